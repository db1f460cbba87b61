"""The columnar input path of ``dpstream run``: records in chunks, steps as columns.

Layer 6 of dpstream (an edge). :mod:`dpstream.io` reads one record at a time
(a :class:`~dpstream.io.RawEvent` each); this module reads the same JSON Lines
and CSV inputs in chunks of lines and hands the run loop one :class:`StepInput`
per time step: the step's valid events as columns (each distinct item once,
per occurrence an integer code), its invalid records with their messages, and
the raw bytes of its records for the keyed input digest. The records, their
steps and every message are exactly those of :func:`dpstream.io.read_events`
followed by :func:`dpstream.io.group_steps`; the tests compare the two paths
record by record.

How a chunk of JSON Lines is parsed
-----------------------------------
The fast way is one call of Arrow's JSON reader (pyarrow, when installed) over
the chunk, with the schema ``t: int64, items: list<string>`` (other fields are
parsed and ignored; any other type is an error). Arrow's parser and Python's
``json.loads`` agree on every line that passes these checks, which the chunk
must pass as a whole, else it is parsed line by line:

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
parsed one at a time by :func:`dpstream.io.parse_jsonl_line` (orjson when
installed, ``json.loads`` otherwise, with ``json.loads`` deciding every line
orjson refuses), which gives the exact record and message.

The digest of a step's input
----------------------------
:func:`step_digest` is a keyed HMAC over the line numbers of the step's records,
their byte lengths and their raw bytes (each record's line(s) without the line
terminator, joined by a line feed), so it is computed from the bytes read and
not from a re-encoding of the parsed records.
"""

from __future__ import annotations

import io as _io
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import compiled
from .io import RawEvent, parse_jsonl_line, raw_bytes

__all__ = [
    "Chunk",
    "StepInput",
    "ChunkGrouper",
    "read_jsonl_chunks",
    "chunks_from_records",
    "step_steps",
    "implicit_steps",
    "records_step",
    "FAST_LINE_BYTES",
    "CHUNK_LINES",
]

#: The longest line (in bytes) the Arrow reader is given; longer lines are parsed
#: one at a time (where ``json.loads`` decides about deep nesting and huge integers).
FAST_LINE_BYTES = 1000

#: Lines per chunk.
CHUNK_LINES = 1 << 15

_INT64_MAX = (1 << 63) - 1


@dataclass
class Chunk:
    """Consecutive records of the input, as columns (one entry per record, in order).

    ``t`` is 0 for a record without a time step; ``errors`` maps a record's
    index to its message (an invalid record has no items); the items of record
    i are ``items[codes[offsets[i]:offsets[i + 1]]]``; its raw bytes are
    ``buf[starts[i]:ends[i]]``.
    """

    lines: np.ndarray
    t: np.ndarray
    errors: dict[int, str]
    offsets: np.ndarray
    codes: np.ndarray
    items: list[Any]
    buf: bytes
    starts: np.ndarray
    ends: np.ndarray
    nlines: int = 0  # input lines the chunk covers (blank ones too)
    users: list[Any] | None = None  # each record's user id (--user-field), or None

    def __len__(self) -> int:
        return int(self.lines.size)


@dataclass
class StepInput:
    """The records of one time step (``t`` None: invalid records after the last step).

    ``events`` are the valid events as columns (``items``, ``codes``,
    ``offsets``; ``event_lines`` their lines); ``errors`` the invalid records
    as ``(line, message)`` in input order; ``lines``, ``lengths`` and ``raw``
    the digest material of every record (valid or not) in input order.
    """

    t: int | None
    event_lines: np.ndarray
    items: list[Any]
    codes: np.ndarray
    offsets: np.ndarray
    errors: list[tuple[int, str]]
    lines: np.ndarray
    lengths: np.ndarray
    raw: bytes
    users: list[Any] | None = None  # each valid event's user id (--user-field)

    @property
    def records(self) -> int:
        return int(self.lines.size)

    @property
    def first_line(self) -> int | None:
        return int(self.lines[0]) if self.lines.size else None


# --------------------------------------------------------------------------- reading


def _read_lines(stream: Any, name: str, hint: int, done: int) -> list[str]:
    import gzip
    import zlib

    try:
        if hasattr(stream, "readlines"):
            return stream.readlines(hint)
        out = []
        for line in stream:
            out.append(line)
            if len(out) >= CHUNK_LINES:
                break
        return out
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(
            f"input {name!r}: the compressed file is truncated or corrupt after line {done} ({exc})"
        ) from None


def read_jsonl_chunks(
    stream: Any, name: str = "input", *, chunk_bytes: int = 1 << 21
) -> Iterator[Chunk]:
    """The records of a JSON Lines text stream, a chunk at a time.

    A stream over bytes (a file, a ``.gz``, stdin) is read as bytes, as much as is
    there at each read; other text streams a chunk of lines at a time.
    """
    binary = getattr(stream, "buffer", None)
    if binary is not None and hasattr(binary, "read1"):
        yield from _binary_chunks(binary, name, chunk_bytes)
        return
    done = 0
    while True:
        lines = _read_lines(stream, name, chunk_bytes, done)
        if not lines:
            return
        yield _text_chunk(lines, done)
        done += len(lines)


_BOM = b"\xef\xbb\xbf"


def _binary_chunks(binary: Any, name: str, chunk_bytes: int) -> Iterator[Chunk]:
    import gzip
    import zlib

    done = 0
    tail = b""
    at_start = True
    while True:
        try:
            data = binary.read1(chunk_bytes)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"input {name!r}: the compressed file is truncated or corrupt "
                f"after line {done} ({exc})"
            ) from None
        buf = tail + data if tail else data
        if at_start and (len(buf) >= 3 or not data):
            at_start = False
            if buf.startswith(_BOM):  # a byte-order mark opens the input (utf-8-sig)
                buf = buf[3:]
        if not data:
            if buf:
                yield _bytes_chunk(buf, done)
            return
        if at_start:
            tail = buf
            continue
        cut = buf.rfind(b"\n")
        if cut < 0:
            tail = buf
            continue
        tail = buf[cut + 1 :]
        chunk = _bytes_chunk(buf[: cut + 1], done)
        done += chunk.nlines
        yield chunk


def _bytes_chunk(buf: bytes, done: int) -> Chunk:
    """The records of whole lines of bytes (the last one may lack its terminator)."""
    if b"\r" not in buf:
        ends = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10)
        if not buf.endswith(b"\n"):
            ends = np.append(ends, len(buf))
        starts = np.empty_like(ends)
        if ends.size:
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
    else:  # terminators \n, \r\n or \r, as text mode with newline="" reads them
        import re

        st, en, pos = [], [], 0
        for m in re.finditer(rb"\r\n|\r|\n", buf):
            st.append(pos)
            en.append(m.start())
            pos = m.end()
        if pos < len(buf):
            st.append(pos)
            en.append(len(buf))
        starts, ends = np.asarray(st, np.int64), np.asarray(en, np.int64)
    strict = buf.isascii()
    if not strict:
        try:
            buf.decode("utf-8")
            strict = True
        except UnicodeDecodeError:
            pass

    def text(i: int) -> str:
        return buf[int(starts[i]) : int(ends[i])].decode("utf-8", "surrogateescape")

    return _jsonl_chunk(buf, starts.astype(np.int64), ends.astype(np.int64), strict, text, done)


def _text_chunk(lines: list[str], done: int) -> Chunk:
    """The records of lines of text (each with its terminator, but maybe the last)."""
    bufs = [raw_bytes(line.rstrip("\r\n")) for line in lines]
    sizes = np.fromiter(map(len, bufs), np.int64, len(bufs))
    ends = np.cumsum(sizes + 1) - 1
    buf = b"\n".join(bufs) + b"\n"
    strict = True
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        strict = False
    chunk = _jsonl_chunk(buf, ends - sizes, ends, strict, lambda i: lines[i], done)
    return chunk


def _jsonl_chunk(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, strict: bool, text: Any, done: int
) -> Chunk:
    n = starts.size
    arr = np.frombuffer(buf, np.uint8)
    fast = np.zeros(n, dtype=bool)
    if (
        strict
        and b"\\u" not in buf
        and _BOM not in buf
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
    rows = _arrow_rows(buf, starts, ends, fast) if fast.any() else None
    if rows is None:
        fast[:] = False
    chunk = _assemble(text, n, done, buf, starts, ends, fast, rows)
    chunk.nlines = n
    return chunk


def _arrow_rows(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, fast: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any] | None:
    """Parse the fast lines with Arrow: (t, t given, items usable, offsets, values),
    or None (no pyarrow, or the reader refused the chunk: parse it line by line)."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return None
    idx = np.flatnonzero(fast)
    if idx.size == fast.size:
        data = buf
    else:
        mv = memoryview(buf)
        data = b"\n".join(
            mv[a:b] for a, b in zip(starts[idx].tolist(), ends[idx].tolist(), strict=True)
        )
    schema = pa.schema([("t", pa.int64()), ("items", pa.list_(pa.string()))])
    try:
        table = pj.read_json(
            _io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 64),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != idx.size:
        return None
    tcol = table.column("t").combine_chunks()
    icol = table.column("items").combine_chunks()
    t_given = _arrow_valid(tcol)
    t = np.where(t_given, _arrow_ints(tcol), 0)
    usable = _arrow_valid(icol)
    offsets = _arrow_ints(icol.offsets)
    values = icol.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    if values.null_count:
        null_at = np.flatnonzero(~_arrow_valid(values))
        usable[np.searchsorted(offsets, null_at, side="right") - 1] = False
    usable &= t_given & (t >= 1)  # no "t", a null or a bad one: the per-line parser words it
    return t, t_given, usable, offsets, values


def _arrow_ints(arr: Any) -> np.ndarray:
    """The value slots of a signed-integer Arrow array as int64 (a null's slot holds
    anything), read from its data buffer.

    ``to_numpy`` would do, but its first call in a process imports pandas when it
    is installed (~0.3 s of every command's start); reading the buffer does not.
    """
    import pyarrow as pa

    if not pa.types.is_signed_integer(arr.type):
        raise TypeError(f"expected a signed-integer Arrow array, got {arr.type}")
    n = len(arr)
    data = arr.buffers()[1]
    if n == 0 or data is None:
        return np.zeros(n, dtype=np.int64)
    dtype = np.dtype(f"=i{arr.type.bit_width // 8}")  # Arrow's memory: the machine's order
    return np.frombuffer(data, dtype=dtype, count=arr.offset + n)[arr.offset :].astype(np.int64)


def _arrow_valid(arr: Any) -> np.ndarray:
    """Which entries of an Arrow array are not null, as a bool array (its validity
    bitmap unpacked; see :func:`_arrow_ints` for why not ``is_null().to_numpy()``)."""
    import pyarrow as pa

    n = len(arr)
    if pa.types.is_null(arr.type):  # no buffers: every entry is null
        return np.zeros(n, dtype=bool)
    bitmap = arr.buffers()[0]
    if arr.null_count == 0 or bitmap is None:
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + n].astype(bool)


def _assemble(
    text: Any,
    n: int,
    done: int,
    buf: bytes,
    starts: np.ndarray,
    ends: np.ndarray,
    fast: np.ndarray,
    rows: Any,
) -> Chunk:
    """The chunk's records: Arrow's rows where usable, the per-line parser elsewhere."""
    rec_t = np.zeros(n, dtype=np.int64)
    is_rec = np.zeros(n, dtype=bool)
    errors_by_line: dict[int, str] = {}
    sizes = np.zeros(n, dtype=np.int64)
    slow_items: dict[int, tuple[str, ...]] = {}
    arrow_codes = None
    arrow_items: list[Any] = []
    fast_idx = np.flatnonzero(fast)
    slow = ~fast
    if rows is not None:
        import pyarrow.compute as pc

        t, t_given, usable, offsets, values = rows
        good = fast_idx[usable]
        is_rec[good] = True
        rec_t[good] = t[usable]
        row_sizes = np.diff(offsets)
        sizes[good] = row_sizes[usable]
        # the items of usable rows, dictionary-encoded: each distinct string once
        keep_occ = np.repeat(usable, row_sizes)
        vals = values if keep_occ.all() else values.filter(keep_occ)
        if len(vals):
            enc = pc.dictionary_encode(vals)
            arrow_codes = _arrow_ints(enc.indices)
            arrow_items = enc.dictionary.to_pylist()
        slow[fast_idx[~usable]] = True
    slow_idx = np.flatnonzero(slow)
    for i in slow_idx.tolist():
        rec = parse_jsonl_line(text(i), done + i + 1)
        if rec is None:
            continue
        is_rec[i] = True
        if rec.t is not None and rec.t > _INT64_MAX and rec_t.dtype != object:
            rec_t = rec_t.astype(object)  # a step past any horizon, kept exactly
        rec_t[i] = rec.t or 0  # an invalid record keeps a step it gives
        if rec.error is not None:
            errors_by_line[i] = rec.error
        else:
            slow_items[i] = rec.items  # type: ignore[assignment]
            sizes[i] = len(rec.items)  # type: ignore[arg-type]
    idx = np.flatnonzero(is_rec)
    # occurrences in record order: the Arrow rows' codes, the slow records' items
    items = arrow_items
    if slow_items:
        table: dict[Any, int] = {}
        pos = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=pos[1:])
        codes = np.empty(int(pos[-1]), dtype=np.int64)
        if arrow_codes is not None:
            arrow_rows = np.flatnonzero(is_rec & fast & ~slow)
            codes[_ranges(pos[arrow_rows], pos[arrow_rows + 1])] = arrow_codes
        base = len(items)
        for i, its in slow_items.items():
            codes[pos[i] : pos[i + 1]] = [base + table.setdefault(x, len(table)) for x in its]
        items = items + list(table)
    else:
        codes = arrow_codes if arrow_codes is not None else np.zeros(0, np.int64)
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
    )


def chunks_from_records(records: Iterable[RawEvent], size: int = 4096) -> Iterator[Chunk]:
    """Chunks from the records of :mod:`dpstream.io`'s readers (CSV, timestamps)."""
    batch: list[RawEvent] = []
    for rec in records:
        batch.append(rec)
        if len(batch) >= size:
            yield _chunk_of(batch)
            batch = []
    if batch:
        yield _chunk_of(batch)


def _chunk_of(recs: list[RawEvent]) -> Chunk:
    table: dict[Any, int] = {}
    codes: list[int] = []
    sizes: list[int] = []
    errors: dict[int, str] = {}
    raws: list[bytes] = []
    for k, rec in enumerate(recs):
        raws.append(rec.raw if rec.raw is not None else b"")
        if rec.error is not None:
            errors[k] = rec.error
            sizes.append(0)
            continue
        items = rec.items or ()
        codes.extend(table.setdefault(x, len(table)) for x in items)
        sizes.append(len(items))
    lens = np.fromiter(map(len, raws), np.int64, len(raws))
    ends = np.cumsum(lens + 1) - 1
    offsets = np.zeros(len(recs) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    users = [r.user for r in recs] if any(r.user is not None for r in recs) else None
    return Chunk(
        users=users,
        lines=np.fromiter((r.line for r in recs), np.int64, len(recs)),
        t=_steps_array([r.t or 0 for r in recs]),
        errors=errors,
        offsets=offsets,
        codes=np.asarray(codes, dtype=np.int64),
        items=list(table),
        buf=b"\n".join(raws) + b"\n",
        starts=ends - lens,
        ends=ends,
    )


# --------------------------------------------------------------------------- grouping


@dataclass
class _Part:
    """A run of consecutive records of one chunk that belong to one step."""

    chunk: Chunk
    a: int
    b: int
    late: dict[int, str] = field(default_factory=dict)  # record index -> message


class ChunkGrouper:
    """:func:`dpstream.io.group_steps` over chunks: the same steps, the same records.

    Every record with an in-range step counts in that step, wherever it stands
    in the input: the steps are released once the input has been read (a batch
    run's public clock is the end of its input, or ``--until``). Closing a step
    when a record of a later one arrives let that record decide that the records
    after it were late: its presence changed other records' counts.

    ``start``: the steps up to it are complete (records of them are late, with
    ``late_message``); ``late_message`` None: no such earlier run. A record with
    a step (valid or not) belongs to it; one without belongs to the step of the
    last record before it that has one, or else to the first step. Not for
    ``--implicit-time`` (a step per line). A record of a step past ``limit``
    (``--until``; the horizon by default) is yielded at once, consecutive ones
    of one step together, for the caller to reject.
    """

    def __init__(
        self,
        horizon: int,
        *,
        start: int = 0,
        late_message: str | None = None,
        limit: int | None = None,
    ) -> None:
        self.limit = horizon if limit is None else limit
        self.start = start
        self.late_message = late_message
        self.steps: dict[int, list[_Part]] = {}  # every step's records, in input order
        self.last: int | None = None  # the step of the last record that had one
        self.lead: list[_Part] = []  # records without a step before any with one
        self.past: list[_Part] = []  # consecutive records of one step past the limit
        self.past_t = 0

    def feed(self, chunk: Chunk) -> Iterator[StepInput]:
        """Take a chunk; yields only the records of steps past the limit."""
        m = len(chunk)
        if m == 0:
            return
        late: dict[int, str] = {}
        if max(self.limit, self.start) > _INT64_MAX and chunk.t.dtype != object:
            chunk.t = chunk.t.astype(object)  # compared with a step past int64
        t = chunk.t
        valid = t > 0  # a record with a step goes to it, valid or not
        if self.late_message is not None:  # records of steps an earlier run released
            old = np.flatnonzero(valid & (t <= self.start))
            for i in old.tolist():
                late[i] = self.late_message.format(t=int(t[i]))
            valid[old] = False
        beyond = valid & (t > self.limit)  # past the limit: rejected where they stand
        valid &= ~beyond
        # the step of every record: its own, or that of the last record before it
        # that had one (-1: none yet)
        at = np.where(valid, np.arange(m), -1)
        np.maximum.accumulate(at, out=at)
        carry = -1 if self.last is None else self.last
        step_of = np.where(at >= 0, t[np.maximum(at, 0)], carry)
        if at[-1] >= 0:
            self.last = int(t[at[-1]])
        change = step_of[1:] != step_of[:-1]
        if beyond.any():  # a range of its own for each run of one step past the limit
            change |= (beyond[1:] != beyond[:-1]) | (beyond[1:] & (t[1:] != t[:-1]))
        cuts = [0, *(np.flatnonzero(change) + 1).tolist(), m]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            part = _Part(chunk, a, b, {i: msg for i, msg in late.items() if a <= i < b})
            if beyond[a]:
                t_past = int(t[a])
                if self.past and self.past_t != t_past:
                    yield from self._flush_past()
                self.past.append(part)
                self.past_t = t_past
                continue
            yield from self._flush_past()
            s = int(step_of[a])
            if s < 0:
                self.lead.append(part)
            else:
                self.steps.setdefault(s, []).append(part)

    def _flush_past(self) -> Iterator[StepInput]:
        """The waiting records of one step past the limit, as that step (rejected)."""
        if self.past:
            yield _step_input(self.past_t, self.past)
            self.past = []

    def finish(self) -> Iterator[StepInput]:
        """Every step from start + 1 to the last one with a record, in order (records
        without a step before any with one in the first), or, when no record had a
        step, those records as step None."""
        yield from self._flush_past()
        if not self.steps:
            if self.lead:
                yield _step_input(None, self.lead)
                self.lead = []
            return
        top = max(self.steps)
        lead, self.lead = self.lead, []
        for s in range(self.start + 1, top + 1):
            yield _step_input(s, lead + self.steps.pop(s, []))
            lead = []


def step_steps(
    chunks: Iterable[Chunk],
    horizon: int,
    *,
    start: int = 0,
    late_message: str | None = None,
    limit: int | None = None,
) -> Iterator[StepInput]:
    """Group chunks into steps (see :class:`ChunkGrouper`)."""
    grouper = ChunkGrouper(horizon, start=start, late_message=late_message, limit=limit)
    for chunk in chunks:
        yield from grouper.feed(chunk)
    yield from grouper.finish()


_code_scratch = threading.local()


def _unique_inverse(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``codes`` (a non-empty int64 array of values in
    [0, size)) and each code's index among them: ``used[inverse] == codes``.

    With the C loops, in one pass over a map from code to slot kept per thread
    (``used`` in order of first appearance); else as ``np.unique(codes,
    return_inverse=True)`` (sorted), by a stable sort. Either order serves: a
    step's items are a set that its codes index, and nothing downstream depends
    on their order (new items are ordered by their keyed ids).
    """
    loops = compiled.loops()
    if loops is not None:
        scratch = getattr(_code_scratch, "buf", None)
        if scratch is None or scratch.size < size:
            scratch = np.full(
                max(size, 2 * (0 if scratch is None else scratch.size)), -1, dtype=np.int64
            )
            _code_scratch.buf = scratch
        used = np.empty(codes.size, dtype=np.int64)
        inverse = np.empty(codes.size, dtype=np.int64)
        k = loops.unique_codes(np.ascontiguousarray(codes, dtype=np.int64), scratch, used, inverse)
        return used[:k], inverse
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(ordered.size, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _item_array(chunk: Chunk) -> np.ndarray:
    """The chunk's distinct items as a NumPy object array (made once per chunk), so a
    step takes its items with one fancy index rather than a Python loop."""
    arr = chunk.__dict__.get("_item_array")
    if arr is None:
        arr = np.empty(len(chunk.items), dtype=object)
        arr[:] = chunk.items
        chunk.__dict__["_item_array"] = arr
    return arr


def _step_input(t: int | None, parts: list[_Part]) -> StepInput:
    ev_lines: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    errors: list[tuple[int, str]] = []
    lines: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    raws: list[bytes] = []
    seen_chunks: dict[int, int] = {}
    chunks: list[Chunk] = []  # the chunks whose items this step uses
    users: list[Any] = []
    for part in parts:
        ch, a, b = part.chunk, part.a, part.b
        lines.append(ch.lines[a:b])
        starts, ends = ch.starts[a:b], ch.ends[a:b]
        lengths.append(ends - starts)
        if b - a == 1 or (ch.starts[a + 1 : b] == ch.ends[a : b - 1] + 1).all():
            raws.append(ch.buf[int(starts[0]) : int(ends[-1])])
        else:
            mv = memoryview(ch.buf)
            raws.append(
                b"\n".join(mv[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
            )
        bad = (
            [i for i in range(a, b) if i in ch.errors or i in part.late]
            if (ch.errors or part.late)
            else []
        )
        for i in bad:
            errors.append((int(ch.lines[i]), part.late.get(i) or ch.errors[i]))
        good = np.arange(a, b)
        if bad:
            good = np.setdiff1d(good, np.asarray(bad, dtype=np.int64), assume_unique=True)
        if good.size == 0:
            continue
        ev_lines.append(ch.lines[good])
        if ch.users is not None:
            users.extend(ch.users[i] for i in good.tolist())
        base = seen_chunks.get(id(ch))
        if base is None:  # the chunks' items, one after the other (not copied)
            base = seen_chunks[id(ch)] = sum(len(x.items) for x in chunks)
            chunks.append(ch)
        lo, hi = ch.offsets[good], ch.offsets[good + 1]
        sizes.append(hi - lo)
        if good.size == b - a and not bad:
            codes.append(ch.codes[int(ch.offsets[a]) : int(ch.offsets[b])] + base)
        else:
            codes.append(ch.codes[_ranges(lo, hi)] + base)
    if len(parts) == 1 and raws:
        raw = raws[0]
    else:
        raw = b"\n".join(r for r in raws)
    all_codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
    if all_codes.size:  # only the items this step uses (a chunk holds many steps)
        used, all_codes = _unique_inverse(all_codes, sum(len(ch.items) for ch in chunks))
        arrays = [_item_array(ch) for ch in chunks]
        src = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        items = src[used].tolist()
    else:
        items = []
    size_arr = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    offsets = np.zeros(size_arr.size + 1, dtype=np.int64)
    np.cumsum(size_arr, out=offsets[1:])
    errors.sort()
    return StepInput(
        t=t,
        event_lines=np.concatenate(ev_lines) if ev_lines else np.zeros(0, np.int64),
        items=items,
        codes=all_codes.astype(np.int64, copy=False).reshape(-1),
        offsets=offsets,
        errors=errors,
        lines=np.concatenate(lines) if lines else np.zeros(0, np.int64),
        lengths=np.concatenate(lengths) if lengths else np.zeros(0, np.int64),
        raw=raw,
        users=users if any(p.chunk.users is not None for p in parts) else None,
    )


def _steps_array(values: list[int]) -> np.ndarray:
    """Time steps as int64, or as Python ints (object) when one is past int64."""
    if values and max(values) > _INT64_MAX:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values, dtype=np.int64).reshape(-1)


def implicit_steps(chunks: Iterable[Chunk], *, start: int = 0) -> Iterator[StepInput]:
    """``--implicit-time``: every record (valid or not) a step of its own, from start + 1
    (the steps of :func:`dpstream.io.group_steps` with ``implicit``)."""
    t = start
    for chunk in chunks:
        for i in range(len(chunk)):
            t += 1
            yield _step_input(t, [_Part(chunk, i, i + 1)])


def records_step(t: int | None, records: list[RawEvent]) -> StepInput:
    """A step made of records read one at a time (``--follow``)."""
    if not records:
        return _step_input(t, [])
    chunk = _chunk_of(list(records))
    return _step_input(t, [_Part(chunk, 0, len(chunk))])


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i]) for every i."""
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shift = np.repeat(lo - (np.cumsum(lens) - lens), lens)
    return shift + np.arange(total, dtype=np.int64)
