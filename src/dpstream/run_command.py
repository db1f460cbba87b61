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
record's content unless ``--verbose-errors`` is given. A batch run counts its
invalid records before its first release, and when more than ``--max-invalid``
of them are invalid (a typo in ``--time-field`` or ``--step``) it writes nothing
(:mod:`dpstream.run_guard`): the operator's decision on the raw data, like
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
releases (``--force`` overrides both: the operator's word that the earlier
release was never published).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import IO, Any

from .errors import DPStreamError, InvalidEventError, StateError
from .ledger import LedgerError, ReleaseLedger, ledger_path, scope_refusal
from .logs import log_fields, setup_logging
from .options import (
    MECH_OPTS,
    RUN_OPTS,
    _domain_option,
    _load_config,
    merge_options,
    resolve_horizon,
)
from .registry import _MECH_KWARGS, MECHANISMS, build_mechanism, make_postprocessor
from .run_follow import follow
from .run_guard import InvalidTally, TooManyInvalidError, check_invalid_share
from .run_output import (
    ParquetFormatter,
    Resume,
    check_new_output,
    check_paths,
    closing_quietly_on_error,
    long_layout_without_step_start,
    open_output,
    postprocess,
)
from .run_report import Progress, log_summary
from .run_settings import auto_format, clock_from_options, reason_key, scoped_stream
from .settings_check import check_settings, mechanism_settings

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


def load_key(opts: dict[str, Any]) -> Any:
    """The key of ``--key-file``, refused when other users may read it (unless overridden)."""
    from .noise import NoiseKey
    from .state import check_private_file

    path = opts["key_file"]
    if not opts.get("allow_readable_key"):
        check_private_file(path, "key file", flag="--allow-readable-key")
    return NoiseKey.load(path)


def _noise_version(opts: dict[str, Any]) -> int:
    """The noise version of this run: ``--noise-version`` if given; else the version of
    the stream this run goes on with or writes over, so that a stream never changes
    version (which would publish independent noise for steps already released):

    * with ``--engine spark``: the newest version, as for any new stream (a Spark
      stream goes on by running the job again into a new directory, so a run cannot
      see what the first one drew: one begun at version 1 passes ``--noise-version 1``);
    * the run on record in ``--state`` (one that released steps; a state without a
      version was written by dpstream 0.1: version 1);
    * else the output file's metadata sidecar, when the output exists (``--force``
      writes over it; a sidecar without a version: 1); an output that holds
      releases but has no sidecar is refused: its version is unknown;
    * else, a new stream: the newest version.
    """
    from .noise import NOISE_VERSION
    from .runmeta import read_run_meta, sidecar_path
    from .state import recorded_params

    if opts.get("noise_version") is not None:
        return int(opts["noise_version"])
    if opts.get("engine", "local") != "local":
        return NOISE_VERSION
    if opts.get("state"):
        params = recorded_params(opts["state"], allow_readable=opts["allow_readable_state"])
        if params is not None:
            return int(params.get("noise_version", 1))
    output = opts.get("output")
    if output and output != "-" and os.path.exists(output):
        try:
            meta = read_run_meta(sidecar_path(output))
        except ValueError:
            meta = None
        if meta is not None:
            return int(meta.get("noise_version", 1))
        if opts.get("force") and os.path.getsize(output) > 0:
            raise ValueError(
                f"output file {output!r} holds releases but no metadata sidecar "
                "says which noise version drew them: pass --noise-version (1 for "
                "releases of dpstream 0.1, or the version of the run that wrote "
                "it); another version would publish independent noise for the "
                "same steps"
            )
    return NOISE_VERSION


def _recorded_tree_base(opts: dict[str, Any]) -> int | None:
    """The tree base of the unknown-domain stream this run goes on with, or None.

    UnkBase's default counter is BLT; a stream that began with the tree (the
    run on record in ``--state``, else the output's metadata sidecar when the
    output exists) must not switch counters half-way (its releases would mix
    independent noises of two counters). So ``-m unknown`` without ``--counter``,
    ``--blt-buffers`` or ``--base`` takes the recorded tree base (``--base r``
    records exactly what a stream begun with the tree by default recorded). An
    explicit flag that differs from the record is refused by the parameter check as for any option.
    """
    from .runmeta import read_run_meta, sidecar_path
    from .state import recorded_params

    if opts.get("mechanism") != "unknown" or any(
        opts.get(k) is not None for k in ("counter", "blt_buffers", "base")
    ):
        return None
    if opts.get("state"):
        params = recorded_params(opts["state"], allow_readable=opts["allow_readable_state"])
        if params is not None:
            if (
                params.get("mechanism") == "unknown"
                and "blt" not in params
                and params.get("counter") is None
                and params.get("base")
            ):
                return int(params["base"])
            return None
    output = opts.get("output")
    if output and output != "-" and os.path.exists(output):
        try:
            meta = read_run_meta(sidecar_path(output))
        except ValueError:
            meta = None
        if (
            meta is not None
            and meta.get("mechanism") == "unknown"
            and meta.get("counter", "tree") == "tree"
            and meta.get("base")
        ):
            return int(meta["base"])
    return None


def _domain_sha256(domain: list[str] | None) -> str | None:
    """The fingerprint of ``--domain`` a resumed run must match (None without one)."""
    if domain is None:
        return None
    return hashlib.sha256(json.dumps(domain, ensure_ascii=True).encode()).hexdigest()


def _run_params(
    opts: dict[str, Any],
    mech: Any,
    domain_sha256: str | None,
    input_format: str,
    output_format: str,
) -> dict[str, Any]:
    """The parameters a resumed run must share (canonical JSON in the state)."""
    params = {k: opts[k] for k in _MECH_KWARGS if k in opts}
    # noise version 1 is not recorded, so that states written before versions existed resume
    version = params.pop("noise_version", None)
    if version not in (None, 1):
        params["noise_version"] = version
    params.update(
        mechanism=opts["mechanism"],
        horizon=opts["horizon"],  # None: no planned end
        base=None if mech.base is None else int(mech.base),
        tau=float(mech.tau),
        domain_sha256=domain_sha256,
        input_format=input_format,
        output_format=output_format,
        round=bool(opts["round"]),
        clamp=bool(opts["clamp"]),
        monotone=bool(opts["monotone"]),
        on_invalid=opts["on_invalid"],
    )
    if opts["horizon"] is None:  # recorded: a resume cannot switch to or from a horizon
        params["unbounded"] = True
    if opts["on_invalid"] == "truncate":  # the rule that picks the kept items
        from .mechanisms.truncation import METHOD

        params["truncation"] = METHOD
    if input_format == "csv":
        params.update(
            item_column=opts["item_column"],
            event_column=opts["event_column"],
            time_column=opts["time_column"],
        )
    if opts.get("user_field") is not None:
        params.update(user_field=opts["user_field"])
    if mech.strategy is not None:  # the BLT's exact parameters
        params.update(counter="blt", blt=mech.strategy.fingerprint())
    if isinstance(params.get("eta"), float):
        params["eta"] = float(params["eta"])
    params["implicit_time"] = bool(opts["implicit_time"])
    clock = clock_from_options(opts)
    if clock is not None:
        params.update(
            time_field=opts["time_field"],
            start=clock.start.isoformat(),
            step_seconds=clock.step.total_seconds(),
            lateness_seconds=clock.lateness.total_seconds(),
            follow=bool(opts["follow"]),
        )
        if clock.months:  # calendar months, in the offset of --start
            params.update(step_months=clock.months, time_zone=clock.zone_text())
    return params


#: What an invalid record's message says when it may quote the record (without
#: --verbose-errors): the reason, never the content.
_REDACTED = {
    "not in the domain": "an item is not in the --domain",
    "not valid JSON": "not valid JSON",
    "time order": "its time step is not after a step already complete (events must be in "
    "time order)",
    "not valid UTF-8": "not valid UTF-8",
    "user id": "its user id (--user-field) is missing, empty or not a string",
    "malformed": "not a valid event",
}


class _Validator:
    """Applies --on-invalid to each record of a step, counting what it dropped or cut."""

    def __init__(
        self,
        *,
        policy: str,
        domain: Sequence[str] | None,
        max_items: int | None,
        truncator: Any,
        stats: RunStats,
        verbose: bool = False,
        users: bool = False,
        domain_index: Any = None,
    ) -> None:
        self.users = users  # events are (user, items) pairs (--user-field)
        self.policy = policy
        from .mechanisms.item_table import domain_table

        # membership looked up for a step's items at once, in a compact table: the
        # mechanism's own table of the same --domain when it has one (``domain_index``),
        # else one built here
        if domain is None:
            self.domain = None
        elif domain_index is not None:
            if len(domain_index) != len(domain):
                raise ValueError("the mechanism's domain table does not match --domain")
            self.domain = domain_index
        else:
            self.domain = domain_table(domain)
        self.max_items = max_items
        self.truncator = truncator
        self.stats = stats
        self.verbose = verbose

    def _invalid(self, line: int, problem: str) -> None:
        reason = reason_key(problem)
        if self.policy == "error":
            if not self.verbose and reason in _REDACTED:
                problem = f"{_REDACTED[reason]} (--verbose-errors shows the record's content)"
            raise InvalidEventError(f"input line {line}: {problem} (see --on-invalid)")
        self.stats.skipped += 1
        self.stats.reasons[reason] += 1

    def events(self, step: Any, *, past: str | None = None) -> Any:
        """The valid events of a step (:class:`dpstream.ingest.StepInput`, or a list of
        records), as :class:`~dpstream.mechanisms.columns.EventColumns`; ``past`` marks
        them all as after the end step. Invalid records are reported in input order."""
        import numpy as np

        from .io.chunks import concat_ranges as _ranges
        from .io.chunks import records_step
        from .mechanisms.columns import EventColumns, distinct_in_events

        if not hasattr(step, "codes"):  # records of one step (or invalid records)
            recs = list(step)
            steps = {r.t for r in recs if r.error is None}
            step = records_step(steps.pop() if len(steps) == 1 else None, recs)
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
                outside = self.domain.lookup(items) < 0
                out_occ = outside[codes] & keep
                if out_occ.any():
                    bad = np.flatnonzero(np.bincount(event_of[out_occ], minlength=n_ev))
                    if self.policy != "truncate":
                        first = np.flatnonzero(out_occ)
                        first_of = dict(
                            zip(event_of[first][::-1].tolist(), first[::-1].tolist(), strict=True)
                        )
                        for e in bad.tolist():
                            item = items[int(codes[first_of[e]])]
                            invalid.append((int(lines[e]), f"item {item!r} is not in the domain"))
                        drop[bad] = True
                    else:
                        keep &= ~out_occ
                        changed[bad] = True
                    distinct = np.bincount(event_of[keep], minlength=n_ev)
            if self.max_items is not None:
                over = np.flatnonzero((distinct > self.max_items) & ~drop)
                if self.policy != "truncate":
                    for e in over.tolist():
                        invalid.append(
                            (
                                int(lines[e]),
                                f"event has {int(distinct[e])} distinct "
                                f"items, more than --max-items {self.max_items}",
                            )
                        )
                        drop[e] = True
                elif over.size:  # every event's cut at once, keyed on (step, its items)
                    if step.t is None:
                        raise ValueError("events to truncate need their time step")
                    occ = _ranges(offsets[over], offsets[over + 1])
                    occ = occ[keep[occ]]
                    sub = np.zeros(over.size + 1, dtype=np.int64)
                    np.cumsum(distinct[over], out=sub[1:])
                    assert int(sub[-1]) == occ.size
                    keep[occ] = self.truncator.keep(int(step.t), items, codes[occ], sub)
                    changed[over] = True
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
        if self.users:  # (user, items) pairs as columns, bounded per user by the mechanism
            from .mechanisms.users import UserEventColumns

            user_of = step.user_codes[~drop] if drop.any() else step.user_codes
            return UserEventColumns(step.user_ids, user_of, cols)
        return cols


def _short_int(value: int) -> str:
    """An integer for a message (a time step may have thousands of digits)."""
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


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


def _go_on(ckpt: Any, record: Any, opts: dict[str, Any], key: Any, digests: Any) -> _GoOn | None:
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
    if continues:  # an open batch released nothing: begin_batch forgets it
        for n, _, seen, first, last in batches:
            if last is not None and mac is not None and seen == mac:
                raise StateError(
                    f"this input was already fed to the stream in {opts['state']} (run {n}, "
                    f"steps {first}..{last}): refusing to release its events twice"
                )
    elif open_batch is not None and mac is not None and open_batch[2] not in (None, mac):
        raise StateError(
            f"the run in {opts['state']} stopped at step {record.last_t} while "
            f"reading another input ({open_batch[1]!r}): give it the same input "
            "to finish its steps"
        )
    saved = load_snapshot(blob, key, _snapshot_context(ckpt, record.params, t))
    if not (isinstance(saved, tuple) and len(saved) == 2):
        raise StateError(
            f"the state's snapshot in {opts['state']} holds no post-processing "
            "state (--clamp/--monotone): go on with the version that wrote it"
        )
    mechanism, publish = saved
    offset = ckpt.step(t).end
    return _GoOn(
        mechanism=mechanism,
        publish=publish,
        t=t,
        offset=offset,
        continues=continues,
        batch=None if continues or open_batch is None else open_batch[0],
    )


def _check_time_mode(opts: dict[str, Any], until: int) -> None:
    """Refuse, before anything is opened, a time mode that would let the data move steps."""
    clock = clock_from_options(opts)
    fmt = auto_format(opts["input"], opts["input_format"])
    if opts["implicit_time"] and clock is not None:
        raise ValueError("--implicit-time and --time-field are two ways to give steps: use one")
    if fmt == "csv" and clock is None and opts.get("time_column") is None:
        raise ValueError(
            "CSV input needs its time steps: --time-column (integer steps) or "
            "--time-field with --step and --start (timestamps)"
        )
    if opts["implicit_time"] and (until < _horizon(opts) or opts["follow"]):
        raise ValueError(
            "--implicit-time numbers the steps by line, so a stream that goes "
            "on over several runs could count a line twice: give each event "
            'its step ("t" or --time-field) to use --until or --follow'
        )
    if opts["output"] == "-" and (until < _horizon(opts) or opts["follow"]):
        raise ValueError(
            "a stream that goes on over several runs (--until, --follow) needs "
            "--output FILE: the file is the record that stops a step from being "
            "released twice"
        )


#: The settings that decide which events count, and where: with their defaults.
def _horizon(opts: dict[str, Any]) -> int:
    """T (--horizon), or the step limit 2^40 of a stream with no planned end (no
    --horizon: -m known and -m unknown with the BLT fitted for every t)."""
    from .factorization import MAX_BLT_HORIZON

    return MAX_BLT_HORIZON if opts.get("horizon") is None else int(opts["horizon"])


def _end_problems(opts: dict[str, Any]) -> list[str]:
    """A run of a stream with no planned end (no --horizon) must end somewhere."""
    if opts.get("horizon") is None and opts.get("until") is None and not opts.get("follow"):
        return [
            "without --horizon (a stream with no planned end) a run needs --until N, the "
            "last time step it releases (a public end step; run again with the same "
            "--state and a later --until to go on), or --follow"
        ]
    return []


def _until(opts: dict[str, Any]) -> int:
    """The public end step of this run: ``--until``, or the horizon. A stream with no
    planned end (no --horizon) has no default: --until, or --follow (which goes on
    until stopped)."""
    horizon = _horizon(opts)
    until = opts.get("until")
    problems = _end_problems(opts)
    if problems:
        raise ValueError(problems[0])
    if until is None:
        return horizon
    if until > horizon:
        raise ValueError(f"--until {until} is past the horizon --horizon {horizon}")
    return int(until)


def _run_on_spark(opts: dict, key: object) -> int:
    """``run --engine spark``: the same releases, computed by Spark executors. The job
    draws the local engine's noise, so it checks and records its noise scope in the
    release ledger as a local run without a state does (before it writes anything)."""
    try:
        from .spark import run_cli
    except ImportError as exc:
        raise ValueError(
            f"--engine spark needs PySpark: pip install 'dpstream[spark]' ({exc})"
        ) from None

    def claim(mech: Any) -> None:
        ledger, _ = _new_run_scope(opts, key, noise_scope(mech, str(opts["stream"])), own="")
        with ledger:
            ledger.claim_scope()

    summary = run_cli(
        {**opts, "until": _until(opts)}, master=opts["master"], key=key, before_release=claim
    )
    _log.info(
        f"{summary['steps']} steps (t = 1..{summary['last_t']}), "
        f"{summary['events']} events ({summary['skipped']} invalid skipped), "
        f"{summary['rows']} rows -> {summary['output']}, "
        f"{summary['elapsed_s']:.1f} s\n  privacy spent: {summary['privacy'].plain()}",
        extra=log_fields(
            **{k: v for k, v in summary.items() if k != "privacy"},
            privacy=summary["privacy"].to_dict(),
        ),
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .io import KeyedTruncator, make_formatter, open_input
    from .mechanisms.truncation import truncation_source
    from .runmeta import NoiseStdFormatter, describe_run, write_run_meta
    from .state import Checkpoint, StateDigests

    config = _load_config(args.config) if args.config else None
    opts = merge_options(args, MECH_OPTS + RUN_OPTS, config)
    resolve_horizon(opts)  # --end gives T
    check_settings(
        opts,
        extra=[
            *_end_problems(opts),
            *(
                []
                if opts["key_file"] is not None
                else [
                    "no key: pass --key-file PATH (create one with `dpstream keygen PATH`; "
                    "keep it secret)"
                ]
            ),
        ],
    )
    setup_logging(opts["log_format"], quiet=opts["quiet"])
    until = _until(opts)
    _check_time_mode(opts, until)
    check_paths(opts, args.config)
    key = load_key(opts)
    opts["noise_version"] = _noise_version(opts)
    if opts["engine"] == "spark":
        if opts.get("horizon") is None:
            raise ValueError(
                "--engine spark needs --horizon (a stream with no planned end "
                "runs on the local engine)"
            )
        if opts["view"]:
            raise ValueError("--view works with --engine local only (for now)")
        return _run_on_spark(opts, key)
    tree_base = _recorded_tree_base(opts)
    if tree_base is not None:  # a tree stream goes on with the tree
        opts["base"] = tree_base
        _log.debug(
            f"--mechanism unknown: going on with the tree counter (base {tree_base}) "
            "of the stream on record; pass --counter blt only for a new stream"
        )
    name = opts["mechanism"]
    spec = MECHANISMS[name]
    domain = _domain_option(opts)
    stream = scoped_stream(opts)
    with mechanism_settings():
        mech = build_mechanism(name, {**opts, "stream": stream}, key, domain)
    scope = noise_scope(mech, stream)
    free_ledger = None  # a run without a state: a new run, checked before anything (a
    if not opts["state"]:  # Parquet file) is made; its one line comes before its release
        free_ledger = _new_run_scope(opts, key, scope, own="")[0]
        free_ledger.close()
    # readable counts (--clamp, --monotone): post-processing whose state (the values
    # published so far) is replayed with the steps, or saved with the mechanism
    publish = make_postprocessor(opts)
    input_format = auto_format(opts["input"], opts["input_format"])
    output_format = auto_format(opts["output"], opts["output_format"])
    clock = clock_from_options(opts)
    step_start = None if clock is None else (lambda t: clock.iso(clock.start_of(t)))
    if (
        step_start is not None
        and opts["state"]
        and not opts["force"]
        and long_layout_without_step_start(opts["output"], output_format)
    ):
        step_start = None  # a stream begun without the column goes on without it
    parquet = None
    if output_format == "parquet":
        if opts["output"] == "-" or opts["state"]:
            raise ValueError(
                "--output-format parquet needs --output FILE and no --state (a "
                "Parquet file cannot be resumed): write jsonl or csv with --state"
            )
        if not opts["force"] and os.path.exists(opts["output"]):
            raise StateError(f"output file {opts['output']!r} exists: pass --force to overwrite it")
        from .io import ParquetWriter

        parquet = ParquetWriter(opts["output"], opts["round"], step_start=step_start)
        base_formatter: Any = ParquetFormatter(parquet)
    else:
        base_formatter = make_formatter(output_format, opts["round"], step_start)
    formatter = NoiseStdFormatter(base_formatter, mech)
    if opts["view"] and (opts["output"] == "-" or output_format != "jsonl"):
        raise ValueError("--view needs --output FILE in JSON Lines (the page follows the file)")
    stats = RunStats()
    max_items = getattr(mech, "max_items", None) if spec.max_items != "none" else None
    truncator = KeyedTruncator(truncation_source(key, stream), max_items or 1)
    validator = _Validator(
        policy=opts["on_invalid"],
        domain=domain,
        max_items=max_items,
        truncator=truncator,
        stats=stats,
        verbose=opts["verbose_errors"],
        users=opts["user_field"] is not None,
        domain_index=getattr(mech, "domain_index", None),
    )
    # the domain lives on in the mechanism's compact table (the validator reads it); its
    # list of str objects (~100 bytes an item) goes now
    domain_sha256 = _domain_sha256(domain)
    del domain
    digests = StateDigests(key)
    quiet = opts["quiet"]
    viewer = None

    state_existed = bool(opts["state"]) and os.path.exists(opts["state"])
    with contextlib.ExitStack() as stack:
        infile = open_input(opts["input"])  # before the output: a missing input truncates nothing
        if opts["input"] != "-":
            stack.callback(infile.close)
        elif infile is not sys.stdin and isinstance(infile, io.TextIOWrapper):
            # a decoding wrapper (always, when it is not stdin): leave stdin itself open
            stack.callback(infile.detach)
        ckpt = None
        ledger: ReleaseLedger | None = None
        new_run: dict[str, str] | None = None
        allow: frozenset[str] = frozenset()  # a run id a kill left in the state (see below)
        resume: Resume | None = None
        go_on: _GoOn | None = None
        if opts["state"]:
            ckpt = Checkpoint(
                opts["state"], fsync=opts["fsync"], allow_readable=opts["allow_readable_state"]
            )
            stack.callback(ckpt.close)
            record, new_run = _open_run(
                ckpt,
                opts,
                mech,
                domain_sha256,
                key,
                input_format,
                output_format,
                formatter.header(),
            )
            if record is not None and record.finished:
                _check_finished(record, infile, opts, input_format)
                _log.info(
                    f"the run in {opts['state']} finished at {record.finished} "
                    f"({record.steps} steps released); nothing to do: a step is never "
                    "released twice"
                )
                return 0
            if record is not None:
                if _check_until(ckpt, record, until, opts, digests):
                    _log.info(
                        f"the run in {opts['state']} has released every step up to "
                        f"--until {until} from this input already; nothing to do: a "
                        "step is never released twice"
                    )
                    return 0
                ledger = _open_ledger(opts, key, ckpt, record, scope=scope)
                stack.callback(ledger.close)
                go_on = _go_on(ckpt, record, opts, key, digests)
                if go_on is not None:
                    mech = formatter.mech = go_on.mechanism
                    publish = go_on.publish
                if go_on is None or not go_on.continues:
                    resume = Resume(last_t=record.last_t, begin=record.last_begin)
                stats.resumed_at = record.last_t
            if new_run is not None:  # its ledger is opened once the run is recorded
                try:
                    first, allow = _new_run_scope(opts, key, scope, own=ckpt.run_id())
                except LedgerError:
                    if not state_existed:  # a state file made just now
                        ckpt.close()
                        with contextlib.suppress(OSError):
                            os.unlink(opts["state"])
                    raise
                first.close()
            if opts["output"] == "-" and resume is not None:
                _log.info(
                    f"note: with --output - the release of step {resume.last_t} "
                    "is printed again on resume (the same bytes); write to a file for "
                    "exactly-once output"
                )
        if free_ledger is not None:  # checked again when its one line is appended
            ledger = free_ledger
            ledger.reopen()
            stack.callback(ledger.close)
        if (new_run is not None or ckpt is None) and parquet is None:  # parquet: checked
            check_new_output(opts, formatter.header())
        chunks = None
        # a batch run that drops invalid records: its input, read and checked before a
        # release (--on-invalid error stops at the first invalid record anyway)
        if not opts["follow"] and opts["on_invalid"] != "error":
            start_t = go_on.t if go_on is not None else 0
            try:
                chunks = _read_checked(
                    infile,
                    opts,
                    input_format,
                    validator=validator,
                    start_t=start_t,
                    until=until,
                    clock=clock,
                )
            except TooManyInvalidError:
                if ckpt is not None and not state_existed:  # a state file made just now
                    ckpt.close()
                    with contextlib.suppress(OSError):
                        os.unlink(opts["state"])
                raise
        if opts["output"] != "-":  # the run's public metadata, before the output is touched
            info = {
                **describe_run(
                    mech, name=name, base_given=opts["base"] is not None, rounded=opts["round"]
                ),
                "clamped": bool(opts["clamp"]),
                "monotone": bool(opts["monotone"]),
            }
            if clock is not None:
                info["clock"] = clock.describe(opts["horizon"])
            write_run_meta(opts["output"], info)
        out: IO[bytes]
        if parquet is not None:
            out = open(os.devnull, "wb")  # noqa: SIM115 - closed below
            stack.callback(parquet.close)
        else:
            out = open_output(
                opts["output"],
                resume,
                ckpt=ckpt,
                digests=digests,
                header=formatter.header(),
                go_on=go_on,
            )
        if opts["output"] != "-":
            stack.push(closing_quietly_on_error(out))
        if opts["view"]:
            from .view.command import start_run_view

            viewer = start_run_view(opts["output"])
            stack.push(viewer.stop_on_error)
        if ckpt is not None and new_run is not None:  # recorded once the output is open
            ckpt.start(**new_run, replace=True)
            ledger = _open_ledger(
                opts, key, ckpt, None, scope=scope, check_scope=not opts["force"], allow=allow
            )
            stack.callback(ledger.close)
        batch = None
        begin_batch = None
        if ckpt is not None:
            batches = ckpt.batches()
            if resume is not None and batches and batches[-1][4] is None:
                batch = batches[-1][0]  # the run that stopped early: this one finishes it
            else:  # recorded by the loop, once the ledger has checked what it must
                begin_batch = partial(
                    ckpt.begin_batch,
                    input=_resolved(opts["input"]),
                    input_mac=_input_mac(opts, digests),
                    first_t=mech.t + 1,
                )
        _run_loop(
            mech,
            infile,
            out,
            opts,
            ckpt=ckpt,
            resume=resume,
            until=until,
            formatter=formatter,
            validator=validator,
            digests=digests,
            stats=stats,
            public_meta=spec.public_meta,
            input_format=input_format,
            quiet=quiet,
            start=(go_on.t, go_on.offset) if go_on is not None else (0, 0),
            batch=batch,
            key=key,
            publish=publish,
            chunks=chunks,
            ledger=ledger,
            begin_batch=begin_batch,
        )
    log_summary(stats, mech, opts)
    if viewer is not None:
        from .view.command import after_run

        after_run(viewer)
    return 0


def _check_until(ckpt: Any, record: Any, until: int, opts: dict[str, Any], digests: Any) -> bool:
    """Refuse an end step before the steps already released, or one that adds nothing.

    Returns True for the command of the batch that ended last run again (the same
    ``--until``, the same input file): it has nothing to do. A batch still open whose
    steps are all written (killed before its end was recorded: state 3 in
    :mod:`dpstream.state`) is neither: this run finishes it.
    """
    if until < record.last_t:
        raise StateError(
            f"--until {until} is before step {record.last_t}, which the run in "
            f"{opts['state']} has already released"
        )
    if until != record.last_t or opts["output"] == "-":
        return False
    try:
        if os.path.getsize(opts["output"]) < record.last_end:
            return False
    except OSError:
        return False
    batches = ckpt.batches()
    if batches and batches[-1][4] is None and batches[-1][3] <= record.last_t:
        return False  # the open batch released steps: finish it (its input is checked)
    ended = [b for b in batches if b[4] is not None]
    unsure = ""
    if ended and ended[-1][4] == until:
        mac = _input_mac(opts, digests)
        if mac is not None and ended[-1][2] == mac:
            return True
        if mac is None:
            unsure = (
                " (from stdin or an empty file the input cannot be told apart: if "
                "this repeats a run that was killed, that run had completed)"
            )
    raise StateError(
        f"the run in {opts['state']} has released every step up to --until "
        f"{until} already{unsure}: give a later --until to release more steps"
    )


def _input_records(infile: Any, opts: dict[str, Any], input_format: str) -> Iterator[Any]:
    """The input's records (``dpstream.io.RawEvent``), in order."""
    from .io import guard_lines, read_events

    csv_opts = {}
    if input_format == "csv":
        csv_opts = dict(
            item_column=opts["item_column"],
            event_column=opts["event_column"],
            time_column=opts["time_column"],
        )
    clock = clock_from_options(opts)
    return read_events(
        guard_lines(infile, opts["input"]),
        input_format,
        time_field=opts["time_field"] if clock else None,
        clock=clock,
        implicit=bool(opts["implicit_time"]),
        user_field=opts.get("user_field"),
        **csv_opts,
    )


def _input_chunks(infile: Any, opts: dict[str, Any], input_format: str) -> Iterator[Any]:
    """The input's records in chunks (``dpstream.ingest.Chunk``), in order: JSON Lines
    with integer steps (with or without user ids) through the columnar reader, the
    other inputs (timestamps, CSV, one step per line) record by record."""
    from .io.chunks import chunks_from_records
    from .io.jsonl import read_jsonl_chunks

    if input_format == "jsonl" and clock_from_options(opts) is None and not opts["implicit_time"]:
        return read_jsonl_chunks(infile, opts["input"], user_field=opts.get("user_field"))
    return chunks_from_records(_input_records(infile, opts, input_format))


def _read_checked(
    infile: Any,
    opts: dict[str, Any],
    input_format: str,
    *,
    validator: Any,
    start_t: int,
    until: int,
    clock: Any,
) -> list[Any]:
    """A batch run's whole input in chunks, refused (:class:`TooManyInvalidError`, before
    anything is written) when more than --max-invalid of its records are invalid.

    The run reads its input to the end before its first release anyway (the steps wait
    for it), so reading it here first costs no memory the run would not take (with
    --implicit-time too: every batch run holds its input, so that too many invalid records
    are refused before anything is written).
    """
    import numpy as np

    chunks = list(_input_chunks(infile, opts, input_format))
    tally = InvalidTally()
    implicit = bool(opts["implicit_time"])
    seen = start_t  # --implicit-time: every record is a step of its own, in input order
    for chunk in chunks:
        steps = np.arange(seen + 1, seen + len(chunk) + 1) if implicit else None
        seen += len(chunk)
        tally.count_chunk(
            chunk,
            validator=validator,
            start=start_t,
            late=bool(start_t),
            limit=until,
            horizon=_horizon(opts),
            steps=steps,
        )
    check_invalid_share(tally, opts, clock=clock)
    return chunks


def _drain(chunks: list[Any]) -> Iterator[Any]:
    """The chunks in order, each let go of by the list as it is taken (so that a step's
    chunks can be freed once the steps that use them are released)."""
    chunks.reverse()
    while chunks:
        yield chunks.pop()


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
                "(a new key and a new state file)"
            )


def _run_loop(
    mech: Any,
    infile: Any,
    out: IO[bytes],
    opts: dict[str, Any],
    *,
    ckpt: Any,
    resume: Resume | None,
    until: int,
    formatter: Any,
    validator: _Validator,
    digests: Any,
    stats: RunStats,
    public_meta: tuple[str, ...],
    input_format: str,
    quiet: bool,
    start: tuple[int, int] = (0, 0),
    batch: int | None = None,
    key: Any = None,
    publish: Any = None,
    chunks: list[Any] | None = None,
    ledger: ReleaseLedger | None = None,
    begin_batch: Callable[[], int] | None = None,
) -> None:
    """Release every step start+1..until; replay (with digest checks) the steps already
    on record. ``start``: the step an earlier run's saved mechanism stopped at, and where
    its last release ends in the output. ``publish``: the readable-counts
    post-processing (:func:`dpstream.registry.make_postprocessor`), in the state that goes
    with ``mech``. ``chunks``: a batch run's input, already read (:func:`_read_checked`).
    ``ledger``: every step is checked against it and appended to it before the state
    records it; when the state is behind it, a batch run checks the input of the steps it
    holds before anything is written. ``begin_batch``: records this run in the state
    (once the ledger has checked it)."""
    from ._crashpoints import write as crash_write
    from .io.chunks import records_step
    from .io.grouping import implicit_steps, step_steps
    from .mechanisms.columns import EventColumns

    horizon = _horizon(opts)
    if publish is None:
        publish = make_postprocessor(opts)
    do_fsync = bool(ckpt is not None and opts["fsync"] and opts["output"] != "-")
    start_t, start_offset = start
    resume_t = resume.last_t if resume is not None else 0
    offset = resume.begin if resume is not None else start_offset
    if resume is None and start_t == 0:
        head = formatter.header()
        if head:
            crash_write(out, head)
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
        batch = (
            events.events()
            if isinstance(events, EventColumns) and not mech.accepts_columns
            else events
        )
        rel = postprocess(publish(_public(mech.step_batch(batch), public_meta)), opts)
        line = formatter.format(rel)
        stats.steps += 1
        stats.events += len(events)
        stats.last_items = len(rel.items)
        input_mac = (
            digests.step_input(t, step.lines, step.lengths, step.raw) if ckpt is not None else None
        )
        release_mac = digests.release(line) if ckpt is not None else None
        if t <= resume_t:
            stored = ckpt.step(t)
            if stored is None:
                raise StateError(f"state file {opts['state']!r} has no step {t}")
            if stored.input_mac != input_mac:
                first = step.first_line or "?"
                raise StateError(
                    f"the input changed: step {t} (input line {first}) differs from the step "
                    f"recorded in {opts['state']}, which was already written; refusing to "
                    "release it again from other data"
                )
            if stored.release_mac != release_mac:
                raise StateError(
                    f"replaying step {t} gave a different release than the one recorded "
                    "(another dpstream or numeric library version?); refusing to resume"
                )
            if ledger is not None:  # on record there too (adopted from the state if not)
                ledger.record(t, input_mac, release_mac)
            if t < resume_t:
                progress.update(t, stats.events)
                return
            assert resume is not None  # t <= resume_t > 0: this run resumes one
            if not line.startswith(resume.written):  # the last step, maybe partly written
                raise StateError(
                    f"output file {opts['output']!r} does not hold the release "
                    f"of step {t} that {opts['state']!r} records as written: "
                    "refusing to resume"
                )
            if opts["output"] != "-":
                out.truncate(offset)  # the output is positioned at `offset`, where t begins
        else:
            if ledger is not None and ckpt is None:  # no state: its scope, once
                ledger.claim_scope()
            elif ledger is not None:  # write-ahead: in the ledger before the state has it
                # (beside a state, so both digests were made)
                assert input_mac is not None and release_mac is not None
                ledger.record(t, input_mac, release_mac)
            if ckpt is not None:  # write-ahead: on record before a byte of it is written
                ckpt.commit(
                    t,
                    begin=offset,
                    end=offset + len(line),
                    release_mac=release_mac,
                    input_mac=input_mac,
                    input_line=(last_line ^ digests.mask(t)) if opts["follow"] else 0,
                )
        try:
            crash_write(out, line)
            out.flush()
            if do_fsync:
                os.fsync(out.fileno())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            where = "stdout" if opts["output"] == "-" else repr(opts["output"])
            again = (
                "run the same command again: it resumes at this step"
                if ckpt is not None
                else "run again with --force (or use --state to be able to resume)"
            )
            raise DPStreamError(
                f"the disk holding the output {where} is full: the run "
                f"stopped at step {t}; free some space and {again}"
            ) from None
        offset += len(line)
        progress.update(t, stats.events)

    def past(t: int) -> str:
        where = f"time step {_short_int(t)}"
        if until < horizon:
            return f"{where} is after --until {until}"
        return f"{where} is past the horizon --horizon {horizon}"

    progress = Progress(until, enabled=not quiet, every=opts["progress_every"], start_t=resume_t)
    with progress:
        if opts["follow"]:  # each step checked by the ledger as it is released
            if begin_batch is not None:
                batch = begin_batch()
            follow(
                infile,
                opts,
                input_format,
                note,
                release,
                mech=mech,
                until=until,
                validator=validator,
                past=past,
                resume_t=resume_t,
                ckpt=ckpt,
                start_t=start_t,
                key=key,
            )
        else:
            late = (
                "time step {t} was already released by an earlier run (a late event)"
                if start_t
                else None
            )  # events of steps an earlier run released
            source = _input_chunks(infile, opts, input_format) if chunks is None else _drain(chunks)
            if opts["implicit_time"]:  # every line is a step: record by record
                steps: Iterable[Any] = implicit_steps(counted(source), start=start_t)
            else:
                # a record past --until is rejected without moving the clock (limit)
                steps = step_steps(
                    counted(source), horizon, start=start_t, late_message=late, limit=until
                )
            if ledger is not None and ledger.last_t > max(resume_t, start_t):
                steps = _ledger_precheck(
                    steps,
                    ledger,
                    digests,
                    opts,
                    after=max(resume_t, start_t),
                    through=min(ledger.last_t, until),
                )
            if begin_batch is not None:
                batch = begin_batch()
            # records past the end come out as they are read; they are rejected after
            # the steps are released, where they stand in an input in time order
            # (their lines and errors only: the rest is freed)
            beyond: list[Any] = []
            for step in steps:
                if step.t is None:  # malformed records after the last step
                    validator.events(step)
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
                    release(step.t, step)
            for step in beyond:
                validator.events(step, past=past(step.t))
        for t in range(mech.t + 1, until + 1):  # the public clock: every step up to the end
            release(t, [])
    out.flush()
    if ckpt is not None:
        summary = {
            "steps": stats.steps,
            "events": stats.events,
            "truncated": stats.truncated,
            "skipped": stats.skipped,
            "occurrences": stats.occurrences,
            "dropped_occurrences": stats.dropped,
            "last_t": int(mech.t),
            "input_records": read,
        }
        # one transaction: every step written and "ready for the next batch" are one
        # state (dpstream.state, "Kill points")
        finished = until == horizon
        ckpt.end_batch(
            batch,
            until,
            None if finished or batch is None else _snapshot_or_none(mech, publish, key, ckpt),
            summary=summary,
            finished=finished,
        )


def _snapshot_context(ckpt: Any, params: str, t: int) -> bytes:
    """What a snapshot is bound to: the run's parameters, its random id and the step."""
    return f"{params}\0{ckpt.run_id()}\0{t}".encode()


def _snapshot_or_none(mech: Any, publish: Any, key: Any, ckpt: Any) -> bytes | None:
    """The snapshot for the next run (the mechanism and its readable-counts
    post-processing), or None (logged) if it cannot be saved."""
    from .snapshot import dump_snapshot

    try:
        return dump_snapshot(
            (mech, publish), key, _snapshot_context(ckpt, ckpt.load().params, mech.t)
        )
    except TypeError as exc:
        _log.warning(f"{exc}; the next run must read the whole stream again")
        return None


def noise_scope(mech: Any, stream: str) -> str:
    """The purpose a mechanism draws its noise under (its stream name, the input settings
    of :func:`scoped_stream`, the noise version and every setting that shapes the noise):
    two runs under one key draw the same noise exactly when these are equal. A mechanism
    that names none gets its stream name, which is coarser (more runs share it)."""
    for part in (mech, getattr(mech, "histogram", None)):  # top-k by KnownBase: its histogram
        for attr in ("noise_scope", "noise_purpose", "tree_purpose"):
            value = getattr(part, attr, None)
            if isinstance(value, str):
                return value
    return stream


def _new_run_scope(
    opts: dict[str, Any], key: Any, scope: str, own: str
) -> tuple[ReleaseLedger, frozenset[str]]:
    """Open the ledger for a new run (one that no state resumes) and refuse it
    (:class:`LedgerError`, before anything is written) when another run released steps
    under the same noise scope; with ``--force``, warn and go on.

    ``own``: the run id a state left with no step on record (``""``: none). The ledger may
    hold its scope and its first step (a kill between the ledger and the state): it is let
    through, and returned to be allowed when the scope line of the new run is appended.
    Returns the ledger (open under ``own`` or a fresh run id) and the run ids allowed.
    """
    ledger = ReleaseLedger(
        ledger_path(opts),
        key,
        own or secrets.token_hex(16),
        fsync=bool(opts["fsync"]),
        scope=scope,
        check_scope=not opts["force"],
    )
    try:
        others = ledger.others()
        allow: frozenset[str] = frozenset()
        if own and ledger.in_scope(own):
            if ledger.last_t > 1:  # the state forgot steps it released: not a kill
                others.append(own)
            else:
                allow = frozenset([own])
        if others and not opts["force"]:
            raise LedgerError(scope_refusal(ledger.path, len(others)))
        if others:
            _log.warning(
                f"--force: the release ledger {ledger.path} records "
                f"{len(others)} earlier run(s) that released steps with the same "
                "key and settings; this run draws the same noise from its data, "
                "which is safe only if those releases were never published"
            )
        return ledger, allow
    except BaseException:
        ledger.close()
        raise


def _open_ledger(
    opts: dict[str, Any],
    key: Any,
    ckpt: Any,
    record: Any,
    *,
    scope: str | None = None,
    check_scope: bool = False,
    allow: frozenset[str] = frozenset(),
) -> ReleaseLedger:
    """The release ledger of the run in the state, checked against it.

    The state's last step must be the ledger's; steps the state holds and the
    ledger lacks (a state written by a dpstream without a ledger, or a ledger
    restored from a backup) are appended. A state behind the ledger (restored
    from a backup, or killed between the two) is let through with a warning:
    the steps the ledger holds are then released again only from the same
    input (:func:`_ledger_precheck`, and :meth:`ReleaseLedger.record`).
    """
    ledger = ReleaseLedger(
        ledger_path(opts),
        key,
        ckpt.run_id(),
        fsync=bool(opts["fsync"]),
        scope=scope,
        check_scope=check_scope,
        allow=allow,
    )
    try:
        last = record.last_t if record is not None else 0
        common = min(last, ledger.last_t)
        if common:
            ours, theirs = ckpt.step(common), ledger.entry(common)
            if (
                theirs is None
                or not ours.input_mac.startswith(theirs.input_mac)
                or not ours.release_mac.startswith(theirs.release_mac)
            ):
                raise LedgerError(
                    f"the release ledger {ledger.path!r} records step {common} of the run in "
                    f"{opts['state']} otherwise than the state does: refusing to go on"
                )
        if ledger.last_t < last:
            steps = (
                (t, s.input_mac, s.release_mac)
                for t, s in ((t, ckpt.step(t)) for t in range(ledger.last_t + 1, last + 1))
            )
            had = ledger.last_t
            ledger.adopt(steps)
            if had:
                _log.warning(
                    f"the release ledger {ledger.path} ended at step {had} of the run "
                    f"in {opts['state']}, which has released {last}: restored from a "
                    "backup? the steps were added from the state; keep the ledger "
                    "on storage that is never rolled back"
                )
        elif ledger.last_t > last:
            _log.warning(
                f"the state {opts['state']} is behind the release ledger "
                f"{ledger.path}: steps {last + 1}..{ledger.last_t} were released "
                "after it was saved (restored from a backup, or a kill between the "
                "two); they are released again only from the same input"
            )
        if last:  # a run released before the ledger kept scopes: its scope, now
            ledger.claim_scope()
    except BaseException:
        ledger.close()
        raise
    return ledger


def _ledger_precheck(
    steps: Iterable[Any],
    ledger: ReleaseLedger,
    digests: Any,
    opts: dict[str, Any],
    *,
    after: int,
    through: int,
) -> Iterator[Any]:
    """``steps``, once the input of steps after+1..through (released by an earlier run,
    which the state does not remember) was found the same as the ledger records.

    A batch run reads its input to the end before it releases, so this costs no extra
    read: it holds those steps (their input is held anyway) and refuses a changed one
    before a byte is written or the state is touched.
    """
    import itertools

    from .io.chunks import records_step

    held: list[Any] = []
    want = after + 1

    def check(t: int, step: Any) -> None:
        if not ledger.same(t, digests.step_input(t, step.lines, step.lengths, step.raw)):
            raise LedgerError(
                f"the state {opts['state']} is behind the release ledger {ledger.path}: step "
                f"{t} was released (after the state was saved) from other input than this "
                "run's; releasing it again from other data would publish the exact "
                "difference of the true counts. Give this run the input those steps were "
                f"released from (steps {after + 1}..{through}), or the state that recorded "
                "them"
            )

    it = iter(steps)
    for step in it:
        held.append(step)
        if step.t is None or step.t <= after or step.t > through:
            continue
        for t in range(want, step.t):  # steps without records (none in a batch run)
            check(t, records_step(t, []))
        check(step.t, step)
        want = step.t + 1
        if want > through:
            break
    for t in range(want, through + 1):  # the steps after the input's last record
        check(t, records_step(t, []))
    return itertools.chain(held, it)


def _open_run(
    ckpt: Any,
    opts: dict[str, Any],
    mech: Any,
    domain_sha256: str | None,
    key: Any,
    input_format: str,
    output_format: str,
    header: bytes,
) -> tuple[Any, dict[str, str] | None]:
    """Check that this run continues the one recorded in the state file.

    Returns ``(record, None)`` to resume the recorded run, or ``(None, ident)``
    for a new run, to be recorded (:meth:`Checkpoint.start`) once the output
    is open. A recorded run with no step on record wrote nothing (a step is
    recorded before its release is written), so it is replaced by this one,
    new parameters and all.
    """
    from .io import resolve_path
    from .state import canonical_json

    params = canonical_json(_run_params(opts, mech, domain_sha256, input_format, output_format))
    ident = dict(
        params=params,
        key_fingerprint=key.fingerprint(),
        input=resolve_path(opts["input"]),
        output=resolve_path(opts["output"]),
    )
    record = ckpt.load()
    if record is None or (record.steps == 0 and not record.finished):
        return None, ident
    _check_truncation_rule(ckpt.path, record.params)
    if ckpt.snapshot() is not None:  # a stream that goes on: each run brings its own input
        ident = {**ident, "input": None}
    ckpt.verify(record, **ident)
    return record, None


def _check_truncation_rule(path: str, recorded: str) -> None:
    """Refuse a state whose run truncated by another rule (a state without ``truncation``
    on record keyed the kept items on input line numbers): its stream must not switch
    rules half-way."""
    params = json.loads(recorded)
    if params.get("on_invalid") == "truncate" and "truncation" not in params:
        raise StateError(
            f"state file {path!r} belongs to a run with --on-invalid truncate by an older "
            "rule (the kept items keyed on input line numbers, which made daily runs differ "
            "from one run); this dpstream keys them on each event's step and items. Finish "
            "that stream with the dpstream that began it, or begin a new one (a new --state "
            "and --output)"
        )


def _public(release: Any, keys: tuple[str, ...]) -> Any:
    from .mechanisms.base import Release

    meta = {k: v for k, v in release.meta.items() if k in keys}
    if meta == dict(release.meta):
        return release
    return Release(t=release.t, items=release.items, values=release.values, meta=meta)
