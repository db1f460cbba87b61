"""User-level steps given with run-wide ids (as the batch run's folded input gives them).

:class:`~dpstream.mechanisms.users.UserEventColumns` may carry the run-wide ids of
its users and items; the mechanism then maps each id to its bounder's state once
per run (no hashing of a user it has met, no look-up of an item it knows). These
tests hold that path against the same steps given as lists of pairs: the same
releases, the same bounder statistics and the same snapshot, through a snapshot
taken midway, steps given without ids in between, a change of numbering, two ids
of one user, and the C loops on and off.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import dpstream as dps
from dpstream import compiled
from dpstream.bounding import UserBounds, UserHasher
from dpstream.mechanisms.columns import EventColumns
from dpstream.mechanisms.histogram_topk import HistogramTopK
from dpstream.mechanisms.item_table import ItemTable, TakenItems
from dpstream.mechanisms.users import UserEventColumns, UserLevel
from dpstream.snapshot import dump_snapshot, load_snapshot

from .conftest import fixed_key

KEY = fixed_key("user-run-ids")


class _Run:
    """Run-wide numbering of users and items (the folded input's role)."""

    def __init__(self) -> None:
        self.source = object()
        self.users: dict[object, int] = {}
        self.items: dict[object, int] = {}

    def columns(self, events: list[tuple[object, list[str]]]) -> UserEventColumns:
        users: dict[object, int] = {}  # the step's users, by (type, value): 1 and "1" differ
        items: dict[str, int] = {}
        codes, offsets, user_of = [], [0], []
        for u, its in events:
            user_of.append(users.setdefault((type(u), u), len(users)))
            codes.extend(items.setdefault(x, len(items)) for x in its)
            offsets.append(len(codes))
        uids = [self.users.setdefault(k, len(self.users)) for k in users]
        iids = [self.items.setdefault(x, len(self.items)) for x in items]
        cols = EventColumns(list(items), np.asarray(codes, np.int64), np.asarray(offsets, np.int64))
        return UserEventColumns(
            [u for _, u in users],
            np.asarray(user_of, np.int64),
            cols,
            (self.source, np.asarray(uids, np.int64), np.asarray(iids, np.int64)),
        )


def _steps(seed: int, steps: int) -> tuple[list[str], list[list[tuple[object, list[str]]]]]:
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


def _build(kind: str, words: list[str], horizon: int):
    common = dict(key=KEY, epsilon=1.0, delta=1e-6, max_items_per_user=2, max_count_per_item=2)
    if kind == "known":
        return dps.KnownDomainHistogram(words, horizon, **common)
    if kind == "unknown":
        return dps.UnknownDomainHistogram(horizon, max_items=3, **common)
    return HistogramTopK(words, horizon, k=3, max_items=3, **common)


def _users_of(mech):
    return (mech.histogram if isinstance(mech, HistogramTopK) else mech)._users


@pytest.mark.parametrize("loops", ["c", "numpy"])
@pytest.mark.parametrize("kind", ["known", "unknown", "histogram-topk"])
def test_steps_with_run_wide_ids_release_what_pairs_release(kind, loops):
    """40 steps: ids from one numbering, a snapshot at step 12 (the copy goes on without
    its index of ids), steps 20-22 given as pairs (items added outside the index),
    a new numbering from step 30; against a twin given every step as pairs."""
    if loops == "c" and not compiled.enabled():
        pytest.skip("the C loops are not built")
    words, steps = _steps(7, 40)
    with compiled.numpy_only() if loops == "numpy" else contextlib.nullcontext():
        twin, mech = _build(kind, words, 40), _build(kind, words, 40)
        run = _Run()
        for t, events in enumerate(steps, start=1):
            if t == 12:
                mech = load_snapshot(dump_snapshot(mech, KEY), KEY)
                assert _users_of(mech)._run_index is None
            if t == 30:
                run = _Run()  # another numbering: the ids of before mean nothing now
            given = events if 20 <= t <= 22 else run.columns(events)
            want, got = twin.step_batch(events), mech.step_batch(given)
            assert list(got.items) == list(want.items), t
            assert np.asarray(got.values).tobytes() == np.asarray(want.values).tobytes(), t
        a, b = _users_of(twin).bounder, _users_of(mech).bounder
        assert a.stats == b.stats and a.stats.kept > 0 and a.stats.dropped_count > 0
        assert _users_of(mech)._run_index is not None  # (not part of the state:)
        assert dump_snapshot(_hist(twin), KEY) == dump_snapshot(_hist(mech), KEY)


def _hist(mech):
    return mech.histogram if isinstance(mech, HistogramTopK) else mech


def test_one_user_under_two_ids_is_one_user():
    """A user given under two run-wide ids (in one step, or the second id later) is one
    user, as in a list of pairs: the step is bounded without the index."""
    words = ["a", "b", "c"]
    twin, mech = _build("known", words, 3), _build("known", words, 3)
    source = object()

    def step(users, ids, events):
        items = {x: i for i, x in enumerate(words)}
        codes = [items[x] for _, its in events for x in its]
        offsets = np.cumsum([0] + [len(its) for _, its in events])
        cols = EventColumns(words, np.asarray(codes, np.int64), offsets)
        user_of = np.asarray([u for u, _ in events], np.int64)
        ids = (source, np.asarray(ids, np.int64), np.arange(3))
        return UserEventColumns(users, user_of, cols, ids)

    pairs = [
        [("alice", ["a"])],
        [("alice", ["b"]), ("alice", ["c"]), ("bob", ["c"])],
        [("alice", ["a", "c"])],
    ]
    given = [  # alice: id 0, and also id 5 from the second step
        step(["alice"], [0], [(0, ["a"])]),
        step(["alice", "alice", "bob"], [0, 5, 1], [(0, ["b"]), (1, ["c"]), (2, ["c"])]),
        step(["alice"], [5], [(0, ["a", "c"])]),
    ]
    for events, cols in zip(pairs, given, strict=True):
        want, got = twin.step_batch(events), mech.step_batch(cols)
        assert np.asarray(got.values).tobytes() == np.asarray(want.values).tobytes()
    assert _users_of(mech).bounder.stats == _users_of(twin).bounder.stats
    assert _users_of(twin).bounder.stats.dropped_new_item == 2  # alice's "c", twice


def test_a_user_is_hashed_once_per_run(monkeypatch):
    """With run-wide ids, each user id is hashed when first met, not at every step."""
    words, steps = _steps(3, 30)
    steps = [[(u, its) for u, its in events if its] for events in steps]  # each user held
    mech = _build("unknown", words, 30)
    hashed: list[object] = []
    many = UserHasher.many

    def counting(self, users, hex=False):
        users = list(users)
        hashed.extend(users)
        return many(self, users, hex=hex)

    monkeypatch.setattr(UserHasher, "many", counting)
    run = _Run()
    for events in steps:
        mech.step_batch(run.columns(events))
    assert sorted(hashed) == sorted({u for events in steps for u, _ in events})


def test_a_user_level_snapshot_of_the_layout_before_run_ids_goes_on(monkeypatch):
    """A snapshot written before UserLevel had an index of ids (its attributes as a
    plain dict) loads and goes on with the releases of the run never stopped."""
    words, steps = _steps(11, 20)
    twin, mech = _build("unknown", words, 20), _build("unknown", words, 20)
    run = _Run()
    for events in steps[:10]:
        twin.step_batch(events)
        mech.step_batch(run.columns(events))
    users = mech._users
    with monkeypatch.context() as m:  # the old layout: no __getstate__, no index
        m.delattr(UserLevel, "__getstate__")
        m.delattr(users, "_run_index")
        old = dump_snapshot(mech, KEY)
    assert b'"_run_index"' not in old
    loaded = load_snapshot(old, KEY)
    run = _Run()
    for events in steps[10:]:
        want, got = twin.step_batch(events), loaded.step_batch(run.columns(events))
        assert np.asarray(got.values).tobytes() == np.asarray(want.values).tobytes()
    assert loaded._users.bounder.stats == twin._users.bounder.stats


def test_user_columns_check_their_ids():
    cols = EventColumns(["a"], np.array([0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="one run-wide id per user and per item"):
        UserEventColumns(["u"], np.array([0]), cols, (object(), np.array([0, 1]), np.array([0])))
    with pytest.raises(ValueError, match="must not be negative"):
        UserEventColumns(["u"], np.array([0]), cols, (object(), np.array([-1]), np.array([0])))


def test_taken_items_read_a_table_at_positions():
    table = ItemTable()
    table.extend(["a", "bb", "ccc", "dddd"])
    view = TakenItems(table, np.array([3, 0, 2]))
    assert len(view) == 3 and list(view) == ["dddd", "a", "ccc"]
    assert view[1] == "a" and view[-1] == "ccc" and view[1:] == ["a", "ccc"]
    assert view.take(np.array([2, 0])) == ["ccc", "dddd"]


def test_the_hasher_gives_hex_digests_in_c_as_hashlib_does():
    hasher = UserLevel(UserBounds(1, 1), KEY).hasher
    ids = ["alice", "ålice", "", 7, -(2**70), b"\x00x"] * 30
    want = [hasher(u).hex() for u in ids]
    assert hasher.many(ids, hex=True) == want
    with compiled.numpy_only():
        assert hasher.many(ids, hex=True) == want
    with pytest.raises(TypeError, match="a user id must be a str, int or bytes"):
        hasher.many(["a", 1.5], hex=True)


@pytest.mark.parametrize("loops", ["c", "numpy"])
def test_two_ids_both_learnt_for_one_user_stay_one_user(loops):
    """Review finding: ids 0 and 5 both learnt for alice in earlier steps, then given
    together (nothing hashed in that step) must not give her L0 = 2 items per id. The
    twin takes the same steps as pairs (the bounder's reference behaviour)."""
    words = [f"w{i}" for i in range(6)]
    twin, mech = _build("known", words, 4), _build("known", words, 4)
    source = object()

    def step(users, ids, events):
        codes = [words.index(x) for _, its in events for x in its]
        offsets = np.cumsum([0] + [len(its) for _, its in events])
        cols = EventColumns(words, np.asarray(codes, np.int64), offsets)
        user_of = np.asarray([u for u, _ in events], np.int64)
        return UserEventColumns(users, user_of, cols, (source, np.asarray(ids), np.arange(6)))

    pairs = [
        [("alice", ["w0"])],
        [("alice", ["w0"])],
        [("alice", ["w1", "w2"]), ("alice", ["w3", "w4"])],
    ]
    given = [
        step(["alice"], [0], [(0, ["w0"])]),  # id 0 learnt
        step(["alice"], [5], [(0, ["w0"])]),  # id 5 learnt, the same user in the state
        step(["alice", "alice"], [0, 5], [(0, ["w1", "w2"]), (1, ["w3", "w4"])]),
    ]
    with contextlib.nullcontext() if loops == "c" else compiled.numpy_only():
        for events, cols in zip(pairs, given, strict=True):
            want, got = twin.step_batch(events), mech.step_batch(cols)
            assert np.asarray(got.values).tobytes() == np.asarray(want.values).tobytes()
    assert _users_of(mech).bounder.stats == _users_of(twin).bounder.stats
    assert int((mech.counts > 0).sum()) == 2  # alice holds L0 = 2 items: w0 and w1


@pytest.mark.parametrize("ids", [False, True])
def test_one_item_under_two_codes_is_counted_once_per_user(ids):
    """Review finding: columns whose item list names "a" twice (codes 0 and 1) count as
    one item for the bounds (Linf = 1 here), with or without run-wide ids."""
    mech = dps.KnownDomainHistogram(
        ["a", "b"], 5, key=KEY, epsilon=1.0, delta=1e-6, max_items_per_user=2,
        max_count_per_item=1,
    )  # fmt: skip
    cols = EventColumns(["a", "a"], np.array([0, 1], np.int64), np.array([0, 1, 2], np.int64))
    run = (object(), np.array([0]), np.array([0, 1])) if ids else None
    mech.step_batch(UserEventColumns(["alice"], np.array([0, 0]), cols, run))
    assert mech.counts.tolist() == [1, 0]


def test_a_pair_table_with_no_empty_slot_is_refused_not_probed_forever():
    """Hardening: a table with no empty slot (only a corrupt state could give one) makes
    the C loops raise instead of probing forever."""
    loops = compiled.loops()
    if loops is None:
        pytest.skip("the compiled loops are not built")
    keys = np.arange(16, dtype=np.int64) + 100  # every slot taken
    with pytest.raises(ValueError, match="full"):
        loops.pair_store(keys, np.zeros(16, np.int64), np.array([7], np.int64),
                         np.array([1], np.int64), 3)  # fmt: skip
