"""Records as columns: chunks of the input, and the input of one time step.

Layer 6 of dpstream (an edge). A :class:`Chunk` holds consecutive records of
the input as columns (their lines, steps, errors, item codes and raw bytes);
the readers of :mod:`dpstream.io.jsonl` and :mod:`dpstream.io.csv` yield
them. :mod:`dpstream.io.grouping` cuts chunks into :class:`StepPart` runs of
one step, and :func:`step_input` joins a step's parts into the
:class:`StepInput` the run loop takes: the step's valid events as columns
(each distinct item once, per occurrence an integer code), its invalid
records with their messages, and the raw bytes of its records for the keyed
input digest.

The digest of a step's input
----------------------------
The digest (``step_input`` of :mod:`dpstream.state`'s digests) is a keyed
HMAC over the line numbers of the step's records, their byte lengths and their
raw bytes (each record's line(s) without the line terminator, joined by a line
feed), so it is computed from the bytes read and not from a re-encoding of the
parsed records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import compiled
from .records import RawEvent

__all__ = [
    "Chunk",
    "StepInput",
    "StepPart",
    "chunks_from_records",
    "step_input",
    "records_step",
    "concat_ranges",
    "INT64_MAX",
]

#: The largest int64: a step past it is kept as a Python int (an object array).
INT64_MAX = (1 << 63) - 1


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
    #: --user-field: the chunk's distinct user ids, and per record the index of its
    #: user among them (-1: an invalid record, no user); None at event level
    user_ids: list[Any] | None = None
    user_codes: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.lines.size)

    @property
    def users(self) -> list[Any] | None:
        """Each record's user id (None for an invalid record), or None at event level."""
        return _user_list(self.user_ids, self.user_codes)


def _user_list(ids: list[Any] | None, codes: np.ndarray | None) -> list[Any] | None:
    if ids is None or codes is None:
        return None
    return [ids[c] if c >= 0 else None for c in codes.tolist()]


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
    #: --user-field: the step's distinct user ids, and per valid event the index of
    #: its user among them; None at event level
    user_ids: list[Any] | None = None
    user_codes: np.ndarray | None = None

    @property
    def users(self) -> list[Any] | None:
        """Each valid event's user id, or None at event level."""
        return _user_list(self.user_ids, self.user_codes)

    @property
    def records(self) -> int:
        return int(self.lines.size)

    @property
    def first_line(self) -> int | None:
        return int(self.lines[0]) if self.lines.size else None

    def raw_pieces(self) -> tuple[bytes]:
        """``raw`` as the pieces a digest reads (:meth:`dpstream.run.fold.FoldedStep.raw_pieces`
        gives a folded step's a block at a time)."""
        return (self.raw,)

    def raw_ends(self) -> np.ndarray:
        """Where the first j records' bytes end in ``raw`` (entry j - 1): ``raw`` is the
        records' bytes joined by line feeds, so the digest material of the first j
        records alone is ``lines[:j]``, ``lengths[:j]`` and ``raw[:raw_ends()[j - 1]]``."""
        return np.cumsum(self.lengths) + np.arange(self.lengths.size)


#: The bytes of records a chunk of :func:`chunks_from_records` holds at most (a record
#: alone may hold more): records of long rows (a Parquet dictionary of long strings)
#: are not held 4,096 at a time
CHUNK_RAW_BYTES = 1 << 23


def chunks_from_records(records: Iterable[RawEvent], size: int = 4096) -> Iterator[Chunk]:
    """Chunks from the records of :mod:`dpstream.io`'s readers (CSV, timestamps): up to
    ``size`` records, and up to :data:`CHUNK_RAW_BYTES` of their bytes, a chunk."""
    batch: list[RawEvent] = []
    held = 0
    for rec in records:
        batch.append(rec)
        held += len(rec.raw or b"")
        if len(batch) >= size or held >= CHUNK_RAW_BYTES:
            yield _chunk_of(batch)
            batch = []
            held = 0
    if batch:
        yield _chunk_of(batch)


def _chunk_of(recs: list[RawEvent]) -> Chunk:
    """Records as one chunk (each distinct item once, in order of first use)."""
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
    user_ids: list[Any] | None = None
    user_codes: np.ndarray | None = None
    if any(r.user is not None for r in recs):
        ids: dict[Any, int] = {}
        user_codes = np.fromiter(
            (-1 if r.user is None else ids.setdefault(r.user, len(ids)) for r in recs),
            np.int64,
            len(recs),
        )
        user_ids = list(ids)
    return Chunk(
        user_ids=user_ids,
        user_codes=user_codes,
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


def _steps_array(values: list[int]) -> np.ndarray:
    """Time steps as int64, or as Python ints (object) when one is past int64."""
    if values and max(values) > INT64_MAX:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass
class StepPart:
    """A run of consecutive records of one chunk that belong to one step."""

    chunk: Chunk
    a: int
    b: int
    late: dict[int, str] = field(default_factory=dict)  # record index -> message


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
    return _object_array(chunk, "items")


def _object_array(chunk: Chunk, name: str) -> np.ndarray:
    """A list attribute of a chunk (its items, its user ids) as a NumPy object array,
    made once per chunk."""
    arr = chunk.__dict__.get("_array_" + name)
    if arr is None:
        values = getattr(chunk, name) or []
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        chunk.__dict__["_array_" + name] = arr
    return arr


def step_input(t: int | None, parts: list[StepPart]) -> StepInput:
    ev_lines: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    errors: list[tuple[int, str]] = []
    lines: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    raws: list[bytes] = []
    seen_chunks: dict[int, int] = {}
    chunks: list[Chunk] = []  # the chunks whose items this step uses
    user_parts: list[np.ndarray] = []  # per valid event, its user's code + the chunk's base
    user_chunks: list[Chunk] = []
    user_base: dict[int, int] = {}
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
        if ch.user_codes is not None and ch.user_ids is not None:
            ubase = user_base.get(id(ch))
            if ubase is None:
                ubase = user_base[id(ch)] = sum(len(x.user_ids or ()) for x in user_chunks)
                user_chunks.append(ch)
            user_parts.append(ch.user_codes[good] + ubase)
        base = seen_chunks.get(id(ch))
        if base is None:  # the chunks' items, one after the other (not copied)
            base = seen_chunks[id(ch)] = sum(len(x.items) for x in chunks)
            chunks.append(ch)
        lo, hi = ch.offsets[good], ch.offsets[good + 1]
        sizes.append(hi - lo)
        if good.size == b - a and not bad:
            codes.append(ch.codes[int(ch.offsets[a]) : int(ch.offsets[b])] + base)
        else:
            codes.append(ch.codes[concat_ranges(lo, hi)] + base)
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
        if len(chunks) > 1:  # an item of two chunks is one item of the step (one code)
            items, all_codes = _distinct_items(items, all_codes)
    else:
        items = []
    size_arr = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    offsets = np.zeros(size_arr.size + 1, dtype=np.int64)
    np.cumsum(size_arr, out=offsets[1:])
    errors.sort()
    user_ids, user_codes = _step_users(user_chunks, user_parts)
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
        user_ids=user_ids if any(p.chunk.user_ids is not None for p in parts) else None,
        user_codes=user_codes if any(p.chunk.user_ids is not None for p in parts) else None,
    )


def _distinct_items(items: list[Any], codes: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """``items`` each once (the first of equal ones) and ``codes`` pointing at them: a
    step's items taken from several chunks repeat an item each chunk has, and one item
    under two codes would be two items to the per-user bound (two pairs of a user)."""
    table: dict[Any, int] = {}
    remap = np.fromiter((table.setdefault(x, len(table)) for x in items), np.int64, len(items))
    if len(table) == len(items):
        return items, codes
    return list(table), remap[codes]


def _step_users(chunks: list[Chunk], parts: list[np.ndarray]) -> tuple[list[Any], np.ndarray]:
    """A step's distinct user ids (only those its valid events use) and per valid event
    the index of its user among them, from the chunks' user columns."""
    codes = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if not codes.size:
        return [], codes
    if (codes < 0).any():
        raise ValueError("a valid record without a user id")
    used, inverse = _unique_inverse(codes, sum(len(ch.user_ids or ()) for ch in chunks))
    arrays = [_object_array(ch, "user_ids") for ch in chunks]
    ids = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return ids[used].tolist(), inverse


def records_step(t: int | None, records: list[RawEvent]) -> StepInput:
    """A step made of records read one at a time (``--follow``)."""
    if not records:
        return step_input(t, [])
    chunk = _chunk_of(list(records))
    return step_input(t, [StepPart(chunk, 0, len(chunk))])


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i]) for every i."""
    lens = hi - lo
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shift = np.repeat(lo - (np.cumsum(lens) - lens), lens)
    return shift + np.arange(total, dtype=np.int64)
