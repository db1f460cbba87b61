"""CSV input: events grouped from their rows, as records or as chunks.

Layer 6 of dpstream (an edge). ``--input-format csv``: a header row, then one
row per (event, item) with an event-id column and an item column (names chosen
by ``--event-column`` and ``--item-column``), and optionally a time-step column
(``--time-column``). An event is every row with one event id in one time step,
wherever the rows stand in the input (they need not be consecutive; an id used
in two steps is two events); an empty item cell adds no item. The reader holds
the input's rows until its end (a batch run holds its input anyway), then
yields the events in the order of their first rows. The CSV is parsed strictly
(a quote must be closed, and followed by a delimiter or the end of the row),
and a field holding a line break (in any column, read or not) or an item
longer than :data:`MAX_CSV_ITEM_CHARS` (1,000) characters is an invalid record:
both are the mark of an unclosed quote that swallowed the rows after it. A
record over several lines is an invalid record per line, so that the invalid
share (``--max-invalid``) counts the rows it swallowed. So is a row
with more or fewer fields than the header (a field too many: an unquoted
delimiter in a field, which shifts the columns after it), and a row whose time
step is not an integer in ASCII digits (an optional minus, as JSON Lines'
``"t"``: not ``1_0``, ``+1`` or ``１``). Errors name the line where the record
started. With ``--user-field NAME`` the column NAME holds each event's user id,
equal on every row of the event.

:func:`read_csv` yields the events one record at a time;
:func:`read_csv_chunks` yields the same records as
:class:`~dpstream.io.chunks.Chunk` columns, for the run loop.
"""

from __future__ import annotations

import csv
import re
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ..clock import StepClock
from .chunks import Chunk, chunks_from_records
from .records import (
    OVERLONG_HEAD,
    OverlongLine,
    RawEvent,
    overlong_message,
    raw_bytes,
    shorten,
    timestamp_step,
    valid_text,
)

__all__ = ["MAX_CSV_ITEM_CHARS", "read_csv", "read_csv_chunks"]

#: The most characters a CSV item may have: a longer one is an invalid record
#: (most likely an unclosed quote that swallowed the rows after it).
MAX_CSV_ITEM_CHARS = 1000

#: A time step cell (stripped): ASCII digits, with an optional minus (a JSON integer's
#: sign; a step below 1 is refused as such).
_STEP = re.compile(r"-?[0-9]+")


def read_csv(
    stream: Iterable[str],
    *,
    item_column: str = "item",
    event_column: str = "event",
    time_column: str | None = None,
    clock: StepClock | None = None,
    delimiter: str = ",",
    user_column: str | None = None,
    verbose: bool = False,
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

    A row whose step cannot be read (a time that is not an integer >= 1 in ASCII
    digits, a bad timestamp) belongs to no event: it is an invalid record of its
    own, as is a record with a CSV syntax error (strict parsing), more or fewer
    fields than the header, a field spanning lines, an item longer than
    :data:`MAX_CSV_ITEM_CHARS` or text that is not valid UTF-8. Each record's
    ``line`` is the line where it started. With ``user_column``, every row of an
    event must hold the same non-empty user id, else the event is an invalid record.
    A header without a column named lists its fields with ``verbose`` only
    (``--verbose-errors``: without a header, they are a record).
    """
    source = _Captured(stream)
    reader = csv.reader(source.lines(), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        raise ValueError(f"input line 1: bad CSV header ({exc})") from None
    cols = _Columns.of(header, item_column, event_column, time_column, user_column, verbose)
    source.captured.clear()  # the header's lines
    yield from _read_rows(reader, source, cols, clock, user_column).records()


def read_csv_chunks(stream: Iterable[str], size: int = 4096, **options: Any) -> Iterator[Chunk]:
    """The records of :func:`read_csv` (with its ``options``) as chunks of ``size``
    records: the columns the run loop takes."""
    return chunks_from_records(read_csv(stream, **options), size)


class _Captured:
    """A stream's lines, kept from the start of the record being read (its raw bytes)."""

    def __init__(self, stream: Iterable[str]) -> None:
        self.stream = stream
        self.captured: list[str] = []
        #: a line of the record being read that was too long to read (its start, length)
        self.overlong: OverlongLine | None = None

    def lines(self) -> Iterator[str]:
        for text in self.stream:
            if isinstance(text, OverlongLine):  # read past: the record is "line too long"
                if self.overlong is None:
                    self.overlong = text
                text = "\n"
            self.captured.append(text)
            yield text

    def take_overlong(self) -> OverlongLine | None:
        """The first line too long to read of the record read since the last call (the
        record is then "line too long"), or None."""
        long, self.overlong = self.overlong, None
        return long

    def take_raw(self) -> bytes:
        """The bytes of the lines read since the last call, without the last terminator."""
        text = "".join(self.captured)
        self.captured.clear()
        cut = 2 if text.endswith("\r\n") else 1 if text.endswith(("\n", "\r")) else 0
        return raw_bytes(text[: len(text) - cut])


class _Columns(NamedTuple):
    """Where a CSV's columns are (``time``, ``user``: None when not read), and how many
    fields every row has (``width``: the header's)."""

    item: int
    event: int
    time: int | None
    user: int | None
    width: int

    @classmethod
    def of(
        cls,
        header: list[str],
        item_column: str,
        event_column: str,
        time_column: str | None,
        user_column: str | None,
        verbose: bool = False,
    ) -> _Columns:
        """The columns named in the header (an error names a missing one, and lists the
        header's fields with ``verbose`` only: review 122, a CSV written without a header
        has a record as its first line, which the error then quoted)."""
        cols = {name.strip(): i for i, name in enumerate(header)}
        for role, name in (
            ("--item-column", item_column),
            ("--event-column", event_column),
            ("--time-column", time_column),
            ("--user-field", user_column),
        ):
            if name is not None and name not in cols:
                listed = (  # (a file without a header: its first line is a record)
                    f"columns: {', '.join(shorten(c) for c in cols)}"
                    if verbose
                    else f"its first line has {len(header)} fields (is the header missing? "
                    "--verbose-errors shows them)"
                )
                raise ValueError(
                    f"input line 1: the CSV header has no column {name!r} ({role}); {listed}"
                )
            if name is not None and [h.strip() for h in header].count(name) > 1:
                raise ValueError(
                    f"input line 1: the CSV header names the column {name!r} ({role}) "
                    "more than once: rename one, so that it is clear which one to read"
                )
        if user_column is not None and user_column in (item_column, event_column, time_column):
            raise ValueError(
                f"--user-field {user_column!r} is also the CSV input's time, item or event "
                "column (--time-column, --item-column, --event-column): a user id must be "
                "a column of its own"
            )
        i_item, i_event = cols[item_column], cols[event_column]
        i_time = cols[time_column] if time_column is not None else None
        i_user = cols[user_column] if user_column is not None else None
        return cls(i_item, i_event, i_time, i_user, len(header))


def _read_rows(
    reader: Any,
    source: _Captured,
    cols: _Columns,
    clock: StepClock | None,
    user_column: str | None,
) -> _Rows:
    """Every event of the input, by (step, id), in the order of its first row; the
    records of rows that belong to no event (no readable step) among them."""
    rows = _Rows()
    events: dict[int | None, dict[Any, int]] = {}  # step -> (user and) id -> event
    while True:
        first_line = reader.line_num + 1  # where the next record starts
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            hint = ": an unclosed quote?" if "end of data" in str(exc) else ""
            rows.add_alone(
                _spanning(
                    first_line, reader.line_num, f"bad CSV record ({exc}{hint})", source.take_raw()
                )
            )
            source.take_overlong()  # (the record is the syntax error's)
            continue
        row_raw = source.take_raw()
        long = source.take_overlong()
        if long is not None:  # its first bytes for the digest, as JSON Lines has them
            head = raw_bytes(long)[:OVERLONG_HEAD]
            rows.add_alone(
                [RawEvent(first_line, None, None, overlong_message(long.length), raw=head)]
            )
            continue
        if not row or all(not c.strip() for c in row):
            continue
        if any("\n" in c or "\r" in c for c in row):  # in any column, read or not
            message = (
                f"a field spans lines (lines {first_line}-{reader.line_num}: an unclosed quote?)"
            )
            rows.add_alone(_spanning(first_line, reader.line_num, message, row_raw))
            continue
        row_err = _row_error(row, cols)
        row_t: int | None = None
        if row_err is None and cols.time is not None:
            row_t, row_err = _row_step(row[cols.time], clock)
        if row_err is not None:  # no event (step and id) to belong to: a record alone
            rows.add_alone([RawEvent(first_line, None, None, row_err, raw=row_raw)])
            continue
        eid = row[cols.event]
        user = None if cols.user is None else row[cols.user]
        missing = (
            f"the user id column {user_column!r} is empty"
            if user == ""  # no user to belong to: never another's event
            else "the event id column (--event-column) is empty"  # not one event of all such
            if eid == ""
            else None
        )
        if missing is not None:  # a record alone (as a null id in Parquet)
            rows.add_alone([RawEvent(first_line, None, None, missing, raw=row_raw)])
            continue
        # at user level an event is one id of one user in one step: rows of another
        # user under the same id are that user's event, so no user's rows can join,
        # or spoil, another user's event
        # (a table per step, keyed by the id alone at event level: a tuple per event
        # was half of what the events held)
        in_step = events.get(row_t)
        if in_step is None:
            in_step = events[row_t] = {}
        id_key: Any = eid if user is None else (user, eid)
        event = in_step.get(id_key)
        if event is None:
            event = in_step[id_key] = rows.new_event(first_line, row_t, user)
        rows.add(event, row[cols.item], row_raw)
    return rows


def _spanning(first_line: int, last_line: int, message: str, raw: bytes) -> list[RawEvent]:
    """An invalid record of lines ``first_line``-``last_line``, as one invalid record per
    line (review 111: an unclosed quote that swallowed 600 rows was one invalid record in
    1,000, so --max-invalid let the loss through): the first holds its bytes."""
    return [RawEvent(first_line, None, None, message, raw=raw)] + [
        RawEvent(line, None, None, message, raw=b"")
        for line in range(first_line + 1, max(first_line, last_line) + 1)
    ]


def _row_error(row: list[str], cols: _Columns) -> str | None:
    """Why a row (on one line: see :func:`_spanning`) is no part of an event, or None.

    A row has the header's fields, no fewer and no more: a field too many is most
    likely an unquoted delimiter in a field, which shifts the columns after it (the
    row ``1,e1,Smith, John`` under ``t,event,item`` would count the item ``Smith``)."""
    if len(row) != cols.width:
        return f"CSV row has {len(row)} fields, expected {cols.width} (as the header has)"
    if not all(valid_text(c) for c in row):
        return "the row is not valid UTF-8"
    if len(row[cols.item]) > MAX_CSV_ITEM_CHARS:
        return (
            f"item of {len(row[cols.item])} characters, more than "
            f"{MAX_CSV_ITEM_CHARS} (an unclosed quote?)"
        )
    return None


def _row_step(cell: str, clock: StepClock | None) -> tuple[int | None, str | None]:
    """The step of a row's time cell: a timestamp on ``clock``, else an integer >= 1.

    An integer is written in ASCII digits, with an optional ``-`` (as a JSON number,
    JSON Lines' ``"t"``): Python's ``int`` would also read ``1_0`` as 10, ``+1`` and
    other scripts' digits (fullwidth ``１``), which no other input reads as a step."""
    if clock is not None:
        return timestamp_step(cell, clock, "the row's timestamp")
    raw = cell.strip()
    try:
        row_t = int(raw) if _STEP.fullmatch(raw) else None
    except ValueError:  # more digits than Python reads (4,300)
        row_t = None
    if row_t is None:
        return None, f"time step must be an integer, got {shorten(raw)!r}"
    if row_t < 1:
        return row_t, f"time step must be >= 1, got {shorten(raw)!r}"
    return row_t, None


class _Rows:
    """The input's records in the order of their first rows, held compactly until the
    input ends (review 119: a _CsvEvent per event, a bytes object and a list entry per
    row held about 14 times the input): each row's bytes in one buffer, its event and
    item as ints in arrays; an event its first line, step and user; a record of no
    event (an invalid one) as it is."""

    def __init__(self) -> None:
        self.buf = bytearray()  # every row's bytes, one after the other
        self.row_end = array("q")  # where each row's bytes end in buf
        self.row_event = array("q")  # its event
        self.row_item = array("q")  # its item (-1: an empty cell, no item)
        self.texts: list[str] = []  # the distinct items
        self.item_ids: dict[str, int] = {}
        self.event_line = array("q")  # an event's first line
        self.event_t: list[int | None] = []  # its step (equal steps: one int object)
        self.event_user: list[str | None] = []  # its user (equal ids: one str object)
        self._shared: dict[Any, Any] = {}
        #: the records in order: an event (its index >= 0), or -1 - (a record of no
        #: event's index in ``alone``)
        self.order = array("q")
        self.alone: list[RawEvent] = []

    def add_alone(self, records: list[RawEvent]) -> None:
        """Records of rows that belong to no event (invalid ones), next in order."""
        for rec in records:
            self.order.append(-1 - len(self.alone))
            self.alone.append(rec)

    def new_event(self, line: int, t: int | None, user: str | None) -> int:
        """A new event, next in order, first read on ``line``: its index."""
        index = len(self.event_line)
        self.event_line.append(line)
        self.event_t.append(self._shared.setdefault(t, t))
        self.event_user.append(self._shared.setdefault(user, user))
        self.order.append(index)
        return index

    def add(self, event: int, item: str, raw: bytes) -> None:
        """One more row of ``event``: its item cell (empty: no item) and its bytes."""
        self.buf += raw
        self.row_end.append(len(self.buf))
        self.row_event.append(event)
        if item == "":
            self.row_item.append(-1)
            return
        at = self.item_ids.get(item)
        if at is None:
            at = self.item_ids[item] = len(self.texts)
            self.texts.append(item)
        self.row_item.append(at)

    def records(self) -> Iterator[RawEvent]:
        """Every record in order: an event with the items of its rows in their order and
        its rows' bytes joined by a line feed (as read, whatever stood between them)."""
        import numpy as np

        n_events = len(self.event_line)
        rows, bounds = array("q"), array("q", bytes(8 * (n_events + 1)))
        if self.row_event:  # each event's rows, in input order (arrays: no int objects)
            row_event = np.frombuffer(self.row_event, dtype=np.int64)
            rows.frombytes(np.argsort(row_event, kind="stable").astype(np.int64).tobytes())
            first = np.frombuffer(bounds, dtype=np.int64)
            np.cumsum(np.bincount(row_event, minlength=n_events), out=first[1:])
            del row_event, first
        view, ends, items, texts = memoryview(self.buf), self.row_end, self.row_item, self.texts
        for at in self.order:
            if at < 0:
                yield self.alone[-1 - at]
                continue
            mine = rows[bounds[at] : bounds[at + 1]]
            raw = b"\n".join([view[ends[r - 1] if r else 0 : ends[r]] for r in mine])
            kept = tuple(texts[items[r]] for r in mine if items[r] >= 0)
            yield RawEvent(
                self.event_line[at],
                self.event_t[at],
                kept,
                None,
                self.event_user[at],
                raw=raw,
            )
