"""The stages of ``dpstream run``, run in order for every step of the public clock.

Layer 6 of dpstream (the run's pipeline). :func:`run_steps` takes the stages the
command opened (:class:`Stages`) and, for each item of the source stage
(:mod:`dpstream.run.source`, or :mod:`dpstream.run.follow`), runs them in order::

    source -> validate and bound (validate) -> mechanism (step_batch)
           -> post-process (publish) -> format -> sink (ledger, state, output)
           -> report (progress)

then releases every step left up to the end step (the release clock is public: a
step with no event is released like any other) and ends the batch in the state.
No stage calls back into another: each returns what the next one takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .follow import follow
from .publish import public_release
from .report import Progress, RunStats
from .scope import ledger_precheck
from .sink import Sink
from .source import Due, ReadCount, SourceItem, batch_items, batch_steps

if TYPE_CHECKING:
    from ..ledger import ReleaseLedger
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..state import Checkpoint, StateDigests
    from .config import RunConfig
    from .validate import Validator

__all__ = ["Stages", "run_steps"]


@dataclass
class Stages:
    """What the command opened for the pipeline: the mechanism (and its readable-counts
    post-processing ``publish``, in the state that goes with it), the formatter, the
    validator, the sink, and the summary's counts."""

    mech: ContinualMechanism
    publish: Any
    formatter: Any
    validator: Validator
    sink: Sink
    stats: RunStats
    public_meta: tuple[str, ...]

    def release(
        self, t: int, records: Any, cfg: RunConfig, count: ReadCount, closed_at: int | None = None
    ) -> None:
        """Step ``t`` through every stage after the source (``closed_at``: the input line
        it closed at, else the last line read)."""
        from ..io.chunks import records_step
        from ..mechanisms.columns import EventColumns
        from .fold import FoldedStep

        step: Any
        if isinstance(records, FoldedStep):  # checked as it was read (run.fold)
            step, events = records, records.valid_events()
        else:
            step = records if hasattr(records, "codes") else records_step(t, list(records))
            events = self.validator.events(step)
        mech = self.mech
        batch = (
            events.events()
            if isinstance(events, EventColumns) and not mech.accepts_columns
            else events
        )
        rel = public_release(mech.step_batch(batch), self.public_meta, self.publish, cfg)
        line = self.formatter.format(rel)
        self.stats.steps += 1
        self.stats.events += len(events)
        self.stats.last_items = len(rel.items)
        self.sink.write(
            t, step, line, last_line=count.last_line if closed_at is None else closed_at
        )


def run_steps(
    infile: Any,
    cfg: RunConfig,
    stages: Stages,
    *,
    until: int,
    start_t: int,
    chunks: Any,
    ledger: ReleaseLedger | None,
    digests: StateDigests,
    key: NoiseKey,
) -> None:
    """Release every step start_t+1..until; replay (with digest checks) the steps already
    on record. ``start_t``: the step an earlier run's saved mechanism stopped at.
    ``chunks``: a batch run's input, already read (:func:`~dpstream.run.source.read_checked`:
    folded, or chunks).
    ``ledger``: every step is checked against it and appended to it before the state
    records it; when the state is behind it, a batch run checks the input of the steps it
    holds before anything is written."""
    sink, count = stages.sink, ReadCount()
    if sink.resume is None and start_t == 0:
        sink.write_header(stages.formatter.header())
    resume_t = sink.resume_t
    no_end = cfg.horizon is None and cfg.until is None  # (a follower with no planned end)
    total = None if no_end else until
    progress = Progress(total, enabled=not cfg.quiet, every=cfg.progress_every, start_t=resume_t)
    with progress:
        source = _open_source(
            infile, cfg, stages, count, until=until, start_t=start_t, chunks=chunks,
            ledger=ledger, digests=digests,
        )  # fmt: skip
        with contextlib.closing(source):
            for item in source:
                if isinstance(item, Due):
                    stages.release(item.t, item.records, cfg, count, item.closed_at)
                    progress.update(item.t, stages.stats.events, stages.stats.skipped)
                else:
                    stages.validator.events(item.records, past=item.past)
        for t in range(stages.mech.t + 1, until + 1):  # the public clock: every step to the end
            stages.release(t, [], cfg, count)
            progress.update(t, stages.stats.events, stages.stats.skipped)
    stats = stages.stats
    summary: dict[str, Any] = {
        "steps": stats.steps,
        "events": stats.events,
        "truncated": stats.truncated,
        "skipped": stats.skipped,
        "occurrences": stats.occurrences,
        "dropped_occurrences": stats.dropped,
        "last_t": int(stages.mech.t),
        "input_records": count.records,
    }
    rules = None if cfg.clock is None else cfg.clock.zone_rules_digest(until)
    if rules is not None:  # the next run checks that these steps stay where they were
        summary["zone_rules"] = {"through": until, "digest": rules}
    sink.end_batch(
        until=until,
        horizon=cfg.horizon_limit,
        mech=stages.mech,
        publish=stages.publish,
        key=key,
        summary=summary,
    )


def _open_source(
    infile: Any,
    cfg: RunConfig,
    stages: Stages,
    count: ReadCount,
    *,
    until: int,
    start_t: int,
    chunks: Any,
    ledger: ReleaseLedger | None,
    digests: StateDigests,
) -> Generator[SourceItem, None, None]:
    """The source stage, and this run's batch recorded in the state once the ledger has
    checked what it must (a batch run whose state is behind the ledger checks the input
    of the steps the ledger holds first, before anything is written)."""
    sink = stages.sink
    resume_t = sink.resume_t
    if cfg.follow:  # each step checked by the ledger as it is released
        sink.begin_batch()
        return follow(
            infile,
            cfg,
            count,
            first_t=stages.mech.t + 1,
            until=until,
            boundary=_boundaries(sink.ckpt, digests, start_t, resume_t),
            recorded_cut=_recorded_cut(ledger, digests, resume_t),
        )
    steps = batch_steps(infile, cfg, count, chunks=chunks, start_t=start_t, until=until)
    if ledger is not None and ledger.last_t > max(resume_t, start_t):
        steps = ledger_precheck(
            steps,
            ledger,
            digests,
            cfg,
            after=max(resume_t, start_t),
            through=min(ledger.last_t, until),
        )
    sink.begin_batch()
    return batch_items(steps, until=until, horizon=cfg.horizon_limit)


#: The most prefixes of a step's records :func:`_recorded_cut` tries (events for the step
#: that came while the run was stopped, at most): a bound on a resume's work.
_MAX_LATE_TRIED = 4096


def _recorded_cut(
    ledger: ReleaseLedger | None, digests: StateDigests, resume_t: int
) -> Callable[[int, list[Any]], int | None] | None:
    """For ``--follow``: where a step the release ledger holds but the state does not (a
    run stopped between the two records) closed, found from its records: the line of the
    last record of the longest run of them, in input order, whose digest is the ledger's
    (0: none of them), or None when the ledger does not hold the step or no run matches
    (then the ledger refuses the step, as before). Records read after it (events that
    came while the run was stopped) are then late, as they were for the run that
    released the step. The step is built once; each prefix's digest is taken over
    slices of its columns, longest first, at most :data:`_MAX_LATE_TRIED` of them."""
    if ledger is None:
        return None
    from ..io.chunks import records_step

    def cut(t: int, records: list[Any]) -> int | None:
        if t <= resume_t or ledger.entry(t) is None:
            return None
        ordered = sorted(records, key=lambda r: r.line)
        step = records_step(t, ordered)
        lines, lengths, ends = step.lines, step.lengths, step.raw_ends()
        n = lines.size
        for j in range(n, max(n - _MAX_LATE_TRIED, 0) - 1, -1):
            raw = step.raw[: int(ends[j - 1])] if j else b""
            if ledger.same(t, digests.step_input(t, lines[:j], lengths[:j], raw)):
                return int(lines[j - 1]) if j else 0
        return None

    return cut


def _boundaries(
    ckpt: Checkpoint | None, digests: StateDigests, start_t: int, resume_t: int
) -> dict[int, int]:
    """The input line each step on record closed at (``--follow``: a resumed run closes
    them there again)."""
    if ckpt is None:
        return {}
    boundary = {}
    for t in range(start_t + 1, resume_t + 1):
        step = ckpt.step(t)
        assert step is not None  # every step up to the last on record is on record
        boundary[t] = step.input_line ^ digests.mask(t)
    return boundary
