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
from .user_bounder import ColumnBounder

__all__ = [
    "UserLevel",
    "UserEventColumns",
    "unit_bound",
    "user_guarantee",
    "bound_user_events",
    "split_user_event",
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
    return event[0], event[1]


class UserEventColumns:
    """The events of one step as columns, with their users: event j is the pair
    ``(users[user_of[j]], events.events()[j])``. Give it to a user-level
    mechanism's ``step_batch`` instead of a list of pairs (the same release,
    bounded without a Python loop over events).

    Example:
        >>> cols = EventColumns(["a", "b"], np.array([0, 1, 1]), np.array([0, 2, 3]))
        >>> UserEventColumns(["alice", "bob"], np.array([1, 0]), cols).pairs()
        [('bob', ['a', 'b']), ('alice', ['b'])]
    """

    __slots__ = ("users", "user_of", "events")

    def __init__(self, users: Sequence[object], user_of: np.ndarray, events: EventColumns) -> None:
        user_of = np.asarray(user_of)
        if not isinstance(events, EventColumns):
            raise TypeError(f"events must be EventColumns, got {type(events).__name__}")
        if user_of.ndim != 1 or user_of.dtype.kind not in "iu" or user_of.size != len(events):
            raise TypeError("user_of must be a 1-D integer array with one entry per event")
        if user_of.size and (user_of.min() < 0 or user_of.max() >= len(users)):
            raise ValueError("user_of must index users")
        self.users = users
        self.user_of = user_of.astype(np.int64, copy=False)
        self.events = events

    def __len__(self) -> int:
        return len(self.events)

    def pairs(self) -> list[tuple[object, list[Hashable]]]:
        """The events as ``(user, items)`` pairs (the per-event path, and for tests)."""
        users = self.users
        return [
            (users[u], ev)
            for u, ev in zip(self.user_of.tolist(), self.events.events(), strict=True)
        ]


class UserLevel:
    """A mechanism's user-level state: the hasher of user ids and the contribution bounder
    (:class:`~dpstream.mechanisms.user_bounder.ColumnBounder`).

    Picklable without key material (the hasher keeps the key object, which a
    snapshot stores as a reference).
    """

    def __init__(self, bounds: UserBounds, key: NoiseKey) -> None:
        self.bounds = bounds
        self.hasher = UserHasher(key)
        self.bounder = ColumnBounder(bounds)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a state saved with the event-at-a-time bounder goes on with the same counts
        if isinstance(state.get("bounder"), ContributionBounder):
            state = {**state, "bounder": ColumnBounder.from_bounder(state["bounder"])}
        self.__dict__.update(state)

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
        for event in events:
            user, items = split_user_event(event)
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
        flat = [names[c] if k else None for c, k in zip(codes, keep.tolist(), strict=True)]
        bounds = offsets.tolist()
        kept = [
            tuple(x for x in flat[a:b] if x is not None)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        return kept, pending

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
        hashes = self._hashes(events.users) if _PLAIN.issuperset(map(type, items)) else None
        first, distinct = distinct_in_events(codes, offsets)
        if max_items is not None and distinct.size and int(distinct.max()) > max_items:
            hashes = None
        if hashes is not None and check is not None and codes.size:
            try:
                check(tuple(items[i] for i in np.unique(codes).tolist()))
            except InvalidEventError:
                hashes = None
        if hashes is None:
            return self.bound(events.pairs(), max_items, check)
        user_of = events.user_of
        if len(set(hashes)) < len(hashes):  # one user given twice: one index
            table: dict[str, int] = {}
            remap = np.fromiter((table.setdefault(h, len(table)) for h in hashes), np.int64)
            hashes, user_of = list(table), remap[user_of]
        keep, pending = self.bounder.bound_columns(hashes, user_of, items, codes, offsets, first)
        event_of = np.repeat(np.arange(len(cols)), np.diff(offsets))
        new_offsets = np.zeros(offsets.size, dtype=np.int64)
        np.cumsum(np.bincount(event_of[keep], minlength=len(cols)), out=new_offsets[1:])
        return EventColumns(items, codes[keep], new_offsets), pending

    def _hashes(self, users: Sequence[object]) -> list[str] | None:
        """The keyed hashes of user ids as hex text, or None when one is not a str, int
        or bytes."""
        if not _PLAIN.issuperset(map(type, users)):
            return None
        return self.hasher.many(users, hex=True)

    def commit(self, pending: Any) -> None:
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
