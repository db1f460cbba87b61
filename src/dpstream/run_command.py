"""``dpstream run``: read events, release every step of a public clock, checkpoint each step.

Layer 6 of dpstream (an edge). The options and the mechanism registry live in
:mod:`dpstream.cli`; this module is the run itself.

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
``--on-invalid error`` the run stops at the first invalid record: the steps
written before it are complete and resumable, but publishing a halted run's
output reveals where the bad record was. Messages never quote an item or a
record's content unless ``--verbose-errors`` is given.

State and resume
----------------
With ``--state``, every step is recorded in the SQLite checkpoint
(:mod:`dpstream.state`) *before* its release is written, with keyed digests of
its input and of its release. A killed run resumes where it stopped and writes
exactly what an uninterrupted run writes; a resumed run whose input changed in
any step already written is refused (the same noise on other data would
publish the difference of the true counts). A new run refuses an output file
that already holds releases (``--force`` overrides).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .cli import (
    _MECH_KWARGS,
    MECH_OPTS,
    MECHANISMS,
    RUN_OPTS,
    _domain_option,
    _load_config,
    _require_budget,
    build_mechanism,
    check_user_options,
    make_postprocessor,
    merge_options,
)
from .errors import DPStreamError, InvalidEventError, StateError
from .logs import log_fields, setup_logging

__all__ = ["cmd_run", "load_key"]

_log = logging.getLogger("dpstream.run")


@dataclass
class RunStats:
    """What a run did, for the summary."""

    steps: int = 0
    events: int = 0
    truncated: int = 0
    skipped: int = 0
    occurrences: int = 0  # distinct items of the valid events, before truncation
    dropped: int = 0  # of those, removed by --on-invalid truncate
    reasons: Counter = field(default_factory=Counter)
    last_items: int = 0
    resumed_at: int = 0
    started: float = field(default_factory=time.monotonic)


def _auto_format(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.endswith((".csv", ".csv.gz")):
        return "csv"
    return "parquet" if path.endswith(".parquet") else "jsonl"


def _postprocess(release: Any, opts: dict[str, Any]) -> Any:
    """``--top N`` and ``--min-value V``: keep part of a release (post-processing: free)."""
    import numpy as np

    from .mechanisms.base import Release

    top, floor = opts.get("top"), opts.get("min_value")
    if top is None and floor is None:
        return release
    values = np.asarray(release.values)
    keep = np.ones(len(values), dtype=bool) if floor is None else values >= floor
    idx = np.flatnonzero(keep)
    if top is not None and len(idx) > top:
        order = np.lexsort((idx, -values[idx]))  # largest first; ties in release order
        idx = np.sort(idx[order[:top]])
    return Release(t=release.t, items=[release.items[i] for i in idx], values=values[idx],
                   meta=release.meta)


class _ParquetFormatter:
    """Hands each release to a Parquet writer; the byte output is unused."""

    name = "parquet"

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def header(self) -> bytes:
        return b""

    def format(self, release: Any) -> bytes:
        self.writer.write(release)
        return b""


def load_key(opts: dict[str, Any]) -> Any:
    """The key of ``--key-file``, refused when other users may read it (unless overridden)."""
    from .noise import NoiseKey
    from .state import check_private_file

    path = opts["key_file"]
    if not opts.get("allow_readable_key"):
        check_private_file(path, "key file", flag="--allow-readable-key")
    return NoiseKey.load(path)


def _clock(opts: dict[str, Any]) -> Any:
    """The public clock of --time-field/--step/--start, or None (steps given as integers)."""
    from .clock import StepClock

    given = [opts.get(k) is not None for k in ("time_field", "step", "start")]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--time-field, --step and --start go together: the timestamps, "
                         "the width of a step and when step 1 begins")
    if opts.get("time_column") is not None:
        raise ValueError("--time-column gives integer steps; --time-field gives timestamps: "
                         "use one of them")
    try:
        return StepClock.parse(opts["start"], opts["step"], opts.get("lateness"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--start/--step/--lateness: {exc}") from None


def _run_params(opts: dict[str, Any], mech: Any, domain: list[str] | None,
                input_format: str, output_format: str) -> dict[str, Any]:
    """The parameters a resumed run must share (canonical JSON in the state)."""
    params = {k: opts[k] for k in _MECH_KWARGS if k in opts}
    params.update(
        mechanism=opts["mechanism"], horizon=opts["horizon"],
        base=None if mech.base is None else int(mech.base), tau=float(mech.tau),
        domain_sha256=None if domain is None else hashlib.sha256(
            json.dumps(domain, ensure_ascii=True).encode()).hexdigest(),
        input_format=input_format, output_format=output_format, round=bool(opts["round"]),
        clamp=bool(opts["clamp"]), monotone=bool(opts["monotone"]),
        on_invalid=opts["on_invalid"],
    )
    if input_format == "csv":
        params.update(item_column=opts["item_column"], event_column=opts["event_column"],
                      time_column=opts["time_column"])
    if opts.get("user_field") is not None:
        params.update(user_field=opts["user_field"])
    if getattr(mech, "strategy", None) is not None:  # the BLT's exact parameters
        params.update(counter="blt", blt=mech.strategy.fingerprint())
    if isinstance(params.get("eta"), float):
        params["eta"] = float(params["eta"])
    params["implicit_time"] = bool(opts["implicit_time"])
    clock = _clock(opts)
    if clock is not None:
        params.update(time_field=opts["time_field"], start=clock.start.isoformat(),
                      step_seconds=clock.step.total_seconds(),
                      lateness_seconds=clock.lateness.total_seconds(),
                      follow=bool(opts["follow"]))
    return params


#: What an invalid record's message says when it may quote the record (without
#: --verbose-errors): the reason, never the content.
_REDACTED = {
    "not in the domain": "an item is not in the --domain",
    "not valid JSON": "not valid JSON",
    "reappears": "an event id comes back after other rows (the rows of an event must be "
                 "consecutive)",
    "time order": "its time step is not after a step already complete (events must be in "
                  "time order)",
    "not valid UTF-8": "not valid UTF-8",
    "user id": "its user id (--user-field) is missing, empty or not a string",
    "malformed": "not a valid event",
}


class _Validator:
    """Applies --on-invalid to each record of a step, counting what it dropped or cut."""

    def __init__(self, *, policy: str, domain: Sequence[str] | None, max_items: int | None,
                 truncator: Any, stats: RunStats, verbose: bool = False,
                 users: bool = False) -> None:
        self.users = users  # events are (user, items) pairs (--user-field)
        self.policy = policy
        self.domain = None if domain is None else frozenset(domain)
        self.max_items = max_items
        self.truncator = truncator
        self.stats = stats
        self.verbose = verbose

    def _invalid(self, line: int, problem: str) -> None:
        reason = _reason_key(problem)
        if self.policy == "error":
            if not self.verbose and reason in _REDACTED:
                problem = (f"{_REDACTED[reason]} (--verbose-errors shows the record's "
                           "content)")
            raise InvalidEventError(f"input line {line}: {problem} (see --on-invalid)")
        self.stats.skipped += 1
        self.stats.reasons[reason] += 1

    def events(self, step: Any, *, past: str | None = None) -> Any:
        """The valid events of a step (:class:`dpstream.ingest.StepInput`, or a list of
        records), as :class:`~dpstream.mechanisms.columns.EventColumns`; ``past`` marks
        them all as after the end step. Invalid records are reported in input order."""
        import numpy as np

        from .ingest import records_step
        from .mechanisms.columns import EventColumns, distinct_in_events

        if not hasattr(step, "codes"):
            step = records_step(None, list(step))
        invalid = list(step.errors)
        items, codes, offsets = step.items, step.codes, step.offsets
        n_ev = offsets.size - 1
        lines = step.event_lines
        if past is not None:
            invalid.extend((int(line), past) for line in lines.tolist())
            n_ev = 0
        drop = np.zeros(max(n_ev, 0), dtype=bool)
        changed = np.zeros(max(n_ev, 0), dtype=bool)
        keep = np.ones(codes.size, dtype=bool)
        if n_ev:
            sizes = np.diff(offsets)
            event_of = np.repeat(np.arange(n_ev), sizes)
            dkeep, distinct = distinct_in_events(codes, offsets)
            before = distinct  # distinct items per event, before any cut
            if dkeep is not None:
                keep &= dkeep
            if self.domain is not None and items:
                domain = self.domain
                outside = np.fromiter((x not in domain for x in items), bool, len(items))
                out_occ = outside[codes] & keep
                if out_occ.any():
                    bad = np.flatnonzero(np.bincount(event_of[out_occ], minlength=n_ev))
                    if self.policy != "truncate":
                        first = np.flatnonzero(out_occ)
                        first_of = dict(zip(event_of[first][::-1].tolist(),
                                            first[::-1].tolist(), strict=True))
                        for e in bad.tolist():
                            item = items[int(codes[first_of[e]])]
                            invalid.append((int(lines[e]),
                                            f"item {item!r} is not in the domain"))
                        drop[bad] = True
                    else:
                        keep &= ~out_occ
                        changed[bad] = True
                    distinct = np.bincount(event_of[keep], minlength=n_ev)
            if self.max_items is not None:
                over = np.flatnonzero((distinct > self.max_items) & ~drop)
                for e in over.tolist():
                    if self.policy != "truncate":
                        invalid.append((int(lines[e]), f"event has {int(distinct[e])} distinct "
                                        f"items, more than --max-items {self.max_items}"))
                        drop[e] = True
                        continue
                    occ = np.arange(offsets[e], offsets[e + 1])
                    occ = occ[keep[occ]]
                    mine = [items[c] for c in codes[occ].tolist()]
                    chosen = set(self.truncator(mine, int(lines[e])))
                    keep[occ] = [x in chosen for x in mine]
                    changed[e] = True
        invalid.sort(key=lambda pair: pair[0])
        for line, problem in invalid:
            self._invalid(line, problem)
        self.stats.truncated += int(np.count_nonzero(changed & ~drop))
        if n_ev <= 0:
            cols = EventColumns(items, np.zeros(0, np.int64), np.zeros(1, np.int64))
            return [] if self.users else cols
        if drop.any():
            keep &= ~drop[event_of]
        final = np.bincount(event_of[keep], minlength=n_ev)
        self.stats.occurrences += int(before[~drop].sum())
        self.stats.dropped += int((before - final)[~drop].sum())
        sizes = final[~drop] if drop.any() else final
        new_offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=new_offsets[1:])
        cols = EventColumns(items, codes if keep.all() else codes[keep], new_offsets)
        if self.users:  # (user, items) pairs, bounded per user by the mechanism
            users = [u for u, d in zip(step.users, drop.tolist(), strict=True) if not d]
            return [(u, tuple(e)) for u, e in zip(users, cols.events(), strict=True)]
        return cols


def _reason_key(problem: str) -> str:
    for key in ("late event", "past the horizon", "after --until", "before --start", "timestamp",
                "user id", "not in the domain", "more than --max-items", "not valid JSON",
                "time order",
                "reappears", "not valid UTF-8"):
        if key in problem:
            return key
    return "malformed"


def _short_int(value: int) -> str:
    """An integer for a message (a time step may have thousands of digits)."""
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


@dataclass
class _Resume:
    """Where a resumed run picks up: the last step on record and its state in the output."""

    last_t: int = 0
    begin: int = 0  # where the last step's release starts in the output
    written: bytes = b""  # the bytes of it already in the output (maybe partial)


def _open_output(path: str, resume: _Resume | None, *, ckpt: Any, digests: Any,
                 header: bytes, go_on: _GoOn | None = None) -> IO[bytes]:
    """The output as binary; on resume, checked and positioned where the last step starts.

    Before anything is changed, the header and the release of the step before
    the last one on record must be the bytes the state recorded (the file is
    the run's output, unchanged), and the file must not reach past the end of
    the last step's release; if it holds all of it, those bytes must be the
    recorded release too. The bytes of the last step already written are kept
    in ``resume.written``: the replay checks that they are a prefix of the
    recomputed release, and only then truncates the file there and writes the
    release again.
    """
    if path == "-":
        return sys.stdout.buffer
    if go_on is not None and go_on.continues:  # after the last step of an earlier run
        resume = _Resume(last_t=go_on.t, begin=ckpt.step(go_on.t).begin)
        fh = _open_output(path, resume, ckpt=ckpt, digests=digests, header=header)
        if len(resume.written) != go_on.offset - resume.begin:
            fh.close()
            raise StateError(f"output file {path!r} does not hold all of step {go_on.t}, "
                             f"which {ckpt.path!r} records as written: refusing to go on")
        fh.seek(go_on.offset)
        return fh
    if resume is None:
        return open(path, "wb")  # noqa: SIM115 - closed by the caller
    try:
        fh = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        raise StateError(f"output file {path!r} is missing, but the state records "
                         f"releases written to it (up to step {resume.last_t})") from None
    try:
        size = os.fstat(fh.fileno()).st_size
        last = ckpt.step(resume.last_t)
        fh.seek(0)
        bad = None
        if fh.read(len(header)) != header:
            bad = "the header"
        elif not len(header) <= resume.begin <= size <= last.end:
            bad = f"the release of step {resume.last_t}"
        elif resume.last_t > 1:
            before = ckpt.step(resume.last_t - 1)
            fh.seek(before.begin)
            if before.end != resume.begin or digests.release(
                    fh.read(before.end - before.begin)) != before.release_mac:
                bad = f"the release of step {resume.last_t - 1}"
        if bad is None:
            fh.seek(resume.begin)
            resume.written = fh.read(size - resume.begin)
            if size == last.end and digests.release(resume.written) != last.release_mac:
                bad = f"the release of step {resume.last_t}"
        if bad is not None:
            raise StateError(
                f"output file {path!r} does not hold {bad} that {ckpt.path!r} records as "
                "written: was it changed or replaced? refusing to resume")
        fh.seek(resume.begin)
    except BaseException:
        fh.close()
        raise
    return fh


@dataclass
class _GoOn:
    """A stream that goes on from the mechanism saved after step ``t`` of an earlier run.

    ``continues``: that run finished its steps, and this one brings the next
    events; otherwise that run stopped early, and this one replays its steps
    after ``t`` (from the same input) before going on. ``offset``: where step
    t's release ends in the output.
    """

    mechanism: Any
    publish: Any
    t: int
    offset: int
    continues: bool
    batch: int | None


def _resolved(path: str) -> str:
    from .io import resolve_path

    return resolve_path(path)


def _input_mac(opts: dict[str, Any], digests: Any) -> str | None:
    """A keyed digest of the whole input file (None for stdin and for an empty file: two
    quiet days may well bring the same empty input)."""
    if opts["input"] == "-" or os.path.getsize(opts["input"]) == 0:
        return None
    return digests.file(opts["input"])


def _go_on(ckpt: Any, record: Any, opts: dict[str, Any], key: Any,
           digests: Any) -> _GoOn | None:
    """How this run goes on from the state's snapshot, or None (no snapshot: replay all)."""
    from .snapshot import load_snapshot

    snap = ckpt.snapshot()
    if snap is None:
        return None
    t, blob = snap
    batches = ckpt.batches()
    open_batch = batches[-1] if batches and batches[-1][4] is None else None
    mac = _input_mac(opts, digests)
    # the last run finished its steps, or stopped before releasing one (kill -9 at its
    # start): either way this run goes on after step t, from its own input
    continues = t == record.last_t
    if continues:
        if open_batch is not None:
            ckpt.drop_open_batches()
        for n, _, seen, first, last in batches:
            if last is not None and mac is not None and seen == mac:
                raise StateError(
                    f"this input was already fed to the stream in {opts['state']} (run {n}, "
                    f"steps {first}..{last}): refusing to release its events twice")
    elif open_batch is not None and mac is not None and open_batch[2] not in (None, mac):
        raise StateError(f"the run in {opts['state']} stopped at step {record.last_t} while "
                         f"reading another input ({open_batch[1]!r}): give it the same input "
                         "to finish its steps")
    saved = load_snapshot(blob, key, _snapshot_context(ckpt, record.params, t))
    if not (isinstance(saved, tuple) and len(saved) == 2):
        raise StateError(f"the state's snapshot in {opts['state']} holds no post-processing "
                         "state (--clamp/--monotone): go on with the version that wrote it")
    mechanism, publish = saved
    offset = ckpt.step(t).end
    return _GoOn(mechanism=mechanism, publish=publish, t=t, offset=offset, continues=continues,
                 batch=None if continues or open_batch is None else open_batch[0])


def _holds_release(path: str, header: bytes) -> bool:
    """Whether output file ``path`` holds anything beyond the formatter's header."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(len(header) + 1)
    except FileNotFoundError:
        return False
    return not (len(data) <= len(header) and header.startswith(data))


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (also through links)."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _check_paths(opts: dict[str, Any], config: str | None) -> None:
    """Refuse, before opening anything, an output or state file that is another file.

    Writing the releases over the input, the key, the domain, the config or
    the state file would destroy it (and a key overwritten with releases is
    lost for good).
    """
    output, state = opts["output"], opts["state"]
    if opts["engine"] == "local" and output != "-" and str(output).endswith(".gz"):
        raise ValueError(f"--output {output!r}: compressed output is not supported (a resumed "
                         "run truncates the output to its last committed step); write an "
                         "uncompressed file and compress it once the run has finished")
    domain = opts.get("domain")
    others = [("--input", opts["input"] if opts["input"] != "-" else None),
              ("--key-file", opts["key_file"]),
              ("--domain", domain if isinstance(domain, str) else None),
              ("--config", config)]
    targets = [("--output", output if output != "-" else None), ("--state", state)]
    for n, (name, path) in enumerate(targets):
        if path is None:
            continue
        for other_name, other in others + targets[:n]:
            if other is not None and _same_file(path, other):
                raise ValueError(f"{name} {path!r} is the same file as {other_name} "
                                 f"{other!r}: refusing to overwrite it")


def _check_time_mode(opts: dict[str, Any], until: int) -> None:
    """Refuse, before anything is opened, a time mode that would let the data move steps."""
    clock = _clock(opts)
    fmt = _auto_format(opts["input"], opts["input_format"])
    if opts["implicit_time"] and clock is not None:
        raise ValueError("--implicit-time and --time-field are two ways to give steps: use one")
    if fmt == "csv" and clock is None and opts.get("time_column") is None:
        raise ValueError("CSV input needs its time steps: --time-column (integer steps) or "
                         "--time-field with --step and --start (timestamps)")
    if opts["implicit_time"] and (until < int(opts["horizon"]) or opts["follow"]):
        raise ValueError("--implicit-time numbers the steps by line, so a stream that goes "
                         "on over several runs could count a line twice: give each event "
                         "its step (\"t\" or --time-field) to use --until or --follow")
    if opts["output"] == "-" and (until < int(opts["horizon"]) or opts["follow"]):
        raise ValueError("a stream that goes on over several runs (--until, --follow) needs "
                         "--output FILE: the file is the record that stops a step from being "
                         "released twice")


#: The settings that decide which events count, and where: with their defaults.
_PROCESSING_DEFAULTS = {"on_invalid": "skip", "implicit_time": False, "time_field": None,
                        "step": None, "start": None, "lateness": None, "follow": False,
                        "user_field": None}


def scoped_stream(opts: dict[str, Any]) -> str:
    """The stream name the noise is drawn under: ``--stream``, plus a fingerprint of the
    input settings that change which events a release counts (``--on-invalid``, the time
    mode and clock, the CSV columns, the user field) when they are not the defaults.

    Two runs of one stream under one key that count different events (skipping against
    truncating, hourly against half-hourly steps) must not share noise: the difference of
    their releases would be the exact difference of their counts. Runs with the default
    settings keep the plain name, so they equal the library's releases for that name.
    """
    from .mechanisms.base import config_tag

    settings = {k: opts.get(k, d) for k, d in _PROCESSING_DEFAULTS.items()
                if opts.get(k, d) != d}
    if _auto_format(str(opts.get("input", "-")), opts.get("input_format") or "auto") == "csv":
        for name, default in (("item_column", "item"), ("event_column", "event"),
                              ("time_column", None)):
            if opts.get(name) != default:
                settings[name] = opts.get(name)
    if not settings:
        return str(opts["stream"])
    return f"{opts['stream']}~{config_tag(**settings)}"


def _until(opts: dict[str, Any]) -> int:
    """The public end step of this run: ``--until``, or the horizon."""
    horizon = int(opts["horizon"])
    until = opts.get("until")
    if until is None:
        return horizon
    if until > horizon:
        raise ValueError(f"--until {until} is past the horizon --horizon {horizon}")
    return int(until)


def _run_on_spark(opts: dict, key: object) -> int:
    """``run --engine spark``: the same releases, computed by Spark executors."""
    try:
        from .spark import run_cli
    except ImportError as exc:
        raise ValueError(f"--engine spark needs PySpark: pip install 'dpstream[spark]' ({exc})"
                         ) from None
    summary = run_cli({**opts, "until": _until(opts)}, master=opts["master"], key=key)
    _log.info(f"{summary['steps']} steps (t = 1..{summary['last_t']}), "
              f"{summary['events']} events ({summary['skipped']} invalid skipped), "
              f"{summary['rows']} rows -> {summary['output']}, "
              f"{summary['elapsed_s']:.1f} s\n  privacy spent: {summary['privacy'].plain()}",
              extra=log_fields(**{k: v for k, v in summary.items() if k != "privacy"},
                               privacy=summary["privacy"].to_dict()))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .io import KeyedTruncator, make_formatter, open_input
    from .noise import NoiseSource
    from .runmeta import NoiseStdFormatter, describe_run, write_run_meta
    from .state import Checkpoint, StateDigests

    config = _load_config(args.config) if args.config else None
    opts = merge_options(args, MECH_OPTS + RUN_OPTS, config)
    if opts["horizon"] is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    if opts["key_file"] is None:
        raise ValueError("no key: pass --key-file PATH (create one with `dpstream keygen PATH`;"
                         " keep it secret)")
    setup_logging(opts["log_format"], quiet=opts["quiet"])
    check_user_options(opts, run=True)
    until = _until(opts)
    _check_time_mode(opts, until)
    _check_paths(opts, args.config)
    _require_budget(opts)
    key = load_key(opts)
    if opts["engine"] == "spark":
        if opts["view"]:
            raise ValueError("--view works with --engine local only (for now)")
        return _run_on_spark(opts, key)
    name = opts["mechanism"]
    spec = MECHANISMS[name]
    domain = _domain_option(opts)
    stream = scoped_stream(opts)
    mech = build_mechanism(name, {**opts, "stream": stream}, key, domain)
    # readable counts (--clamp, --monotone): post-processing whose state (the values
    # published so far) is replayed with the steps, or saved with the mechanism
    publish = make_postprocessor(opts)
    input_format = _auto_format(opts["input"], opts["input_format"])
    output_format = _auto_format(opts["output"], opts["output_format"])
    parquet = None
    if output_format == "parquet":
        if opts["output"] == "-" or opts["state"]:
            raise ValueError("--output-format parquet needs --output FILE and no --state (a "
                             "Parquet file cannot be resumed): write jsonl or csv with --state")
        if not opts["force"] and os.path.exists(opts["output"]):
            raise StateError(f"output file {opts['output']!r} exists: pass --force to "
                             "overwrite it")
        from .io import ParquetWriter

        parquet = ParquetWriter(opts["output"], opts["round"])
        base_formatter: Any = _ParquetFormatter(parquet)
    else:
        base_formatter = make_formatter(output_format, opts["round"])
    formatter = NoiseStdFormatter(base_formatter, mech)
    if opts["view"] and (opts["output"] == "-" or output_format != "jsonl"):
        raise ValueError("--view needs --output FILE in JSON Lines (the page follows the file)")
    stats = RunStats()
    max_items = getattr(mech, "max_items", None) if spec.max_items != "none" else None
    truncator = KeyedTruncator(NoiseSource(key, f"{stream}/truncate"), max_items or 1)
    validator = _Validator(policy=opts["on_invalid"], domain=domain, max_items=max_items,
                           truncator=truncator, stats=stats, verbose=opts["verbose_errors"],
                           users=opts["user_field"] is not None)
    digests = StateDigests(key)
    quiet = opts["quiet"]
    viewer = None

    with contextlib.ExitStack() as stack:
        infile = open_input(opts["input"])  # before the output: a missing input truncates nothing
        if opts["input"] != "-":
            stack.callback(infile.close)
        elif infile is not sys.stdin:  # a decoding wrapper: leave stdin itself open
            stack.callback(infile.detach)
        ckpt = None
        new_run: dict[str, str] | None = None
        resume: _Resume | None = None
        go_on: _GoOn | None = None
        if opts["state"]:
            ckpt = Checkpoint(opts["state"], fsync=opts["fsync"],
                              allow_readable=opts["allow_readable_state"])
            stack.callback(ckpt.close)
            record, new_run = _open_run(ckpt, opts, mech, domain, key, input_format,
                                        output_format, formatter.header())
            if record is not None and record.finished:
                _check_finished(record, infile, opts, input_format)
                _log.info(f"the run in {opts['state']} finished at {record.finished} "
                          f"({record.steps} steps released); nothing to do: a step is never "
                          "released twice")
                return 0
            if record is not None:
                _check_until(record, until, opts)
                go_on = _go_on(ckpt, record, opts, key, digests)
                if go_on is not None:
                    mech = formatter.mech = go_on.mechanism
                    publish = go_on.publish
                if go_on is None or not go_on.continues:
                    resume = _Resume(last_t=record.last_t, begin=record.last_begin)
                stats.resumed_at = record.last_t
            if opts["output"] == "-" and resume is not None:
                _log.info(f"note: with --output - the release of step {resume.last_t} "
                          "is printed again on resume (the same bytes); write to a file for "
                          "exactly-once output")
        if (new_run is not None or ckpt is None) and parquet is None:  # parquet: checked
            _check_new_output(opts, formatter.header())
        if opts["output"] != "-":  # the run's public metadata, before the output is touched
            write_run_meta(opts["output"], {**describe_run(
                mech, name=name, base_given=opts["base"] is not None, rounded=opts["round"]),
                "clamped": bool(opts["clamp"]), "monotone": bool(opts["monotone"])})
        if parquet is not None:
            out = open(os.devnull, "wb")  # noqa: SIM115 - closed below
            stack.callback(parquet.close)
        else:
            out = _open_output(opts["output"], resume, ckpt=ckpt, digests=digests,
                               header=formatter.header(), go_on=go_on)
        if opts["output"] != "-":
            stack.push(_closing_quietly_on_error(out))
        if opts["view"]:
            from .view.command import start_run_view

            viewer = start_run_view(opts["output"])
            stack.push(viewer.stop_on_error)
        if ckpt is not None and new_run is not None:  # recorded once the output is open
            ckpt.start(**new_run, replace=True)
        batch = None
        if ckpt is not None:
            batches = ckpt.batches()
            if resume is not None and batches and batches[-1][4] is None:
                batch = batches[-1][0]  # the run that stopped early: this one finishes it
            else:
                batch = ckpt.begin_batch(input=_resolved(opts["input"]),
                                         input_mac=_input_mac(opts, digests),
                                         first_t=mech.t + 1)
        _run_loop(mech, infile, out, opts, ckpt=ckpt, resume=resume, until=until,
                  formatter=formatter, validator=validator, digests=digests, stats=stats,
                  public_meta=spec.public_meta, input_format=input_format, quiet=quiet,
                  start=(go_on.t, go_on.offset) if go_on is not None else (0, 0),
                  batch=batch, key=key, publish=publish)
    _log_summary(stats, mech, opts)
    if viewer is not None:
        from .view.command import after_run

        after_run(viewer)
    return 0


def _closing_quietly_on_error(fh: IO[bytes]) -> Any:
    """An exit callback closing ``fh``; a failed close (say, a full disk flushing the
    rest of a buffer) does not hide the error that is already on its way."""

    def exit_(exc_type: object, exc: object, tb: object) -> bool:
        try:
            fh.close()
        except OSError:
            if exc_type is None:
                raise
        return False

    return exit_


def _check_until(record: Any, until: int, opts: dict[str, Any]) -> None:
    """Refuse an end step before the steps already released, or one that adds nothing."""
    if until < record.last_t:
        raise StateError(f"--until {until} is before step {record.last_t}, which the run in "
                         f"{opts['state']} has already released")
    if until == record.last_t and opts["output"] != "-":
        with contextlib.suppress(OSError):
            if os.path.getsize(opts["output"]) >= record.last_end:
                raise StateError(
                    f"the run in {opts['state']} has released every step up to --until "
                    f"{until} already: give a later --until to release more steps")


def _check_new_output(opts: dict[str, Any], header: bytes) -> None:
    """Refuse to start a new run over an output that already holds releases (unless --force).

    Such a file is most likely the output of an earlier run of the same
    stream: starting again (with another stream name, say) would publish its
    steps a second time with fresh noise.
    """
    path = opts["output"]
    if path == "-" or opts["force"] or not _holds_release(path, header):
        return
    hint = ("resume it with its --state file, or pass --force to overwrite it (a release "
            "already published from it still counts against the budget)")
    raise StateError(f"output file {path!r} already holds releases: {hint}")


def _input_records(infile: Any, opts: dict[str, Any], input_format: str) -> Iterator[Any]:
    """The input's records (``dpstream.io.RawEvent``), in order."""
    from .io import guard_lines, read_events

    csv_opts = {}
    if input_format == "csv":
        csv_opts = dict(item_column=opts["item_column"], event_column=opts["event_column"],
                        time_column=opts["time_column"])
    clock = _clock(opts)
    return read_events(guard_lines(infile, opts["input"]), input_format,
                       time_field=opts["time_field"] if clock else None, clock=clock,
                       implicit=bool(opts["implicit_time"]),
                       user_field=opts.get("user_field"), **csv_opts)


def _input_chunks(infile: Any, opts: dict[str, Any], input_format: str) -> Iterator[Any]:
    """The input's records in chunks (``dpstream.ingest.Chunk``), in order: JSON Lines
    with integer steps through the columnar reader, the other inputs (timestamps, CSV,
    one step per line, user ids) record by record."""
    from .ingest import chunks_from_records, read_jsonl_chunks

    if (input_format == "jsonl" and _clock(opts) is None and not opts["implicit_time"]
            and opts.get("user_field") is None):
        return read_jsonl_chunks(infile, opts["input"])
    return chunks_from_records(_input_records(infile, opts, input_format))


def _check_finished(record: Any, infile: Any, opts: dict[str, Any], input_format: str) -> None:
    """Refuse (exit status 1) a finished run whose input has grown since it finished.

    A finished run never releases again, so events appended to its input
    later would otherwise be ignored without a word.
    """
    read = (record.summary or {}).get("input_records")
    if not isinstance(read, int):  # a state written before the count was recorded
        return
    for count, rec in enumerate(_input_records(infile, opts, input_format), 1):
        if count > read:
            raise StateError(
                f"the run in {opts['state']} finished after step {record.last_t}, but the "
                f"input has records after the ones it read (from input line {rec.line}): a "
                "finished run never releases again; release new events as a new stream "
                "(a new key and a new state file)")


def _run_loop(mech: Any, infile: Any, out: IO[bytes], opts: dict[str, Any], *, ckpt: Any,
              resume: _Resume | None, until: int, formatter: Any, validator: _Validator,
              digests: Any, stats: RunStats, public_meta: tuple[str, ...], input_format: str,
              quiet: bool, start: tuple[int, int] = (0, 0), batch: int | None = None,
              key: Any = None, publish: Any = None) -> None:
    """Release every step start+1..until; replay (with digest checks) the steps already
    on record. ``start``: the step an earlier run's saved mechanism stopped at, and where
    its last release ends in the output. ``publish``: the readable-counts
    post-processing (:func:`dpstream.cli.make_postprocessor`), in the state that goes
    with ``mech``."""
    from .ingest import records_step, step_steps
    from .io import group_steps
    from .mechanisms.columns import EventColumns

    horizon = int(opts["horizon"])
    if publish is None:
        publish = make_postprocessor(opts)
    do_fsync = bool(ckpt is not None and opts["fsync"] and opts["output"] != "-")
    start_t, start_offset = start
    resume_t = resume.last_t if resume is not None else 0
    offset = resume.begin if resume is not None else start_offset
    if resume is None and start_t == 0:
        head = formatter.header()
        if head:
            out.write(head)
            offset += len(head)
    read = 0
    last_line = 0  # the last input line read so far

    def note(rec: Any) -> Any:
        nonlocal read, last_line
        read += 1
        last_line = rec.line
        return rec

    def note_chunk(chunk: Any) -> Any:
        nonlocal read, last_line
        read += len(chunk)
        if len(chunk):
            last_line = int(chunk.lines[-1])
        return chunk

    def counted(chunks: Iterable[Any]) -> Iterator[Any]:
        return map(note_chunk, chunks)

    def release(t: int, step: Any) -> None:
        nonlocal offset
        if not hasattr(step, "codes"):  # records read one at a time (--follow)
            step = records_step(t, list(step))
        events = validator.events(step)
        batch = (events.events() if isinstance(events, EventColumns)
                 and not getattr(mech, "accepts_columns", False) else events)
        rel = _postprocess(publish(_public(mech.step_batch(batch), public_meta)), opts)
        line = formatter.format(rel)
        stats.steps += 1
        stats.events += len(events)
        stats.last_items = len(rel.items)
        input_mac = (digests.step_input(t, step.lines, step.lengths, step.raw)
                     if ckpt is not None else None)
        if t <= resume_t:
            stored = ckpt.step(t)
            if stored is None:
                raise StateError(f"state file {opts['state']!r} has no step {t}")
            if stored.input_mac != input_mac:
                first = step.first_line or "?"
                raise StateError(
                    f"the input changed: step {t} (input line {first}) differs from the step "
                    f"recorded in {opts['state']}, which was already written; refusing to "
                    "release it again from other data")
            if stored.release_mac != digests.release(line):
                raise StateError(
                    f"replaying step {t} gave a different release than the one recorded "
                    "(another dpstream or numeric library version?); refusing to resume")
            if t < resume_t:
                progress.update(t, stats.events)
                return
            if not line.startswith(resume.written):  # the last step, maybe partly written
                raise StateError(f"output file {opts['output']!r} does not hold the release "
                                 f"of step {t} that {opts['state']!r} records as written: "
                                 "refusing to resume")
            if opts["output"] != "-":
                out.truncate(offset)  # the output is positioned at `offset`, where t begins
        else:
            if ckpt is not None:  # write-ahead: on record before a byte of it is written
                ckpt.commit(t, begin=offset, end=offset + len(line),
                            release_mac=digests.release(line), input_mac=input_mac,
                            input_line=(last_line ^ digests.mask(t)) if opts["follow"] else 0)
        try:
            out.write(line)
            out.flush()
            if do_fsync:
                os.fsync(out.fileno())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            where = "stdout" if opts["output"] == "-" else repr(opts["output"])
            again = ("run the same command again: it resumes at this step" if ckpt is not None
                     else "run again with --force (or use --state to be able to resume)")
            raise DPStreamError(f"the disk holding the output {where} is full: the run "
                                f"stopped at step {t}; free some space and {again}") from None
        offset += len(line)
        progress.update(t, stats.events)

    def past(t: int) -> str:
        where = f"time step {_short_int(t)}"
        if until < horizon:
            return f"{where} is after --until {until}"
        return f"{where} is past the horizon --horizon {horizon}"

    progress = _Progress(until, enabled=not quiet, every=opts["progress_every"],
                         start_t=resume_t)
    with progress:
        if opts["follow"]:
            _follow(infile, opts, input_format, note, release, mech=mech, until=until,
                    validator=validator, past=past, resume_t=resume_t, ckpt=ckpt,
                    start_t=start_t, key=key)
        else:
            late = ("time step {t} was already released by an earlier run (a late event)"
                    if start_t else None)  # events of steps an earlier run released
            if opts["implicit_time"]:  # every line is a step: record by record
                steps: Iterable[Any] = (
                    records_step(t, recs) for t, recs in group_steps(
                        map(note, _input_records(infile, opts, input_format)), horizon,
                        start=start_t, implicit=True))
            else:
                steps = step_steps(counted(_input_chunks(infile, opts, input_format)),
                                   horizon, start=start_t, late_message=late)
            for step in steps:
                if step.t is None:  # malformed records after the last step
                    validator.events(step)
                elif step.t > until:
                    validator.events(step, past=past(step.t))
                else:
                    release(step.t, step)
        for t in range(mech.t + 1, until + 1):  # the public clock: every step up to the end
            release(t, [])
    out.flush()
    if ckpt is not None:
        summary = {"steps": stats.steps, "events": stats.events,
                   "truncated": stats.truncated, "skipped": stats.skipped,
                   "occurrences": stats.occurrences, "dropped_occurrences": stats.dropped,
                   "last_t": int(mech.t), "input_records": read}
        if until == horizon:
            ckpt.finish(summary)
            if batch is not None:
                ckpt.end_batch(batch, until, None)
        else:
            ckpt.set_summary(summary)
            if batch is not None:
                ckpt.end_batch(batch, until, _snapshot_or_none(mech, publish, key, ckpt))


def _snapshot_context(ckpt: Any, params: str, t: int) -> bytes:
    """What a snapshot is bound to: the run's parameters, its random id and the step."""
    return f"{params}\0{ckpt.run_id()}\0{t}".encode()


def _snapshot_or_none(mech: Any, publish: Any, key: Any, ckpt: Any) -> bytes | None:
    """The snapshot for the next run (the mechanism and its readable-counts
    post-processing), or None (logged) if it cannot be saved."""
    from .snapshot import dump_snapshot

    try:
        return dump_snapshot((mech, publish), key,
                             _snapshot_context(ckpt, ckpt.load().params, mech.t))
    except TypeError as exc:
        _log.warning(f"{exc}; the next run must read the whole stream again")
        return None


_IDLE = object()  # the follower has read everything there is for now
_EOF = object()  # the input has ended (stdin closed)


def _follow(infile: Any, opts: dict[str, Any], input_format: str, note: Any, release: Any,
            *, mech: Any, until: int, validator: _Validator, past: Any, resume_t: int,
            ckpt: Any, start_t: int = 0, key: Any = None) -> None:
    """``--follow``: read a growing input and release each step when the clock says.

    Step t is released once it is due on the public clock (its window has
    ended, plus ``--lateness``) and the reader has caught up with the input
    or read an event of a later step: a backlog is read in order first, so
    which events make a step does not depend on how fast they were read. An
    event that arrives after its step was released is late and goes to
    ``--on-invalid``. A resumed run closes the steps on record at the input
    line each one closed at the first time (kept in the state), so late
    events stay late and the replay is exact.
    """
    import datetime as _dt
    import queue
    import threading

    from .io import guard_lines
    from .state import StateDigests

    clock = _clock(opts)
    if clock is None:
        raise ValueError("--follow needs the public clock: --time-field, --step and --start")
    if input_format != "jsonl":
        raise ValueError("--follow reads JSON Lines input")
    poll = 0.2
    q: queue.Queue = queue.Queue(maxsize=10_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def lines() -> Iterator[str]:
        partial = ""
        while not stop.is_set():
            line = infile.readline()
            if line == "":
                if opts["input"] == "-":
                    return
                q.put(_IDLE)
                stop.wait(poll)
                continue
            partial += line
            if partial.endswith("\n"):
                yield partial
                partial = ""

    def reader() -> None:
        try:
            for rec in _input_records_from(guard_lines(lines(), opts["input"]), opts,
                                           input_format):
                q.put(rec)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
        q.put(_EOF)

    thread = threading.Thread(target=reader, name="dpstream-follow", daemon=True)
    thread.start()
    pending: dict[int, list[Any]] = {}
    caught_up = ended = False
    newest = 0  # the latest step an event was read for
    latest_line = 0  # the latest input line read
    # steps on record close where they closed the first time
    mask = StateDigests(key).mask if key is not None else (lambda t: 0)
    boundary = {t: ckpt.step(t).input_line ^ mask(t) for t in range(start_t + 1, resume_t + 1)}
    late = "time step {} was already released (a late event)"
    try:
        while mech.t < until:
            t = mech.t + 1
            now = _dt.datetime.now(_dt.timezone.utc)
            if t in boundary:
                if caught_up and latest_line < boundary[t]:
                    raise StateError(f"the input ends at line {latest_line}, but step {t} "
                                     f"closed after line {boundary[t]} the first time: is it "
                                     "the same input?")
                ready = ended or latest_line > boundary[t] or (caught_up and latest_line
                                                                == boundary[t])
            else:
                ready = clock.due(now) >= t and (caught_up or ended or newest > t)
            if ready:
                recs = pending.pop(t, [])
                cut = boundary.get(t, latest_line)
                release(t, [r for r in recs if r.line <= cut])
                validator.events([r for r in recs if r.line > cut], past=late.format(t))
                continue
            wait = (clock.end_of(t) + clock.lateness - now).total_seconds()
            if ended:
                stop.wait(max(min(wait, 1.0), 0.01))
                continue
            try:
                item = q.get(timeout=max(min(wait, poll), 0.01))
            except queue.Empty:
                continue
            if item is _IDLE:
                caught_up = True
            elif item is _EOF:
                ended = True
                if errors:
                    raise errors[0]
            else:
                rec = note(item)
                caught_up, latest_line = False, rec.line
                if rec.error is not None or rec.t is None:
                    validator.events([rec])
                elif rec.t <= mech.t:
                    validator.events([rec], past=late.format(rec.t))
                elif rec.t > until:
                    validator.events([rec], past=past(rec.t))
                else:
                    pending.setdefault(rec.t, []).append(rec)
                    newest = max(newest, rec.t)
    finally:
        stop.set()


def _input_records_from(lines: Iterable[str], opts: dict[str, Any],
                        input_format: str) -> Iterator[Any]:
    from .io import read_events

    clock = _clock(opts)
    return read_events(lines, input_format, time_field=opts["time_field"], clock=clock,
                       user_field=opts.get("user_field"))


def _open_run(ckpt: Any, opts: dict[str, Any], mech: Any, domain: list[str] | None, key: Any,
              input_format: str, output_format: str,
              header: bytes) -> tuple[Any, dict[str, str] | None]:
    """Check that this run continues the one recorded in the state file.

    Returns ``(record, None)`` to resume the recorded run, or ``(None, ident)``
    for a new run, to be recorded (:meth:`Checkpoint.start`) once the output
    is open. A recorded run with no step on record wrote nothing (a step is
    recorded before its release is written), so it is replaced by this one,
    new parameters and all.
    """
    from .io import resolve_path
    from .state import canonical_json

    params = canonical_json(_run_params(opts, mech, domain, input_format, output_format))
    ident = dict(params=params, key_fingerprint=key.fingerprint(),
                 input=resolve_path(opts["input"]), output=resolve_path(opts["output"]))
    record = ckpt.load()
    if record is None or (record.steps == 0 and not record.finished):
        return None, ident
    if ckpt.snapshot() is not None:  # a stream that goes on: each run brings its own input
        ident = {**ident, "input": None}
    ckpt.verify(record, **ident)
    return record, None


def _public(release: Any, keys: tuple[str, ...]) -> Any:
    from .mechanisms.base import Release

    meta = {k: v for k, v in release.meta.items() if k in keys}
    if meta == dict(release.meta):
        return release
    return Release(t=release.t, items=release.items, values=release.values, meta=meta)


def _log_summary(stats: RunStats, mech: Any, opts: dict[str, Any]) -> None:
    elapsed = time.monotonic() - stats.started
    rate = stats.events / elapsed if elapsed > 0 else float("inf")
    resumed = f", resumed after step {stats.resumed_at}" if stats.resumed_at else ""
    lines = [
        f"{stats.steps} steps (t = 1..{mech.t} of T = {mech.horizon}), "
        f"{stats.events} events{resumed}, {elapsed:.1f} s ({rate:,.0f} events/s)",
        f"  invalid events: {stats.truncated} truncated, {stats.skipped} skipped"
        + (" (" + ", ".join(f"{n} {r}" for r, n in stats.reasons.most_common()) + ")"
           if stats.reasons else ""),
        f"  items released at the last step: {stats.last_items}",
        *_bounding_summary(mech),
        *_truncation_lines(stats, opts),
        f"  privacy spent: {mech.privacy.plain()}",
        f"  output: {opts['output'] if opts['output'] != '-' else 'stdout'}"
        + (f"; state: {opts['state']}" if opts["state"] else ""),
    ]
    _log.info("\n".join(lines), extra=log_fields(
        steps=stats.steps, last_t=int(mech.t), horizon=int(mech.horizon), events=stats.events,
        resumed_at=stats.resumed_at, elapsed_s=round(elapsed, 3), truncated=stats.truncated,
        skipped=stats.skipped, skipped_by_reason=dict(stats.reasons),
        occurrences=stats.occurrences, dropped_occurrences=stats.dropped,
        items_released_last=stats.last_items, privacy=mech.privacy.to_dict(),
        output=opts["output"], state=opts["state"]))


def _bounding_summary(mech: Any) -> list[str]:
    """The user bounds' effect, for the operator (not private: it counts users)."""
    users = getattr(mech, "_users", None)
    if users is None:
        return []
    st = users.bounder.stats
    return [f"  user bounds ({users.bounds.describe()}): {st.kept} contributions kept, "
            f"{st.dropped} dropped ({st.dropped_new_item} past --max-items-per-user, "
            f"{st.dropped_count} past --max-count-per-item); {users.users} users"]


def _truncation_lines(stats: RunStats, opts: dict[str, Any]) -> list[str]:
    """The share of item occurrences truncation dropped (for the operator, never published)."""
    if not stats.occurrences or opts.get("on_invalid") != "truncate":
        return []
    share = stats.dropped / stats.occurrences
    line = (f"  truncation dropped {stats.dropped:,} of {stats.occurrences:,} item occurrences "
            f"({share:.1%}; not part of the release)")
    if share >= 0.05:
        line += (": counts of items that come in large events are low by up to that share; "
                 "a larger --max-items keeps more (see `dpstream plan` for its noise)")
    return [line]


class _Progress:
    """Progress of a run on stderr: a rich bar on a terminal, else a log line now and then.

    The log line (every ``every`` seconds, and never for a quiet run) gives the
    step, the events so far, the rate and an estimate of the time left.
    """

    def __init__(self, total: int, *, enabled: bool, every: float = 10.0,
                 start_t: int = 0) -> None:
        self.total = total
        self.bar_mode = enabled and sys.stderr.isatty()
        self.log_mode = enabled and not self.bar_mode
        self.every = every
        self._bar: Any = None
        self._start = time.monotonic()
        self._last_log = self._start
        self._start_t = start_t

    def __enter__(self) -> _Progress:
        if self.bar_mode:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("steps"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("run", total=self.total, rate="")
        return self

    def update(self, t: int, events: int) -> None:
        now = time.monotonic()
        elapsed = max(now - self._start, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, completed=t, rate=f"{events / elapsed:,.0f} events/s")
        elif self.log_mode and now - self._last_log >= self.every:
            self._last_log = now
            done = max(t - self._start_t, 1)
            eta = (self.total - t) * elapsed / done
            _log.info(f"step {t} of {self.total} ({100 * t / self.total:.0f}%), {events:,} "
                      f"events, {events / elapsed:,.0f} events/s, about {_duration(eta)} left",
                      extra=log_fields(step=t, total=self.total, events=events,
                                       events_per_s=round(events / elapsed, 1),
                                       eta_s=round(eta, 1)))

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
