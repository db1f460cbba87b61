"""ContinualTopK: SparseGumb (algo:sparseGumb), continual top-k with at most s switches."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import dpstream as dps
from dpstream import tree
from dpstream.mechanisms.topk import ContinualTopK, noise_eta, svt_noise_tail, utility_eta
from dpstream.noise import NoiseSource
from dpstream.oneshot.known import gumbel_top_k

from .conftest import Z_TOL, fixed_key


def rotating_prefixes(d, horizon, rng):
    """Prefix histograms whose leader changes every few steps (many switch triggers)."""
    counts = np.zeros(d, dtype=np.int64)
    out = []
    for t in range(1, horizon + 1):
        counts = counts + rng.integers(0, 2, size=d)
        counts[(t // 3) % d] += 25
        out.append(counts.copy())
    return out


def test_tau_matches_the_theorem():
    """rho = (2k + 1) / (2 tau^2) (the sparse vector per Lyu-Su-Li; the paper: 2k + 4),
    and k / tau^2 when no sparse-vector round runs (switches = 0, wait=False)."""
    for k in (1, 3, 10):
        m = ContinualTopK(range(20), 100, k=k, switches=4, eta=1.0, key=fixed_key("p"), rho=0.5)
        assert (2 * k + 1) / (2 * m.tau**2) == pytest.approx(0.5, rel=1e-12)
        assert (2 * k + 1) / (2 * m.tau**2) <= 0.5  # rounded towards more noise
        m0 = ContinualTopK(range(20), 100, k=k, switches=0, key=fixed_key("p"), rho=0.5, wait=False)
        assert k / m0.tau**2 == pytest.approx(0.5, rel=1e-12) and m0.rounds == 0
        w0 = ContinualTopK(range(20), 100, k=k, switches=0, key=fixed_key("p"), rho=0.5)
        assert (2 * k + 1) / (2 * w0.tau**2) == pytest.approx(0.5, rel=1e-12)  # the wait
        assert m.privacy.rho == pytest.approx(0.5, rel=1e-12)
        # R = s + 1 sparse-vector rounds with the waiting round, s without
        assert m.rounds == 5 and m.tau_1 == pytest.approx(math.sqrt(5) * m.tau)
        assert m.tau_2 == pytest.approx(math.sqrt(5) * m.tau)
        m = ContinualTopK(
            range(20), 100, k=k, switches=4, eta=1.0, key=fixed_key("p"), rho=0.5, wait=False
        )
        assert m.rounds == 4 and m.tau_1 == pytest.approx(2 * m.tau)
        assert m.tau_2 == pytest.approx(math.sqrt(5) * m.tau)
    m = ContinualTopK(range(20), 100, k=2, switches=1, eta=1.0, key=fixed_key("p"), tau=3.0)
    assert m.privacy.rho == pytest.approx(5 / (2 * 9.0), rel=1e-12)
    m = ContinualTopK(
        range(20), 100, k=2, switches=1, eta=1.0, key=fixed_key("p"), epsilon=1.0, delta=1e-6
    )
    assert m.privacy.epsilon <= 1.0 and m.privacy.conversion != "gaussian-exact"
    # the paper's conversion would need more noise than ours (CKS20 is tighter)
    lg = math.log(1e6)
    rho_paper = (math.sqrt(lg + 1.0) - math.sqrt(lg)) ** 2
    assert m.tau <= math.sqrt(2.5 / rho_paper)


def test_per_user_guarantee_is_the_event_theorem_at_tau_over_linf_and_the_docs_say_so():
    """Per user, rho = Linf^2 (2k + 1) / (2 tau^2) (Linf^2 k / tau^2 with no sparse-vector
    round), what .privacy states; docs/privacy.md's table gives the same coefficient."""
    from pathlib import Path

    for k, linf, switches, wait, coef in (
        (2, 3, 1, True, 2 * 2 + 1),
        (1, 2, 0, True, 3),
        (3, 2, 0, False, 2 * 3),
    ):
        m = ContinualTopK(
            range(20),
            100,
            k=k,
            switches=switches,
            key=fixed_key("p"),
            tau=1.5,
            wait=wait,
            max_items_per_user=4,
            max_count_per_item=linf,
        )
        assert m.privacy.unit == "user"
        assert m.privacy.rho == pytest.approx(linf**2 * coef / (2 * 1.5**2), rel=1e-12)
    assert "(2k+1)" in m.theorem_user
    docs = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text()
    row = next(line for line in docs.splitlines() if line.startswith("| top-k (SparseGumb)"))
    assert "Linf^2 (2k + 1) / (2 tau^2)-zCDP" in row


@pytest.mark.parametrize("switches", [0, 1, 3])
def test_never_more_than_s_reselections(switches, monkeypatch):
    """A stream whose leader rotates every 3 steps, eta = 0: the switch budget runs out.

    Counted from outside: the selection routine is spied on (at most s + 1 calls),
    and the released item set changes at most s times.
    """
    calls = []
    original = ContinualTopK._select

    def spy(self, t, counts):
        calls.append(t)
        return original(self, t, counts)

    monkeypatch.setattr(ContinualTopK, "_select", spy)
    rng = np.random.default_rng(5)
    d, horizon = 12, 120
    prefixes = rotating_prefixes(d, horizon, rng)
    for rep in range(5):
        calls.clear()
        m = ContinualTopK(
            range(d),
            horizon,
            k=2,
            switches=switches,
            eta=0.0,
            key=fixed_key(f"sw{rep}"),
            rho=2.0,
            wait=False,
        )
        sets, left = [], []
        for t, h in enumerate(prefixes, start=1):
            rel = m.release(t, h)
            sets.append(frozenset(rel.items))
            left.append(rel.meta["switches_left"])
        changes = sum(a != b for a, b in zip(sets, sets[1:], strict=False))
        assert len(calls) <= switches + 1 and calls[0] == 1
        assert changes <= switches
        assert all(a >= b >= 0 for a, b in zip(left, left[1:], strict=False))
        if switches == 0:
            assert changes == 0 and len(calls) == 1 and left[-1] == 0
        else:
            # with eta = 0 and a rotating leader the budget is spent
            assert left[-1] == 0 and len(calls) == switches + 1


def test_switches_to_the_new_leader_with_eta_from_the_utility_lemma():
    """Leader A until t=100, then B grows faster and overtakes A once, clearly.

    tau comes from rho = 1 (tau = sqrt(3) for k = 1), eta from eq:eta with
    beta = 0.01. By lem:SVTutility the switch happens (probability >= 1 - beta
    per epoch) once B leads by alpha_3 = alpha_2 + 2 alpha_BM + 2 alpha_AT
    (eq:alphaGap), and not while A is still ahead. Checked over 10 keys.
    """
    d, horizon, s = 50, 256, 1
    rng = np.random.default_rng(11)
    steps = rng.integers(0, 4, size=(horizon, d))
    steps[:100, 0] += 40  # A
    steps[100:, 0] += 20
    steps[100:, 1] += 80  # B
    prefixes = np.cumsum(steps, axis=0)
    a_item, b_item = 0, 1
    for rep in range(10):
        m = ContinualTopK(
            range(d),
            horizon,
            k=1,
            switches=s,
            eta=1.0,
            key=fixed_key(f"lead{rep}"),
            rho=1.0,
            counter="tree",
            wait=False,
        )
        eta = utility_eta(
            tau=m.tau, switches=s, domain_size=d, horizon=horizon, base=m.base, beta=0.01
        )
        m = ContinualTopK(
            range(d),
            horizon,
            k=1,
            switches=s,
            eta=eta,
            key=fixed_key(f"lead{rep}"),
            rho=1.0,
            counter="tree",
            wait=False,
        )
        levels = tree.num_levels(horizon, m.base)
        alpha_bm = m.tau * levels * math.sqrt(2 * 2 * (m.base - 1) * math.log(6 * horizon / 0.01))
        alpha_at = 8 * m.tau * math.log(6 * d * horizon / 0.01)
        alpha_2 = eta - alpha_bm - alpha_at
        alpha_3 = alpha_2 + 2 * alpha_bm + 2 * alpha_at
        gap = prefixes[:, b_item] - prefixes[:, a_item]
        t_clear = int(np.argmax(gap >= alpha_3)) + 1  # first step B leads by alpha_3
        assert gap[-1] >= alpha_3 and t_clear < horizon
        picks = []
        for t in range(1, horizon + 1):
            picks.append(m.release(t, prefixes[t - 1]).items[0])
        assert picks[0] == a_item
        t_switch = picks.index(b_item) + 1
        assert gap[t_switch - 1] > 0, "switched while A was still ahead"
        assert t_switch <= t_clear
        assert all(p == b_item for p in picks[t_switch - 1 :])
        assert m.switches_left == 0
        print(
            f"rep {rep}: eta={eta:.0f} switch at t={t_switch} (B ahead from "
            f"t={int(np.argmax(gap > 0)) + 1}, clear at t={t_clear})"
        )


def test_switches_zero_never_reselects():
    d, horizon = 10, 60
    prefixes = rotating_prefixes(d, horizon, np.random.default_rng(2))
    for rep in range(5):
        m = ContinualTopK(
            range(d),
            horizon,
            k=1,
            switches=0,
            eta=0.0,
            key=fixed_key(f"z{rep}"),
            rho=5.0,
            wait=False,
        )
        items = {m.release(t, h).items[0] for t, h in enumerate(prefixes, start=1)}
        assert len(items) == 1 and m.switches_left == 0


def random_events(rng, domain, steps):
    """Events of any size (unrestricted l0), up to the whole domain."""
    return [
        [
            list(rng.choice(domain, size=rng.integers(0, len(domain) + 1), replace=False))
            for _ in range(rng.integers(0, 3))
        ]
        for _ in range(steps)
    ]


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_event_mode_equals_aggregate_mode_bit_for_bit(counter):
    rng = np.random.default_rng(3)
    domain = [f"item{i}" for i in range(30)]
    horizon = 80
    stream = random_events(rng, domain, horizon)
    key = fixed_key("modes")

    def make(k):
        return ContinualTopK(
            domain,
            horizon,
            k=3,
            switches=6,
            eta=lambda t: 0.05 * t,
            key=k,
            rho=0.3,
            counter=counter,
        )

    ev, agg, other = make(key), make(key), make(fixed_key("modes-other"))
    prefix = dict.fromkeys(domain, 0)
    switched = compared = 0
    for t, events in enumerate(stream, start=1):
        re_, ro = ev.step_batch(events), other.step_batch(events)
        for event in events:
            for item in event:
                prefix[item] += 1
        rg = agg.release(t, prefix)
        assert list(re_.items) == list(rg.items)
        assert np.array_equal(re_.values, rg.values)
        assert re_.meta == rg.meta
        if len(re_.values) and len(ro.values):  # (before the first selection both are empty)
            compared += 1
            assert not np.array_equal(re_.values, ro.values)
        switched += re_.meta["switched"]
    assert switched >= 1  # the comparison covered re-selections
    assert compared >= horizon // 2  # and most steps were compared across keys
    assert dict(zip(domain, ev.counts.tolist(), strict=True)) == prefix


def test_same_releases_in_a_fresh_process():
    key = fixed_key("fresh-topk")
    code = f"""
import numpy as np
from dpstream import NoiseKey
from dpstream.mechanisms.topk import ContinualTopK
k = NoiseKey.from_bytes(bytes.fromhex("{key.to_bytes().hex()}"))
m = ContinualTopK(list(range(8)), 40, k=2, switches=3, eta=0.5, key=k, rho=1.0)
out = []
for t in range(40):
    r = m.step([t % 8, (t // 5) % 8, 7 - t % 3])
    out.append(repr(list(r.items)) + r.values.tobytes().hex())
print(";".join(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    m = ContinualTopK(list(range(8)), 40, k=2, switches=3, eta=0.5, key=key, rho=1.0)
    here = []
    for t in range(40):
        r = m.step([t % 8, (t // 5) % 8, 7 - t % 3])
        here.append(repr(list(r.items)) + r.values.tobytes().hex())
    assert res.stdout.strip() == ";".join(here)


def test_first_selection_is_known_gumbel_with_tau2():
    """The first selection is KnownGumb_k(h; tau_2), no counts, purpose "<scope>/select-0"."""
    d = 40
    counts = (np.arange(d) * 7) % 13
    for rep in range(5):
        key = fixed_key(f"first{rep}")
        m = ContinualTopK(
            range(d), 50, k=4, switches=2, eta=1.0, key=key, tau=2.0, stream="s", wait=False
        )
        rel = m.release(5, counts)
        ref = gumbel_top_k(
            counts,
            items=list(range(d)),
            k=4,
            tau=math.sqrt(3) * 2.0,
            key=key,
            purpose=f"{m.noise_scope}/select-0",
            with_counts=False,
        )
        assert tuple(rel.items) == ref.items


def test_counters_are_keyed_tree_counters_and_survive_reselection():
    """Brute force: every released count is h_t^u + sum over I_t of N(0, L tau_2^2) cells,
    drawn under purpose "<scope>/counter-n" where n is the selection at which u last
    entered the released set. So an item kept across a re-selection keeps its counter and a
    re-entering item gets a fresh one.
    """
    d, horizon = 10, 60
    prefixes = rotating_prefixes(d, horizon, np.random.default_rng(8))
    key = fixed_key("brute")
    m = ContinualTopK(
        range(d),
        horizon,
        k=3,
        switches=8,
        eta=0.0,
        key=key,
        tau=0.8,
        stream="bf",
        counter="tree",
        wait=False,
    )
    levels = tree.num_levels(horizon, m.base)
    cell_std = math.sqrt(levels) * m.tau_2
    generation: dict[int, int] = {}
    prev: set[int] = set()
    kept_across = 0
    for t, h in enumerate(prefixes, start=1):
        rel = m.release(t, h)
        n = rel.meta["selection"]
        now = set(rel.items)
        if rel.meta["switched"] or t == 1:
            kept_across += len(now & prev) if t > 1 else 0
        for u in now - prev:
            generation[u] = n
        for u, v in zip(rel.items, rel.values, strict=True):
            src = NoiseSource(key, f"{m.noise_scope}/counter-{generation[u]}")
            prep = src.prepare([u])
            noise = 0.0
            for lv, j in tree.cells_at(t, m.base):
                noise += src.gaussian(prep, lv, j, 0, scale=cell_std)[0]
            assert v - h[u] == pytest.approx(noise, abs=1e-9)
        prev = now
    assert m.switches_left < 8 and kept_across >= 1


def test_counters_are_keyed_blt_counters_and_survive_reselection():
    """The BLT twin of the test above: every released count is h_t^u + (B z)_t, B = A C^-1
    as a dense matrix from the strategy column, z_s = N(0, sigma^2) drawn at (0, s, 0)
    under purpose "<scope>/counter-n", sigma = tau_2 max_j ||C e_j|| (a fresh counter
    replays steps 1..t).
    """
    from scipy.linalg import toeplitz

    d, horizon = 10, 60
    prefixes = rotating_prefixes(d, horizon, np.random.default_rng(8))
    key = fixed_key("brute")
    m = ContinualTopK(
        range(d), horizon, k=3, switches=8, eta=0.0, key=key, tau=0.8, stream="bf", counter="blt"
    )
    C = np.tril(toeplitz(m.strategy.strategy_column()))
    B = np.tril(np.ones((horizon, horizon))) @ np.linalg.inv(C)
    sigma = m.tau_2 * math.sqrt(np.sum(C * C, axis=0).max())
    assert m.counter_std == pytest.approx(sigma, rel=1e-11)
    generation: dict[int, int] = {}
    prev: set[int] = set()
    kept_across = 0
    for t, h in enumerate(prefixes, start=1):
        rel = m.release(t, h)
        n = rel.meta["selection"]
        now = set(rel.items)
        if rel.meta["switched"]:
            kept_across += len(now & prev)
        for u in now - prev:
            generation[u] = n
        for u, v in zip(rel.items, rel.values, strict=True):
            src = NoiseSource(key, f"{m.noise_scope}/counter-{generation[u]}")
            prep = src.prepare([u])
            z = np.array([src.gaussian(prep, 0, j, 0, scale=sigma)[0] for j in range(1, t + 1)])
            assert v - h[u] == pytest.approx(B[t - 1, :t] @ z, abs=1e-9)
        prev = now
    assert m.switches_left < 8 and kept_across >= 1


@pytest.mark.statistical
def test_counter_noise_has_tau2_tree_variance():
    """noisy - true of a selected item at t is N(0, |I_t| L_r tau_2^2), tau_2 = sqrt(s+1) tau.

    k = d = 400 (everything selected), 100 keys: n = 40,000 draws per t. Mean
    within Z_TOL sigma/sqrt(n), variance ratio within Z_TOL sqrt(2/n) = 3.5%; a
    counter with tau instead of tau_2 (s = 2: a factor 3 in variance) is far outside.
    """
    d, horizon, tau, s = 400, 100, 0.5, 2
    check_at = [1, 37, 64, 100]
    samples = {t: [] for t in check_at}
    counts = np.arange(d, dtype=np.int64)
    for rep in range(100):
        m = ContinualTopK(
            range(d),
            horizon,
            k=d,
            switches=s,
            eta=1e9,
            key=fixed_key(f"v{rep}"),
            tau=tau,
            counter="tree",
            wait=False,
        )
        for t in check_at:
            rel = m.release(t, counts + t)
            samples[t].append(rel.values - (np.asarray(rel.items) + t))
    for t, parts in samples.items():
        x = np.concatenate(parts)
        sigma2 = sum(tree.digits(t, m.base)) * m.levels * (s + 1) * tau**2
        assert abs(x.mean()) < Z_TOL * math.sqrt(sigma2 / x.size), t
        assert abs(x.var() / sigma2 - 1) < Z_TOL * math.sqrt(2 / x.size), t


def test_release_meta_and_errors_leave_state_unchanged():
    key = fixed_key("bad")
    m = ContinualTopK(["a", "b", "c"], 5, k=1, switches=1, eta=lambda t: 1.0, key=key, rho=1.0)
    # the same schedule as values: the noise scope fingerprints eta's values
    ref = ContinualTopK(["a", "b", "c"], 5, k=1, switches=1, eta=lambda t: 1.0, key=key, rho=1.0)
    with pytest.raises(dps.InvalidEventError, match="not in the domain"):
        m.step(["zz"])
    with pytest.raises(TypeError, match="str"):
        m.step("ab")
    r1, q1 = m.step(["a", "b", "c"]), ref.step(["a", "b", "c"])  # any event size is fine
    assert r1.meta["switches_left"] == 1 and m.switches_left == 1
    assert np.array_equal(r1.values, q1.values)
    # a schedule is checked at every step up front: a bad value at t = 4 fails now
    with pytest.raises(ValueError, match=r"eta\(4\)"):
        ContinualTopK(
            ["a", "b", "c"],
            5,
            k=1,
            switches=1,
            key=key,
            rho=1.0,
            eta=lambda t: -1.0 if t == 4 else 1.0,
        )
    assert m.t == 1 and m.counts.tolist() == [1, 1, 1]
    assert np.array_equal(m.step(["a"]).values, ref.step(["a"]).values)
    with pytest.raises(ValueError, match="decrease"):
        m.release(3, {"a": 0})
    with pytest.raises(dps.HorizonExceededError):
        m.release(6, {"a": 9})
    assert m.t == 2


def test_two_eta_schedules_draw_different_noise():
    """Review finding I: every callable eta was fingerprinted as "callable", so two runs
    with different schedules shared all noise."""
    key = fixed_key("eta-scope")
    a = ContinualTopK(["a", "b"], 6, k=1, switches=1, key=key, rho=1.0, eta=lambda t: 1.0)
    b = ContinualTopK(["a", "b"], 6, k=1, switches=1, key=key, rho=1.0, eta=lambda t: 2.0)
    c = ContinualTopK(["a", "b"], 6, k=1, switches=1, key=key, rho=1.0, eta=lambda t: 1.0)
    assert a.noise_scope != b.noise_scope and a.noise_scope == c.noise_scope
    assert a.eta_at(3) == 1.0 and b.eta_at(6) == 2.0
    from dpstream.snapshot import dump_snapshot, load_snapshot

    assert load_snapshot(dump_snapshot(a, key), key).eta_at(2) == 1.0  # a snapshot keeps it


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"k": 0}, ValueError, "k must be"),
        ({"k": 4}, ValueError, "k must be"),
        ({"switches": -1}, ValueError, "switches"),
        ({"eta": -0.5}, ValueError, "eta"),
        ({"eta": "x"}, ValueError, "eta"),  # a string: only "auto"
        ({"eta": [1.0]}, TypeError, "eta"),
        ({"wait": 1}, TypeError, "wait"),
        ({"rho": None}, ValueError, "rho"),
    ],
)
def test_constructor_errors(kwargs, exc, match):
    args = {"k": 1, "switches": 1, "eta": 1.0, "rho": 1.0} | kwargs
    if args["rho"] is None:
        del args["rho"]
    with pytest.raises(exc, match=match):
        ContinualTopK(["a", "b", "c"], 10, key=fixed_key("c"), **args)


# --------------------------------------------------------------------------- eta="auto", waiting


@pytest.mark.parametrize("tau_1,variance", [(1.0, 0.0), (1.0, 9.0), (2.0, 400.0)])
def test_svt_noise_tail_against_simulation(tau_1, variance):
    """svt_noise_tail is P(Lap(4 tau_1) - Lap(2 tau_1) + N(0, v) > x), checked by simulation.

    n = 2,000,000 simulated draws (NumPy, a simulation, not a release): each
    frequency within Z_TOL binomial standard errors. A tail with the Laplace
    scales swapped or the Gaussian term left out misses by > 20 SE at x = 20.
    """
    rng = np.random.default_rng(20)
    n = 2_000_000
    d = (
        rng.laplace(0, 4 * tau_1, n)
        - rng.laplace(0, 2 * tau_1, n)
        + rng.normal(0, math.sqrt(variance), n)
    )
    for x in (-5.0, 0.0, 5.0, 20.0, 40.0):
        p = svt_noise_tail(x, tau_1=tau_1, variance=variance)
        se = math.sqrt(p * (1 - p) / n)
        assert abs((d > x).mean() - p) <= Z_TOL * se + 1e-12, x
    eta = noise_eta(tau_1=tau_1, variance=variance, level=1e-3)
    assert svt_noise_tail(eta, tau_1=tau_1, variance=variance) <= 1e-3
    assert svt_noise_tail(eta * (1 - 1e-6), tau_1=tau_1, variance=variance) > 1e-3 * (1 - 1e-4)


def test_auto_eta_is_the_noise_quantile_not_the_union_bound():
    """eta="auto": the 1 - 0.05/T quantile of one comparison's noise, counter variance
    |I_t| L_r tau_2^2 at t; the waiting round's eta0 has no counter term."""
    d, horizon, s = 500, 1000, 3
    m = ContinualTopK(
        range(d), horizon, k=5, switches=s, key=fixed_key("auto"), rho=0.1, counter="tree"
    )
    for t in (1, 7, 500, 999, 1000):
        var = sum(tree.digits(t, m.base)) * m.levels * m.tau_2**2
        assert svt_noise_tail(m.eta_at(t), tau_1=m.tau_1, variance=var) == pytest.approx(
            0.05 / horizon, rel=1e-6
        )
    assert svt_noise_tail(m.start_eta_at(3), tau_1=m.tau_1) == pytest.approx(
        0.05 / horizon, rel=1e-6
    )
    # far below the paper's worst-case utility eta (union bounds over d and T, 3 terms)
    worst = utility_eta(
        tau=m.tau, switches=s, domain_size=d, horizon=horizon, base=m.base, beta=0.05
    )
    assert max(m.eta_at(t) for t in range(1, horizon + 1)) < worst / 2


def test_beta_and_start_beta_set_the_quantiles_and_their_own_noise():
    """beta / start_beta: eta_t and eta0 are the 1 - beta/T and 1 - start_beta/T
    quantiles; the defaults keep the noise scope (releases replay), other values get
    their own; a given eta refuses them."""
    d, horizon = 50, 200
    kw = dict(k=3, switches=2, key=fixed_key("beta"), rho=0.1, counter="tree")
    base = ContinualTopK(range(d), horizon, **kw)
    same = ContinualTopK(range(d), horizon, beta=0.05, start_beta=0.05, **kw)
    lax = ContinualTopK(range(d), horizon, start_beta=0.2, **kw)
    both = ContinualTopK(range(d), horizon, beta=0.3, **kw)
    assert same.noise_scope == base.noise_scope
    assert len({base.noise_scope, lax.noise_scope, both.noise_scope}) == 3
    t = 77
    var = sum(tree.digits(t, base.base)) * base.levels * base.tau_2**2
    assert lax.eta_at(t) == base.eta_at(t)
    assert svt_noise_tail(lax.start_eta_at(t), tau_1=lax.tau_1) == pytest.approx(
        0.2 / horizon, rel=1e-6
    )
    assert lax.start_eta_at(t) < base.start_eta_at(t)
    assert svt_noise_tail(both.eta_at(t), tau_1=both.tau_1, variance=var) == pytest.approx(
        0.3 / horizon, rel=1e-6
    )
    assert svt_noise_tail(both.start_eta_at(t), tau_1=both.tau_1) == pytest.approx(
        0.3 / horizon, rel=1e-6
    )
    assert lax.privacy == base.privacy == both.privacy
    with pytest.raises(ValueError, match="eta='auto' only"):
        ContinualTopK(range(d), horizon, eta=5.0, beta=0.2, **kw)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="beta"):
            ContinualTopK(range(d), horizon, start_beta=bad, **kw)


def test_auto_eta_uses_the_blt_counters_own_variance():
    """With BLT counters (the default for T >= 2) eta="auto" is the same quantile with the
    BLT count's variance at t, sigma^2 ||row_t(B)||^2, sigma = tau_2 max_j ||C e_j||: from
    dense matrices here (B = A C^-1), not from the code's closed form. Sized with the
    tree's variance instead, the tail at eta would be off by 100 times the tolerance
    or more (checked below)."""
    from scipy.linalg import toeplitz

    d, horizon, s = 50, 300, 2
    m = ContinualTopK(range(d), horizon, k=3, switches=s, key=fixed_key("auto-blt"), rho=0.5)
    assert m.counter == "blt"
    C = np.tril(toeplitz(m.strategy.strategy_column()))
    B = np.tril(np.ones((horizon, horizon))) @ np.linalg.inv(C)
    rows = np.sum(B * B, axis=1)
    sigma = m.tau_2 * math.sqrt(np.sum(C * C, axis=0).max())
    r = tree.optimal_base(horizon)
    for t in (1, 2, 50, 299, 300):
        var = sigma**2 * rows[t - 1]
        assert svt_noise_tail(m.eta_at(t), tau_1=m.tau_1, variance=var) == pytest.approx(
            0.05 / horizon, rel=1e-6
        )
        tree_var = sum(tree.digits(t, r)) * tree.num_levels(horizon, r) * m.tau_2**2
        if t >= 50:  # the tree's variance would fail the check above
            assert (
                abs(svt_noise_tail(m.eta_at(t), tau_1=m.tau_1, variance=tree_var) - 0.05 / horizon)
                > 1e-4 * 0.05 / horizon
            )
    assert m.noise_std_worst == pytest.approx(sigma * math.sqrt(rows.max()), rel=1e-9)


def test_waiting_round_rarely_selects_on_an_empty_stream():
    """Every count 0 for T steps: the first selection happens in at most beta = 5% of runs.

    300 keys, T = 100: under the bound the rate is <= 0.05; allowed 0.05 + Z_TOL
    binomial SE (0.063). Power: with eta halved the same runs select far more
    often (> 0.3), and without waiting they always select at t = 1.
    """
    d, horizon, n = 12, 100, 300
    zeros = np.zeros(d, dtype=np.int64)

    def selected_rate(**kw):
        hits = 0
        for rep in range(n):
            m = ContinualTopK(
                range(d), horizon, k=3, switches=2, key=fixed_key(f"empty{rep}"), rho=1.0, **kw
            )
            for t in range(1, horizon + 1):
                rel = m.release(t, zeros)
                if rel.items:
                    hits += 1
                    break
                assert rel.meta["status"] == "not yet" and len(rel.values) == 0
                assert rel.meta["switches_left"] == 2 and rel.meta["selection"] == -1
        return hits / n

    rate = selected_rate()
    assert rate <= 0.05 + Z_TOL * math.sqrt(0.05 * 0.95 / n)
    probe = ContinualTopK(range(d), horizon, k=3, switches=2, key=fixed_key("p"), rho=1.0)
    assert selected_rate(eta=probe.start_eta_at(1) / 2) > 0.3
    assert selected_rate(wait=False) == 1.0


def test_waiting_round_selects_once_the_kth_count_is_clear():
    """The k-th count eta0 + 40 tau_1 above 0: the round fires at once in (almost) every run
    (the noise Lap(4 tau_1) - Lap(2 tau_1) is below -40 tau_1 with probability e^-10 / 1.5),
    and the list is then released with status "selected" and no switch spent."""
    d, horizon = 12, 100
    for rep in range(30):
        m = ContinualTopK(range(d), horizon, k=3, switches=2, key=fixed_key(f"clear{rep}"), rho=1.0)
        counts = np.zeros(d, dtype=np.int64)
        counts[[2, 5, 7]] = int(m.start_eta_at(1) + 40 * m.tau_1)
        rel = m.release(1, counts)
        assert rel.meta["status"] == "selected" and sorted(rel.items) == [2, 5, 7]
        assert rel.meta["switches_left"] == 2 and rel.meta["selection"] == 0


@pytest.mark.parametrize("switches", [0, 4])
def test_selection_over_chunks_equals_selection_in_one_pass(monkeypatch, switches):
    """A domain larger than SELECT_CHUNK is scored a chunk at a time, keeping each
    chunk's k best (and its ids decrypted a chunk at a time): over 60 keys and
    streams, with chunks of 7 and 1 items against one pass, every release is the
    same (the k largest of the domain are among the chunks' k best; exact float ties
    of two scores, probability ~0, are the only case a chunked pass may order
    differently)."""
    from dpstream.oneshot import known as oneshot_known

    domain = [f"u{i}" for i in range(50)]
    rng = np.random.default_rng(11)

    def run(chunk, seed):
        monkeypatch.setattr(oneshot_known, "SELECT_CHUNK", chunk)
        m = ContinualTopK(
            domain, 30, k=3, switches=switches, eta=0.0, key=fixed_key(f"c{seed}"), rho=2.0
        )
        steps = np.random.default_rng(seed).choice(50, size=(30, 40), p=weights)
        out = []
        for row in steps:
            rel = m.step_batch([[domain[i]] for i in row.tolist()])
            out.append((list(rel.items), rel.values.tolist(), rel.meta["selection"]))
        return out

    weights = rng.dirichlet(np.full(50, 0.3))
    selections = 0
    for seed in range(60):
        one = run(1 << 16, seed)
        assert run(7, seed) == one and run(1, seed) == one
        selections += one[-1][2] + 1
    assert selections == 60 if switches == 0 else selections > 90  # re-selections happened


def test_gumbel_select_kernel_in_chunks_from_prepared_ids(monkeypatch):
    """The same selection from a PreparedItems (MetaAlgo's form) in chunks of 5 as in one
    pass, for k from 1 to past the chunk size, counts with many equal values."""
    from dpstream.oneshot import known as oneshot_known

    source = NoiseSource(fixed_key("kernel-chunks"), "sel")
    prepared = source.prepare([f"x{i}" for i in range(64)])
    counts = np.random.default_rng(5).integers(0, 4, 64)
    for k in (1, 3, 5, 9, 64):
        monkeypatch.setattr(oneshot_known, "SELECT_CHUNK", 1 << 16)
        one = oneshot_known.gumbel_select_kernel(source, prepared, counts, k, 1.5)
        monkeypatch.setattr(oneshot_known, "SELECT_CHUNK", 5)
        chunked = oneshot_known.gumbel_select_kernel(source, prepared, counts, k, 1.5)
        assert chunked.tolist() == one.tolist() and len(set(one.tolist())) == k


def test_another_domain_draws_other_noise():
    """Review 86: ContinualTopK's noise scope left out the domain. Per user, first come,
    first kept keeps other contributions under another domain (a user whose event holds
    "c" before "a" keeps "a" only where "c" is not in the domain), so one key and stream
    over two domains published the exact difference of the bounded counts. Now the
    released difference is that difference plus the difference of two independent noise
    values, which is not 0 (with probability 1)."""
    key = fixed_key("topk-domain")

    def topk(domain):
        return dps.ContinualTopK(domain, 4, k=1, switches=0, wait=False, key=key, rho=1.0,
                                 max_items_per_user=1, max_count_per_item=1)  # fmt: skip

    small, large = ["a", "b"], ["a", "b", "c"]
    m1, m2 = topk(small), topk(large)
    assert m1.noise_scope != m2.noise_scope
    assert topk(["b", "a"]).noise_scope == m1.noise_scope  # a domain is a set
    events = [(f"u{i}", ["a"]) for i in range(500)] + [(f"v{i}", ["c", "a"]) for i in range(37)]
    r1 = m1.step_batch([(u, [i for i in items if i in small]) for u, items in events])
    r2 = m2.step_batch(events)
    true_difference = 537 - 500  # the v users' "a" counts under the small domain only
    assert r1.counts["a"] - r2.counts["a"] != pytest.approx(true_difference, abs=1e-6)
