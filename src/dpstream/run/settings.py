"""What a run's options mean before anything is read: the input format, the public clock,
the noise's stream name, and the cause of an invalid record.

Layer 6 of dpstream (the run's settings), shared by the run's config
(:mod:`dpstream.run.config`), its stages (:mod:`dpstream.run.source`,
:mod:`dpstream.run.follow`, :mod:`dpstream.run.validate`) and Spark
(:mod:`dpstream.spark.command`), none of which import each other for these
(docs/architecture.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = [
    "PROCESSING_DEFAULTS",
    "auto_format",
    "input_format",
    "clock_from_options",
    "message_words",
    "parse_share",
    "parse_size",
    "reason_key",
    "scoped_stream",
]


def auto_format(path: str, fmt: str) -> str:
    """A file's format from ``--input-format``/``--output-format`` (``auto``: by the
    path's suffix in any case, else JSON Lines: review 122, ``out.CSV`` was written as
    JSON Lines and ``in.CSV`` read as JSON Lines)."""
    if fmt != "auto":
        return fmt
    name = path.lower()
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    return "parquet" if name.endswith(".parquet") else "jsonl"


def input_format(path: str, fmt: str) -> str:
    """The input's format: :func:`auto_format`, and with ``auto`` ``parquet`` for a
    directory that holds ``*.parquet`` files (a data lake's partitions; Spark reads a
    directory of JSON Lines files)."""
    if fmt == "auto" and path != "-" and os.path.isdir(path) and _holds_parquet(path):
        return "parquet"
    return auto_format(path, fmt)


def _holds_parquet(path: str) -> bool:
    for _, _, files in os.walk(path):
        if any(name.endswith(".parquet") for name in files):
            return True
    return False


def clock_from_options(opts: Mapping[str, Any]) -> Any:
    """The public clock of --time-field/--step/--start, or None (steps given as integers)."""
    from ..clock import StepClock

    given = [opts.get(k) is not None for k in ("time_field", "step", "start")]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(
            "--time-field, --step and --start go together: the timestamps, "
            "the width of a step and when step 1 begins"
        )
    if opts.get("time_column") is not None:
        raise ValueError(
            "--time-column gives integer steps; --time-field gives timestamps: use one of them"
        )
    try:
        return StepClock.parse(opts["start"], opts["step"], opts.get("lateness"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--start/--step/--lateness: {exc}") from None


#: The words that name why a record is invalid, in the order a message is tried for them.
REASON_KEYS = (
    "late event",
    "past the horizon",
    "after --until",
    "before --start",
    "timestamp",
    "user id",
    "not in the domain",
    "more than --max-items",
    "not valid JSON",
    "time order",
    "not valid UTF-8",
    "line too long",
)


#: What a reader's message quotes of a record: the value after "got ", or a quoted string.
_QUOTED = re.compile(r"got .*$|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)


def message_words(problem: str) -> str:
    """A reader's message without what it quotes of the record: the words a reason is
    read from (review 111: an item holding "timestamp" made its record's reason a
    timestamp's, and lifted the redaction of its message)."""
    return _QUOTED.sub("", problem)


def reason_key(problem: str) -> str:
    """Why a record is invalid, from the reader's own words in ``problem`` (never from
    what it quotes of the record): one of :data:`REASON_KEYS`, else ``malformed``."""
    words = message_words(problem)
    for key in REASON_KEYS:
        if key in words:
            return key
    return "malformed"


PROCESSING_DEFAULTS = {
    "on_invalid": "skip",
    "implicit_time": False,
    "time_field": None,
    "step": None,
    "start": None,
    "lateness": None,
    "follow": False,
    "user_field": None,
}


def recorded_item_column(input_kind: str, name: str | None) -> str | None:
    """An input's item column as its noise scope and state record it. For Parquet,
    ``items`` (a list column, what an unnamed run reads when the file has one) is
    recorded as the default, ``item``, so that naming it (``--item-column items``, which
    a file holding both columns needs) keeps the stream's noise and its state's
    parameters, and the releases of the same events in JSON Lines; a CSV's ``items``
    is a column of another name."""
    return "item" if input_kind == "parquet" and name == "items" else name


def scoped_stream(opts: Mapping[str, Any]) -> str:
    """The stream name the noise is drawn under: ``--stream``, plus a fingerprint of the
    input settings that change which events a release counts (``--on-invalid``, the time
    mode and clock, the CSV columns, the user field) when they are not the defaults.

    Two runs of one stream under one key that count different events (skipping against
    truncating, hourly against half-hourly steps) must not share noise: the difference of
    their releases would be the exact difference of their counts. Runs with the default
    settings keep the plain name, so they equal the library's releases for that name
    (built with the run's noise version: ``noise_version=2`` for a new stream).
    """
    from ..mechanisms.base import config_tag

    settings = {k: opts.get(k, d) for k, d in PROCESSING_DEFAULTS.items() if opts.get(k, d) != d}
    fmt = input_format(str(opts.get("input", "-")), opts.get("input_format") or "auto")
    if fmt in ("csv", "parquet"):  # Parquet's defaults read JSON Lines' t and items
        for name, default in (
            ("item_column", "item"),
            ("event_column", "event"),
            ("time_column", None),
        ):
            value = opts.get(name)
            if name == "item_column":
                value = recorded_item_column(fmt, value)
            if value != default:
                settings[name] = value
    if not settings:
        return str(opts["stream"])
    return f"{opts['stream']}~{config_tag(**settings)}"


def parse_share(text: object) -> Fraction:
    """``--max-invalid``: ``"0.05"`` or ``"5%"`` as an exact fraction in [0, 1]."""
    s = str(text).strip()
    try:
        value = Fraction(s[:-1].strip()) / 100 if s.endswith("%") else Fraction(s)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"expected a share like 0.05 or 5%, got {text!r}") from None
    if not 0 <= value <= 1:
        raise ValueError(
            f"expected a share from 0 to 1 (or 0% to 100%), got {text!r}; it "
            "is a share of the input records, not a count"
        )
    return value


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: object) -> int:
    """A size in bytes from ``512M``, ``2G``, ``100k``, ``1048576`` (powers of 1024)."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)[bB]?\s*", str(text))
    if m is None:
        raise ValueError(f"expected a size such as 512M or 2G, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]
