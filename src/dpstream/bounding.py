"""Contribution bounding: what one privacy unit (an event, or a user) may change.

Layer 3 of dpstream (the floor of ``tree`` and ``factorization``). Pure code:
no noise, no I/O.

Two privacy units
-----------------
* **Event** (the default): one event holds at most Delta0 items (``max_items``),
  each counted once, at one time step.
* **User**: events carry a user id, and over the whole stream each user
  contributes to at most L0 = ``max_items_per_user`` distinct items, at most
  Linf = ``max_count_per_item`` times to each (PipelineDP's
  max_partitions_contributed and max_contributions_per_partition).
  :class:`ContributionBounder` enforces this on a stream: a user's
  contributions are kept in arrival order and what exceeds the bounds is
  dropped ("first come, first kept"). Which of a user's contributions are kept
  is a function of that user's own events only, so removing one user changes
  no other user's kept contributions: the bounded streams of two neighbouring
  inputs differ by exactly one user's bounded contributions.

Both units are described by a :class:`UnitBound` (at most ``items`` items, each
count changed by at most ``per_item``); an event is the unit ``items = Delta0,
per_item = 1``.

Sensitivity of a linear counter, for either unit
------------------------------------------------
The continual counters of dpstream release, per item u, a linear image C x^u of
the item's per-step counts x^u (plus Gaussian noise of the same standard
deviation on every coordinate): the r-ary tree's partial-sum table (C has a row
per cell, a 1 where the cell covers the step) or a BLT factorization's strategy
matrix C (:mod:`dpstream.factorization`). Items are separate counters (separate
coordinates, independent noise).

**Lemma.** Let a unit contribute x^u to item u, with x^u an integer vector,
x^u >= 0, sum_t x^u_t <= per_item (several of a user's events may fall in one
step), and x^u != 0 for at most ``items`` items. For *any* matrix C,

    max ||(C x^u)_u||_2 = sqrt(items) * per_item * max_j ||C e_j||_2,

the maximum over all such placements of the stacked vector over items.

*Proof.* For one item, by the triangle inequality and x >= 0,
||C x|| = ||sum_j x_j C e_j|| <= sum_j x_j ||C e_j|| <= (sum_j x_j) max_j
||C e_j|| <= per_item max_j ||C e_j||. The bound is attained by x =
per_item e_j* (all of the unit's count at a step j* whose column is longest),
an allowed placement. (Equivalently: ||C x|| is convex in x, so its maximum
over the polytope {x >= 0, sum x <= per_item} is at a vertex, 0 or per_item
e_j.) The stacked squared norm is the sum of the items' squared norms, each
at most per_item^2 max_j ||C e_j||^2, over at most ``items`` nonzero items;
``items`` items each placed at j* attain it. QED.

So with noise of standard deviation tau * max_j ||C e_j|| on every coordinate
(the tree's cell noise sqrt(L_r) tau: every step lies in one cell per level,
max_j ||C e_j||^2 = L_r; the BLT's sigma = tau max_j ||C e_j||), the release is
a Gaussian mechanism with sensitivity/noise ratio mu = sqrt(items) per_item /
tau, i.e. ``items * per_item**2 / (2 tau**2)``-zCDP with the exact Gaussian
(epsilon, delta) curve: :func:`gaussian_coefficient`. The event unit gives the
paper's Delta0 / (2 tau^2) (KnownBase lemma). The lemma needs x >= 0: the
neighbour relation removes a unit's contributions (replaces them by nothing);
it would not hold for replacing one user's data by another's (x of mixed sign).

User ids are never kept in clear: :class:`UserHasher` maps them to 128-bit
keyed hashes (BLAKE2b under a subkey of the noise key with its own label), and
the bounder holds only those hashes, the kept items and their counts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from . import compiled
from ._checks import check_int
from .noise import NoiseKey, encode_item

__all__ = [
    "UNITS",
    "UserBounds",
    "UnitBound",
    "UserHasher",
    "ContributionBounder",
    "BoundingStats",
    "gaussian_coefficient",
    "unit_sensitivity",
    "resolve_user_bounds",
]

#: The privacy units (``PrivacyGuarantee.unit``).
UNITS = ("event", "user")


@dataclass(frozen=True)
class UserBounds:
    """Per-user contribution bounds over the whole stream (user-level privacy).

    Attributes:
        max_items_per_user: L0, the most distinct items one user contributes to.
        max_count_per_item: Linf, the most times one user is counted for one item.
    """

    max_items_per_user: int
    max_count_per_item: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "max_items_per_user", check_int("max_items_per_user", self.max_items_per_user, 1)
        )
        object.__setattr__(
            self, "max_count_per_item", check_int("max_count_per_item", self.max_count_per_item, 1)
        )

    @property
    def unit(self) -> UnitBound:
        """The user as a :class:`UnitBound` (L0 items, Linf per item)."""
        return UnitBound(
            items=self.max_items_per_user, per_item=self.max_count_per_item, unit="user"
        )

    def tag(self) -> str:
        """A short text for noise purposes and run parameters (``"user:L0xLinf"``)."""
        return f"user:{self.max_items_per_user}x{self.max_count_per_item}"

    def describe(self) -> str:
        """The bounds in words."""
        times = "once" if self.max_count_per_item == 1 else f"{self.max_count_per_item} times"
        n = self.max_items_per_user
        return f"each user counted for at most {n} item{'s' if n > 1 else ''}, at most {times} each"


def resolve_user_bounds(
    max_items_per_user: object, max_count_per_item: object
) -> UserBounds | None:
    """The :class:`UserBounds` of a mechanism's keyword arguments, or None (event level).

    Both are given (user level) or neither (event level): one alone is an error,
    since a silent default would either leave a user's contributions unbounded or
    count something else than asked.
    """
    if max_items_per_user is None and max_count_per_item is None:
        return None
    if max_items_per_user is None or max_count_per_item is None:
        missing = "max_items_per_user" if max_items_per_user is None else "max_count_per_item"
        raise ValueError(
            f"user-level privacy needs max_items_per_user= and "
            f"max_count_per_item= together (missing {missing}=)"
        )
    return UserBounds(max_items_per_user, max_count_per_item)  # type: ignore[arg-type]


@dataclass(frozen=True)
class UnitBound:
    """What one privacy unit may change: at most ``items`` item counts, each by at most
    ``per_item`` in total over the stream (an event: Delta0 items, 1 each)."""

    items: int
    per_item: int = 1
    unit: str = "event"

    def __post_init__(self) -> None:
        check_int("items", self.items, 1)
        check_int("per_item", self.per_item, 1)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    @property
    def coefficient(self) -> float:
        """:func:`gaussian_coefficient` of this unit."""
        return gaussian_coefficient(self.items, self.per_item)


def gaussian_coefficient(items: int, per_item: int = 1) -> float:
    """a in rho = a / tau^2 for a linear counter per item with noise tau max_j ||C e_j||.

    ``items * per_item**2 / 2`` (the module's lemma): mu^2 / 2 with mu =
    sqrt(items) per_item / tau the sensitivity/noise ratio.
    """
    items = check_int("items", items, 1)
    per_item = check_int("per_item", per_item, 1)
    return items * per_item * per_item / 2.0


def unit_sensitivity(max_column_norm: float, items: int, per_item: int = 1) -> float:
    """The l2 sensitivity sqrt(items) * per_item * max_j ||C e_j|| of the stacked C x^u.

    The module's lemma: exact (attained) for any matrix C whose longest column
    has norm ``max_column_norm``.
    """
    if not (math.isfinite(max_column_norm) and max_column_norm >= 0):
        raise ValueError(f"max_column_norm must be finite and >= 0, got {max_column_norm!r}")
    return (
        math.sqrt(check_int("items", items, 1))
        * check_int("per_item", per_item, 1)
        * float(max_column_norm)
    )


class UserHasher:
    """User ids to 128-bit keyed hashes (BLAKE2b, key derived as ``"user-id/v1"``).

    The label is its own purpose of the noise key, so a user's hash is never an
    item's identifier or a noise value. Pickling keeps the :class:`NoiseKey`
    object (a snapshot stores it as a reference, never the bytes), not the
    derived hash key.
    """

    __slots__ = ("_key", "_hash_key")

    def __init__(self, key: NoiseKey) -> None:
        if not isinstance(key, NoiseKey):
            raise TypeError(f"key must be a dpstream.NoiseKey, got {type(key).__name__}")
        self._key = key
        self._hash_key = key.derive("user-id/v1")

    def __call__(self, user: object) -> bytes:
        """The 16-byte keyed hash of ``user`` (str, int or bytes, as items are)."""
        try:
            data = encode_item(user)
        except TypeError:
            raise TypeError(
                f"a user id must be a str, int or bytes, got {type(user).__name__}"
            ) from None
        return hashlib.blake2b(data, key=self._hash_key, digest_size=16).digest()

    @overload
    def many(self, users: Iterable[object]) -> list[bytes]: ...
    @overload
    def many(self, users: Iterable[object], hex: Literal[True]) -> list[str]: ...

    def many(self, users: Iterable[object], hex: bool = False) -> list[bytes] | list[str]:
        """The hashes of many user ids (each as :meth:`__call__` gives it; the keyed
        state is set up once and copied per id); with ``hex``, as hex text."""
        if hex:  # in C when the compiled loops are on (the same digests)
            ids = users if isinstance(users, list) else list(users)
            digests = np.empty((len(ids), 2), dtype="<u8")
            try:
                done = compiled.item_digests_into(ids, self._hash_key, encode_item, digests)
            except TypeError:  # (an id of another type: the loop below says which)
                done = False
            if done:
                text = digests.tobytes().hex()
                return [text[i : i + 32] for i in range(0, len(text), 32)]
            users = ids
        base = hashlib.blake2b(key=self._hash_key, digest_size=16)
        out = []
        for user in users:
            try:  # a str as encode_item gives it, without its checks (the common case)
                data = (
                    b"s" + user.encode("utf-8", "surrogatepass")
                    if type(user) is str
                    else encode_item(user)
                )
            except TypeError:
                raise TypeError(
                    f"a user id must be a str, int or bytes, got {type(user).__name__}"
                ) from None
            h = base.copy()
            h.update(data)
            out.append(h.hexdigest() if hex else h.digest())
        return out  # type: ignore[return-value]

    def __reduce__(self) -> tuple[Any, ...]:
        return (UserHasher, (self._key,))

    def __repr__(self) -> str:
        return "UserHasher(...)"


@dataclass
class BoundingStats:
    """What a :class:`ContributionBounder` dropped (not private: for the operator)."""

    kept: int = 0
    dropped: int = 0  # item occurrences dropped
    dropped_new_item: int = 0  # ... of them, because the user had max_items_per_user items
    dropped_count: int = 0  # ... because the user had max_count_per_item of that item

    def add(self, other: BoundingStats) -> None:
        """Count in another batch's (a committed one's)."""
        self.kept += other.kept
        self.dropped += other.dropped
        self.dropped_new_item += other.dropped_new_item
        self.dropped_count += other.dropped_count


@dataclass
class _Pending:
    """The changes a batch would make to a bounder, applied by ``commit``."""

    users: dict[bytes, dict[Hashable, int]] = field(default_factory=dict)
    stats: BoundingStats = field(default_factory=BoundingStats)


class ContributionBounder:
    """Keeps each user within ``UserBounds`` over the whole stream: first come, first kept.

    Feed it every event in arrival order (time step, then input order within a
    step) as ``(user hash, items)``. An item occurrence of user v is kept iff
    v already holds that item with fewer than ``max_count_per_item`` kept
    occurrences, or v holds fewer than ``max_items_per_user`` items (then it
    becomes one of them); otherwise it is dropped. Items of one event are taken
    in the event's order; an event counts each of its distinct items once.

    Deterministic, and a function of v's own events only (their order and
    items), so removing another user changes nothing that v keeps (the module's
    docstring says why that is what the privacy proof needs).

    State: per tracked user, the kept items and their counts, keyed by the
    user's hash (see :class:`UserHasher`; no id in clear, no key material):
    about 250 bytes per tracked user with a few items (``bench/bench_bounding.py``),
    each distinct kept item stored once.
    A batch is bounded in two phases, :meth:`bound` then :meth:`commit`, so a
    mechanism that rejects a batch leaves the bounder unchanged. Picklable
    (a run's snapshot holds it).

    Example:
        >>> b = ContributionBounder(UserBounds(max_items_per_user=1, max_count_per_item=2))
        >>> kept, pending = b.bound([(b"u1", ("a", "b")), (b"u1", ("a",)), (b"u1", ("a",))])
        >>> kept
        [('a',), ('a',), ()]
        >>> b.commit(pending)
    """

    def __init__(self, bounds: UserBounds) -> None:
        if not isinstance(bounds, UserBounds):
            raise TypeError(f"bounds must be a UserBounds, got {type(bounds).__name__}")
        self.bounds = bounds
        self._users: dict[bytes, dict[Hashable, int]] = {}
        self._names: dict[Hashable, Hashable] = {}  # one object per distinct kept item
        self.stats = BoundingStats()

    def __len__(self) -> int:
        """The number of users tracked (who kept at least one contribution). Not private."""
        return len(self._users)

    def kept_of(self, user_hash: bytes) -> dict[Hashable, int]:
        """A copy of the kept counts of one user (item -> count). Not private."""
        return dict(self._users.get(user_hash, {}))

    def bound(
        self, events: Iterable[tuple[bytes, Sequence[Hashable]]]
    ) -> tuple[list[tuple[Hashable, ...]], _Pending]:
        """The kept items of each event, in order, and the pending state change.

        Args:
            events: ``(user hash, items)`` in arrival order; the items of one
                event are made distinct (first occurrence kept).

        Returns:
            ``(kept, pending)``: ``kept[i]`` the items of event i within the
            bounds (possibly none); pass ``pending`` to :meth:`commit` once the
            batch is accepted.
        """
        l0 = self.bounds.max_items_per_user
        linf = self.bounds.max_count_per_item
        pending = _Pending()
        stats = pending.stats
        out: list[tuple[Hashable, ...]] = []
        for user, items in events:
            if not isinstance(user, bytes):
                raise TypeError(f"a user hash must be bytes, got {type(user).__name__}")
            held = pending.users.get(user)
            if held is None:
                held = dict(self._users.get(user, ()))
                pending.users[user] = held
            kept = []
            for item in dict.fromkeys(items):
                count = held.get(item)
                if count is None:
                    if len(held) >= l0:
                        stats.dropped += 1
                        stats.dropped_new_item += 1
                        continue
                    item = self._names.setdefault(item, item)
                    held[item] = 1
                elif count >= linf:
                    stats.dropped += 1
                    stats.dropped_count += 1
                    continue
                else:
                    held[item] = count + 1
                kept.append(item)
            stats.kept += len(kept)
            out.append(tuple(kept))
        return out, pending

    def commit(self, pending: _Pending) -> None:
        """Apply the state change of an accepted batch (from :meth:`bound`)."""
        for user, held in pending.users.items():
            if held:
                self._users[user] = held
        self.stats.add(pending.stats)

    def __repr__(self) -> str:
        b = self.bounds
        return (
            f"ContributionBounder(max_items_per_user={b.max_items_per_user}, "
            f"max_count_per_item={b.max_count_per_item}, users={len(self)})"
        )
