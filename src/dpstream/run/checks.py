"""The mechanism, budget and bounds settings of ``plan`` and ``run``, checked at once.

Layer 6 of dpstream. ``dpstream plan`` and ``dpstream run`` check these
settings with the same function, :func:`settings_problems`, so that a plan is
only ever printed for settings a run accepts, and a run refuses exactly what a
plan refuses. Every problem of a command line is found before anything is
reported: the user fixes them all in one go instead of one per attempt.
:class:`SettingsError` carries the list; the command prints one problem a line
and exits with status 2, as for any other usage error.

What is checked needs no file and no key: that --horizon (or, for -m known
and -m unknown, no planned end) and a budget are given (one budget, whole),
what each ``--mechanism`` needs (``--max-items``, ``--domain``, ``--k``...),
the options that do not apply to it, and that the user-level options go
together. ``-m top-k`` needs --k only: --switches
(SparseGumb's s) defaults to ``default_switches(T)`` when absent, whether or not
--max-items lets a histogram's top-k be chosen instead. Values the mechanism
itself checks (a base out of range, ``--k`` larger than the domain) are
reported when it is built, also
with status 2 (:func:`mechanism_settings`). ``run`` lists with them the CSV and
Parquet column options given with JSON Lines input, whose fields are fixed
(:func:`jsonl_column_problems`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import DPStreamError

__all__ = [
    "SettingsError",
    "settings_problems",
    "check_settings",
    "jsonl_column_problems",
    "mechanism_settings",
    "USER_BOUNDS",
]

#: The two bounds of user-level privacy, as flags.
USER_BOUNDS = ("--max-items-per-user", "--max-count-per-item")


class SettingsError(DPStreamError, ValueError):
    """The command line's settings have problems: ``problems`` lists each (plain words).

    A ``ValueError`` too, so that code catching bad arguments catches it.
    """

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

    def report(self, prog: str, words: Callable[[str], str] = str) -> str:
        """What the command prints: one problem on a line, or a list of them (each
        problem on one line, in the command line's ``words``)."""
        problems = [" ".join(words(p).split()) for p in self.problems]
        if len(problems) == 1:
            return f"{prog}: error: {problems[0]}"
        lines = [f"{prog}: error: {len(problems)} problems with the settings:"]
        return "\n".join([*lines, *(f"  - {p}" for p in problems)])


@contextmanager
def mechanism_settings() -> Iterator[None]:
    """A ``ValueError`` raised in this block (by a mechanism's constructor, which checks
    the values this module does not: a base out of range, --k past the domain size) is
    a problem of the settings too: :class:`SettingsError`, exit status 2."""
    try:
        yield
    except SettingsError:
        raise
    except ValueError as exc:
        raise SettingsError([str(exc)]) from exc


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _budget_problems(opts: Mapping[str, Any]) -> list[str]:
    """A budget is one of --epsilon with --delta, --rho or --tau (or, for ``plan``,
    --target-error, which replaces it)."""
    problems = []
    given = [d for d in ("epsilon", "rho", "tau") if opts.get(d) is not None]
    delta = opts.get("delta")
    if delta is not None and not delta < 1:
        problems.append(f"--delta must be below 1 (a probability), got {delta}")
    if opts.get("target_error") is not None:
        if given:
            problems.append(
                "--target-error replaces the budget: drop " + " and ".join(_flag(d) for d in given)
            )
        return problems
    forms = [
        f
        for f, present in (
            ("rho", opts.get("rho") is not None),
            ("epsilon", opts.get("epsilon") is not None or delta is not None),
            ("tau", opts.get("tau") is not None),
        )
        if present
    ]
    if not forms:
        problems.append(
            "give a privacy budget: --epsilon E --delta D, or --rho R (or --tau "
            "for the noise scale itself)"
        )
    elif len(forms) > 1:
        flags = [_flag(d) for d in ("epsilon", "delta", "rho", "tau") if opts.get(d) is not None]
        problems.append(
            f"give one privacy budget, not several (got {', '.join(flags)}): "
            "--epsilon E --delta D, or --rho R, or --tau"
        )
    elif opts.get("epsilon") is not None and delta is None:
        problems.append("--epsilon needs --delta as well (the budget is the pair)")
    elif opts.get("epsilon") is None and delta is not None:
        problems.append("--delta needs --epsilon as well (the budget is the pair)")
    problems += _budget_range_problems(opts)
    return problems


def _budget_range_problems(opts: Mapping[str, Any]) -> list[str]:
    """--rho, --epsilon, --tau and --delta outside the range the calibration's float
    arithmetic supports (:data:`dpstream.privacy.RHO_RANGE` and its siblings, where the bounds are
    derived): refused here, before any input is read, not by a traceback."""
    import math

    from ..privacy import budget_range_problem, delta_range_problem

    problems = []
    delta = opts.get("delta")
    if isinstance(delta, (int, float)) and 0 < delta < 1:
        problem = delta_range_problem(float(delta), label="--delta ")
        if problem is not None:
            problems.append(problem)
    for name in ("rho", "epsilon", "tau"):
        value = opts.get(name)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            problem = budget_range_problem(name, float(value), label=_flag(name))
            if problem is not None:
                problems.append(problem)
    return problems


def _mechanism_problems(opts: Mapping[str, Any]) -> list[str]:
    """What ``--mechanism`` needs, and the options that do not apply to it."""
    from ..registry import _MECH_KWARGS, MECHANISMS, mechanism_class

    name = opts.get("mechanism", "known")
    spec = MECHANISMS[name]
    params = inspect.signature(mechanism_class(name)).parameters
    problems = []
    has_domain = opts.get("domain") is not None or opts.get("domain_size") is not None
    if (
        spec.max_items == "required"
        and opts.get("max_items") is None
        and opts.get("max_items_per_user") is None
    ):
        problems.append(f"--mechanism {name} needs --max-items N (the most items an event holds)")
    if spec.domain == "required" and not has_domain:
        problems.append(
            f"--mechanism {name} needs --domain FILE (the known items; for "
            "`plan`, --domain-size N will do)"
        )
    if spec.domain == "none" and opts.get("domain") is not None:
        problems.append(f"--domain does not apply to --mechanism {name}")
    if name == "top-k":
        if opts.get("k") is None:
            problems.append("--mechanism top-k needs --k N (how many items it releases)")
    if name == "meta":
        oneshot = opts.get("oneshot")
        if oneshot is None:
            problems.append(
                "--mechanism meta needs --oneshot (the one-shot mechanism of every tree cell)"
            )
        elif not oneshot.startswith("unknown") and not has_domain:
            problems.append(
                f"--oneshot {oneshot} needs --domain FILE (the known items; for "
                "`plan`, --domain-size N will do)"
            )
        elif oneshot.startswith("unknown") and opts.get("kbar") is None:
            problems.append(
                f"--oneshot {oneshot} needs --kbar N (how many candidates each selection "
                "may consider, at least --k)"
            )
    for dest in _MECH_KWARGS:
        value = opts.get(dest)
        if value is None or dest == "remember" or (dest == "eta" and value == "auto"):
            continue  # --remember is on by default and applies where it can
        if dest == "max_items" and name == "top-k":
            continue  # top-k picks SparseGumb, KnownBase's or UnkBase's top-k
        if dest not in params:
            problems.append(f"{_flag(dest)} does not apply to --mechanism {name}")
    if opts.get("blt_buffers") is not None and "counter" not in params:
        problems.append(f"--blt-buffers does not apply to --mechanism {name}")
    if (
        name == "unknown"
        and opts.get("threshold_delta") is None
        and opts.get("target_error") is None
        and opts.get("epsilon") is None
        and opts.get("delta") is None
    ):
        for budget in ("rho", "tau"):
            if opts.get(budget) is not None:
                problems.append(
                    f"--mechanism unknown with --{budget} needs --threshold-delta "
                    "D (the delta of the threshold that hides rare items)"
                )
                break
    known_meta = name == "meta" and not str(opts.get("oneshot") or "").startswith("unknown")
    if (
        opts.get("target_error") is not None
        and "threshold_delta" in params
        and not known_meta  # meta's known-domain one-shots have no threshold
        and opts.get("threshold_delta") is None
        and opts.get("delta") is None
    ):
        problems.append(
            f"--mechanism {name} with --target-error needs --delta (or "
            "--threshold-delta): the threshold that hides rare items is set "
            "from it"
        )
    return problems


def _user_problems(opts: Mapping[str, Any]) -> list[str]:
    """User-level privacy needs --user-field and both bounds, never some of them: a run
    must not fall back to event level without a word, nor a plan show such a run."""
    problems = []
    bounds = [opts.get("max_items_per_user"), opts.get("max_count_per_item")]
    field = opts.get("user_field")
    if (bounds[0] is None) != (bounds[1] is None):
        missing = USER_BOUNDS[bounds.index(None)]
        problems.append(
            f"user-level privacy needs {USER_BOUNDS[0]} and {USER_BOUNDS[1]} "
            f"together (missing {missing})"
        )
    elif field is not None and bounds[0] is None:
        problems.append(
            f"--user-field needs {USER_BOUNDS[0]} and {USER_BOUNDS[1]} (how "
            "much of the stream one user may contribute)"
        )
    if field is None and any(b is not None for b in bounds):
        problems.append(
            f"{'/'.join(USER_BOUNDS)} need --user-field (the field or column "
            "holding each event's user id)"
        )
    # (the item and event columns' defaults name CSV's and Parquet's columns: their
    # readers refuse a user column that is one of them, seeing the format)
    named = [r for r in ("time_field", "time_column") if field and opts.get(r) == field]
    if named:  # the user would be read from the step's field
        flag = "--" + named[0].replace("_", "-")
        problems.append(
            f"--user-field {field!r} is also {flag}: a user id must be a field or column of its own"
        )
    delta = opts.get("delta")
    if field is not None and isinstance(delta, (int, float)) and 0.5 <= delta < 1.0:
        # (review 113: such a run's cost had no per-event claim, and every later run
        # on its dataset failed when it added the costs up)
        problems.append(
            f"--delta {delta!r} with --user-field: a dataset's budget counts a user-level "
            "run per event at twice its delta (two events of one user), which must stay "
            "below 1: give a --delta below 0.5"
        )
    if field is not None and opts.get("mechanism") == "meta":
        problems.append(
            "--user-field does not apply to --mechanism meta (known, unknown and "
            "top-k protect users)"
        )
    return problems


#: The mechanisms that run without --horizon (a stream with no planned end).
UNBOUNDED_MECHANISMS = ("known", "unknown")


def _horizon_problems(opts: Mapping[str, Any]) -> list[str]:
    """--horizon may be left out (a stream with no planned end) for -m known, -m
    unknown and -m top-k with --max-items (the top-k of those histograms), and not
    with the options that size a counter for T (the tree, a chosen buffer count).
    SparseGumb (top-k with any number of items per event: its switches and
    quantiles are spread over T) and ``meta`` (a tree) need it."""
    if opts.get("horizon") is not None:
        return []
    name = opts.get("mechanism", "known")
    problems = []
    if name == "top-k":
        if opts.get("max_items") is None:
            return [
                "--mechanism top-k without --horizon needs --max-items: with any number "
                "of items per event top-k runs with switches, which spreads them over T "
                "(--horizon); with at most --max-items items per event it is read off "
                "the known- or unknown-domain histogram, whose noise holds for every t"
            ]
        given = [f"--{n}" for n in ("switches", "eta") if opts.get(n) not in (None, "auto")]
        if given:
            problems.append(
                f"{' and '.join(given)}: settings of top-k with switches, which needs "
                "--horizon; without --horizon the top-k is read off the known- or "
                "unknown-domain histogram, which has no switches"
            )
    elif name not in UNBOUNDED_MECHANISMS:
        return [
            f"--mechanism {name} needs --horizon (T, the number of time steps): its "
            f"tree is sized for T; only {', '.join(UNBOUNDED_MECHANISMS)} and top-k with "
            "--max-items run with no planned end"
        ]
    if opts.get("counter") == "tree" or opts.get("base") is not None:
        problems.append(
            "without --horizon (no planned end) the counter is the BLT: "
            "--counter tree and --base need --horizon"
        )
    if opts.get("blt_buffers") is not None:
        problems.append(
            "without --horizon (no planned end) the counter is the 4-buffer "
            "BLT fitted for every t: --blt-buffers needs --horizon"
        )
    if opts.get("target_error") is not None:
        problems.append(
            "--target-error needs --horizon (it sets the error at the worst "
            "step, and a stream with no planned end has none; plan shows the "
            "error at t = 10 .. 10^6 for a budget)"
        )
    return problems


def _top_k_choice_problems(opts: Mapping[str, Any]) -> list[str]:
    """-m top-k with --max-items chooses between three mechanisms at one budget: a
    fixed noise (--tau, or plan's --target-error) is a different budget for each."""
    if opts.get("mechanism") != "top-k" or opts.get("max_items") is None:
        return []
    if opts.get("tau") is not None:
        from ..mechanisms.histogram_topk import TAU_CHOICE_REFUSAL

        return [TAU_CHOICE_REFUSAL]
    if opts.get("target_error") is not None:
        return [
            "--target-error with -m top-k --max-items: the command chooses between top-k "
            "with switches and the histograms' top-k at one budget, and one noise level "
            "is a different budget for each; give --epsilon and --delta (or --rho) to "
            "compare them, or plan -m known --target-error for the budget the known-"
            "domain histogram's top-k needs (it costs what the histogram does)"
        ]
    return []


#: The longest --dataset or --stream name: far from any ledger line's limit (1 MB), even
#: escaped (a character takes at most 12 bytes there).
NAME_MAX = 1000


def settings_problems(opts: Mapping[str, Any]) -> list[str]:
    """Every problem of the mechanism, budget and bounds settings in ``opts`` (the merged
    options of ``plan`` or ``run``, ``dest -> value``), in plain words; [] when none.

    ``plan``'s --domain-size stands for --domain and its --target-error for the budget;
    ``run`` has neither, so the same function serves both commands.
    """
    problems = _horizon_problems(opts)
    problems += _top_k_choice_problems(opts)
    problems += _budget_problems(opts)
    problems += _mechanism_problems(opts)
    problems += _user_problems(opts)
    if opts.get("budget_cap") is not None and not opts.get("dataset"):
        # the default name (the input's file name) changes with a copy, a link or a
        # daily file of the same people's data, and each name starts a budget afresh
        problems.append(
            "--budget-cap needs --dataset NAME: a cap holds for one named dataset, and "
            "the default name (the input's file name) differs for a copy, a link or "
            "another day's file of the same data"
        )
    for flag in ("dataset", "stream"):
        name = opts.get(flag)
        if isinstance(name, str) and len(name) > NAME_MAX:
            # (review 106: an 800 KB --dataset wrote a budget line of 1 MB, which every
            # later run and `dpstream budget` then refused as no ledger line)
            problems.append(
                f"--{flag} is {len(name):,} characters long: a name is at most {NAME_MAX:,}"
            )
    stream = opts.get("stream")
    if isinstance(stream, str) and "~" in stream:
        # the run appends "~" and a tag of its input settings to the name (scoped_stream):
        # a given name with "~" could spell another run's scoped name and share its noise
        problems.append(
            f"--stream {stream!r}: a stream name may not contain '~' (the run "
            "adds it, with a tag of the input settings)"
        )
    return problems


#: The CSV and Parquet column options, and what a JSON Lines input reads instead: its
#: fields are fixed, so a column named for it would be ignored without a word (and the
#: run would count ``items`` in the steps of ``t`` while the operator meant others).
_JSONL_FIXED = {
    "item_column": (
        "--item-column does not apply to JSON Lines input: an event's items are its "
        '"items" field (drop --item-column, or give the input as CSV or Parquet)'
    ),
    "event_column": (
        "--event-column does not apply to JSON Lines input: each line is one event "
        "(drop --event-column, or give the input as CSV or Parquet)"
    ),
    "time_column": (
        "--time-column does not apply to JSON Lines input: an event's time step is its "
        '"t" field (drop --time-column; for timestamps in another field, --time-field '
        "with --step and --start)"
    ),
}


def jsonl_column_problems(input_kind: str, named: Iterable[str]) -> list[str]:
    """The column options ``named`` (given by a flag or the config file, by ``dest``)
    that a run of ``input_kind`` input would ignore: JSON Lines reads the fixed fields
    ``"t"`` (or --time-field) and ``"items"``, so --item-column, --event-column and
    --time-column are refused with it, not ignored."""
    if input_kind != "jsonl":
        return []
    given = set(named)
    return [problem for dest, problem in _JSONL_FIXED.items() if dest in given]


def check_settings(opts: Mapping[str, Any], *, extra: Sequence[str] = ()) -> None:
    """Raise :class:`SettingsError` listing every problem of ``opts`` (and the command's
    own ``extra`` problems) when there is any."""
    problems = [*settings_problems(opts), *extra]
    if problems:
        raise SettingsError(problems)
