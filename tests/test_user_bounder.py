"""The columnar bounder (NumPy, a batch at a time) against the event-at-a-time one.

:class:`dpstream.bounding.ContributionBounder` states first come, first kept one
event at a time; :class:`dpstream.mechanisms.user_bounder.ColumnBounder` applies
it to a whole batch with sorts and a hash table. Both are fed the same random streams (many
seeds, both bounds, batches committed or rejected, state carried across batches
and through a snapshot) and must keep the same occurrences, hold the same
counts and report the same statistics; a user-level mechanism given the step as
:class:`~dpstream.mechanisms.users.UserEventColumns` releases the same bytes as
given the list of pairs.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest

import dpstream as dps
from dpstream import compiled
from dpstream.bounding import ContributionBounder, UserBounds
from dpstream.errors import InvalidEventError
from dpstream.mechanisms import user_bounder
from dpstream.mechanisms.columns import EventColumns
from dpstream.mechanisms.histogram_topk import HistogramTopK, UnknownTopK
from dpstream.mechanisms.user_bounder import ColumnBounder
from dpstream.mechanisms.users import UserEventColumns, UserLevel
from dpstream.snapshot import dump_snapshot, load_snapshot

from .conftest import fixed_key

KEY = fixed_key("user-bounder")


def _batch(rng: random.Random, users: int, items: str) -> list[tuple[bytes, tuple]]:
    return [
        (
            f"u{rng.randrange(users)}".encode(),
            tuple(rng.choice(items) for _ in range(rng.randint(0, 5))),
        )
        for _ in range(rng.randint(0, 30))
    ]


def _same_state(py: ContributionBounder, col: ColumnBounder, users) -> None:
    assert col.stats == py.stats
    assert len(col) == len(py)
    for u in users:
        assert col.kept_of(u) == py.kept_of(u)


def _loops(kind: str) -> contextlib.AbstractContextManager[None]:
    """The C loops (the batch bounded event by event in C) or the NumPy path (sorts)."""
    if kind == "c" and not compiled.enabled():
        pytest.skip("the C loops are not built")
    return compiled.numpy_only() if kind == "numpy" else contextlib.nullcontext()


@pytest.mark.parametrize("loops", ["c", "numpy"])
@pytest.mark.parametrize("slots", [2, 4, 64])
def test_the_column_bounder_keeps_what_the_event_bounder_keeps(monkeypatch, slots, loops):
    """Random batches, bounds from (1, 1) to (4, 3), a fifth of the batches rejected
    (bounded, never committed); the pair table starting with 2 slots (rehashed at
    almost every batch, long probe runs), 4 or 64; in C and with NumPy."""
    monkeypatch.setattr(user_bounder, "_MIN_SLOTS", slots)
    with _loops(loops):
        _random_batches()


def _random_batches() -> None:
    for seed in range(150):
        rng = random.Random(seed)
        bounds = UserBounds(rng.randint(1, 4), rng.randint(1, 3))
        py, col = ContributionBounder(bounds), ColumnBounder(bounds)
        users = [f"u{i}".encode() for i in range(7)]
        for _ in range(rng.randint(1, 12)):
            batch = _batch(rng, len(users), "abcdefgh")
            kept_py, pend_py = py.bound(batch)
            kept_col, pend_col = col.bound(batch)
            assert kept_col == kept_py, (seed, batch)
            assert pend_col.stats == pend_py.stats
            if rng.random() < 0.8:
                py.commit(pend_py)
                col.commit(pend_col)
            _same_state(py, col, users)


def test_the_c_and_numpy_paths_share_one_state():
    """Batches bounded in turn by the C loop and by NumPy's sorts (a state made by one
    read and grown by the other: the same table layout, the same hash of a slot)."""
    if not compiled.enabled():
        pytest.skip("the C loops are not built")
    for seed in range(40):
        rng = random.Random(500 + seed)
        bounds = UserBounds(rng.randint(1, 4), rng.randint(1, 3))
        py, col = ContributionBounder(bounds), ColumnBounder(bounds)
        users = [f"u{i}".encode() for i in range(7)]
        for n in range(10):
            batch = _batch(rng, len(users), "abcdefgh")
            kept_py, pend_py = py.bound(batch)
            with compiled.numpy_only() if n % 2 else contextlib.nullcontext():
                kept_col, pend_col = col.bound(batch)
                col.commit(pend_col)
            py.commit(pend_py)
            assert kept_col == kept_py, (seed, batch)
            _same_state(py, col, users)


def test_batches_in_any_cut_give_the_same_decisions():
    """A stream bounded as one batch, or cut into batches at any places (committed in
    turn), keeps the same occurrences: the rule is one of arrival order only."""
    for seed in range(60):
        rng = random.Random(1000 + seed)
        bounds = UserBounds(rng.randint(1, 3), rng.randint(1, 3))
        stream = _batch(rng, 4, "abcde") * 3
        whole = ColumnBounder(bounds)
        want, pend = whole.bound(stream)
        whole.commit(pend)
        cut = ColumnBounder(bounds)
        got: list[tuple] = []
        at = 0
        while at < len(stream):
            step = stream[at : at + rng.randint(1, 6)]
            at += len(step)
            kept, pend = cut.bound(step)
            cut.commit(pend)
            got.extend(kept)
        assert got == want
        assert cut.stats == whole.stats


def test_bound_columns_takes_repeats_in_an_event_once_and_users_in_any_order():
    bounds = UserBounds(2, 2)
    py, col = ContributionBounder(bounds), ColumnBounder(bounds)
    users = [b"v", b"w"]
    # event 0: w a a b c; event 1: v c; event 2: w a; event 3: w a
    codes = np.array([0, 0, 1, 2, 2, 0, 0])
    offsets = np.array([0, 4, 5, 6, 7])
    hexes = [u.hex() for u in users]
    keep, pend = col.bound_columns(hexes, np.array([1, 0, 1, 1]), ["a", "b", "c"], codes, offsets)
    kept_py, pend_py = py.bound([(b"w", "aabc"), (b"v", "c"), (b"w", "a"), (b"w", "a")])
    assert kept_py == [("a", "b"), ("c",), ("a",), ()]
    assert keep.tolist() == [True, False, True, False, True, True, False]
    assert pend.stats == pend_py.stats
    col.commit(pend)
    py.commit(pend_py)
    _same_state(py, col, users)


def test_a_bounder_state_goes_on_through_a_snapshot_and_from_the_event_bounder():
    bounds = UserBounds(3, 2)
    rng = random.Random(5)
    py, col = ContributionBounder(bounds), ColumnBounder(bounds)
    for _ in range(6):
        batch = _batch(rng, 6, "abcdefg")
        for b in (py, col):
            b.commit(b.bound(batch)[1])
    loaded = load_snapshot(dump_snapshot(col, KEY), KEY)
    converted = ColumnBounder.from_bounder(py)
    users = [f"u{i}".encode() for i in range(6)]
    for b in (loaded, converted):
        _same_state(py, b, users)
    for _ in range(6):
        batch = _batch(rng, 6, "abcdefg")
        want, pend = py.bound(batch)
        py.commit(pend)
        for b in (loaded, converted):
            kept, pend = b.bound(batch)
            assert kept == want
            b.commit(pend)
    for b in (loaded, converted):
        _same_state(py, b, users)


def _user_steps(seed: int, steps: int):
    rng = np.random.default_rng(seed)  # simulated input data
    words = [f"w{i}" for i in range(12)]
    out = []
    for _ in range(steps):
        events = [
            (
                f"user{int(rng.integers(0, 9))}",
                rng.choice(words, size=int(rng.integers(0, 4))).tolist(),
            )
            for _ in range(int(rng.integers(0, 15)))
        ]
        out.append(events)
    return words, out


def _as_columns(events) -> UserEventColumns:
    users: dict[str, int] = {}
    items: dict[str, int] = {}
    codes, offsets, user_of = [], [0], []
    for u, its in events:
        user_of.append(users.setdefault(u, len(users)))
        codes.extend(items.setdefault(x, len(items)) for x in its)
        offsets.append(len(codes))
    cols = EventColumns(list(items), np.asarray(codes, np.int64), np.asarray(offsets, np.int64))
    return UserEventColumns(list(users), np.asarray(user_of, np.int64), cols)


@pytest.mark.parametrize("mech", ["known", "unknown", "topk", "histogram-topk", "unknown-topk"])
def test_a_mechanism_given_user_columns_releases_what_it_releases_for_pairs(mech):
    words, steps = _user_steps(3, 30)
    common = dict(key=KEY, epsilon=1.0, delta=1e-6, max_items_per_user=2, max_count_per_item=2)

    def build():
        if mech == "known":
            return dps.KnownDomainHistogram(words, 30, **common)
        if mech == "unknown":
            return dps.UnknownDomainHistogram(30, max_items=3, **common)
        if mech == "topk":
            return dps.ContinualTopK(words, 30, k=3, switches=4, **common)
        if mech == "unknown-topk":
            return UnknownTopK(words, 30, k=3, max_items=3, **common)
        return HistogramTopK(words, 30, k=3, max_items=3, **common)

    a, b = build(), build()
    for events in steps:
        ra, rb = a.step_batch(events), b.step_batch(_as_columns(events))
        assert list(ra.items) == list(rb.items)
        assert np.asarray(ra.values).tobytes() == np.asarray(rb.values).tobytes()
    wrapped = mech in ("histogram-topk", "unknown-topk")
    stats = [(m.histogram if wrapped else m)._users.bounder.stats for m in (a, b)]
    assert stats[0] == stats[1] and stats[0].kept > 0 and stats[0].dropped > 0
    a, b = (a.histogram, b.histogram) if wrapped else (a, b)
    assert dump_snapshot(a, KEY) == dump_snapshot(b, KEY)


def test_user_columns_with_a_bad_event_raise_what_pairs_raise():
    words = ["a", "b", "c"]
    common = dict(key=KEY, epsilon=1.0, delta=1e-6, max_items_per_user=2, max_count_per_item=1)
    cases = [
        [("x", ["a"]), ("y", ["a", "zz"])],  # an item outside the domain
        [("x", ["a", "b", "c", "a"])],  # over max_items (3 distinct > 2)
        [("x", ["a"]), (1.5, ["b"])],  # a user id of another type
        [("x", ["a", "b", "c"]), ("y", ["zz"])],  # over max_items, then outside the domain
    ]
    for events in cases:
        for make in (
            lambda: dps.KnownDomainHistogram(words, 5, max_items=2, **common),
            lambda: HistogramTopK(words, 5, k=2, max_items=2, **common),
            lambda: UnknownTopK(words, 5, k=2, max_items=2, **common),
        ):
            errors = []
            for given in (events, _as_columns(events)):
                mech = make()
                with pytest.raises((InvalidEventError, TypeError)) as exc:
                    mech.step_batch(given)
                errors.append((type(exc.value), str(exc.value)))
                assert mech.t == 0
            assert errors[0] == errors[1], events


def test_user_columns_at_event_level_are_refused():
    mech = dps.UnknownDomainHistogram(5, max_items=2, key=KEY, epsilon=1.0, delta=1e-6)
    with pytest.raises(TypeError, match="max_items_per_user"):
        mech.step_batch(_as_columns([("x", ["a"])]))


def test_the_hasher_hashes_many_ids_as_it_hashes_one():
    hasher = UserLevel(UserBounds(1, 1), KEY).hasher
    ids = ["alice", "ålice", "", 7, -(2**70), b"\x00x"]
    assert hasher.many(ids) == [hasher(u) for u in ids]
    with pytest.raises(TypeError, match="a user id must be a str, int or bytes"):
        hasher.many(["a", 1.5])


@pytest.mark.parametrize("loops", ["c", "numpy"])
def test_the_pair_table_holds_what_a_dict_holds(monkeypatch, loops):
    """The open-addressing table under many keys (and keys that share a home slot),
    stored in batches of updates and new keys, against a dict."""
    monkeypatch.setattr(user_bounder, "_MIN_SLOTS", 2)
    with _loops(loops):
        _pair_table_batches()


def _pair_table_batches() -> None:
    rng = np.random.default_rng(11)  # test data
    b = ColumnBounder(UserBounds(1, 1))
    want: dict[int, int] = {}
    home = user_bounder._slots_of(np.arange(1 << 12, dtype=np.int64), 1 << 12)
    crowd = np.flatnonzero(home == home[0])  # keys that share one home slot
    for _ in range(40):
        fresh = rng.integers(0, 1 << 40, int(rng.integers(0, 300)))
        old = rng.choice(list(want), size=min(len(want), 50), replace=False) if want else []
        keys = np.unique(np.concatenate([fresh, np.asarray(old, np.int64), crowd]))
        counts = rng.integers(1, 9, keys.size)
        b._store(keys, counts)
        want.update(zip(keys.tolist(), counts.tolist(), strict=True))
        probe = np.concatenate([keys, rng.integers(0, 1 << 40, 100)])
        assert b._lookup(probe).tolist() == [want.get(k, 0) for k in probe.tolist()]
    assert b._pairs == len(want) and b._keys.size >= 2 * len(want)


def test_user_ids_equal_as_ids_are_one_user_in_a_list_of_pairs():
    """1 and NumPy's 1 (the same id to the keyed hash) in one step are one user, as the
    event-at-a-time bounder has them."""
    common = dict(key=KEY, epsilon=1.0, delta=1e-6, max_items_per_user=1, max_count_per_item=1)
    mech = dps.KnownDomainHistogram(["a", "b"], 4, **common)
    mech.step_batch([(1, ["a"]), (np.int64(1), ["b"]), ("1", ["b"])])
    assert mech._users.bounder.stats.kept == 2  # user 1 keeps "a" only; user "1" keeps "b"
    assert mech._users.bounder.stats.dropped_new_item == 1
    twin = ContributionBounder(UserBounds(1, 1))
    hasher = mech._users.hasher
    kept, _ = twin.bound(
        [(hasher(1), ("a",)), (hasher(np.int64(1)), ("b",)), (hasher("1"), ("b",))]
    )
    assert kept == [("a",), (), ("b",)]


def test_a_count_bound_past_int32_keeps_exact_counts():
    bounds = UserBounds(2, 2**40)
    py, col = ContributionBounder(bounds), ColumnBounder(bounds)
    batch = [(b"u", ("a", "b", "c"))] * 5
    for b in (py, col):
        b.commit(b.bound(batch)[1])
    assert col._counts.dtype == np.int64
    _same_state(py, col, [b"u"])
    assert col.kept_of(b"u") == {"a": 5, "b": 5}


@pytest.mark.parametrize("kind", ["known", "unknown"])
@pytest.mark.parametrize("first", ["events", "counts"])
def test_one_user_level_mechanism_takes_events_or_bounded_counts_not_both(kind, first):
    """Review 112: with max_count_per_item=1, alice's bounded count of "a" at step 1
    (release(..., bounded=True)) and her event ["a"] at step 2 (step_batch) both
    counted: 2 contributions of one item from one user, and no error. The bounder of
    the events cannot know who is in the counts, so a mechanism keeps to one mode."""
    bounds = {"max_items_per_user": 1, "max_count_per_item": 1}
    key = fixed_key("modes")
    if kind == "known":
        mech = dps.KnownDomainHistogram(["a", "b"], 5, key=key, rho=1.0, **bounds)
    else:
        mech = dps.UnknownDomainHistogram(5, key=key, epsilon=1.0, delta=1e-6, **bounds)
    events = lambda: mech.step_batch([("alice", ["a"])])  # noqa: E731
    counts = lambda: mech.release(mech.t + 1, {"a": 1}, bounded=True)  # noqa: E731
    do, then = (events, counts) if first == "events" else (counts, events)
    do()
    with pytest.raises(ValueError, match="either \\(user, items\\) events or counts"):
        then()
    assert mech.t == 1
    do()  # the mode it began with goes on
    assert mech.t == 2
