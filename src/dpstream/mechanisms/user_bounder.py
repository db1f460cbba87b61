"""First come, first kept, over a whole batch of events at once (NumPy, or C).

Layer 5 of dpstream (the state of :class:`~dpstream.mechanisms.users.UserLevel`).
Pure code: no noise, no I/O. :class:`ColumnBounder` keeps each user within
:class:`UserBounds` by the
rule of :class:`~dpstream.bounding.ContributionBounder` (which stays as the
event-at-a-time statement of the rule, and the brute-force twin the tests hold
this one against): events in arrival order (time step, then input order within
a step); an item occurrence of user v is kept iff v already holds the item
with fewer than ``max_count_per_item`` kept occurrences, or v holds fewer than
``max_items_per_user`` items (the item then becomes one of them).

Why a batch can be bounded without a loop over its events
---------------------------------------------------------
Group a batch's occurrences by (user, item), each event's items made distinct.
Held items never leave a user and counts never go down, so, with c0 the
pair's count before the batch (0: not held) and h0 the user's held items:

* the occurrence of rank r (0-based, in arrival order) of a held pair is kept
  iff c0 + r < Linf (every earlier one was kept while under the bound);
* a pair not held before is admitted iff fewer than L0 - h0 of the user's new
  pairs come before it by first occurrence (each first occurrence of a new
  item is admitted while the user has room, and nothing else fills it); an
  admitted pair then keeps its ranks r < Linf, a refused one keeps nothing
  (the user stays full, so each later occurrence is refused too).

So one stable sort by (user, item) gives every decision: that is the NumPy
path. With the compiled loops (:mod:`dpstream.compiled`), ``_loops.user_bound``
applies the rule event by event in one pass instead, against a small table of
the batch's pairs (their counts before the batch read from the state's table,
which it does not change), and ``_loops.pair_store`` writes the counts at
commit: the same decisions, the same state (the tests run both against the
event-at-a-time bounder, and one after the other on one state).

The state is a table of the users' keyed hashes (dense indices), the number of
items each holds, the kept items once each, and the counts of the held (user,
item) pairs in an open-addressing hash table of int64 keys ``user << 32 | item``
(linear probing, at most half full: a batch costs about its own size, whatever
the state holds). About 160, 260 and 450
bytes per user holding 1, 3 and 10 items (``bench/bench_bounding.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import compiled
from ..bounding import BoundingStats, ContributionBounder, UserBounds
from .columns import distinct_in_events
from .item_table import ItemTable, take_at

__all__ = ["ColumnBounder", "ColumnPending", "kept_items"]

_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
#: The pair table's least number of slots, and its fullest share (then it doubles).
_MIN_SLOTS = 64
_MAX_FILL = (1, 2)
#: Fibonacci hashing's multiplier (2^64 / the golden ratio, odd).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = -1


def _slots_of(keys: np.ndarray, size: int) -> np.ndarray:
    """Each key's home slot in a table of ``size`` (a power of two) slots."""
    bits = size.bit_length() - 1
    with np.errstate(over="ignore"):
        h = keys.astype(np.uint64) * _GOLDEN
    return (h >> np.uint64(64 - bits)).astype(np.int64)


def _probe(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each key's slot in an open-addressing ``table`` (linear probing), or -1."""
    size = table.size
    mask = size - 1
    pos = _slots_of(keys, size)
    out = np.full(keys.size, -1, dtype=np.int64)
    active = np.arange(keys.size)
    while active.size:  # each round: one probe for every key still looking
        cand = table[pos[active]]
        hit = cand == keys[active]
        out[active[hit]] = pos[active[hit]]
        active = active[~hit & (cand != _EMPTY)]
        pos[active] = (pos[active] + 1) & mask
    return out


def _insert(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Put distinct keys absent from ``table`` into empty slots: their slots."""
    mask = table.size - 1
    pos = _slots_of(keys, table.size)
    out = np.empty(keys.size, dtype=np.int64)
    active = np.arange(keys.size)
    while active.size:  # each round: the keys at an empty slot claim it, one per slot
        at = pos[active]
        free = table[at] == _EMPTY
        table[at[free]] = keys[active[free]]  # two keys at one slot: one of them wins
        won = table[at] == keys[active]
        out[active[won]] = at[won]
        active = active[~won]
        pos[active] = (pos[active] + 1) & mask
    return out


@dataclass
class ColumnPending:
    """The change one batch makes to a :class:`ColumnBounder`, applied by ``commit``:
    the batch's users (hex hashes) with their indices in the state then (-1: not
    there) and the held items each then has; the batch's items with their indices
    in the state (-1: not there, or not looked up); and per touched (user, item)
    pair (places in ``users`` and ``items``) its count before and after. ``commit``
    writes the indices of the users and items it adds into ``known`` and
    ``item_known`` (what a caller that maps its own ids to the state's reads)."""

    users: Sequence[str] = field(default_factory=list)
    known: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    held: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    items: Sequence[Hashable] = field(default_factory=list)
    item_known: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_user: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_before: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stats: BoundingStats = field(default_factory=BoundingStats)
    #: the state's numbers of users and items when bounded, and whether every item
    #: was looked up (then, the state unchanged since, -1 means "not there")
    sizes: tuple[int, int] = (-1, -1)
    items_looked_up: bool = False


def kept_items(
    names: Sequence[Hashable], codes: Sequence[int], keep: np.ndarray, offsets: np.ndarray
) -> list[tuple[Hashable, ...]]:
    """Each event's kept items, in order: ``names[codes[i]]`` for every occurrence i that
    ``keep`` marks, event e holding occurrences ``offsets[e]`` .. ``offsets[e + 1] - 1``."""
    flat = [names[c] if k else None for c, k in zip(codes, keep.tolist(), strict=True)]
    bounds = offsets.tolist()
    return [
        tuple(x for x in flat[a:b] if x is not None)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


class ColumnBounder:
    """:class:`~dpstream.bounding.ContributionBounder`'s rule over columns: the same
    decisions, the same statistics, the state in arrays.

    A batch is bounded in two phases, :meth:`bound_columns` (or :meth:`bound`,
    the event-list form) then :meth:`commit`, so a mechanism that rejects a batch
    leaves the bounder unchanged. Holds only the users' keyed hashes (as hex
    text, in an :class:`~dpstream.mechanisms.item_table.ItemTable`), the kept
    items (another one) and their counts: no id in clear. Picklable and
    snapshot-safe.

    Example:
        >>> b = ColumnBounder(UserBounds(max_items_per_user=1, max_count_per_item=2))
        >>> kept, pending = b.bound([(b"u1", ("a", "b")), (b"u1", ("a",)), (b"u1", ("a",))])
        >>> kept
        [('a',), ('a',), ()]
        >>> b.commit(pending)
    """

    def __init__(self, bounds: UserBounds) -> None:
        if not isinstance(bounds, UserBounds):
            raise TypeError(f"bounds must be a UserBounds, got {type(bounds).__name__}")
        self.bounds = bounds
        self.stats = BoundingStats()
        self._users = ItemTable()  # user hashes (hex) -> dense index, by first kept item
        self._held = np.zeros(0, dtype=np.int64)  # per user: items held
        self._items = ItemTable()  # the kept items, each once
        # the held pairs' counts: an open-addressing table of keys user << 32 | item
        self._keys = np.full(_MIN_SLOTS, _EMPTY, dtype=np.int64)
        # int32 counts (a count never passes Linf) unless Linf does not fit
        wide = bounds.max_count_per_item >= 2**31
        self._counts = np.zeros(_MIN_SLOTS, dtype=np.int64 if wide else np.int32)
        self._pairs = 0

    @classmethod
    def from_bounder(cls, old: ContributionBounder) -> ColumnBounder:
        """The state of an event-at-a-time bounder, as columns (same decisions after)."""
        new = cls(old.bounds)
        pend = ColumnPending()
        counts, pu, items = [], [], []
        for u, held in enumerate(old._users.values()):
            for item, count in held.items():
                pu.append(u)
                items.append(item)
                counts.append(count)
        pend.users = [user.hex() for user in old._users]
        pend.known = np.full(len(pend.users), -1, dtype=np.int64)
        pend.held = np.asarray([len(h) for h in old._users.values()], dtype=np.int64)
        pend.items = items
        pend.item_known = np.full(len(items), -1, dtype=np.int64)
        pend.pair_user = np.asarray(pu, dtype=np.int64)
        pend.pair_code = np.arange(len(items), dtype=np.int64)
        pend.pair_before = np.zeros(len(items), dtype=np.int64)
        pend.pair_count = np.asarray(counts, dtype=np.int64)
        new.commit(pend)
        new.stats = BoundingStats(**vars(old.stats))
        return new

    def __len__(self) -> int:
        """The number of users tracked (who kept at least one contribution). Not private."""
        return len(self._users)

    @property
    def items_held(self) -> int:
        """The number of distinct items the state holds (of any user). Not private."""
        return len(self._items)

    def user_index(self, hashes: Sequence[str]) -> np.ndarray:
        """The state's indices of users by their hex hashes (-1: not held)."""
        if not len(self._users) or not len(hashes):
            return np.full(len(hashes), -1, dtype=np.int64)
        return self._users.lookup(list(hashes))

    def kept_of(self, user_hash: bytes) -> dict[Hashable, int]:
        """A copy of the kept counts of one user (item -> count). Not private."""
        u = self._users.get(user_hash.hex())
        if u is None:
            return {}
        out: dict[Hashable, int] = {}
        at = np.flatnonzero((self._keys >> _SHIFT) == u)  # (an empty slot is -1 >> 32 = -1)
        at = at[np.argsort(self._keys[at])]
        items = self._items.take(self._keys[at] & _LOW)
        out.update(zip(items, self._counts[at].tolist(), strict=True))
        return out

    # -- the pair table ------------------------------------------------------------------
    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """The counts of pair keys (0 for a pair not held)."""
        at = _probe(self._keys, keys)
        return np.where(at >= 0, self._counts[np.maximum(at, 0)], 0).astype(np.int64)

    def _store(self, keys: np.ndarray, counts: np.ndarray, fresh: int | None = None) -> None:
        """Set the counts of distinct pair keys (held ones updated, the others added);
        at most ``fresh`` of them (None: any) are not held yet."""
        counts = np.asarray(counts, dtype=np.int64)
        need = self._pairs + (keys.size if fresh is None else fresh)
        size = self._keys.size
        while need * _MAX_FILL[1] > size * _MAX_FILL[0]:
            size *= 2
        loops = compiled.loops()
        if size > self._keys.size:  # rehash into a table twice (or more) the size
            held = self._keys != _EMPTY
            old_keys, old_counts = self._keys[held], self._counts[held]
            self._keys = np.full(size, _EMPTY, dtype=np.int64)
            self._counts = np.zeros(size, dtype=self._counts.dtype)
            if loops is not None:
                loops.pair_store(self._keys, self._counts, old_keys, old_counts.astype(np.int64), 0)
            else:
                self._counts[_insert(self._keys, old_keys)] = old_counts
        if loops is not None:
            self._pairs += loops.pair_store(self._keys, self._counts, keys, counts, self._pairs)
            return
        at = _probe(self._keys, keys)
        new = at < 0
        if new.any():
            at[new] = _insert(self._keys, keys[new])
            self._pairs += int(np.count_nonzero(new))
        self._counts[at] = counts

    # -- bounding ------------------------------------------------------------------------
    def bound_columns(
        self,
        users: Sequence[str],
        user_of: np.ndarray,
        items: Sequence[Hashable],
        codes: np.ndarray,
        offsets: np.ndarray,
        first: np.ndarray | None | bool = False,
        *,
        known: np.ndarray | None = None,
        item_known: np.ndarray | None = None,
        items_complete: bool = False,
    ) -> tuple[np.ndarray, ColumnPending]:
        """Which occurrences of a batch are kept, and the pending state change.

        Args:
            users: the batch's distinct user hashes as hex text (any order;
                :meth:`~dpstream.bounding.UserHasher.many` with ``hex=True``).
            user_of: per event, the index of its user in ``users``.
            items: the batch's distinct items.
            codes, offsets: event j holds the items ``items[codes[offsets[j]:
                offsets[j + 1]]]``, events in arrival order; an item repeated
                within an event is taken once (its first occurrence).
            first: which occurrences are the first of their item in their event
                (``distinct_in_events``'s mask, None: all), when the caller has it.
            known, item_known: the users' and the items' indices in the state
                (-1: not there, or not known), when the caller keeps them (from
                an earlier pending's, after its commit); the users and items
                marked -1 are looked up. ``users[j]`` is read only where
                ``known[j]`` ends up -1.
            items_complete: ``item_known``'s -1 all mean "not there" (the caller
                knows every item of the state): none is looked up.

        Returns:
            ``(keep, pending)``: ``keep`` a bool mask over ``codes``; pass
            ``pending`` to :meth:`commit` once the batch is accepted.
        """
        codes = np.asarray(codes, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        user_of = np.asarray(user_of, dtype=np.int64)
        n_ev = offsets.size - 1
        if user_of.shape != (n_ev,):
            raise ValueError("user_of must give one user per event")
        pending = ColumnPending(users=users, items=items)
        pending.sizes = (len(self._users), len(self._items))
        keep = np.zeros(codes.size, dtype=bool)
        pending.known = np.full(len(users), -1, dtype=np.int64)
        pending.held = np.zeros(len(users), dtype=np.int64)
        pending.item_known = np.full(len(items), -1, dtype=np.int64)
        if not codes.size:
            return keep, pending
        # the users' indices in the state (-1: not there yet)
        known_u = pending.known = self._resolve(self._users, users, known)
        held0 = np.zeros(len(users), dtype=np.int64)
        held0[known_u >= 0] = self._held[known_u[known_u >= 0]]
        pending.held = held0.copy()
        mask = distinct_in_events(codes, offsets)[0] if first is False else first
        assert not isinstance(mask, bool)  # (False: made here; True is no mask)
        if item_known is not None and items_complete:
            pending.item_known = np.array(item_known, dtype=np.int64)
            pending.items_looked_up = True
        loops = compiled.loops()
        if loops is not None:
            self._bound_compiled(loops, pending, keep, user_of, codes, offsets, mask, item_known)
        else:
            self._bound_numpy(pending, keep, user_of, codes, offsets, mask, item_known)
        return keep, pending

    @staticmethod
    def _resolve(table: ItemTable, keys: Sequence[Any], index: np.ndarray | None) -> np.ndarray:
        """The indices of ``keys`` in ``table`` (-1: not there), given or looked up where
        ``index`` has -1."""
        if index is None:
            return table.lookup(list(keys))
        out = np.array(index, dtype=np.int64)
        miss = np.flatnonzero(out < 0)
        if miss.size and len(table):
            out[miss] = table.lookup(take_at(keys, miss))
        return out

    def _bound_compiled(
        self,
        loops: Any,
        pending: ColumnPending,
        keep: np.ndarray,
        user_of: np.ndarray,
        codes: np.ndarray,
        offsets: np.ndarray,
        first: np.ndarray | None,
        item_known: np.ndarray | None,
    ) -> None:
        """:meth:`bound_columns` by the C loop (event by event, the state read only)."""
        n_users, n_items = len(self._users), len(self._items)
        known_u, items = pending.known, pending.items
        if not pending.items_looked_up:
            pending.item_known = self._resolve(self._items, items, item_known)
            pending.items_looked_up = True
        known_i = pending.item_known
        # a user or item new to the state: an index past the state's, its own
        uidx = np.where(known_u >= 0, known_u, n_users + np.arange(known_u.size))
        iidx = np.where(known_i >= 0, known_i, n_items + np.arange(known_i.size))
        n = codes.size
        out = np.empty((4, n), dtype=np.int64)
        pairs, kept, new_dropped, count_dropped = loops.user_bound(
            self._keys, self._counts, n_users, n_items, uidx, user_of, iidx, codes, offsets,
            None if first is None else first.view(np.uint8),
            self.bounds.max_items_per_user, self.bounds.max_count_per_item,
            pending.held, keep.view(np.uint8), out[0], out[1], out[2], out[3],
        )  # fmt: skip
        pending.pair_user = out[0, :pairs]  # (the pairs that keep an occurrence)
        pending.pair_code = out[1, :pairs]
        pending.pair_count = out[2, :pairs]
        pending.pair_before = out[3, :pairs]
        st = pending.stats
        st.kept = kept
        st.dropped_new_item = new_dropped
        st.dropped_count = count_dropped
        st.dropped = new_dropped + count_dropped

    def _bound_numpy(
        self,
        pending: ColumnPending,
        keep: np.ndarray,
        user_of: np.ndarray,
        codes: np.ndarray,
        offsets: np.ndarray,
        first: np.ndarray | None,
        item_known: np.ndarray | None,
    ) -> None:
        """:meth:`bound_columns` by sorts (see the module doc)."""
        l0 = self.bounds.max_items_per_user
        linf = self.bounds.max_count_per_item
        known_u, items, held0 = pending.known, pending.items, pending.held.copy()
        n_ev = offsets.size - 1
        occ = np.flatnonzero(first) if first is not None else np.arange(codes.size)
        ev = np.repeat(np.arange(n_ev), np.diff(offsets))[occ]
        u, c = user_of[ev], codes[occ]
        order = np.argsort(u * len(items) + c, kind="stable")  # by pair, arrival order
        su, sc = u[order], c[order]
        start = np.ones(order.size, dtype=bool)
        start[1:] = (su[1:] != su[:-1]) | (sc[1:] != sc[:-1])
        g_start = np.flatnonzero(start)  # each pair's first place in ``order``
        g_of = np.cumsum(start) - 1
        rank = np.arange(order.size) - g_start[g_of]
        g_user, g_code = su[g_start], sc[g_start]
        g_size = np.diff(np.append(g_start, order.size))
        g_first = order[g_start]  # the pair's first occurrence in arrival order
        gu = known_u[g_user]
        c0 = np.zeros(g_start.size, dtype=np.int64)
        gi = np.full(g_start.size, -1, dtype=np.int64)
        if (gu >= 0).any():  # the items of the users seen before: their counts
            wanted = np.zeros(len(items), dtype=bool)
            wanted[g_code[gu >= 0]] = True
            if pending.items_looked_up:
                wanted[:] = False
            elif item_known is not None:
                pending.item_known = np.array(item_known, dtype=np.int64)
                wanted &= pending.item_known < 0
            at = np.flatnonzero(wanted)
            pending.item_known[at] = self._items.lookup(take_at(items, at))
            gi = pending.item_known[g_code]
            old = (gu >= 0) & (gi >= 0)
            if old.any():
                c0[old] = self._lookup((gu[old] << _SHIFT) | gi[old])
        new = np.flatnonzero(c0 == 0)
        admit = np.zeros(g_start.size, dtype=bool)
        if new.size:  # a user's new pairs by first occurrence: the first L0 - h0 get in
            by = new[np.lexsort((g_first[new], g_user[new]))]
            nu = g_user[by]
            lead = np.ones(by.size, dtype=bool)
            lead[1:] = nu[1:] != nu[:-1]
            lead_at = np.flatnonzero(lead)
            nth = np.arange(by.size) - lead_at[np.cumsum(lead) - 1]
            admit[by] = nth < l0 - held0[nu]
            np.add.at(pending.held, g_user[by[admit[by]]], 1)
        room = np.where((c0 > 0) | admit, linf - c0, 0)
        kept_occ = rank < room[g_of]
        keep[occ[order[kept_occ]]] = True
        g_kept = np.minimum(g_size, room)
        touched = np.flatnonzero(g_kept > 0)
        pending.pair_user = g_user[touched]
        pending.pair_code = g_code[touched]
        pending.pair_before = c0[touched]
        pending.pair_count = c0[touched] + g_kept[touched]
        st = pending.stats
        st.kept = int(g_kept.sum())
        refused = (c0 == 0) & ~admit
        st.dropped_new_item = int(g_size[refused].sum())
        st.dropped_count = int((g_size - g_kept)[~refused].sum())
        st.dropped = st.dropped_new_item + st.dropped_count

    def bound(
        self, events: Iterable[tuple[bytes, Sequence[Hashable]]]
    ) -> tuple[list[tuple[Hashable, ...]], ColumnPending]:
        """:meth:`ContributionBounder.bound`'s form: ``(user hash, items)`` in arrival
        order in, the kept items of each event out (and the pending change)."""
        users: dict[bytes, int] = {}
        table: dict[Hashable, int] = {}
        user_of: list[int] = []
        codes: list[int] = []
        sizes: list[int] = []
        for user, items in events:
            if not isinstance(user, bytes):
                raise TypeError(f"a user hash must be bytes, got {type(user).__name__}")
            user_of.append(users.setdefault(user, len(users)))
            its = dict.fromkeys(items)
            codes.extend(table.setdefault(x, len(table)) for x in its)
            sizes.append(len(its))
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        names = list(table)
        keep, pending = self.bound_columns(
            [u.hex() for u in users], np.asarray(user_of, dtype=np.int64), names,
            np.asarray(codes, dtype=np.int64), offsets,
        )  # fmt: skip
        return kept_items(names, codes, keep, offsets), pending

    def commit(self, pending: ColumnPending) -> None:
        """Apply the state change of an accepted batch (from :meth:`bound_columns`)."""
        grows = np.flatnonzero(pending.held > 0)
        if grows.size:
            index = pending.known
            new = grows[index[grows] < 0]
            if new.size:  # users new to the state (or added since the batch was bounded)
                absent = pending.sizes[0] == len(self._users)  # (-1: not there)
                hexes = [pending.users[j] for j in new.tolist()]
                index[new] = self._users.positions(hexes, absent)
            if len(self._users) > self._held.size:
                more = max(len(self._users), 2 * self._held.size) - self._held.size
                self._held = np.concatenate([self._held, np.zeros(more, np.int64)])
            self._held[index[grows]] = pending.held[grows]
            if pending.pair_user.size:
                item_at = pending.item_known
                codes = pending.pair_code
                need = np.zeros(len(item_at), dtype=bool)  # (each item once, in order)
                need[codes[item_at[codes] < 0]] = True
                miss = np.flatnonzero(need)
                if miss.size:
                    its = pending.items
                    absent = pending.items_looked_up and pending.sizes[1] == len(self._items)
                    item_at[miss] = self._items.positions(take_at(its, miss), absent)
                if len(self._users) > _LOW >> 1 or len(self._items) > _LOW:
                    raise OverflowError("more than 2^31 users or 2^32 items held")
                keys = (index[pending.pair_user] << _SHIFT) | item_at[codes]
                fresh = int(np.count_nonzero(pending.pair_before == 0))
                self._store(keys, pending.pair_count, fresh)
        self.stats.add(pending.stats)

    def __repr__(self) -> str:
        b = self.bounds
        return (
            f"ColumnBounder(max_items_per_user={b.max_items_per_user}, "
            f"max_count_per_item={b.max_count_per_item}, users={len(self)})"
        )
