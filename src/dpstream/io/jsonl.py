"""JSON Lines input: one parser, read in chunks, with a record-at-a-time fallback.

Layer 6 of dpstream (an edge). ``--input-format jsonl`` (the default), one
event per line:

* ``{"items": ["aspirin", "ibuprofen"]}``, optionally with ``"t": 3``, the time
  step the event belongs to (many events may share a step; other keys are
  ignored), or
* ``["aspirin", "ibuprofen"]``, a plain JSON array.

Blank lines are ignored. JSON nested too deeply or with an integer of more
than 4,300 digits is an invalid record. The rules every format shares (items,
UTF-8, user ids) are :mod:`dpstream.io.records`'s.

One line is parsed by :func:`parse_jsonl_line`, which decides every record and
words every message. :func:`read_jsonl` applies it line by line (``--follow``,
timestamps, ``--implicit-time``, user ids); :func:`read_jsonl_chunks` reads the
input in chunks of lines into :class:`~dpstream.io.chunks.Chunk` columns and
gives the same records, steps and messages (the tests compare the two record
by record).

How a chunk is parsed
---------------------
The fast way is one call of Arrow's JSON reader (pyarrow, when installed) over
the chunk (:func:`dpstream.io.arrow.arrow_rows`), with the schema ``t: int64,
items: list<string>`` (other fields are parsed and ignored; any other type is
an error). Arrow's parser and Python's ``json.loads`` agree on every line that
passes these checks, which the chunk must pass as a whole, else it is parsed
line by line:

* every byte is printable or a line feed (no tab, no carriage return, no other
  control character: ``json.loads`` and Arrow disagree on some of them), and
  the chunk holds no ``\\u`` escape (a lone surrogate escape is an invalid
  record here) and no byte-order mark;
* the text is valid UTF-8;
* the lines given to Arrow each start with ``{`` and end with ``}`` and are at
  most :data:`FAST_LINE_BYTES` long (so no integer has 4,300 digits and no
  nesting is deep enough for ``json.loads`` to give up); a string cannot hold a
  raw line feed, so each such line is exactly one object, and the reader must
  return one row per line;
* Arrow refuses duplicate keys ``t`` or ``items``, numbers like ``01`` or
  ``1e2`` as integers, and values of another type.

Lines that are not given to Arrow (blank lines, plain arrays, long lines), and
rows whose ``items`` is missing or holds a null, or whose ``t`` is below 1, are
parsed one at a time by :func:`parse_jsonl_line` (orjson when installed,
``json.loads`` otherwise, with ``json.loads`` deciding every line orjson
refuses), which gives the exact record and message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import numpy as np

from ..clock import StepClock
from .arrow import arrow_ints, arrow_rows
from .chunks import INT64_MAX, Chunk, chunks_from_records, concat_ranges
from .lines import BOM, LineBlock, line_blocks, line_texts
from .records import (
    MAX_LINE_BYTES,
    OVERLONG_HEAD,
    OverlongLine,
    RawEvent,
    overlong_message,
    parse_items,
    parse_t,
    parse_user,
    raw_bytes,
    shorten,
    timestamp_step,
    valid_text,
)

__all__ = [
    "NOT_UTF8",
    "parse_jsonl_line",
    "read_jsonl",
    "read_jsonl_chunks",
    "jsonl_chunk",
    "arrow_chunk",
    "FAST_LINE_BYTES",
]

#: The longest line (in bytes) the Arrow reader is given; longer lines are parsed
#: one at a time (where ``json.loads`` decides about deep nesting and huge integers).
FAST_LINE_BYTES = 1000


_fast_loads: Callable[[str], Any] | None
try:  # a faster parser for the lines it agrees on (json.loads decides the others)
    from orjson import JSONDecodeError as _FastError
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = None

#: Lines longer than this, or with more brackets, go to ``json.loads`` directly
#: (orjson reads integers of any length as floats and nests deeper than json.loads).
_FAST_MAX_CHARS = 4000
_FAST_MAX_BRACKETS = 200


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)``, or why the line is not valid JSON."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})"
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except ValueError as exc:  # an integer of more than 4,300 digits
        why = "an integer has too many digits" if "digits" in str(exc) else str(exc)
        return None, f"not valid JSON ({shorten(why, 80)})"


#: The invalid record of a line (or a Parquet row) whose bytes are not UTF-8.
NOT_UTF8 = "the line is not valid UTF-8"


def parse_jsonl_line(
    line: str,
    lineno: int,
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> RawEvent | None:
    """One JSON Lines record (see :func:`read_jsonl`), or None for a blank line that is
    no record (a blank line is a record of its own step with ``implicit``)."""
    if isinstance(line, OverlongLine):  # too long to read: its first bytes for the digest
        head = raw_bytes(line)[:OVERLONG_HEAD]
        return RawEvent(lineno, None, None, overlong_message(line.length), raw=head)
    raw = raw_bytes(line.rstrip("\r\n"))
    if len(raw) > MAX_LINE_BYTES:  # (every reader of lines, Spark's too: the same record)
        return RawEvent(lineno, None, None, overlong_message(len(raw)), raw=raw[:OVERLONG_HEAD])
    text = line.strip()
    if not text:
        if implicit:
            return RawEvent(lineno, None, None, "a blank line (an empty event is [])", raw=raw)
        return None
    if not valid_text(text):
        return RawEvent(lineno, None, None, NOT_UTF8, raw=raw)
    if (
        _fast_loads is not None
        and len(text) <= _FAST_MAX_CHARS
        and text.count("[") + text.count("{") <= _FAST_MAX_BRACKETS
    ):
        try:
            rec = _record(
                _fast_loads(text), text, lineno, time_field, clock, implicit, user_field, raw
            )
        except _FastError:
            rec = None
        if rec is not None and rec.error is None:
            return rec
        # orjson refused the line, or the record is invalid: json.loads decides (and
        # words the message), so that both parsers give the same records
    obj, err = _loads(text)
    if err is not None:
        return RawEvent(lineno, None, None, err, raw=raw)
    return _record(obj, text, lineno, time_field, clock, implicit, user_field, raw)


def _record(
    obj: Any,
    text: str,
    lineno: int,
    time_field: str | None,
    clock: StepClock | None,
    implicit: bool,
    user_field: str | None,
    raw: bytes,
) -> RawEvent:
    """The record of one parsed line (a JSON array or an object), or why it is none."""
    if isinstance(obj, list):
        return _array_record(obj, lineno, time_field, clock, implicit, user_field, raw)
    if isinstance(obj, dict):
        return _object_record(obj, text, lineno, time_field, clock, implicit, user_field, raw)
    return RawEvent(
        lineno,
        None,
        None,
        f'an event must be a JSON array or an object with "items", got {text[:40]!r}',
        raw=raw,
    )


def _array_record(
    obj: list,
    lineno: int,
    time_field: str | None,
    clock: StepClock | None,
    implicit: bool,
    user_field: str | None,
    raw: bytes,
) -> RawEvent:
    """A plain array of items: an event only with ``implicit`` time and no user ids."""
    if not implicit:
        where = (
            f'a "{time_field}" timestamp'
            if clock is not None
            else 'a time step "t" (or --implicit-time: each line is a step)'
        )
        return RawEvent(
            lineno,
            None,
            None,
            f'an event needs {where}: write it as an {{"items": [...], ...}} object',
            raw=raw,
        )
    if user_field is not None:
        return RawEvent(
            lineno,
            None,
            None,
            f'an event needs a "{user_field}" user id (--user-field): write it as an object',
            raw=raw,
        )
    items, err = parse_items(obj)
    return RawEvent(lineno, None, items, err, raw=raw)


def _object_record(
    obj: dict,
    text: str,
    lineno: int,
    time_field: str | None,
    clock: StepClock | None,
    implicit: bool,
    user_field: str | None,
    raw: bytes,
) -> RawEvent:
    """An event object: its step (from the time mode), user id and items."""
    t: int | None = None
    if implicit:
        err = 'a line gives "t", but --implicit-time makes each line a step' if "t" in obj else None
    elif clock is not None:
        if time_field not in obj:
            return RawEvent(
                lineno,
                None,
                None,
                f'an event needs a "{time_field}" timestamp (--time-field)',
                raw=raw,
            )
        when = obj[time_field]
        if type(when) is float and time_field is not None:
            when = _written_number(text, time_field, when)
        t, err = timestamp_step(when, clock, "its timestamp")
    elif "t" not in obj:
        return RawEvent(
            lineno,
            None,
            None,
            'an event needs a time step "t" (or --implicit-time: each line is a step)',
            raw=raw,
        )
    else:
        t, err = parse_t(obj.get("t"))
    if err is None and "items" not in obj:
        err = 'an event object needs an "items" array'
    user = None
    if err is None and user_field is not None:
        user, err = parse_user(obj, user_field)
    items = None
    if err is None:
        items, err = parse_items(obj["items"])
    ok = err is None
    return RawEvent(lineno, t, items if ok else None, err, user if ok else None, raw=raw)


def _written_number(text: str, field: str, value: float) -> float | Decimal:
    """The number ``field`` of the line's object as written (a ``Decimal``), for epoch
    seconds: a JSON parser reads it as the nearest double, which may be past a step
    boundary its digits are before (``1772409599.99999999`` reads as ``1772409600.0``)."""
    if not math.isfinite(value):
        return value  # 1e400: refused as infinite, as the parsers read it
    try:
        obj = json.loads(text, parse_float=Decimal)
    except (ValueError, RecursionError):
        return value
    written = obj.get(field) if isinstance(obj, dict) else None
    return written if isinstance(written, Decimal) else value


def read_jsonl(
    lines: Iterable[str],
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> Iterator[RawEvent]:
    """Parse JSON Lines events (see the module docstring).

    Steps come from the public time mode, never from the data: an event's
    ``"t"`` (the default), the timestamp in ``time_field`` on ``clock``, or,
    with ``implicit``, the line itself: then *every* line is a step, blank or
    broken ones too (a broken or blank line is an invalid record of its own
    step), so what a line holds never changes which step the next line is.
    Without ``implicit`` blank lines are skipped, an event without its time
    is an invalid record of no step, and an event whose time is readable but
    whose items are not keeps its step (an invalid record of that step).
    With ``user_field``, every event is an object with a non-empty string user
    id in that field; an event without one is an invalid record (of its step).
    """
    if (time_field is None) != (clock is None):
        raise ValueError("time_field and clock go together")
    if implicit and clock is not None:
        raise ValueError("implicit time and a clock do not go together")
    for lineno, line in enumerate(lines, 1):
        rec = parse_jsonl_line(
            line,
            lineno,
            time_field=time_field,
            clock=clock,
            implicit=implicit,
            user_field=user_field,
        )
        if rec is not None:
            yield rec


def read_jsonl_chunks(
    stream: Any,
    name: str = "input",
    *,
    chunk_bytes: int = 1 << 20,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> Iterator[Chunk]:
    """The records of a JSON Lines text stream, a chunk at a time.

    With integer steps ``"t"`` (no ``clock``, not ``implicit``), with or without
    user ids, the chunks are parsed as the module docstring says: a stream over
    bytes (a file, a ``.gz``, stdin) is read as bytes, as much as is there at each
    read; other text streams a chunk of lines at a time. In the other time modes
    (and for a user field named ``t`` or ``items``) the records of
    :func:`read_jsonl` are gathered into chunks.
    """
    if clock is not None or implicit or user_field in ("", "t", "items"):
        records = read_jsonl(
            line_texts(stream, name, chunk_bytes),
            time_field=time_field,
            clock=clock,
            implicit=implicit,
            user_field=user_field,
        )
        yield from chunks_from_records(records)
        return
    for block in line_blocks(stream, name, chunk_bytes):
        yield jsonl_chunk(block, user_field)


def jsonl_chunk(block: LineBlock, user_field: str | None = None) -> Chunk:
    """The records of a block of lines: the lines that pass the screen of the module
    docstring go to Arrow, the others to :func:`parse_jsonl_line`."""
    fast = _screen(block)
    if block.overlong:  # (its first bytes only: the per-line parser words it)
        fast[list(block.overlong)] = False
    rows = arrow_rows(block.buf, block.starts, block.ends, fast, user_field) if fast.any() else None
    if rows is None:
        fast[:] = False
    return _chunk(block, fast, rows, user_field)


def arrow_chunk(block: LineBlock) -> Chunk | None:
    """The records of a block of lines (integer steps, no user ids) when every line
    passes the screen and Arrow's reader takes them all, as :func:`jsonl_chunk` gives
    them; None when a line would be parsed alone (the caller then has a faster way for
    such lines than the chunk's fallback, which parses each of them in full)."""
    fast = _screen(block)
    if not fast.all():
        return None
    rows = arrow_rows(block.buf, block.starts, block.ends, fast) if fast.size else None
    if rows is None:
        return None
    return _chunk(block, fast, rows, None)


def _screen(block: LineBlock) -> np.ndarray:
    """Which lines of the block go to Arrow (the screen of the module docstring)."""
    buf, starts, ends = block.buf, block.starts, block.ends
    n = starts.size
    arr = np.frombuffer(buf, np.uint8)
    fast = np.zeros(n, dtype=bool)
    if (
        block.strict
        and b"\\u" not in buf
        and BOM not in buf
        and b"\r" not in buf
        and np.count_nonzero(arr < 32) == np.count_nonzero(arr == 10)
    ):
        nonempty = ends > starts
        lengths = ends - starts
        first = np.zeros(n, dtype=np.uint8)
        last = np.zeros(n, dtype=np.uint8)
        first[nonempty] = arr[starts[nonempty]]
        last[nonempty] = arr[ends[nonempty] - 1]
        fast = nonempty & (first == ord("{")) & (last == ord("}")) & (lengths <= FAST_LINE_BYTES)
    return fast


def _chunk(block: LineBlock, fast: np.ndarray, rows: Any, user_field: str | None) -> Chunk:
    n = block.starts.size
    chunk = _assemble(
        block.text, n, block.done, block.buf, block.starts, block.ends, fast, rows, user_field
    )
    chunk.nlines = n
    return chunk


def _assemble(
    text: Any,
    n: int,
    done: int,
    buf: bytes,
    starts: np.ndarray,
    ends: np.ndarray,
    fast: np.ndarray,
    rows: Any,
    user_field: str | None = None,
) -> Chunk:
    """The chunk's records: Arrow's rows where usable, the per-line parser elsewhere."""
    rec_t = np.zeros(n, dtype=np.int64)
    is_rec = np.zeros(n, dtype=bool)
    sizes = np.zeros(n, dtype=np.int64)
    slow = ~fast
    arrow_codes: np.ndarray | None = None
    arrow_items: list[Any] = []
    user_codes = np.full(n, -1, dtype=np.int64) if user_field is not None else None
    user_ids: list[Any] = []
    if rows is not None:
        arrow_codes, arrow_items = _take_arrow_rows(rows, fast, slow, is_rec, rec_t, sizes)
        if user_codes is not None:
            user_ids = _take_arrow_users(rows, fast, user_codes)
    rec_t, errors_by_line, slow_items, slow_users = _parse_slow_lines(
        text, done, slow, is_rec, rec_t, sizes, user_field
    )
    if user_codes is not None and slow_users:
        table = {u: k for k, u in enumerate(user_ids)}
        for i, u in slow_users.items():
            user_codes[i] = table.setdefault(u, len(table))
        user_ids = list(table)
    idx = np.flatnonzero(is_rec)
    items, codes = _merge_codes(arrow_items, arrow_codes, slow_items, sizes, is_rec & fast & ~slow)
    rec_sizes = sizes[idx]
    offsets = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(rec_sizes, out=offsets[1:])
    where = {int(i): k for k, i in enumerate(idx.tolist())} if errors_by_line else {}
    return Chunk(
        lines=idx + (done + 1),
        t=rec_t[idx],
        errors={where[i]: msg for i, msg in errors_by_line.items()},
        offsets=offsets,
        codes=codes,
        items=items,
        buf=buf,
        starts=starts[idx],
        ends=ends[idx],
        user_ids=user_ids if user_codes is not None else None,
        user_codes=user_codes[idx] if user_codes is not None else None,
    )


def _take_arrow_users(rows: Any, fast: np.ndarray, user_codes: np.ndarray) -> list[Any]:
    """Set the user code of each usable Arrow row (the users dictionary-encoded, each
    distinct id once) and give the distinct ids."""
    import pyarrow.compute as pc

    _, _, usable, _, _, users = rows
    if not usable.any():
        return []
    vals = users.filter(usable) if not usable.all() else users
    enc = pc.dictionary_encode(vals)
    user_codes[np.flatnonzero(fast)[usable]] = arrow_ints(enc.indices)
    return list(enc.dictionary.to_pylist())


def _take_arrow_rows(
    rows: Any,
    fast: np.ndarray,
    slow: np.ndarray,
    is_rec: np.ndarray,
    rec_t: np.ndarray,
    sizes: np.ndarray,
) -> tuple[np.ndarray | None, list[Any]]:
    """Mark Arrow's usable rows as records (their steps and sizes) and the unusable ones
    ``slow``; the usable rows' items dictionary-encoded, each distinct string once:
    (codes, items)."""
    import pyarrow.compute as pc

    fast_idx = np.flatnonzero(fast)
    t, t_given, usable, offsets, values, _ = rows
    good = fast_idx[usable]
    is_rec[good] = True
    rec_t[good] = t[usable]
    row_sizes = np.diff(offsets)
    sizes[good] = row_sizes[usable]
    keep_occ = np.repeat(usable, row_sizes)
    vals = values if keep_occ.all() else values.filter(keep_occ)
    codes: np.ndarray | None = None
    items: list[Any] = []
    if len(vals):
        enc = pc.dictionary_encode(vals)
        codes = arrow_ints(enc.indices)
        items = enc.dictionary.to_pylist()
    slow[fast_idx[~usable]] = True
    return codes, items


def _parse_slow_lines(
    text: Any,
    done: int,
    slow: np.ndarray,
    is_rec: np.ndarray,
    rec_t: np.ndarray,
    sizes: np.ndarray,
    user_field: str | None = None,
) -> tuple[np.ndarray, dict[int, str], dict[int, tuple[str, ...]], dict[int, str]]:
    """Parse the ``slow`` lines one at a time (:func:`parse_jsonl_line`): the steps (an
    object array once a step is past int64), the errors, the items and the user ids
    (``user_field``) by line index."""
    errors_by_line: dict[int, str] = {}
    slow_items: dict[int, tuple[str, ...]] = {}
    slow_users: dict[int, str] = {}
    for i in np.flatnonzero(slow).tolist():
        rec = parse_jsonl_line(text(i), done + i + 1, user_field=user_field)
        if rec is None:
            continue
        is_rec[i] = True
        if rec.t is not None and rec.t > INT64_MAX and rec_t.dtype != object:
            rec_t = rec_t.astype(object)  # a step past any horizon, kept exactly
        rec_t[i] = rec.t or 0  # an invalid record keeps a step it gives
        if rec.error is not None:
            errors_by_line[i] = rec.error
        else:
            slow_items[i] = rec.items  # type: ignore[assignment]
            sizes[i] = len(rec.items)  # type: ignore[arg-type]
            if rec.user is not None:
                slow_users[i] = rec.user
    return rec_t, errors_by_line, slow_items, slow_users


def _merge_codes(
    arrow_items: list[Any],
    arrow_codes: np.ndarray | None,
    slow_items: dict[int, tuple[str, ...]],
    sizes: np.ndarray,
    from_arrow: np.ndarray,
) -> tuple[list[Any], np.ndarray]:
    """The occurrences in record order: the Arrow rows' codes (records ``from_arrow``),
    the slow records' items after them in the item list."""
    if not slow_items:
        codes = arrow_codes if arrow_codes is not None else np.zeros(0, np.int64)
        return arrow_items, codes
    table: dict[Any, int] = {}
    pos = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=pos[1:])
    codes = np.empty(int(pos[-1]), dtype=np.int64)
    if arrow_codes is not None:
        arrow_at = np.flatnonzero(from_arrow)
        codes[concat_ranges(pos[arrow_at], pos[arrow_at + 1])] = arrow_codes
    base = len(arrow_items)
    for i, its in slow_items.items():
        codes[pos[i] : pos[i + 1]] = [base + table.setdefault(x, len(table)) for x in its]
    return arrow_items + list(table), codes
