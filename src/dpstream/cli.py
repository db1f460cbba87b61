"""The ``dpstream`` command: ``run``, ``plan``, ``demo`` and ``keygen``.

Layer 6 of dpstream. ``dpstream run`` reads events (``dpstream.io``), feeds
them step by step to a continual mechanism built from the options through a
small registry (each mechanism module is imported only when asked for),
writes one release per time step, and with ``--state`` checkpoints every step
in SQLite (``dpstream.state``) so that a killed run resumes exactly where it
stopped. Errors are one line on stderr with exit status 1 (``--debug`` shows
the traceback); usage errors exit with status 2; a closed pipe on stdout
(``dpstream run ... | head``) ends the run quietly with status 141.

Before anything is opened, ``run`` refuses an output or state file that is
the input, the key, the domain, the config or each other (through links
too). With ``--state``, a run is recorded only once its output is open; a
recorded run with no committed step and no release in its output is replaced
by the next one (new parameters allowed); a resumed run first checks that the
output still holds the last committed release; and a finished run refuses an
input that has grown since (it never releases again).

Exactly-once output needs a file: with ``--output -`` (stdout) and
``--state``, a resumed run writes only the steps after the last committed one,
but a release printed just before a crash and not yet committed is printed
again on resume.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import DPStreamError, InvalidEventError, StateError

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
        "(with --max-items: the more accurate of SparseGumb and KnownBase's top-k)"),
    "meta": MechanismSpec(
        "meta", "dpstream.mechanisms.meta", "MetaHistogram", "optional", False, "optional",
        ("status",), "MetaAlgo: a one-shot mechanism on every cell of the tree (event mode)"),
}

#: Options passed to the mechanism's constructor when set (CLI dest = keyword).
_MECH_KWARGS = ("max_items", "k", "switches", "eta", "oneshot", "kbar", "base", "remember",
                "threshold_delta", "stream", "rho", "epsilon", "delta", "tau")


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
    ``ContinualTopK`` (``eta="auto"``); with ``--max-items`` top-k is the
    more accurate of SparseGumb and KnownBase's top-k (:func:`top_k_choice`).
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
    if spec.max_items == "required" and "max_items" not in kwargs:
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
    horizon = options.get("horizon")
    if horizon is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    if name == "top-k":
        for req in ("k", "switches"):
            if req not in kwargs:
                raise ValueError(f"--mechanism top-k needs --{req}")
    if name == "meta" and "oneshot" not in kwargs:
        raise ValueError("--mechanism meta needs --oneshot")
    return cls(*args, horizon, key=key, **kwargs)


def top_k_choice(name: str, options: dict[str, Any], key: Any,
                 domain: Sequence[str] | None) -> Any:
    """For ``-m top-k --max-items N``: SparseGumb or KnownBase's top-k, whichever is
    more accurate for the budget (``dpstream.mechanisms.histogram_topk.choose_top_k``);
    ``None`` otherwise."""
    if name != "top-k" or options.get("max_items") is None:
        return None
    from .mechanisms.histogram_topk import choose_top_k

    probe = build_mechanism(name, {**options, "max_items": None}, key, domain)  # checks
    kwargs = {d: options[d] for d in _MECH_KWARGS
              if options.get(d) is not None and d not in ("max_items", "k", "switches", "eta")
              and d != "remember"}
    if options.get("eta") not in (None, "auto"):
        kwargs["eta"] = options["eta"]
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
    Opt(("--horizon", "-T"), "horizon", "T, the number of time steps", None, _positive_int,
        metavar="T", default_text="none, required"),
    Opt(("--domain",), "domain",
        "file of the known domain: one item per line, or a JSON array (known, top-k; "
        "optional for meta)", None, str, metavar="FILE"),
    Opt(("--max-items",), "max_items",
        "Delta0, the most distinct items one event may hold (known, unknown; optional for meta)",
        None, _positive_int, metavar="N"),
    Opt(("--k",), "k", "how many items top-k (and meta's top-k one-shots) release",
        None, _positive_int, default_text="none; required for top-k"),
    Opt(("--switches",), "switches", "top-k: the most re-selections of the top-k (s)",
        None, _nonneg_int, metavar="S", default_text="none; required for top-k"),
    Opt(("--eta",), "eta",
        "top-k: how far (in counts) an outside item must lead before a switch; 'auto' sizes "
        "it from the noise (a tie sets off a switch with probability 5% over the whole run)",
        "auto", _eta),
    Opt(("--oneshot",), "oneshot",
        "meta: the one-shot mechanism run on every tree cell", None, str,
        choices=("gaussian", "gumbel", "unknown-gaussian", "unknown-gumbel")),
    Opt(("--kbar",), "kbar", "meta: kbar of the unknown-domain one-shots", None, _positive_int),
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

RUN_OPTS: tuple[Opt, ...] = (
    Opt(("--key-file",), "key_file", "the secret noise key (create one with `dpstream "
        "keygen PATH`)", None, str, metavar="PATH", default_text="none, required"),
    Opt(("--input", "-i"), "input", "events to read, '-' for stdin; *.gz is decompressed",
        "-", str, metavar="PATH"),
    Opt(("--input-format",), "input_format", "jsonl or csv; auto = csv for *.csv[.gz], "
        "else jsonl", "auto", str, choices=("auto", "jsonl", "csv")),
    Opt(("--item-column",), "item_column", "CSV input: the item column", "item", str),
    Opt(("--event-column",), "event_column", "CSV input: the event-id column; the rows of "
        "one event must be consecutive, an id that comes back later (within its time step, "
        "or among the last 100,000 ids) is an invalid record", "event", str),
    Opt(("--time-column",), "time_column", "CSV input: the time-step column", None, str,
        default_text="none: each event is a step of its own"),
    Opt(("--output", "-o"), "output", "where to write the releases, '-' for stdout "
        "(exactly-once with --state needs a file; not compressed, and not the input, key, "
        "domain, config or state file)", "-", str, metavar="PATH"),
    Opt(("--output-format",), "output_format", "jsonl or csv; auto = csv for *.csv, else "
        "jsonl", "auto", str, choices=("auto", "jsonl", "csv")),
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
        "--domain, a malformed line or a step past --horizon: error (stop, naming the line), "
        "truncate (keep --max-items items chosen by the keyed PRF, drop items outside the "
        "domain; skip what cannot be truncated) or skip (drop the event)", "error", str,
        choices=("error", "truncate", "skip")),
    Opt(("--state",), "state", "SQLite checkpoint: commit every step, resume after a crash, "
        "refuse another key or parameters", None, str, metavar="FILE.sqlite"),
    Opt(("--fsync",), "fsync", "with --state, fsync the output and the state at every step: "
        "durable against power loss, but it costs about 8 ms per step on a typical disk "
        "(a 10,000-step run spends over a minute in fsync). --no-fsync is still safe "
        "against a killed process (kill -9, out of memory, Ctrl-C): use it when power loss "
        "or an OS crash is not the concern", True, kind="bool"),
    Opt(("--quiet", "-q"), "quiet", "no progress bar and no summary on stderr", False,
        kind="flag"),
    Opt(("--engine",), "engine", "local (NumPy, one machine) or spark (PySpark, the "
        "`dpstream[spark]` extra; known and unknown mechanisms; see docs/spark.md)", "local",
        str, choices=("local", "spark")),
    Opt(("--master",), "master", "Spark master URL (with --engine spark)", "local[*]", str),
)

PLAN_OPTS: tuple[Opt, ...] = (
    Opt(("--domain-size",), "domain_size", "size of the known domain when --domain is not "
        "given (placeholder items are used)", None, _positive_int, metavar="D"),
    Opt(("--target-error",), "target_error", "give the budget needed for this half-width "
        "of a 95% interval of a count at the worst step (instead of a budget)", None,
        _positive_float, metavar="E"),
    Opt(("--json",), "json", "print the plan as JSON", False, kind="flag"),
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
input (JSON Lines): one event per line, {"items": ["a", "b"], "t": 3} ("t" optional:
  events sharing t form one step; an event without t is a step of its own) or
  ["a", "b"]. CSV: one row per (event, item), see --event-column/--item-column.
  Items are strings (JSON integers are read as text). *.gz is decompressed.
output (JSON Lines): one line per step, {"t": 3, "released": {"a": 13, ...}}
  (+ "meta" for the mechanism's public extras, e.g. the threshold); floats are
  rounded to integers (--no-round: exact floats). CSV: t,item,value.
state: with --state, a killed run resumes where it stopped when run again with
  the same command: nothing is written twice and the output equals an
  uninterrupted run's; a finished run is not released again. Exactly-once needs
  --output FILE (not stdout).
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
                   "keygen": cmd_keygen, "reproduce": cmd_reproduce}[args.command]
        return handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `dpstream run ... | head`: the reader left, quietly stop
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a pipeline cut short
    except (DPStreamError, ValueError, TypeError, OSError) as exc:
        if debug:
            raise
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            msg = f"{exc.filename}: {exc.strerror}"
        print(f"{PROG}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 1


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


# --------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    from . import planning
    from .noise import NoiseKey

    config = _load_config(args.config) if args.config else None
    opts = merge_options(args, MECH_OPTS + PLAN_OPTS, config, ignore=RUN_OPTS)
    name = opts["mechanism"]
    spec = MECHANISMS[name]
    domain = _domain_option(opts)
    if domain is None and opts["domain_size"] is not None and spec.domain != "none":
        domain = [f"item-{i}" for i in range(opts["domain_size"])]
    key = NoiseKey.generate()  # throw-away: the plan releases nothing
    target = opts["target_error"]
    if target is not None:
        if any(opts[b] is not None for b in ("epsilon", "rho", "tau")):
            raise ValueError("--target-error replaces the budget: drop --epsilon/--rho/--tau")
        unit = build_mechanism(name, {**opts, "tau": 1.0, "delta": None}, key, domain)
        tau = planning.tau_for_target(target, planning.noise_std_worst(unit))
        mech = build_mechanism(name, {**opts, "tau": tau, "delta": None}, key, domain)
    else:
        _require_budget(opts)
        mech = build_mechanism(name, opts, key, domain)
    info = planning.describe(mech, name=name, base_given=opts["base"] is not None)
    choice = top_k_choice(name, {**opts, "tau": mech.tau, "delta": None} if target is not None
                          else opts, key, domain)
    if choice is not None:
        info["choice"] = choice.reason
        info["candidates"] = choice.errors
    if hasattr(mech, "threshold_for_cells"):  # unknown domain: what coarser steps buy
        budget = {"tau": mech.tau, "delta": None} if target is not None else {}
        info["coarser_steps"] = planning.coarser_steps(
            lambda h: build_mechanism(name, {**opts, **budget, "horizon": h}, key, domain),
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
            o = {**opts, **budget, "max_items": n}
            if choice is not None:
                return top_k_choice(name, o, key, domain).errors["KnownBase top-k"]
            return planning.noise_std_worst(build_mechanism(name, o, key, domain))

        info["max_items_hint"] = planning.max_items_hint(std_for, opts["max_items"])
    if target is not None:
        info["target_error"] = target
    if opts["json"]:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(planning.format_plan(info))
    return 0


def _require_budget(opts: dict[str, Any]) -> None:
    if all(opts[b] is None for b in ("epsilon", "rho", "tau")):
        raise ValueError("give a privacy budget: --epsilon E --delta D, or --rho R "
                         "(or --tau for the noise scale itself)")


def _domain_option(opts: dict[str, Any]) -> list[str] | None:
    from .io import read_domain

    value = opts.get("domain")
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return read_domain(value)


# --------------------------------------------------------------------------- run


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
    return "csv" if path.endswith((".csv", ".csv.gz")) else "jsonl"


def _run_params(opts: dict[str, Any], mech: Any, domain: list[str] | None,
                input_format: str, output_format: str) -> dict[str, Any]:
    """The parameters a resumed run must share (canonical JSON in the state)."""
    params = {k: opts[k] for k in _MECH_KWARGS if k in opts}
    params.update(
        mechanism=opts["mechanism"], horizon=opts["horizon"], base=int(mech.base),
        tau=float(mech.tau),
        domain_sha256=None if domain is None else hashlib.sha256(
            json.dumps(domain, ensure_ascii=True).encode()).hexdigest(),
        input_format=input_format, output_format=output_format, round=bool(opts["round"]),
        clamp=bool(opts["clamp"]), monotone=bool(opts["monotone"]),
        on_invalid=opts["on_invalid"],
    )
    if input_format == "csv":
        params.update(item_column=opts["item_column"], event_column=opts["event_column"],
                      time_column=opts["time_column"])
    if isinstance(params.get("eta"), float):
        params["eta"] = float(params["eta"])
    return params


class _Validator:
    """Applies --on-invalid to each record of a step, counting what it dropped or cut."""

    def __init__(self, *, policy: str, domain: Sequence[str] | None, max_items: int | None,
                 truncator: Any, stats: RunStats) -> None:
        self.policy = policy
        self.domain = None if domain is None else frozenset(domain)
        self.max_items = max_items
        self.truncator = truncator
        self.stats = stats

    def _invalid(self, line: int, problem: str) -> None:
        if self.policy == "error":
            raise InvalidEventError(f"input line {line}: {problem} (see --on-invalid)")
        self.stats.skipped += 1
        self.stats.reasons[_reason_key(problem)] += 1

    def events(self, records: Sequence[Any], *, past_horizon: int | None = None,
               t: int | None = None) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for rec in records:
            if rec.error is not None:
                self._invalid(rec.line, rec.error)
                continue
            if past_horizon is not None:
                step = rec.t if rec.t is not None else t
                where = "its time step" if step is None else f"time step {_short_int(step)}"
                self._invalid(rec.line, f"{where} is past the horizon --horizon {past_horizon}")
                continue
            items = tuple(dict.fromkeys(rec.items))
            before = len(items)
            changed = False
            if self.domain is not None:
                outside = [i for i in items if i not in self.domain]
                if outside:
                    if self.policy != "truncate":
                        self._invalid(rec.line, f"item {outside[0]!r} is not in the domain")
                        continue
                    items = tuple(i for i in items if i in self.domain)
                    changed = True
            if self.max_items is not None and len(items) > self.max_items:
                if self.policy != "truncate":
                    self._invalid(rec.line, f"event has {len(items)} distinct items, more "
                                            f"than --max-items {self.max_items}")
                    continue
                items = self.truncator(items, rec.line)
                changed = True
            if changed:
                self.stats.truncated += 1
            self.stats.occurrences += before
            self.stats.dropped += before - len(items)
            out.append(items)
        return out


def _short_int(value: int) -> str:
    """An integer for a message (a time step may have thousands of digits)."""
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


def _reason_key(problem: str) -> str:
    for key in ("past the horizon", "not in the domain", "more than --max-items",
                "not valid JSON", "time order", "reappears", "not valid UTF-8"):
        if key in problem:
            return key
    return "malformed"


def _step_digest(records: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for rec in records:
        h.update(json.dumps([rec.line, rec.t, rec.items, rec.error]).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _open_output(path: str, resume_offset: int | None, *, ckpt: Any = None,
                 resume_t: int = 0, header: bytes = b"") -> IO[bytes]:
    """The output as binary; on resume, checked and truncated to the last committed offset.

    Before truncating, the bytes of the last committed step (and the header)
    must be the ones the state recorded: the file must be the run's output,
    not another file at the same path, or one changed since.
    """
    from .state import sha256_hex

    if path == "-":
        return sys.stdout.buffer
    if resume_offset is None:
        return open(path, "wb")  # noqa: SIM115 - closed by the caller
    try:
        fh = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        raise StateError(f"output file {path!r} is missing, but the state records "
                         f"{resume_offset} bytes written to it") from None
    try:
        size = os.fstat(fh.fileno()).st_size
        if size < resume_offset:
            raise StateError(f"output file {path!r} has {size} bytes, fewer than the "
                             f"{resume_offset} the state records as committed; refusing "
                             "to resume")
        if resume_t >= 1 and ckpt is not None:
            begin = len(header)
            if resume_t > 1:
                before = ckpt.step(resume_t - 1)
                if before is None:
                    raise StateError(f"state file {ckpt.path!r} has no step {resume_t - 1}")
                begin = before[0]
            stored = ckpt.step(resume_t)
            fh.seek(0)
            head = fh.read(len(header))
            fh.seek(begin)
            last = fh.read(resume_offset - begin)
            if stored is None or head != header or sha256_hex(last) != stored[1]:
                raise StateError(
                    f"output file {path!r} does not hold the release of step {resume_t} "
                    f"that {ckpt.path!r} records as committed (bytes {begin}..{resume_offset}): "
                    "was it changed or replaced? refusing to resume")
        fh.truncate(resume_offset)
        fh.seek(resume_offset)
    except BaseException:
        fh.close()
        raise
    return fh


def _recorded_header(record: Any) -> bytes:
    """The header the recorded run's output starts with."""
    from .io import make_formatter

    try:
        fmt = json.loads(record.params).get("output_format", "jsonl")
        return make_formatter(fmt).header()
    except ValueError:
        return b""


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


def _run_on_spark(opts: dict, key: object) -> int:
    """``run --engine spark``: the same releases, computed by Spark executors."""
    try:
        from .spark import run_cli
    except ImportError as exc:
        raise ValueError(f"--engine spark needs PySpark: pip install 'dpstream[spark]' ({exc})"
                         ) from None
    summary = run_cli(opts, master=opts["master"], key=key)
    if not opts["quiet"]:
        print(f"{PROG}: {summary['steps']} steps (t = 1..{summary['last_t']}), "
              f"{summary['events']} events, {summary['rows']} rows -> {summary['output']}, "
              f"{summary['elapsed_s']:.1f} s\n  privacy spent: {summary['privacy']}",
              file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .io import KeyedTruncator, make_formatter, open_input
    from .noise import NoiseKey, NoiseSource
    from .state import Checkpoint

    config = _load_config(args.config) if args.config else None
    opts = merge_options(args, MECH_OPTS + RUN_OPTS, config)
    if opts["horizon"] is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    if opts["key_file"] is None:
        raise ValueError("no key: pass --key-file PATH (create one with `dpstream keygen PATH`;"
                         " keep it secret)")
    _check_paths(opts, args.config)
    _require_budget(opts)
    key = NoiseKey.load(opts["key_file"])
    if opts["engine"] == "spark":
        return _run_on_spark(opts, key)
    name = opts["mechanism"]
    spec = MECHANISMS[name]
    domain = _domain_option(opts)
    mech = build_mechanism(name, opts, key, domain)
    input_format = _auto_format(opts["input"], opts["input_format"])
    output_format = _auto_format(opts["output"], opts["output_format"])
    formatter = make_formatter(output_format, opts["round"])
    stats = RunStats()
    max_items = getattr(mech, "max_items", None) if spec.max_items != "none" else None
    truncator = KeyedTruncator(NoiseSource(key, f"{opts['stream']}/truncate"), max_items or 1)
    validator = _Validator(policy=opts["on_invalid"], domain=domain, max_items=max_items,
                           truncator=truncator, stats=stats)
    quiet = opts["quiet"]

    with contextlib.ExitStack() as stack:
        infile = open_input(opts["input"])  # before the output: a missing input truncates nothing
        if opts["input"] != "-":
            stack.callback(infile.close)
        elif infile is not sys.stdin:  # a decoding wrapper: leave stdin itself open
            stack.callback(infile.detach)
        ckpt = None
        new_run: dict[str, str] | None = None
        resume_t = 0
        resume_offset: int | None = None
        if opts["state"]:
            ckpt = Checkpoint(opts["state"], fsync=opts["fsync"])
            stack.callback(ckpt.close)
            record, new_run = _open_run(ckpt, opts, mech, domain, key, input_format,
                                        output_format)
            if record is not None and record.finished:
                _check_finished(record, infile, opts, input_format)
                if not quiet:
                    print(f"{PROG}: the run in {opts['state']} finished at {record.finished} "
                          f"({record.steps} steps released); nothing to do: a step is never "
                          "released twice", file=sys.stderr)
                return 0
            if record is not None:
                resume_t, resume_offset = record.last_t, record.last_offset
                stats.resumed_at = resume_t
            if opts["output"] == "-" and not quiet:
                print(f"{PROG}: note: with --output - a release printed just before a crash "
                      "may be printed again on resume; write to a file for exactly-once output",
                      file=sys.stderr)
        out = _open_output(opts["output"], resume_offset, ckpt=ckpt, resume_t=resume_t,
                           header=formatter.header())
        is_file = opts["output"] != "-"
        if is_file:
            stack.callback(out.close)
        if ckpt is not None and new_run is not None:  # recorded once the output is open
            ckpt.start(**new_run, replace=True)
        _run_loop(mech, infile, out, opts, ckpt=ckpt, resume_t=resume_t,
                  offset=resume_offset or 0, formatter=formatter, validator=validator,
                  stats=stats, public_meta=spec.public_meta, input_format=input_format,
                  quiet=quiet)
    if not quiet:
        _print_summary(stats, mech, opts)
    return 0


def _input_records(infile: Any, opts: dict[str, Any], input_format: str) -> Iterator[Any]:
    """The input's records (``dpstream.io.RawEvent``), in order."""
    from .io import guard_lines, read_events

    csv_opts = {}
    if input_format == "csv":
        csv_opts = dict(item_column=opts["item_column"], event_column=opts["event_column"],
                        time_column=opts["time_column"])
    return read_events(guard_lines(infile, opts["input"]), input_format, **csv_opts)


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
              resume_t: int, offset: int, formatter: Any, validator: _Validator,
              stats: RunStats, public_meta: tuple[str, ...], input_format: str,
              quiet: bool) -> None:
    """Release every step; replay (with digest checks) the steps already committed."""
    from .io import group_steps
    from .state import sha256_hex

    horizon = int(opts["horizon"])
    is_file = opts["output"] != "-"
    do_fsync = bool(ckpt is not None and opts["fsync"] and is_file)
    if offset == 0 and resume_t == 0:
        head = formatter.header()
        if head:
            out.write(head)
            offset += len(head)
    read = 0

    def counted(records: Iterable[Any]) -> Iterator[Any]:
        nonlocal read
        for rec in records:
            read += 1
            yield rec

    records = counted(_input_records(infile, opts, input_format))
    publish = make_postprocessor(opts)  # replays from step 1 on resume: same state
    progress = _Progress(horizon, enabled=not quiet and sys.stderr.isatty())
    with progress:
        for t, recs in group_steps(records, horizon):
            if t is None:  # malformed records after the last step
                validator.events(recs)
                continue
            if t > horizon:
                validator.events(recs, past_horizon=horizon, t=t)
                continue
            events = validator.events(recs)
            release = publish(_public(mech.step_batch(events), public_meta))
            line = formatter.format(release)
            stats.steps += 1
            stats.events += len(events)
            stats.last_items = len(release.items)
            digest_in = _step_digest(recs)
            if t <= resume_t:
                stored = ckpt.step(t)
                if stored is None:
                    raise StateError(f"state file {opts['state']!r} has no step {t}")
                if stored[2] != digest_in:
                    first = recs[0].line if recs else "?"
                    raise StateError(
                        f"the input changed: step {t} (input line {first}) differs from "
                        f"the run recorded in {opts['state']}; refusing to resume")
                if stored[1] != sha256_hex(line):
                    raise StateError(
                        f"replaying step {t} gave a different release than the one "
                        "recorded (another dpstream or numeric library version?); "
                        "refusing to resume")
                progress.update(t, stats.events)
                continue
            out.write(line)
            offset += len(line)
            out.flush()
            if do_fsync:
                os.fsync(out.fileno())
            if ckpt is not None:
                ckpt.commit(t, offset=offset, release_sha256=sha256_hex(line),
                            input_sha256=digest_in, events=len(events))
            progress.update(t, stats.events)
    if mech.t < resume_t:
        raise StateError(f"the input ends at step {mech.t}, but {opts['state']} records "
                         f"steps up to {resume_t}: is it the same input?")
    out.flush()
    if ckpt is not None:
        ckpt.finish({"steps": stats.steps, "events": stats.events,
                     "truncated": stats.truncated, "skipped": stats.skipped,
                     "occurrences": stats.occurrences, "dropped_occurrences": stats.dropped,
                     "last_t": int(mech.t), "input_records": read})


def _open_run(ckpt: Any, opts: dict[str, Any], mech: Any, domain: list[str] | None, key: Any,
              input_format: str, output_format: str) -> tuple[Any, dict[str, str] | None]:
    """Check that this run continues the one recorded in the state file.

    Returns ``(record, None)`` to resume the recorded run, or ``(None, ident)``
    for a new run, to be recorded (:meth:`Checkpoint.start`) once the output
    is open. A recorded run with no committed step whose output holds no
    release released nothing, so it is replaced by this one, new parameters
    and all (e.g. after a first line refused under ``--on-invalid error``, or
    an output that could not be opened).
    """
    from .io import resolve_path
    from .state import canonical_json

    params = canonical_json(_run_params(opts, mech, domain, input_format, output_format))
    ident = dict(params=params, key_fingerprint=key.fingerprint(),
                 input=resolve_path(opts["input"]), output=resolve_path(opts["output"]))
    record = ckpt.load()
    if record is None:
        return None, ident
    if record.steps > 0 or record.finished:
        ckpt.verify(record, **ident)
        return record, None
    if record.output != "-" and not _holds_release(record.output, _recorded_header(record)):
        return None, ident  # nothing released: start over
    try:
        ckpt.verify(record, **ident)
    except StateError as exc:
        if record.output == "-":
            hint = ("no step is committed, but with --output - dpstream cannot tell whether "
                    "a release was printed before it stopped; if none was, delete "
                    f"{opts['state']} to start over")
        else:
            hint = (f"no step is committed, but {record.output} holds a release written "
                    "before it stopped: run again with the same options to finish that run, "
                    f"or delete {opts['state']} and that output to start over (a release "
                    "already published from it then counts against the budget)")
        raise StateError(f"{exc}; {hint}") from None
    return record, None


def _public(release: Any, keys: tuple[str, ...]) -> Any:
    from .mechanisms.base import Release

    meta = {k: v for k, v in release.meta.items() if k in keys}
    if meta == dict(release.meta):
        return release
    return Release(t=release.t, items=release.items, values=release.values, meta=meta)


def _print_summary(stats: RunStats, mech: Any, opts: dict[str, Any]) -> None:
    elapsed = time.monotonic() - stats.started
    rate = stats.events / elapsed if elapsed > 0 else float("inf")
    resumed = f", resumed after step {stats.resumed_at}" if stats.resumed_at else ""
    lines = [
        f"{PROG}: {stats.steps} steps (t = 1..{mech.t} of T = {mech.horizon}), "
        f"{stats.events} events{resumed}, {elapsed:.1f} s ({rate:,.0f} events/s)",
        f"  invalid events: {stats.truncated} truncated, {stats.skipped} skipped"
        + (" (" + ", ".join(f"{n} {r}" for r, n in stats.reasons.most_common()) + ")"
           if stats.reasons else ""),
        f"  items released at the last step: {stats.last_items}",
        *_truncation_lines(stats, opts),
        f"  privacy spent: {mech.privacy}",
        f"  output: {opts['output'] if opts['output'] != '-' else 'stdout'}"
        + (f"; state: {opts['state']}" if opts["state"] else ""),
    ]
    print("\n".join(lines), file=sys.stderr)


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
    """A rich progress bar on stderr (steps done, events/s), only on a terminal."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self._bar: Any = None
        self._start = time.monotonic()

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(TextColumn("steps"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("run", total=self.total, rate="")
        return self

    def update(self, t: int, events: int) -> None:
        if self._bar is not None:
            elapsed = max(time.monotonic() - self._start, 1e-9)
            self._bar.update(self._task, completed=t, rate=f"{events / elapsed:,.0f} events/s")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

