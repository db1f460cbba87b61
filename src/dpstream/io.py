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
with no item.

Items on the command line are strings: a JSON integer item ``5`` is read as
``"5"`` (so a CSV and a JSON Lines file of the same stream give the same
releases). Blank lines are ignored. A ``.gz`` input is decompressed on the fly.

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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .mechanisms.base import Release
from .noise import NoiseSource

__all__ = [
    "RawEvent",
    "open_input",
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


def open_input(path: str) -> TextIO:
    """A text stream for ``path``: ``-`` is stdin, ``*.gz`` is decompressed."""
    if path == "-":
        return sys.stdin
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - caller closes


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
            return None, f"an item must be a string or an integer, got {json.dumps(v)}"
        out.append(item)
    return tuple(out), None


def _parse_t(value: object) -> tuple[int | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f'"t" must be an integer, got {json.dumps(value)}'
    if value < 1:
        return None, f'"t" must be >= 1, got {value}'
    return value, None


def read_jsonl(lines: Iterable[str]) -> Iterator[RawEvent]:
    """Parse JSON Lines events (see the module docstring); blank lines are skipped."""
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            yield RawEvent(lineno, None, None, f"not valid JSON ({exc.msg})")
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
    """Parse CSV rows (one per event and item) into events, grouping consecutive event ids."""
    reader = csv.reader(stream, delimiter=delimiter)
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
                f"columns: {', '.join(cols)}"
            )
    i_item, i_event = cols[item_column], cols[event_column]
    i_time = cols[time_column] if time_column is not None else None
    width = max(i for i in (i_item, i_event, i_time) if i is not None) + 1

    current: str | None = None
    start = 0
    items: list[str] = []
    t_val: int | None = None
    error: str | None = None

    def flush() -> RawEvent:
        if error is not None:
            return RawEvent(start, None, None, error)
        return RawEvent(start, t_val, tuple(items), None)

    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            if current is not None:
                yield flush()
                current = None
            yield RawEvent(reader.line_num, None, None, f"bad CSV row ({exc})")
            continue
        lineno = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < width:
            if current is not None:
                yield flush()
                current = None
            yield RawEvent(lineno, None, None, f"CSV row has {len(row)} fields, expected "
                                               f"at least {width}")
            continue
        eid = row[i_event]
        row_t: int | None = None
        row_err: str | None = None
        if i_time is not None:
            raw = row[i_time].strip()
            try:
                row_t = int(raw)
                if row_t < 1:
                    row_err = f"time step must be >= 1, got {raw!r}"
            except ValueError:
                row_err = f"time step must be an integer, got {raw!r}"
        if eid != current:
            if current is not None:
                yield flush()
            current, start, items, t_val, error = eid, lineno, [], row_t, row_err
        elif error is None and row_err is not None:
            error = row_err
        elif error is None and row_t != t_val:
            error = f"event {eid!r} has rows with different time steps ({t_val} and {row_t})"
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
        text = fh.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"domain file {path!r}: not a valid JSON array ({exc.msg})") from None
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
    ``max_items`` smallest are kept (in the event's order). The choice depends
    on the event alone (and the key), so neighbouring streams stay neighbours
    and the privacy guarantee is unchanged.
    """

    def __init__(self, source: NoiseSource, max_items: int) -> None:
        self.source = source
        self.max_items = max_items

    def __call__(self, items: Sequence[str], ordinal: int) -> tuple[str, ...]:
        distinct = tuple(dict.fromkeys(items))
        if len(distinct) <= self.max_items:
            return distinct
        prepared = self.source.prepare(distinct)
        u = NoiseSource.to_uniform(self.source.blocks(prepared, 0, ordinal))
        keep = np.sort(np.argsort(u, kind="stable")[: self.max_items])
        return tuple(distinct[i] for i in keep)


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
