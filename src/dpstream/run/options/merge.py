"""Options from the flags, a TOML config file and the defaults, merged into one mapping.

Layer 6 of dpstream (the command line's options, :mod:`dpstream.run.options`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .base import Opt


def load_config(path: str) -> dict[str, Any]:
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
    if isinstance(value, list):
        return [str(v) for v in value]
    from ...io import read_domain  # only for a domain file: `plan` without one skips io

    return read_domain(value)
