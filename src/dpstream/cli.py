"""The ``dpstream`` command: ``run``, ``plan``, ``demo``, ``keygen`` and ``reproduce``.

Layer 6 of dpstream. This module holds the options, the parser and the
mechanism registry (each mechanism module is imported only when asked for);
``run`` itself is :mod:`dpstream.run_command`. Errors are one line on stderr
with exit status 1 (``--debug`` shows the traceback); usage errors exit with
status 2, the problems of the settings all listed at once
(:mod:`dpstream.settings_check`, shared by ``plan`` and ``run``); a closed
pipe on stdout (``dpstream run ... | head``) ends the run quietly with status
141.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import DPStreamError
from .settings_check import SettingsError, check_settings, mechanism_settings

__all__ = ["main", "build_parser", "MECHANISMS", "build_mechanism"]

PROG = "dpstream"


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class MechanismSpec:
    """How the command builds one mechanism.

    Attributes:
        name: the ``--mechanism`` value.
        module, cls: where the class lives (imported lazily).
        domain: ``"required"``, ``"optional"`` or ``"none"`` (``--domain``).
        domain_positional: the constructor takes the domain as first argument.
        max_items: ``"required"``, ``"optional"`` or ``"none"`` (``--max-items``).
        public_meta: the ``Release.meta`` keys that are part of the private
            output (others, e.g. a true number of distinct items, are not
            written).
        summary: one line for ``--help``.
    """

    name: str
    module: str
    cls: str
    domain: str
    domain_positional: bool
    max_items: str
    public_meta: tuple[str, ...]
    summary: str


MECHANISMS: dict[str, MechanismSpec] = {
    "known": MechanismSpec(
        "known", "dpstream.mechanisms.known", "KnownDomainHistogram", "required", True,
        "required", (), "KnownBase: running histogram of a known domain, <= max-items per event"),
    "unknown": MechanismSpec(
        "unknown", "dpstream.mechanisms.unknown", "UnknownDomainHistogram", "none", False,
        "required", ("threshold", "remember"),
        "UnkBase: running histogram of items never listed in advance, <= max-items per event"),
    "top-k": MechanismSpec(
        "top-k", "dpstream.mechanisms.topk", "ContinualTopK", "required", True, "optional",
        ("status", "switches_left", "switched", "selection"),
        "SparseGumb: continual top-k of a known domain, any number of items per event "
        "(with --max-items: SparseGumb, KnownBase's or UnkBase's top-k, whichever lists "
        "items soonest)"),
    "meta": MechanismSpec(
        "meta", "dpstream.mechanisms.meta", "MetaHistogram", "optional", False, "optional",
        ("status",), "MetaAlgo: a one-shot mechanism on every cell of the tree (event mode)"),
}

#: Options passed to the mechanism's constructor when set (CLI dest = keyword).
_MECH_KWARGS = ("max_items", "k", "switches", "eta", "oneshot", "kbar", "counter", "base",
                "remember", "threshold_delta", "stream", "rho", "epsilon", "delta", "tau",
                "max_items_per_user", "max_count_per_item", "noise_version")


def mechanism_class(name: str) -> type:
    """Import the class of mechanism ``name`` (lazily: only the one asked for)."""
    spec = MECHANISMS[name]
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        if exc.name == spec.module:
            raise DPStreamError(
                f"mechanism {name!r} is not available in this version of dpstream "
                f"(module {spec.module} is missing)"
            ) from None
        raise
    return getattr(module, spec.cls)


def build_mechanism(name: str, options: dict[str, Any], key: Any,
                    domain: Sequence[str] | None) -> Any:
    """Build mechanism ``name`` from command-line options (``dest -> value``).

    Options that are ``None`` are left to the constructor's defaults; an
    option the mechanism does not take is an error naming the option. For
    top-k, ``eta = "auto"`` (or unset) is the noise-sized default of
    ``ContinualTopK`` (``eta="auto"``) and an absent ``--switches`` is
    ``default_switches(T)``; with ``--max-items`` top-k is the best of SparseGumb,
    KnownBase's and UnkBase's top-k (:func:`top_k_choice`).
    """
    choice = top_k_choice(name, options, key, domain)
    if choice is not None:
        return choice.mechanism
    if name not in MECHANISMS:
        raise ValueError(f"--mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    spec = MECHANISMS[name]
    cls = mechanism_class(name)
    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    for dest in _MECH_KWARGS:
        value = options.get(dest)
        if value is None or (dest == "remember" and (value is False or "remember" not in params)):
            continue  # --remember (on by default) applies to the mechanisms that remember
        if dest == "eta" and value == "auto":
            continue
        if dest not in params:
            raise ValueError(f"--{dest.replace('_', '-')} does not apply to --mechanism {name}")
        kwargs[dest] = value
    _counter_from_buffers(name, options, kwargs, "counter" in params)
    check_user_options(options)
    if spec.max_items == "required" and "max_items" not in kwargs \
            and "max_items_per_user" not in kwargs:
        raise ValueError(f"--mechanism {name} needs --max-items (the most items an event holds)")
    args: list[Any] = []
    if spec.domain == "required" and domain is None:
        raise ValueError(f"--mechanism {name} needs --domain FILE (the known items)")
    if domain is not None:
        if spec.domain == "none":
            raise ValueError(f"--domain does not apply to --mechanism {name}")
        if spec.domain_positional:
            args.append(list(domain))
        else:
            kwargs["domain"] = list(domain)
    horizon = options.get("horizon")  # None: no planned end (-m known, -m unknown)
    if horizon is None and name not in ("known", "unknown"):
        raise ValueError(f"--mechanism {name} needs --horizon (T, the number of time steps)")
    if name == "top-k":
        if "k" not in kwargs:
            raise ValueError("--mechanism top-k needs --k")
        if "switches" not in kwargs:  # SparseGumb's default s for T (smallest s, 8^s >= T)
            from .mechanisms.topk import default_switches

            kwargs["switches"] = default_switches(int(horizon))
    if name == "meta" and "oneshot" not in kwargs:
        raise ValueError("--mechanism meta needs --oneshot")
    return cls(*args, horizon, key=key, **kwargs)


def _counter_from_buffers(name: str, options: dict[str, Any], kwargs: dict[str, Any],
                          takes_counter: bool) -> None:
    """``--blt-buffers K``: ``kwargs["counter"]`` becomes the K-buffer BLT for --horizon."""
    buffers = options.get("blt_buffers")
    if buffers is None:
        return
    if not takes_counter:
        raise ValueError(f"--blt-buffers does not apply to --mechanism {name}")
    from .mechanisms.counters import counter_with_buffers

    horizon = options.get("horizon")
    if horizon is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    kwargs["counter"] = counter_with_buffers(options.get("counter"), options.get("base"),
                                             buffers, int(horizon))


def check_user_options(options: dict[str, Any]) -> None:
    """User level needs both bounds; one alone is an error (the command line's ``plan``
    and ``run`` also need --user-field with them: :mod:`dpstream.settings_check`)."""
    per_user, per_item = options.get("max_items_per_user"), options.get("max_count_per_item")
    if (per_user is None) != (per_item is None):
        missing = "--max-count-per-item" if per_item is None else "--max-items-per-user"
        raise ValueError(f"user-level privacy needs --max-items-per-user and "
                         f"--max-count-per-item together (missing {missing})")
    if options.get("user_field") is not None and options.get("mechanism") == "meta":
        raise ValueError("--user-field does not apply to --mechanism meta (known, unknown and "
                         "top-k protect users)")


def top_k_choice(name: str, options: dict[str, Any], key: Any,
                 domain: Sequence[str] | None) -> Any:
    """For ``-m top-k --max-items N``: SparseGumb, KnownBase's or UnkBase's top-k, the
    one an item needs the smallest count to be listed by, from public parameters
    (``dpstream.mechanisms.histogram_topk.choose_top_k``); ``None`` otherwise. Without
    --switches, SparseGumb is compared with its default s (``default_switches``)."""
    if name != "top-k" or options.get("max_items") is None:
        return None
    from .mechanisms.histogram_topk import choose_top_k

    probe = build_mechanism(name, {**options, "max_items": None}, key, domain)  # checks
    kwargs = {d: options[d] for d in _MECH_KWARGS
              if options.get(d) is not None and d not in ("max_items", "k", "switches", "eta")
              and d != "remember"}
    if options.get("eta") not in (None, "auto"):
        kwargs["eta"] = options["eta"]
    _counter_from_buffers(name, options, kwargs, True)
    return choose_top_k(probe.domain, probe.horizon, k=probe.k, switches=probe.switches,
                        max_items=options["max_items"], key=key, **kwargs)


# --------------------------------------------------------------------------- options

#: Defaults of the readable-count post-processing, chosen by the measurements
#: in docs/utility.md (bias and error on real streams).
CLAMP_DEFAULT = True
MONOTONE_DEFAULT = False


def make_postprocessor(opts: dict[str, Any]) -> Any:
    """The post-processing ``run`` applies to each release before writing it.

    ``dpstream.postprocess.ReadableCounts`` with --clamp/--monotone/--round;
    lists (top-k, unknown, meta's selections) stay ordered by published value.
    """
    from .postprocess import ReadableCounts

    name = opts.get("mechanism", "known")
    ranked = name in ("unknown", "top-k") or (name == "meta"
                                             and opts.get("oneshot") != "gaussian")
    return ReadableCounts(clamp=bool(opts.get("clamp", CLAMP_DEFAULT)),
                          monotone=bool(opts.get("monotone", MONOTONE_DEFAULT)),
                          round_counts=bool(opts.get("round", True)), ranked=ranked)


@dataclass(frozen=True)
class Opt:
    """One option: its flags, default (shown in --help) and type."""

    flags: tuple[str, ...]
    dest: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
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
    Opt(("--mechanism", "-m"), "mechanism",
        "the mechanism: " + "; ".join(f"{s.name} = {s.summary}" for s in MECHANISMS.values()),
        "known", choices=tuple(MECHANISMS)),
    Opt(("--horizon", "-T"), "horizon", "T, the number of time steps (leave it out for a "
        "stream with no planned end: -m known and -m unknown, with --until or --follow; "
        "docs/operations.md)", None, _positive_int,
        metavar="T", default_text="none: no planned end (known, unknown); required otherwise"),
    Opt(("--domain",), "domain",
        "file of the known domain: one item per line, or a JSON array (known, top-k; "
        "optional for meta)", None, str, metavar="FILE"),
    Opt(("--max-items",), "max_items",
        "the most distinct items one event may hold: the privacy cost grows with it (known, "
        "unknown; optional for meta)",
        None, _positive_int, metavar="N"),
    Opt(("--user-field",), "user_field", "protect users, not events: the JSON field (or CSV "
        "column) holding each event's user id, compared as an exact string (normalise "
        "case, spaces and Unicode upstream); needs --max-items-per-user and "
        "--max-count-per-item (known, unknown, top-k)", None, str, metavar="NAME",
        default_text="none: per event"),
    Opt(("--max-items-per-user",), "max_items_per_user", "with --user-field: the most "
        "distinct items one user is counted for over the whole stream (later ones are "
        "dropped: first come, first kept)", None, _positive_int, metavar="N"),
    Opt(("--max-count-per-item",), "max_count_per_item", "with --user-field: the most times "
        "one user is counted for one item over the whole stream (1: count users, not "
        "events)", None, _positive_int, metavar="C"),
    Opt(("--k",), "k", "how many items top-k (and meta's top-k one-shots) release",
        None, _positive_int, default_text="none; required for top-k"),
    Opt(("--switches",), "switches", "top-k: the most re-selections of the top-k (s)",
        None, _nonneg_int, metavar="S",
        default_text="the smallest S with 8^S >= --horizon (3 for T = 379)"),
    Opt(("--eta",), "eta",
        "top-k: how far (in counts) an outside item must lead before a switch; 'auto' sizes "
        "it from the noise (a tie sets off a switch with probability 5% over the whole run)",
        "auto", _eta),
    Opt(("--oneshot",), "oneshot",
        "meta: the one-shot mechanism run on every tree cell", None, str,
        choices=("gaussian", "gumbel", "unknown-gaussian", "unknown-gumbel")),
    Opt(("--kbar",), "kbar", "meta, unknown-domain one-shots: how many candidates each "
        "selection may consider (at least --k)", None, _positive_int, metavar="N"),
    Opt(("--counter",), "counter", "the running counter of each item (known, unknown, top-k; "
        "--engine spark -m unknown: tree only): tree "
        "(the paper's r-ary tree) or blt (a buffered Toeplitz factorization: same privacy, "
        "about 3x less noise per count)", None, str, choices=("tree", "blt"),
        default_text="the one with less noise for T: blt, or tree for T = 1 or with --base"),
    Opt(("--blt-buffers",), "blt_buffers", "the BLT counter's buffers per item (1-10): "
        "fewer keep 8 bytes per item less each, for more noise (the count's std grows "
        "by 2% with 2 and 18% with 1 at T = 1,000; 20% and 115% at T = 10^6)", None,
        _positive_int, metavar="K",
        default_text="4"),
    Opt(("--base",), "base", "the tree base r", None, _positive_int, metavar="R",
        default_text="r*, the base that minimises the worst-case noise for T"),
    Opt(("--remember",), "remember", "unknown: keep showing an item once it was shown (no "
        "flicker; post-processing of the releases, no privacy cost)", True, kind="bool"),
    Opt(("--threshold-delta",), "threshold_delta",
        "unknown/meta: delta of the discovery threshold (required with --rho or --tau; with "
        "--epsilon/--delta the default splits delta to minimise the threshold)",
        None, _positive_float, metavar="D"),
    Opt(("--stream",), "stream", "a name separating this stream's noise from other streams "
        "under the same key", "default", str, metavar="NAME"),
    Opt(("--epsilon",), "epsilon", "privacy budget epsilon (with --delta)", None,
        _positive_float, metavar="E"),
    Opt(("--delta",), "delta", "privacy budget delta (with --epsilon)", None, _positive_float,
        metavar="D"),
    Opt(("--rho",), "rho", "privacy budget as rho-zCDP (instead of --epsilon/--delta)", None,
        _positive_float, metavar="R"),
    Opt(("--tau",), "tau", "the noise scale tau itself (instead of a budget; for experts)",
        None, _positive_float),
)

#: The public clock's settings, shared by ``run`` and ``plan`` (which reads --end).
CLOCK_OPTS: tuple[Opt, ...] = (
    Opt(("--step",), "step", "with --time-field: the width of a time step: s, m or min, h, "
        "d, w (e.g. 1h, 15min, 2h30m, 1w), or mo for calendar months (1mo: step t begins on "
        "--start's day and time, t - 1 months later; --start on day 1-28); 'M' is refused "
        "(minutes or months?)", None, str, metavar="DURATION"),
    Opt(("--start",), "start", "with --time-field: when step 1 begins (ISO-8601, e.g. "
        "2026-03-01T00:00Z, or epoch seconds; its UTC offset is the clock's time zone); "
        "public, never read from the data", None, str, metavar="TIMESTAMP"),
    Opt(("--end",), "end", "with --start and --step: when the last step ends, instead of "
        "--horizon (T is the number of steps from --start to --end; --end must fall where a "
        "step ends; both given must agree)", None, str, metavar="TIMESTAMP",
        default_text="none: --horizon"),
)

RUN_OPTS: tuple[Opt, ...] = (
    Opt(("--key-file",), "key_file", "the secret noise key (create one with `dpstream "
        "keygen PATH`)", None, str, metavar="PATH", default_text="none, required"),
    Opt(("--noise-version",), "noise_version", "how Gaussian noise is drawn from the key: 2 "
        "(the ziggurat method) or 1 (the inverse CDF), only to go on with a stream that "
        "drew version 1 (dpstream 0.1; --engine spark of 0.2); the two give independent "
        "noise of the same distribution",
        None, int, choices=(1, 2), metavar="V",
        default_text="2 for a new run; a resumed run keeps the version it began with"),
    Opt(("--input", "-i"), "input", "events to read, '-' for stdin; *.gz is decompressed",
        "-", str, metavar="PATH"),
    Opt(("--input-format",), "input_format", "jsonl or csv; auto = csv for *.csv[.gz], "
        "else jsonl", "auto", str, choices=("auto", "jsonl", "csv")),
    Opt(("--item-column",), "item_column", "CSV input: the item column", "item", str),
    Opt(("--event-column",), "event_column", "CSV input: the event-id column; an event is "
        "every row of one id in one time step, wherever the rows stand in the input (an id "
        "in two steps is two events)", "event", str),
    Opt(("--time-column",), "time_column", "CSV input: the time-step column", None, str,
        default_text="none; CSV input needs it, or --time-field for timestamps"),
    Opt(("--implicit-time",), "implicit_time", "JSON Lines without time steps: every line "
        "is a step of its own, blank and broken lines too (then the guarantee hides what a "
        "line holds, not whether it exists; not for a stream that goes on over several runs)",
        False, kind="flag"),
    Opt(("--time-field",), "time_field", "the JSON field (or CSV column) holding each "
        "event's timestamp, ISO-8601 or epoch seconds: steps then come from the public "
        "clock --start/--step, not from \"t\"", None, str, metavar="NAME"),
    *CLOCK_OPTS,
    Opt(("--follow",), "follow", "with --time-field: follow a growing --input (like tail -f; "
        "stdin until it closes) and release each step when the clock has passed its end "
        "(plus --lateness), with events or without; an event for a step already released "
        "is late (see --on-invalid)", False, kind="flag"),
    Opt(("--lateness",), "lateness", "with --follow: how long after a step's end its events "
        "may still arrive, e.g. 5m", None, str, metavar="DURATION", default_text="0s"),
    Opt(("--output", "-o"), "output", "where to write the releases, '-' for stdout "
        "(exactly-once with --state needs a file; not compressed, and not the input, key, "
        "domain, config or state file; for a table, prefer .parquet to .csv: see "
        "--output-format)", "-", str, metavar="PATH"),
    Opt(("--output-format",), "output_format", "jsonl (one line per step), or a long "
        "table with one row per released item per step and the columns t, item, value, "
        "noise_std (and step_start, ISO-8601, with --start/--step): csv, jsonl-long or "
        "parquet (needs pyarrow; not with --state); auto = by the --output suffix (.csv, "
        ".parquet), else jsonl. In csv, a step that releases no item is a row with an empty "
        "item, and pandas' read_csv also reads items named NA, null or None as empty (NaN): "
        "prefer parquet, or read with keep_default_na=False, na_values=['']", "auto", str,
        choices=("auto", "jsonl", "csv", "jsonl-long", "parquet")),
    Opt(("--top",), "top", "write only the N largest released counts of each step "
        "(post-processing of the release: free; e.g. for a large known domain)", None,
        _positive_int, metavar="N", default_text="all"),
    Opt(("--min-value",), "min_value", "write only the counts of at least this value "
        "(post-processing: free; e.g. 1 to leave out items the noise made small)", None,
        float, metavar="V", default_text="all"),
    Opt(("--round",), "round", "write counts rounded to integers (the default, and the safe "
        "choice: the low-order bits of floating-point noise can leak the true count; "
        "rounding is free post-processing); --no-round writes the exact floats", True,
        kind="bool"),
    Opt(("--clamp",), "clamp", "publish a count below 0 as 0 (post-processing; see "
        "docs/utility.md for its bias)", CLAMP_DEFAULT, kind="bool"),
    Opt(("--monotone",), "monotone", "never publish a count below the last one published for "
        "the same item: running counts do not go down (post-processing; see docs/utility.md "
        "for its bias)", MONOTONE_DEFAULT, kind="bool"),
    Opt(("--on-invalid",), "on_invalid",
        "what to do with an event with more than --max-items items, an item outside "
        "--domain, a malformed line or a step past --until/--horizon: skip (drop the event, "
        "count it in the summary; the releases stay on the public clock), truncate (keep "
        "--max-items items chosen by the keyed PRF, drop items outside the domain; skip what "
        "cannot be truncated) or error (stop at it: the output then ends where the bad "
        "event was, which publishing it would reveal)", "skip", str,
        choices=("error", "truncate", "skip")),
    Opt(("--max-invalid",), "max_invalid", "a batch run writes nothing and exits with an "
        "error when more than this share of its input records are invalid (a missing time "
        "field, a --step typo, a wrong --domain...), counted before the first release: a "
        "share from 0 to 1 or a percentage (0.05 or 5%; 0: no invalid record, 1: no limit); "
        "a decision on the raw data, for the operator (docs/privacy.md)", "0.05",
        _share, metavar="SHARE"),
    Opt(("--verbose-errors",), "verbose_errors", "let error messages quote the offending "
        "record's content (items are private data: off by default)", False, kind="flag"),
    Opt(("--until",), "until", "the last time step this run releases (a public end step, "
        "for a stream that is still going: run again with the same --state and a later "
        "--until to go on); every step up to it is released, with events or without",
        None, _positive_int, metavar="N", default_text="--horizon"),
    Opt(("--force",), "force", "start a new run even though --output already holds "
        "releases (overwriting them; what was published from it still counts against the "
        "budget)", False, kind="flag"),
    Opt(("--allow-readable-key",), "allow_readable_key", "use a --key-file that other users "
        "can read (refused by default: anyone who reads the key can remove the noise)",
        False, kind="flag"),
    Opt(("--allow-readable-state",), "allow_readable_state", "use a --state file that other "
        "users can read (refused by default: the state is as private as the input)", False,
        kind="flag"),
    Opt(("--state",), "state", "SQLite checkpoint: commit every step, resume after a crash, "
        "refuse another key or parameters", None, str, metavar="FILE.sqlite"),
    Opt(("--ledger",), "ledger", "with --state, the release ledger: an append-only record of "
        "every step each run released, checked and extended at every step, so that a state "
        "restored from a backup cannot release a step again from other input; keep it on "
        "storage that is never rolled back (docs/operations.md)", None, str, metavar="PATH",
        default_text="KEY-FILE.ledger, beside --key-file"),
    Opt(("--fsync",), "fsync", "with --state, fsync the output and the state at every step: "
        "durable against power loss, but it costs about 8 ms per step on a typical disk "
        "(a 10,000-step run spends over a minute in fsync). --no-fsync is still safe "
        "against a killed process (kill -9, out of memory, Ctrl-C): use it when power loss "
        "or an OS crash is not the concern", True, kind="bool"),
    Opt(("--quiet", "-q"), "quiet", "no progress and no summary on stderr (warnings and "
        "errors only)", False, kind="flag"),
    Opt(("--log-format",), "log_format", "stderr lines as text or as one JSON object per "
        "line (for log collectors)", "text", str, choices=("text", "json")),
    Opt(("--progress-every",), "progress_every", "when stderr is not a terminal, log a "
        "progress line (step, events/s, time left) every this many seconds", 10.0,
        _positive_float, metavar="SECONDS"),
    Opt(("--engine",), "engine", "local (NumPy, one machine) or spark (PySpark, the "
        "`dpstream[spark]` extra; known and unknown mechanisms; see docs/spark.md)", "local",
        str, choices=("local", "spark")),
    Opt(("--master",), "master", "Spark master URL (with --engine spark)", "local[*]", str),
    Opt(("--view",), "view", "serve a live web page of the releases while the run writes "
        "them (needs --output FILE.jsonl; the address is printed; after the run the page "
        "stays until Ctrl-C; see `dpstream view`)", False, kind="flag"),
)

PLAN_OPTS: tuple[Opt, ...] = (
    *CLOCK_OPTS,
    Opt(("--domain-size",), "domain_size", "size of the known domain when --domain is not "
        "given (placeholder items are used)", None, _positive_int, metavar="D"),
    Opt(("--target-error",), "target_error", "give the budget needed for this half-width "
        "of a 95% interval of a count at the worst step (instead of a budget)", None,
        _positive_float, metavar="E"),
    Opt(("--json",), "json", "print the plan as JSON", False, kind="flag"),
    Opt(("--explain",), "explain", "also say where each number comes from, with the paper's "
        "algorithms, theorems and equations", False, kind="flag"),
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
            parser.add_argument(*opt.flags, dest=opt.dest, action="store_true",
                                default=argparse.SUPPRESS, help=text)
        elif opt.kind == "bool":
            parser.add_argument(*opt.flags, dest=opt.dest, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=text)
        else:
            parser.add_argument(*opt.flags, dest=opt.dest, type=opt.type, choices=opt.choices,
                                default=argparse.SUPPRESS, metavar=opt.metavar, help=text)


def _load_config(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
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


def merge_options(args: argparse.Namespace, opts: Sequence[Opt],
                  config: dict[str, Any] | None,
                  ignore: Iterable[Opt] = ()) -> dict[str, Any]:
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
        raise ValueError(f"config file: {name} must be one of {', '.join(opt.choices)}, "
                         f"got {value!r}")
    return value


# --------------------------------------------------------------------------- parser

RUN_EPILOG = """\
input (JSON Lines): one event per line, {"items": ["a", "b"], "t": 3}.
  CSV: one row per (event, item), see --event-column/--item-column and
  --time-column (or --time-field). Items are strings (JSON integers are read
  as text). *.gz is decompressed.
users: with --user-field user, events carry {"user": "alice", ...} and the guarantee
  protects each user (all their events), whose contributions are bounded over the
  stream by --max-items-per-user and --max-count-per-item (first come, first kept).
time steps: events sharing t form one step; an event without t (or a bare
  array such as ["a", "b"]) is an invalid record (see --on-invalid), and CSV
  input without --time-column (or --time-field) is refused. With
  --implicit-time every line is a step of its own ({"items": [...]} or
  ["a", "b"], no t): then the guarantee hides what a line holds (its items
  replaced by none), not whether the line exists. Every step 1..--until
  (default --horizon) is released, with events or without: which steps exist
  never depends on the data.
output (JSON Lines): one line per step, {"t": 3, "released": {"a": 13, ...}}
  (+ "meta" for the mechanism's public extras, e.g. the threshold); floats are
  rounded to integers (--no-round: exact floats). CSV: t,item,value,noise_std;
  pandas' read_csv reads an item named NA, null or None as NaN, like a quiet
  step's empty item: prefer -o FILE.parquet (or keep_default_na=False).
state: with --state, a killed run resumes where it stopped when run again with
  the same command: nothing is written twice and the output equals an
  uninterrupted run's; a finished run is not released again; a step already
  written is never released again from changed input. The state file is as
  private as the input (mode 0600). Exactly-once needs --output FILE (not stdout).
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``dpstream`` argument parser (every option's help states its default)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback on an error (default: off)")
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common],
        description="Differentially private histograms and top-k lists under continual "
                    "observation: a private release at every time step of an event stream.",
        epilog="Start with `dpstream demo`. Each command's --help lists its options.",
    )
    parser.add_argument("--version", action="store_true",
                        help="print the version and exit (default: off)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run", parents=[common], help="release a private histogram at every step of a stream",
        description="Read events, release at every time step, write the releases. Options may "
                    "also come from a TOML file (--config); flags override it.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", metavar="FILE.toml", default=None,
                     help="TOML file with any of these options, named as the long flags "
                          "(e.g. horizon = 1000, max-items = 3) (default: none)")
    add_options(run, MECH_OPTS + RUN_OPTS)

    plan = sub.add_parser(
        "plan", parents=[common], help="show what a budget buys before spending it",
        description="Print tau, the tree base and why, the noise at the worst step, the "
                    "95% interval of a count, the discovery threshold (unknown domain), "
                    "top-k's switches and eta; or, with --target-error, the budget needed.",
    )
    plan.add_argument("--config", metavar="FILE.toml", default=None,
                      help="TOML file with the mechanism options; a file written for `run` "
                           "works, its run-only options are ignored (default: none)")
    add_options(plan, MECH_OPTS + PLAN_OPTS)

    demo = sub.add_parser(
        "demo", parents=[common], help="run on a bundled real dataset and a synthetic stream",
        description="Run a mechanism on the bundled FAA wildlife-strike reports and on a "
                    "simulated Zipf stream; print the top items, true against private, and "
                    "plot them over time.",
    )
    from .demo import add_demo_options

    add_demo_options(demo)

    from .view.command import add_view_parser

    add_view_parser(sub, parents=[common])

    keygen = sub.add_parser("keygen", parents=[common], help="write a new secret noise key",
                            description="Write a new 32-byte key from the OS CSPRNG to PATH "
                                        "(mode 0600; never overwrites).")
    keygen.add_argument("path", metavar="PATH", help="where to write the key (required)")

    reproduce = sub.add_parser(
        "reproduce", parents=[common], help="regenerate the paper's figures and a report",
        description="Run the paper's experiments (base of the tree, continual top-1 on a Zipf "
                    "stream, unknown domain, error against epsilon) and write PNG figures and "
                    "REPORT.md, whose claim checks are computed from the run. Simulation mode: "
                    "per-trial keys derived from a documented seed.",
    )
    reproduce.add_argument("--out", metavar="DIR", default="reproduction",
                           help="directory for the figures and REPORT.md (default: reproduction)")
    reproduce.add_argument("--trials", metavar="N", type=int, default=None,
                           help="trials of every simulated figure (default: the paper's, e.g. "
                                "1000 for the top-1 figure; fewer with --quick)")
    reproduce.add_argument("--quick", action="store_true",
                           help="few trials, under two minutes (default: off, the full run "
                                "takes about ten minutes on 2 cores)")
    reproduce.add_argument("--quiet", "-q", action="store_true",
                           help="no progress on stderr (default: show progress)")
    return parser


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """The console entry point: returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        if args.version:
            from . import __version__

            print(__version__)
            return 0
        if args.command is None:
            parser.print_help(sys.stdout)
            return 0
        handler = {"run": cmd_run, "plan": cmd_plan, "demo": cmd_demo,
                   "keygen": cmd_keygen, "reproduce": cmd_reproduce,
                   "view": cmd_view}[args.command]
        return handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except SettingsError as exc:  # every problem of the command line, one a line
        if debug:
            raise
        print(exc.report(PROG, _user_words), file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `dpstream run ... | head`: the reader left, quietly stop
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a pipeline cut short
    except (DPStreamError, ValueError, TypeError, OSError) as exc:
        if debug:
            raise
        msg = _user_words(str(exc) or type(exc).__name__)
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            msg = f"{exc.filename}: {exc.strerror}"
        print(f"{PROG}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 1


#: Library words in messages, and the command-line words a user typed instead.
_FLAG_WORDS = {"rho": "--rho", "epsilon": "--epsilon", "delta": "--delta", "tau": "--tau",
               "threshold_delta": "--threshold-delta", "max_items": "--max-items",
               "horizon": "--horizon", "base": "--base", "k": "--k", "kbar": "--kbar",
               "switches": "--switches", "eta": "--eta", "stream": "--stream",
               "counter": "--counter", "max_items_per_user": "--max-items-per-user",
               "max_count_per_item": "--max-count-per-item"}


def _user_words(msg: str) -> str:
    """A library message in the command line's words: ``rho=`` becomes ``--rho``,
    ``max_items`` and Delta0 ``--max-items`` (the library names its keyword arguments)."""
    import re

    def flag(m: re.Match[str]) -> str:
        name, value = m.group(1), m.group(2)
        if name not in _FLAG_WORDS:
            return m.group(0)
        return _FLAG_WORDS[name] + (f" {value.strip(chr(39))}" if value else "")

    # 'rho=' (a keyword), 'rho=0.5', "counter='tree'": the flag, then its value
    msg = re.sub(r"\b([a-z][a-z_]*)=('[^']*'|[\w.+-]+)?", flag, msg)
    msg = re.sub(r"\b(max_items|threshold_delta)\b", lambda m: _FLAG_WORDS[m.group(1)], msg)
    msg = msg.replace("m_delta", "the discovery threshold")
    return msg.replace("Delta0", "--max-items")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (e.g. captured in tests)
        pass


def cmd_keygen(args: argparse.Namespace) -> int:
    from .noise import NoiseKey

    key = NoiseKey.generate()
    key.save(args.path)
    print(f"wrote a new key to {args.path} (mode 0600, fingerprint {key.fingerprint()}); "
          "keep it secret: it decrypts the noise", file=sys.stderr)
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .experiments import reproduce

    if args.trials is not None and args.trials < 1:
        raise ValueError(f"--trials must be >= 1, got {args.trials}")
    try:
        path = reproduce(args.out, trials=args.trials, quick=args.quick,
                         progress=not args.quiet)
    except RuntimeError as exc:  # an experiment failed; REPORT.md still says which
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_view(args: argparse.Namespace) -> int:
    from .view.command import cmd_view as view

    return view(args)


# --------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    from . import planning
    from .noise import NoiseKey

    config = _load_config(args.config) if args.config else None
    opts = merge_options(args, MECH_OPTS + PLAN_OPTS, config, ignore=RUN_OPTS)
    resolve_horizon(opts)  # --end gives T
    check_settings(opts)  # the same check as run's: a plan only for what a run accepts
    name = opts["mechanism"]
    spec = MECHANISMS[name]
    domain = _domain_option(opts)
    if domain is None and opts["domain_size"] is not None and spec.domain != "none":
        domain = [f"item-{i}" for i in range(opts["domain_size"])]
    key = NoiseKey.generate()  # throw-away: the plan releases nothing
    target = opts["target_error"]
    if target is not None:
        fixed = {**opts, "delta": None}
        params = inspect.signature(mechanism_class(name)).parameters
        if "threshold_delta" in params and opts["threshold_delta"] is None:
            # the discovery threshold needs its delta; without --threshold-delta, half of
            # --delta (the mechanism pays --max-items times it)
            fixed["threshold_delta"] = opts["delta"] / (2 * (opts["max_items"] or 1))
        with mechanism_settings():
            unit = build_mechanism(name, {**fixed, "tau": 1.0}, key, domain)
        tau = planning.tau_for_target(target, planning.noise_std_worst(unit))
        mech = build_mechanism(name, {**fixed, "tau": tau}, key, domain)
    else:
        with mechanism_settings():
            mech = build_mechanism(name, opts, key, domain)
    used = fixed if target is not None else opts  # the options the mechanism was built from
    info = planning.describe(mech, name=name, base_given=opts["base"] is not None)
    choice = top_k_choice(name, {**opts, "tau": mech.tau, "delta": None} if target is not None
                          else opts, key, domain)
    if choice is not None:
        info["choice"] = choice.reason
        info["top_k"] = choice.name
        info["candidates"] = choice.errors
        info["candidates_noise_std"] = choice.noise_std
    if name == "top-k" and opts.get("switches") is None:
        info["switches_default"] = True
    if hasattr(mech, "threshold_for_cells") and not mech.unbounded:
        # unknown domain: what coarser steps buy
        budget = {"tau": mech.tau, "delta": None} if target is not None else {}
        info["coarser_steps"] = planning.coarser_steps(
            lambda h: build_mechanism(name, {**used, **budget, "horizon": h}, key, domain),
            int(mech.horizon))
    if name == "top-k" and choice is None and opts.get("tau") is None and target is None:
        # would KnownBase's top-k beat SparseGumb if events had a size bound? Its noise
        # grows as sqrt(max_items) for a fixed (epsilon, delta) or rho
        one = top_k_choice(name, {**opts, "max_items": 1}, key, domain)
        ratio = one.errors["SparseGumb"] / one.errors["KnownBase top-k"]
        info["max_items_break_even"] = int(ratio * ratio)
    if spec.max_items != "none" and opts.get("max_items") is not None:
        budget = {"tau": mech.tau, "delta": None} if target is not None else {}

        def std_for(n: int) -> float:
            o = {**used, **budget, "max_items": n}
            if choice is not None:
                return top_k_choice(name, o, key, domain).noise_std["KnownBase top-k"]
            return planning.noise_std_worst(build_mechanism(name, o, key, domain))

        info["max_items_hint"] = planning.max_items_hint(std_for, opts["max_items"])
    if target is not None:
        info["target_error"] = target
    if opts["json"]:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(planning.format_plan(info))
        if opts["explain"]:
            print(planning.explain(info))
    return 0


def resolve_horizon(opts: dict[str, Any]) -> None:
    """``--end``: set ``opts["horizon"]`` to the number of steps from --start to --end.

    Refuses an --end without --start and --step, one that does not fall where a step
    ends, and a --horizon that gives another T (``run`` and ``plan`` alike).
    """
    end = opts.get("end")
    if end is None:
        return
    if opts.get("start") is None or opts.get("step") is None:
        raise ValueError("--end needs --start and --step: T is the number of steps from "
                         "--start to --end")
    from .clock import StepClock, steps_until

    try:
        horizon = steps_until(StepClock.parse(str(opts["start"]), str(opts["step"])), end)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--start/--step/--end: {exc}") from None
    if opts.get("horizon") is not None and int(opts["horizon"]) != horizon:
        raise ValueError(f"--horizon {opts['horizon']} and --end {end} disagree: from --start "
                         f"{opts['start']} in steps of --step {opts['step']}, --end gives "
                         f"T = {horizon}; give one of them")
    opts["horizon"] = horizon


def _domain_option(opts: dict[str, Any]) -> list[str] | None:
    from .io import read_domain

    value = opts.get("domain")
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return read_domain(value)


# --------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    """``dpstream run`` (in :mod:`dpstream.run_command`)."""
    from .run_command import cmd_run as run

    return run(args)
