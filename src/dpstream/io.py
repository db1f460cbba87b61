"""Reading events and writing releases: the file formats of the ``dpstream`` command.

Layer 6 of dpstream (the edges). Everything here streams: a reader yields one
event at a time and :func:`group_steps` holds the events of one time step only,
so memory does not grow with the input file.

Input formats
-------------
JSON Lines (``--input-format jsonl``, the default), one event per line:

* ``{"items": ["aspirin", "ibuprofen"]}``, optionally with ``"t": 3``, the time
  step the event belongs to (many events may share a step; other keys are
  ignored), or
* ``["aspirin", "ibuprofen"]``, a plain JSON array.

CSV (``--input-format csv``): a header row, then one row per (event, item)
with an event-id column and an item column (names chosen by ``--event-column``
and ``--item-column``), and optionally a time-step column (``--time-column``).
The rows of one event must be consecutive; an empty item cell gives an event
with no item. An event id that comes back after other rows is an invalid
record (``--on-invalid`` applies), never a second event: otherwise one event
could contribute more than ``--max-items`` items. A reappearance is always
detected within a time step (all ids of the open step are kept, as the step
itself is) and across steps among the last :data:`RECENT_EVENT_IDS` (100,000)
event ids of earlier steps, so memory does not grow with the file. The CSV is parsed strictly
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

CSV: a header ``t,item,value`` and one row per released item per step (a step
that releases no item writes no row: use JSON Lines to see every step).

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
import sys
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .mechanisms.base import Release, keyed_subset
from .noise import NoiseSource

__all__ = [
    "RawEvent",
    "MAX_CSV_ITEM_CHARS",
    "RECENT_EVENT_IDS",
    "open_input",
    "guard_lines",
    "read_jsonl",
    "read_csv",
    "read_events",
    "group_steps",
    "read_domain",
    "KeyedTruncator",
    "JsonlFormatter",
    "CsvFormatter",
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
    """

    line: int
    t: int | None
    items: tuple[str, ...] | None
    error: str | None = None


# --------------------------------------------------------------------------- input


#: The most characters a CSV item may have: a longer one is an invalid record
#: (most likely an unclosed quote that swallowed the rows after it).
MAX_CSV_ITEM_CHARS = 1000

#: How many of the last event ids a CSV reader remembers to catch an event
#: whose rows are not consecutive, across time steps (within a step, all).
RECENT_EVENT_IDS = 100_000

#: Text decoding of every input: UTF-8 with an optional byte-order mark; bytes
#: that are not UTF-8 become lone surrogates, which the parsers reject per record.
_ENCODING = dict(encoding="utf-8-sig", errors="surrogateescape")


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
            raise ValueError(f"input {name!r}: the compressed file is truncated or corrupt "
                             f"after line {lineno} ({exc})") from None
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
            return None, ("an item must be a string or an integer, got "
                          f"{_short(json.dumps(v, default=str))}")
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


def read_jsonl(lines: Iterable[str]) -> Iterator[RawEvent]:
    """Parse JSON Lines events (see the module docstring); blank lines are skipped."""
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if not _valid_text(text):
            yield RawEvent(lineno, None, None, "the line is not valid UTF-8")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            yield RawEvent(lineno, None, None, f"not valid JSON ({exc.msg})")
            continue
        except RecursionError:
            yield RawEvent(lineno, None, None, "not valid JSON (nested too deeply)")
            continue
        except ValueError as exc:  # an integer of more than 4,300 digits
            why = "an integer has too many digits" if "digits" in str(exc) else str(exc)
            yield RawEvent(lineno, None, None, f"not valid JSON ({_short(why, 80)})")
            continue
        if isinstance(obj, list):
            items, err = _parse_items(obj)
            yield RawEvent(lineno, None, items, err)
        elif isinstance(obj, dict):
            if "items" not in obj:
                yield RawEvent(lineno, None, None, 'an event object needs an "items" array')
                continue
            t, err = _parse_t(obj.get("t"))
            if err:
                yield RawEvent(lineno, None, None, err)
                continue
            items, err = _parse_items(obj["items"])
            yield RawEvent(lineno, t if err is None else None, items, err)
        else:
            yield RawEvent(
                lineno, None, None,
                f'an event must be a JSON array or an object with "items", got {text[:40]!r}',
            )


def read_csv(
    stream: Iterable[str],
    *,
    item_column: str = "item",
    event_column: str = "event",
    time_column: str | None = None,
    delimiter: str = ",",
) -> Iterator[RawEvent]:
    """Parse CSV rows (one per event and item) into events, grouping consecutive event ids.

    An event id that reappears after other rows becomes an invalid record (see
    the module docstring for the memory this takes), as does a record with a
    CSV syntax error (strict parsing), a field spanning lines, an item longer
    than :data:`MAX_CSV_ITEM_CHARS` or text that is not valid UTF-8. Each
    record's ``line`` is the line where it started.
    """
    reader = csv.reader(stream, delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        raise ValueError(f"input line 1: bad CSV header ({exc})") from None
    cols = {name.strip(): i for i, name in enumerate(header)}
    for role, name in (("--item-column", item_column), ("--event-column", event_column),
                       ("--time-column", time_column)):
        if name is not None and name not in cols:
            raise ValueError(
                f"input line 1: the CSV header has no column {name!r} ({role}); "
                f"columns: {', '.join(_short(c) for c in cols)}"
            )
    i_item, i_event = cols[item_column], cols[event_column]
    i_time = cols[time_column] if time_column is not None else None
    width = max(i for i in (i_item, i_event, i_time) if i is not None) + 1

    current: str | None = None
    start = 0
    items: list[str] = []
    t_val: int | None = None
    error: str | None = None
    # Event ids seen before: all of the open time step (kept anyway, as the step
    # is), and a bounded FIFO of the most recent ones across steps.
    step_ids: dict[str, int] = {}
    step_t: int | None = None
    recent: OrderedDict[str, int] = OrderedDict()

    def flush() -> RawEvent:
        if error is not None:
            return RawEvent(start, None, None, error)
        return RawEvent(start, t_val, tuple(items), None)

    def seen_at(eid: str) -> int | None:
        line = step_ids.get(eid)
        return recent.get(eid) if line is None else line

    def remember(eid: str, line: int, t: int | None) -> None:
        nonlocal step_t
        if time_column is None or t != step_t:  # a new step: its ids join the recent ones
            for old_id, old_line in step_ids.items():
                recent[old_id] = old_line
                recent.move_to_end(old_id)
            step_ids.clear()
            step_t = t
            while len(recent) > RECENT_EVENT_IDS:
                recent.popitem(last=False)
        if time_column is None:
            recent[eid] = line
            recent.move_to_end(eid)
            if len(recent) > RECENT_EVENT_IDS:
                recent.popitem(last=False)
        else:
            step_ids.setdefault(eid, line)

    while True:
        first_line = reader.line_num + 1  # where the next record starts
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            if current is not None:
                yield flush()
                current = None
            hint = ": an unclosed quote?" if "end of data" in str(exc) else ""
            yield RawEvent(first_line, None, None, f"bad CSV record ({exc}{hint})")
            continue
        lineno = first_line
        if not row or all(not c.strip() for c in row):
            continue
        row_err: str | None = None
        if len(row) < width:
            row_err = f"CSV row has {len(row)} fields, expected at least {width}"
        elif any("\n" in row[i] or "\r" in row[i] for i in (i_item, i_event, i_time)
                 if i is not None):
            row_err = ("a field spans lines (lines "
                       f"{first_line}-{reader.line_num}: an unclosed quote?)")
        elif not all(_valid_text(c) for c in row):
            row_err = "the row is not valid UTF-8"
        elif len(row[i_item]) > MAX_CSV_ITEM_CHARS:
            row_err = (f"item of {len(row[i_item])} characters, more than "
                       f"{MAX_CSV_ITEM_CHARS} (an unclosed quote?)")
        if row_err is not None:
            if current is not None:
                yield flush()
                current = None
            yield RawEvent(lineno, None, None, row_err)
            continue
        eid = row[i_event]
        row_t: int | None = None
        if i_time is not None:
            raw = row[i_time].strip()
            try:
                row_t = int(raw)
                if row_t < 1:
                    row_err = f"time step must be >= 1, got {_short(raw)!r}"
            except ValueError:
                row_err = f"time step must be an integer, got {_short(raw)!r}"
        if eid != current:
            if current is not None:
                yield flush()
            current, start, items, t_val, error = eid, lineno, [], row_t, row_err
            before = seen_at(eid)
            if before is not None and error is None:
                error = (f"event {_short(eid)!r} reappears: its rows must be consecutive "
                         f"(it started at line {before})")
            remember(eid, lineno, row_t if row_err is None else step_t)
        elif error is None and row_err is not None:
            error = row_err
        elif error is None and row_t != t_val:
            error = (f"event {_short(eid)!r} has rows with different time steps "
                     f"({t_val} and {row_t})")
        if row[i_item] != "":
            items.append(row[i_item])
    if current is not None:
        yield flush()


def read_events(stream: Iterable[str], fmt: str, **csv_options: Any) -> Iterator[RawEvent]:
    """Dispatch on ``fmt`` (``"jsonl"`` or ``"csv"``)."""
    if fmt == "jsonl":
        return read_jsonl(stream)
    if fmt == "csv":
        return read_csv(stream, **csv_options)
    raise ValueError(f"input format must be 'jsonl' or 'csv', got {fmt!r}")


def group_steps(
    records: Iterable[RawEvent], horizon: int
) -> Iterator[tuple[int | None, list[RawEvent]]]:
    """Group records into time steps, in order, one step in memory at a time.

    Yields ``(t, records)`` for t = 1, 2, ... up to the last step the input
    reaches, including empty steps in gaps (but no gap step past ``horizon``;
    steps past it are yielded as they come, for the caller to reject). A
    malformed record belongs to no step: it is yielded with the step that is
    open, or else with the next one, or, at the end of the input, as
    ``(None, records)``; it never advances time. A record whose ``t`` is not
    after an already closed step becomes a malformed record (the input must be
    in time order).
    """
    current = 0
    step: list[RawEvent] | None = None  # the open step `current` (started by an explicit t)
    bad: list[RawEvent] = []  # malformed records waiting for the next step
    for rec in records:
        if rec.error is not None:
            (step if step is not None else bad).append(rec)
            continue
        explicit = rec.t is not None
        t = rec.t if rec.t is not None else current + 1
        if step is not None and explicit and t == current:
            step.append(rec)
            continue
        if t <= current:
            late = RawEvent(rec.line, None, None,
                            f"time step {t} is not after step {current}, which is already "
                            "complete (events must be in time order)")
            (step if step is not None else bad).append(late)
            continue
        if step is not None:
            yield current, step
            step = None
        for gap in range(current + 1, min(t, horizon + 1)):
            yield gap, bad
            bad = []
        current = t
        if explicit:
            step, bad = bad + [rec], []
        else:  # an event without t is a step of its own
            yield t, bad + [rec]
            bad = []
    if step is not None:
        yield current, step
    if bad:
        yield None, bad


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
            raise ValueError(f"domain file {path!r}: not a valid JSON array "
                             f"({_short(str(exc) or 'nested too deeply', 80)})") from None
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
        dup = next(d for d in domain if d in seen or seen.add(d))
        raise ValueError(f"domain file {path!r} lists {dup!r} twice")
    return domain


class KeyedTruncator:
    """Keeps ``max_items`` of an event's items, chosen by a keyed PRF (``--on-invalid truncate``).

    Taking "the first k items" would let the order in which a client lists
    items decide what is counted; here every item of the event gets a keyed
    uniform at the address (0, ordinal) under its own purpose, and the
    ``max_items`` smallest are kept (in the event's order). The command passes
    the event's input line number as ``ordinal``, so the choice depends on the
    event's items, its line number and the key, and on no other event's
    content. Line numbers are distinct, so under the secret key the choices of
    different events are independent uniform draws. Removing one event shifts
    the line numbers of the events after it, and so changes which of their
    items are kept; but the choices are identically distributed, so pairing
    each remaining event's choice in one stream with the same event's choice
    in the other makes the truncated streams neighbours. The guarantee is
    therefore unchanged, as an average over that pairing. The truncation noise
    uses its own purpose, independent of the release noise.
    """

    def __init__(self, source: NoiseSource, max_items: int) -> None:
        self.source = source
        self.max_items = max_items

    def __call__(self, items: Sequence[str], ordinal: int) -> tuple[str, ...]:
        return keyed_subset(self.source, items, self.max_items, ordinal)  # type: ignore[return-value]


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


class JsonlFormatter:
    """``{"t": 3, "released": {item: count, ...}}`` per line (see the module docstring)."""

    name = "jsonl"

    def __init__(self, round_counts: bool = False) -> None:
        self.round_counts = round_counts

    def header(self) -> bytes:
        return b""

    def format(self, release: Release) -> bytes:
        values = _values(release, self.round_counts)
        obj: dict[str, Any] = {
            "t": int(release.t),
            "released": {str(k): v for k, v in zip(release.items, values, strict=True)},
        }
        if release.meta:
            obj["meta"] = dict(release.meta)
        return (json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)
                + "\n").encode("utf-8")


class CsvFormatter:
    """A ``t,item,value`` header, then one row per released item per step."""

    name = "csv"

    def __init__(self, round_counts: bool = False) -> None:
        self.round_counts = round_counts

    def header(self) -> bytes:
        return b"t,item,value\n"

    def format(self, release: Release) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        t = int(release.t)
        for item, value in zip(release.items, _values(release, self.round_counts), strict=True):
            writer.writerow((t, item, repr(value) if isinstance(value, float) else value))
        return buf.getvalue().encode("utf-8")


def make_formatter(fmt: str, round_counts: bool = False) -> JsonlFormatter | CsvFormatter:
    """The release formatter for ``fmt`` (``"jsonl"`` or ``"csv"``)."""
    if fmt == "jsonl":
        return JsonlFormatter(round_counts)
    if fmt == "csv":
        return CsvFormatter(round_counts)
    raise ValueError(f"output format must be 'jsonl' or 'csv', got {fmt!r}")


def output_path_kind(path: str) -> str:
    """``"stdout"`` for ``-``, else ``"file"`` (a helper for messages)."""
    return "stdout" if path == "-" else "file"


def resolve_path(path: str) -> str:
    """An absolute path for ``path`` (``-`` stays ``-``): what the checkpoint records."""
    return path if path == "-" else str(Path(path).resolve())
