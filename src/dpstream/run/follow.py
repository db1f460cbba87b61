"""``dpstream run --follow``: the source stage for a growing input, steps closed by the
public clock.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). :func:`follow` yields
what the pipeline does next, in order: a :class:`~dpstream.run.source.Due` step to
release, or :class:`~dpstream.run.source.Rejected` records (invalid, late or past the
end) for the validate stage to count. It decides *when* each step is released (the
clock, and the reader having caught up), never what it holds; it counts what it reads
in a :class:`~dpstream.run.source.ReadCount`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from .follow_input import DueSizes, FollowedInput, TakenLines
from .follow_pending import PendingRecords
from .source import Due, ReadCount, Rejected, SourceItem, past_message

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["follow", "input_records_from"]


def _utcnow() -> Any:
    """The wall clock the follower reads (one seam, so tests can drive time)."""
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc)


_IDLE = object()  # the follower has read everything there is for now
_EOF = object()  # the input has ended (stdin closed)
_POLL = 0.2  # seconds between reads of an input that has no new line
_LATE = "time step {} was already released (a late event)"


def follow(
    infile: Any,
    cfg: RunConfig,
    count: ReadCount,
    *,
    first_t: int,
    until: int,
    boundary: dict[int, int],
    recorded_cut: Callable[[int, list[Any]], int | None] | None = None,
) -> Generator[SourceItem, None, None]:
    """``--follow``: read a growing input and yield each step when the clock says.

    Step t closes at the input's size when it falls due on the public clock (its
    window has ended, plus ``--lateness``): it holds the events of step t whose
    lines were written in full by then, and it is released once the reader has
    read that far. An event written after the due instant is late (it goes to
    ``--on-invalid``), however far behind the reader was: which events make a
    step depends on when each was written, not on how fast a backlog was parsed,
    nor on its order. (A step does not close when an event of a later step is
    read: one event put early in a backlog would then make the events after it
    late, so its presence would change other events' counts.) An input whose size
    cannot be read (a stream without a file descriptor) closes a due step once the
    reader has caught up with it. A resumed run closes the steps on record at the
    input line each one closed at the first time (``boundary``, from the state), so
    late events stay late and the replay is exact; a step released but not on the
    state's record (the run stopped between the release ledger's record and the
    state's) closes where ``recorded_cut`` finds the ledger's record of it.
    ``first_t``: the first step to release (the consumer releases every
    :class:`Due` step before asking for the next item).
    """
    clock = cfg.clock
    if clock is None:
        raise ValueError("--follow needs the public clock: --time-field, --step and --start")
    if cfg.input_kind != "jsonl":
        raise ValueError("--follow reads JSON Lines input")
    source = FollowedInput(infile, cfg.input)
    q: queue.Queue = queue.Queue(maxsize=10_000)
    stop = threading.Event()
    errors: list[BaseException] = []
    thread = threading.Thread(
        target=_reader, args=(source, cfg, q, stop, errors), name="dpstream-follow", daemon=True
    )
    thread.start()
    sizes = None
    if source.sized:
        sizes = DueSizes(
            clock,
            first_t,
            until,
            source.size_now,
            lambda: _utcnow(),
            stop,
            backlog_size=source.backlog_size,
        )
    taken = TakenLines()
    from .fold import memory_budget

    pending = PendingRecords(memory_budget(cfg.memory))
    caught_up = ended = False
    t = first_t
    try:
        while t <= until:
            if sizes is not None and sizes.errors:
                raise sizes.errors[0]
            now = _utcnow()
            size = None  # the input's size at step t's due instant, once it is due
            if t in boundary:  # from a pipe, caught up is no end: its lines may be slow
                caught = caught_up and not source.waits_for_writers
                ready = _ready_on_record(t, boundary[t], count.last_line, caught, ended)
            elif sizes is None:
                ready = bool(clock.due(now) >= t and (caught_up or ended))
            else:
                size = sizes.size_of(t)
                ready = size is not None and (taken.seen >= size or ended)
            if ready:
                recs = pending.pop(t)
                cut = boundary.get(t)
                if cut is None and recorded_cut is not None:
                    cut = recorded_cut(t, recs)
                if cut is None:
                    cut = count.last_line if size is None else taken.line_within(size)
                yield Due(t, [r for r in recs if r.line <= cut], closed_at=cut)
                yield Rejected([r for r in recs if r.line > cut], _LATE.format(t))
                taken.closed_at(cut)
                t += 1
                continue
            wait = (clock.end_of(t) + clock.lateness - now).total_seconds()
            if ended:
                stop.wait(max(min(wait, 1.0), 0.01))
                continue
            try:
                item, end = q.get(timeout=max(min(wait, _POLL), 0.01))
            except queue.Empty:
                continue
            if item is _IDLE:
                caught_up = True
                taken.caught_up(end)
            elif item is _EOF:
                ended = True
                if errors:
                    raise errors[0]
            else:
                rec = count.take(item)
                taken.take(rec.line, end)
                caught_up = False
                rejected = _held(rec, t, until, cfg.horizon_limit, pending)
                if rejected is not None:
                    yield rejected
    finally:
        stop.set()
        source.close()
        pending.close()


def _ready_on_record(t: int, line: int, last_line: int, caught_up: bool, ended: bool) -> bool:
    """Whether step ``t``, which closed after input line ``line`` the first time, closes
    now: once the reader has read past that line (or caught up with it). ``caught_up``:
    the reader has read all of an input that says it holds no more (a file; a pipe only
    when it has ended)."""
    if (caught_up or ended) and last_line < line:
        raise StateError(
            f"the input ends at line {last_line}, but step {t} "
            f"closed after line {line} the first time: is it "
            "the same input?"
        )
    return last_line >= line  # every record up to the line it closed at has been read


def _held(rec: Any, t: int, until: int, horizon: int, pending: PendingRecords) -> Rejected | None:
    """A record read while step ``t`` is open: held for its step, or rejected (invalid,
    late, or past the end step)."""
    if rec.error is not None or rec.t is None:
        return Rejected([rec], None)
    if rec.t < t:
        return Rejected([rec], _LATE.format(rec.t))
    if rec.t > until:
        return Rejected([rec], past_message(rec.t, until, horizon))
    pending.add(rec)
    return None


def _reader(
    source: FollowedInput, cfg: RunConfig, q: queue.Queue, stop: threading.Event, errors: list
) -> None:
    """The reader thread: every record of the growing input onto ``q`` with the byte
    offset its line ends at, ``_IDLE`` with the bytes read when it has read all there
    is for now, ``_EOF`` at the end (an error goes to ``errors``)."""
    from ..io import guard_lines

    read = [0]  # the lines handed to the parser

    def lines() -> Iterator[str]:
        while not stop.is_set():
            line = source.readline()
            if line:
                read[0] += 1
                yield line
                continue
            if source.at_end():  # stdin closed
                return
            source.check()  # a followed file rotated stops the run
            q.put((_IDLE, source.consumed()))
            stop.wait(_POLL)

    try:
        for rec in input_records_from(guard_lines(lines(), cfg.input), cfg):
            # the parser takes one line at a time: the record is of the last line read
            assert rec.line == read[0], (rec.line, read[0])
            q.put((rec, source.end))
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread
        errors.append(exc)
    q.put((_EOF, 0))


def input_records_from(lines: Iterable[str], cfg: RunConfig) -> Iterator[Any]:
    """The records of ``lines`` (JSON Lines), their steps from the public clock."""
    from ..io import read_events

    return read_events(
        lines,
        cfg.input_kind,
        time_field=cfg.time_field,
        clock=cfg.clock,
        user_field=cfg.user_field,
    )
