"""The ``dpstream`` command: ``run``, ``plan``, ``demo``, ``keygen`` and ``reproduce``.

Layer 6 of dpstream: parsing and dispatch. The options are
:mod:`dpstream.run.options`, the mechanisms :mod:`dpstream.registry`; ``run``
and ``plan`` are :mod:`dpstream.run.command` and :mod:`dpstream.run.plan`
(imported when asked for; they never import this module). Errors are one line on
stderr with exit status 1 (``--debug`` shows the traceback); usage errors exit with
status 2, the problems of the settings all listed at once
(:class:`dpstream.run.config.RunConfig`, shared by ``plan`` and ``run``); a closed
pipe on stdout (``dpstream run ... | head``) ends the run quietly with status
141.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .errors import DPStreamError
from .registry import MECHANISMS, build_mechanism, make_postprocessor
from .run.checks import SettingsError
from .run.options import CLOCK_OPTS, MECH_OPTS, PLAN_OPTS, RUN_OPTS, Opt, add_options

__all__ = ["main", "build_parser", "MECHANISMS", "build_mechanism"]

# re-exported for callers of the command line's pieces (bench, tests)
_REEXPORTED = (CLOCK_OPTS, MECH_OPTS, PLAN_OPTS, RUN_OPTS, Opt, make_postprocessor)

PROG = "dpstream"


# --------------------------------------------------------------------------- parser

RUN_EPILOG = """\
input (JSON Lines): one event per line, {"items": ["a", "b"], "t": 3}; its
  fields are fixed ("t" or --time-field, "items"): the column options are for
  CSV and Parquet, and refused with it. CSV: one row per (event, item), see
  --event-column, --item-column and --time-column (or --time-field). Items are
  strings (JSON integers are read as text). *.gz is decompressed. Parquet (a file, or a
  directory of them): the columns t and items, or one row per item as CSV
  (docs/operations.md).
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
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback on an error (default: off)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        parents=[common],
        description="Differentially private histograms and top-k lists under continual "
        "observation: a private release at every time step of an event stream.",
        epilog="Start with `dpstream demo`. Each command's --help lists its options.",
    )
    parser.add_argument(
        "--version", action="store_true", help="print the version and exit (default: off)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub, common)
    _add_plan(sub, common)
    _add_demo(sub, common)
    from .view.command import add_view_parser

    add_view_parser(sub, parents=[common])
    _add_keygen(sub, common)
    _add_reproduce(sub, common)
    from .run.budget import add_budget_parser

    add_budget_parser(sub, parents=[common])
    # an option's prefix (--eps for --epsilon) is no spelling of it (review 122): it
    # would take another option's place when a new option shares the prefix
    for command in (parser, *sub.choices.values()):
        command.allow_abbrev = False
    return parser


def _refuse_repeated_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Exit with a usage error (status 2) when a command line gives an option twice
    (review 122: ``-i day1 -i day2`` read day2 only, and released day1's steps empty;
    ``--epsilon 1 ... --epsilon 8`` spent 8), as a config file's twice-set key is.
    Two spellings of one option (``-i`` and ``--input``) are one option."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return
    at = next((i for i, x in enumerate(argv) if x in sub.choices), None)
    if at is None:
        return
    command = sub.choices[argv[at]]
    seen: dict[str, str] = {}
    args = iter(argv[at + 1 :])
    for token in args:
        if token == "--":
            break
        for name, action, attached in _options_in(token, command._option_string_actions):
            if isinstance(action, (argparse._AppendAction, argparse._CountAction)):
                continue
            before = seen.get(action.dest)
            if before is not None and not (action.nargs == 0 and before == name):
                # (a flag given again as it was changes nothing: -q -q)
                both = name if before == name else f"{before} and {name}"
                command.error(
                    f"{both}: an option given twice (one value per option; which one was "
                    "meant is not for dpstream to guess)"
                )
            seen[action.dest] = name
            if action.nargs != 0 and not attached:
                next(args, None)  # its value, which may look like an option (-o -)


def _options_in(token: str, known: dict[str, argparse.Action]) -> list[tuple[str, Any, bool]]:
    """The options a command-line token gives, as argparse reads it: (spelling, action,
    whether the value is in the token). ``--name`` or ``--name=value``; ``-x``, ``-xVALUE``
    or flags grouped (``-qx``, the last of which may take the rest as its value; review
    123: ``-i../day2.jsonl`` and ``-T5`` went unseen)."""
    if not token.startswith("-") or token == "-":
        return []
    if token.startswith("--"):
        name = token.split("=", 1)[0]
        action = known.get(name)
        return [] if action is None else [(name, action, "=" in token)]
    found: list[tuple[str, Any, bool]] = []
    rest = token[1:]
    while rest:
        name = "-" + rest[0]
        action = known.get(name)
        if action is None:  # (a negative number, or a token argparse refuses itself)
            break
        if action.nargs != 0:  # takes a value: the rest of the token, or the next one
            found.append((name, action, len(rest) > 1))
            break
        found.append((name, action, False))
        rest = rest[1:]
    return found


def _add_run(sub: Any, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[common],
        help="release a private histogram at every step of a stream",
        description="Read events, release at every time step, write the releases. Options may "
        "also come from a TOML file (--config); flags override it.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="TOML file with any of these options, named as the long flags "
        "(e.g. horizon = 1000, max-items = 3), at its top or in a [run] table; an "
        "option set twice (two spellings, or the top and [run]) is refused; its "
        "relative paths are relative to its folder; --force and --replace-unfinished "
        "are flags only (default: none)",
    )
    add_options(run, MECH_OPTS + RUN_OPTS)


def _add_plan(sub: Any, common: argparse.ArgumentParser) -> None:
    plan = sub.add_parser(
        "plan",
        parents=[common],
        help="show what a budget buys before spending it",
        description="Print tau, the tree counter's base and why, the noise at the worst step, the "
        "95% interval of a count, the discovery threshold (unknown domain), "
        "top-k's switches and eta; or, with --target-error, the budget needed.",
    )
    plan.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="TOML file with the mechanism options; a file written for `run` "
        "works, its run-only options are ignored (default: none)",
    )
    add_options(plan, MECH_OPTS + PLAN_OPTS)


def _add_demo(sub: Any, common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run on a bundled real dataset and a synthetic stream",
        description="Run a mechanism on the bundled FAA wildlife-strike reports and on a "
        "simulated Zipf stream; print the top items, true against private, and "
        "plot them over time.",
    )
    from .demo import add_demo_options

    add_demo_options(demo)


def _add_keygen(sub: Any, common: argparse.ArgumentParser) -> None:
    keygen = sub.add_parser(
        "keygen",
        parents=[common],
        help="write a new secret noise key",
        description="Write a new 32-byte key from the OS CSPRNG to PATH "
        "(mode 0600; never overwrites).",
    )
    keygen.add_argument("path", metavar="PATH", help="where to write the key (required)")


def _add_reproduce(sub: Any, common: argparse.ArgumentParser) -> None:
    reproduce = sub.add_parser(
        "reproduce",
        parents=[common],
        help="regenerate the paper's figures and a report",
        description="Run the paper's experiments (base of the tree, continual top-1 on a Zipf "
        "stream, unknown domain, error against epsilon) and write PNG figures and "
        "REPORT.md, whose claim checks are computed from the run. Simulation mode: "
        "per-trial keys derived from a documented seed.",
    )
    reproduce.add_argument(
        "--out",
        metavar="DIR",
        default="reproduction",
        help="directory for the figures and REPORT.md (default: reproduction)",
    )
    reproduce.add_argument(
        "--trials",
        metavar="N",
        type=int,
        default=None,
        help="trials of every simulated figure (default: the paper's, e.g. "
        "1000 for the top-1 figure; fewer with --quick)",
    )
    reproduce.add_argument(
        "--quick",
        action="store_true",
        help="few trials, under two minutes (default: off, the full run "
        "takes about ten minutes on 2 cores)",
    )
    reproduce.add_argument(
        "--quiet", "-q", action="store_true", help="no progress on stderr (default: show progress)"
    )


# --------------------------------------------------------------------------- main


def _prefer_system_arrow_pool() -> None:
    """Arrow's buffers from the C library's allocator in this process, unless the user chose.

    Arrow's default pool (mimalloc) keeps the pages of the chunks a run has read
    for reuse: about 16 MB of the peak of a batch run over a 55 MB input
    (docs/throughput.md, "Batch memory"), for no speed a run shows. Arrow reads
    ``ARROW_DEFAULT_MEMORY_POOL`` when it is first used, so this is set before;
    a value the user set is kept, and a process that already loaded Arrow (a
    library caller of :func:`main`) keeps its pool.
    """
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def main(argv: list[str] | None = None) -> int:
    """The console entry point: returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    _refuse_repeated_options(parser, argv)
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    _prefer_system_arrow_pool()
    try:
        if args.version:
            from ._version import __version__

            print(__version__)
            return 0
        if args.command is None:
            parser.print_help(sys.stdout)
            return 0
        handler = {
            "run": cmd_run,
            "plan": cmd_plan,
            "demo": cmd_demo,
            "keygen": cmd_keygen,
            "reproduce": cmd_reproduce,
            "view": cmd_view,
            "budget": cmd_budget,
        }[args.command]
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
_FLAG_WORDS = {
    "rho": "--rho",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "tau": "--tau",
    "threshold_delta": "--threshold-delta",
    "max_items": "--max-items",
    "horizon": "--horizon",
    "base": "--base",
    "k": "--k",
    "kbar": "--kbar",
    "switches": "--switches",
    "eta": "--eta",
    "stream": "--stream",
    "counter": "--counter",
    "max_items_per_user": "--max-items-per-user",
    "max_count_per_item": "--max-count-per-item",
}


def _user_words(msg: str) -> str:
    """A library message in the command line's words: ``rho=`` becomes ``--rho``,
    ``max_items`` and Delta0 ``--max-items`` (the library names its keyword arguments),
    a mechanism's paper name (UnkBase...) what it does (:mod:`dpstream.words`)."""
    import re

    from .words import MECHANISM_WORDS

    def flag(m: re.Match[str]) -> str:
        name, value = m.group(1), m.group(2)
        if name not in _FLAG_WORDS:
            return m.group(0)
        return _FLAG_WORDS[name] + (f" {value.strip(chr(39))}" if value else "")

    # 'rho=' (a keyword), 'rho=0.5', "counter='tree'": the flag, then its value
    msg = re.sub(r"\b([a-z][a-z_]*)=('[^']*'|[\w.+-]+)?", flag, msg)
    msg = re.sub(r"\b(max_items|threshold_delta)\b", lambda m: _FLAG_WORDS[m.group(1)], msg)
    msg = re.sub(r"(?<!-)\bkbar\b", "--kbar", msg)
    msg = msg.replace("m_delta", "the discovery threshold")
    for paper in sorted(MECHANISM_WORDS, key=len, reverse=True):  # "KnownBase top-k" first
        msg = re.sub(rf"\b(?:the )?{paper}\b", "the " + MECHANISM_WORDS[paper], msg)
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
    print(
        f"wrote a new key to {args.path} (mode 0600, fingerprint {key.fingerprint()}); "
        "keep it secret: it decrypts the noise",
        file=sys.stderr,
    )
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .experiments import reproduce

    if args.trials is not None and args.trials < 1:
        raise ValueError(f"--trials must be >= 1, got {args.trials}")
    try:
        path = reproduce(args.out, trials=args.trials, quick=args.quick, progress=not args.quiet)
    except RuntimeError as exc:  # an experiment failed; REPORT.md still says which
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_budget(args: argparse.Namespace) -> int:
    """``dpstream budget``: what every run spent on each dataset."""
    from .run.budget import cmd_budget as run

    return run(args)


def cmd_view(args: argparse.Namespace) -> int:
    from .view.command import cmd_view as view

    return view(args)


# --------------------------------------------------------------------------- run, plan


def cmd_plan(args: argparse.Namespace) -> int:
    """``dpstream plan`` (in :mod:`dpstream.run.plan`)."""
    from .run.plan import cmd_plan as plan

    return plan(args)


def cmd_run(args: argparse.Namespace) -> int:
    """``dpstream run`` (in :mod:`dpstream.run.command`)."""
    from .run.command import cmd_run as run

    return run(args)
