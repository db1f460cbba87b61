"""MetaHistogram: MetaAlgo (algo:MetaAlgo), one-shot mechanisms on the cells of the tree."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from scipy.special import ndtri

import dpstream as dps
from dpstream import tree
from dpstream.mechanisms.meta import MetaHistogram
from dpstream.oneshot import unknown
from dpstream.oneshot.known import gaussian_histogram, gumbel_top_k
from dpstream.privacy import DEFAULT_DELTA, epsilon_bun_steinke

from .conftest import Z_TOL, fixed_key

VARIANTS = {
    "gaussian": {"domain": [f"i{u}" for u in range(12)], "max_items": 3},
    "gumbel": {"domain": [f"i{u}" for u in range(12)], "k": 3},
    "unknown-gaussian": {"kbar": 5, "max_items": 3},
    "unknown-gumbel": {"kbar": 5, "k": 3},
}


def random_stream(rng, steps, n_items=12, max_items=3, max_events=3):
    return [
        [
            [
                f"i{u}"
                for u in rng.choice(n_items, size=rng.integers(0, max_items + 1), replace=False)
            ]
            for _ in range(rng.integers(0, max_events + 1))
        ]
        for _ in range(steps)
    ]


def block_histogram(stream, level, j, base):
    """Brute force: the histogram of the events at the steps of cell (level, j)."""
    lo, hi = tree.cell_span(level, j, base)
    c = Counter()
    for events in stream[lo - 1 : hi]:
        for event in events:
            c.update(set(event))
    return c


def brute_force_release(m, stream, t):
    """The release at t recomputed from the definition: one-shot calls on the cells I_t."""
    tau = math.sqrt(m.levels) * m.tau
    total: dict = {}
    for level, j in tree.cells_at(t, m.base):
        hist = block_histogram(stream, level, j, m.base)
        purpose = f"{m.noise_scope}/cell-{level}-{j}"
        if m.oneshot == "gaussian":
            out = gaussian_histogram(
                {u: hist.get(u, 0) for u in m.domain}, tau=tau, key=m.key, purpose=purpose
            )
        elif m.oneshot == "gumbel":
            out = gumbel_top_k(
                {u: hist.get(u, 0) for u in m.domain}, k=m.k, tau=tau, key=m.key, purpose=purpose
            )
        elif m.oneshot == "unknown-gaussian":
            out = unknown.unknown_domain_gaussian(
                dict(hist),
                kbar=m.kbar,
                tau=tau,
                delta=m.threshold_delta / m.levels,
                key=m.key,
                purpose=purpose,
            )
        else:
            out = unknown.unknown_domain_gumbel(
                dict(hist),
                k=m.k,
                kbar=m.kbar,
                tau=tau,
                delta=m.threshold_delta / m.levels,
                key=m.key,
                purpose=purpose,
            )
        for u, v in out.counts.items():  # an item a cell did not release contributes 0
            total[u] = total.get(u, 0.0) + v
    return total


@pytest.mark.parametrize("oneshot", list(VARIANTS))
@pytest.mark.parametrize("base", [2, 3])
def test_release_is_the_sum_of_one_shot_cells(oneshot, base):
    rng = np.random.default_rng(7)
    horizon = 40
    stream = random_stream(rng, horizon)
    # skew the stream so the unknown-domain thresholds are crossed: i0 and i1 are frequent
    stream = [
        events + [["i0", f"i{1 + (t // 6) % 11}"]] * 3 + [["i0"]] * 2
        for t, events in enumerate(stream)
    ]
    stream = [[], []] + stream[:-2]  # two empty steps first: "gumbel" must wait
    extra = {"threshold_delta": 0.05} if oneshot.startswith("unknown") else {}
    m = MetaHistogram(
        horizon,
        oneshot=oneshot,
        key=fixed_key(f"bf-{oneshot}"),
        base=base,
        tau=0.7,
        stream="bf",
        **VARIANTS[oneshot],
        **extra,
    )
    released = waited = 0
    started = False
    for t, events in enumerate(stream, start=1):
        rel = m.step_batch(events)
        released += len(rel)
        expected = brute_force_release(m, stream, t)
        if oneshot.endswith("gumbel"):  # the top-k of the sum
            top = sorted(expected.items(), key=lambda kv: -kv[1])[: m.k]
            if oneshot == "gumbel" and not started:
                # "not yet" until the largest value clears z sigma_t (MetaHistogram docstring)
                z = float(-ndtri(0.05 / (m.k * (base - 1) * m.levels * horizon)))
                sigma = math.sqrt(sum(tree.digits(t, base)) * m.levels) * 0.7
                started = top[0][1] > z * sigma
                if not started:
                    assert rel.items == [] and rel.meta == {"status": "not yet"}
                    waited += 1
                    continue
            assert list(rel.items) == [u for u, _ in top]
            assert np.allclose(rel.values, [v for _, v in top], rtol=0, atol=1e-9)
        else:
            assert set(rel.items) == set(expected)
            got = rel.counts
            assert all(abs(got[u] - expected[u]) < 1e-9 for u in expected)
        if oneshot == "gaussian":
            assert list(rel.items) == m.domain
    assert released >= horizon // 2  # not a vacuous comparison of empty releases
    if oneshot == "gumbel":
        assert waited >= 1  # the comparison covered "not yet" releases too


@pytest.mark.parametrize("oneshot", list(VARIANTS))
def test_every_cell_is_processed_exactly_once_when_it_closes(oneshot, monkeypatch):
    """Spy on the per-cell one-shot call: each cell of some I_t once, at its last step.

    A cell (l, j) with j a multiple of r is never in any I_t (its parent closes at
    the same step), so it need not be privatised; every other cell must be, once.
    """
    calls = []
    original = MetaHistogram._noisy_cell

    def spy(self, level, j):
        calls.append((level, j, self.t))
        return original(self, level, j)

    monkeypatch.setattr(MetaHistogram, "_noisy_cell", spy)
    horizon, base = 100, 3
    rng = np.random.default_rng(1)
    m = MetaHistogram(
        horizon, oneshot=oneshot, key=fixed_key("calls"), base=base, rho=1.0, **VARIANTS[oneshot]
    )
    for events in random_stream(rng, horizon):
        m.step_batch(events)
    cells = [(lv, j) for lv, j, _ in calls]
    assert len(cells) == len(set(cells))  # exactly once
    used = {c for t in range(1, horizon + 1) for c in tree.cells_at(t, base)}
    assert set(cells) == used
    for lv, j, t in calls:
        assert t == tree.cell_span(lv, j, base)[1]  # when it closes


@pytest.mark.statistical
@pytest.mark.parametrize("base", [2, 3])
def test_gaussian_variant_has_knownbase_distribution(base):
    """noisy - true at t is N(0, |I_t| L_r tau^2), as for KnownBase (thm:BinMechUtility).

    40 keys x 2000 items: n = 80,000 draws per t. Mean within Z_TOL sigma/sqrt(n),
    variance ratio within Z_TOL sqrt(2/n) = 2.5%; one missing or extra cell in a
    sum is a change of at least 1/|I_t| >= 1/(2 (r-1) L) in the variance.
    """
    horizon, tau, d = 64, 0.6, 2000
    check_at = [1, 5, 31, 48, 64]
    domain = list(range(d))
    samples = {t: [] for t in check_at}
    for rep in range(40):
        m = MetaHistogram(
            horizon,
            oneshot="gaussian",
            domain=domain,
            max_items=1,
            base=base,
            key=fixed_key(f"mg{rep}"),
            tau=tau,
        )
        true = np.zeros(d)
        for t in range(1, horizon + 1):
            rel = m.step([t % d])
            true[t % d] += 1
            if t in samples:
                samples[t].append(rel.values - true)
    levels = tree.num_levels(horizon, base)
    for t, parts in samples.items():
        x = np.concatenate(parts)
        sigma2 = sum(tree.digits(t, base)) * levels * tau**2
        assert abs(x.mean()) < Z_TOL * math.sqrt(sigma2 / x.size), t
        assert abs(x.var() / sigma2 - 1) < Z_TOL * math.sqrt(2 / x.size), t


def test_privacy_of_each_variant_matches_the_theorem():
    key = fixed_key("priv")
    dom = VARIANTS["gaussian"]["domain"]
    tau = 2.0
    m = MetaHistogram(100, oneshot="gaussian", domain=dom, max_items=3, key=key, tau=tau)
    assert m.privacy.rho == pytest.approx(3 / (2 * tau**2), rel=1e-12)
    assert m.privacy.conversion == "gaussian-exact" and m.privacy.rho_delta == 0
    m = MetaHistogram(100, oneshot="gumbel", domain=dom, k=4, key=key, tau=tau)
    assert m.privacy.rho == pytest.approx(4 / tau**2, rel=1e-12)
    assert m.privacy.rho_delta == 0 and m.privacy.conversion != "gaussian-exact"
    m = MetaHistogram(100, oneshot="gumbel", domain=dom, k=4, key=key, rho=0.5)
    assert 4 / m.tau**2 == pytest.approx(0.5, rel=1e-12) and 4 / m.tau**2 <= 0.5

    # unknown-gaussian: (eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')
    m = MetaHistogram(
        100, oneshot="unknown-gaussian", kbar=5, max_items=3, key=key, tau=tau, threshold_delta=1e-8
    )
    assert m.privacy.rho == pytest.approx(3 / (2 * tau**2), rel=1e-12)
    assert m.privacy.rho_delta == pytest.approx(3e-8, rel=1e-12)
    assert m.privacy.delta == pytest.approx(3e-8 + DEFAULT_DELTA, rel=1e-12)
    assert m.cell_delta == pytest.approx(1e-8 / m.levels, rel=1e-12)
    assert m.cell_tau == pytest.approx(math.sqrt(m.levels) * tau, rel=1e-12)
    # the paper's conversion bounds ours from above
    assert m.privacy.epsilon <= epsilon_bun_steinke(3 / (2 * tau**2), DEFAULT_DELTA)

    # unknown-gumbel: (eps(k/tau^2, delta'), 2k delta + delta') with the CKS20 conversion,
    # tighter than eq:epsilon
    m = MetaHistogram(
        100, oneshot="unknown-gumbel", kbar=5, k=3, key=key, tau=tau, threshold_delta=1e-8
    )
    rho = 3 / tau**2
    assert m.privacy.rho == pytest.approx(rho, rel=1e-12)
    assert m.privacy.rho_delta == pytest.approx(6e-8, rel=1e-12)  # 2k delta, kbar <= 2k
    assert m.privacy.conversion == "cks2020"
    assert m.privacy.epsilon == pytest.approx(cks_epsilon(rho, DEFAULT_DELTA), rel=1e-7)
    assert m.privacy.epsilon < rho + 2 * math.sqrt(rho * math.log(1 / DEFAULT_DELTA))
    # with kbar > 2k the UnkGumb theorem's kbar delta is the larger charge
    m = MetaHistogram(
        100, oneshot="unknown-gumbel", kbar=20, k=3, key=key, tau=tau, threshold_delta=1e-8
    )
    assert m.privacy.rho_delta == pytest.approx(20e-8, rel=1e-12)


def cks_epsilon(rho: float, delta: float) -> float:
    """CKS20 Cor. 13 by a direct 1-D minimisation over alpha (independent of dpstream)."""
    from scipy.optimize import minimize_scalar

    def f(a: float) -> float:
        return a * rho + (math.log(1 / delta) + (a - 1) * math.log(1 - 1 / a) - math.log(a)) / (
            a - 1
        )

    res = minimize_scalar(f, bounds=(1 + 1e-9, 1e4), method="bounded", options={"xatol": 1e-12})
    return min(float(res.fun), rho + 2 * math.sqrt(rho * math.log(1 / delta)))


@pytest.mark.parametrize("oneshot", ["unknown-gaussian", "unknown-gumbel"])
def test_unknown_variants_split_an_epsilon_delta_budget(oneshot):
    kw = VARIANTS[oneshot]
    m = MetaHistogram(100, oneshot=oneshot, key=fixed_key("split"), epsilon=1.0, delta=1e-6, **kw)
    c = kw["max_items"] if oneshot == "unknown-gaussian" else max(2 * kw["k"], kw["kbar"])
    assert m.privacy.delta == 1e-6
    assert m.threshold_delta == pytest.approx(1e-6 / (2 * c), rel=1e-12)
    assert m.privacy.rho_delta == pytest.approx(0.5e-6, rel=1e-9)
    assert m.privacy.epsilon <= 1.0 and m.privacy.epsilon == pytest.approx(1.0, rel=1e-6)
    if oneshot == "unknown-gumbel":
        rho = kw["k"] / m.tau**2
        assert cks_epsilon(rho, 1e-6 - m.privacy.rho_delta) <= 1.0 + 1e-9
        # the noise is below what eq:epsilon would need for the same claim
        assert epsilon_bun_steinke(rho, 1e-6 - m.privacy.rho_delta) > 1.0
    with pytest.raises(ValueError, match="threshold"):
        MetaHistogram(
            100,
            oneshot=oneshot,
            key=fixed_key("split"),
            epsilon=1.0,
            delta=1e-6,
            threshold_delta=1e-6,
            **kw,
        )


def test_same_key_same_releases_and_in_a_fresh_process():
    key = fixed_key("fresh-meta")
    code = f"""
from dpstream import NoiseKey
from dpstream.mechanisms.meta import MetaHistogram
k = NoiseKey.from_bytes(bytes.fromhex("{key.to_bytes().hex()}"))
out = []
for oneshot, kw in [("gumbel", dict(domain=list(range(9)), k=2)),
                    ("unknown-gumbel", dict(kbar=4, k=2))]:
    m = MetaHistogram(30, oneshot=oneshot, key=k, rho=2.0, **kw)
    for t in range(30):
        r = m.step([t % 9, (t // 4) % 9, 3])
        out.append(repr(list(r.items)) + r.values.tobytes().hex())
print(";".join(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = []
    for oneshot, kw in [
        ("gumbel", {"domain": list(range(9)), "k": 2}),
        ("unknown-gumbel", {"kbar": 4, "k": 2}),
    ]:
        m = MetaHistogram(30, oneshot=oneshot, key=key, rho=2.0, **kw)
        for t in range(30):
            r = m.step([t % 9, (t // 4) % 9, 3])
            here.append(repr(list(r.items)) + r.values.tobytes().hex())
    assert res.stdout.strip() == ";".join(here)
    other = MetaHistogram(30, oneshot="gumbel", key=fixed_key("x"), rho=2.0, domain=range(9), k=2)
    other.started = True  # skip the "not yet" post-processing: compare the noisy values
    theirs = [other.step([t % 9, (t // 4) % 9, 3]).values.tobytes().hex() for t in range(30)]
    assert any(theirs) and not any(v in res.stdout for v in theirs if v)


def test_memory_stays_bounded_by_the_cells_alive():
    """Noisy cells kept: <= r - 1 per level, each with <= k items; open blocks: one per level."""
    horizon, base, k = 2000, 2, 3
    m = MetaHistogram(
        horizon, oneshot="gumbel", domain=range(50), k=k, base=base, key=fixed_key("mem"), rho=1.0
    )
    u = MetaHistogram(
        horizon,
        oneshot="unknown-gumbel",
        kbar=6,
        k=k,
        base=base,
        key=fixed_key("mem"),
        rho=1.0,
        threshold_delta=0.1,
    )
    rng = np.random.default_rng(0)
    for _ in range(horizon):
        events = [list(rng.integers(0, 50, size=3)) + [0] for _ in range(3)]
        m.step_batch(events)
        u.step_batch(events)
        for mech in (m, u):
            kept = [len(level) for level in mech._level_maps]
            assert all(n <= (base - 1) * k for n in kept)
        assert m._open.shape == (m.levels, 50) and len(u._open_maps) == u.levels
        assert sum(len(c) for c in u._open_maps) <= u.levels * 50
    assert sum(len(level) for level in u._level_maps) > 0


def test_errors():
    key = fixed_key("err")
    dom = ["a", "b", "c"]
    with pytest.raises(ValueError, match="oneshot"):
        MetaHistogram(10, oneshot="laplace", key=key, rho=1.0)
    with pytest.raises(ValueError, match="domain"):
        MetaHistogram(10, oneshot="gumbel", k=1, key=key, rho=1.0)
    with pytest.raises(ValueError, match="max_items"):
        MetaHistogram(10, oneshot="gaussian", domain=dom, key=key, rho=1.0)
    with pytest.raises(ValueError, match="k must be at most"):
        MetaHistogram(10, oneshot="gumbel", domain=dom, k=4, key=key, rho=1.0)
    with pytest.raises(ValueError, match="no domain"):
        MetaHistogram(10, oneshot="unknown-gumbel", domain=dom, k=1, kbar=2, key=key, rho=1.0)
    with pytest.raises(TypeError, match="kbar"):
        MetaHistogram(10, oneshot="unknown-gaussian", max_items=1, key=key, rho=1.0)
    with pytest.raises(ValueError, match="kbar"):
        MetaHistogram(10, oneshot="gaussian", domain=dom, max_items=1, kbar=3, key=key, rho=1.0)
    m = MetaHistogram(3, oneshot="gaussian", domain=dom, max_items=2, key=key, rho=1.0)
    ref = MetaHistogram(3, oneshot="gaussian", domain=dom, max_items=2, key=key, rho=1.0)
    with pytest.raises(dps.InvalidEventError, match="max_items"):
        m.step(["a", "b", "c"])
    with pytest.raises(dps.InvalidEventError, match="not in the domain"):
        m.step_batch([["a"], ["zz"]])
    assert m.t == 0
    assert np.array_equal(m.step(["a"]).values, ref.step(["a"]).values)
    with pytest.raises(NotImplementedError, match="event mode"):
        m.release(2, {"a": 1})
    m.step([])
    m.step([])
    with pytest.raises(dps.HorizonExceededError):
        m.step(["a"])
    u = MetaHistogram(4, oneshot="unknown-gumbel", kbar=2, k=1, key=key, rho=1.0)
    with pytest.raises(TypeError, match="str, int or bytes"):
        u.step_batch([["a"], [1.5]])
    assert u.t == 0 and all(not c for c in u._open_maps)


def test_gumbel_waits_while_every_count_is_zero():
    """oneshot="gumbel" on an empty stream: a list is started in at most beta = 5% of runs
    (union bound; 150 keys, 0.05 + Z_TOL SE allowed). Power: without the wait
    (start_z = 0) every run releases a random list at t = 1."""
    n, horizon = 150, 30
    started = 0
    for rep in range(n):
        m = MetaHistogram(
            horizon, oneshot="gumbel", domain=range(20), k=3, key=fixed_key(f"mz{rep}"), rho=1.0
        )
        started += any(m.step([]).items for _ in range(horizon))
    assert started / n <= 0.05 + Z_TOL * math.sqrt(0.05 * 0.95 / n)
    m = MetaHistogram(
        horizon, oneshot="gumbel", domain=range(20), k=3, key=fixed_key("mz"), rho=1.0
    )
    m.start_z = 0.0
    assert len(m.step([]).items) == 3


@pytest.mark.parametrize("oneshot", ["gaussian", "gumbel"])
def test_another_domain_draws_other_noise(oneshot):
    """Review 86: the known-domain variants' noise scope left out the domain, so one key
    and stream over two domains drew the same noise, and with truncation (which keeps
    other items under another domain) the difference of two releases was the exact
    difference of their true counts. Empty steps: each value is noise alone, so equal
    values would be equal noise (two independent Gaussians are equal with probability
    0)."""
    key = fixed_key("meta-domain")
    extra = {"max_items": 2} if oneshot == "gaussian" else {"k": 1}

    def meta(domain):
        return dps.MetaHistogram(8, oneshot=oneshot, domain=domain, key=key, rho=1.0, **extra)

    ref, same = meta(["a", "b"]), meta(["b", "a"])  # the order of a domain is no change
    others = [meta(["a", "b", "c"]), meta(["a", "c"])]
    assert len({ref.noise_scope, *(o.noise_scope for o in others)}) == 3
    assert same.noise_scope == ref.noise_scope
    if oneshot == "gaussian":
        r0 = ref.step([]).counts
        assert same.step([]).counts == r0
        for other in others:
            assert other.step([]).counts["a"] != r0["a"]
