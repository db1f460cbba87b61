"""One command-line option (:class:`Opt`), the types that check a flag's value, and how
an option table becomes argparse arguments.

Layer 6 of dpstream (the command line's options, :mod:`dpstream.run.options`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


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


def _finite_float(text: str) -> float:
    """An argparse type: a finite number (not nan, not inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _unit_float(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (a delta)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text}")
    return value


def _size(text: str) -> str:
    """An argparse type: a size in bytes such as 512M or 2G (kept as text, read by
    :func:`dpstream.run.settings.parse_size`)."""
    from ..settings import parse_size

    try:
        if parse_size(text) <= 0:
            raise ValueError(f"expected a size above 0, got {text!r}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return str(text).strip()


def _share(text: str) -> str:
    """An argparse type: a share from 0 to 1, as a number or a percentage (kept as text,
    read exactly by :func:`dpstream.run.settings.parse_share`)."""
    from ..settings import parse_share

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


#: The types of the options whose value is a number, with the words they also take
#: (``--eta auto``): a config file's or a keyword's value for them is a number, not
#: text (TOML and Python have numbers: ``top = "2"`` is a mistake, refused).
NUMBER_TYPES: dict[Callable[[str], Any], tuple[str, ...]] = {
    _positive_int: (),
    _nonneg_int: (),
    _positive_float: (),
    _finite_float: (),
    _unit_float: (),
    _eta: ("auto",),
    int: (),
}


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
