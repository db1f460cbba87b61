"""User-level privacy for the continual mechanisms: bounded users in, a guarantee per user out.

Layer 5 of dpstream. A mechanism built with ``max_items_per_user=`` and
``max_count_per_item=`` (:class:`~dpstream.bounding.UserBounds`) protects a
user, not an event: its event mode takes ``(user, items)`` pairs, hashes the
user id with a keyed hash (:class:`~dpstream.bounding.UserHasher`), keeps each
user within the bounds over the whole stream
(:class:`~dpstream.bounding.ContributionBounder`: first come, first kept), and
its guarantee (``.privacy``, ``unit == "user"``) is calibrated for the worst
placement of one user's bounded contributions (the lemma in
:mod:`dpstream.bounding`). Aggregate mode (``release(t, counts)``) takes the
prefix histogram of contributions that the caller has already bounded so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from ..bounding import ContributionBounder, UnitBound, UserBounds, UserHasher
from ..errors import InvalidEventError
from ..noise import NoiseKey
from ..privacy import PrivacyGuarantee
from .base import check_max_items, normalise_event
from .columns import _PLAIN, EventColumns, distinct_in_events
from .item_table import TakenItems, take_at
from .user_bounder import ColumnBounder, kept_items

__all__ = [
    "UserLevel",
    "UserEventColumns",
    "unit_bound",
    "user_guarantee",
    "bound_user_events",
    "commit_user_events",
    "split_user_event",
    "refuse_unordered",
]


def unit_bound(max_items: int | None, bounds: UserBounds | None) -> UnitBound:
    """What one privacy unit changes: an event (Delta0 items, 1 each) or a bounded user."""
    if bounds is not None:
        return bounds.unit
    return UnitBound(items=check_max_items(max_items))


def user_guarantee(
    guarantee: PrivacyGuarantee, bounds: UserBounds | None, theorem: str | None = None
) -> PrivacyGuarantee:
    """``guarantee`` stated per user (unit and theorem), or unchanged at event level."""
    if bounds is None:
        return guarantee
    return dataclasses.replace(
        guarantee,
        unit="user",
        theorem=(theorem or guarantee.theorem) + f" [per user: {bounds.describe()}]",
    )


def split_user_event(event: object) -> tuple[object, object]:
    """An event of user-level mode, ``(user, items)``: its user id and its items."""
    if (
        isinstance(event, (str, bytes))
        or not isinstance(event, Sequence)
        or len(event) != 2
        or isinstance(event[1], (str, bytes))
    ):
        raise InvalidEventError(
            "with max_items_per_user= every event is a (user, items) pair, e.g. "
            f"('alice', ['a', 'b']); got {type(event).__name__} of another shape"
        )
    if isinstance(event[1], (set, frozenset)):
        raise TypeError(_UNORDERED.format(what="the items of an event"))
    return event[0], event[1]


def refuse_unordered(events: object) -> None:
    """Refuse a step's events given as a set at user level (:data:`_UNORDERED`)."""
    if isinstance(events, (set, frozenset)):
        raise TypeError(_UNORDERED.format(what="the events of a step"))


#: review 121: which items a user keeps first (max_items_per_user) followed a set's
#: order, which is the process's hash seed's: two runs of the same data released the
#: exact difference of the items kept
_UNORDERED = (
    "{what} given as a set: with max_items_per_user the first items a user gives are "
    "the ones kept, and a set's order changes from one Python process to the next "
    "(the same data would keep other items in another run); give a list, in the "
    "events' order"
)


def check_bounded(users: Any, bounded: bool) -> None:
    """Refuse aggregate counts for a mechanism with user bounds unless the caller says
    (``bounded=True``) that they are the counts of contributions already bounded per
    user, first come, first kept: counts carry no user ids, so the mechanism cannot
    bound them, and its per-user guarantee holds only for bounded counts."""
    if users is None:
        return
    if not bounded:
        raise ValueError(
            "release(t, counts) of a mechanism built with max_items_per_user and "
            "max_count_per_item: counts carry no user ids, so they cannot be bounded "
            "here, and the per-user guarantee holds only for counts of contributions "
            "bounded per user (first come, first kept) beforehand; pass bounded=True "
            "to say they are, or give (user, items) events to step_batch"
        )
    if users.mode == "events":
        raise ValueError(_MIXED.format(now="release(t, counts)", before="(user, items) events"))
    users.mode = "aggregate"


#: Why one user-level mechanism takes events or bounded counts, never both (review 112:
#: a user's contributions in the counts were unknown to the bounder of the events, so a
#: user passed max_count_per_item over the stream, silently).
_MIXED = (
    "{now} of a user-level mechanism that took {before}: the bounds hold over the whole "
    "stream only when one bounder sees every contribution, and bounded counts carry no "
    "users while events are bounded here, so a user could pass the bounds across the "
    "two; give one mechanism either (user, items) events or counts bounded beforehand "
    "(bounded=True), for the whole stream"
)


class UserEventColumns:
    """The events of one step as columns, with their users: event j is the pair
    ``(users[user_of[j]], events.events()[j])``. Give it to a user-level
    mechanism's ``step_batch`` instead of a list of pairs (the same release,
    bounded without a Python loop over events).

    ``ids``, when the caller numbers users and items over a whole run (as the
    batch run's folded input does): ``(source, user_ids, item_ids)``, the run-wide
    ids of ``users`` and of ``events.items``, valid for every step given with the
    same ``source`` object (an id is one user or one item in all of them). The
    mechanism then maps each id to its bounder's state once per run instead of
    hashing each step's users and looking up its items (the same release).

    Example:
        >>> cols = EventColumns(["a", "b"], np.array([0, 1, 1]), np.array([0, 2, 3]))
        >>> UserEventColumns(["alice", "bob"], np.array([1, 0]), cols).pairs()
        [('bob', ['a', 'b']), ('alice', ['b'])]
    """

    __slots__ = ("users", "user_of", "events", "ids")

    def __init__(
        self,
        users: Sequence[object],
        user_of: np.ndarray,
        events: EventColumns,
        ids: tuple[object, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        user_of = np.asarray(user_of)
        if not isinstance(events, EventColumns):
            raise TypeError(f"events must be EventColumns, got {type(events).__name__}")
        if user_of.ndim != 1 or user_of.dtype.kind not in "iu" or user_of.size != len(events):
            raise TypeError("user_of must be a 1-D integer array with one entry per event")
        if user_of.size and (user_of.min() < 0 or user_of.max() >= len(users)):
            raise ValueError("user_of must index users")
        if ids is not None:
            source, uids, iids = ids
            uids = np.asarray(uids, dtype=np.int64)
            iids = np.asarray(iids, dtype=np.int64)
            if uids.shape != (len(users),) or iids.shape != (len(events.items),):
                raise ValueError("ids must give one run-wide id per user and per item")
            if (uids.size and uids.min() < 0) or (iids.size and iids.min() < 0):
                raise ValueError("run-wide ids must not be negative")
            ids = (source, uids, iids)
        self.users = users
        self.user_of = user_of.astype(np.int64, copy=False)
        self.events = events
        self.ids = ids

    def __len__(self) -> int:
        return len(self.events)

    def pairs(self) -> list[tuple[object, list[Hashable]]]:
        """The events as ``(user, items)`` pairs (the per-event path, and for tests)."""
        users = list(self.users)
        cols = self.events
        events = EventColumns(list(cols.items), cols.codes, cols.offsets).events()
        return [(users[u], ev) for u, ev in zip(self.user_of.tolist(), events, strict=True)]


class _RunIndex:
    """The bounder state's index of each run-wide id of one ``source`` (-1: not known
    yet), users and items (see :class:`UserEventColumns`). Filled as ids are found
    in the state or added to it; never saved (a snapshot holds the state only)."""

    def __init__(self, source: object, bounder: ColumnBounder) -> None:
        self.source = source
        self.bounder = bounder
        self.users = np.zeros(0, dtype=np.int64)
        self.items = np.zeros(0, dtype=np.int64)
        #: the state's number of items when every one of them was known here (-1: not
        #: so); while the state holds that many, an item not known is not there
        self.items_synced = 0 if not bounder.items_held else -1

    def items_complete(self) -> bool:
        """Whether every item of the state is known here."""
        return self.items_synced == self.bounder.items_held

    @staticmethod
    def _grown(index: np.ndarray, ids: np.ndarray) -> np.ndarray:
        top = int(ids.max(initial=-1)) + 1
        if top <= index.size:
            return index
        more = np.full(max(top, 2 * index.size) - index.size, -1, dtype=np.int64)
        return np.concatenate([index, more])

    def of(self, user_ids: np.ndarray, item_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The state's indices of these users and items (-1: not known yet)."""
        self.users = self._grown(self.users, user_ids)
        self.items = self._grown(self.items, item_ids)
        return self.users[user_ids], self.items[item_ids]

    def learn(self, user_ids: np.ndarray, users: np.ndarray) -> None:
        """Remember the state's indices of these users (those >= 0; the ids were given
        to :meth:`of` before)."""
        found = users >= 0
        self.users[user_ids[found]] = users[found]

    def learn_items(self, item_ids: np.ndarray, items: np.ndarray) -> None:
        """:meth:`learn` for items."""
        found = items >= 0
        self.items[item_ids[found]] = items[found]


class _Pending:
    """A step's pending bounder change, with the run-wide ids it did not know (at the
    places ``users`` and ``items`` of the step): their indices are learnt at its commit."""

    __slots__ = ("change", "index", "user_ids", "users", "item_ids", "items")

    def __init__(
        self, change: Any, index: _RunIndex, ids: tuple[Any, np.ndarray, np.ndarray],
        users: np.ndarray, items: np.ndarray,
    ) -> None:  # fmt: skip
        self.change = change
        self.index = index
        self.users, self.user_ids = users, ids[1][users]
        self.items, self.item_ids = items, ids[2][items]


class UserLevel:
    """A mechanism's user-level state: the hasher of user ids and the contribution bounder
    (:class:`~dpstream.mechanisms.user_bounder.ColumnBounder`).

    Picklable without key material (the hasher keeps the key object, which a
    snapshot stores as a reference). The index of a run's ids into the bounder's
    state (see :class:`UserEventColumns`) is not part of the state: it is rebuilt,
    from the state, by the run that gives ids.
    """

    def __init__(self, bounds: UserBounds, key: NoiseKey) -> None:
        self.bounds = bounds
        self.hasher = UserHasher(key)
        self.bounder = ColumnBounder(bounds)
        self._run_index: _RunIndex | None = None
        #: what the stream gave: "events" or "aggregate" (bounded counts); never both
        self.mode: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_run_index"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a state saved with the event-at-a-time bounder goes on with the same counts
        if isinstance(state.get("bounder"), ContributionBounder):
            state = {**state, "bounder": ColumnBounder.from_bounder(state["bounder"])}
        self.__dict__.update(state)
        self._run_index = None
        self.__dict__.setdefault("mode", None)

    def bound(
        self,
        events: Iterable[object],
        max_items: int | None,
        check: Callable[[tuple[Hashable, ...]], None] | None = None,
    ) -> tuple[list[tuple[Hashable, ...]], Any]:
        """Check every ``(user, items)`` event, then bound them; nothing changes yet.

        Each event's items are made distinct and checked (item types, at most
        ``max_items`` items when given, and ``check``, e.g. domain membership)
        *before* bounding, so an invalid event is reported even if its user
        is over the bounds. Returns the kept items per event and the pending
        change for :meth:`commit`.
        """
        ids: dict[Any, int] = {}  # each distinct user id (by type and value) once
        table: dict[Hashable, int] = {}
        user_of: list[int] = []
        codes: list[int] = []
        sizes: list[int] = []
        refuse_unordered(events)
        for event in events:
            user, items = split_user_event(event)
            if isinstance(user, bytearray):  # the bytes it holds (a bytearray is no dict key)
                user = bytes(user)
            norm = normalise_event(items, max_items)
            if check is not None:
                check(norm)
            if type(user) not in _PLAIN:
                self.hasher(user)  # raises for an id of another type, before the next event
            user_of.append(ids.setdefault((type(user), user), len(ids)))
            codes.extend(table.setdefault(x, len(table)) for x in norm)
            sizes.append(len(norm))
        hashes = self.hasher.many([u for _, u in ids], hex=True)
        users: dict[str, int] = {}  # equal hashes (1 and numpy's 1): one user
        remap = [users.setdefault(h, len(users)) for h in hashes]
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        names = list(table)
        keep, pending = self.bounder.bound_columns(
            list(users),
            np.asarray(remap, dtype=np.int64)[np.asarray(user_of, dtype=np.int64)],
            names,
            np.asarray(codes, dtype=np.int64),
            offsets,
            None,  # (each event's items made distinct above)
        )
        return kept_items(names, codes, keep, offsets), pending

    def bound_columns(
        self,
        events: UserEventColumns,
        max_items: int | None,
        check: Callable[[tuple[Hashable, ...]], None] | None = None,
    ) -> tuple[EventColumns | list[tuple[Hashable, ...]], Any]:
        """:meth:`bound` over columns: the kept occurrences as
        :class:`~dpstream.mechanisms.columns.EventColumns` (one entry per event, in
        order) and the pending change. A step with anything the per-event checks
        would refuse (an item or user id of another type, an event over
        ``max_items``, an item ``check`` refuses) goes through :meth:`bound`, which
        raises the same error as for a list of pairs."""
        cols = events.events
        items, codes, offsets = cols.items, cols.codes, cols.offsets
        plain = (isinstance(items, TakenItems) and items.all_str) or _PLAIN.issuperset(
            map(type, items)
        )
        if plain and not isinstance(items, TakenItems) and len(set(items)) < len(items):
            plain = False  # one item under two codes: the per-event path counts it once
        first, distinct = distinct_in_events(codes, offsets)
        if max_items is not None and distinct.size and int(distinct.max()) > max_items:
            plain = False
        if plain and check is not None and codes.size:
            try:
                check(tuple(take_at(items, np.unique(codes))))
            except InvalidEventError:
                plain = False
        users = self._users_of(events) if plain else None
        if users is None:
            return self.bound(events.pairs(), max_items, check)
        hashes, user_of, known, item_known, index = users
        keep, change = self.bounder.bound_columns(
            hashes, user_of, items, codes, offsets, first, known=known, item_known=item_known,
            items_complete=index is not None and index.items_complete(),
        )  # fmt: skip
        pending: Any = change
        if index is not None:
            assert events.ids is not None and known is not None and item_known is not None
            pending = _Pending(
                change, index, events.ids, np.flatnonzero(known < 0), np.flatnonzero(item_known < 0)
            )
        event_of = np.repeat(np.arange(len(cols)), np.diff(offsets))
        new_offsets = np.zeros(offsets.size, dtype=np.int64)
        np.cumsum(np.bincount(event_of[keep], minlength=len(cols)), out=new_offsets[1:])
        kept = codes[keep]
        # only the items kept somewhere (the mechanism looks up each item it is given,
        # and an item every user was refused would stay new to it at every step)
        present = np.zeros(len(items), dtype=bool)
        present[kept] = True
        if not present.all():
            used = np.flatnonzero(present)
            kept = (np.cumsum(present) - 1)[kept]
            items = take_at(items, used)
        elif not isinstance(items, list):
            items = list(items)
        return EventColumns(items, kept, new_offsets), pending

    def _users_of(self, events: UserEventColumns) -> tuple[Any, ...] | None:
        """The step's users for the bounder: ``(hashes, user_of, known, item_known,
        index)``, or None when a user id is not a str, int or bytes. With run-wide ids,
        only the users the state has not been seen to hold are hashed (``hashes`` is
        "" for the others) and ``known``/``item_known`` are the state's indices."""
        if events.ids is not None:
            source, uids, iids = events.ids
            index = self._run_index
            if index is None or index.source is not source or index.bounder is not self.bounder:
                index = self._run_index = _RunIndex(source, self.bounder)
            known, item_known = index.of(uids, iids)
            miss = np.flatnonzero(known < 0)
            ids = take_at(events.users, miss)
            if _PLAIN.issuperset(map(type, ids)):
                fresh = self.hasher.many(ids, hex=True)
                found = self.bounder.user_index(fresh)
                known[miss] = found
                # two ids, one user (equal hashes, or two ids the index learnt for one
                # user of the state): the path without ids, which merges them
                one = len(set(fresh)) == len(fresh)
                if one:
                    held = known[known >= 0]
                    one = np.unique(held).size == held.size
                if one:
                    index.learn(uids[miss], found)
                    given = [""] * len(known)
                    for j, h in zip(miss.tolist(), fresh, strict=True):
                        given[j] = h
                    return given, events.user_of, known, item_known, index
        hashes = self._hashes(events.users)
        if hashes is None:
            return None
        user_of = events.user_of
        if len(set(hashes)) < len(hashes):  # one user given twice: one index
            table: dict[str, int] = {}
            remap = np.fromiter((table.setdefault(h, len(table)) for h in hashes), np.int64)
            hashes, user_of = list(table), remap[user_of]
        return hashes, user_of, None, None, None

    def _hashes(self, users: Sequence[object]) -> list[str] | None:
        """The keyed hashes of user ids as hex text, or None when one is not a str, int
        or bytes."""
        if not _PLAIN.issuperset(map(type, users)):
            return None
        return self.hasher.many(users, hex=True)

    def commit(self, pending: Any) -> None:
        """Apply a step's pending change (from :meth:`bound` or :meth:`bound_columns`)."""
        if isinstance(pending, _Pending):
            change, index = pending.change, pending.index
            complete = index.items_complete()
            self.bounder.commit(change)
            if index is self._run_index:  # the ids of the users and items found
                index.learn(pending.user_ids, change.known[pending.users])
                index.learn_items(pending.item_ids, change.item_known[pending.items])
                # (every item added has an id of this step, learnt just now)
                index.items_synced = self.bounder.items_held if complete else -1
            return
        self.bounder.commit(pending)

    @property
    def users(self) -> int:
        """Users tracked so far (not private)."""
        return len(self.bounder)


def bound_user_events(
    users: UserLevel | None,
    events: Iterable[object] | EventColumns | UserEventColumns,
    max_items: int | None,
    check: Callable[[tuple[Hashable, ...]], None] | None = None,
) -> tuple[Iterable[object] | EventColumns, Any]:
    """``(events, None)`` at event level; in user mode the bounded item events and the
    pending bounder change (commit it once the step is released)."""
    if users is not None and users.mode == "aggregate":
        raise ValueError(_MIXED.format(now="step_batch(events)", before="bounded counts"))
    if isinstance(events, UserEventColumns):
        if users is None:
            raise TypeError(
                "UserEventColumns hold (user, items) pairs: give them to a mechanism "
                "built with max_items_per_user= and max_count_per_item="
            )
        return users.bound_columns(events, max_items, check)
    if users is None:
        return events, None
    if isinstance(events, EventColumns):
        raise TypeError(
            "with max_items_per_user= every event is a (user, items) pair: give "
            "a list of pairs, not EventColumns (which hold no users)"
        )
    return users.bound(events, max_items, check)


def commit_user_events(users: UserLevel | None, pending: Any) -> None:
    """Commit the pending bounder change of :func:`bound_user_events` once the step is
    released (``pending`` None: event level, nothing to commit)."""
    if pending is not None:
        assert users is not None  # (a pending change: user level)
        users.commit(pending)
        users.mode = "events"
