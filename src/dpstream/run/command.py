"""``dpstream run``: read events, release every step of a public clock, checkpoint each step.

Layer 6 of dpstream (the run command). :func:`cmd_run` builds the run's
:class:`~dpstream.run.config.RunConfig`, resolves what the stream on record decides
(:mod:`dpstream.run.record`), builds the mechanism and the stages, opens the input,
the state, the release ledger and the output in the order that keeps every kill
resumable, and hands them to :mod:`dpstream.run.pipeline` (docs/architecture.md).

The release clock is public
---------------------------
Which steps a run releases never depends on the data: a run releases every
step 1..T (``--horizon``), or 1..N with ``--until N`` (a public end step, for a
stream that is still going: a later run with the same ``--state`` and a later
``--until`` continues it). Steps in which no event happened are released like
any other, including every step after the last event. Otherwise the number of
output lines, or whether a last step exists, would tell whether one event was
there (a neighbouring input would release one step fewer).

With ``--on-invalid skip`` (the default) an invalid record (an oversized
event, an item outside ``--domain``, a malformed line, a step past the end) is
dropped and counted for the operator; the releases are the same as if it had
never been in the input, so they still follow the public clock. With
``--on-invalid error`` a batch run, which reads its input before its first
release, refuses its first invalid record (in the order it releases) before
anything is written; ``--follow`` stops at it as it comes: the steps written
before it are complete and resumable, but publishing a halted run's output
reveals where the bad record was. Messages never quote an item or a
record's content unless ``--verbose-errors`` is given. A batch run counts its
invalid records before its first release, and when more than ``--max-invalid``
of them are invalid (a typo in ``--time-field`` or ``--step``) it writes nothing
(:mod:`dpstream.run.guard`): the operator's decision on the raw data, like
``--on-invalid error``.

State and resume
----------------
With ``--state``, every step is recorded in the SQLite checkpoint
(:mod:`dpstream.state`) *before* its release is written, with keyed digests of
its input and of its release. A killed run resumes where it stopped and writes
exactly what an uninterrupted run writes; a resumed run whose input changed in
any step already written is refused (the same noise on other data would
publish the difference of the true counts). Every step also goes into the
release ledger (:mod:`dpstream.ledger`) before the state records it, so a
state restored from a backup cannot release a step again from other input.
Every run, with a state or without, also records its noise scope in the
ledger before its first release, and a new run (a new state, or none) whose
scope another run already released under is refused before anything is
written: it would draw the same noise from other data (a deleted state, or a
second run without one). A new run refuses an output file that already holds
releases (``--overwrite`` replaces it; ``--force`` overrides both: the
operator's word that the earlier release was never published). A run holds
its output's lock from before it opens its state to its last write
(:mod:`dpstream.run.lock`): a second run writing the same file is refused
before it records anything in the ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from ..errors import InvalidEventError, StateError
from ..ledger import BudgetCapError, LedgerError, ReleaseLedger
from ..logs import setup_logging
from ..registry import MECHANISMS, make_postprocessor
from .budget import run_cap, run_spend, sidecar_budget
from .config import RunConfig
from .guard import TooManyInvalidError
from .lock import output_lock, regular_or_new
from .mechanism import build_run_mechanism, make_validator
from .on_spark import run_on_spark
from .options import domain_option
from .output import (
    Resume,
    check_new_output,
    check_paths,
    closing_quietly_on_error,
    open_output,
    release_formatter,
)
from .pipeline import Stages, run_steps
from .record import (
    GoOn,
    check_until,
    domain_sha256,
    go_on,
    input_mac,
    noise_version_of,
    open_run,
    recorded_tree_base,
)
from .report import RunStats, log_summary
from .scope import new_run_scope, noise_scope, open_ledger
from .sink import BatchStart, Sink
from .source import check_finished, read_checked

if TYPE_CHECKING:
    from ..budget import DatasetSpend
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..privacy import BudgetCap
    from ..state import Checkpoint, RunRecord, StateDigests
    from .validate import Validator

__all__ = ["cmd_run", "load_key", "run_config"]

_log = logging.getLogger("dpstream.run")


def load_key(cfg: RunConfig) -> NoiseKey:
    """The key of ``--key-file``, refused when other users may read it (unless overridden)."""
    from ..noise import NoiseKey
    from ..state import check_private_file

    path = str(cfg.key_file)
    if not cfg.allow_readable_key:
        check_private_file(path, "key file", flag="--allow-readable-key")
    return NoiseKey.load(path)


@dataclass
class _Built:
    """What a run builds before it opens a file: the mechanism and the stages around it."""

    mech: ContinualMechanism
    publish: Any
    formatter: Any
    parquet: Any
    validator: Validator
    stats: RunStats
    scope: str
    domain_sha256: str | None
    free_ledger: ReleaseLedger | None
    spend: DatasetSpend
    cap: BudgetCap | None


@dataclass
class _Opened:
    """The state of a run and what it says: the record resumed or the new run to record,
    the release ledger, and where the stream goes on from."""

    ckpt: Checkpoint | None = None
    ledger: ReleaseLedger | None = None
    new_run: dict[str, str] | None = None
    allow: frozenset[str] = frozenset()  # run ids kills left in the state
    resume: Resume | None = None
    go_on: GoOn | None = None
    done: bool = False  # nothing to do: every step asked for is released already
    behind: int | None = None  # the ledger's last step, past this batch's --until


def cmd_run(args: argparse.Namespace) -> int:
    """``dpstream run``: returns the exit status."""
    cfg = RunConfig.from_args(args)
    setup_logging(cfg.log_format, quiet=cfg.quiet)
    until = cfg.last_step  # a stream without an end step is refused first
    check_paths(cfg)
    if cfg.lateness and not cfg.follow and cfg.engine == "local":  # a warning, not a
        _log.warning(  # refusal: a stream begun with it goes on with it
            "--lateness is how long a followed step stays open after its window: without "
            "--follow it changes nothing (a batch run counts every event in its own step, "
            "however late), but a stream begun with it keeps it in its state"
        )
    if cfg.engine == "local" and not cfg.state and until < cfg.horizon_limit:
        _log.warning(
            f"--until {until} without --state: the steps after {until} can never be "
            "released on this stream (a later run of its key and settings is refused, "
            "and its noise state is not kept); give --state FILE to go on later"
        )
    elif cfg.engine == "spark" and until < cfg.horizon_limit:  # (review 114: unsaid)
        _log.warning(
            f"--until {until} on Spark: the steps after {until} can never be released on "
            "this stream (a later run of its key and settings is refused; a Spark run "
            "keeps no state): a stream that goes on runs on the local engine with --state"
        )
    if cfg.clock is not None and not cfg.follow:  # (both engines: review 104)
        _warn_open_steps(cfg, until)
    return run_config(cfg, load_key(cfg))


def _warn_open_steps(cfg: RunConfig, until: int) -> None:
    """A batch run with a clock that releases steps whose windows have not ended yet
    (review 87): an event that comes for them later is late for the next batch (it is
    dropped), so warn, naming the last step that has ended. (Only a warning: the clock
    is public, and a batch may be meant to close its steps early.)"""
    import datetime as _dt

    clock = cfg.clock
    assert clock is not None
    now = _dt.datetime.now(_dt.timezone.utc)
    last = min(until, cfg.horizon_limit)
    try:
        if clock.end_of(last) <= now:
            return
        ended = clock.step_of(now) - 1  # the last step whose window has ended
    except (OverflowError, ValueError):  # a step past the year 9999: far from ended
        ended = None
    if cfg.until is not None:  # (without it, the run finishes a stream whose horizon
        _refuse_unbegun_steps(cfg, last, now, ended)  # may be ahead: warned, as before)
    upto = f"; the last step that has ended is {ended}" if ended is not None else ""
    _log.warning(
        f"this batch releases steps up to {last}, and the windows of the last ones have "
        f"not ended yet{upto}: an event that comes for them later is late for the next "
        "batch (dropped), so give --until the last step that has ended (or --follow)"
    )


def _refuse_unbegun_steps(cfg: RunConfig, last: int, now: Any, ended: int | None) -> None:
    """Refuse an ``--until`` whose step has not begun yet, on both engines (review 102:
    ``--until 20260302``, a date for a step number, began releasing 20 million empty
    hourly steps, whose later events would be late for ever; review 104: Spark too).
    No event can have come for a step whose window has not begun, so closing it early
    is never meant; a step begun and not ended (the current one) is a warning."""
    clock = cfg.clock
    assert clock is not None
    try:
        begun = clock.start_of(last) <= now
    except (OverflowError, ValueError):  # a step past the year 9999
        begun = False
    if begun:
        return
    current = f"; the last step that has ended is {ended}" if ended is not None else ""
    raise ValueError(
        f"--until {cfg.until} names a step whose window has not begun yet{current}: those "
        "steps would be "
        "released empty, and any event of them late for ever. Give --until a step that "
        "has ended (a step number on the clock of --start and --step)"
    )


def run_config(
    cfg: RunConfig, key: NoiseKey, *, on_summary: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Run the stream of ``cfg`` (checked, its paths too) with its ``key``: the body of
    ``dpstream run`` after the flags are read, shared by :func:`dpstream.release_frame`
    so that a frame gives the command's releases. Returns the exit status.
    ``on_summary`` is given the counts of the summary's invalid events (``skipped``,
    ``truncated``, ``skipped_by_reason``: as private as the input, for the caller): on
    the local engine once a batch's input is read, before its first release (its counts
    are final then; a callback that raises releases nothing), at the end on Spark."""
    until = cfg.last_step
    cfg = cfg.with_options(noise_version=noise_version_of(cfg.options()))
    if cfg.engine == "spark":
        return run_on_spark(cfg, key, on_summary=on_summary)
    with output_lock(str(cfg.output)):  # before the state, the output and the ledger
        viewer = _run_local(cfg, key, until, on_summary)
    if viewer is not None:
        from ..view.command import after_run

        after_run(viewer)
    return 0


def _run_local(
    cfg: RunConfig, key: NoiseKey, until: int, on_summary: Callable[[dict[str, Any]], None] | None
) -> Any:
    """The local run of :func:`run_config`, holding its output's lock
    (:mod:`dpstream.run.lock`): returns the live view to follow, or None."""
    tree_base = recorded_tree_base(cfg)
    if tree_base is not None:  # a tree stream goes on with the tree
        cfg = cfg.with_options(base=tree_base)
        _log.debug(
            f"--mechanism unknown: going on with the tree counter (base {tree_base}) "
            "of the stream on record; pass --counter blt only for a new stream"
        )
    built = _build(cfg, key)
    from ..state import StateDigests

    digests = StateDigests(key)
    viewer = None
    state_existed = bool(cfg.state) and os.path.exists(str(cfg.state))
    with contextlib.ExitStack() as stack:
        infile = _open_input(cfg, stack)  # before the output: a missing input truncates nothing
        opened = _open_state(cfg, key, built, infile, until, digests, stack, state_existed)
        if opened.done:
            return None
        viewer = _release(
            cfg, key, built, opened, infile, until, digests, stack, state_existed, on_summary
        )
    log_summary(built.stats, built.mech, cfg)
    return viewer


def _build(cfg: RunConfig, key: NoiseKey) -> _Built:
    """The mechanism, its noise scope (checked in the ledger now when the run has no
    state), the formatter and the validator: nothing opened yet but a Parquet file."""
    domain = domain_option(cfg.options())
    mech, stream = build_run_mechanism(cfg, key, domain)
    scope = noise_scope(mech, stream)
    spend, cap = run_spend(cfg, mech), run_cap(cfg)  # its cost on its dataset, and the cap
    free_ledger = None  # a run without a state: a new run, checked before anything (a
    if not cfg.state:  # Parquet file) is made; its one line comes before its release
        free_ledger = new_run_scope(cfg, key, scope, own="", budget=spend, cap=cap)[0]
        free_ledger.close()
    # readable counts (--clamp, --monotone): post-processing whose state (the values
    # published so far) is replayed with the steps, or saved with the mechanism
    publish = make_postprocessor(cfg.options())
    formatter, parquet = release_formatter(cfg, mech)
    if cfg.view and (cfg.output == "-" or cfg.output_kind != "jsonl"):
        raise ValueError("--view needs --output FILE in JSON Lines (the page follows the file)")
    stats = RunStats()
    validator = make_validator(cfg, mech, domain, key, stream, stats)
    # the domain lives on in the mechanism's compact table (the validator reads it); its
    # list of str objects (~100 bytes an item) goes now
    fingerprint = domain_sha256(domain)
    del domain
    return _Built(
        mech=mech,
        publish=publish,
        formatter=formatter,
        parquet=parquet,
        validator=validator,
        stats=stats,
        scope=scope,
        domain_sha256=fingerprint,
        free_ledger=free_ledger,
        spend=spend,
        cap=cap,
    )


def _open_input(cfg: RunConfig, stack: contextlib.ExitStack) -> Any:
    """The input, closed with the run (stdin itself is left open); a Parquet input is its
    path (a file or a directory, read in record batches by the source stage)."""
    from ..io import open_input

    if cfg.input_kind == "parquet":
        from ..io.parquet import parquet_files

        parquet_files(cfg.input)  # a missing input (or an empty directory) truncates nothing
        return cfg.input

    if cfg.follow and cfg.input != "-" and stat.S_ISFIFO(_mode(cfg.input)):
        infile = _open_fifo(cfg.input)
    else:
        infile = open_input(cfg.input)
    if cfg.input != "-":
        stack.callback(infile.close)
    elif infile is not sys.stdin and isinstance(infile, io.TextIOWrapper):
        # a decoding wrapper (always, when it is not stdin): leave stdin itself open
        stack.callback(infile.detach)
    return infile


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _open_fifo(path: str) -> Any:
    """A named pipe to follow, opened without waiting for a writer (an open for reading
    waits for one, and the steps due meanwhile would not be released on time)."""
    from ..io.records import text_stream

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return text_stream(open(fd, "rb"))  # noqa: SIM115 - closed with the run


def _forget_new_state(cfg: RunConfig, ckpt: Checkpoint, state_existed: bool) -> None:
    """Remove a state file this run made just now, when it is refused before a release."""
    if not state_existed:
        ckpt.close()
        with contextlib.suppress(OSError):
            os.unlink(str(cfg.state))


def _open_state(
    cfg: RunConfig,
    key: NoiseKey,
    built: _Built,
    infile: Any,
    until: int,
    digests: StateDigests,
    stack: contextlib.ExitStack,
    state_existed: bool,
) -> _Opened:
    """Open ``--state`` and check this run against the run on record (and the ledger):
    resume it, go on from its snapshot, or record a new run once the output is open."""
    from ..state import Checkpoint

    opened = _Opened()
    if not cfg.state:
        return opened
    ckpt = opened.ckpt = Checkpoint(
        cfg.state, fsync=cfg.fsync, allow_readable=cfg.allow_readable_state
    )
    stack.callback(ckpt.close)
    record, opened.new_run = open_run(ckpt, cfg, built.mech, built.domain_sha256, key)
    if record is not None and _nothing_to_do(cfg, ckpt, record, infile, until, digests):
        opened.done = True
        return opened
    if record is not None:
        opened.go_on = go_on(ckpt, record, cfg, key, digests)
        if opened.go_on is not None:
            # the noise scope the stream draws under is its snapshot's, which a newer
            # dpstream may word otherwise for a new stream (the domain in top-k's
            # scope, say): the ledger must know the stream by the one it recorded,
            # else it counts the stream's budget a second time
            built.scope = noise_scope(opened.go_on.mechanism, built.scope)
        if opened.go_on is not None and opened.go_on.continues:
            # a later batch is marked as begun before it waits for the ledger's lock (and
            # the key registry's): killed while it waited (a backup holding the ledger,
            # a timeout), it left no mark, and the next day's command released the
            # killed day's steps without its events (review 110); only such a batch is
            # marked (:func:`_mark_batch`)
            marked = _mark_batch(cfg, opened, digests)
            if marked is not None:  # a run stopped by an error before its first release
                stack.push(_unmark_on_error(ckpt, marked))  # leaves no mark
        opened.ledger = open_ledger(
            cfg, key, ckpt, record, scope=built.scope, budget=built.spend, cap=built.cap
        )
        stack.callback(opened.ledger.close)
        if until < opened.ledger.last_t:  # the state is behind the ledger (a kill, a backup)
            # a batch that ends below the ledger's steps goes on only if its input ends
            # there too (checked once it is read): the earlier batches replayed in order,
            # each with its own input and --until, give the releases on record (review
            # 109: a state restored two batches behind was stuck for good)
            opened.behind = opened.ledger.last_t
            if cfg.follow:
                raise LedgerError(_behind_ledger(cfg, until, opened.ledger))
        if opened.go_on is not None:
            built.mech = built.formatter.mech = opened.go_on.mechanism
            built.publish = opened.go_on.publish
        if opened.go_on is None or not opened.go_on.continues:
            opened.resume = Resume(last_t=record.last_t, begin=record.last_begin)
        built.stats.resumed_at = record.last_t
    if opened.new_run is not None:  # its ledger is opened once the run is recorded
        try:
            first, opened.allow = new_run_scope(
                cfg,
                key,
                built.scope,
                own=ckpt.run_id(),
                replaced=ckpt.replaced_runs(),
                budget=built.spend,
                cap=built.cap,
            )
        except LedgerError:
            _forget_new_state(cfg, ckpt, state_existed)
            raise
        try:
            if opened.allow and not (cfg.force or cfg.replace_unfinished):
                _refuse_other_first_input(cfg, ckpt, first, opened.allow)
        finally:
            first.close()
    if cfg.output == "-" and opened.resume is not None:
        _log.info(
            f"note: with --output - the release of step {opened.resume.last_t} "
            "is printed again on resume (the same bytes); write to a file for "
            "exactly-once output"
        )
    return opened


def _behind_ledger(cfg: RunConfig, until: int, ledger: ReleaseLedger) -> str:
    """Why a batch may not end at ``until``, below the ledger's steps, with its input
    going on past it."""
    return (
        f"--until {until} is before step {ledger.last_t}, which the release ledger "
        f"{ledger.path} records as released for the stream in {cfg.state} (after the state "
        "was saved: a kill between the two, or a state restored from a backup), and this "
        "input holds records past it: run each batch again in order, each with its own "
        f"input and --until, up to step {ledger.last_t} (a batch that ended inside its "
        "input could never be followed: the rest of that input would be released from "
        "another batch, which the ledger refuses)"
    )


def _refuse_other_first_input(
    cfg: RunConfig, ckpt: Checkpoint, ledger: ReleaseLedger, allow: frozenset[str]
) -> None:
    """Refuse, before anything is written, a new run from another input than the one
    the state's run read, when the ledger holds that run's step 1 (review 101: killed
    between the ledger's record of step 1 and the state's, then given the next day's
    command, the stream began again from the next day's input and the first day's
    events could never count). The same input goes on (the ledger then checks step 1
    against its digest); ``--replace-unfinished`` gives those events up."""
    from ..io import resolve_path

    record = ckpt.load()
    if record is None or record.steps or not record.input:
        return
    recorded = max(ledger.last_of(run) for run in allow)
    if recorded and record.input != resolve_path(cfg.input):
        raise LedgerError(
            f"the stream's first run (reading {record.input!r}) was killed after the "
            f"release ledger {ledger.path} recorded its step 1, before the state "
            f"{cfg.state} did: run it again with that input first, so that its events "
            "count; to give them up (that step was never written), add --replace-unfinished"
        )


def _check_finished_input(
    cfg: RunConfig, ckpt: Checkpoint, record: RunRecord, digests: StateDigests
) -> None:
    """Refuse a finished stream given a file none of its runs read (a next day's file,
    say): it would exit 0 and count nothing, silently (review 87). The same command
    again (an input it read) has nothing to do, as before."""
    mac = input_mac(cfg, digests)
    batches = ckpt.batches()
    read = [b for b in batches if b[2] is not None]
    if mac is None or not read or any(b[2] == mac for b in batches):
        return
    raise StateError(
        f"the stream in {cfg.state} finished after step {record.last_t}, and this input "
        f"is not one its runs read (its last read {read[-1][1]!r}): a finished stream "
        "never releases again; release new events as a new stream (a new key and a new "
        "state file)"
    )


def _nothing_to_do(
    cfg: RunConfig,
    ckpt: Checkpoint,
    record: RunRecord,
    infile: Any,
    until: int,
    digests: StateDigests,
) -> bool:
    """Whether the run on record has released every step this run asks for (logged)."""
    if record.finished:
        check_finished(record, infile, cfg)  # an input that grew: its first new line
        _check_finished_input(cfg, ckpt, record, digests)
        _log.info(
            f"the run in {cfg.state} finished at {record.finished} "
            f"({record.steps} steps released); nothing to do: a step is never "
            "released twice"
        )
        return True
    if check_until(ckpt, record, until, cfg, digests):
        source, late = " from this input", ""
        if cfg.follow:  # the file may have grown: what came for those steps since is late
            source = ""
            late = (
                " (an event for those steps that came since is late: the next batch "
                "counts it as skipped)"
            )
        _log.info(
            f"the run in {cfg.state} has released every step up to --until {until}{source} "
            f"already; nothing to do: a step is never released twice{late}"
        )
        return True
    return False


def _release(
    cfg: RunConfig,
    key: NoiseKey,
    built: _Built,
    opened: _Opened,
    infile: Any,
    until: int,
    digests: StateDigests,
    stack: contextlib.ExitStack,
    state_existed: bool,
    on_summary: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Check the input and the output, write the sidecar, open the output, record a new
    run, and run the pipeline. Returns the live view, or None."""
    ckpt = opened.ckpt
    if built.free_ledger is not None:  # checked again when its one line is appended
        opened.ledger = built.free_ledger
        opened.ledger.reopen()
        stack.callback(opened.ledger.close)
    if (opened.new_run is not None or ckpt is None) and built.parquet is None:
        try:
            check_new_output(cfg, built.formatter.header())  # (parquet: checked when built)
        except StateError:
            if ckpt is not None:  # a state file made just now goes (nothing was released)
                _forget_new_state(cfg, ckpt, state_existed)
            raise
    chunks = _read_input(cfg, built, opened, infile, until, state_existed)
    if chunks is not None and not isinstance(chunks, list):  # its temporary file goes
        stack.callback(chunks.close)
    if opened.behind is not None and built.stats.reasons.get("after --until", 0):
        assert opened.ledger is not None  # (behind: read off the ledger)
        raise LedgerError(_behind_ledger(cfg, until, opened.ledger))
    if on_summary is not None and chunks is not None:  # a batch: its counts are final
        st = built.stats
        on_summary(
            {
                "skipped": st.skipped,
                "truncated": st.truncated,
                "skipped_by_reason": dict(st.reasons),
            }
        )
    budget = _dataset_budget(cfg, key, built, opened, state_existed)  # the cap, again
    # a resumed output is checked (missing, changed) before its sidecar is touched; a new
    # one gets its sidecar first, so that a reader of the output always finds it
    resumed = opened.resume is not None or (opened.go_on is not None and opened.go_on.continues)
    out = _open_out(cfg, built, opened, digests, stack) if resumed else None
    if cfg.output != "-" and regular_or_new(str(cfg.output)):  # not beside a pipe or a
        _write_sidecar(cfg, built.mech, budget)  # device: the run's public metadata
    if out is None:
        out = _open_out(cfg, built, opened, digests, stack)
    viewer = None
    if cfg.view:
        from ..view.command import start_run_view

        viewer = start_run_view(cfg.output)
        stack.push(viewer.stop_on_error)
    if ckpt is not None and opened.new_run is not None:  # recorded once the output is open
        ckpt.start(**opened.new_run, replace=True)
        opened.ledger = open_ledger(
            cfg,
            key,
            ckpt,
            None,
            scope=built.scope,
            check_scope=not cfg.force,
            allow=opened.allow,
            budget=built.spend,
            cap=built.cap,
        )
        stack.callback(opened.ledger.close)
    start_t, start_offset = (
        (opened.go_on.t, opened.go_on.offset) if opened.go_on is not None else (0, 0)
    )
    resume = opened.resume
    sink = Sink(
        out,
        cfg,
        ckpt=ckpt,
        ledger=opened.ledger,
        digests=digests,
        resume=resume,
        offset=resume.begin if resume is not None else start_offset,
        **_batch(cfg, ckpt, resume, built.mech, digests),
    )
    stages = Stages(
        mech=built.mech,
        publish=built.publish,
        formatter=built.formatter,
        validator=built.validator,
        sink=sink,
        stats=built.stats,
        public_meta=MECHANISMS[cfg.mechanism].public_meta,
    )
    run_steps(
        infile, cfg, stages, until=until, start_t=start_t, chunks=chunks,
        ledger=opened.ledger, digests=digests, key=key,
    )  # fmt: skip
    return viewer


def _mark_batch(cfg: RunConfig, opened: _Opened, digests: StateDigests) -> int | None:
    """Record, before a later batch of a stream waits for its ledger and reads its input,
    that it began: a batch killed while waiting or reading (the long part of a batch)
    leaves this mark, and the next run
    given another input (another file, or the same file with other bytes) is refused,
    since it would release the killed batch's steps without its events, which could
    then never count (late). Given the same input it
    takes the mark's place, as with ``--replace-unfinished`` (the operator gives those
    events up). Stdin is one input to this check: it cannot tell two of them apart.
    Returns the mark's batch number (None: no mark, as for a first batch, whose run is
    recorded once its output is open, a ``--follow`` run, recorded as it starts, and a
    run that finishes or replays steps on record)."""
    from ..io import resolve_path

    ckpt = opened.ckpt
    if ckpt is None or opened.new_run is not None or cfg.follow or opened.resume is not None:
        return None
    batches = ckpt.batches()
    last = batches[-1] if batches else None
    released = ckpt.last_step()
    this = resolve_path(str(cfg.input))
    mac = input_mac(cfg, digests)  # (the digest go_on took of this file: kept)
    if last is not None and last[4] is None:
        if last[3] <= released:  # it released steps: this run finishes them
            return None
        same = last[2] == mac if None not in (last[2], mac) else last[1] == this
        if not same and not cfg.replace_unfinished:
            raise StateError(
                f"the last run of the stream in {cfg.state} (reading {last[1]!r}, from "
                f"step {last[3]}) stopped before it released a step, so its events are "
                "not counted yet: run it again with that input first, then this one "
                "(this run would release its steps without them, and they would then "
                "come too late); to give its events up, add --replace-unfinished"
            )
    return ckpt.begin_batch(input=this, input_mac=mac, first_t=released + 1)


def _unmark_on_error(ckpt: Any, n: int) -> Callable[..., bool]:
    """An exit callback: a run that stops on an error (a refusal, a bad input) before its
    first release leaves no mark (the state as it found it); a kill leaves it."""

    def unmark(exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is not None and issubclass(exc_type, Exception):
            with contextlib.suppress(Exception):
                ckpt.drop_batch(n)
        return False

    return unmark


def _read_input(
    cfg: RunConfig, built: _Built, opened: _Opened, infile: Any, until: int, state_existed: bool
) -> Any:
    """A batch run: its input, read, checked (--max-invalid; --on-invalid error stops at
    the first invalid record, in the order the run releases) and folded into its steps'
    counts before a release, so either refusal comes before anything is written; None
    for --follow (read as released)."""
    if cfg.follow:
        return None
    start_t = opened.go_on.t if opened.go_on is not None else 0
    try:
        return read_checked(infile, cfg, validator=built.validator, start_t=start_t, until=until)
    except (TooManyInvalidError, InvalidEventError):
        if opened.ckpt is not None:  # a state file made just now goes
            _forget_new_state(cfg, opened.ckpt, state_existed)
        raise


def _dataset_budget(
    cfg: RunConfig, key: NoiseKey, built: _Built, opened: _Opened, state_existed: bool
) -> dict[str, Any] | None:
    """The dataset's budget for the sidecar, its cap checked once more right before the
    first file is written (a new state made now is removed when the cap refuses)."""
    ckpt = opened.ckpt
    run_id = (  # the run's own, whose budget line names a going stream's dataset
        opened.ledger.run_id
        if opened.ledger is not None
        else (ckpt.run_id() if ckpt is not None else "") or "sidecar-reader"
    )
    try:
        return sidecar_budget(cfg, key, built.scope, built.spend, run_id, opened.allow)
    except BudgetCapError:
        if ckpt is not None and opened.new_run is not None:
            _forget_new_state(cfg, ckpt, state_existed)
        raise


def _write_sidecar(cfg: RunConfig, mech: ContinualMechanism, budget: Any = None) -> None:
    """The run's public metadata beside its output (:mod:`dpstream.run.meta`), with its
    dataset's budget (:func:`~dpstream.run.budget.sidecar_budget`) when there is one."""
    from .meta import describe_run, write_run_meta

    info = {
        **describe_run(
            mech, name=cfg.mechanism, base_given=cfg.base is not None, rounded=cfg.round
        ),
        "clamped": bool(cfg.clamp),
        "monotone": bool(cfg.monotone),
    }
    if cfg.clock is not None:
        info["clock"] = cfg.clock.describe(cfg.horizon)
    if budget is not None:
        info["budget"] = budget
    write_run_meta(cfg.output, info)


def _open_out(
    cfg: RunConfig,
    built: _Built,
    opened: _Opened,
    digests: StateDigests,
    stack: contextlib.ExitStack,
) -> IO[bytes]:
    """The output, checked and positioned for a resumed run (Parquet: its writer, and a
    byte sink that discards)."""
    out: IO[bytes]
    if built.parquet is not None:
        out = open(os.devnull, "wb")  # noqa: SIM115 - closed below
        stack.callback(built.parquet.close)
    else:
        out = open_output(
            cfg.output,
            opened.resume,
            ckpt=opened.ckpt,
            digests=digests,
            header=built.formatter.header(),
            go_on=opened.go_on,
        )
    if cfg.output != "-":
        stack.push(closing_quietly_on_error(out))
    return out


def _batch(
    cfg: RunConfig,
    ckpt: Checkpoint | None,
    resume: Resume | None,
    mech: ContinualMechanism,
    digests: StateDigests,
) -> dict[str, Any]:
    """This run's batch in the state: the run that stopped early (this one finishes it),
    or a new one to record once the ledger has checked what it must."""
    if ckpt is None:
        return {}
    from ..io import resolve_path

    batches = ckpt.batches()
    if resume is not None and batches and batches[-1][4] is None:
        n, _, mac, first_t, _ = batches[-1]
        this = input_mac(cfg, digests)
        if cfg.replace_unfinished and None not in (mac, this) and mac != this:
            # the open batch finished from the input that replaces its own (checked on
            # the steps it released): the batch records that input once it ends
            replaced = BatchStart(input=resolve_path(cfg.input), input_mac=this, first_t=first_t)
            return {"batch": n, "replaced": replaced}
        return {"batch": n}

    return {
        "batch_start": BatchStart(
            input=resolve_path(cfg.input),
            input_mac=input_mac(cfg, digests),
            first_t=mech.t + 1,
        )
    }
