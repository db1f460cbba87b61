"""Reading events and writing releases: the file formats of the ``dpstream`` command.

Layer 6 of dpstream (the edges). The JSON Lines reader yields one event at a
time; the CSV reader, which groups each event's rows, and :func:`group_steps`,
which releases no step before the input's end, hold the input.

Input formats
-------------
JSON Lines (``--input-format jsonl``, the default), one event per line:

* ``{"items": ["aspirin", "ibuprofen"]}``, optionally with ``"t": 3``, the time
  step the event belongs to (many events may share a step; other keys are
  ignored), or
* ``["aspirin", "ibuprofen"]``, a plain JSON array.

With ``--user-field NAME`` (user-level privacy) every event is an object whose
field NAME holds a non-empty string user id (a CSV column of that name, equal
on every row of an event); an event without one is an invalid record.

CSV (``--input-format csv``): a header row, then one row per (event, item)
with an event-id column and an item column (names chosen by ``--event-column``
and ``--item-column``), and optionally a time-step column (``--time-column``).
An event is every row with one event id in one time step, wherever the rows
stand in the input (they need not be consecutive; an id used in two steps is
two events); an empty item cell adds no item. The reader holds the input's
rows until its end (a batch run holds its input anyway), then yields the
events in the order of their first rows. The CSV is parsed strictly
(a quote must be closed, and followed by a delimiter or the end of the row),
and a field holding a line break or an item longer than
:data:`MAX_CSV_ITEM_CHARS` (1,000) characters is an invalid record: both are
the mark of an unclosed quote that swallowed the rows after it. Errors name
the line where the record started.

Items on the command line are strings: a JSON integer item ``5`` is read as
``"5"`` (so a CSV and a JSON Lines file of the same stream give the same
releases). Blank lines are ignored. A ``.gz`` input is decompressed on the fly
(a truncated or corrupt one is an error naming the last line read). Inputs are
UTF-8, with or without a byte-order mark; a line that is not valid UTF-8, or
an item holding a lone surrogate (a JSON ``"\\ud800"``), is an invalid record.
JSON nested too deeply or with an integer of more than 4,300 digits is an
invalid record too.

Time steps: an event with ``t`` belongs to step ``t`` (steps must not go back);
an event without ``t`` is a step of its own (the step after the current one).
Steps with no event between two given steps are released too (nothing
happened then, and the histogram is still released). A malformed line
belongs to no step and does not advance time.

Output formats
--------------
JSON Lines (default): one line per time step,
``{"t": 3, "released": {"aspirin": 12.7, "ibuprofen": 3.2}}``, the items in
the mechanism's order, plus ``"meta": {...}`` when the mechanism reports extras
(for instance the threshold of the unknown-domain mechanism). Counts are
written with the shortest decimal that reads back as the same float64, so
the file holds exactly the library's values.

The long ("tidy") formats have one row per released item per step, with the
columns ``t, item, value, noise_std`` (the standard deviation of a count at
that step: a 95% interval is value +- 1.96 noise_std); a step that releases no
item is one row with an empty item and value, so every step is there. They
load into pandas and polars with their default readers: CSV
(``--output-format csv``, with a header), JSON Lines rows (``jsonl-long``)
and Parquet (``parquet``, needs pyarrow). The run's public metadata (the
guarantee, the threshold, the base) is in the sidecar ``OUTPUT.meta.json``.

Counts are written rounded to the nearest integer unless ``--no-round`` is
given. Released values are true counts plus continuous (floating-point)
Gaussian noise, and the low-order bits of such floats reveal more about the
true count than the noise scale suggests (Mironov, CCS 2012): the noise takes
values on a known grid, so a count that used a single tree cell can often be
recovered exactly from the float. Rounding is post-processing and costs no
privacy; ``--no-round`` (exact floats, bit for bit the library's values) is
for testing and research, not for publication.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypedDict

import numpy as np

from . import compiled
from .clock import StepClock, parse_timestamp
from .mechanisms.base import Release
from .mechanisms.item_table import utf8_and_lengths
from .mechanisms.truncation import keep_ranked, keyed_subset
from .noise import NoiseSource

__all__ = [
    "RawEvent",
    "MAX_CSV_ITEM_CHARS",
    "open_input",
    "guard_lines",
    "read_jsonl",
    "parse_jsonl_line",
    "raw_bytes",
    "read_csv",
    "read_events",
    "group_steps",
    "read_domain",
    "KeyedTruncator",
    "JsonlFormatter",
    "CsvFormatter",
    "JsonlLongFormatter",
    "ParquetWriter",
    "LONG_COLUMNS",
    "make_formatter",
]


@dataclass(frozen=True)
class RawEvent:
    """One input record, parsed or not.

    Attributes:
        line: 1-based line number in the input (for CSV, the event's first row).
        t: the time step the record gives, or ``None``.
        items: the event's items as strings (possibly with repeats), or
            ``None`` when the record is malformed.
        error: what is wrong with the record, or ``None``.
        user: the event's user id (``--user-field``), or ``None`` at event level.
        raw: the record's bytes as read (its line or lines, without the line
            terminator): what the keyed digest of a step's input reads.
    """

    line: int
    t: int | None
    items: tuple[str, ...] | None
    error: str | None = None
    user: str | None = None
    raw: bytes | None = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------- input


#: The most characters a CSV item may have: a longer one is an invalid record
#: (most likely an unclosed quote that swallowed the rows after it).
MAX_CSV_ITEM_CHARS = 1000


class _TextDecoding(TypedDict):
    """The keyword arguments of :func:`open` that decode an input's text."""

    encoding: str
    errors: str


#: Text decoding of every input: UTF-8 with an optional byte-order mark; bytes
#: that are not UTF-8 become lone surrogates, which the parsers reject per record.
_ENCODING: _TextDecoding = dict(encoding="utf-8-sig", errors="surrogateescape")


def open_input(path: str) -> TextIO:
    """A text stream for ``path``: ``-`` is stdin, ``*.gz`` is decompressed.

    The text is UTF-8 with an optional byte-order mark; invalid bytes are kept
    as lone surrogates (``surrogateescape``) so that the parsers can reject
    the one record that holds them instead of stopping the whole input.
    """
    if path == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return sys.stdin
        return io.TextIOWrapper(buffer, newline="", **_ENCODING)
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", newline="", **_ENCODING)
    return open(path, newline="", **_ENCODING)  # noqa: SIM115 - caller closes


def guard_lines(stream: Iterable[str], name: str) -> Iterator[str]:
    """The lines of ``stream``, with a truncated or corrupt ``.gz`` as a one-line error.

    Raises:
        ValueError: the compressed stream ends early or is corrupt (naming the
            last line read in full).
    """
    lineno = 0
    it = iter(stream)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"input {name!r}: the compressed file is truncated or corrupt "
                f"after line {lineno} ({exc})"
            ) from None
        lineno += 1
        yield line


def _valid_text(text: str) -> bool:
    """False if ``text`` holds a lone surrogate (invalid UTF-8 input, or a JSON escape)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _item(value: object) -> str | None:
    """A JSON value as a command-line item: strings as they are, integers as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _parse_items(values: object) -> tuple[tuple[str, ...] | None, str | None]:
    if not isinstance(values, list):
        return None, f"items must be a JSON array, got {type(values).__name__}"
    out = []
    for v in values:
        item = _item(v)
        if item is None:
            return None, (
                f"an item must be a string or an integer, got {_short(json.dumps(v, default=str))}"
            )
        if not _valid_text(item):
            return None, "an item is not valid UTF-8 text (it holds a lone surrogate)"
        out.append(item)
    return tuple(out), None


def _parse_t(value: object) -> tuple[int | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f'"t" must be an integer, got {_short(json.dumps(value))}'
    if value < 1:
        return None, f'"t" must be >= 1, got {_short(str(value))}'
    return value, None


def _step_of(value: object, clock: StepClock, what: str) -> tuple[int | None, str | None]:
    """The step of a timestamp on the public clock, or why there is none."""
    try:
        t = clock.step_of(parse_timestamp(value))
    except (TypeError, ValueError) as exc:
        return None, f"{what}: {exc}"
    if t < 1:
        return None, f"{what} is before --start"
    return t, None


def raw_bytes(text: str) -> bytes:
    """The bytes a line of text was read from (``surrogateescape`` restores invalid
    UTF-8 bytes; any other lone surrogate, from a caller's own text, passes through)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


_fast_loads: Callable[[str], Any] | None
try:  # a faster parser for the lines it agrees on (json.loads decides the others)
    from orjson import JSONDecodeError as _FastError
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = None

#: Lines longer than this, or with more brackets, go to ``json.loads`` directly
#: (orjson reads integers of any length as floats and nests deeper than json.loads).
_FAST_MAX_CHARS = 4000
_FAST_MAX_BRACKETS = 200


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)``, or why the line is not valid JSON."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})"
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except ValueError as exc:  # an integer of more than 4,300 digits
        why = "an integer has too many digits" if "digits" in str(exc) else str(exc)
        return None, f"not valid JSON ({_short(why, 80)})"


def parse_jsonl_line(
    line: str,
    lineno: int,
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> RawEvent | None:
    """One JSON Lines record (see :func:`read_jsonl`), or None for a blank line that is
    no record (a blank line is a record of its own step with ``implicit``)."""
    text = line.strip()
    raw = raw_bytes(line.rstrip("\r\n"))
    if not text:
        if implicit:
            return RawEvent(lineno, None, None, "a blank line (an empty event is [])", raw=raw)
        return None
    if not _valid_text(text):
        return RawEvent(lineno, None, None, "the line is not valid UTF-8", raw=raw)
    if (
        _fast_loads is not None
        and len(text) <= _FAST_MAX_CHARS
        and text.count("[") + text.count("{") <= _FAST_MAX_BRACKETS
    ):
        try:
            rec = _record(
                _fast_loads(text), text, lineno, time_field, clock, implicit, user_field, raw
            )
        except _FastError:
            rec = None
        if rec is not None and rec.error is None:
            return rec
        # orjson refused the line, or the record is invalid: json.loads decides (and
        # words the message), so that both parsers give the same records
    obj, err = _loads(text)
    if err is not None:
        return RawEvent(lineno, None, None, err, raw=raw)
    return _record(obj, text, lineno, time_field, clock, implicit, user_field, raw)


def _record(
    obj: Any,
    text: str,
    lineno: int,
    time_field: str | None,
    clock: StepClock | None,
    implicit: bool,
    user_field: str | None,
    raw: bytes,
) -> RawEvent:
    if isinstance(obj, list):
        if not implicit:
            where = (
                f'a "{time_field}" timestamp'
                if clock is not None
                else 'a time step "t" (or --implicit-time: each line is a step)'
            )
            return RawEvent(
                lineno,
                None,
                None,
                f'an event needs {where}: write it as an {{"items": [...], ...}} object',
                raw=raw,
            )
        if user_field is not None:
            return RawEvent(
                lineno,
                None,
                None,
                f'an event needs a "{user_field}" user id (--user-field): write it as an object',
                raw=raw,
            )
        items, err = _parse_items(obj)
        return RawEvent(lineno, None, items, err, raw=raw)
    if isinstance(obj, dict):
        t: int | None = None
        if implicit:
            err = (
                'a line gives "t", but --implicit-time makes each line a step'
                if "t" in obj
                else None
            )
        elif clock is not None:
            if time_field not in obj:
                return RawEvent(
                    lineno,
                    None,
                    None,
                    f'an event needs a "{time_field}" timestamp (--time-field)',
                    raw=raw,
                )
            t, err = _step_of(obj[time_field], clock, "its timestamp")
        elif "t" not in obj:
            return RawEvent(
                lineno,
                None,
                None,
                'an event needs a time step "t" (or --implicit-time: each line is a step)',
                raw=raw,
            )
        else:
            t, err = _parse_t(obj.get("t"))
        if err is None and "items" not in obj:
            err = 'an event object needs an "items" array'
        user = None
        if err is None and user_field is not None:
            user, err = _parse_user(obj, user_field)
        items = None
        if err is None:
            items, err = _parse_items(obj["items"])
        ok = err is None
        return RawEvent(lineno, t, items if ok else None, err, user if ok else None, raw=raw)
    return RawEvent(
        lineno,
        None,
        None,
        f'an event must be a JSON array or an object with "items", got {text[:40]!r}',
        raw=raw,
    )


def _parse_user(obj: dict, user_field: str) -> tuple[str | None, str | None]:
    """The user id of an event object (``--user-field``), or why there is none."""
    if user_field not in obj:
        return None, f'an event needs a "{user_field}" user id (--user-field)'
    value = obj[user_field]
    if not isinstance(value, str) or not value:
        return None, (
            f'the user id "{user_field}" must be a non-empty string, got '
            f"{_short(json.dumps(value, default=str))}"
        )
    if not _valid_text(value):
        return None, "the user id is not valid UTF-8 text (it holds a lone surrogate)"
    return value, None


def read_jsonl(
    lines: Iterable[str],
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> Iterator[RawEvent]:
    """Parse JSON Lines events (see the module docstring).

    Steps come from the public time mode, never from the data: an event's
    ``"t"`` (the default), the timestamp in ``time_field`` on ``clock``, or,
    with ``implicit``, the line itself: then *every* line is a step, blank or
    broken ones too (a broken or blank line is an invalid record of its own
    step), so what a line holds never changes which step the next line is.
    Without ``implicit`` blank lines are skipped, an event without its time
    is an invalid record of no step, and an event whose time is readable but
    whose items are not keeps its step (an invalid record of that step).
    With ``user_field``, every event is an object with a non-empty string user
    id in that field; an event without one is an invalid record (of its step).
    """
    if (time_field is None) != (clock is None):
        raise ValueError("time_field and clock go together")
    if implicit and clock is not None:
        raise ValueError("implicit time and a clock do not go together")
    for lineno, line in enumerate(lines, 1):
        rec = parse_jsonl_line(
            line,
            lineno,
            time_field=time_field,
            clock=clock,
            implicit=implicit,
            user_field=user_field,
        )
        if rec is not None:
            yield rec


def read_csv(
    stream: Iterable[str],
    *,
    item_column: str = "item",
    event_column: str = "event",
    time_column: str | None = None,
    clock: StepClock | None = None,
    delimiter: str = ",",
    user_column: str | None = None,
) -> Iterator[RawEvent]:
    """Parse CSV rows (one per event and item) into events: an event is every row
    with one event id in one time step, wherever the rows stand in the input.

    The input is read to its end before the first record is yielded (a later
    row may belong to any event). The events come out in the order of their
    first rows, each with that row's line, its items in the order of its rows
    and its rows' bytes (joined by a line feed) as ``raw``; an id in two steps
    is two events. So what happens to an event is a function of its own rows
    and step, never of the rows between them (else another event's row could
    cut it in two: one event's presence would change another's count). Without
    a time column (and a clock), the id alone is the event.

    A row whose step cannot be read (a time that is not an integer >= 1, a bad
    timestamp) belongs to no event: it is an invalid record of its own, as is
    a record with a CSV syntax error (strict parsing), too few fields, a field
    spanning lines, an item longer than :data:`MAX_CSV_ITEM_CHARS` or text
    that is not valid UTF-8. Each record's ``line`` is the line where it
    started. With ``user_column``, every row of an event must hold the same
    non-empty user id, else the event is an invalid record.
    """
    captured: list[str] = []  # the lines of the record being read (for its raw bytes)

    def capture() -> Iterator[str]:
        for text in stream:
            captured.append(text)
            yield text

    def take_raw() -> bytes:
        text = "".join(captured)
        captured.clear()
        cut = 2 if text.endswith("\r\n") else 1 if text.endswith(("\n", "\r")) else 0
        return raw_bytes(text[: len(text) - cut])

    reader = csv.reader(capture(), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        raise ValueError(f"input line 1: bad CSV header ({exc})") from None
    cols = {name.strip(): i for i, name in enumerate(header)}
    for role, name in (
        ("--item-column", item_column),
        ("--event-column", event_column),
        ("--time-column", time_column),
        ("--user-field", user_column),
    ):
        if name is not None and name not in cols:
            raise ValueError(
                f"input line 1: the CSV header has no column {name!r} ({role}); "
                f"columns: {', '.join(_short(c) for c in cols)}"
            )
    i_item, i_event = cols[item_column], cols[event_column]
    i_time = cols[time_column] if time_column is not None else None
    i_user = cols[user_column] if user_column is not None else None
    width = max(i for i in (i_item, i_event, i_time, i_user) if i is not None) + 1

    # Every event of the input, by (step, id), in the order of its first row; the
    # records of rows that belong to no event (no readable step) among them.
    records: list[_CsvEvent | RawEvent] = []
    events: dict[tuple[int | None, str], _CsvEvent] = {}
    texts: dict[str, str] = {}  # one string per distinct item (the rows are held)

    captured.clear()  # the header's lines
    while True:
        first_line = reader.line_num + 1  # where the next record starts
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            hint = ": an unclosed quote?" if "end of data" in str(exc) else ""
            records.append(
                RawEvent(first_line, None, None, f"bad CSV record ({exc}{hint})", raw=take_raw())
            )
            continue
        lineno = first_line
        row_raw = take_raw()
        if not row or all(not c.strip() for c in row):
            continue
        row_err: str | None = None
        if len(row) < width:
            row_err = f"CSV row has {len(row)} fields, expected at least {width}"
        elif any(
            "\n" in row[i] or "\r" in row[i]
            for i in (i_item, i_event, i_time, i_user)
            if i is not None
        ):
            row_err = (
                f"a field spans lines (lines {first_line}-{reader.line_num}: an unclosed quote?)"
            )
        elif not all(_valid_text(c) for c in row):
            row_err = "the row is not valid UTF-8"
        elif len(row[i_item]) > MAX_CSV_ITEM_CHARS:
            row_err = (
                f"item of {len(row[i_item])} characters, more than "
                f"{MAX_CSV_ITEM_CHARS} (an unclosed quote?)"
            )
        row_t: int | None = None
        if row_err is None and i_time is not None and clock is not None:
            row_t, row_err = _step_of(row[i_time], clock, "the row's timestamp")
        elif row_err is None and i_time is not None:
            raw = row[i_time].strip()
            try:
                row_t = int(raw)
                if row_t < 1:
                    row_err = f"time step must be >= 1, got {_short(raw)!r}"
            except ValueError:
                row_err = f"time step must be an integer, got {_short(raw)!r}"
        if row_err is not None:  # no event (step and id) to belong to: a record alone
            records.append(RawEvent(lineno, None, None, row_err, raw=row_raw))
            continue
        eid = row[i_event]
        event = events.get((row_t, eid))
        if event is None:
            event = events[(row_t, eid)] = _CsvEvent(lineno, row_t, eid)
            records.append(event)
        event.add(row[i_item], None if i_user is None else row[i_user], user_column, row_raw, texts)
    events.clear()
    texts.clear()
    records.reverse()  # let go of each record as it is yielded
    while records:
        rec = records.pop()
        yield rec.record() if isinstance(rec, _CsvEvent) else rec


class _CsvEvent:
    """The rows of one CSV event (one id in one step) read so far."""

    __slots__ = ("line", "t", "eid", "items", "user", "error", "raws")

    def __init__(self, line: int, t: int | None, eid: str) -> None:
        self.line, self.t, self.eid = line, t, eid
        self.items: list[str] = []
        self.user: str | None = None
        self.error: str | None = None
        self.raws: list[bytes] = []

    def add(
        self,
        item: str,
        user: str | None,
        user_column: str | None,
        raw: bytes,
        texts: dict[str, str],
    ) -> None:
        """Take one more row (``user``: its user id cell, None at event level)."""
        first = not self.raws
        self.raws.append(raw)
        if user is not None and self.error is None:
            if user == "":
                self.error = f"the user id column {user_column!r} is empty"
            elif first:
                self.user = user
            elif user != self.user:
                self.error = f"event {_short(self.eid)!r} has rows with different user ids"
        if item != "" and self.error is None:
            self.items.append(texts.setdefault(item, item))

    def record(self) -> RawEvent:
        raw = b"\n".join(self.raws)
        if self.error is not None:
            return RawEvent(self.line, None, None, self.error, raw=raw)
        return RawEvent(self.line, self.t, tuple(self.items), None, self.user, raw=raw)


def read_events(
    stream: Iterable[str],
    fmt: str,
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
    **csv_options: Any,
) -> Iterator[RawEvent]:
    """Dispatch on ``fmt`` (``"jsonl"`` or ``"csv"``); ``time_field`` with ``clock``:
    steps from timestamps (a JSON field, or the CSV column of that name);
    ``implicit``: every JSON line is a step (CSV needs a time column);
    ``user_field``: each event's user id (a JSON field, or the CSV column)."""
    if fmt == "jsonl":
        return read_jsonl(
            stream, time_field=time_field, clock=clock, implicit=implicit, user_field=user_field
        )
    if implicit:
        raise ValueError(
            "--implicit-time is for JSON Lines: the rows of a CSV event are not "
            "a step each; give --time-column or --time-field"
        )
    if user_field is not None:
        csv_options = {**csv_options, "user_column": user_field}
    if clock is not None:
        csv_options = {**csv_options, "time_column": time_field, "clock": clock}
    if fmt == "csv":
        return read_csv(stream, **csv_options)
    raise ValueError(f"input format must be 'jsonl' or 'csv', got {fmt!r}")


def group_steps(
    records: Iterable[RawEvent],
    horizon: int,
    *,
    start: int = 0,
    implicit: bool = False,
    limit: int | None = None,
) -> Iterator[tuple[int | None, list[RawEvent]]]:
    """Group records into time steps.

    With ``implicit``, every record (valid or not) is a step of its own, one
    at a time. Otherwise the input is read to its end first, and then
    ``(t, records)`` is yielded for t = start+1, start+2, ... up to the last
    step a record has, including empty steps in gaps: a record with a time
    belongs to that step wherever it stands in the input, valid or not (an
    invalid one is the caller's to drop); a record without a time belongs to
    the step of the last record before it that has one, or else to the first
    step, or, when no record has a time, all such records are yielded as
    ``(None, records)``. A record of a step up to ``start`` (a stream that
    goes on from an earlier run) is a malformed record in the step it stands.

    The steps wait for the end of the input because closing one when a record
    of a later step arrived let that record decide that the records after it
    were late: its presence changed other records' counts, which the privacy
    guarantee does not cover.

    A record whose time is past ``limit`` (``--until``; the horizon by
    default) is yielded at once as ``(t, records)`` with t > limit, for the
    caller to reject, consecutive ones of the same time together.
    """
    limit = horizon if limit is None else limit
    if implicit:
        current = start
        for rec in records:
            current += 1
            yield current, [rec]
        return
    steps: dict[int, list[RawEvent]] = {}
    last: int | None = None  # the step of the last record that had one
    lead: list[RawEvent] = []  # records without a step before any with one
    past: list[RawEvent] = []  # consecutive records of one time past ``limit``
    for rec in records:
        if rec.t is not None and rec.t > limit:
            if past and past[0].t != rec.t:
                yield past[0].t, past
                past = []
            past.append(rec)
            continue
        if past:
            yield past[0].t, past
            past = []
        if rec.t is not None and rec.t <= start:
            rec = RawEvent(
                rec.line,
                None,
                None,
                f"time step {rec.t} is not after step {start}, which is already "
                "complete (events must be in time order)",
                raw=rec.raw,
            )
        if rec.t is None:
            (lead if last is None else steps[last]).append(rec)
            continue
        last = rec.t
        steps.setdefault(last, []).append(rec)
    if past:
        yield past[0].t, past
    if not steps:
        if lead:
            yield None, lead
        return
    for t in range(start + 1, max(steps) + 1):
        yield t, lead + steps.pop(t, [])
        lead = []


def read_domain(path: str) -> list[str]:
    """The known domain: a JSON array of items, or one item per line (blank lines skipped)."""
    with open_input(path) as fh:
        text = "".join(guard_lines(fh, path))
    if not _valid_text(text):
        raise ValueError(f"domain file {path!r} is not valid UTF-8 text")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"domain file {path!r}: not a valid JSON array ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:
            raise ValueError(
                f"domain file {path!r}: not a valid JSON array "
                f"({_short(str(exc) or 'nested too deeply', 80)})"
            ) from None
        items, err = _parse_items(values)
        if err:
            raise ValueError(f"domain file {path!r}: {err}")
        domain = list(items or ())
    else:
        domain = [line.strip() for line in text.splitlines() if line.strip()]
    if not domain:
        raise ValueError(f"domain file {path!r} holds no item")
    if len(set(domain)) != len(domain):
        seen: set[str] = set()
        for dup in domain:  # the first item seen a second time
            if dup in seen:
                raise ValueError(f"domain file {path!r} lists {dup!r} twice")
            seen.add(dup)
    return domain


class KeyedTruncator:
    """Keeps ``max_items`` of an event's items, chosen by a keyed PRF (``--on-invalid truncate``).

    Taking "the first k items" would let the order in which a client lists
    items decide what is counted; here the kept items of an event of step t
    are a keyed function of t and the event's own distinct items
    (:mod:`dpstream.mechanisms.truncation`), never of its input line or of any
    other event. So removing an event changes no other event's kept items,
    the truncated streams of neighbouring inputs are neighbours, and a stream
    fed in daily runs is cut exactly as one run over all the days.
    """

    def __init__(self, source: NoiseSource, max_items: int) -> None:
        self.source = source
        self.max_items = max_items

    def __call__(self, items: Sequence[str], t: int) -> tuple[str, ...]:
        """The kept items of one event of step ``t``, in the event's order."""
        return keyed_subset(self.source, items, self.max_items, t)  # type: ignore[return-value]

    def keep(
        self, t: int, items: Sequence[Any], codes: np.ndarray, offsets: np.ndarray
    ) -> np.ndarray:
        """The kept occurrences of several events of step ``t`` (columns; see
        :func:`~dpstream.mechanisms.truncation.keep_ranked`)."""
        return keep_ranked(self.source, t, items, codes, offsets, self.max_items)


# --------------------------------------------------------------------------- output


def _json_default(value: object) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _values(release: Release, round_counts: bool) -> list[float] | list[int]:
    values = np.asarray(release.values, dtype=np.float64)
    if round_counts:
        return np.rint(values).astype(np.int64).tolist()
    return values.tolist()


class _ItemText:
    """The items of a release as an Arrow string array of their encoded text (JSON
    or CSV), kept while the release's items are the same list: a known domain is
    encoded once, not at every step.

    ``plain``: a regular expression of the characters that need ``encode``; when
    no item (all ``str``) holds one, the text is ``quote + item + quote``, built by
    Arrow without a Python call per item.
    """

    def __init__(self, encode: Any, plain: str | None = None, quote: str = "") -> None:
        self._encode = encode
        self._plain = plain
        self._quote = quote
        self._items: Any = None
        self._len = -1
        self._text: Any = None
        self._raw: tuple[Any, np.ndarray] | None = None

    def holds(self, items: Sequence[Any]) -> bool:
        """Whether the text of ``items`` is at hand (the same list as last time)."""
        return items is self._items and len(items) == self._len

    def __call__(self, items: Sequence[Any]) -> Any:
        if not self.holds(items):
            self._text = self._build(items)
            self._items, self._len = items, len(items)
            self._raw = None
        return self._text

    def raw(self, items: Sequence[Any]) -> tuple[Any, np.ndarray]:
        """The items' text as (UTF-8 bytes, offsets: int64, or uint32 for Arrow's int32
        ones, which are never negative), for the C row joiner."""
        text = self(items)
        if self._raw is None:
            import pyarrow as pa

            wide = pa.types.is_large_string(text.type)
            _, offsets, data = text.buffers()
            off = np.frombuffer(
                offsets,
                dtype=np.int64 if wide else np.int32,
                count=len(text) + 1,
                offset=text.offset * (8 if wide else 4),
            )
            self._raw = (b"" if data is None else data, off if wide else off.view(np.uint32))
        return self._raw

    def _build(self, items: Sequence[Any]) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        as_arrow = getattr(items, "to_arrow", None)  # a known domain's view: its bytes
        if as_arrow is not None and self._encode is str:
            return as_arrow()
        if self._plain is not None and (as_arrow is not None or all(type(x) is str for x in items)):
            try:
                arr = as_arrow() if as_arrow is not None else pa.array(items, pa.string())
            except (pa.ArrowException, UnicodeEncodeError):
                arr = None  # a lone surrogate: the slow path decides
            if arr is not None and not pc.any(pc.match_substring_regex(arr, self._plain)).as_py():
                if not self._quote:
                    return arr
                q = pa.scalar(self._quote, pa.string())
                return pc.binary_join_element_wise(q, arr, q, "")
        return pa.array([self._encode(x) for x in items], pa.string())


def _value_text(release: Release, round_counts: bool) -> Any:
    """The values as an Arrow string array, written as the slow path writes them:
    integers in decimal, floats as ``repr`` (the shortest text that reads back the
    same float64); None when a value is not finite (the slow path decides)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = np.asarray(release.values, dtype=np.float64)
    if not np.isfinite(values).all():
        return None
    if round_counts:
        return pc.cast(pa.array(np.rint(values).astype(np.int64)), pa.string())
    return pa.array(list(map(repr, values.tolist())), pa.string())


def _join(pieces: Any, sep: str) -> str:
    """The strings of an Arrow array joined by ``sep``, in C++."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(pieces) == 0:
        return ""
    one = pa.ListArray.from_arrays(pa.array([0, len(pieces)], pa.int32()), pieces)
    return pc.binary_join(one, sep)[0].as_py()


def _int_rows(
    text: _ItemText, release: Release, head: bytes, mid: bytes, tail: bytes, sep: bytes
) -> bytes | None:
    """The rows ``head + item text + mid + rounded value + tail`` of a release, joined
    by ``sep`` in one C pass (the items' text from ``text``, encoded once for a known
    domain); None without the C loops or when a value is not finite (the callers'
    other paths decide). The same bytes as Arrow's kernels: integers in decimal."""
    return _join_int_rows(release.values, lambda: text.raw(release.items), head, mid, tail, sep)


def _plain_int_rows(
    items: Sequence[Any],
    values: np.ndarray,
    special: Any,
    head: bytes,
    mid: bytes,
    tail: bytes,
    sep: bytes,
) -> bytes | None:
    """:func:`_int_rows` for fresh ``str`` items that need no escaping (``special``, a
    compiled bytes pattern, finds none in their UTF-8), their text being the items
    themselves: one encode and one C pass, no Arrow array. None otherwise."""

    def text() -> tuple[bytes, np.ndarray] | None:
        if not _STR_ONLY.issuperset(map(type, items)):
            return None
        encoded = utf8_and_lengths(items)  # None for a lone surrogate: json.dumps decides
        if encoded is None or special.search(encoded[0]):
            return None
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(encoded[1], out=offsets[1:])
        return encoded[0], offsets

    return _join_int_rows(values, text, head, mid, tail, sep)


def _join_int_rows(
    values: Any, text: Any, head: bytes, mid: bytes, tail: bytes, sep: bytes
) -> bytes | None:
    """The C joiner over ``text()`` (the items' UTF-8 and offsets, or None) and the
    rounded values; None without the C loops, for a value that is not finite, or
    when ``text()`` gives none."""
    loops = compiled.loops()
    values = np.asarray(values, dtype=np.float64)
    if loops is None or not np.isfinite(values).all():
        return None
    got = text()
    if got is None:
        return None
    return loops.join_rows(got[0], got[1], np.rint(values).astype(np.int64), head, mid, tail, sep)


_STR_ONLY = frozenset((str,))


def _meta_text(release: Release) -> str:
    """``, "meta": {...}`` of a release with meta (as ``json.dumps`` of the whole
    release writes it), else empty."""
    if not release.meta:
        return ""
    return ', "meta": ' + json.dumps(
        dict(release.meta), ensure_ascii=False, allow_nan=False, default=_json_default
    )


#: Characters that make an item's JSON text more than the item in quotes
#: (``json.dumps(..., ensure_ascii=False)`` escapes these and only these).
_JSON_SPECIAL = '[\\x00-\\x1f"\\\\]'
_JSON_SPECIAL_BYTES = re.compile(_JSON_SPECIAL.encode())
#: Characters that make the csv module quote a field.
_CSV_SPECIAL = '[,"\\r\\n]'


def _json_key(item: Any) -> str:
    return json.dumps(str(item), ensure_ascii=False)


class _Formatter:
    """A release formatter: Arrow's string kernels for a large release, rows otherwise
    (both give the same bytes; the row path is the reference).

    Arrow's kernels pay ~100 us of calls per release and then beat ``json.dumps``
    per item when the items' text is already encoded (a known domain, the same
    items at every step: from 64 items on), or past a few thousand fresh items
    (an open domain's release, whose items are new objects at every step).
    """

    _text: _ItemText | None = None  # the items' text, where the formatter keeps one
    _last_items: Any = None  # the items of the release before

    #: Whether one row costs a json.dumps or a csv writer call on the row path (the
    #: long formats): then the C joiner of rounded counts is faster for fresh items too
    #: (measured at 64 items: 1.3x for CSV, 2.6x for jsonl-long; the wide JSONL's one
    #: json.dumps of a dict wins up to ~2,000 items).
    _rows_per_item = False

    def _columnar(self, release: Release) -> bool:
        n = len(release.values)
        repeated, self._last_items = release.items is self._last_items, release.items
        if n >= _COLUMNAR_FRESH_MIN:
            return True
        if (
            n >= _COLUMNAR_MIN
            and self._rows_per_item
            and getattr(self, "round_counts", False)
            and compiled.loops() is not None
        ):
            return True
        # the same items as the step before (a known domain's one tuple): encode them
        # once, for this step and the next ones
        return (
            n >= _COLUMNAR_MIN
            and self._text is not None
            and (repeated or self._text.holds(release.items))
        )

    def format(self, release: Release) -> bytes:
        if self._columnar(release):
            try:
                fast = self._format_columns(release)
            except Exception:  # noqa: BLE001 - the slow path raises what it raises
                fast = None
            if fast is not None:
                return fast
        return self._format_rows(release)

    def _format_columns(self, release: Release) -> bytes | None:  # pragma: no cover
        raise NotImplementedError

    def _format_rows(self, release: Release) -> bytes:  # pragma: no cover
        raise NotImplementedError


class JsonlFormatter(_Formatter):
    """``{"t": 3, "released": {item: count, ...}}`` per line (see the module docstring)."""

    name = "jsonl"

    def __init__(self, round_counts: bool = False) -> None:
        self.round_counts = round_counts
        self._keys = self._text = _ItemText(_json_key, _JSON_SPECIAL, '"')

    def header(self) -> bytes:
        return b""

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as :meth:`_format_rows`, built by Arrow's string kernels."""
        import pyarrow.compute as pc

        tail = "}" + _meta_text(release)
        head = f'{{"t": {int(release.t)}, "released": {{'
        body = _int_rows(self._keys, release, b"", b": ", b"", b", ") if self.round_counts else None
        if body is not None:
            return head.encode() + body + (tail + "}\n").encode("utf-8")
        vals = _value_text(release, self.round_counts)
        if vals is None:
            return None
        pairs = pc.binary_join_element_wise(self._keys(release.items), vals, ": ")
        return (head + _join(pairs, ", ") + tail + "}\n").encode("utf-8")

    def _format_rows(self, release: Release) -> bytes:
        if self.round_counts and len(release.values):
            pairs = _plain_int_rows(
                release.items, release.values, _JSON_SPECIAL_BYTES, b'"', b'": ', b"", b", "
            )
            if pairs is not None:
                return (
                    f'{{"t": {int(release.t)}, "released": {{'.encode()
                    + pairs
                    + ("}" + _meta_text(release) + "}\n").encode("utf-8")
                )
        return self._format_dict(release)

    def _format_dict(self, release: Release) -> bytes:
        """The reference: the release as a dict through ``json.dumps``."""
        values = _values(release, self.round_counts)
        released = {str(k): v for k, v in zip(release.items, values, strict=True)}
        obj: dict[str, Any] = {"t": int(release.t), "released": released}
        if release.meta:
            obj["meta"] = dict(release.meta)
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)
        if len(released) < len(values):
            # two items with one text (1 and "1"): a dict would keep only the last
            # pair; write one pair per item, as the columnar path does
            pairs = ", ".join(
                f"{_json_key(k)}: {json.dumps(v, allow_nan=False)}"
                for k, v in zip(release.items, values, strict=True)
            )
            text = f'{{"t": {int(release.t)}, "released": {{{pairs}}}{_meta_text(release)}}}'
        return (text + "\n").encode("utf-8")


#: The columns of every long ("tidy") output: one row per released item per step.
LONG_COLUMNS = ("t", "item", "value", "noise_std")
#: The column a run with a public clock (--start/--step) adds: when each step begins.
STEP_START = "step_start"

#: Releases of at least this many items are formatted by Arrow's string kernels when
#: their items' text is cached (the same items as the step before) ...
_COLUMNAR_MIN = 64
#: ... and from this many items on in any case (measured: at 3,000 fresh items
#: json.dumps takes 0.7 ms and the kernels 0.9 ms; at 10,000, 5.3 and 2.4 ms).
_COLUMNAR_FRESH_MIN = 4096


def _long_rows(
    release: Release, round_counts: bool, step_start: Callable[[int], str] | None = None
) -> list[tuple[Any, ...]]:
    """The rows of one release in the long format; an empty step is one row with no item.

    ``noise_std`` comes from the release's meta (the run adds it: the standard
    deviation of a count at that step, public); ``None`` when absent. With
    ``step_start`` (a run's public clock), each row ends with ``step_start(t)``.
    """
    t = int(release.t)
    std = release.meta.get("noise_std") if release.meta else None
    values = _values(release, round_counts)
    extra = () if step_start is None else (step_start(t),)
    if not values:
        return [(t, None, None, std, *extra)]
    return [
        (t, str(item), value, std, *extra)
        for item, value in zip(release.items, values, strict=True)
    ]


def _csv_cell(item: Any) -> str:
    """An item as the csv module writes it (quoted when it must be)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([str(item), ""])  # as one field of a row
    return buf.getvalue()[:-2]


class CsvFormatter(_Formatter):
    """The long format as CSV: a ``t,item,value,noise_std`` header, then one row per
    released item per step; a step that releases no item writes one row with empty
    ``item`` and ``value``, so every step of the clock is in the file."""

    _rows_per_item = True
    name = "csv"

    def __init__(
        self, round_counts: bool = False, step_start: Callable[[int], str] | None = None
    ) -> None:
        self.round_counts = round_counts
        self.step_start = step_start  # a public clock: a step_start column (ISO-8601)
        self._cells = self._text = _ItemText(_csv_cell, _CSV_SPECIAL)

    def header(self) -> bytes:
        extra = () if self.step_start is None else (STEP_START,)
        return (",".join((*LONG_COLUMNS, *extra)) + "\n").encode()

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as :meth:`_format_rows`, built by Arrow's string kernels."""
        import pyarrow as pa
        import pyarrow.compute as pc

        std = release.meta.get("noise_std") if release.meta else None
        std_text = "" if std is None else repr(std) if isinstance(std, float) else str(std)
        if self.step_start is not None:  # ISO-8601 text: nothing a CSV writer quotes
            std_text += "," + self.step_start(int(release.t))
        rows = (
            _int_rows(
                self._cells,
                release,
                f"{int(release.t)},".encode(),
                b",",
                f",{std_text}".encode(),
                b"\n",
            )
            if self.round_counts
            else None
        )
        if rows is not None:
            return rows + b"\n"
        vals = _value_text(release, self.round_counts)
        if vals is None:
            return None
        n = len(vals)
        rows = pc.binary_join_element_wise(
            pa.array([str(int(release.t))] * 1, pa.string()).take(pa.array(np.zeros(n, np.int64))),
            self._cells(release.items),
            vals,
            pa.array([std_text], pa.string()).take(pa.array(np.zeros(n, np.int64))),
            ",",
        )
        return (_join(rows, "\n") + "\n").encode("utf-8")

    def _format_rows(self, release: Release) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in _long_rows(release, self.round_counts, self.step_start):
            writer.writerow(
                ["" if v is None else repr(v) if isinstance(v, float) else v for v in row]
            )
        return buf.getvalue().encode("utf-8")


class JsonlLongFormatter(_Formatter):
    """The long format as JSON Lines: ``{"t", "item", "value", "noise_std"}`` per row
    (``item`` and ``value`` null for a step that releases no item)."""

    _rows_per_item = True
    name = "jsonl-long"

    def __init__(
        self, round_counts: bool = False, step_start: Callable[[int], str] | None = None
    ) -> None:
        self.round_counts = round_counts
        self.step_start = step_start  # a public clock: a "step_start" field (ISO-8601)
        self._keys = self._text = _ItemText(_json_key, _JSON_SPECIAL, '"')
        self._columns = LONG_COLUMNS + (() if step_start is None else (STEP_START,))

    def header(self) -> bytes:
        return b""

    def _format_rows(self, release: Release) -> bytes:
        return "".join(
            json.dumps(
                dict(zip(self._columns, row, strict=True)), ensure_ascii=False, allow_nan=False
            )
            + "\n"
            for row in _long_rows(release, self.round_counts, self.step_start)
        ).encode("utf-8")

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as the row by row path, built by Arrow's string kernels."""
        import pyarrow as pa
        import pyarrow.compute as pc

        std = release.meta.get("noise_std") if release.meta else None
        if isinstance(std, float) and not math.isfinite(std):
            return None
        head = f'{{"t": {int(release.t)}, "item": '
        start = (
            ""
            if self.step_start is None
            else f', "{STEP_START}": {json.dumps(self.step_start(int(release.t)))}'
        )
        tail = f', "noise_std": {json.dumps(std)}{start}}}'
        joined = (
            _int_rows(self._keys, release, head.encode(), b', "value": ', tail.encode(), b"\n")
            if self.round_counts
            else None
        )
        if joined is not None:
            return joined + b"\n"
        vals = _value_text(release, self.round_counts)
        if vals is None:
            return None
        n = len(vals)
        const = pa.array([head, ', "value": ', tail], pa.string())
        rows = pc.binary_join_element_wise(
            const.take(pa.array(np.zeros(n, np.int64))),
            self._keys(release.items),
            const.take(pa.array(np.ones(n, np.int64))),
            vals,
            const.take(pa.array(np.full(n, 2, np.int64))),
            "",
        )
        return (_join(rows, "\n") + "\n").encode("utf-8")


class ParquetWriter:
    """The long format as Parquet (needs pyarrow: ``pip install 'dpstream[parquet]'``).

    One row group per batch of steps; the file is complete when closed. It
    cannot be truncated and resumed like a text output, so a run with
    ``--state`` writes JSON Lines or CSV (convert afterwards).
    """

    name = "parquet"

    def __init__(
        self,
        path: str,
        round_counts: bool = False,
        *,
        rows_per_group: int = 65536,
        step_start: Callable[[int], str] | None = None,
    ) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                "--output-format parquet needs pyarrow: pip install 'dpstream[parquet]'"
            ) from None
        self.round_counts = round_counts
        self._pa = pa
        self.step_start = step_start  # a public clock: a step_start column (ISO-8601)
        self._schema = pa.schema(
            [
                ("t", pa.int64()),
                ("item", pa.string()),
                ("value", pa.int64() if round_counts else pa.float64()),
                ("noise_std", pa.float64()),
                *([(STEP_START, pa.string())] if step_start else []),
            ]
        )
        self._writer = pq.ParquetWriter(path, self._schema)
        self._rows: list[tuple[Any, ...]] = []  # empty steps, row by row
        self._batches: list[Any] = []  # releases as tables, in order
        self._pending = 0
        self._rows_per_group = rows_per_group
        self._items = _ItemText(str)

    def write(self, release: Release) -> None:
        pa = self._pa
        n = len(release.values)
        if n == 0:  # an empty step is one row with no item and no value
            self._rows.extend(_long_rows(release, self.round_counts, self.step_start))
        else:
            self._flush_rows()
            std = release.meta.get("noise_std") if release.meta else None
            values = np.asarray(release.values, dtype=np.float64)
            if self.round_counts:
                values = np.rint(values).astype(np.int64)
            self._batches.append(
                pa.table(
                    [
                        pa.array(np.full(n, int(release.t), dtype=np.int64)),
                        self._items(release.items),
                        pa.array(values, type=self._schema[2].type),
                        pa.array(
                            np.full(n, np.nan if std is None else float(std)),
                            mask=np.full(n, std is None),
                        ),
                        *(
                            [
                                pa.array([self.step_start(int(release.t))], pa.string()).take(
                                    pa.array(np.zeros(n, np.int64))
                                )
                            ]
                            if self.step_start
                            else []
                        ),
                    ],
                    schema=self._schema,
                )
            )
            self._pending += n
        if self._pending + len(self._rows) >= self._rows_per_group:
            self._flush()

    def _flush_rows(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows, strict=True))
            self._batches.append(
                self._pa.table(
                    [
                        self._pa.array(c, type=f.type)
                        for c, f in zip(cols, self._schema, strict=True)
                    ],
                    schema=self._schema,
                )
            )
            self._pending += len(self._rows)
            self._rows = []

    def _flush(self) -> None:
        self._flush_rows()
        if self._batches:
            self._writer.write_table(self._pa.concat_tables(self._batches))
            self._batches, self._pending = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


def make_formatter(
    fmt: str, round_counts: bool = False, step_start: Callable[[int], str] | None = None
) -> JsonlFormatter | CsvFormatter | JsonlLongFormatter:
    """The release formatter for ``fmt``: ``"jsonl"`` (a line per step), ``"csv"`` or
    ``"jsonl-long"`` (a row per released item per step). ``step_start`` (a run's public
    clock: t to when step t begins, ISO-8601) adds a ``step_start`` column to the long
    formats."""
    if fmt == "jsonl":
        return JsonlFormatter(round_counts)
    if fmt == "csv":
        return CsvFormatter(round_counts, step_start)
    if fmt == "jsonl-long":
        return JsonlLongFormatter(round_counts, step_start)
    raise ValueError(f"output format must be 'jsonl', 'csv' or 'jsonl-long', got {fmt!r}")


def output_path_kind(path: str) -> str:
    """``"stdout"`` for ``-``, else ``"file"`` (a helper for messages)."""
    return "stdout" if path == "-" else "file"


def resolve_path(path: str) -> str:
    """An absolute path for ``path`` (``-`` stays ``-``): what the checkpoint records."""
    return path if path == "-" else str(Path(path).resolve())
