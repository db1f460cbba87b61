"""The settings of one ``dpstream run`` (or ``plan``): a frozen :class:`RunConfig`, built
and checked in one place from the flags, the TOML config file and the defaults.

Layer 6 of dpstream (the run's configuration). :meth:`RunConfig.from_args` merges
the three sources (:mod:`dpstream.run.options`), lets ``--end`` give the horizon,
and checks every setting of the mechanism, the budget and the bounds at once
(:mod:`dpstream.run.checks`: one :class:`~dpstream.run.checks.SettingsError` lists
every problem, exit status 2), then, for ``run``, the public end step and the time
mode (one ``ValueError``, exit status 1). ``run``, ``plan`` and the Spark command
read the same object; the stages of a run (docs/architecture.md) take it instead of
an options dict. What the stream on record decides (its noise version, its tree
base) is resolved later, from the state and the output, into a copy
(:func:`dataclasses.replace`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .checks import SettingsError, check_settings, jsonl_column_problems
from .options import (
    MECH_OPTS,
    PLAN_OPTS,
    RUN_OPTS,
    load_config,
    merge_options,
    resolve_horizon,
)
from .settings import auto_format, clock_from_options, input_format

if TYPE_CHECKING:
    from ..clock import StepClock

__all__ = ["RunConfig", "end_problems", "horizon_limit", "last_step"]

#: What a run without --key-file is told (a problem of the settings, listed with the rest).
_NO_KEY = "no key: pass --key-file PATH (create one with `dpstream keygen PATH`; keep it secret)"


@dataclass(frozen=True)
class RunConfig:
    """Every setting of ``dpstream run`` or ``plan``, by its option's ``dest`` name.

    The fields are the options of :mod:`dpstream.run.options` (their defaults are the
    table's, applied by :meth:`from_args`); ``command`` says which command's options
    were merged (``plan`` has no run options, ``run`` no ``plan`` ones), ``config_file``
    is ``--config``, and ``clock`` the public clock of --time-field/--step/--start
    (``None``: integer steps), parsed once when a run's config is built.
    """

    command: str = "run"
    config_file: str | None = None
    # the mechanism and its budget
    mechanism: str = "known"
    horizon: int | None = None
    domain: str | list[str] | None = None
    max_items: int | None = None
    user_field: str | None = None
    max_items_per_user: int | None = None
    max_count_per_item: int | None = None
    k: int | None = None
    switches: int | None = None
    eta: float | str = "auto"
    oneshot: str | None = None
    kbar: int | None = None
    counter: str | None = None
    blt_buffers: int | None = None
    base: int | None = None
    remember: bool = True
    threshold_delta: float | None = None
    stream: str = "default"
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    tau: float | None = None
    # the public clock
    step: str | None = None
    start: str | None = None
    end: str | None = None
    # input
    key_file: str | None = None
    noise_version: int | None = None
    input: str = "-"
    input_format: str = "auto"
    item_column: str = "item"
    event_column: str = "event"
    time_column: str | None = None
    implicit_time: bool = False
    time_field: str | None = None
    follow: bool = False
    lateness: str | None = None
    # output and its post-processing
    output: str = "-"
    output_format: str = "auto"
    top: int | None = None
    min_value: float | None = None
    round: bool = True
    clamp: bool = True
    monotone: bool = False
    # invalid records, the end step, state
    on_invalid: str = "skip"
    max_invalid: str = "0.05"
    allow_empty: bool = False
    verbose_errors: bool = False
    until: int | None = None
    force: bool = False
    overwrite: bool = False
    allow_readable_key: bool = False
    allow_readable_state: bool = False
    replace_unfinished: bool = False
    state: str | None = None
    ledger: str | None = None
    dataset: str | None = None
    budget_cap: float | None = None
    budget_cap_delta: float = 1e-6
    fsync: bool = True
    # reporting and engine
    quiet: bool = False
    log_format: str = "text"
    progress_every: float = 10.0
    memory: str | None = None
    engine: str = "local"
    master: str = "local[*]"
    view: bool = False
    # plan only
    domain_size: int | None = None
    target_error: float | None = None
    json: bool = False
    explain: bool = False
    # resolved when a run's config is built
    clock: StepClock | None = None
    #: --item-column was given (a flag or the config file), not its default: a Parquet
    #: input with both an ``items`` and an ``item`` column is refused without it
    item_column_given: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, command: str = "run") -> RunConfig:
        """The config of ``dpstream run`` (or ``plan``) from its parsed flags: flags over
        the ``--config`` TOML file over the defaults, every setting checked.

        Raises:
            SettingsError: every problem of the mechanism, budget and bounds settings
                (and, for ``run``, a missing end step or key, and a CSV or Parquet
                column option with JSON Lines input), listed at once.
            ValueError: a bad config file; for ``run``, an end step past the horizon
                or a time mode that would let the data move steps.
        """
        path = getattr(args, "config", None)
        toml = load_config(path) if path else None
        if command == "plan":  # a config written for `run` works: its run options are ignored
            opts = merge_options(args, MECH_OPTS + PLAN_OPTS, toml, ignore=RUN_OPTS)
        else:
            opts = merge_options(args, MECH_OPTS + RUN_OPTS, toml)
        resolve_horizon(opts)  # --end gives T
        if command == "plan":
            check_settings(opts)  # the same check as run's: a plan only for what a run accepts
            _check_plan_clock(opts)
            return cls(command=command, config_file=path, **opts)
        no_key = [] if opts["key_file"] is not None else [_NO_KEY]
        named = [  # the column options given (a flag or the config file), not defaults
            d
            for d in ("item_column", "event_column", "time_column")
            if d in vars(args) or d in (toml or {})
        ]
        fmt = input_format(opts["input"], opts["input_format"])
        columns = jsonl_column_problems(fmt, named)
        if opts["follow"] and ("max_invalid" in vars(args) or "max_invalid" in (toml or {})):
            columns.append(  # (review 102: accepted, and without effect)
                "--max-invalid does not apply to --follow: a followed stream is released as "
                "its events come, before the share of invalid ones is known (its progress "
                "lines and summary count what was skipped)"
            )
        check_settings(opts, extra=[*end_problems(opts), *no_key, *columns])
        try:
            until = last_step(opts)
        except ValueError as exc:  # --until past the horizon: a setting's problem too
            raise SettingsError([str(exc)]) from None
        time_mode = _time_mode_problems(opts, until)
        if time_mode:
            raise SettingsError(time_mode)
        given = "item_column" in named
        return cls(
            command=command,
            config_file=path,
            clock=clock_from_options(opts),
            item_column_given=given,
            **opts,
        )

    @cached_property
    def _options(self) -> Mapping[str, Any]:
        dests = MECH_OPTS + (PLAN_OPTS if self.command == "plan" else RUN_OPTS)
        return MappingProxyType({o.dest: getattr(self, o.dest) for o in dests})

    def options(self) -> Mapping[str, Any]:
        """The merged options as a read-only ``dest -> value`` mapping (the command's own
        options only), for the functions that read options by name: the mechanism
        registry, the settings check, the noise scope, the ledger's path."""
        return self._options

    def with_options(self, **changes: Any) -> RunConfig:
        """A copy with some settings replaced (what the stream on record decides)."""
        return replace(self, **changes)

    @property
    def replaces_output(self) -> bool:
        """Whether an --output that holds releases may be replaced: ``--overwrite``, or
        ``--force`` (the operator's word that the earlier release was never published)."""
        return self.force or self.overwrite

    @property
    def last_step(self) -> int:
        """The public end step of this run: ``--until``, or the horizon."""
        return last_step(self.options())

    @property
    def horizon_limit(self) -> int:
        """T, or the step limit 2^40 of a stream with no planned end."""
        return horizon_limit(self.options())

    @property
    def input_kind(self) -> str:
        """The input's format: ``jsonl``, ``csv`` or ``parquet`` (``--input-format auto``
        resolved: by the suffix, and a directory is Parquet)."""
        return input_format(self.input, self.input_format)

    @property
    def output_kind(self) -> str:
        """The output's format (``--output-format auto`` resolved by the path's suffix)."""
        return auto_format(self.output, self.output_format)

    @property
    def users(self) -> bool:
        """Events carry user ids (user-level privacy)."""
        return self.user_field is not None

    @property
    def named_item_column(self) -> str | None:
        """``--item-column`` when it was given, else None (its default: Parquet reads
        ``items``, else ``item``)."""
        return self.item_column if self.item_column_given else None

    def field_names(self) -> tuple[str, ...]:
        """Every field, in order (for tests and tools)."""
        return tuple(f.name for f in fields(self))


def horizon_limit(opts: Mapping[str, Any]) -> int:
    """T (--horizon), or the step limit 2^40 of a stream with no planned end (no
    --horizon: -m known and -m unknown with the BLT fitted for every t)."""
    from ..factorization import MAX_BLT_HORIZON

    return MAX_BLT_HORIZON if opts.get("horizon") is None else int(opts["horizon"])


def end_problems(opts: Mapping[str, Any]) -> list[str]:
    """A run of a stream with no planned end (no --horizon) must end somewhere."""
    if opts.get("horizon") is None and opts.get("until") is None and not opts.get("follow"):
        return [
            "without --horizon (a stream with no planned end) a run needs --until N, the "
            "last time step it releases (a public end step; run again with the same "
            "--state and a later --until to go on), or --follow"
        ]
    return []


def last_step(opts: Mapping[str, Any]) -> int:
    """The public end step of this run: ``--until``, or the horizon. A stream with no
    planned end (no --horizon) has no default: --until, or --follow (which goes on
    until stopped)."""
    horizon = horizon_limit(opts)
    until = opts.get("until")
    problems = end_problems(opts)
    if problems:
        raise ValueError(problems[0])
    if until is None:
        return horizon
    if until > horizon:
        if opts.get("horizon") is None:  # (review 115: it named a --horizon never given)
            raise ValueError(
                f"--until {until} is past the step limit {horizon} (2^40) of a stream "
                "with no planned end"
            )
        raise ValueError(f"--until {until} is past the horizon --horizon {horizon}")
    return int(until)


def _check_plan_clock(opts: Mapping[str, Any]) -> None:
    """``plan`` refuses the --start and --step a run would refuse (a step of ``1M``, a
    monthly clock from the 31st, an unknown unit, one without the other): a plan only
    for what a run accepts."""
    start, step = opts.get("start"), opts.get("step")
    if start is None and step is None:
        return
    if start is None or step is None:
        raise ValueError("--start and --step go together: when step 1 begins, and its width")
    from ..clock import StepClock

    try:
        StepClock.parse(str(start), str(step), opts.get("lateness"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--start/--step: {exc}") from None


def _time_mode_problems(opts: Mapping[str, Any], until: int) -> list[str]:
    """What is wrong, before anything is opened, with a time mode that would let the data
    move steps (listed with the other settings' problems: exit status 2, review 122)."""
    problems: list[str] = []
    clock = clock_from_options(opts)
    fmt = input_format(opts["input"], opts["input_format"])
    if opts["implicit_time"] and clock is not None:
        problems.append("--implicit-time and --time-field are two ways to give steps: use one")
    last = opts.get("horizon") or until  # the last step whose end is written (sidecar, rows)
    if opts["follow"] and opts.get("horizon") is None and opts.get("until") is None:
        last = None  # a stream with no end, on the wall clock: no step past 9999 falls due
    if clock is not None and last is not None:
        try:
            clock.end_of(int(last))
        except (OverflowError, ValueError):
            problems.append(
                f"step {last} of --step {clock.step_text()} from --start "
                f"{clock.iso(clock.start)} would end past the year 9999: a smaller "
                "--horizon (or --until)"
            )
    if fmt == "csv" and clock is None and opts.get("time_column") is None:
        problems.append(
            "CSV input needs its time steps: --time-column (integer steps) or "
            "--time-field with --step and --start (timestamps)"
        )
    if fmt == "parquet" and opts["implicit_time"]:
        problems.append(
            "--implicit-time is for JSON Lines: give each Parquet row its step "
            "(a time column, or --time-field for timestamps)"
        )
    if opts["follow"] and clock is None:  # before the state and the output are made
        problems.append("--follow needs the public clock: --time-field, --step and --start")
    if fmt == "parquet" and (opts["input"] == "-" or opts["follow"]):
        problems.append(
            "Parquet input is read from a file or a directory (--input PATH), in a batch "
            "run (not stdin, not --follow)"
        )
    if opts["follow"] and fmt != "jsonl":
        problems.append("--follow reads JSON Lines input")
    if (
        opts["follow"]
        and auto_format(str(opts["output"] or "-"), opts["output_format"]) == "parquet"
    ):
        problems.append(  # review 122: a follower published nothing for hours
            "--follow writes each step when it is due, and a Parquet file is written whole "
            "when the run ends (a follower killed before then published nothing, its "
            "budget spent): write jsonl or csv with --follow"
        )
    if opts["follow"] and str(opts["input"]).lower().endswith(".gz"):
        problems.append(
            "--follow reads a growing plain file or stdin: a .gz input does not grow line "
            "by line (decompress it into the followed file, or run it as a batch)"
        )
    if opts["implicit_time"] and (until < horizon_limit(opts) or opts["follow"]):
        problems.append(
            "--implicit-time numbers the steps by line, so a stream that goes "
            "on over several runs could count a line twice: give each event "
            'its step ("t" or --time-field) to use --until or --follow'
        )
    if opts["output"] == "-" and (until < horizon_limit(opts) or opts["follow"]):
        problems.append(
            "a stream that goes on over several runs (--until, --follow) needs "
            "--output FILE: the file is the record that stops a step from being "
            "released twice"
        )
    return problems
