"""Writing releases as text: what every output format shares.

Layer 6 of dpstream (an edge). The formats (:mod:`dpstream.io.jsonl_out`,
:mod:`dpstream.io.csv_out`, :mod:`dpstream.io.parquet_out`):

JSON Lines (default): one line per time step,
``{"t": 3, "released": {"aspirin": 12.7, "ibuprofen": 3.2}}``, the items in
the mechanism's order, plus ``"meta": {...}`` when the mechanism reports extras
(for instance the threshold of the unknown-domain mechanism). Counts are
written with the shortest decimal that reads back as the same float64, so
the file holds exactly the library's values.

The long ("tidy") formats have one row per released item per step, with the
columns ``t, item, value, noise_std`` (the standard deviation of a count at
that step: a 95% interval is value +- 1.96 noise_std), and with a public clock
(``--start``/``--step``) ``step_start, step_end``: the step's window
[step_start, step_end), ISO-8601 in the clock's offset; a step that releases no
item is one row with an empty item and value, so every step is there. They
load into pandas and polars with their default readers: CSV
(``--output-format csv``, with a header), JSON Lines rows (``jsonl-long``)
and Parquet (``parquet``, needs pyarrow). The run's public metadata (the
guarantee, the threshold, the base) is in the sidecar ``OUTPUT.meta.json``.

Counts are written rounded to the nearest integer unless ``--no-round`` is
given. Released values are true counts plus continuous (floating-point)
Gaussian noise, and the low-order bits of such floats reveal more about the
true count than the noise scale suggests (Mironov, CCS 2012): the noise takes
values on a known grid, so a count that used a single tree cell can often be
recovered exactly from the float. Rounding is post-processing and costs no
privacy; ``--no-round`` (exact floats, bit for bit the library's values) is
for testing and research, not for publication.

A text :class:`Formatter` builds a large release's bytes with Arrow's string
kernels or the C row joiner, and a small one row by row; both give the same
bytes (the row path is the reference).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import compiled
from ..mechanisms.base import Release
from ..mechanisms.item_table import utf8_and_lengths

__all__ = [
    "Formatter",
    "LongFormatter",
    "ItemText",
    "LONG_COLUMNS",
    "STEP_START",
    "STEP_END",
    "JSON_SPECIAL",
    "JSON_SPECIAL_BYTES",
    "CSV_SPECIAL",
    "long_rows",
    "clock_columns",
    "clock_values",
    "release_values",
    "value_text",
    "meta_text",
    "json_key",
    "json_default",
    "join_text",
    "RowPieces",
    "int_rows",
    "plain_int_rows",
]


def json_default(value: object) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def release_values(release: Release, round_counts: bool) -> list[float] | list[int]:
    values = np.asarray(release.values, dtype=np.float64)
    if round_counts:
        return np.rint(values).astype(np.int64).tolist()
    return values.tolist()


class ItemText:
    """The items of a release as an Arrow string array of their encoded text (JSON
    or CSV), kept while the release's items are the same list: a known domain is
    encoded once, not at every step.

    ``plain``: a regular expression of the characters that need ``encode``; when
    no item (all ``str``) holds one, the text is ``quote + item + quote``, built by
    Arrow without a Python call per item.
    """

    def __init__(self, encode: Any, plain: str | None = None, quote: str = "") -> None:
        self._encode = encode
        self._plain = plain
        self._quote = quote
        self._items: Any = None
        self._len = -1
        self._text: Any = None
        self._raw: tuple[Any, np.ndarray] | None = None

    def holds(self, items: Sequence[Any]) -> bool:
        """Whether the text of ``items`` is at hand (the same list as last time)."""
        return items is self._items and len(items) == self._len

    def __call__(self, items: Sequence[Any]) -> Any:
        if not self.holds(items):
            self._text = self._build(items)
            self._items, self._len = items, len(items)
            self._raw = None
        return self._text

    def raw(self, items: Sequence[Any]) -> tuple[Any, np.ndarray]:
        """The items' text as (UTF-8 bytes, offsets: int64, or uint32 for Arrow's int32
        ones, which are never negative), for the C row joiner."""
        text = self(items)
        if self._raw is None:
            import pyarrow as pa

            wide = pa.types.is_large_string(text.type)
            _, offsets, data = text.buffers()
            off = np.frombuffer(
                offsets,
                dtype=np.int64 if wide else np.int32,
                count=len(text) + 1,
                offset=text.offset * (8 if wide else 4),
            )
            self._raw = (b"" if data is None else data, off if wide else off.view(np.uint32))
        return self._raw

    def _build(self, items: Sequence[Any]) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        as_arrow = getattr(items, "to_arrow", None)  # a known domain's view: its bytes
        if as_arrow is not None and self._encode is str:
            return as_arrow()
        if self._plain is not None and (as_arrow is not None or all(type(x) is str for x in items)):
            try:
                arr = as_arrow() if as_arrow is not None else pa.array(items, pa.string())
            except (pa.ArrowException, UnicodeEncodeError):
                arr = None  # a lone surrogate: the slow path decides
            if arr is not None and not pc.any(pc.match_substring_regex(arr, self._plain)).as_py():
                if not self._quote:
                    return arr
                q = pa.scalar(self._quote, pa.string())
                return pc.binary_join_element_wise(q, arr, q, "")
        return pa.array([self._encode(x) for x in items], pa.string())


def value_text(release: Release, round_counts: bool) -> Any:
    """The values as an Arrow string array, written as the slow path writes them:
    integers in decimal, floats as ``repr`` (the shortest text that reads back the
    same float64); None when a value is not finite (the slow path decides)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = np.asarray(release.values, dtype=np.float64)
    if not np.isfinite(values).all():
        return None
    if round_counts:
        return pc.cast(pa.array(np.rint(values).astype(np.int64)), pa.string())
    return pa.array(list(map(repr, values.tolist())), pa.string())


def join_text(pieces: Any, sep: str) -> str:
    """The strings of an Arrow array joined by ``sep``, in C++."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(pieces) == 0:
        return ""
    one = pa.ListArray.from_arrays(pa.array([0, len(pieces)], pa.int32()), pieces)
    return pc.binary_join(one, sep)[0].as_py()


class RowPieces(NamedTuple):
    """The constant bytes of a release's rows for the C row writer: each row is ``head +
    item text + mid + rounded value + tail``, the rows joined by ``sep``, the whole
    between ``first`` and ``last`` (a release's own start and end, written in place so
    that the rows are not copied again to frame them)."""

    head: bytes
    mid: bytes
    tail: bytes
    sep: bytes
    first: bytes = b""
    last: bytes = b""


def int_rows(text: ItemText, release: Release, pieces: RowPieces) -> bytes | None:
    """A release's rows (:class:`RowPieces`) in one C pass, the items' text from
    ``text`` (encoded once for a known domain); None without the C loops or when a
    value is not finite (the callers' other paths decide). The same bytes as Arrow's
    kernels: integers in decimal."""
    return _join_int_rows(release.values, lambda: text.raw(release.items), pieces)


def plain_int_rows(
    items: Sequence[Any], values: np.ndarray, special: Any, pieces: RowPieces
) -> bytes | None:
    """:func:`int_rows` for fresh ``str`` items that need no escaping (``special``, a
    compiled bytes pattern, finds none in their UTF-8), their text being the items
    themselves: one encode and one C pass, no Arrow array. None otherwise."""

    def text() -> tuple[bytes, np.ndarray] | None:
        if not _STR_ONLY.issuperset(map(type, items)):
            return None
        encoded = utf8_and_lengths(items)  # None for a lone surrogate: json.dumps decides
        if encoded is None or special.search(encoded[0]):
            return None
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(encoded[1], out=offsets[1:])
        return encoded[0], offsets

    return _join_int_rows(values, text, pieces)


def _join_int_rows(values: Any, text: Any, pieces: RowPieces) -> bytes | None:
    """The C joiner over ``text()`` (the items' UTF-8 and offsets, or None) and the
    rounded values, with ``pieces``; None without the C loops, for a value that is not
    finite, or when ``text()`` gives none."""
    loops = compiled.loops()
    values = np.asarray(values, dtype=np.float64)
    if loops is None or not np.isfinite(values).all():
        return None
    got = text()
    if got is None:
        return None
    return loops.join_rows(got[0], got[1], np.rint(values).astype(np.int64), *pieces)


_STR_ONLY = frozenset((str,))


def meta_text(release: Release) -> str:
    """``, "meta": {...}`` of a release with meta (as ``json.dumps`` of the whole
    release writes it), else empty."""
    if not release.meta:
        return ""
    return ', "meta": ' + json.dumps(
        dict(release.meta), ensure_ascii=False, allow_nan=False, default=json_default
    )


#: Characters that make an item's JSON text more than the item in quotes
#: (``json.dumps(..., ensure_ascii=False)`` escapes these and only these).
JSON_SPECIAL = '[\\x00-\\x1f"\\\\]'
JSON_SPECIAL_BYTES = re.compile(JSON_SPECIAL.encode())
#: Characters that make the csv module quote a field.
CSV_SPECIAL = '[,"\\r\\n]'


def json_key(item: Any) -> str:
    return json.dumps(str(item), ensure_ascii=False)


class Formatter:
    """A release formatter: Arrow's string kernels for a large release, rows otherwise
    (both give the same bytes; the row path is the reference).

    Arrow's kernels pay ~100 us of calls per release and then beat ``json.dumps``
    per item when the items' text is already encoded (a known domain, the same
    items at every step: from 64 items on), or past a few thousand fresh items
    (an open domain's release, whose items are new objects at every step).
    """

    _text: ItemText | None = None  # the items' text, where the formatter keeps one
    _last_items: Any = None  # the items of the release before

    #: Whether one row costs a json.dumps or a csv writer call on the row path (the
    #: long formats): then the C joiner of rounded counts is faster for fresh items too
    #: (measured at 64 items: 1.3x for CSV, 2.6x for jsonl-long; the wide JSONL's one
    #: json.dumps of a dict wins up to ~2,000 items).
    _rows_per_item = False

    def _columnar(self, release: Release) -> bool:
        n = len(release.values)
        repeated, self._last_items = release.items is self._last_items, release.items
        if n >= _COLUMNAR_FRESH_MIN:
            return True
        if (
            n >= _COLUMNAR_MIN
            and self._rows_per_item
            and getattr(self, "round_counts", False)
            and compiled.loops() is not None
        ):
            return True
        # the same items as the step before (a known domain's one tuple): encode them
        # once, for this step and the next ones
        return (
            n >= _COLUMNAR_MIN
            and self._text is not None
            and (repeated or self._text.holds(release.items))
        )

    def format(self, release: Release) -> bytes:
        if self._columnar(release):
            try:
                fast = self._format_columns(release)
            except Exception:  # noqa: BLE001 - the slow path raises what it raises
                fast = None
            if fast is not None:
                return fast
        return self._format_rows(release)

    def _format_columns(self, release: Release) -> bytes | None:  # pragma: no cover
        raise NotImplementedError

    def _format_rows(self, release: Release) -> bytes:  # pragma: no cover
        raise NotImplementedError


#: The columns of every long ("tidy") output: one row per released item per step.
LONG_COLUMNS = ("t", "item", "value", "noise_std")
#: The columns a run with a public clock (--start/--step) adds: when each step begins
#: and when it ends (the step covers [step_start, step_end)).
STEP_START = "step_start"
STEP_END = "step_end"

#: Releases of at least this many items are formatted by Arrow's string kernels when
#: their items' text is cached (the same items as the step before) ...
_COLUMNAR_MIN = 64
#: ... and from this many items on in any case (measured: at 3,000 fresh items
#: json.dumps takes 0.7 ms and the kernels 0.9 ms; at 10,000, 5.3 and 2.4 ms).
_COLUMNAR_FRESH_MIN = 4096


def clock_columns(
    step_start: Callable[[int], str] | None, step_end: Callable[[int], str] | None
) -> tuple[str, ...]:
    """The names of the clock's columns a long output has (those given, in this order)."""
    return tuple(n for n, f in ((STEP_START, step_start), (STEP_END, step_end)) if f is not None)


def clock_values(
    t: int, step_start: Callable[[int], str] | None, step_end: Callable[[int], str] | None
) -> tuple[str, ...]:
    """Step t's values of the :func:`clock_columns` (when it begins and ends, as given)."""
    return tuple(f(t) for f in (step_start, step_end) if f is not None)


class LongFormatter(Formatter):
    """A long format: the :data:`LONG_COLUMNS` of a row per released item per step, and
    with a public clock the :func:`clock_columns` (ISO-8601 text of the step's bounds).
    A subclass gives the text of its items (:meth:`_new_cells`)."""

    _rows_per_item = True
    _cells: ItemText  # the items' text in the format (a cell or a JSON string)

    def __init__(
        self,
        round_counts: bool = False,
        step_start: Callable[[int], str] | None = None,
        step_end: Callable[[int], str] | None = None,
    ) -> None:
        self.round_counts = round_counts
        self.step_start, self.step_end = step_start, step_end
        self._clock = clock_columns(step_start, step_end)
        self._cells = self._text = self._new_cells()

    def _new_cells(self) -> ItemText:  # pragma: no cover
        raise NotImplementedError


def long_rows(
    release: Release,
    round_counts: bool,
    step_start: Callable[[int], str] | None = None,
    step_end: Callable[[int], str] | None = None,
) -> list[tuple[Any, ...]]:
    """The rows of one release in the long format; an empty step is one row with no item.

    ``noise_std`` comes from the release's meta (the run adds it: the standard
    deviation of a count at that step, public); ``None`` when absent. With
    ``step_start`` and ``step_end`` (a run's public clock), each row ends with
    ``step_start(t)`` and ``step_end(t)`` (those given: :func:`clock_columns`).
    """
    t = int(release.t)
    std = release.meta.get("noise_std") if release.meta else None
    values = release_values(release, round_counts)
    extra = clock_values(t, step_start, step_end)
    if not values:
        return [(t, None, None, std, *extra)]
    return [
        (t, str(item), value, std, *extra)
        for item, value in zip(release.items, values, strict=True)
    ]
