"""The items an open-domain mechanism has seen, numbered in order, in compact form.

Layer 5 of dpstream. UnkBase keeps every item it has seen, in order of first
appearance: position i of its state arrays is item i. A ``dict`` item ->
position plus a list of the items costs ~150 bytes per item (the str objects,
the boxed positions, the dict's entries), and a lookup of a fresh string (as
parsed from input) walks three or four cache misses once the table outgrows
the cache. :class:`ItemTable` holds the same map in three arrays:

* ``data``: the items' UTF-8 bytes end to end, ``offsets`` where each starts
  (item i is ``data[offsets[i]:offsets[i + 1]]``): uint32 while the bytes are
  fewer than 2^32, int64 from then on;
* ``slots``: an open-addressing table (linear probing) of entries, each a tag
  from the item's hash and its position + 1: uint32 entries up to 2^26 slots
  (the tag is the bits the position leaves, 6 or more), uint64 beyond; at most
  half full for a table that grows (an open domain, whose lookups often miss;
  a power of two of slots, doubled as it grows), 4/5 full for a fixed domain
  (built once, with exactly the slots that fill: 5 bytes per item whatever the
  domain's size; its lookups mostly hit, which takes ~3 probes at that fill, in
  the same cache line or the next).

The loops that hash, probe, compare and decode are C (``dpstream._loops``, see
:mod:`dpstream.compiled`). The hash is SipHash-1-3 of the UTF-8 bytes under a
random 128-bit key drawn for the table (``os.urandom``), so no input can be
crafted to pile items into one run of slots without it; a slot whose hash half
matches is confirmed by comparing the bytes, so two items are never confused.
Neither the key nor the slots are saved (in a snapshot or a pickle): a loaded
table draws a new key and rebuilds its slots from the bytes.

Only ``str`` items are held this way. The first item of another type (an int,
bytes) or a str that is not valid UTF-8 (a lone surrogate, which JSON can
carry) turns the table into a plain list + dict for good, and so does the
absence of the C module (``DPSTREAM_COMPILED=0``, or an install without a
compiler): the same positions, the same releases, the memory and speed of a
plain list + dict.
"""

from __future__ import annotations

import operator
import os
import weakref
from collections.abc import Hashable, Sequence
from itertools import repeat
from typing import Any, TypeGuard

import numpy as np

from .. import compiled
from .columns import object_addresses

__all__ = [
    "ItemTable",
    "TableItems",
    "TakenItems",
    "domain_table",
    "release_items",
    "take_at",
]

_STR = frozenset((str,))
_MIN_SLOTS = 16
#: The most filled share of the slots (the C insert refuses more than 4/5).
_GROWING_FILL = (1, 2)
_FIXED_FILL = (4, 5)
#: The most slots held as uint32 (above: uint64, whose tags are 32 bits).
_NARROW_MAX_SLOTS = 1 << 26
#: The most bytes of items whose offsets are held as uint32 (above: int64).
_NARROW_MAX_BYTES = (1 << 32) - 1


def _empty_slots(size: int) -> np.ndarray:
    return np.zeros(size, dtype=np.uint32 if size <= _NARROW_MAX_SLOTS else np.uint64)


def _grown(arr: np.ndarray, need: int) -> np.ndarray:
    """``arr`` with room for ``need`` entries: itself, or a copy 1.5x larger (or ``need``)."""
    if need <= arr.size:
        return arr
    out = np.zeros(max(need, arr.size + arr.size // 2), dtype=arr.dtype)
    out[: arr.size] = arr
    return out


def _exactly_str(items: Sequence[Hashable]) -> TypeGuard[Sequence[str]]:
    """Whether every item is exactly a str (no subclass)."""
    return _STR.issuperset(map(type, items))


def utf8_and_lengths(items: Sequence[str]) -> tuple[bytes, np.ndarray] | None:
    """(UTF-8 bytes end to end, byte lengths) of ``items``, or None when one is not valid
    UTF-8 (a lone surrogate)."""
    try:
        blob = "".join(items).encode("utf-8")
    except UnicodeEncodeError:
        return None
    lengths = np.fromiter(map(len, items), np.int64, len(items))
    if len(blob) != int(lengths.sum()):  # not all ASCII: lengths in bytes
        lengths = np.fromiter((len(x.encode("utf-8")) for x in items), np.int64, len(items))
    return blob, lengths


class ItemTable:
    """Distinct canonical items, numbered 0, 1, 2, ... in the order they were added.

    Example:
        >>> t = ItemTable()
        >>> t.extend(["b", "a"])
        >>> t.lookup(["a", "c", "b"]).tolist()
        [1, -1, 0]
        >>> t.to_list()
        ['b', 'a']
    """

    __slots__ = (
        "_n",
        "_data",
        "_size",
        "_offsets",
        "_slots",
        "_key",
        "_loops",
        "_objects",
        "_index",
        "_addresses",
        "_all_str",
        "_fill",
        "_rows_of",
        "__weakref__",
    )

    def __init__(self, fixed: bool = False) -> None:
        self._n = 0
        # the slots' most filled share, as (numerator, denominator)
        self._fill = _FIXED_FILL if fixed else _GROWING_FILL
        self._loops = compiled.loops()
        self._data = np.zeros(0, dtype=np.uint8)
        self._size = 0  # bytes used in _data
        self._offsets = np.zeros(1, dtype=np.uint32)
        self._slots = _empty_slots(_MIN_SLOTS)
        self._key = np.frombuffer(os.urandom(16), dtype=np.uint64).copy()
        self._objects: list[Hashable] | None = None
        self._index: dict[Hashable, int] | None = None
        self._addresses: tuple[np.ndarray, int] | None = None
        self._all_str = True  # every item is a str (always so in the compact form)
        # (another table, its rows' positions here: -2 not looked up yet, -3 - n absent
        # when this table held n items)
        self._rows_of: tuple[weakref.ref[ItemTable], np.ndarray] | None = None
        if self._loops is None:
            self._objects, self._index = [], {}

    @classmethod
    def of(cls, items: Sequence[Hashable], fixed: bool = False) -> ItemTable:
        """A table of ``items`` (distinct, canonical), numbered in their order;
        ``fixed``: no item will be added (its slots may be fuller)."""
        table = cls(fixed)
        table.extend(items)
        return table

    # -- reading -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def get(self, item: Hashable, default: int | None = None) -> int | None:
        """The position of one item, or ``default`` (a dict's ``get``; for many items
        at once, :meth:`lookup`)."""
        if self._index is not None:
            return self._index.get(item, default)
        pos = int(self.lookup([item])[0])
        return default if pos < 0 else pos

    def __contains__(self, item: object) -> bool:
        return self.get(item) is not None  # type: ignore[arg-type]

    @property
    def compact(self) -> bool:
        """Whether the items are held as UTF-8 bytes (all str, and the C loops on)."""
        return self._objects is None

    @property
    def all_str(self) -> bool:
        """Whether every item is a ``str`` (in either layout)."""
        return self._all_str

    def to_list(self) -> list[Hashable]:
        """All items, in order of addition (new Python objects in the compact form)."""
        if self._objects is not None:
            return list(self._objects)
        return self.take(np.arange(self._n, dtype=np.int64))

    def take(self, positions: Sequence[int] | np.ndarray) -> list[Hashable]:
        """The items at ``positions``, as a list."""
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        if self._objects is not None:
            objects = self._objects
            return [objects[i] for i in pos.tolist()]
        return self._loops.item_strings(self._data[: self._size], self._offsets[: self._n + 1], pos)

    def lookup(self, items: Sequence[Hashable]) -> np.ndarray:
        """Each item's position (int64), or -1 for an item not in the table."""
        k = len(items)
        if self._index is not None:
            return np.fromiter(map(self._index.get, items, repeat(-1, k)), np.int64, k)
        out = np.empty(k, dtype=np.int64)
        if not isinstance(items, (list, tuple)):
            items = list(items)
        self._loops.item_lookup(
            items,
            self._key,
            self._data[: self._size],
            self._offsets[: self._n + 1],
            self._slots,
            out,
        )
        return out

    def lookup_rows(self, table: ItemTable, rows: np.ndarray) -> np.ndarray:
        """:meth:`lookup` of ``table``'s items at ``rows`` (int64), each row's item read
        and hashed once for as long as ``table`` is the one asked about.

        A run hands every step its items as rows of one run-wide table
        (:class:`TakenItems`); a mechanism's table maps them to its positions.
        Both tables only ever grow, and a stored item keeps its position, so a
        row's position here, once found, holds for good; a row found absent is
        marked with this table's size then, and looked up again once the table has
        grown. The work is that of the rows asked for, never of the whole run-wide
        table (an open domain grows at every step). The answer is exactly
        :meth:`lookup` of ``table.take(rows)``: the map is a cache (never
        pickled), keyed on the other table's identity.
        """
        rows = np.asarray(rows, dtype=np.int64)
        held = self._rows_of
        size = len(table)
        if held is None or held[0]() is not table:
            known = np.full(max(size, 16), -2, dtype=np.int64)
            self._rows_of = (weakref.ref(table), known)
        else:
            known = held[1]
            if known.size < size:
                grown = np.full(max(size, 2 * known.size), -2, dtype=np.int64)
                grown[: known.size] = known
                known = grown
                self._rows_of = (held[0], known)
        out = known[rows]
        absent = -3 - self._n  # the mark of a row absent at this size
        todo = (out == -2) | ((out < -2) & (out != absent))
        if todo.any():
            fresh = np.unique(rows[todo])
            found = self.lookup(table.take(fresh))
            known[fresh] = np.where(found < 0, absent, found)
            out = known[rows]
        out[out < 0] = -1
        return out

    def starts(self, items: Any) -> bool:
        """Whether ``items`` (a list, tuple or 1-d NumPy array) begins with every stored
        item, in order, each equal to it (aggregate mode's no-lookup path).

        Only when every stored item is a ``str``: an equal value is then that very
        item (``True == 1`` cannot slip in); False otherwise.
        """
        n = self._n
        if len(items) < n or not self._all_str:
            return False
        head = items if len(items) == n else items[:n]
        if self._objects is not None:
            if isinstance(head, np.ndarray) and head.dtype == object:
                # the very objects of items_seen (a NumPy or pandas column of them):
                # compare their addresses, without touching the objects
                theirs = object_addresses(head)
                if theirs is not None and np.array_equal(theirs, self._object_addresses()):
                    return True
            if isinstance(head, np.ndarray):
                head = head.tolist()
            # list equality: the same objects compare by identity, others by value
            return list(head) == self._objects
        if isinstance(head, np.ndarray):
            head = head.tolist()
        return bool(
            self._loops.item_prefix_equals(
                head, self._data[: self._size], self._offsets[: n + 1], n
            )
        )

    def _object_addresses(self) -> np.ndarray:
        """``id()`` of every stored object, in order, extended as items are added.
        Addresses mean nothing in another process: never pickled."""
        assert self._objects is not None
        buf, have = self._addresses or (np.empty(0, dtype=np.uintp), 0)
        n = self._n
        if buf.size < n:
            grown = np.empty(max(n, 2 * buf.size), dtype=np.uintp)
            grown[:have] = buf[:have]
            buf = grown
        if have < n:
            buf[have:n] = np.fromiter(map(id, self._objects[have:n]), np.uintp, n - have)
        self._addresses = (buf, n)
        return buf[:n]

    # -- writing -------------------------------------------------------------------
    def positions(self, items: Sequence[Hashable], absent: bool = False) -> np.ndarray:
        """The positions of ``items`` (canonical), the missing ones added in order of
        first appearance; ``absent``: none of them is stored yet (no look-up when they
        are also distinct)."""
        if absent and len(set(items)) == len(items):
            n = self._n
            self.extend(items)
            return np.arange(n, n + len(items), dtype=np.int64)
        pos = self.lookup(items)
        miss = np.flatnonzero(pos < 0)
        if miss.size:
            new: dict[Hashable, int] = {}
            n = self._n
            pos[miss] = [n + new.setdefault(items[i], len(new)) for i in miss.tolist()]
            self.extend(list(new))
        return pos

    def extend(self, items: Sequence[Hashable]) -> None:
        """Add ``items`` (distinct, canonical, none of them stored yet) at the next positions."""
        m = len(items)
        if not m:
            return
        if self._objects is None:
            encoded = utf8_and_lengths(items) if _exactly_str(items) else None
            if encoded is not None:
                self._append(*encoded)
                return
            self._to_objects()  # another type, or a lone surrogate: Python objects from now
        assert self._objects is not None and self._index is not None
        n = self._n
        self._objects.extend(items)
        self._index.update(zip(items, range(n, n + m), strict=True))
        self._n = n + m
        if self._all_str and not _STR.issuperset(map(type, items)):
            self._all_str = False

    def _append(self, blob: bytes, lengths: np.ndarray) -> None:
        n, m = self._n, lengths.size
        if n + m >= 0xFFFFFFFF:
            raise OverflowError("an item table holds fewer than 2^32 - 1 items")
        size = self._size + len(blob)
        self._data = _grown(self._data, size)
        self._data[self._size : size] = np.frombuffer(blob, dtype=np.uint8)
        if size > _NARROW_MAX_BYTES and self._offsets.dtype != np.int64:
            self._offsets = self._offsets.astype(np.int64)  # past uint32, for good
        self._offsets = _grown(self._offsets, n + m + 1)
        ends = np.cumsum(lengths, dtype=np.int64)
        ends += self._size
        self._offsets[n + 1 : n + m + 1] = ends  # each <= size: fits the offsets' type
        self._size = size
        self._n = n + m
        num, den = self._fill
        if self._n * den > self._slots.size * num:
            self._rebuild()
        else:
            self._insert(n, n + m)

    def _insert(self, first: int, last: int) -> None:
        self._loops.item_insert(
            self._key,
            self._data[: self._size],
            self._offsets[: self._n + 1],
            self._slots,
            first,
            last,
        )

    def _rebuild(self) -> None:
        """Slots for the stored items: for a fixed domain, the fewest they fill at most
        4/5 of (any number up to 2^26: uint32 slots take any count); else the smallest
        power of two they fill at most half of (doubling as the table grows)."""
        num, den = self._fill
        size = max(_MIN_SLOTS, -(-self._n * den // num))
        if self._fill != _FIXED_FILL or size > _NARROW_MAX_SLOTS:
            size = 1 << (size - 1).bit_length()
        self._slots = _empty_slots(size)
        self._insert(0, self._n)

    def _to_objects(self) -> None:
        """Switch to the plain layout (a list and a dict), for good."""
        objects = self.to_list()
        self._objects = objects
        self._index = dict(zip(objects, range(len(objects)), strict=True))
        self._data = np.zeros(0, dtype=np.uint8)
        self._size = 0
        self._offsets = np.zeros(1, dtype=np.uint32)
        self._slots = _empty_slots(_MIN_SLOTS)

    def nbytes(self) -> int:
        """Bytes of the compact arrays (0 in the plain layout, whose cost is Python's)."""
        if self._objects is not None:
            return 0
        return self._data.nbytes + self._offsets.nbytes + self._slots.nbytes

    # -- pickling: the bytes and offsets, or the objects (key and slots drawn anew) -------
    def __getstate__(self) -> dict[str, Any]:
        fixed = {"fixed": True} if self._fill == _FIXED_FILL else {}
        if self._objects is not None:
            return {"objects": list(self._objects), **fixed}
        # int64 offsets whatever the layout in memory (the format of older snapshots)
        return {
            "data": self._data[: self._size].copy(),
            "offsets": self._offsets[: self._n + 1].astype(np.int64),
            **fixed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        ItemTable.__init__(self, bool(state.get("fixed", False)))
        if "objects" in state:
            items = list(state["objects"])
        else:
            data = np.asarray(state["data"], dtype=np.uint8)
            offsets = np.asarray(state["offsets"], dtype=np.int64)
            if (
                offsets.ndim != 1
                or offsets.size < 1
                or offsets[0] != 0
                or offsets[-1] != data.size
                or np.any(np.diff(offsets) < 0)
            ):
                raise ValueError("item table: the offsets do not match the stored bytes")
            if self._objects is None:
                self._append(data.tobytes(), np.diff(offsets))
                return
            blob = data.tobytes()
            items = [
                blob[a:b].decode("utf-8")
                for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
            ]
        if self._objects is None and not _STR.issuperset(map(type, items)):
            self._to_objects()
        self.extend(items)


def domain_table(items: Sequence[Hashable]) -> ItemTable:
    """A table of a known domain's items (canonical), in their order.

    Raises ValueError when two items are equal: a duplicate is found by looking
    every item up again (it maps to its first copy's position), without the
    dict of every item that a check by set would build.
    """
    table = ItemTable.of(items, fixed=True)
    if not np.array_equal(table.lookup(items), np.arange(len(items), dtype=np.int64)):
        raise ValueError("domain items must be distinct")
    return table


def release_items(table: ItemTable, items: Sequence[Hashable]) -> Sequence[Hashable]:
    """The items of every release of a known domain (``table`` = ``domain_table(items)``):
    one object for every step (output formatters encode its text once), read-only
    (nothing done to a published release can relabel the next one). For str items a
    view of the table, in either layout (so its type does not depend on the install;
    in the compact one no str object per item outlives the caller); else a tuple."""
    return TableItems(table) if table.all_str else tuple(items)


class TableItems(Sequence):  # type: ignore[type-arg]
    """The items of a compact :class:`ItemTable` as a read-only sequence, made into
    Python objects only when read.

    A known domain's releases carry the whole domain at every step; a tuple of
    it keeps one str object per item alive (~60 bytes each) next to the
    table's bytes. This view is the same object at every step (output formatters
    encode its text once), reads an item by decoding its bytes, and gives its
    items to Arrow without any Python object (:meth:`to_arrow`).

    Equal to any other sequence (list, tuple, view) of equal items, in order.
    """

    __slots__ = ("_table", "_n")

    _CHUNK = 1 << 14  # items decoded at a time while iterating

    def __init__(self, table: ItemTable) -> None:
        self._table = table
        self._n = len(table)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.take(np.arange(self._n, dtype=np.int64)[index])
        i = operator.index(index)  # an int or a NumPy integer (a float: TypeError)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("item index out of range")
        return self._table.take(np.array([i], dtype=np.int64))[0]

    def __iter__(self) -> Any:
        for start in range(0, self._n, self._CHUNK):
            stop = min(start + self._CHUNK, self._n)
            yield from self._table.take(np.arange(start, stop, dtype=np.int64))

    def __reversed__(self) -> Any:
        for stop in range(self._n, 0, -self._CHUNK):
            start = max(stop - self._CHUNK, 0)
            yield from self._table.take(np.arange(stop - 1, start - 1, -1, dtype=np.int64))

    def __contains__(self, item: object) -> bool:
        return self._position(item) is not None

    def _position(self, item: object) -> int | None:
        try:
            pos = self._table.get(item)  # type: ignore[arg-type]
        except TypeError:  # unhashable (the plain layout's dict): in no table
            return None
        return pos if pos is not None and pos < self._n else None

    def index(self, item: Any, start: int = 0, stop: int | None = None) -> int:
        pos = self._position(item)
        begin, end, _ = slice(start, stop).indices(self._n)  # negative: from the end
        if pos is None or not begin <= pos < end:
            raise ValueError(f"{item!r} is not in the items")
        return pos

    def count(self, item: Any) -> int:
        return int(item in self)

    def take(self, positions: Sequence[int] | np.ndarray) -> list[Hashable]:
        """The items at ``positions`` (a list: one C call, not one per item)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < -self._n or pos.max() >= self._n):
            raise IndexError("item index out of range")
        return self._table.take(np.where(pos < 0, pos + self._n, pos))

    def to_arrow(self) -> Any:
        """The items as a pyarrow string array, built from the table's bytes."""
        import pyarrow as pa

        t = self._table
        if not t.compact:
            return pa.array(self._table.take(np.arange(self._n, dtype=np.int64)), pa.string())
        offsets = t._offsets[: self._n + 1]
        data = np.ascontiguousarray(t._data[: int(offsets[-1])])
        if data.size < (1 << 31) and offsets.dtype == np.uint32:  # Arrow's int32 offsets
            return pa.StringArray.from_buffers(
                self._n, pa.py_buffer(offsets.view(np.int32)), pa.py_buffer(data)
            )
        arr = pa.LargeStringArray.from_buffers(
            self._n, pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64)), pa.py_buffer(data)
        )
        return arr.cast(pa.string()) if data.size < (1 << 31) else arr

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, TableItems) and other._table is self._table:
            return other._n == self._n
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists: not hashable

    def __repr__(self) -> str:
        head = ", ".join(map(repr, self.take(np.arange(min(self._n, 5), dtype=np.int64))))
        more = ", ..." if self._n > 5 else ""
        return f"TableItems([{head}{more}], n={self._n})"


class TakenItems(Sequence):  # type: ignore[type-arg]
    """The items of an :class:`ItemTable` at some positions, as a read-only sequence made
    into Python objects only when read: a step's users handed on by their run-wide
    ids, of whom the bounder reads only those it has not met (:meth:`take`)."""

    __slots__ = ("_table", "_positions")

    def __init__(self, table: ItemTable, positions: np.ndarray) -> None:
        self._table = table
        self._positions = np.asarray(positions, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._positions.size)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._table.take(self._positions[index])
        return self._table.take(self._positions[[operator.index(index)]])[0]

    def __iter__(self) -> Any:
        return iter(self._table.take(self._positions))

    @property
    def all_str(self) -> bool:
        """Whether every item is a ``str`` (so none of another type: not read to know)."""
        return self._table.all_str

    def take(self, at: Sequence[int] | np.ndarray) -> list[Hashable]:
        """The items at the places ``at`` of this sequence (one call)."""
        return self._table.take(self._positions[np.asarray(at, dtype=np.int64)])

    def positions_in(self, index: ItemTable) -> np.ndarray:
        """Each item's position in ``index`` (int64), -1 for an item it lacks: ``index``'s
        ``lookup`` of these items, which reads each run-wide row once per run
        (:meth:`ItemTable.lookup_rows`)."""
        return index.lookup_rows(self._table, self._positions)


def take_at(seq: Sequence[Any], at: np.ndarray) -> list[Any]:
    """``seq``'s entries at the positions ``at`` (one call for a :class:`TakenItems`)."""
    if isinstance(seq, TakenItems):
        return seq.take(at)
    return [seq[j] for j in at.tolist()]
