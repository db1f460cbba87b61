"""The source stage of a run: the input's records, grouped into the steps to release.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). A batch run reads its
input in chunks (JSON Lines with integer steps through the columnar reader of
:mod:`dpstream.io.jsonl`, the other inputs record by record), counts its invalid records
before the first release (:mod:`dpstream.run.guard`; Parquet in record batches,
:mod:`dpstream.io.parquet`), and yields each step in order:
:class:`Due` (a step to release) or :class:`Rejected` (records for the validate stage
to count: malformed, or past the end step). ``--follow`` has its own source,
:mod:`dpstream.run.follow`. What was read is counted in a :class:`ReadCount`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from .guard import InvalidTally, check_invalid_share, check_not_empty

if TYPE_CHECKING:
    from ..state import RunRecord
    from .config import RunConfig
    from .validate import Validator

__all__ = [
    "Due",
    "ReadCount",
    "Rejected",
    "SourceItem",
    "batch_items",
    "batch_steps",
    "check_finished",
    "input_chunks",
    "input_records",
    "past_message",
    "read_checked",
]


@dataclass(frozen=True)
class Due:
    """Step ``t`` is to be released with these records (a ``StepInput`` or a list);
    ``closed_at``: with ``--follow``, the input line the step closed at (None: the last
    line read)."""

    t: int
    records: Any
    closed_at: int | None = None


@dataclass(frozen=True)
class Rejected:
    """Records the validate stage only counts (or stops at, with ``--on-invalid error``);
    ``past``: the message for records after the end step (or late), else None."""

    records: Any
    past: str | None


SourceItem = Due | Rejected


@dataclass
class ReadCount:
    """The input records read so far, and the input line of the latest one."""

    records: int = 0
    last_line: int = 0

    def take(self, rec: Any) -> Any:
        """Count one record (``--follow``)."""
        self.records += 1
        self.last_line = rec.line
        return rec

    def take_chunk(self, chunk: Any) -> Any:
        """Count one chunk of records (a batch run)."""
        self.records += len(chunk)
        if len(chunk):
            self.last_line = int(chunk.lines[-1])
        return chunk


def _short_int(value: int) -> str:
    """An integer for a message (a time step may have thousands of digits)."""
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


def past_message(t: int, until: int, horizon: int) -> str:
    """Why a record of step ``t`` is not released by a run that ends at ``until``."""
    where = f"time step {_short_int(t)}"
    if until < horizon:
        return f"{where} is after --until {until}"
    return f"{where} is past the horizon --horizon {horizon}"


def input_records(infile: Any, cfg: RunConfig) -> Iterator[Any]:
    """The input's records (``dpstream.io.RawEvent``), in order."""
    from ..io import read_events
    from ..io.lines import line_texts

    if cfg.input_kind == "parquet":
        from ..io.parquet import read_parquet_records

        return read_parquet_records(infile, **_parquet_options(cfg))

    csv_opts = {}
    if cfg.input_kind == "csv":
        csv_opts = dict(
            item_column=cfg.item_column,
            event_column=cfg.event_column,
            time_column=cfg.time_column,
            verbose=cfg.verbose_errors,
        )
    clock = cfg.clock
    return read_events(
        line_texts(infile, cfg.input, ends=cfg.input_kind == "csv"),
        cfg.input_kind,
        time_field=cfg.time_field if clock else None,
        clock=clock,
        implicit=bool(cfg.implicit_time),
        user_field=cfg.user_field,
        **csv_opts,
    )


def input_chunks(infile: Any, cfg: RunConfig) -> Iterator[Any]:
    """The input's records in chunks (``dpstream.io.chunks.Chunk``), in order: JSON Lines
    with integer steps (with or without user ids) through the columnar reader, the other
    inputs (timestamps, CSV, one step per line) record by record."""
    from ..io.chunks import chunks_from_records
    from ..io.jsonl import read_jsonl_chunks

    if cfg.input_kind == "jsonl" and cfg.clock is None and not cfg.implicit_time:
        return read_jsonl_chunks(infile, cfg.input, user_field=cfg.user_field)
    if cfg.input_kind == "parquet":  # ``infile``: the input's path (a file or a directory)
        from ..io.parquet import read_parquet_chunks

        return read_parquet_chunks(infile, **_parquet_options(cfg))
    return chunks_from_records(input_records(infile, cfg))


def _parquet_options(cfg: RunConfig) -> dict[str, Any]:
    """The columns and time mode of a Parquet input (:mod:`dpstream.io.parquet`)."""
    return dict(
        time_column=cfg.time_column,
        item_column=cfg.named_item_column,
        event_column=cfg.event_column,
        time_field=cfg.time_field if cfg.clock is not None else None,
        clock=cfg.clock,
        user_field=cfg.user_field,
    )


def read_checked(
    infile: Any, cfg: RunConfig, *, validator: Validator, start_t: int, until: int
) -> Any:
    """A batch run's whole input, refused (:class:`TooManyInvalidError`, before anything
    is written) when more than --max-invalid of its records are invalid.

    The run reads its input to the end before its first release anyway (the steps wait
    for it). Each chunk is folded into what its steps count as it is read
    (:class:`~dpstream.run.fold.FoldedInput`, to close once the run ends); with
    --implicit-time (a step per record) the chunks are held and returned as a list.
    With --on-invalid error the first invalid record, in the order the run releases (the
    fold keeps it for the step it is in), is raised here, before anything is written.
    """
    import numpy as np

    folded = None if cfg.implicit_time else _folded(cfg, validator, start_t, until)
    chunks: list[Any] = []
    tally = InvalidTally()
    implicit = bool(cfg.implicit_time)
    seen = start_t  # --implicit-time: every record is a step of its own, in input order
    try:
        for chunk in input_chunks(infile, cfg):
            steps = np.arange(seen + 1, seen + len(chunk) + 1) if implicit else None
            seen += len(chunk)
            tally.count_chunk(
                chunk,
                validator=validator,
                start=start_t,
                late=bool(start_t),
                limit=until,
                horizon=cfg.horizon_limit,
                steps=steps,
            )
            if folded is None:
                chunks.append(chunk)
            else:  # folded into what its steps count; the chunk goes
                folded.feed(chunk)
        check_not_empty(tally.records, tally.later, cfg)
        if cfg.on_invalid != "error":  # (which refuses the first invalid record, below)
            check_invalid_share(tally, cfg)
        if folded is not None:
            folded.finish()
        if cfg.on_invalid == "error" and (tally.invalid or tally.later):
            # stop at the first invalid record before anything is written: the whole
            # input is read before the first release anyway (as the Spark engine does)
            error = (
                _first_held_error(chunks, validator, cfg, start_t, until)
                if folded is None
                else folded.first_error()
            )
            if error is not None:
                raise error
    except BaseException:
        if folded is not None:
            folded.close()
        raise
    return chunks if folded is None else folded


def _first_held_error(
    chunks: list[Any], validator: Validator, cfg: RunConfig, start_t: int, until: int
) -> Exception | None:
    """:meth:`~dpstream.run.fold.FoldedInput.first_error` for held chunks (``--implicit-
    time``): each step checked as the run will check it, in order (error mode raises at
    its first invalid record, before any count or statistic changes)."""
    from ..errors import InvalidEventError

    try:
        for item in batch_items(
            _grouped(iter(chunks), cfg, start_t, until), until=until, horizon=cfg.horizon_limit
        ):
            if isinstance(item, Due):
                validator.events(item.records)
            else:
                validator.events(item.records, past=item.past)
    except InvalidEventError as exc:
        return exc
    return None


def _folded(cfg: RunConfig, validator: Validator, start_t: int, until: int) -> Any:
    """The fold of a batch run's input (:mod:`dpstream.run.fold`): its steps' counts
    (with ``--state``, the bytes the input digests hash in a temporary file)."""
    from .fold import FoldedInput, memory_budget

    horizon = cfg.horizon_limit
    return FoldedInput(
        validator,
        horizon=horizon,
        start=start_t,
        until=until,
        past=lambda t: past_message(t, until, horizon),
        digests=bool(cfg.state),
        budget=memory_budget(cfg.memory),
        users=cfg.user_field is not None,
    )


def _drain(chunks: list[Any]) -> Iterator[Any]:
    """The chunks in order, each let go of by the list as it is taken (so that a step's
    chunks can be freed once the steps that use them are released)."""
    chunks.reverse()
    while chunks:
        yield chunks.pop()


def batch_steps(
    infile: Any,
    cfg: RunConfig,
    count: ReadCount,
    *,
    chunks: Any,
    start_t: int,
    until: int,
) -> Iterator[Any]:
    """A batch run's steps (``dpstream.io.chunks.StepInput``, or a folded input's
    :class:`~dpstream.run.fold.FoldedStep`), read lazily: ``chunks`` (the input already
    read by :func:`read_checked`) or the input itself. ``start_t``: the
    step an earlier run released up to (an event of a step up to it is late)."""

    if chunks is not None and not isinstance(chunks, list):  # folded as it was read
        count.records, count.last_line = chunks.records, chunks.last_line
        return chunks.steps()  # type: ignore[no-any-return]
    source = input_chunks(infile, cfg) if chunks is None else _drain(chunks)
    return _grouped(map(count.take_chunk, source), cfg, start_t, until)


def _grouped(chunks: Iterator[Any], cfg: RunConfig, start_t: int, until: int) -> Iterator[Any]:
    """The steps of ``chunks``: a step per record with --implicit-time, else by their
    steps (records past --until rejected without moving the clock, those of steps up to
    ``start_t`` late)."""
    from ..io.grouping import implicit_steps, step_steps

    if cfg.implicit_time:  # every line is a step: record by record
        return implicit_steps(chunks, start=start_t)
    late = (
        "time step {t} was already released by an earlier run (a late event)" if start_t else None
    )  # events of steps an earlier run released
    return step_steps(chunks, cfg.horizon_limit, start=start_t, late_message=late, limit=until)


def batch_items(
    steps: Iterable[Any], *, until: int, horizon: int
) -> Generator[SourceItem, None, None]:
    """The batch run's steps in order, as :class:`Due` and :class:`Rejected` items.

    Records past the end come out as they are read; they are rejected after the steps
    are released, where they stand in an input in time order (their lines and errors
    only: the rest is freed)."""
    beyond: list[Any] = []
    for step in steps:
        if step.t is None:  # malformed records after the last step
            yield Rejected(step, None)
        elif step.t > until:
            beyond.append(
                replace(
                    step,
                    items=[],
                    codes=step.codes[:0],
                    offsets=step.offsets[:1],
                    raw=b"",
                    lines=step.lines[:0],
                    lengths=step.lengths[:0],
                )
            )
        else:
            yield Due(step.t, step)
    for step in beyond:
        yield Rejected(step, past_message(step.t, until, horizon))


def check_finished(record: RunRecord, infile: Any, cfg: RunConfig) -> None:
    """Refuse (exit status 1) a finished run whose input has grown since it finished.

    A finished run never releases again, so events appended to its input
    later would otherwise be ignored without a word.
    """
    read = (record.summary or {}).get("input_records")
    if not isinstance(read, int):  # a state written before the count was recorded
        return
    for count, rec in enumerate(input_records(infile, cfg), 1):
        if count > read:
            raise StateError(
                f"the run in {cfg.state} finished after step {record.last_t}, but the "
                f"input has records after the ones it read (from input line {rec.line}): a "
                "finished run never releases again; release new events as a new stream "
                "(a new key and a new state file)"
            )
