"""The options of ``dpstream run`` and ``plan``: their table, TOML configs, and merging.

Layer 6 of dpstream (the command line's options). One table of :class:`Opt`
serves the parser (:mod:`dpstream.cli`), the TOML config files and the merge
of both into one ``dest -> value`` mapping that ``run``, ``plan`` and Spark
read (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .registry import CLAMP_DEFAULT, MECHANISMS, MONOTONE_DEFAULT


@dataclass(frozen=True)
class Opt:
    """One option: its flags, default (shown in --help) and type."""

    flags: tuple[str, ...]
    dest: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | tuple[int, ...] | None = None
    kind: str = "value"  # "value", "flag" (store_true) or "bool" (--x/--no-x)
    metavar: str | None = None
    default_text: str | None = None  # what --help shows as the default


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _share(text: str) -> str:
    """An argparse type: a share from 0 to 1, as a number or a percentage (kept as text,
    read exactly by :func:`dpstream.run_guard.parse_share`)."""
    from .run_guard import parse_share

    try:
        parse_share(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return str(text).strip()


def _eta(text: str) -> float | str:
    if str(text) == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


MECH_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--mechanism", "-m"),
        "mechanism",
        "the mechanism: " + "; ".join(f"{s.name} = {s.summary}" for s in MECHANISMS.values()),
        "known",
        choices=tuple(MECHANISMS),
    ),
    Opt(
        ("--horizon", "-T"),
        "horizon",
        "T, the number of time steps (leave it out for a "
        "stream with no planned end: -m known and -m unknown, with --until or --follow; "
        "docs/operations.md)",
        None,
        _positive_int,
        metavar="T",
        default_text="none: no planned end (known, unknown); required otherwise",
    ),
    Opt(
        ("--domain",),
        "domain",
        "file of the known domain: one item per line, or a JSON array (known, top-k; "
        "optional for meta)",
        None,
        str,
        metavar="FILE",
    ),
    Opt(
        ("--max-items",),
        "max_items",
        "the most distinct items one event may hold: the privacy cost grows with it (known, "
        "unknown; optional for meta)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--user-field",),
        "user_field",
        "protect users, not events: the JSON field (or CSV "
        "column) holding each event's user id, compared as an exact string (normalise "
        "case, spaces and Unicode upstream); needs --max-items-per-user and "
        "--max-count-per-item (known, unknown, top-k)",
        None,
        str,
        metavar="NAME",
        default_text="none: per event",
    ),
    Opt(
        ("--max-items-per-user",),
        "max_items_per_user",
        "with --user-field: the most "
        "distinct items one user is counted for over the whole stream (later ones are "
        "dropped: first come, first kept)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--max-count-per-item",),
        "max_count_per_item",
        "with --user-field: the most times "
        "one user is counted for one item over the whole stream (1: count users, not "
        "events)",
        None,
        _positive_int,
        metavar="C",
    ),
    Opt(
        ("--k",),
        "k",
        "how many items top-k (and meta's top-k one-shots) release",
        None,
        _positive_int,
        default_text="none; required for top-k",
    ),
    Opt(
        ("--switches",),
        "switches",
        "top-k: the most re-selections of the top-k (s)",
        None,
        _nonneg_int,
        metavar="S",
        default_text="the smallest S with 8^S >= --horizon (3 for T = 379)",
    ),
    Opt(
        ("--eta",),
        "eta",
        "top-k: how far (in counts) an outside item must lead before a switch; 'auto' sizes "
        "it from the noise (a tie sets off a switch with probability 5% over the whole run)",
        "auto",
        _eta,
    ),
    Opt(
        ("--oneshot",),
        "oneshot",
        "meta: the one-shot mechanism run on every tree cell",
        None,
        str,
        choices=("gaussian", "gumbel", "unknown-gaussian", "unknown-gumbel"),
    ),
    Opt(
        ("--kbar",),
        "kbar",
        "meta, unknown-domain one-shots: how many candidates each "
        "selection may consider (at least --k)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--counter",),
        "counter",
        "the running counter of each item (known, unknown, top-k; "
        "--engine spark -m unknown: tree only): tree "
        "(the paper's r-ary tree) or blt (a buffered Toeplitz factorization: same privacy, "
        "about 3x less noise per count)",
        None,
        str,
        choices=("tree", "blt"),
        default_text="the one with less noise for T: blt, or tree for T = 1 or with --base",
    ),
    Opt(
        ("--blt-buffers",),
        "blt_buffers",
        "the BLT counter's buffers per item (1-10): "
        "fewer keep 8 bytes per item less each, for more noise (the count's std grows "
        "by 2% with 2 and 18% with 1 at T = 1,000; 20% and 115% at T = 10^6)",
        None,
        _positive_int,
        metavar="K",
        default_text="4",
    ),
    Opt(
        ("--base",),
        "base",
        "the base of the tree counter (e.g. 8: a tree counter with base 8)",
        None,
        _positive_int,
        metavar="R",
        default_text="r*, the base that minimises the worst-case noise for T",
    ),
    Opt(
        ("--remember",),
        "remember",
        "unknown: keep showing an item once it was shown (no "
        "flicker; post-processing of the releases, no privacy cost)",
        True,
        kind="bool",
    ),
    Opt(
        ("--threshold-delta",),
        "threshold_delta",
        "unknown/meta: delta of the discovery threshold (required with --rho or --tau; with "
        "--epsilon/--delta the default splits delta to minimise the threshold)",
        None,
        _positive_float,
        metavar="D",
    ),
    Opt(
        ("--stream",),
        "stream",
        "a name separating this stream's noise from other streams under the same key",
        "default",
        str,
        metavar="NAME",
    ),
    Opt(
        ("--epsilon",),
        "epsilon",
        "privacy budget epsilon (with --delta)",
        None,
        _positive_float,
        metavar="E",
    ),
    Opt(
        ("--delta",),
        "delta",
        "privacy budget delta (with --epsilon)",
        None,
        _positive_float,
        metavar="D",
    ),
    Opt(
        ("--rho",),
        "rho",
        "privacy budget as rho-zCDP (instead of --epsilon/--delta)",
        None,
        _positive_float,
        metavar="R",
    ),
    Opt(
        ("--tau",),
        "tau",
        "the noise scale tau itself (instead of a budget; for experts)",
        None,
        _positive_float,
    ),
)

#: The public clock's settings, shared by ``run`` and ``plan`` (which reads --end).
CLOCK_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--step",),
        "step",
        "with --time-field: the width of a time step: s, m or min, h, "
        "d, w (e.g. 1h, 15min, 2h30m, 1w), or mo for calendar months (1mo: step t begins on "
        "--start's day and time, t - 1 months later; --start on day 1-28); 'M' is refused "
        "(minutes or months?)",
        None,
        str,
        metavar="DURATION",
    ),
    Opt(
        ("--start",),
        "start",
        "with --time-field: when step 1 begins (ISO-8601, e.g. "
        "2026-03-01T00:00Z, or epoch seconds; its UTC offset is the clock's time zone); "
        "public, never read from the data",
        None,
        str,
        metavar="TIMESTAMP",
    ),
    Opt(
        ("--end",),
        "end",
        "with --start and --step: when the last step ends, instead of "
        "--horizon (T is the number of steps from --start to --end; --end must fall where a "
        "step ends; both given must agree)",
        None,
        str,
        metavar="TIMESTAMP",
        default_text="none: --horizon",
    ),
)

RUN_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--key-file",),
        "key_file",
        "the secret noise key (create one with `dpstream keygen PATH`)",
        None,
        str,
        metavar="PATH",
        default_text="none, required",
    ),
    Opt(
        ("--noise-version",),
        "noise_version",
        "how Gaussian noise is drawn from the key: 2 "
        "(the ziggurat method) or 1 (the inverse CDF), only to go on with a stream that "
        "drew version 1 (dpstream 0.1; --engine spark of 0.2); the two give independent "
        "noise of the same distribution",
        None,
        int,
        choices=(1, 2),
        metavar="V",
        default_text="2 for a new run; a resumed run keeps the version it began with",
    ),
    Opt(
        ("--input", "-i"),
        "input",
        "events to read, '-' for stdin; *.gz is decompressed",
        "-",
        str,
        metavar="PATH",
    ),
    Opt(
        ("--input-format",),
        "input_format",
        "jsonl or csv; auto = csv for *.csv[.gz], else jsonl",
        "auto",
        str,
        choices=("auto", "jsonl", "csv"),
    ),
    Opt(("--item-column",), "item_column", "CSV input: the item column", "item", str),
    Opt(
        ("--event-column",),
        "event_column",
        "CSV input: the event-id column; an event is "
        "every row of one id in one time step, wherever the rows stand in the input (an id "
        "in two steps is two events)",
        "event",
        str,
    ),
    Opt(
        ("--time-column",),
        "time_column",
        "CSV input: the time-step column",
        None,
        str,
        default_text="none; CSV input needs it, or --time-field for timestamps",
    ),
    Opt(
        ("--implicit-time",),
        "implicit_time",
        "JSON Lines without time steps: every line "
        "is a step of its own, blank and broken lines too (then the guarantee hides what a "
        "line holds, not whether it exists; not for a stream that goes on over several runs)",
        False,
        kind="flag",
    ),
    Opt(
        ("--time-field",),
        "time_field",
        "the JSON field (or CSV column) holding each "
        "event's timestamp, ISO-8601 or epoch seconds: steps then come from the public "
        'clock --start/--step, not from "t"',
        None,
        str,
        metavar="NAME",
    ),
    *CLOCK_OPTS,
    Opt(
        ("--follow",),
        "follow",
        "with --time-field: follow a growing --input (like tail -f; "
        "stdin until it closes) and release each step when the clock has passed its end "
        "(plus --lateness), with events or without; an event for a step already released "
        "is late (see --on-invalid)",
        False,
        kind="flag",
    ),
    Opt(
        ("--lateness",),
        "lateness",
        "with --follow: how long after a step's end its events may still arrive, e.g. 5m",
        None,
        str,
        metavar="DURATION",
        default_text="0s",
    ),
    Opt(
        ("--output", "-o"),
        "output",
        "where to write the releases, '-' for stdout "
        "(exactly-once with --state needs a file; not compressed, and not the input, key, "
        "domain, config or state file; for a table, prefer .parquet to .csv: see "
        "--output-format)",
        "-",
        str,
        metavar="PATH",
    ),
    Opt(
        ("--output-format",),
        "output_format",
        "jsonl (one line per step), or a long "
        "table with one row per released item per step and the columns t, item, value, "
        "noise_std (and step_start, ISO-8601, with --start/--step): csv, jsonl-long or "
        "parquet (needs pyarrow; not with --state); auto = by the --output suffix (.csv, "
        ".parquet), else jsonl. In csv, a step that releases no item is a row with an empty "
        "item, and pandas' read_csv also reads items named NA, null or None as empty (NaN): "
        "prefer parquet, or read with keep_default_na=False, na_values=['']",
        "auto",
        str,
        choices=("auto", "jsonl", "csv", "jsonl-long", "parquet"),
    ),
    Opt(
        ("--top",),
        "top",
        "write only the N largest released counts of each step "
        "(post-processing of the release: free; e.g. for a large known domain)",
        None,
        _positive_int,
        metavar="N",
        default_text="all",
    ),
    Opt(
        ("--min-value",),
        "min_value",
        "write only the counts of at least this value "
        "(post-processing: free; e.g. 1 to leave out items the noise made small)",
        None,
        float,
        metavar="V",
        default_text="all",
    ),
    Opt(
        ("--round",),
        "round",
        "write counts rounded to integers (the default, and the safe "
        "choice: the low-order bits of floating-point noise can leak the true count; "
        "rounding is free post-processing); --no-round writes the exact floats",
        True,
        kind="bool",
    ),
    Opt(
        ("--clamp",),
        "clamp",
        "publish a count below 0 as 0 (post-processing; see docs/utility.md for its bias)",
        CLAMP_DEFAULT,
        kind="bool",
    ),
    Opt(
        ("--monotone",),
        "monotone",
        "never publish a count below the last one published for "
        "the same item: running counts do not go down (post-processing; see docs/utility.md "
        "for its bias)",
        MONOTONE_DEFAULT,
        kind="bool",
    ),
    Opt(
        ("--on-invalid",),
        "on_invalid",
        "what to do with an event with more than --max-items items, an item outside "
        "--domain, a malformed line or a step past --until/--horizon: skip (drop the event, "
        "count it in the summary; the releases stay on the public clock), truncate (keep "
        "--max-items items chosen by the keyed PRF, drop items outside the domain; skip what "
        "cannot be truncated) or error (stop at it: the output then ends where the bad "
        "event was, which publishing it would reveal)",
        "skip",
        str,
        choices=("error", "truncate", "skip"),
    ),
    Opt(
        ("--max-invalid",),
        "max_invalid",
        "a batch run writes nothing and exits with an "
        "error when more than this share of its input records are invalid (a missing time "
        "field, a --step typo, a wrong --domain...), counted before the first release: a "
        "share from 0 to 1 or a percentage (0.05 or 5%; 0: no invalid record, 1: no limit); "
        "a decision on the raw data, for the operator (docs/privacy.md)",
        "0.05",
        _share,
        metavar="SHARE",
    ),
    Opt(
        ("--verbose-errors",),
        "verbose_errors",
        "let error messages quote the offending "
        "record's content (items are private data: off by default)",
        False,
        kind="flag",
    ),
    Opt(
        ("--until",),
        "until",
        "the last time step this run releases (a public end step, "
        "for a stream that is still going: run again with the same --state and a later "
        "--until to go on); every step up to it is released, with events or without",
        None,
        _positive_int,
        metavar="N",
        default_text="--horizon",
    ),
    Opt(
        ("--force",),
        "force",
        "start a new run even though --output already holds "
        "releases (overwriting them), or the release ledger records a run of the same key "
        "and settings: your statement that the earlier release was never published (the "
        "same noise on other data publishes the difference; what was published still "
        "counts against the budget)",
        False,
        kind="flag",
    ),
    Opt(
        ("--allow-readable-key",),
        "allow_readable_key",
        "use a --key-file that other users "
        "can read (refused by default: anyone who reads the key can remove the noise)",
        False,
        kind="flag",
    ),
    Opt(
        ("--allow-readable-state",),
        "allow_readable_state",
        "use a --state file that other "
        "users can read (refused by default: the state is as private as the input)",
        False,
        kind="flag",
    ),
    Opt(
        ("--state",),
        "state",
        "SQLite checkpoint: commit every step, resume after a crash, "
        "refuse another key or parameters",
        None,
        str,
        metavar="FILE.sqlite",
    ),
    Opt(
        ("--ledger",),
        "ledger",
        "the release ledger: an append-only record of every run's "
        "noise scope (a new run of the same key and settings is refused) and, with --state, "
        "of every step each run released, checked and extended at every step, so that a "
        "state restored from a backup cannot release a step again from other input; keep it "
        "on storage that is never rolled back (docs/operations.md)",
        None,
        str,
        metavar="PATH",
        default_text="KEY-FILE.ledger, beside --key-file",
    ),
    Opt(
        ("--fsync",),
        "fsync",
        "with --state, fsync the output and the state at every step: "
        "durable against power loss, but it costs about 8 ms per step on a typical disk "
        "(a 10,000-step run spends over a minute in fsync). --no-fsync is still safe "
        "against a killed process (kill -9, out of memory, Ctrl-C): use it when power loss "
        "or an OS crash is not the concern",
        True,
        kind="bool",
    ),
    Opt(
        ("--quiet", "-q"),
        "quiet",
        "no progress and no summary on stderr (warnings and errors only)",
        False,
        kind="flag",
    ),
    Opt(
        ("--log-format",),
        "log_format",
        "stderr lines as text or as one JSON object per line (for log collectors)",
        "text",
        str,
        choices=("text", "json"),
    ),
    Opt(
        ("--progress-every",),
        "progress_every",
        "when stderr is not a terminal, log a "
        "progress line (step, events/s, time left) every this many seconds",
        10.0,
        _positive_float,
        metavar="SECONDS",
    ),
    Opt(
        ("--engine",),
        "engine",
        "local (NumPy, one machine) or spark (PySpark, the "
        "`dpstream[spark]` extra; known and unknown mechanisms; see docs/spark.md)",
        "local",
        str,
        choices=("local", "spark"),
    ),
    Opt(("--master",), "master", "Spark master URL (with --engine spark)", "local[*]", str),
    Opt(
        ("--view",),
        "view",
        "serve a live web page of the releases while the run writes "
        "them (needs --output FILE.jsonl; the address is printed; after the run the page "
        "stays until Ctrl-C; see `dpstream view`)",
        False,
        kind="flag",
    ),
)

PLAN_OPTS: tuple[Opt, ...] = (
    *CLOCK_OPTS,
    Opt(
        ("--domain-size",),
        "domain_size",
        "size of the known domain when --domain is not given (placeholder items are used)",
        None,
        _positive_int,
        metavar="D",
    ),
    Opt(
        ("--target-error",),
        "target_error",
        "give the budget needed for this half-width "
        "of a 95% interval of a count at the worst step (instead of a budget)",
        None,
        _positive_float,
        metavar="E",
    ),
    Opt(("--json",), "json", "print the plan as JSON", False, kind="flag"),
    Opt(
        ("--explain",),
        "explain",
        "also say where each number comes from, with the paper's "
        "algorithms, theorems and equations",
        False,
        kind="flag",
    ),
)


def _fmt_default(opt: Opt) -> str:
    if opt.default_text is not None:
        return opt.default_text
    if opt.kind == "flag":
        return "off"
    if opt.kind == "bool":
        return "on" if opt.default else "off"
    if opt.default is None:
        return "none"
    return str(opt.default)


def add_options(parser: argparse.ArgumentParser, opts: Iterable[Opt]) -> None:
    """Add ``opts`` with default SUPPRESS (so a given flag is told from a default)."""
    for opt in opts:
        text = f"{opt.help} (default: {_fmt_default(opt)})".replace("%", "%%")
        if opt.kind == "flag":
            parser.add_argument(
                *opt.flags, dest=opt.dest, action="store_true", default=argparse.SUPPRESS, help=text
            )
        elif opt.kind == "bool":
            parser.add_argument(
                *opt.flags,
                dest=opt.dest,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=text,
            )
        else:  # (no type: the text as given, as str leaves it)
            parser.add_argument(
                *opt.flags,
                dest=opt.dest,
                choices=opt.choices,
                type=str if opt.type is None else opt.type,
                default=argparse.SUPPRESS,
                metavar=opt.metavar,
                help=text,
            )


def _load_config(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte-order mark is allowed
    except UnicodeDecodeError:
        raise ValueError(f"config file {path!r} is not valid UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path!r}: {exc}") from None
    if isinstance(data.get("run"), dict):  # an optional [run] table
        data = {**{k: v for k, v in data.items() if k != "run"}, **data["run"]}
    return {k.replace("-", "_"): v for k, v in data.items()}


def merge_options(
    args: argparse.Namespace,
    opts: Sequence[Opt],
    config: dict[str, Any] | None,
    ignore: Iterable[Opt] = (),
) -> dict[str, Any]:
    """Command-line flags over the config file over the defaults, checked like flags.

    Options of ``ignore`` may appear in the config file and are left out (so
    that ``plan`` reads a config file written for ``run``).
    """
    given = vars(args)
    out: dict[str, Any] = {}
    known = {o.dest: o for o in opts}
    if config:
        ignored = {o.dest for o in ignore}
        unknown = sorted(set(config) - set(known) - ignored)
        if unknown:
            raise ValueError(f"config file: unknown option {unknown[0]!r}")
    for opt in opts:
        if opt.dest in given:
            out[opt.dest] = given[opt.dest]
        elif config and opt.dest in config:
            out[opt.dest] = _config_value(opt, config[opt.dest])
        else:
            out[opt.dest] = opt.default
    return out


def _config_value(opt: Opt, value: Any) -> Any:
    name = opt.flags[0]
    if opt.kind in ("flag", "bool"):
        if not isinstance(value, bool):
            raise ValueError(f"config file: {name} must be true or false, got {value!r}")
        return value
    if opt.dest == "domain" and isinstance(value, list):
        return value  # the domain itself
    if isinstance(value, (dict, list)) or isinstance(value, bool):
        raise ValueError(f"config file: {name} must be a single value, got {value!r}")
    if opt.type is not None:
        try:
            value = opt.type(str(value))
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"config file: {name}: {exc}") from None
    if opt.choices is not None and value not in opt.choices:
        allowed = ", ".join(map(str, opt.choices))
        raise ValueError(f"config file: {name} must be one of {allowed}, got {value!r}")
    return value


def resolve_horizon(opts: dict[str, Any]) -> None:
    """``--end``: set ``opts["horizon"]`` to the number of steps from --start to --end.

    Refuses an --end without --start and --step, one that does not fall where a step
    ends, and a --horizon that gives another T (``run`` and ``plan`` alike).
    """
    end = opts.get("end")
    if end is None:
        return
    if opts.get("start") is None or opts.get("step") is None:
        raise ValueError(
            "--end needs --start and --step: T is the number of steps from --start to --end"
        )
    from .clock import StepClock, steps_until

    try:
        horizon = steps_until(StepClock.parse(str(opts["start"]), str(opts["step"])), end)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--start/--step/--end: {exc}") from None
    if opts.get("horizon") is not None and int(opts["horizon"]) != horizon:
        raise ValueError(
            f"--horizon {opts['horizon']} and --end {end} disagree: from --start "
            f"{opts['start']} in steps of --step {opts['step']}, --end gives "
            f"T = {horizon}; give one of them"
        )
    opts["horizon"] = horizon


def _domain_option(opts: dict[str, Any]) -> list[str] | None:
    from .io import read_domain

    value = opts.get("domain")
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return read_domain(value)
