"""Options from the flags, a TOML config file and the defaults, merged into one mapping.

Layer 6 of dpstream (the command line's options, :mod:`dpstream.run.options`).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import numbers
import os
import re
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .base import NUMBER_TYPES, Opt

#: The most a config file may hold (its settings, an inline domain list among them).
CONFIG_MAX_BYTES = 16 << 20


#: The most dots a config file's line may hold: a dotted key is one line, and tomllib
#: reads one of n parts in time quadratic in n (review 103: 20,000 parts, 40 KB, took
#: 12 s); no setting's key or value is near this.
CONFIG_MAX_DOTS = 1000


def _refuse_long_dotted_keys(path: str, text: str) -> None:
    """Refuse a line of more than :data:`CONFIG_MAX_DOTS` dots before tomllib reads it."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.count(".") > CONFIG_MAX_DOTS:
            raise ValueError(
                f"config file {path!r}: line {number} holds more than {CONFIG_MAX_DOTS} "
                "dots (a key nested that deep is no setting): not a config file?"
            )


def load_config(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    if os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode):
        raise ValueError(f"config file {path!r} is a device, not a TOML file")
    with open(path, "rb") as fh:
        raw = fh.read(CONFIG_MAX_BYTES + 1)  # not a whole device such as /dev/zero
    if len(raw) > CONFIG_MAX_BYTES:
        raise ValueError(
            f"config file {path!r} is larger than {CONFIG_MAX_BYTES >> 20} MB: not a "
            "config file? (a long domain goes in a --domain file)"
        )
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is allowed
    except UnicodeDecodeError:
        raise ValueError(f"config file {path!r} is not valid UTF-8 text") from None
    _refuse_long_dotted_keys(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path!r}: {exc}") from None
    except RecursionError:  # (review 103: arrays nested 5,000 deep: a traceback)
        raise ValueError(f"config file {path!r}: nested too deeply to read") from None
    tables = [("", data)]
    if isinstance(data.get("run"), dict):  # an optional [run] table
        tables = [("", {k: v for k, v in data.items() if k != "run"}), (" in [run]", data["run"])]
    out: dict[str, Any] = {}
    named: dict[str, str] = {}  # each setting: how and where the file named it
    for place, table in tables:
        for key, value in table.items():
            dest = key.replace("-", "_")
            if dest in named:  # two spellings, or the top and [run]: which counts is no guess
                raise ValueError(
                    f"config file {path!r} sets {dest!r} twice ({named[dest]} and "
                    f"{key!r}{place}): keep one"
                )
            out[dest], named[dest] = value, f"{key!r}{place}"
    for dest in _ONE_RUN_ONLY:
        if out.get(dest) is True:  # (False is the default; text: refused as not a bool)
            raise ValueError(
                f"config file {path!r} sets {named[dest]}: it speaks for one run only (the "
                "operator's word about that run's situation), so it is given as a flag, "
                "never kept in a file that every run reads"
            )
    base = os.path.dirname(os.path.abspath(path))
    for dest in _PATHS:
        value = out.get(dest)
        if isinstance(value, str) and value and value != "-" and not _URI.match(value):
            out[dest] = os.path.join(base, os.path.expanduser(value))  # (absolute: as is)
    return out


#: The options of a file's path: a config file's relative path is relative to the
#: config file's folder, not to the folder a run starts in (review 102: a cron job
#: started elsewhere made a new state, output and ledger there, and released the
#: stream's steps again under the same noise).
_PATHS = ("input", "output", "state", "ledger", "key_file", "domain")
#: A URI (``s3a://``, ``hdfs://``, ``file:/x``): a scheme of two or more characters.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
#: Flags that state a fact about one run (``--force``: the earlier release was never
#: published; ``--replace-unfinished``: the killed batch's events are given up).
_ONE_RUN_ONLY = ("force", "replace_unfinished")


def merge_options(
    args: argparse.Namespace,
    opts: Sequence[Opt],
    config: dict[str, Any] | None,
    ignore: Iterable[Opt] = (),
) -> dict[str, Any]:
    """Command-line flags over the config file over the defaults, checked like flags.

    Options of ``ignore`` may appear in the config file and are left out (so
    that ``plan`` reads a config file written for ``run``). Every value of the
    config file is checked (:func:`check_values`), before any is used.
    """
    given = vars(args)
    checked = check_values(config, opts, ignore=ignore) if config else {}
    out: dict[str, Any] = {}
    for opt in opts:
        if opt.dest in given:
            out[opt.dest] = given[opt.dest]
        elif opt.dest in checked:
            out[opt.dest] = checked[opt.dest]
        else:
            out[opt.dest] = opt.default
    return out


def check_values(
    values: Mapping[str, Any],
    opts: Sequence[Opt],
    *,
    where: str = "config file",
    keywords: bool = False,
    ignore: Iterable[Opt] = (),
    written: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Option values by name (``dest``), checked as a TOML config file's: the values
    to use, by name.

    The one check of values that did not come through the parser: a config file's
    (``dpstream run --config``) and :func:`dpstream.release_frame`'s keywords. An
    unknown name is refused (with the closest known name, if one is close); a flag
    takes ``True`` or ``False`` only (not ``"false"``); a number option takes a
    number, not text; every value then goes through its option's parser and
    choices, as the command line's text does.

    Args:
        values: the values by option name (a config file's keys with ``_`` for ``-``).
        opts: the options that may be given.
        where: what gave them, the start of every refusal (``release_frame``).
        keywords: named as Python keywords: a refusal names the keyword (``top``) and
            says "setting", and a ``None`` leaves the option at its default (left
            out of the result); else as a config file, by the flag (``--top``).
        ignore: options that may appear and are left out (``plan`` reading a
            config file written for ``run``).
        written: the name a keyword was given as, where it is not the option's
            (``release_frame``'s ``items=`` is ``item_column``).

    Raises:
        ValueError: the first name or value refused, with ``where`` and its name.
    """
    known = {o.dest: o for o in opts}
    unknown = sorted(set(values) - set(known) - {o.dest for o in ignore})
    if unknown:
        what = "setting" if keywords else "option"
        raise ValueError(
            f"{where}: unknown {what} {unknown[0]!r}{_did_you_mean(unknown[0], known, keywords)}"
        )
    out: dict[str, Any] = {}
    for dest, value in values.items():
        opt = known.get(dest)
        if opt is None or (keywords and value is None):
            continue  # ignored, or the default
        name = (written or {}).get(dest, dest) if keywords else opt.flags[0]
        out[dest] = _checked_value(opt, value, f"{where}: {name}")
    return out


def _did_you_mean(name: str, known: Mapping[str, Opt], keywords: bool) -> str:
    """`` (did you mean 'budget_cap'?)`` for a misspelled name, or nothing."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    if not close:
        return ""
    return f" (did you mean {close[0] if keywords else close[0].replace('_', '-')!r}?)"


#: A single value of a config file (TOML's strings, numbers and dates) or a keyword
#: (also a path object).
_SINGLE = (str, os.PathLike, numbers.Real, datetime.date, datetime.time)


def _numpy_kind(value: Any) -> str | None:
    """The dtype kind of a NumPy scalar ('b', 'i', 'u', 'f', ...), or None for anything
    else (NumPy is not imported here: the command's start must not pay for it)."""
    dtype = getattr(value, "dtype", None)
    if type(value).__module__ != "numpy" or getattr(value, "ndim", None) != 0:
        return None
    return getattr(dtype, "kind", None)


def _as_text(value: Any) -> str:
    """A setting's value as the text its option's parser reads, the same number it is:
    a NumPy float by its float64 value's repr (``str`` of ``np.float32(0.1)`` is "0.1",
    another float64 than the one a caller passing it got before)."""
    kind = _numpy_kind(value)
    if kind == "f":
        return repr(float(value))
    if kind in ("i", "u"):
        return str(int(value))
    return str(value)


def _checked_value(opt: Opt, value: Any, label: str) -> Any:
    if opt.kind in ("flag", "bool"):
        if _numpy_kind(value) == "b":
            value = bool(value)
        if not isinstance(value, bool):
            text = " (a bool, not text)" if isinstance(value, str) else ""
            raise ValueError(f"{label} must be true or false{text}, got {value!r}")
        return value
    if opt.dest == "domain" and isinstance(value, list):
        return value  # the domain itself
    if isinstance(value, bool) or not isinstance(value, _SINGLE):
        raise ValueError(f"{label} must be a single value, got {value!r}")
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    words = NUMBER_TYPES.get(opt.type) if opt.type is not None else None
    if words is not None and isinstance(value, str) and value not in words:
        kind = " or ".join(["a number", *map(repr, words)])
        raise ValueError(f"{label} must be {kind}, not text, got {value!r}")
    if opt.type is not None:
        try:
            value = opt.type(_as_text(value))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ValueError(f"{label}: {exc}") from None
    if opt.choices is not None and value not in opt.choices:
        allowed = ", ".join(map(str, opt.choices))
        raise ValueError(f"{label} must be one of {allowed}, got {value!r}")
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
    from ...clock import StepClock, steps_until

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


def domain_option(opts: Mapping[str, Any]) -> list[str] | None:
    value = opts.get("domain")
    if value is None:
        return None
    if isinstance(value, list):  # a config file's or a caller's list: read as a file's
        from ...io.domain import domain_list

        return domain_list(value, "--domain (a list)")
    from ...io import read_domain  # only for a domain file: `plan` without one skips io

    return read_domain(value)
