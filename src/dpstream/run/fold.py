"""A batch run's input folded, as it is read, into what each step counts.

Layer 6 of dpstream (part of the source stage, :mod:`dpstream.run.source`). A batch
run releases nothing before its input ends (the public clock: an event out of order
still counts in its own step), but it need not hold the input until then. Each chunk
is cut into its steps' records as it is read (:meth:`dpstream.io.grouping.ChunkGrouper.parts`),
checked by the validate stage at once (the same per-event checks, so the same counts
and the same decisions), and kept as:

* event level: per step, the items of its valid events with their counts (item ids
  in a run-wide :class:`~dpstream.mechanisms.item_table.ItemTable`) and the number of
  its valid events. The mechanisms count each item once per event, so a step released
  from these (:func:`spread`: the occurrences dealt out over the same number of events,
  none twice in one event, none over ``--max-items``) is the step released from its
  events, bit for bit;
* user level: what the first-come-first-kept rule reads, in input order: per valid
  event its user id and its items (ids in run-wide tables), no raw bytes nor strings.

The keyed digest of each step's input (``--state``: :meth:`dpstream.state.StateDigests.step_input`
hashes the count of its records, their line numbers, their byte lengths and then their
raw bytes) needs the records' bytes at the step's release, so they go to a temporary
file as they are read (never held in memory), and are read back one step at a time.

Past ``--memory`` bytes of counts held, they are written to that temporary file too
(a daily input larger than memory still runs). The file lives in a private directory
(0700, files 0600) under the system's temporary directory, named
``dpstream-spill-<pid>-*``, made only when needed and removed when the run ends, on
error too; a run killed outright (SIGKILL) leaves it, and the next run that makes one
first removes every such directory of this user whose process is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .settings import parse_size

if TYPE_CHECKING:
    from .validate import Validator

__all__ = [
    "DEFAULT_MEMORY",
    "FoldedInput",
    "FoldedStep",
    "SpillDir",
    "memory_budget",
    "parse_size",
    "spread",
]

#: The bytes of a step's input a digest reads back from the temporary file at a time.
_READ_BLOCK = 1 << 22

#: --memory's default: counts held in memory up to this many bytes, then spilled.
DEFAULT_MEMORY = "512M"
_PREFIX = "dpstream-spill-"
#: a step's segments held in memory before they are merged into one (event level)
_MERGE_AT = 8


class SpillDir:
    """One append-only temporary file, made on first use in a private (0700) directory
    as a 0600 file and unlinked at once with its directory: it has no name on disk
    while the run holds it, so no kill leaves the input's bytes behind. Where an open
    file cannot be removed, :meth:`close` removes both (and a stale directory of a
    process that is gone is removed when the next one is made)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root
        self.path: str | None = None
        self._fd: int | None = None
        self.size = 0

    def _open(self) -> int:
        if self._fd is None:
            root = self.root or tempfile.gettempdir()
            remove_stale(root)
            self.path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=root)  # 0700
            fd, name = tempfile.mkstemp(dir=self.path, suffix=".bin")  # 0600
            self._fd = fd
            try:  # no name on disk from now on: a kill of any kind (SIGKILL, SIGTERM, a
                os.unlink(name)  # power loss) leaves nothing of the input behind; the open
                os.rmdir(self.path)  # descriptor keeps the file until it is closed
                self.path = None
            except OSError:  # (where an open file cannot be removed: close() removes it)
                pass
        return self._fd

    def write(self, data: bytes | memoryview) -> int:
        """Append ``data``; returns where it starts."""
        fd = self._open()
        at = self.size
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = os.pwrite(fd, view, self.size)
            self.size += n
            view = view[n:]
        return at

    def read(self, at: int, n: int) -> bytes:
        """``n`` bytes from ``at``."""
        assert self._fd is not None
        out = bytearray()
        while len(out) < n:
            block = os.pread(self._fd, n - len(out), at + len(out))
            if not block:
                raise OSError("dpstream's temporary file is shorter than written")
            out += block
        return bytes(out)

    def close(self) -> None:
        """Remove the directory and its file (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def memory_budget(memory: str | None) -> int:
    """``--memory`` in bytes (default :data:`DEFAULT_MEMORY`): what a batch run's folded
    counts and a follower's records of steps not yet due hold in memory before they
    spill."""
    return parse_size(memory or DEFAULT_MEMORY)


def remove_stale(root: str, prefix: str = _PREFIX) -> None:
    """Remove the spill directories (or others named ``prefix`` + pid + ``-`` + a word)
    under ``root`` that this user's processes left when killed outright (their process
    is gone)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    uid = os.getuid()
    for name in names:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)-\w+", name)
        if m is None:
            continue
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != uid or not os.path.isdir(path):
                continue
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another user, or not ours to look at
            continue


def spread(codes: np.ndarray, counts: np.ndarray, events: int) -> tuple[np.ndarray, np.ndarray]:
    """Occurrences of items (``codes[i]`` ``counts[i]`` times, each count at most
    ``events``) dealt out over ``events`` events: occurrence j goes to event j mod
    ``events``, so an item's occurrences (consecutive) land in distinct events and no
    event gets more than ceil(total / events). Returns (codes, offsets) per event."""
    total = int(counts.sum())
    if events <= 0:
        if total:
            raise ValueError("occurrences without an event")
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    flat = np.repeat(codes.astype(np.int64, copy=False), counts)
    slot = np.arange(total, dtype=np.int64) % events
    order = np.argsort(slot, kind="stable")
    offsets = np.zeros(events + 1, dtype=np.int64)
    np.cumsum(np.bincount(slot, minlength=events), out=offsets[1:])
    return flat[order], offsets


def _merge(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) with each id once, its counts summed (ids ascending)."""
    if not ids.size:
        return ids.astype(np.int32), _narrow(counts)
    order = np.argsort(ids, kind="stable")
    ids, counts = ids[order], counts[order]
    start = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    summed = np.add.reduceat(counts.astype(np.int64), start)
    return ids[start].astype(np.int32), _narrow(summed)


def _narrow(a: np.ndarray) -> np.ndarray:
    """Counts (>= 0) in the narrowest type that holds them: most of a step's items
    count a few times, so uint8 holds most segments (a quarter of int32's memory).
    Whoever adds them up widens first (:func:`_merge` sums in int64)."""
    top = int(a.max()) if a.size else 0
    for dtype in (np.uint8, np.uint16, np.int32):
        if top <= np.iinfo(dtype).max:
            return a.astype(dtype)
    return a.astype(np.int64)


#: a segment in memory: a tuple of arrays; on disk: (offset, ((dtype, n), ...))
Segment = Any


class FoldedStep:
    """One step of a folded input: its valid events (as counts, or at user level as
    columns) and, with digests, where its records' bytes are in the temporary file.
    Read by :meth:`dpstream.run.pipeline.Stages.release` and the sink (the digest
    material: ``lines``, ``lengths``, ``raw``, read from the file when asked)."""

    __slots__ = ("t", "events", "segments", "digest_refs", "first_line", "error", "_owner")

    def __init__(self, owner: FoldedInput, t: int) -> None:
        self._owner = owner
        self.t = t
        self.events = 0  # valid events
        self.segments: list[Segment] = []
        self.digest_refs: list[tuple[int, int, int]] = []  # (offset, records, raw bytes)
        self.first_line: int | None = None
        self.error: Exception | None = None  # --on-invalid error: raised at its release

    # -- the digest material (as dpstream.io.chunks.StepInput has it) -----------------
    def _heads(self) -> list[bytes]:
        """Each part's line numbers and byte lengths (16 bytes a record), not its bytes."""
        return [self._owner.spill.read(at, 16 * n) for at, n, _ in self.digest_refs]

    @property
    def lines(self) -> np.ndarray:
        heads = [np.frombuffer(h, dtype="<i8", count=len(h) // 16) for h in self._heads()]
        return np.concatenate(heads) if heads else np.zeros(0, np.int64)

    @property
    def lengths(self) -> np.ndarray:
        heads = self._heads()
        parts = [np.frombuffer(h, dtype="<i8", offset=len(h) // 2) for h in heads]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def raw_pieces(self) -> Iterator[bytes]:
        """The records' bytes joined by line feeds (what :attr:`raw` is), a block of at
        most :data:`_READ_BLOCK` bytes at a time: a step's digest never holds its
        input (a daily run of one step a day held it three times over)."""
        spill = self._owner.spill
        for k, (at, n, size) in enumerate(self.digest_refs):
            if k:
                yield b"\n"
            at += 16 * n
            for lo in range(0, size, _READ_BLOCK):
                yield spill.read(at + lo, min(_READ_BLOCK, size - lo))

    @property
    def raw(self) -> bytes:
        return b"".join(self.raw_pieces())

    @property
    def records(self) -> int:
        return sum(n for _, n, _ in self.digest_refs)

    def valid_events(self) -> Any:
        """The step's valid events, as the validate stage gives them to the mechanism."""
        return self._owner.events_of(self)


class FoldedInput:
    """A batch run's input folded as it is read (see the module doc). Feed it chunks in
    input order (:meth:`feed`), then take its steps in order (:meth:`steps`); close it."""

    def __init__(
        self,
        validator: Validator,
        *,
        horizon: int,
        start: int,
        until: int,
        past: Any,
        digests: bool,
        budget: int,
        users: bool,
        spill_root: str | None = None,
    ) -> None:
        from ..io.grouping import ChunkGrouper
        from ..mechanisms.item_table import ItemTable

        late = "time step {t} was already released by an earlier run (a late event)"
        self.grouper = ChunkGrouper(
            horizon, start=start, late_message=late if start else None, limit=until
        )
        self.validator = validator
        self.start = start
        self.past = past  # t -> the message for records of step t past the end
        self.digests = digests
        self.budget = budget
        self.users = users
        self.items = ItemTable()
        self.user_ids = ItemTable() if users else None
        self.steps_by_t: dict[int, FoldedStep] = {}
        self.lead: list[Any] = []  # StepInputs of records before any with a step
        self.held = 0  # bytes of counts held in memory
        self.spilled = 0  # segments written to the temporary file
        self.spill = SpillDir(spill_root)
        self.records = 0
        self.last_line = 0
        #: --on-invalid error: what the first invalid record past the end step raises
        #: (after the steps are released, as the run rejects such records then)
        self.after: Exception | None = None

    # -- reading -------------------------------------------------------------------------
    def feed(self, chunk: Any) -> None:
        """Fold one chunk (:class:`dpstream.io.chunks.Chunk`) of the input."""
        from ..io.chunks import step_input

        self.records += len(chunk)
        if len(chunk):
            self.last_line = int(chunk.lines[-1])
        for s, part, beyond in self.grouper.parts(chunk):
            if beyond:  # counted now, as the run counts them after its releases
                if self.after is None:  # (--on-invalid error: the first, raised then)
                    self.after = self._checked(step_input(s, [part]), past=self.past(s))[1]
            elif s < 0:  # its step is known at the end: start + 1, or none
                lead = step_input(None, [part])
                self.lead.append(lead)
                self.held += _lead_cost(lead)
            else:
                self._add(self._step(s), step_input(s, [part]))
        if self.held > self.budget:
            self._spill_all()

    def _step(self, t: int) -> FoldedStep:
        step = self.steps_by_t.get(t)
        if step is None:
            step = self.steps_by_t[t] = FoldedStep(self, t)
        return step

    def _add(self, step: FoldedStep, part: Any, *, front: bool = False) -> None:
        """Check one run of a step's records and fold its valid events into the step."""
        if step.first_line is None or front:
            step.first_line = part.first_line
        if self.digests:
            raw = part.raw
            lines = np.ascontiguousarray(part.lines, dtype="<i8")
            lengths = np.ascontiguousarray(part.lengths, dtype="<i8")
            at = self.spill.write(lines.tobytes() + lengths.tobytes() + raw)
            ref = (at, int(lines.size), len(raw))
            if front:
                step.digest_refs.insert(0, ref)
            else:
                step.digest_refs.append(ref)
        if step.error is not None and not front:  # --on-invalid error: it stops the run
            return  # (records before any step come first: they are checked still)
        valid, error = self._checked(part)
        if error is not None:
            step.error = error
            return
        if not len(valid):
            return
        step.events += len(valid)
        if self.users:
            seg = self._user_segment(valid)
        else:
            codes = self.items_of(valid.items)[valid.codes]
            seg = _merge(codes, np.ones(codes.size, np.int64))
        self.held += sum(a.nbytes for a in seg)
        if front:
            step.segments.insert(0, seg)
        else:
            step.segments.append(seg)
        if not self.users and sum(map(_in_memory, step.segments)) > _MERGE_AT:
            self._merge_step(step)

    def _checked(self, part: Any, past: str | None = None) -> tuple[Any, Exception | None]:
        """The validate stage on a run of records: its valid events, or (--on-invalid
        error) the error its first invalid record raises, kept to be raised where the
        run releases that record's step."""
        from ..errors import InvalidEventError

        try:
            return self.validator.events(part, past=past), None
        except InvalidEventError as exc:
            return [], exc

    def _user_segment(self, valid: Any) -> tuple[np.ndarray, ...]:
        cols = valid.events
        codes = self.items_of(cols.items)[cols.codes].astype(np.int32)
        sizes = np.diff(cols.offsets).astype(np.int32)
        assert self.user_ids is not None
        users = self.user_ids.positions(list(valid.users))[valid.user_of].astype(np.int32)
        return codes, sizes, users

    def items_of(self, items: list[Any]) -> np.ndarray:
        """The run-wide ids of ``items`` (new ones added)."""
        return self.items.positions(items)

    def _merge_step(self, step: FoldedStep) -> None:
        """Merge a step's segments held in memory into one (event level)."""
        mem = [s for s in step.segments if _in_memory(s)]
        disk = [s for s in step.segments if not _in_memory(s)]
        before = sum(a.nbytes for s in mem for a in s)
        merged = _merge(np.concatenate([s[0] for s in mem]), np.concatenate([s[1] for s in mem]))
        self.held += sum(a.nbytes for a in merged) - before
        step.segments = [*disk, merged]

    def _spill_all(self) -> None:
        """Write every segment held in memory to the temporary file."""
        for step in self.steps_by_t.values():
            for i, seg in enumerate(step.segments):
                if _in_memory(seg):
                    arrays = [np.ascontiguousarray(a) for a in seg]
                    at = self.spill.write(b"".join(a.tobytes() for a in arrays))
                    step.segments[i] = (at, tuple((a.dtype.str, a.size) for a in arrays))
                    self.spilled += 1
        for i, lead in enumerate(self.lead):
            if not isinstance(lead, tuple) and _all_invalid(lead):
                self.lead[i] = self._write_lead(lead)
        self.held = 0

    # -- records before any step (late ones, ones without a step) -------------------------
    def _write_lead(self, part: Any) -> tuple[int, int, int, int]:
        """A run of records before any step, all invalid, to the temporary file (review
        119: a day's file that grows by a day held its earlier days, all late, at about
        8 times their size): where, and its records, bytes and messages' sizes (each
        record's message is its error: the errors' lines are the records')."""
        lines = np.ascontiguousarray(part.lines, dtype="<i8").tobytes()
        lengths = np.ascontiguousarray(part.lengths, dtype="<i8").tobytes()
        messages = json.dumps([message for _, message in part.errors]).encode("ascii")
        at = self.spill.write(lines + lengths + part.raw + messages)
        return (at, len(part.errors), len(part.raw), len(messages))

    def _lead_part(self, lead: Any) -> Any:
        """A run of records before any step, read back from the temporary file when it
        went there."""
        if not isinstance(lead, tuple):
            return lead
        from ..io.chunks import step_input

        at, n, raw_n, text_n = lead
        blob = self.spill.read(at, 16 * n + raw_n + text_n)
        lines = np.frombuffer(blob, dtype="<i8", count=n)
        lengths = np.frombuffer(blob, dtype="<i8", count=n, offset=8 * n)
        raw = blob[16 * n : 16 * n + raw_n]
        messages = json.loads(blob[16 * n + raw_n :].decode("ascii"))
        errors = list(zip(lines.tolist(), messages, strict=True))
        return replace(step_input(None, []), lines=lines, lengths=lengths, raw=raw, errors=errors)

    def finish(self) -> None:
        """The end of the input: records before any step go to the first step (when a
        record had a step), each run read back from the temporary file as it is taken."""
        if self.steps_by_t and self.lead:
            first = self._step(self.start + 1)
            for lead in reversed(self.lead):
                part = self._lead_part(lead)
                self._add(first, replace(part, t=self.start + 1), front=True)
            self.lead = []

    def first_error(self) -> Exception | None:
        """``--on-invalid error``: what the run would stop at, in the order it releases
        (the first invalid record of the earliest step, then of the records before any
        step, then of those past the end step), or None: a batch run raises it once its
        input is read, before anything is written."""
        for t in sorted(self.steps_by_t):
            if self.steps_by_t[t].error is not None:
                return self.steps_by_t[t].error
        for part in map(self._lead_part, self.lead):  # no record had a step: these first
            error = self._checked(part)[1]  # (no side effect: error mode raises first)
            if error is not None:
                return error
        return self.after

    # -- releasing -----------------------------------------------------------------------
    def steps(self) -> Iterator[Any]:
        """Every step from start + 1 to the last one with a record, in order (a step
        without records as an empty :class:`~dpstream.io.chunks.StepInput`, as the
        grouping makes it); or, when no record had a step, those records (step None)."""
        from ..io.chunks import step_input

        if not self.steps_by_t:
            yield from map(self._lead_part, self.lead)
            self.lead = []
            if self.after is not None:
                raise self.after
            return
        for t in range(self.start + 1, max(self.steps_by_t) + 1):
            step = self.steps_by_t.pop(t, None)
            yield step_input(t, []) if step is None else step
        if self.after is not None:
            raise self.after

    def _load(self, seg: Segment) -> tuple[np.ndarray, ...]:
        if _in_memory(seg):
            return seg  # type: ignore[no-any-return]
        at, shapes = seg
        sizes = [np.dtype(d).itemsize * n for d, n in shapes]
        blob = self.spill.read(at, sum(sizes))
        out, pos = [], 0
        for (d, n), size in zip(shapes, sizes, strict=True):
            out.append(np.frombuffer(blob, dtype=d, count=n, offset=pos))
            pos += size
        return tuple(out)

    def events_of(self, step: FoldedStep) -> Any:
        """A step's valid events as the validate stage gives them: EventColumns (event
        level, the counts spread over the step's events), UserEventColumns (or [] for
        none) at user level."""
        from ..mechanisms.columns import EventColumns
        from ..mechanisms.item_table import TakenItems

        if step.error is not None:
            raise step.error
        segs = [self._load(s) for s in step.segments]
        if self.users:
            if not step.events:
                return []
            return self._user_events(segs)
        if segs:
            ids, counts = _merge(
                np.concatenate([s[0] for s in segs]), np.concatenate([s[1] for s in segs])
            )
        else:
            ids, counts = np.zeros(0, np.int32), np.zeros(0, np.int64)
        # the items as rows of the run-wide table: a mechanism's table maps each row
        # to its position once per run, without making strings of them every step
        codes, offsets = spread(np.arange(ids.size), counts, step.events)
        return EventColumns(TakenItems(self.items, ids), codes, offsets)

    def _user_events(self, segs: list[tuple[np.ndarray, ...]]) -> Any:
        from ..io.chunks import _unique_inverse
        from ..mechanisms.columns import EventColumns
        from ..mechanisms.item_table import TakenItems
        from ..mechanisms.users import UserEventColumns

        assert self.user_ids is not None
        codes = np.concatenate([s[0] for s in segs]).astype(np.int64)
        sizes = np.concatenate([s[1] for s in segs]).astype(np.int64)
        users = np.concatenate([s[2] for s in segs]).astype(np.int64)
        offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if codes.size:  # (the items read only where needed: most are kept by no user)
            used, codes = _unique_inverse(codes, len(self.items))
        else:
            used = np.zeros(0, np.int64)
        uused, user_of = _unique_inverse(users, len(self.user_ids))
        cols = EventColumns(TakenItems(self.items, used), codes, offsets)
        # the run-wide ids too: the bounder maps each user and item to its state once
        ids = (self.user_ids, uused, used)
        return UserEventColumns(TakenItems(self.user_ids, uused), user_of, cols, ids)

    def close(self) -> None:
        """Remove the temporary file (idempotent)."""
        self.steps_by_t.clear()
        self.spill.close()


def _all_invalid(part: Any) -> bool:
    """Whether every record of a run of records is invalid (none is an event)."""
    return len(part.errors) == int(part.lines.size) and not len(part.codes)


def _lead_cost(part: Any) -> int:
    """What a run of records before any step holds in memory, about (its bytes, its
    line numbers and lengths, a message each)."""
    return len(part.raw) + 16 * int(part.lines.size) + 300 * len(part.errors)


def _in_memory(seg: Segment) -> bool:
    return bool(seg) and isinstance(seg[0], np.ndarray)
