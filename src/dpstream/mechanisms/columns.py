"""Events and prefix histograms as columns: the array-speed paths of the mechanisms.

Layer 5 of dpstream. A step's events reach a mechanism either as a list of
events (each an iterable of items) or as :class:`EventColumns` (the distinct
items of the step once, and per occurrence the index of its item: what the
command line's columnar reader produces). Both are turned here into one form,
*positions*: per item occurrence, the item's column in the mechanism's state
(or, for an item not seen before, a provisional column past the end), with
the events' offsets. Everything after that is NumPy over the whole step.

A fast path never decides anything the event-at-a-time code would decide
differently: whenever a step holds something unusual (an event that is not a
list or tuple, an item that is not a plain ``str``/``int``/``bytes``, an event
over ``max_items``, an item outside a known domain), these helpers say so and
the mechanism runs its original per-event code, which raises the same error
with the same message. The tests compare both paths on the same steps.
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from typing import Any, Protocol, TypeGuard

import numpy as np

from .. import compiled

__all__ = [
    "EventColumns",
    "as_events",
    "flatten_events",
    "positions",
    "event_positions",
    "domain_positions",
    "fast_events",
    "aggregate_items",
    "aggregate_raw",
    "domain_aggregate",
    "is_frame",
    "distinct_in_events",
    "aggregate_columns",
    "object_addresses",
    "check_grows",
]

#: Item types that are already canonical (``canonical_item`` returns them unchanged).
_PLAIN = frozenset((str, int, bytes))
#: Event types the fast path reads as they are.
_EVENT_TYPES = frozenset((list, tuple))
#: The widest event for which duplicates are found by comparing shifted copies.
_NARROW = 16
#: Events up to this wide are checked for repeated items in C (each occurrence
#: against the earlier ones of its event), wider ones by the NumPy paths.
_C_WIDTH = 64


class EventColumns:
    """The events of one step as columns.

    Occurrence i is the item ``items[codes[i]]``; event j holds occurrences
    ``offsets[j]:offsets[j + 1]``. ``items`` are distinct, canonical items
    (``str``, ``int`` or ``bytes``). Give it to ``step_batch`` instead of a
    list of events (the same release, without a Python loop over events).

    Example:
        >>> import numpy as np
        >>> cols = EventColumns(["a", "b"], np.array([0, 1, 1]), np.array([0, 2, 3]))
        >>> cols.events()
        [['a', 'b'], ['b']]
    """

    __slots__ = ("items", "codes", "offsets")

    def __init__(self, items: Sequence[Hashable], codes: np.ndarray, offsets: np.ndarray) -> None:
        codes = np.asarray(codes)
        offsets = np.asarray(offsets)
        if codes.ndim != 1 or codes.dtype.kind not in "iu":
            raise TypeError("codes must be a 1-D integer array")
        if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or offsets.size < 1:
            raise TypeError("offsets must be a 1-D integer array of n_events + 1 entries")
        if offsets[0] != 0 or offsets[-1] != codes.size or (np.diff(offsets) < 0).any():
            raise ValueError("offsets must start at 0, not decrease and end at len(codes)")
        if codes.size and (codes.min() < 0 or codes.max() >= len(items)):
            raise ValueError("codes must index items")
        self.items = items
        self.codes = codes.astype(np.int64, copy=False)
        self.offsets = offsets.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def events(self) -> list[list[Hashable]]:
        """The events as lists of items (the slow path, and for tests)."""
        flat = _take(self.items, self.codes.tolist())
        bounds = self.offsets.tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def as_events(events: Iterable[object] | EventColumns) -> Sequence[object] | EventColumns:
    """``events`` as something that can be read twice (the fast path, then maybe the
    per-event path): a list, a tuple or :class:`EventColumns` as they are."""
    if isinstance(events, (list, tuple, EventColumns)):
        return events
    return list(events)


def fast_events(events: Iterable[object] | EventColumns) -> Iterable[object]:
    """The events for the per-event path (:class:`EventColumns` as lists)."""
    return events.events() if isinstance(events, EventColumns) else events


def event_positions(
    events: Any, index: Any, n: int
) -> tuple[np.ndarray, np.ndarray, list[Hashable]] | None:
    """(per-occurrence columns, event offsets, new items) of a step's events (see
    :func:`positions`), or ``None`` when the per-event path must run."""
    if isinstance(events, EventColumns):
        items = events.items
        if not (_table_rows(items) and items.all_str) and not _PLAIN.issuperset(map(type, items)):
            return None
        ucols, new = positions(items, index, n)
        return ucols[events.codes], events.offsets, new
    flat = flatten_events(events)
    if flat is None:
        return None
    cols, new = positions(flat[0], index, n)
    return cols, flat[1], new


def domain_positions(events: Any, index: Any, max_items: int | None) -> np.ndarray | None:
    """The domain positions of a step's distinct (per event) item occurrences, or
    ``None`` when the per-event path must run (an item outside the domain, an event
    over ``max_items``, an unusual type)."""
    fast = event_positions(events, index, len(index))
    if fast is None or fast[2]:
        return None
    cols, offsets, _ = fast
    keep, distinct = distinct_in_events(cols, offsets)
    if max_items is not None and distinct.size and distinct.max() > max_items:
        return None
    return cols if keep is None else cols[keep]


def flatten_events(events: Any) -> tuple[list[Hashable], np.ndarray] | None:
    """(all items in order, event offsets) when every event is a list or tuple of
    plain ``str``/``int``/``bytes`` items; ``None`` otherwise (use the per-event path)."""
    if type(events) not in (list, tuple):  # a subclass too: read through its __iter__
        events = list(events)
    loops = compiled.loops()
    if loops is not None:  # the same answer, without a Python step per item
        offsets = np.empty(len(events) + 1, dtype=np.int64)
        flat = loops.flatten_events(events, offsets)
        return None if flat is None else (flat, offsets)
    if not _EVENT_TYPES.issuperset(map(type, events)):
        return None
    flat = list(chain.from_iterable(events))
    if not _PLAIN.issuperset(map(type, flat)):
        return None
    offsets = np.zeros(len(events) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, events), np.int64, len(events)), out=offsets[1:])
    return flat, offsets


def lookup_all(items: Sequence[Hashable], index: Any) -> np.ndarray:
    """Each item's ``index`` position (int64), -1 for an item it lacks. ``index``: a
    Mapping, or anything with a ``lookup(items)`` that answers for all at once (an
    :class:`~dpstream.mechanisms.item_table.ItemTable`)."""
    if isinstance(index, Mapping):
        return np.fromiter(map(index.get, items, repeat(-1, len(items))), np.int64, len(items))
    if _table_rows(items) and hasattr(index, "lookup_rows"):
        return items.positions_in(index)  # each run-wide row looked up once per run
    return index.lookup(items)


class _TableRows(Protocol):
    """What :class:`~dpstream.mechanisms.item_table.TakenItems` offers here (that module
    imports this one)."""

    @property
    def all_str(self) -> bool: ...

    def positions_in(self, index: Any) -> np.ndarray: ...

    def take(self, at: Sequence[int] | np.ndarray) -> list[Hashable]: ...


def _table_rows(items: Any) -> TypeGuard[_TableRows]:
    """Whether ``items`` are rows of an item table that can be looked up without being
    read (a :class:`~dpstream.mechanisms.item_table.TakenItems`)."""
    return hasattr(items, "positions_in")


def _take(items: Sequence[Hashable], at: list[int]) -> list[Hashable]:
    """``items`` at the places ``at``, in one call for table rows."""
    if _table_rows(items):
        return items.take(at)
    return [items[i] for i in at]


def positions(items: Sequence[Hashable], index: Any, n: int) -> tuple[np.ndarray, list[Hashable]]:
    """Each item's column: ``index[item]``, or ``n + k`` for the k-th new item (in
    order of first appearance). Returns (columns as int64, the new items).

    ``index``: a Mapping item -> column, or anything with a ``lookup(items)`` that
    returns the columns at once, -1 for an item it lacks (an
    :class:`~dpstream.mechanisms.item_table.ItemTable`)."""
    cols = lookup_all(items, index)
    missing = np.flatnonzero(cols < 0)
    new: dict[Hashable, int] = {}
    if missing.size:
        at = missing.tolist()
        for i, item in zip(at, _take(items, at), strict=True):
            cols[i] = n + new.setdefault(item, len(new))
    return cols, list(new)


def distinct_in_events(
    cols: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """Which occurrences are the first of their item in their event, and how many
    distinct items each event holds.

    Returns ``(keep, distinct)``: ``keep`` is a boolean mask (``None`` when every
    occurrence is kept), ``distinct`` the per-event counts.
    """
    sizes = np.diff(offsets)
    n_events = sizes.size
    if cols.size == 0 or n_events == 0:
        return None, sizes
    width = int(sizes.max())
    if width <= 1:
        return None, sizes
    loops = compiled.loops() if width <= _C_WIDTH and cols.size >= compiled.MIN_ITEMS else None
    if loops is not None:  # one pass in C, the same mask and counts
        keep = np.empty(cols.size, dtype=bool)
        distinct = np.empty(n_events, dtype=np.int64)
        cols64 = np.ascontiguousarray(cols, dtype=np.int64)
        offsets64 = np.ascontiguousarray(offsets, dtype=np.int64)
        if loops.event_duplicates(cols64, offsets64, keep, distinct) == 0:
            return None, sizes
        return keep, distinct
    event = np.repeat(np.arange(n_events), sizes)
    if width <= _NARROW:
        # an occurrence repeats an earlier one of its event at most width - 1 places back
        dup = None
        for shift in range(1, width):
            same = (cols[shift:] == cols[:-shift]) & (event[shift:] == event[:-shift])
            if same.any():
                if dup is None:
                    dup = np.zeros(cols.size, dtype=bool)
                dup[shift:] |= same
        if dup is None:
            return None, sizes
    else:
        order = np.lexsort((cols, event))  # stable: the first occurrence comes first
        ev, co = event[order], cols[order]
        dup = np.zeros(cols.size, dtype=bool)
        dup[order[1:]] = (ev[1:] == ev[:-1]) & (co[1:] == co[:-1])
    keep = ~dup
    return keep, np.bincount(event[keep], minlength=n_events)


def aggregate_columns(items: Any, counts: Any = None) -> tuple[list[Hashable], np.ndarray]:
    """Aggregate-mode input as (items, int64 counts): a Mapping, two sequences
    (items, counts), or a pandas/polars/Arrow frame with columns ``item`` and
    ``count`` (or two columns, one named ``count``: the other holds the items).

    Counts must be integers >= 0 (a float, bool or string would release
    something other than the true histogram); items are checked by the caller.
    """
    if counts is None:
        items, counts = _frame_columns(items)
    values = _count_array(counts)
    if isinstance(items, np.ndarray) and items.dtype.kind in "iu":
        keys: list[Hashable] = items.tolist()
    elif isinstance(items, np.ndarray) and items.dtype.kind in "US":
        keys = items.tolist()
    else:
        keys = items.tolist() if hasattr(items, "tolist") else list(items)
    if len(keys) != values.size:
        raise ValueError(
            f"items and counts must have the same length, got {len(keys)} and {values.size}"
        )
    return keys, values


def aggregate_raw(items: Any, counts: Any = None) -> tuple[Any, np.ndarray]:
    """Like :func:`aggregate_columns`, but the items as given (a NumPy array stays an
    array; a frame's column becomes a NumPy array or a list), not yet checked."""
    if counts is None:
        items, counts = _frame_columns(items, as_array=True)
    values = _count_array(counts)
    if hasattr(items, "to_numpy") and not isinstance(items, np.ndarray):
        items = items.to_numpy()
    if not isinstance(items, (np.ndarray, list)):
        items = list(items)
    if len(items) != values.size:
        raise ValueError(
            f"items and counts must have the same length, got {len(items)} and {values.size}"
        )
    return items, values


#: The largest true count a mechanism takes: 2^53, below which every integer is a
#: float64. The noise is added to the count as a float64; above 2^53 neighbouring
#: counts round to values 2 or more apart whatever the noise, so the release would
#: tell them apart with certainty (no count of real events gets near it).
MAX_COUNT = 1 << 53


def too_large(name: str) -> ValueError:
    """The refusal of a count above :data:`MAX_COUNT`."""
    return ValueError(
        f"{name} must be at most 2^53 ({MAX_COUNT}): above it a float64 cannot hold every "
        "count, and the noise would not hide a change of one event"
    )


def not_integers(name: str, arr: np.ndarray) -> TypeError:
    """The error for counts of a dtype other than integers: a missing value named where
    it is (a nullable Int64 column's NA comes as a NaN, and "got dtype float64" named
    nothing the caller gave)."""
    if arr.dtype.kind == "f" and arr.ndim == 1 and np.isnan(arr).any():
        at = int(np.isnan(arr).argmax())
        return TypeError(f"{name} hold a missing value (NaN or NA) at position {at}")
    return TypeError(f"{name} must hold integers, got dtype {arr.dtype}")


def check_count_range(name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` (int64 counts already >= 0) if none is above :data:`MAX_COUNT`."""
    if arr.size and int(arr.max()) > MAX_COUNT:
        raise too_large(name)
    return arr


def _count_array(counts: Any) -> np.ndarray:
    if hasattr(counts, "to_numpy") and not isinstance(counts, np.ndarray):
        counts = counts.to_numpy()
    arr = np.asarray(counts)
    if arr.dtype == object:
        for value in arr.tolist():
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"counts must be integers, got {value!r}")
        arr = np.array(arr.tolist(), dtype=np.int64) if arr.size else np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise not_integers("counts", arr)
    if arr.ndim != 1:
        raise ValueError(f"counts must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("counts must fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError("counts must be >= 0")
    return check_count_range("counts", arr)


def _frame_columns(frame: Any, as_array: bool = False) -> tuple[Any, Any]:
    """(items, counts) of a pandas/polars DataFrame or an Arrow table."""
    names = None
    if hasattr(frame, "column_names"):  # pyarrow.Table
        names = list(frame.column_names)
    elif hasattr(frame, "columns"):  # pandas or polars
        names = [str(c) for c in frame.columns]
    if names is None:
        raise TypeError(
            "counts must be a Mapping item -> count, arrays (items, counts) or a "
            f"data frame with columns item and count, got {type(frame).__name__}"
        )
    if "item" in names and "count" in names:
        item_col, count_col = "item", "count"
    elif len(names) == 2 and names.count("count") == 1:  # value_counts().reset_index()
        item_col, count_col = [n for n in names if n != "count"][0], "count"
    else:
        # two columns of other names are not read by position: with integer items, a
        # (count, item) frame would be read silently with the counts as items
        raise ValueError(
            f"a frame of counts needs columns 'item' and 'count' (or two columns, one of "
            f"them 'count'), got {names}"
        )
    if hasattr(frame, "column_names"):
        return frame.column(item_col).to_pylist(), frame.column(count_col).to_numpy()
    items, counts = frame[item_col], frame[count_col]
    pandas = type(items).__module__.split(".")[0] == "pandas"
    if as_array and pandas and items.dtype == object:  # no copy: the items' very objects
        items = items.to_numpy()
    elif hasattr(items, "to_list"):  # polars (and pandas for a list)
        items = items.to_list()
    return items, counts


def object_addresses(arr: np.ndarray) -> np.ndarray | None:
    """The object addresses (``id``) held by a 1-D C-contiguous object array, as a
    uintp view of its buffer (no object is touched), or None for any other array.

    A copy (a view of the buffer would not keep ``arr`` alive). Two such arrays
    are equal exactly when they hold the very same objects in the same order.
    """
    if arr.dtype != object or arr.ndim != 1 or not arr.flags.c_contiguous:
        return None
    n = int(arr.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.uintp)
    words = (ctypes.c_size_t * n).from_address(arr.ctypes.data)
    return np.ctypeslib.as_array(words).view(np.uintp).copy()


def check_grows(counts: np.ndarray, previous: np.ndarray) -> None:
    """ValueError unless every count is at least its previous value (aggregate mode's
    prefix histogram only grows)."""
    if np.less(counts, previous).any():
        raise ValueError("counts must not decrease: a prefix histogram only grows")


def is_frame(obj: Any) -> bool:
    """Whether ``obj`` is a pandas/polars DataFrame or an Arrow table (not a Mapping,
    not an array)."""
    return not isinstance(obj, (Mapping, np.ndarray, list, tuple)) and (
        hasattr(obj, "column_names") or (hasattr(obj, "columns") and hasattr(obj, "shape"))
    )


def aggregate_items(items: Any, counts: Any) -> tuple[list[Hashable], np.ndarray]:
    """Aggregate-mode (items, counts) as canonical items and int64 counts; items
    must be distinct. ``counts`` None: ``items`` is a frame."""
    from ..noise import canonical_item

    keys, values = aggregate_columns(items, counts)
    if not _PLAIN.issuperset(map(type, keys)):
        try:
            keys = [canonical_item(k) for k in keys]
        except TypeError as exc:
            raise TypeError(f"counts: {exc}") from None
    return keys, values


def domain_aggregate(items: Any, counts: Any, index: Any, previous: np.ndarray) -> np.ndarray:
    """Aggregate-mode counts given as (items, counts) or a frame, over a known domain:
    an int64 array aligned with the domain (missing items count 0)."""
    from ..errors import InvalidEventError

    keys, values = aggregate_items(items, counts)
    n = previous.size
    pos = lookup_all(keys, index)
    if pos.size and pos.min() < 0:
        raise InvalidEventError(f"item {keys[int(np.argmax(pos < 0))]!r} is not in the domain")
    arr = np.zeros(n, dtype=np.int64)
    arr[pos] = values
    if pos.size and np.count_nonzero(np.bincount(pos, minlength=n) > 1):
        raise ValueError("items must be distinct (one count per item)")
    check_grows(arr, previous)
    return arr
