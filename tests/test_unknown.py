"""UnkBase (algo:UnkBase): the continual histogram over an unknown domain."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import dpstream as dps
from dpstream.mechanisms.known import KnownDomainHistogram
from dpstream.mechanisms.unknown import UnknownDomainHistogram

from .conftest import Z_TOL, fixed_key


def levels_of(T: int, r: int) -> int:
    """L_r = floor(log_r T) + 1 by repeated multiplication (independent of dpstream.tree)."""
    L, size = 1, r
    while size <= T:
        L, size = L + 1, size * r
    return L


def cells_brute(t: int, r: int, L: int) -> list[tuple[int, int]]:
    """I_t(r) by greedy cover of 1..t with the largest aligned blocks (Section 3)."""
    out, start = [], 0
    for level in range(L, 0, -1):
        size = r ** (level - 1)
        while start + size <= t:
            out.append((level, (start + size) // size))
            start += size
    assert start == t
    return out


def random_stream(rng, domain, steps, max_items, max_events=3):
    return [
        [
            [
                domain[i]
                for i in rng.choice(len(domain), size=rng.integers(0, max_items + 1), replace=False)
            ]
            for _ in range(rng.integers(0, max_events + 1))
        ]
        for _ in range(steps)
    ]


# --------------------------------------------------------------------------- threshold


@pytest.mark.parametrize(
    "tau,T,r,delta",
    [
        (1.0, 100, 2, 1e-6),
        (0.3, 1000, 4, 1e-3),
        (5.0, 7, 3, 0.5),
        (2.0, 1, 2, 1e-9),
        (1.7, 65536, 16, 1e-12),
    ],
)
def test_threshold_is_eq_threshold(tau, T, r, delta):
    u = UnknownDomainHistogram(
        T, max_items=1, key=fixed_key("thr"), base=r, tau=tau, threshold_delta=delta
    )
    L = levels_of(T, r)
    expected = tau * L * math.sqrt(r - 1) * stats.norm.isf(delta / T) + 1
    assert u.threshold == pytest.approx(expected, rel=1e-12)
    # conservative in floating point: the union bound holds exactly as computed
    assert T * stats.norm.sf((u.threshold - 1) / (tau * L * math.sqrt(r - 1))) <= delta
    # the release at t = 1 (one tree cell) uses m_1, not m_delta
    assert u.step([]).meta["threshold"] == pytest.approx(
        tau * math.sqrt(L) * stats.norm.isf(delta / T) + 1, rel=1e-12
    )


def per_step_threshold(t, T, r, tau, delta):
    """m_t = 1 + sqrt(|I_t| L_r) tau Phi^-1(1 - delta/T), |I_t| by the greedy cover."""
    L = levels_of(T, r)
    return 1 + math.sqrt(len(cells_brute(t, r, L)) * L) * tau * stats.norm.isf(delta / T)


@pytest.mark.parametrize(
    "tau,T,r,delta",
    [
        (1.0, 100, 2, 1e-6),
        (0.3, 1000, 4, 1e-3),
        (5.0, 7, 3, 0.5),
        (2.0, 1, 2, 1e-9),
        (1.7, 300, 16, 1e-12),
    ],
)
def test_per_step_threshold_never_exceeds_m_delta(tau, T, r, delta):
    """m_t at every t <= T: the closed form, conservative in floating point (T (1 -
    Phi((m_t - 1)/s_t)) <= delta, s_t = sqrt(|I_t| L) tau), at most m_delta, and below
    it wherever I_t has fewer than (r - 1) L_r cells."""
    u = UnknownDomainHistogram(
        T, max_items=1, key=fixed_key("thr"), base=r, tau=tau, threshold_delta=delta
    )
    L = levels_of(T, r)
    below = 0
    for t in range(1, T + 1):
        m_t = u.threshold_at(t)
        n_cells = len(cells_brute(t, r, L))
        assert m_t == pytest.approx(per_step_threshold(t, T, r, tau, delta), rel=1e-12), t
        assert T * stats.norm.sf((m_t - 1) / (math.sqrt(n_cells * L) * tau)) <= delta, t
        assert m_t <= u.threshold
        if n_cells < (r - 1) * L:
            assert m_t < u.threshold
            below += 1
    assert below >= 1 or T == 1  # (T = 1: one step, of one cell = (r - 1) L_r)


# --------------------------------------------------------------------------- bad outcomes


def brute_force_ever_released(T, r, tau, m, n, rng):
    """P(an item seen once, at a uniform time s, is ever above m(t)): simulated with numpy.

    For arrival time s, the count at t >= s is 1 + sum over cells of I_t of an
    independent N(0, L tau^2) per cell (one value per cell and item); ``m`` is
    the threshold as a function of t.
    """
    L = levels_of(T, r)
    cells = sorted({c for t in range(1, T + 1) for c in cells_brute(t, r, L)})
    col = {c: i for i, c in enumerate(cells)}
    hits = 0
    per_s = n // T
    for s in range(1, T + 1):
        z = rng.normal(0.0, math.sqrt(L) * tau, size=(per_s, len(cells)))
        ever = np.zeros(per_s, dtype=bool)
        for t in range(s, T + 1):
            idx = [col[c] for c in cells_brute(t, r, L)]
            ever |= 1 + z[:, idx].sum(axis=1) > m(t)
        hits += int(ever.sum())
    return hits / (per_s * T)


@pytest.mark.statistical
def test_item_seen_once_is_rarely_released():
    """lem:badOutcomes with the per-step thresholds m_t: an item in exactly one event is
    ever released w.p. <= delta.

    4 keys x 4000 items, each in exactly one single-item event, at arrival
    times spread evenly over 1..T (n = 16,000 independent items: distinct keyed
    addresses). Checked one-sided against the lemma's delta (Z_TOL binomial
    SE) and two-sided against a numpy simulation of the same process with
    160,000 items and thresholds m_t from the closed form: the difference of
    the two proportions has standard error sqrt(p(1-p)(1/n + 1/n_mc)), allowed
    Z_TOL times. (The union bound over T makes delta loose; the simulation is
    the sharp check.) Power: thresholds without the union bound over T
    (Phi^-1(1 - delta) in place of Phi^-1(1 - delta/T)) are ever crossed far
    more often than delta, in the same simulation.
    """
    T, r, tau, delta = 16, 2, 1.0, 0.4
    n_items, n_keys = 4000, 4
    ever = []
    for k in range(n_keys):
        u = UnknownDomainHistogram(
            T, max_items=1, key=fixed_key(f"bad{k}"), base=r, tau=tau, threshold_delta=delta
        )
        shown = set()
        for t in range(1, T + 1):
            events = [[f"it{i}"] for i in range(n_items) if i % T == t - 1]
            rel = u.step_batch(events)
            shown |= set(rel.items)
        assert len(u) == n_items
        ever.append(len(shown) / n_items)
    n = n_items * n_keys
    p_hat = float(np.mean(ever))
    assert p_hat <= delta + Z_TOL * math.sqrt(delta * (1 - delta) / n)
    n_mc = 160_000
    p_mc = brute_force_ever_released(
        T, r, tau, lambda t: per_step_threshold(t, T, r, tau, delta), n_mc, np.random.default_rng(7)
    )
    se = math.sqrt(p_mc * (1 - p_mc) * (1 / n + 1 / n_mc))
    print(f"P(ever released) = {p_hat:.4f}, simulated {p_mc:.4f}, bound {delta}")
    assert abs(p_hat - p_mc) <= Z_TOL * se
    p_wrong = brute_force_ever_released(
        T,
        r,
        tau,
        lambda t: per_step_threshold(t, T, r, tau, delta * T),
        16_000,
        np.random.default_rng(8),
    )
    assert p_wrong > delta + 10 * math.sqrt(delta * (1 - delta) / 16_000)


# --------------------------------------------------------------------------- discovery


@pytest.mark.statistical
def test_discovery_probability_lemma():
    """Utility lemma of UnkBase with m_t: count h is shown w.p. Phi((h - m_t)/(sqrt(|I_t|
    L_r) tau)).

    That is >= Phi(c / (sqrt(r-1) L_r)) for h = m_delta + c tau, the lemma's bound
    (m_t <= m_delta and |I_t| <= (r - 1) L_r). Aggregate mode,
    3 keys x 10,000 items, all at count h = ceil(m + 3 tau), released at
    t = 80 (|I_t| = 8 in base 3), 81 (|I_t| = 1) and 100. At each t the
    30,000 items are independent; the proportion is checked two-sided against
    the exact value and one-sided against the bound, Z_TOL binomial standard
    errors (0.0027 at p = 0.68).
    """
    T, r, tau, thr_delta = 100, 3, 1.0, 0.05
    n_items, n_keys = 10_000, 3
    L = levels_of(T, r)
    shown = {80: 0, 81: 0, 100: 0}
    for k in range(n_keys):
        u = UnknownDomainHistogram(
            T, max_items=1, key=fixed_key(f"disc{k}"), base=r, tau=tau, threshold_delta=thr_delta
        )
        h = math.ceil(u.threshold + 3 * tau)
        counts = {i: h for i in range(n_items)}
        for t in shown:
            shown[t] += len(u.release(t, counts))
    c = (h - u.threshold) / tau
    n = n_items * n_keys
    for t, s in shown.items():
        n_cells = len(cells_brute(t, r, L))
        m_t = per_step_threshold(t, T, r, tau, thr_delta)
        exact = stats.norm.cdf((h - m_t) / (tau * math.sqrt(n_cells * L)))
        bound = stats.norm.cdf(c / (math.sqrt(r - 1) * L))
        se = math.sqrt(exact * (1 - exact) / n)
        assert abs(s / n - exact) <= Z_TOL * se, t
        assert s / n >= bound - Z_TOL * se, t


# --------------------------------------------------------------------------- KnownBase noise


@pytest.mark.parametrize("remember", [False, True])
def test_released_counts_are_knownbase_counts(remember):
    """A discovered item's count is exactly KnownBase's over the whole domain with the
    stream's tree-noise realisation: true count plus the TreeNoise of u.tree_purpose,
    rebuilt here item by item from the public noise pieces."""
    from dpstream.mechanisms.tree_noise import TreeNoise
    from dpstream.noise import NoiseSource

    rng = np.random.default_rng(3)
    domain = [f"w{i}" for i in range(40)] + list(range(10))
    stream = random_stream(rng, domain, 60, 3)
    key = fixed_key("same-noise")
    u = UnknownDomainHistogram(
        60,
        max_items=3,
        key=key,
        tau=0.4,
        threshold_delta=0.3,
        remember=remember,
        stream="s1",
        counter="tree",
    )
    kn = KnownDomainHistogram(
        domain, 60, max_items=3, key=key, tau=0.4, stream="s1", counter="tree"
    )
    assert u.base == kn.base and u.tree_purpose != kn.tree_purpose  # open vs known domain
    source = NoiseSource(key, u.tree_purpose)
    tree = TreeNoise(source, 60, u.base, math.sqrt(u.levels) * u.tau)
    tree.add_items(source.prepare(domain))
    counts = np.zeros(len(domain), dtype=np.int64)
    pos = {it: i for i, it in enumerate(domain)}
    seen, ever_shown, n_released = set(), set(), 0
    for t, events in enumerate(stream, 1):
        ru = u.step_batch(events)
        for ev in events:
            counts[[pos[it] for it in set(ev)]] += 1
        tree.advance(t)
        full = counts + tree.noise()
        seen |= {it for ev in events for it in ev}
        m_t = per_step_threshold(t, 60, u.base, 0.4, 0.3)  # closed form, not the code's
        above = {it for it in seen if full[pos[it]] > m_t}
        ever_shown |= above
        assert set(ru.items) == (ever_shown if remember else above)
        for it, v in zip(ru.items, ru.values.tolist(), strict=True):
            assert v == full[pos[it]]  # bit for bit
        n_released += len(ru)
    assert n_released > 20  # the test saw many discovered items (35 with this key)
    assert len(u) == len(seen)
    other = UnknownDomainHistogram(
        60,
        max_items=3,
        key=key,
        tau=0.4,
        threshold_delta=0.3,
        remember=remember,
        stream="s2",
        counter="tree",
    )
    ro = other.step_batch([["w1"]] * 30)
    ru = UnknownDomainHistogram(
        60, max_items=3, key=key, tau=0.4, threshold_delta=0.3, stream="s1", counter="tree"
    ).step_batch([["w1"]] * 30)
    assert ro.values[0] != ru.values[0]  # a different stream has different noise


# --------------------------------------------------------------------------- modes


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_event_mode_equals_aggregate_mode(counter):
    """Event and aggregate mode release the same bits. With the tree, also an aggregate
    release that skips steps; with BLT only when every step is released (an item first
    seen at a skipped step joins later, with other noise: see BLTNoise.join_items)."""
    rng = np.random.default_rng(11)
    domain = [f"q{i}" for i in range(25)] + [5, 6, b"x"]
    stream = random_stream(rng, domain, 80, 2)
    key = fixed_key("modes")
    kw = {"max_items": 2, "key": key, "tau": 0.2, "threshold_delta": 0.2, "counter": counter}
    ev, ev2 = UnknownDomainHistogram(80, **kw), UnknownDomainHistogram(80, **kw)
    agg, jumpy = UnknownDomainHistogram(80, **kw), UnknownDomainHistogram(80, **kw)
    other = UnknownDomainHistogram(
        80, max_items=2, key=fixed_key("other"), tau=0.2, threshold_delta=0.2
    )
    prefix: dict = {"never": 0}  # a zero count has not appeared: ignored
    total = 0
    for t, events in enumerate(stream, start=1):
        ra, rb, ro = ev.step_batch(events), ev2.step_batch(events), other.step_batch(events)
        for event in events:
            for item in event:
                prefix[item] = prefix.get(item, 0) + 1
        rg = agg.release(t, dict(reversed(prefix.items())))  # Mapping order is irrelevant
        for r in (rb, rg):
            assert r.t == t and list(r.items) == list(ra.items)
            assert np.array_equal(r.values, ra.values) and r.meta == ra.meta
        if len(ra) and len(ro):
            assert not np.array_equal(ra.values, ro.values)
        assert list(ra.values) == sorted(ra.values, reverse=True)  # largest first
        if t % 7 == 0 and counter == "tree":  # a jump gives the same release
            rj = jumpy.release(t, prefix)
            assert rj.items == ra.items and np.array_equal(rj.values, ra.values)
        total += len(ra)
    assert total > 50
    assert "never" not in agg.items_seen and len(agg) == len(ev)
    assert dict(zip(ev.items_seen, ev.counts.tolist(), strict=True)) == {
        k: v for k, v in prefix.items() if v > 0
    }


def test_same_releases_in_a_fresh_process():
    key = fixed_key("fresh")
    code = f"""
from dpstream.noise import NoiseKey
from dpstream.mechanisms.unknown import UnknownDomainHistogram
k = NoiseKey.from_bytes(bytes.fromhex("{key.to_bytes().hex()}"))
u = UnknownDomainHistogram(40, max_items=2, key=k, epsilon=4.0, delta=0.05)
evs = [[["x"], [3, "y"]], [["x"]], []]
out = [u.step_batch(evs[t % 3]).values.tobytes().hex() for t in range(40)]
print(",".join(out), u.tau, u.threshold)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    u = UnknownDomainHistogram(40, max_items=2, key=key, epsilon=4.0, delta=0.05)
    evs = [[["x"], [3, "y"]], [["x"]], []]
    here = [u.step_batch(evs[t % 3]).values.tobytes().hex() for t in range(40)]
    assert res.stdout.strip() == f"{','.join(here)} {u.tau} {u.threshold}"
    assert any(here)  # something was released


# --------------------------------------------------------------------------- privacy


def exact_gaussian_delta(epsilon, mu):
    # Balle & Wang (2018), Theorem 8, written out independently of dpstream.privacy
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
        -epsilon / mu - mu / 2
    )


@pytest.mark.parametrize(
    "epsilon,delta,max_items,T", [(1.0, 1e-6, 1, 1000), (0.5, 1e-8, 3, 100), (4.0, 1e-5, 2, 50000)]
)
def test_calibration_splits_delta_to_minimise_the_threshold(epsilon, delta, max_items, T):
    key = fixed_key("cal")
    u = UnknownDomainHistogram(T, max_items=max_items, key=key, epsilon=epsilon, delta=delta)
    sp, g = u.privacy_split, u.privacy
    assert sp.chosen_by == "min-threshold"
    assert g.delta == delta and g.epsilon <= epsilon
    assert g.rho_delta == sp.threshold_part == max_items * u.threshold_delta
    assert sp.threshold_part + sp.conversion_delta <= delta
    mu = math.sqrt(max_items) / u.tau
    assert exact_gaussian_delta(epsilon, mu) <= sp.conversion_delta * (1 + 1e-9)
    assert exact_gaussian_delta(epsilon, mu * 1.001) > sp.conversion_delta  # tau is tight
    assert g.rho == pytest.approx(max_items / (2 * u.tau**2), rel=1e-12)
    # brute force over other splits: none gives a smaller threshold
    for f in np.linspace(0.02, 0.98, 25):
        v = UnknownDomainHistogram(
            T,
            max_items=max_items,
            key=key,
            epsilon=epsilon,
            delta=delta,
            threshold_delta=f * delta / max_items,
        )
        assert v.privacy_split.chosen_by == "user"
        assert v.privacy.epsilon <= epsilon
        assert u.threshold <= v.threshold * (1 + 1e-6)


def test_rho_and_tau_forms_need_threshold_delta():
    key = fixed_key("forms")
    with pytest.raises(ValueError, match="threshold_delta"):
        UnknownDomainHistogram(10, max_items=1, key=key, rho=0.5)
    with pytest.raises(ValueError, match="threshold_delta"):
        UnknownDomainHistogram(10, max_items=1, key=key, tau=1.0)
    u = UnknownDomainHistogram(10, max_items=2, key=key, rho=0.5, threshold_delta=1e-7)
    assert u.tau == pytest.approx(math.sqrt(2 / (2 * 0.5)), rel=1e-12)
    assert u.privacy.rho <= 0.5 and u.privacy.rho_delta == 2e-7
    assert u.privacy.delta == pytest.approx(2e-7 + dps.privacy.DEFAULT_DELTA, rel=1e-12)
    assert u.privacy_split.chosen_by == "reporting"
    with pytest.raises(ValueError, match="< delta"):
        UnknownDomainHistogram(
            10, max_items=2, key=key, epsilon=1.0, delta=1e-6, threshold_delta=5e-7
        )
    with pytest.raises(ValueError, match="threshold_delta"):
        UnknownDomainHistogram(10, max_items=1, key=key, tau=1.0, threshold_delta=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        UnknownDomainHistogram(10, max_items=1, key=key, rho=1.0, tau=1.0, threshold_delta=0.1)
    with pytest.raises(TypeError, match="remember"):
        UnknownDomainHistogram(10, max_items=1, key=key, tau=1.0, threshold_delta=0.1, remember=1)
    with pytest.raises(TypeError, match="key"):
        UnknownDomainHistogram(10, max_items=1, key=b"k" * 32, tau=1.0, threshold_delta=0.1)
    with pytest.raises(ValueError, match="max_items"):
        UnknownDomainHistogram(10, max_items=0, key=key, tau=1.0, threshold_delta=0.1)


# --------------------------------------------------------------------------- invalid input


def test_invalid_input_leaves_state_unchanged():
    key = fixed_key("bad-input")
    kw = {"max_items": 2, "key": key, "tau": 0.2, "threshold_delta": 0.4}
    u, ref = UnknownDomainHistogram(3, **kw), UnknownDomainHistogram(3, **kw)
    with pytest.raises(dps.InvalidEventError, match="max_items"):
        u.step_batch([["a"], ["a", "b", "c"]])
    with pytest.raises(TypeError, match="str"):
        u.step("ab")
    with pytest.raises(TypeError, match="items"):
        u.step_batch([["a"], [1.5]])  # a float item: refused before anything changes
    assert u.t == 0 and len(u) == 0
    ra, rr = u.step_batch([["a", "b"]] * 5), ref.step_batch([["a", "b"]] * 5)
    assert ra.items == rr.items and np.array_equal(ra.values, rr.values) and len(ra) == 2
    u.step(["b", "b"])  # an event is a set
    assert dict(zip(u.items_seen, u.counts.tolist(), strict=True)) == {"a": 5, "b": 6}
    u.step([])
    with pytest.raises(dps.HorizonExceededError):
        u.step(["a"])
    with pytest.raises(dps.HorizonExceededError):
        u.release(4, {"a": 5})
    assert u.t == 3


def test_aggregate_mode_checks():
    u = UnknownDomainHistogram(10, max_items=1, key=fixed_key("agg"), tau=1.0, threshold_delta=0.1)
    u.release(2, {"a": 2, "b": 1})
    with pytest.raises(ValueError, match="greater than the last"):
        u.release(2, {"a": 2, "b": 1})
    with pytest.raises(ValueError, match="decrease"):
        u.release(3, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="decrease"):
        u.release(3, {"a": 2})  # b was seen: a missing item counts 0
    with pytest.raises(TypeError, match="integers"):
        u.release(3, {"a": 2.0, "b": 1})
    with pytest.raises(ValueError, match=">= 0"):
        u.release(3, {"a": 2, "b": 1, "c": -1})
    with pytest.raises(TypeError, match="Mapping"):
        u.release(3, [2, 1])
    with pytest.raises(TypeError, match="items"):
        u.release(3, {"a": 2, "b": 1, 2.5: 1})
    assert u.t == 2 and len(u) == 2
    assert u.release(5, {"a": 2, "b": 1, "c": 4}).t == 5 and len(u) == 3
