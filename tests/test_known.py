"""KnownBase (Algorithm 2) and BinMech (Algorithm 1)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import dpstream as dps
from dpstream import tree

from .conftest import Z_TOL, fixed_key


def random_stream(rng, domain, steps, max_items, max_events=3):
    return [
        [
            list(rng.choice(domain, size=rng.integers(0, max_items + 1), replace=False))
            for _ in range(rng.integers(0, max_events + 1))
        ]
        for _ in range(steps)
    ]


@pytest.mark.statistical
@pytest.mark.parametrize("base", [2, 3, None])
def test_noisy_counts_unbiased_with_tree_variance(base):
    """noisy - true at t is N(0, |I_t| L_r tau^2), checked over 40 keys x 5000 items.

    Tolerances (n = 200,000 samples of the noise at each t, all independent:
    distinct keyed addresses): the sample mean divided by sigma/sqrt(n) is
    N(0, 1), and the sample variance divided by sigma^2 is 1 + N(0, 2/n)
    (normal data). Both are allowed Z_TOL = 5 standard errors, i.e. a relative
    variance error of 5 sqrt(2/n) = 1.6%; a scale error of 30% (or a missing
    cell) would be 40x outside that.
    """
    horizon, tau, n_items, n_keys = 200, 0.7, 5000, 40
    check_at = [1, 7, 63, 100, 127, 200]
    domain = list(range(n_items))
    samples = {t: [] for t in check_at}
    for k in range(n_keys):
        h = dps.KnownDomainHistogram(
            domain,
            horizon,
            max_items=1,
            counter="tree",
            base=base,
            key=fixed_key(f"var{k}"),
            tau=tau,
        )
        for t in range(1, horizon + 1):
            rel = h.step_batch([[t % n_items]])
            if t in samples:
                samples[t].append(rel.values - h.counts)
    r = h.base
    levels = tree.num_levels(horizon, r)
    for t, parts in samples.items():
        x = np.concatenate(parts)
        n = x.size
        sigma2 = sum(tree.digits(t, r)) * levels * tau**2
        assert abs(x.mean()) < Z_TOL * math.sqrt(sigma2 / n), t
        assert abs(x.var() / sigma2 - 1) < Z_TOL * math.sqrt(2 / n), t


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_same_key_same_stream_same_releases_and_modes_agree(counter):
    rng = np.random.default_rng(1)
    domain = [f"item{i}" for i in range(30)]
    stream = random_stream(rng, domain, 60, 3)
    key = fixed_key("modes")

    def make(k=key):
        return dps.KnownDomainHistogram(domain, 60, max_items=3, key=k, rho=0.3, counter=counter)

    a, b, agg, jumpy, other = make(), make(), make(), make(), make(fixed_key("other"))
    assert a.counter == counter
    prefix = dict.fromkeys(domain, 0)
    for t, events in enumerate(stream, start=1):
        ra, rb, ro = a.step_batch(events), b.step_batch(events), other.step_batch(events)
        for event in events:
            for item in event:
                prefix[item] += 1
        rg = agg.release(t, prefix)
        assert np.array_equal(ra.values, rb.values)
        assert np.array_equal(ra.values, rg.values)  # event mode == aggregate mode, bit for bit
        assert not np.array_equal(ra.values, ro.values)
        assert ra.t == t and list(ra.items) == domain
        if t % 7 == 0:  # aggregate mode may skip steps (a jump recomputes from scratch)
            rj = jumpy.release(t, prefix)
            assert np.array_equal(ra.values, rj.values)
    # the true counts are what the stream says
    assert dict(zip(domain, a.counts.tolist(), strict=False)) == prefix


def test_same_releases_in_a_fresh_process():
    key = fixed_key("fresh")
    code = f"""
import dpstream as dps
k = dps.NoiseKey.from_bytes(bytes.fromhex("{key.to_bytes().hex()}"))
h = dps.KnownDomainHistogram(["x", "y", 3], 50, max_items=2, key=k, epsilon=1.0, delta=1e-6)
out = [h.step([["x"], [3, "y"], []][t % 3]).values.tobytes().hex() for t in range(50)]
print(",".join(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    h = dps.KnownDomainHistogram(["x", "y", 3], 50, max_items=2, key=key, epsilon=1.0, delta=1e-6)
    here = [h.step([["x"], [3, "y"], []][t % 3]).values.tobytes().hex() for t in range(50)]
    assert res.stdout.strip() == ",".join(here)


def test_privacy_is_delta0_over_two_tau_squared():
    h = dps.KnownDomainHistogram(range(5), 100, max_items=3, key=fixed_key("p"), tau=2.0)
    assert h.privacy.rho == pytest.approx(3 / (2 * 2.0**2), rel=1e-12)
    h = dps.KnownDomainHistogram(range(5), 100, max_items=3, key=fixed_key("p"), rho=0.25)
    assert 3 / (2 * h.tau**2) <= 0.25  # rounded towards more noise
    assert 3 / (2 * h.tau**2) == pytest.approx(0.25, rel=1e-12)
    c = dps.TreeCounter(1000, key=fixed_key("c"), rho=0.5)
    assert c.base == 4 and c.privacy.rho == pytest.approx(1 / (2 * c.tau**2))


def exact_gaussian_delta(epsilon, mu):
    # Balle & Wang (2018), Theorem 8, written out independently of dpstream.privacy
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
        -epsilon / mu - mu / 2
    )


def paper_tau(epsilon, delta, a):
    # largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon, then rho = a / tau^2
    lg = math.log(1 / delta)
    rho = (math.sqrt(lg + epsilon) - math.sqrt(lg)) ** 2
    return math.sqrt(a / rho)


@pytest.mark.parametrize(
    "epsilon,delta,max_items", [(1.0, 1e-6, 1), (0.5, 1e-8, 3), (4.0, 1e-5, 2)]
)
def test_calibration_meets_exact_gaussian_delta_and_beats_paper(epsilon, delta, max_items):
    h = dps.KnownDomainHistogram(
        range(3), 1000, max_items=max_items, key=fixed_key("cal"), epsilon=epsilon, delta=delta
    )
    mu = math.sqrt(max_items) / h.tau  # l2 sensitivity sqrt(Delta0 L) over noise sqrt(L) tau
    assert exact_gaussian_delta(epsilon, mu) <= delta * (1 + 1e-9)
    # the smallest tau: 0.1% less noise breaks the target
    assert exact_gaussian_delta(epsilon, mu * 1.001) > delta
    tp = paper_tau(epsilon, delta, max_items / 2)
    print(f"tau exact-Gaussian={h.tau:.4f} vs paper conversion={tp:.4f}")
    assert h.tau < tp
    assert h.privacy.epsilon <= epsilon and h.privacy.delta == delta


def test_invalid_input_leaves_state_unchanged():
    key = fixed_key("bad")
    h = dps.KnownDomainHistogram(["a", "b", "c"], 3, max_items=2, key=key, rho=1.0)
    ref = dps.KnownDomainHistogram(["a", "b", "c"], 3, max_items=2, key=key, rho=1.0)
    with pytest.raises(dps.InvalidEventError, match="max_items"):
        h.step(["a", "b", "c"])
    with pytest.raises(dps.InvalidEventError, match="not in the domain"):
        h.step_batch([["a"], ["zzz"]])
    with pytest.raises(TypeError, match="str"):
        h.step("ab")
    assert h.t == 0
    assert np.array_equal(h.step(["a"]).values, ref.step(["a"]).values)
    h.step([])
    h.step(["b", "b"])  # an event is a set: b counts once
    assert h.counts.tolist() == [1, 1, 0]
    with pytest.raises(dps.HorizonExceededError):
        h.step(["a"])
    with pytest.raises(dps.HorizonExceededError):
        h.release(4, {"a": 1})
    assert h.t == 3


def test_aggregate_mode_checks():
    h = dps.KnownDomainHistogram(["a", "b"], 10, max_items=1, key=fixed_key("agg"), rho=1.0)
    h.release(2, {"a": 2})
    with pytest.raises(ValueError, match="greater than the last"):
        h.release(2, {"a": 2})
    with pytest.raises(ValueError, match="decrease"):
        h.release(3, {"a": 1})
    with pytest.raises(dps.InvalidEventError):
        h.release(3, {"q": 1})
    with pytest.raises(ValueError, match="one entry per domain item"):
        h.release(3, [1, 2, 3])
    assert h.release(3, np.array([2, 1])).t == 3


def test_counts_above_2_to_the_53_are_refused():
    """Review 86: a count is made a float64 before its noise is added; above 2^53
    neighbouring counts round 2 or more apart (2^60 + 128 and + 129 released 256 apart
    under noise of std 1.3), so a release would tell them apart whatever the noise. Each
    way a count comes in refuses them; 2^53 itself is taken."""
    big = 2**53 + 1
    h = dps.KnownDomainHistogram(["a", "b"], 10, max_items=1, key=fixed_key("big"), rho=1.0)
    for counts in ({"a": big}, [big, 0], np.array([big, 0]), np.array([big, 0], np.uint64)):
        with pytest.raises(ValueError, match="2\\^53"):
            h.release(1, counts)
    assert h.t == 0
    assert h.release(1, {"a": 2**53}).t == 1
    c = dps.TreeCounter(10, key=fixed_key("big-c"), rho=1.0)
    with pytest.raises(ValueError, match="2\\^53"):
        c.release(1, big)
    c.step(2**53)
    with pytest.raises(ValueError, match="2\\^53"):
        c.step(1)  # the running count would pass 2^53
    assert c.t == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({}, "rho"),
        ({"rho": 1.0, "tau": 1.0}, "exactly one"),
        ({"epsilon": 1.0}, "delta"),
        ({"rho": -1.0}, "rho"),
        ({"epsilon": 1.0, "delta": 2.0}, "delta"),
    ],
)
def test_budget_errors_name_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=fixed_key("e"), **kwargs)


def test_constructor_errors():
    k = fixed_key("e")
    with pytest.raises(ValueError, match="distinct"):
        dps.KnownDomainHistogram(["a", "a"], 10, max_items=1, key=k, rho=1)
    with pytest.raises(ValueError, match="max_items"):
        dps.KnownDomainHistogram(["a"], 10, max_items=0, key=k, rho=1)
    with pytest.raises(ValueError, match="base"):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=k, rho=1, base=1)
    with pytest.raises(TypeError, match="key"):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=b"x" * 32, rho=1)


def test_tree_counter_counts_and_agrees_with_one_item_histogram():
    key = fixed_key("ctr")
    c = dps.TreeCounter(100, key=key, tau=1.0, stream="s")
    h = dps.KnownDomainHistogram(
        ["__counter__"], 100, max_items=1, key=key, tau=1.0, stream="s", counter="tree"
    )
    bits = np.random.default_rng(3).integers(0, 2, 100)
    for b in bits:
        assert c.step(int(b)) == h.step(["__counter__"] if b else []).values[0]
    assert c.count == bits.sum()


def test_tree_noise_restored_from_its_level_sums_continues_bit_for_bit():
    from dpstream.mechanisms.tree_noise import TreeNoise
    from dpstream.noise import NoiseSource

    src = NoiseSource(fixed_key("restore"), "r")
    prepared = src.prepare(range(50))
    a = TreeNoise(src, 300, 3, 1.7)
    a.add_items(prepared)
    for t in range(1, 118):
        a.advance(t)
    b = TreeNoise.restore(src, 300, 3, 1.7, a.prepared, a.t, a.level_sums())
    assert np.array_equal(a.noise(), b.noise())
    for t in range(118, 300, 7):  # steps and jumps after the restore
        a.advance(t)
        b.advance(t)
        assert np.array_equal(a.noise(), b.noise())
    with pytest.raises(ValueError, match="shape"):
        TreeNoise.restore(src, 300, 3, 1.7, a.prepared, 5, np.zeros((2, 50)))


def test_every_setting_that_changes_the_release_changes_the_noise():
    """Review finding 7: the tree purpose ignored max_items and the domain, so two runs
    that truncate or filter differently shared all noise, and the difference of their
    releases was the exact difference of their (differently processed) true counts."""
    key = fixed_key("scope")
    base = dict(key=key, tau=1.0, base=3)
    ref = dps.KnownDomainHistogram(["a", "b"], 50, max_items=2, **base)
    same = dps.KnownDomainHistogram(["a", "b"], 50, max_items=2, **base)
    others = [
        dps.KnownDomainHistogram(["a", "b"], 50, max_items=3, **base),
        dps.KnownDomainHistogram(["a", "b", "c"], 50, max_items=2, **base),
        dps.KnownDomainHistogram(["a", "c"], 50, max_items=2, **base),
    ]
    r0 = ref.step([]).counts
    assert same.step([]).counts == r0  # identical settings replay identically
    # the order of the domain changes no release, and no noise (the tag is of the set)
    assert dps.KnownDomainHistogram(["b", "a"], 50, max_items=2, **base).step([]).counts == r0
    for other in others:
        got = other.step([]).counts
        assert got["a"] != r0["a"], other.tree_purpose
    u = dps.UnknownDomainHistogram(50, max_items=2, **base, threshold_delta=0.1)
    assert u.tree_purpose not in {ref.tree_purpose, *(o.tree_purpose for o in others)}


@pytest.mark.parametrize("domain", [["a", "b", "c"], [1, 2, 3]])
def test_releases_share_one_immutable_item_sequence(domain):
    """Every release of a known domain carries the same read-only sequence (formatters
    encode its text once per run; str items are a view of the compact table, others a
    tuple), and nothing done to a published release can relabel the next."""
    h = dps.KnownDomainHistogram(domain, 8, max_items=1, key=fixed_key("tuple"), rho=1.0)
    r1, r2 = h.step_batch([[domain[0]]]), h.step_batch([[domain[1]]])
    assert r1.items is r2.items
    assert list(r1.items) == domain == h.domain
    if isinstance(domain[0], str):
        assert r1.items == domain  # the view equals any sequence of its items
    with pytest.raises(AttributeError):
        r1.items.reverse()  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        r1.items[0] = domain[2]  # type: ignore[index]
    assert list(r2.items) == domain


def test_a_failed_blt_step_leaves_no_half_stepped_state(monkeypatch):
    """An error inside the fused BLT step (after some columns took the step) makes the
    noise refuse to go on, rather than step those columns twice on a retry."""
    from dpstream.mechanisms import blt_noise

    h = dps.KnownDomainHistogram(
        [f"i{j}" for j in range(50)],
        16,
        max_items=1,
        key=fixed_key("blt-fail"),
        rho=1.0,
        counter="blt",
    )
    h.release(1, np.zeros(50, dtype=np.int64))
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise MemoryError("simulated")

    monkeypatch.setattr(blt_noise, "stream_step", failing)
    with pytest.raises(MemoryError):
        h.release(2, np.zeros(50, dtype=np.int64))
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="half-stepped"):
        h.release(3, np.zeros(50, dtype=np.int64))
    assert calls


def test_domain_tag_is_the_sum_of_item_fingerprints():
    """domain_tag against its definition: the item count and the sum of the items'
    fingerprints (SHA-256 of a prefix and the item's canonical bytes, first 16 bytes
    big-endian) mod 2^128, whatever the order; the sum wraps many times here."""
    import hashlib

    from dpstream.mechanisms.known import domain_tag
    from dpstream.noise import encode_item

    items = [f"it{i}" for i in range(3000)] + [7, b"raw", "\u00e9", "\ud800", ""]
    total = sum(
        int.from_bytes(
            hashlib.sha256(b"dpstream/domain-item\0" + encode_item(x)).digest()[:16], "big"
        )
        for x in items
    )
    want = f"{len(items)}:{total % (1 << 128):032x}"
    assert total >= 1 << 138  # the modulus matters
    assert domain_tag(items) == want == domain_tag(reversed(items))
    assert domain_tag([]) == f"0:{0:032x}"


@pytest.mark.parametrize("counter", ["blt", "tree"])
def test_counts_kept_as_int32_until_one_needs_more_with_the_same_releases(counter):
    """Counts are kept in 4 bytes per item while every one fits, in 8 from then on; the
    releases are those of a mechanism that jumped to the same counts directly (a skipped
    step gives the same bits, test above), and ``counts`` is always int64 and exact."""
    domain = ["a", "b", "c", "d"]
    key = fixed_key("int32-counts")

    def mech():
        return dps.KnownDomainHistogram(domain, 50, max_items=2, key=key, rho=1.0, counter=counter)

    h = mech()
    rng = np.random.default_rng(7)
    steps = random_stream(rng, domain, 5, 2)
    brute = np.zeros(4, dtype=np.int64)
    for evs in steps:
        rel = h.step_batch(evs)
        for ev in evs:
            for item in ev:
                brute[domain.index(item)] += 1
        assert h._counts.dtype == np.int32 and h.counts.dtype == np.int64
        assert h.counts.tolist() == brute.tolist()
    top = np.iinfo(np.int32).max
    for t, counts in (
        (6, brute + [top - int(brute[0]), 0, 0, 0]),  # exactly 2^31 - 1: int32
        (8, brute + [top, 1, 0, 5]),  # past it: int64
        (9, brute + [top, 1, 3, 5]),
    ):
        rel = h.release(t, counts)
        direct = mech().release(t, counts)
        assert rel.values.tolist() == direct.values.tolist()
        assert h.counts.tolist() == counts.tolist()
        assert h._counts.dtype == (np.int32 if counts.max() <= top else np.int64)
    rel = h.step_batch([["b"]])  # event mode on the wide counts
    assert h.counts.tolist() == (brute + [top, 2, 3, 5]).tolist()
    assert rel.values.tolist() == mech().release(10, brute + [top, 2, 3, 5]).values.tolist()
    mine = brute + [top, 2, 3, 6]
    h.release(11, mine)
    mine[3] += 1  # the caller's array changing later changes nothing kept
    assert h.counts.tolist() == (brute + [top, 2, 3, 6]).tolist()


def test_counts_switch_to_int64_on_the_largest_count_not_the_stream_volume(monkeypatch):
    """The switch is decided by the largest count, not by how many occurrences the
    stream has had: with the int32 limit lowered to 100, 40 steps of 3 items spread
    over 50 items (120 occurrences, no count above 3) stay narrow, and the step whose
    largest count passes 100 widens them."""
    from dpstream.mechanisms import narrow_counts

    monkeypatch.setattr(narrow_counts, "INT32_MAX", 100)
    domain = [f"i{j}" for j in range(50)]
    h = dps.KnownDomainHistogram(domain, 200, max_items=3, key=fixed_key("volume"), rho=1.0)
    for t in range(40):
        h.step_batch([[domain[(3 * t + j) % 50] for j in range(3)]])
    assert h._counts.dtype == np.int32 and h._max_count == int(h.counts.max()) <= 3
    h.step_batch([["i0"]] * (100 - int(h.counts[0])))
    assert h._counts.dtype == np.int32 and h._max_count == 100  # exactly the limit
    h.step_batch([["i0"]])
    assert h._counts.dtype == np.int64 and h._max_count == 101
    assert h.counts[0] == 101 and h.counts[1:].max() <= 3


def test_a_bool_among_list_counts_is_refused_as_the_mapping_form_refuses_it():
    """Review 112: release(1, [True, 2, 3]) counted True as 1 (NumPy makes the list int64),
    where {"a": True} and an array of bools are refused."""
    h = dps.KnownDomainHistogram(["a", "b", "c"], 10, max_items=2, key=fixed_key("b"), tau=1.0)
    with pytest.raises(TypeError, match="must hold integers, got a bool"):
        h.release(1, [True, 2, 3])
    assert h.t == 0
    h.release(1, [1, 2, 3])
