"""UnkBase and SparseGumb keep their true counts as int32 while the largest fits.

(KnownBase's tests of the same rule are in test_known.py.) Each test compares
against an independent brute-force count of the stream and against releases of
a mechanism that kept int64 counts, or jumped to the same counts directly.
"""

from __future__ import annotations

import numpy as np
import pytest

import dpstream as dps
from dpstream.mechanisms import narrow_counts

from .conftest import fixed_key

INT32_TOP = int(np.iinfo(np.int32).max)


def _unknown(key_label: str) -> dps.UnknownDomainHistogram:
    # a small tau and a generous threshold delta: most items are shown, so the
    # releases compared below hold many values; the tree, whose jumps equal its steps
    # (a BLT item joins at the step it is first seen: test_unknown_blt)
    return dps.UnknownDomainHistogram(
        300, max_items=3, key=fixed_key(key_label), tau=0.3, threshold_delta=0.3, counter="tree"
    )


def _topk(key_label: str, domain: list[str]) -> dps.ContinualTopK:
    return dps.ContinualTopK(
        domain, 300, k=3, switches=3, eta=1.0, key=fixed_key(key_label), rho=2.0
    )


def _stream(seed: int, steps: int, items: int) -> list[list[list[str]]]:
    """Steps of 1-4 events, each of 1-3 distinct items; item 0 is in most events, so
    its count grows fastest (simulation data)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        events = []
        for _ in range(int(rng.integers(1, 5))):
            picks = {"i0"} if rng.random() < 0.8 else set()
            picks |= {f"i{int(j)}" for j in rng.integers(1, items, int(rng.integers(0, 3)))}
            events.append(sorted(picks) or ["i1"])
        out.append(events)
    return out


def _brute(steps: list[list[list[str]]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for events in steps:
        for event in events:
            for item in event:
                counts[item] = counts.get(item, 0) + 1
    return counts


def _replay_with_a_lowered_limit(monkeypatch, make, steps, counts_match):
    """Run ``steps`` through ``make()`` with the real int32 limit (the reference: it
    never widens), then again with the limit lowered to 40, checking at every step
    that the releases are the same bits, that ``counts`` is int64 and equals a
    brute-force count (``counts_match(mech, brute)``), and that the counts are int32
    exactly while the largest is at most 40. Returns the reference's releases and
    the first step whose largest count passed 40 (None: none did)."""
    reference = make()
    expected = [reference.step_batch(events) for events in steps]
    assert reference._counts.dtype == np.int32  # never near 2^31 - 1

    monkeypatch.setattr(narrow_counts, "INT32_MAX", 40)
    mech = make()
    seen: list[list[list[str]]] = []
    widened_at = None
    for events, want in zip(steps, expected, strict=True):
        got = mech.step_batch(events)
        seen.append(events)
        brute = _brute(seen)
        assert list(got.items) == list(want.items) and got.meta == want.meta
        assert got.values.tolist() == want.values.tolist()
        assert mech.counts.dtype == np.int64
        assert counts_match(mech, brute)
        top = max(brute.values())
        assert mech._max_count == top
        assert mech._counts.dtype == (np.int32 if top <= 40 else np.int64)
        if top > 40 and widened_at is None:
            widened_at = len(seen)
    return expected, widened_at


def test_unknown_domain_counts_widen_on_the_largest_count_with_the_same_releases(monkeypatch):
    """With the int32 limit lowered to 40, item i0 (in ~80% of events) passes it
    while the others stay far below: the counts stay int32 up to the step whose
    largest count passes 40, exactly, and are int64 after; every release equals
    that of a mechanism that never widened (the real limit), and ``counts`` is
    int64 and equals a brute-force count throughout."""
    steps = _stream(1, 60, 30)
    expected, widened_at = _replay_with_a_lowered_limit(
        monkeypatch,
        lambda: _unknown("narrow-unknown"),
        steps,
        lambda u, brute: dict(zip(u.items_seen, u.counts.tolist(), strict=True)) == brute,
    )
    assert widened_at is not None and widened_at < len(steps)  # both layouts ran
    assert sum(len(r) for r in expected) > 200


def test_unknown_domain_a_new_item_counted_past_the_limit_widens(monkeypatch):
    """The largest count may belong to an item first seen in this step (counted in
    the new items' counts, not in those of the items seen before)."""
    monkeypatch.setattr(narrow_counts, "INT32_MAX", 10)
    u = _unknown("narrow-new")
    u.step_batch([["a"], ["b"]])
    assert u._counts.dtype == np.int32
    u.step_batch([["fresh"]] * 10)  # exactly the limit
    assert u._counts.dtype == np.int32 and u._max_count == 10
    u.step_batch([["later"]] * 11)
    assert u._counts.dtype == np.int64 and u._max_count == 11
    assert dict(zip(u.items_seen, u.counts.tolist(), strict=True)) == {
        "a": 1,
        "b": 1,
        "fresh": 10,
        "later": 11,
    }


def test_unknown_domain_counts_past_int32_in_aggregate_mode_are_exact():
    """Past the real limit (2^31 - 1) in aggregate mode, then event mode on the wide
    counts: exact counts and the releases of a mechanism that jumped to them."""
    u = _unknown("wide-unknown")
    u.step_batch([["a", "b"], ["c"]])
    for t, prefix in (
        (3, {"a": INT32_TOP, "b": 1, "c": 1}),  # exactly: int32
        (5, {"a": INT32_TOP + 7, "b": 2, "c": 1}),  # past: int64
        (6, {"a": INT32_TOP + 7, "b": 2, "c": 1, "d": 2**40}),
    ):
        got = u.release(t, prefix)
        direct = _unknown("wide-unknown").release(t, prefix)
        assert list(got.items) == list(direct.items)
        assert got.values.tolist() == direct.values.tolist()
        assert dict(zip(u.items_seen, u.counts.tolist(), strict=True)) == prefix
        assert u._counts.dtype == (np.int32 if max(prefix.values()) <= INT32_TOP else np.int64)
    got = u.step_batch([["b"]])
    want = {"a": INT32_TOP + 7, "b": 3, "c": 1, "d": 2**40}
    assert dict(zip(u.items_seen, u.counts.tolist(), strict=True)) == want
    assert got.values.tolist() == _unknown("wide-unknown").release(7, want).values.tolist()


def test_topk_counts_widen_on_the_largest_count_with_the_same_releases(monkeypatch):
    """SparseGumb: the same rule and checks as UnkBase's test above."""
    domain = [f"i{j}" for j in range(30)]
    expected, widened_at = _replay_with_a_lowered_limit(
        monkeypatch,
        lambda: _topk("narrow-topk", domain),
        _stream(3, 80, 30),
        lambda m, brute: m.counts.tolist() == [brute.get(x, 0) for x in domain],
    )
    assert widened_at is not None and sum(len(r) for r in expected) > 100


def test_topk_counts_past_int32_in_aggregate_mode():
    domain = ["a", "b", "c", "d", "e"]
    m = _topk("wide-topk", domain)
    m.step_batch([["a"], ["b", "c"]])
    prefix = np.array([INT32_TOP + 3, 2, 1, 0, 9], dtype=np.int64)
    caller = prefix.copy()
    m.release(4, caller)
    caller[0] = 0  # the caller's array changing later changes nothing kept
    assert m.counts.tolist() == prefix.tolist() and m._counts.dtype == np.int64


@pytest.mark.parametrize("top, wide", [(INT32_TOP, False), (INT32_TOP + 1, True)])
def test_store_keeps_every_value(top, wide):
    """The helper itself: a new int64 array exactly when a value needs it, never the
    caller's array, every value kept."""
    dest = np.zeros(3, dtype=np.int32)
    counts = np.array([0, 5, top], dtype=np.int64)
    out = narrow_counts.store(dest, counts, top)
    assert (out is dest) is not wide and out is not counts
    assert out.dtype == (np.int64 if wide else np.int32)
    assert out.tolist() == counts.tolist()
    grown = narrow_counts.widened(np.array([1, 2], dtype=np.int32), top)
    assert grown.dtype == (np.int64 if wide else np.int32) and grown.tolist() == [1, 2]
