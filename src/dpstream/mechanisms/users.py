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

from ..bounding import ContributionBounder, UnitBound, UserBounds, UserHasher
from ..errors import InvalidEventError
from ..noise import NoiseKey
from ..privacy import PrivacyGuarantee
from .base import check_max_items, normalise_event
from .columns import EventColumns

__all__ = ["UserLevel", "unit_bound", "user_guarantee", "bound_user_events", "split_user_event"]


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


class UserLevel:
    """A mechanism's user-level state: the hasher of user ids and the contribution bounder.

    Picklable without key material (the hasher keeps the key object, which a
    snapshot stores as a reference).
    """

    def __init__(self, bounds: UserBounds, key: NoiseKey) -> None:
        self.bounds = bounds
        self.hasher = UserHasher(key)
        self.bounder = ContributionBounder(bounds)

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
        pairs = []
        for event in events:
            user, items = split_user_event(event)
            norm = normalise_event(items, max_items)
            if check is not None:
                check(norm)
            pairs.append((self.hasher(user), norm))
        return self.bounder.bound(pairs)

    def commit(self, pending: Any) -> None:
        self.bounder.commit(pending)

    @property
    def users(self) -> int:
        """Users tracked so far (not private)."""
        return len(self.bounder)


def bound_user_events(
    users: UserLevel | None,
    events: Iterable[object] | EventColumns,
    max_items: int | None,
    check: Callable[[tuple[Hashable, ...]], None] | None = None,
) -> tuple[Iterable[object] | EventColumns, Any]:
    """``(events, None)`` at event level; in user mode the bounded item events and the
    pending bounder change (commit it once the step is released)."""
    if users is None:
        return events, None
    if isinstance(events, EventColumns):
        raise TypeError(
            "with max_items_per_user= every event is a (user, items) pair: give "
            "a list of pairs, not EventColumns (which hold no users)"
        )
    return users.bound(events, max_items, check)
