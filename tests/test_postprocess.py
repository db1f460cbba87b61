"""ReadableCounts: clamp at zero and non-decreasing running counts, as post-processing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dpstream.mechanisms.base import Release
from dpstream.postprocess import ReadableCounts


def random_releases(rng, n_items, steps, ranked):
    """Releases whose item sets change (items come and go), noisy values around a trend."""
    out = []
    for t in range(1, steps + 1):
        k = int(rng.integers(0, n_items + 1))
        items = [f"i{j}" for j in rng.choice(n_items, size=k, replace=False)]
        values = rng.normal(0.3 * t, 6.0, size=k)
        if ranked:
            order = np.argsort(-values)
            items, values = [items[j] for j in order], values[order]
        out.append(Release(t, items, values, meta={"x": t}))
    return out


def reference(releases, clamp, monotone, round_counts):
    """Brute force: per item, the running max of the published (rounded, clamped) values."""
    last: dict[str, float] = {}
    out = []
    for rel in releases:
        pub = {}
        for item, v in zip(rel.items, rel.values.tolist(), strict=True):
            v = float(np.rint(v)) if round_counts else v
            v = max(v, 0.0) if clamp else v
            if monotone and item in last:
                v = max(v, last[item])
            pub[item] = v
        if monotone:
            last.update(pub)
        out.append(pub)
    return out


@pytest.mark.parametrize("clamp", [False, True])
@pytest.mark.parametrize("monotone", [False, True])
@pytest.mark.parametrize("round_counts", [False, True])
def test_against_brute_force(clamp, monotone, round_counts):
    rng = np.random.default_rng(5)  # simulated releases
    releases = random_releases(rng, 12, 60, ranked=True)
    pp = ReadableCounts(clamp=clamp, monotone=monotone, round_counts=round_counts, ranked=True)
    changed = 0
    for rel, want in zip(releases, reference(releases, clamp, monotone, round_counts), strict=True):
        got = pp(rel)
        assert dict(zip(got.items, got.values.tolist(), strict=True)) == want
        assert list(got.values) == sorted(got.values, reverse=True)  # still a ranked list
        assert got.meta == rel.meta and got.t == rel.t
        changed += any(a != b for a, b in zip(got.values, rel.values, strict=True))
    if clamp or monotone:
        assert changed > 10  # the options did act on these releases


def test_whole_domain_fast_path_equals_the_table():
    """A known domain releases the same list every step (fast path: arrays); switching to
    another list object must carry the running maxima over."""
    rng = np.random.default_rng(6)
    items = [f"d{j}" for j in range(1500)]
    steps = [Release(t, items, rng.normal(0.5 * t, 20.0, size=1500)) for t in range(1, 30)]
    steps.append(Release(30, list(items[:700]), rng.normal(10.0, 20.0, size=700)))  # a copy
    steps.append(Release(31, items, rng.normal(10.0, 20.0, size=1500)))
    pp = ReadableCounts(clamp=False, monotone=True, round_counts=False)
    for rel, want in zip(steps, reference(steps, False, True, False), strict=True):
        got = pp(rel)
        assert got.items == list(rel.items)  # not ranked: order kept
        assert dict(zip(got.items, got.values.tolist(), strict=True)) == want


def test_replay_is_deterministic_and_time_order_is_checked():
    rng = np.random.default_rng(7)
    releases = random_releases(rng, 8, 30, ranked=False)
    a, b = ReadableCounts(monotone=True), ReadableCounts(monotone=True)
    for rel in releases:
        ra, rb = a(rel), b(rel)
        assert ra.items == rb.items and np.array_equal(ra.values, rb.values)
    with pytest.raises(ValueError, match="time order"):
        a(releases[3])
    with pytest.raises(TypeError, match="clamp"):
        ReadableCounts(clamp=1)


def test_known_domain_view_takes_the_fast_path():
    """A known domain's releases carry one read-only view of its table at every step
    (not a tuple): --monotone keeps its running maxima as an array aligned with it,
    not a dict of every item rebuilt from fresh str objects at every step; and a
    snapshot of (mechanism, publisher) keeps the two pointing at one view."""
    from dpstream.mechanisms.known import KnownDomainHistogram
    from dpstream.noise import NoiseKey
    from dpstream.snapshot import dump_snapshot, load_snapshot

    domain = [f"d{j}" for j in range(1500)]
    key = NoiseKey(hashlib.sha256(b"postprocess").digest())
    mech = KnownDomainHistogram(domain, 16, max_items=1, key=key, rho=0.01)
    pp = ReadableCounts(clamp=False, monotone=True, round_counts=False)
    releases = [mech.step([domain[t]]) for t in range(1, 6)]
    want = reference(releases, False, True, False)
    for rel, w in zip(releases, want, strict=True):
        got = pp(rel)
        assert got.items is rel.items
        assert dict(zip(got.items, got.values.tolist(), strict=True)) == w
    assert pp._same_items is mech._release_items and not pp._last
    mech2, pp2 = load_snapshot(dump_snapshot((mech, pp), key), key)
    rel = mech2.step([domain[7]])
    assert rel.items is pp2._same_items
    got = pp2(rel)
    assert np.all(got.values >= pp._same_last)


def test_the_default_publishes_integers():
    """Review 86: the default kept the floats, whose low-order bits give away true counts
    (tests/test_float_attack.py); it now rounds, as the command does by default."""
    got = ReadableCounts()(Release(1, ["a", "b"], np.array([5.2, -0.6])))
    assert got.values.dtype == np.int64 and got.values.tolist() == [5, 0]
