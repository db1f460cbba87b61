"""Parquet input: events read in record batches, as the chunks of the JSON Lines reader.

Layer 6 of dpstream (an edge). ``--input-format parquet`` (auto for ``*.parquet``
and for a directory): one Parquet file, or a directory of them (a data lake's
partitions: every ``*.parquet`` file under it, in the sorted order of their
paths, so the order never depends on the file system). The columns are named by
the run's flags, with JSON Lines' names as defaults:

* one row per event: ``items``, a list of strings (or integers, read as their
  decimal text; a fixed-size list, or a list of nulls when every list is
  empty), and ``t``, the integer time step (``--time-column`` names another
  column); or
* one row per item, as CSV: a string (or integer) item column (``item``, or
  ``--item-column``; a column of nulls when every item is null) and an
  event-id column (``event``, ``--event-column``); an event is every row of
  one id in one step, wherever its rows stand; a null item adds no item (an
  empty event is one row with a null item); a file with both ``items`` and
  ``item`` is refused unless ``--item-column`` names one;
* with ``--time-field NAME --step --start`` the column NAME holds timestamps on
  the public clock: a Parquet timestamp or date (one without a time zone is
  UTC; nanoseconds are floored to the microsecond, as the clock floors every
  instant), epoch seconds (integers or floats) or ISO-8601 strings;
* with ``--user-field NAME`` the string column NAME holds each event's user id.

A row is a record (its number, from 1 over the files in order, stands where
JSON Lines gives a line number). Every record goes through the rules of JSON
Lines (:mod:`dpstream.io.records`): a row whose step, items or user id JSON
Lines would refuse is an invalid record with JSON Lines' message, so a Parquet
file and a JSON Lines file of the same events give the same records, steps and
releases (an item or user id whose bytes are not UTF-8, which Arrow does not
check, is the invalid record "not valid UTF-8", as that line of JSON Lines; so is
a time string on a clock, and in one row per item the row alone, as a CSV row). A
missing column or a column of another type is an error before anything is read
(``ValueError``, naming the column, its flag and the types it may have), as is
a file that is not Parquet (an empty one).

How a batch is read
-------------------
With integer steps and a list column (the common case) a batch is read by
columns, as Arrow's rows of a JSON Lines chunk are
(:func:`dpstream.io.jsonl` ``_assemble``): the steps from the integer column's
buffer, the items dictionary-encoded, and only the rows that are not plainly
valid (a null, a step below 1, an empty user id) are written as a JSON object
and parsed by :func:`~dpstream.io.jsonl.parse_jsonl_line`, which words their
messages. The other layouts are read row by row into records.

The bytes of a record (for the keyed digest of a step's input) are its values
encoded without loss, so that a resumed run refuses a changed step: with integer
steps and a list column, a fixed head (which values are null, the step, the item
count) then each item followed by 0xff (0xfd: a null item) then the user id
(:func:`_list_row_bytes`, NumPy over Arrow's buffers); in the other layouts
(read row by row) the row as JSON text: the event's JSON Lines object with a
clock, ``[time, event id, item, user id]`` for one row per item. They differ from the
bytes of the same event in JSON Lines, so a state's input digests are those of
its format (a run resumes only on the format it began with).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..clock import StepClock
from .arrow import arrow_ints, arrow_valid, event_rows
from .chunks import INT64_MAX, Chunk, chunks_from_records
from .jsonl import NOT_UTF8, _assemble, parse_jsonl_line
from .parquet_layout import _Layout, _layout, _value_type, is_list_type, item_column_type
from .records import RawEvent, parse_t, raw_bytes, shorten, timestamp_step, valid_text

__all__ = [
    "BATCH_ROWS",
    "escaped_text",
    "folder_files",
    "parquet_files",
    "read_parquet_chunks",
    "read_parquet_records",
]

#: Rows per record batch read from a Parquet file (a chunk of the run loop).
BATCH_ROWS = 1 << 16


def folder_files(folder: str, suffix: str = "") -> list[str]:
    """Every file under ``folder`` at any depth whose name ends with ``suffix``, but those
    whose names (or their folders' names) begin with ``.`` or ``_`` (as Spark and Hive
    leave their markers), sorted by their paths relative to it, component by component.

    Links are followed, to folders as to files (a lake's partitions are often links),
    but a file or folder reached twice (two links to one folder, a link to a file
    beside it, a hard link, a loop) is refused: its events would count twice, and a
    neighbouring input would differ in more than one event. So is a link to nothing (a
    partition elsewhere, not mounted) and a folder that cannot be listed: their events
    would be left out without a word."""
    _refuse_table_format(folder)
    found = []
    seen: dict[tuple[int, int], str] = {}

    def once(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError as exc:  # a link to nothing, or a file gone while listed
            raise ValueError(f"--input {folder!r}: cannot read {path!r} ({exc.strerror})") from None
        first = seen.setdefault((st.st_dev, st.st_ino), path)
        if first != path:
            raise ValueError(
                f"--input {folder!r}: {path!r} and {first!r} are one file or folder "
                "(a link or a hard link); its events would count twice: remove one"
            )

    def unreadable(exc: OSError) -> None:  # a folder that cannot be listed is not empty
        raise ValueError(
            f"--input {folder!r}: cannot list {exc.filename!r} ({exc.strerror})"
        ) from None

    once(folder)
    for root, dirs, files in os.walk(folder, onerror=unreadable, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in dirs:
            once(os.path.join(root, name))
        for name in files:
            if name.startswith((".", "_")):
                continue
            path = os.path.join(root, name)
            if name.endswith(suffix) or not os.path.exists(path):  # (a link to nothing:
                once(path)  # a partition folder elsewhere, not mounted?)
                found.append(path)
    return sorted(found, key=lambda p: os.path.relpath(p, folder).split(os.sep))


#: Folders a table format keeps beside (or above) its data files, and the format's name.
_TABLE_LOGS = (("_delta_log", "a Delta Lake table"), (".hoodie", "an Apache Hudi table"))


def _refuse_table_format(folder: str) -> None:
    """Refuse a folder of a table format's table, or one inside it (review 117: a Delta
    table's folder keeps the files an OPTIMIZE or an update removed until VACUUM, and
    read as plain files their events counted again: 50 events released as 100). Only
    the format's log says which files are the table now."""
    here = os.path.abspath(folder)
    while True:
        for log, what in _TABLE_LOGS:
            if os.path.isdir(os.path.join(here, log)):
                raise ValueError(_table_refusal(folder, what, os.path.join(here, log)))
        meta = os.path.join(here, "metadata")
        if os.path.isdir(meta) and any(n.endswith(".metadata.json") for n in _names(meta)):
            raise ValueError(_table_refusal(folder, "an Apache Iceberg table", meta))
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _table_refusal(folder: str, what: str, log: str) -> str:
    return (
        f"--input {folder!r} is {what}'s folder (or in one: {log!r}): its folder also "
        "holds files the table no longer has (replaced by a compaction, an update or a "
        "delete, until they are vacuumed), whose events would count again. Give the "
        "table's current rows: export them as Parquet files (Spark: "
        "spark.read.format(...).load(...).write.parquet(...)), or read the table into a "
        "frame and use dpstream.release_frame"
    )


def parquet_files(path: str) -> list[str]:
    """The Parquet files of ``path``: the file itself, or every ``*.parquet`` file under
    a directory (:func:`folder_files`)."""
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"--input {path!r}: no such file or directory")
        return [path]
    found = folder_files(path, ".parquet")
    if not found:
        raise ValueError(f"--input {path!r}: the directory holds no *.parquet file")
    refuse_copies(path, found)
    return found


def refuse_copies(folder: str, files: list[str]) -> None:
    """Refuse two files of the same bytes under one input folder (review 102: a copy,
    ``part-0 (copy).parquet``, counted its events twice, with exit 0): their events
    would count twice, and each event's protection hold for one of the two. Only files
    of equal sizes are read to compare (a digest of each); files that hold no event
    (empty, blank, or Parquet of no rows: a folder's quiet hours) may be alike."""
    import hashlib

    by_size: dict[int, list[str]] = {}
    for name in files:
        if os.path.isfile(name) and os.path.getsize(name) > 0:  # (an empty one holds
            by_size.setdefault(os.path.getsize(name), []).append(name)  # no event)
    for same in by_size.values():
        if len(same) < 2:
            continue
        digests: dict[bytes, str] = {}
        for name in same:
            h = hashlib.sha256()
            with open(name, "rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
            first = digests.setdefault(h.digest(), name)
            if first != name and not _holds_no_events(name):
                raise ValueError(
                    f"--input {folder!r}: {name!r} holds the same bytes as {first!r} (a "
                    "copy?); its events would count twice: remove one"
                )


def _holds_no_events(name: str) -> bool:
    """Whether a file counts no event twice when copied (review 108: the empty hours of
    a folder, byte-identical, were refused as copies): blank text, or a Parquet file of
    no rows."""
    size = os.path.getsize(name)
    if size <= 1 << 16:
        with open(name, "rb") as fh:
            if not fh.read().strip():
                return True
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(name).metadata.num_rows == 0
        except Exception:  # not Parquet: its reader says so in words
            return False
    return False


def _batches(path: str, settings: dict[str, Any]) -> Iterator[tuple[_Layout, Any]]:
    """Every record batch of the input's files in order, with the layout of its file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in parquet_files(path):
        if os.path.exists(name) and not os.path.isfile(name):  # (review 103: a FIFO
            raise ValueError(  # named *.parquet hung the run for ever)
                f"{name!r} is not a regular file (a pipe or a device): not a Parquet file"
            )
        try:
            # INT96 (Spark's default timestamps) as microseconds: in nanoseconds an
            # instant outside 1677-2262 wrapped around into another step (review 117)
            plain = pq.ParquetFile(name, coerce_int96_timestamp_unit="us")
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{name!r} is not a Parquet file ({exc})") from None
        layout = _layout(plain.schema_arrow, f"the Parquet input {name!r}", **settings)
        columns = layout.columns()
        written = {c: plain.schema_arrow.field(c).type for c in columns}
        leaves = _leaves(plain.schema_arrow, columns)
        # strings stay dictionary-encoded until a batch is cut to a bounded size: a
        # dictionary of one long string under 65,536 indices is a 2 KB file that
        # decoded to 1 GB a batch (review 117)
        strings = [j for j in leaves if plain.schema.column(j).physical_type == "BYTE_ARRAY"]
        pfile = pq.ParquetFile(
            name,
            coerce_int96_timestamp_unit="us",
            read_dictionary=strings,
            metadata=plain.metadata,
        )
        for group in range(pfile.num_row_groups):
            rows = _rows_per_batch(plain.metadata.row_group(group), leaves)
            for batch in pfile.iter_batches(batch_size=rows, row_groups=[group], columns=columns):
                for part in _bounded(batch):
                    yield layout, _decoded(_as_written(part, written), layout)


#: The bytes of strings a batch is decoded to at most, and the values (list items) it
#: holds at most (a batch of one row may hold more): what reading a batch costs grows
#: with both (about 160 bytes a value through the chunk's arrays)
BATCH_BYTES = 1 << 23
BATCH_VALUES = 1 << 18


def _leaves(schema: Any, columns: list[str]) -> list[int]:
    """The indices of the Parquet leaf columns (in the file's order) of the top-level
    ``columns`` of an Arrow ``schema``: found by counting leaves, not by dotted paths (a
    column named ``items.list.element`` beside a list ``items`` is another leaf)."""
    import pyarrow as pa

    def count(typ: Any) -> int:
        if pa.types.is_struct(typ):
            return sum(count(typ.field(i).type) for i in range(typ.num_fields))
        if pa.types.is_map(typ):
            return count(typ.key_type) + count(typ.item_type)
        if is_list_type(typ) or pa.types.is_list_view(typ) or pa.types.is_large_list_view(typ):
            return count(typ.value_type)
        return 1

    out: list[int] = []
    at, wanted = 0, set(columns)
    for field in schema:
        n = count(field.type)
        if field.name in wanted:
            out += range(at, at + n)
        at += n
    return out


def _rows_per_batch(group: Any, leaves: list[int]) -> int:
    """Rows a batch of a row group is read in: :data:`BATCH_ROWS`, fewer when the read
    columns' pages (decompressed, a dictionary page left out: :func:`_bounded` cuts
    what it decodes to) or their values hold more than :data:`BATCH_BYTES` or
    :data:`BATCH_VALUES` a batch (a value repeated without a dictionary compresses as
    well as one with it; a row may hold thousands of empty strings)."""
    size = values = 0
    for j in leaves:
        chunk = group.column(j)
        total = max(0, int(chunk.total_uncompressed_size))
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            packed = max(0, int(chunk.data_page_offset) - int(chunk.dictionary_page_offset))
            ratio = total / max(1, int(chunk.total_compressed_size))
            total = max(0, total - int(packed * ratio))
        size += total
        values += max(0, int(chunk.num_values))
    rows = max(1, group.num_rows)
    return int(
        min(
            BATCH_ROWS,
            max(1, BATCH_BYTES * rows // max(1, size)),
            max(1, BATCH_VALUES * rows // max(1, values)),
        )
    )


def _bounded(batch: Any) -> Iterator[Any]:
    """``batch`` in runs of rows whose dictionary-encoded strings decode to at most
    :data:`BATCH_BYTES` and that hold at most :data:`BATCH_VALUES` list items each (one
    row alone may hold more)."""
    n = batch.num_rows
    if not n:
        return
    weight = np.zeros(n, dtype=np.float64)
    for col in batch.columns:
        size, values = _row_costs(col)
        weight += size / BATCH_BYTES + values / BATCH_VALUES
    ends = np.cumsum(weight)
    if ends[-1] <= 1.0:
        yield batch
        return
    start = 0
    while start < n:
        before = ends[start - 1] if start else 0.0
        stop = max(start + 1, int(np.searchsorted(ends, before + 1.0, side="right")))
        # taken, not sliced: a slice keeps its list column's whole child array, which
        # a cast back to strings would decode in full, slice after slice
        yield batch.take(np.arange(start, stop))
        start = stop


def _row_costs(col: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the bytes a column's dictionary-encoded strings decode to (0 for other
    values) and the items of a list column (0 for a column of single values)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    typ = col.type
    if not is_list_type(typ):
        if not pa.types.is_dictionary(typ):
            return np.zeros(n), np.zeros(n)
        return _string_sizes(col).astype(np.float64), np.zeros(n)
    counts = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
    if not pa.types.is_dictionary(typ.value_type):
        return np.zeros(n), counts.astype(np.float64)
    # the flattened items are the non-null rows' in order: per row, a run of them
    each = np.concatenate([[0], np.cumsum(_string_sizes(col.flatten()))])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return (each[bounds[1:]] - each[bounds[:-1]]).astype(np.float64), counts.astype(np.float64)


def _string_sizes(values: Any) -> np.ndarray:
    """The decoded length of each value of a dictionary array (0 for a null)."""
    import pyarrow.compute as pc

    lengths = pc.binary_length(values.dictionary)
    taken = pc.take(lengths, values.indices)
    return np.asarray(pc.fill_null(taken, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _as_written(batch: Any, written: dict[str, Any]) -> Any:
    """A batch with the columns read dictionary-encoded back at their written types (a
    column Arrow reads beside them, a struct ``ev`` for a column named ``ev.step``, is
    left as it is)."""
    import pyarrow as pa

    names = batch.schema.names
    types = [written.get(n) for n in names]
    columns = batch.columns
    if all(w is None or c.type == w for c, w in zip(columns, types, strict=True)):
        return batch
    cast = [
        c if w is None or c.type == w else c.cast(w) for c, w in zip(columns, types, strict=True)
    ]
    return pa.RecordBatch.from_arrays(cast, names=names)


def _decoded(batch: Any, layout: _Layout) -> Any:
    """A batch with its dictionary-encoded columns (pandas categoricals) decoded, and its
    item column of a type that holds no value (nulls) or of fixed-size lists as the
    strings or lists the readers take (:func:`item_column_type`)."""
    import pyarrow as pa

    k = batch.schema.get_field_index(layout.items)
    cast = item_column_type(_value_type(batch.schema.field(k).type))
    if cast is None and not any(pa.types.is_dictionary(f.type) for f in batch.schema):
        return batch
    columns = [
        c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in batch.columns
    ]
    if cast is not None:
        columns[k] = columns[k].cast(cast)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def read_parquet_chunks(
    path: str,
    *,
    time_column: str | None = None,
    item_column: str | None = None,
    event_column: str = "event",
    time_field: str | None = None,
    clock: StepClock | None = None,
    user_field: str | None = None,
) -> Iterator[Chunk]:
    """The records of a Parquet file or directory (see the module docstring) as chunks,
    each batch of a file a chunk (one row per event), or all the events of the input in
    chunks (one row per item: an event's rows may stand anywhere)."""
    if (time_field is None) != (clock is None):
        raise ValueError("time_field and clock go together")
    settings = dict(
        time_column=time_column,
        item_column=item_column,
        event_column=event_column,
        time_field=time_field,
        clock=clock,
        user_field=user_field,
    )
    batches = _batches(path, settings)
    first = next(batches, None)
    if first is None:
        return
    if first[0].per_item:
        yield from chunks_from_records(_per_item_records(_chain(first, batches)))
        return
    done = 0
    for layout, batch in _chain(first, batches):
        if layout.per_item:
            raise ValueError(
                f"--input {path!r}: its files mix one row per event and one row per item"
            )
        yield _event_chunk(layout, batch, done)
        done += batch.num_rows


def read_parquet_records(path: str, **settings: Any) -> Iterator[RawEvent]:
    """The records of :func:`read_parquet_chunks` one at a time (to count them)."""
    for chunk in read_parquet_chunks(path, **settings):
        users = chunk.users
        for k in range(len(chunk)):
            err = chunk.errors.get(k)
            lo, hi = int(chunk.offsets[k]), int(chunk.offsets[k + 1])
            items = None if err else tuple(chunk.items[c] for c in chunk.codes[lo:hi].tolist())
            user = users[k] if users is not None else None
            yield RawEvent(int(chunk.lines[k]), int(chunk.t[k]) or None, items, err, user)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _event_chunk(layout: _Layout, batch: Any, done: int) -> Chunk:
    """A batch of one row per event: by columns with integer steps, else row by row."""
    n = batch.num_rows
    if layout.clock is not None:
        lines = _json_rows(batch, layout)
        recs = []
        for i in range(n):  # each row's JSON object, its raw bytes too
            rec = parse_jsonl_line(
                lines[i],
                done + i + 1,
                time_field=layout.time,
                clock=layout.clock,
                user_field=layout.user,
            )
            assert rec is not None
            recs.append(rec)
        return next(chunks_from_records(recs, size=n))
    rows = _event_rows(batch, layout)
    data, starts, ends = _list_row_bytes(batch, layout, rows)
    fast = np.ones(n, dtype=bool)
    texts: list[str] | None = None
    asked = 0

    def text(i: int) -> str:  # an unusable row as JSON, for the per-line parser
        # a few such rows are encoded one by one (a row slice), many at once
        nonlocal texts, asked
        if texts is None:
            asked += 1
            if asked <= _ONE_BY_ONE:
                return _json_rows(batch.slice(i, 1), layout)[0]
            texts = _json_rows(batch, layout)
        return texts[i]

    chunk = _assemble(text, n, done, data, starts, ends, fast, rows, layout.user)
    chunk.nlines = n
    return chunk


#: How many rows of a batch the per-line parser is given one row slice at a time before
#: the whole batch is encoded once (a batch holds up to 65,536 rows).
_ONE_BY_ONE = 64


def _event_rows(batch: Any, layout: _Layout) -> tuple[Any, ...]:
    """A batch's columns as the Arrow rows of :func:`dpstream.io.arrow.arrow_rows`: (t, t
    given, usable, offsets, values, users); a row is usable when JSON Lines' rules plainly
    take it (the others go to the per-line parser)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tcol = batch.column(layout.time)
    past = None
    if pa.types.is_uint64(tcol.type):
        # a step past int64 goes to the per-line parser, which reads it exactly (past the
        # horizon, as JSON Lines says); here it holds the largest int64 (a null stays null)
        past = pc.greater(tcol, pa.scalar(INT64_MAX, pa.uint64()))
        tcol = pc.if_else(past, pa.scalar(INT64_MAX, pa.uint64()), tcol)
    if tcol.type != pa.int64():
        tcol = pc.cast(tcol, pa.int64())
    icol = batch.column(layout.items)
    if not pa.types.is_list(icol.type):
        icol = pc.cast(icol, pa.list_(icol.type.value_type))
    if not (pa.types.is_string(icol.type.value_type)):
        icol = pc.cast(icol, pa.list_(pa.string()))  # integer items: their decimal text
    users = None
    if layout.user is not None:
        users = batch.column(layout.user)
        if users.type != pa.string():
            users = pc.cast(users, pa.string())
    rows = event_rows(tcol, icol, users)
    rows[2][_not_utf8_rows(icol, users)] = False  # the per-line parser words them
    if past is not None:
        rows[2][pc.fill_null(past, False).to_numpy(zero_copy_only=False)] = False
    return rows


def _not_utf8_rows(icol: Any, users: Any) -> np.ndarray:
    """Which rows hold an item or a user id whose bytes are not UTF-8 (Arrow does not
    check a Parquet file's strings): the rows a JSON Lines line of those bytes would
    be, invalid records. One full validation when every string is UTF-8."""
    import pyarrow as pa

    bad = np.zeros(len(icol), dtype=bool)
    for col in (icol, users):
        if col is None:
            continue
        try:
            col.validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        values = col.values if col is icol else col
        binary = values.cast(
            pa.large_binary() if pa.types.is_large_string(values.type) else pa.binary()
        )
        wrong = np.array([not _is_utf8(v) for v in binary.to_pylist()], dtype=bool)
        if col is icol:
            offsets = arrow_ints(icol.offsets)
            seen = np.concatenate([[0], np.cumsum(wrong)])
            bad |= seen[offsets[1:]] > seen[offsets[:-1]]
        else:
            bad |= wrong
    return bad


def _is_utf8(value: bytes | None) -> bool:
    try:
        if value is not None:
            value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _pylist(col: Any) -> list[Any]:
    """A column's values in Python, the bytes of a string that are not UTF-8 kept as
    lone surrogates (``surrogateescape``, as the JSON Lines reader decodes a line), so
    that the per-line parser finds the record invalid ("not valid UTF-8")."""
    import pyarrow as pa

    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        pass
    typ = col.type
    listed = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    inner = typ.value_type if listed else typ
    binary = pa.large_binary() if pa.types.is_large_string(inner) else pa.binary()
    if listed:
        binary = pa.large_list(binary) if pa.types.is_large_list(typ) else pa.list_(binary)

    values = col.cast(binary).to_pylist()
    if listed:
        return [None if r is None else [escaped_text(v) for v in r] for r in values]
    return [escaped_text(v) for v in values]


def escaped_text(value: Any) -> Any:
    """A string's bytes as text, the bytes that are not UTF-8 kept as lone surrogates
    (``surrogateescape``, as the JSON Lines reader decodes a line); anything else as it
    is."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _python_value(value: Any) -> Any:
    """A value as JSON Lines would hold it (a timestamp or date as ISO-8601 text)."""
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return value


def _time_values(col: Any) -> list[Any]:
    """A time column's values in Python (timestamps as ``datetime``, nanoseconds floored
    to the microsecond: see :func:`_floor_to_micros`)."""
    import pyarrow as pa

    if pa.types.is_timestamp(col.type) and col.type.tz:
        _check_zone(col.type.tz)
    if pa.types.is_timestamp(col.type) and col.type.unit == "ns":
        col = _floor_to_micros(col)
    try:
        values = _pylist(col)  # text that is not UTF-8: escaped
    except (OverflowError, ValueError):  # a time Python cannot hold (past the year 9999)
        values = [_time_value(col, i) for i in range(len(col))]
    return [_python_value(v) for v in values]


#: What a time that Python's ``datetime`` cannot hold reads as: a text no timestamp
#: parser takes, so its record is invalid ("timestamp"), as in JSON Lines.
_NO_TIME = "a time Python cannot hold (past the year 9999)"


def _time_value(col: Any, i: int) -> Any:
    """Row ``i`` of a time column in Python, or :data:`_NO_TIME` (review 111: a year past
    9999 stopped the run with a traceback)."""
    try:
        return col[i].as_py()
    except (OverflowError, ValueError):
        return _NO_TIME


def _check_zone(zone: str) -> None:
    """Refuse, in one line, a timestamp column whose time zone Python does not know (its
    values cannot be placed on the clock; review 111: a traceback)."""
    import pyarrow as pa

    try:
        pa.scalar(0, pa.timestamp("s", zone)).as_py()
    except Exception as exc:  # pytz's or zoneinfo's error for an unknown name
        raise ValueError(
            f"the Parquet time column's time zone {zone!r} is not one Python knows "
            f"({type(exc).__name__}): write the timestamps in UTC, or with an IANA zone "
            "name such as Europe/Paris"
        ) from None


def _floor_to_micros(col: Any) -> Any:
    """A timestamp column of nanoseconds as microseconds, floored (toward minus infinity,
    on the integers): an instant stays in the step that holds it, since every step
    boundary is a whole microsecond (``datetime``). (Arrow's cast truncates toward zero:
    500 ns before 1970 would be 1970-01-01T00:00, in the next day's step.)"""
    import pyarrow as pa

    nanos = col.cast(pa.int64())
    valid = np.asarray(nanos.is_valid())
    micros = np.floor_divide(np.asarray(nanos.fill_null(0)), 1000)
    return pa.array(micros, pa.int64(), mask=~valid).cast(pa.timestamp("us", col.type.tz))


def _json_rows(batch: Any, layout: _Layout) -> list[str]:
    """Each row of a batch (one row per event) as the JSON Lines object of its event (a
    null is a missing field, as JSON Lines would miss it)."""
    tkey = layout.time if layout.clock is not None else "t"
    cols: list[tuple[str, list[Any]]] = [
        (tkey, _time_values(batch.column(layout.time))),
        ("items", _pylist(batch.column(layout.items))),
    ]
    if layout.user is not None:
        cols.append((layout.user, _pylist(batch.column(layout.user))))
    out = []
    for row in zip(*(values for _, values in cols), strict=True):
        obj = {k: v for (k, _), v in zip(cols, row, strict=True) if v is not None}
        out.append(json.dumps(obj, ensure_ascii=False))
    return out


#: The fixed head of a row's digest bytes (one row per event, integer steps): which of
#: step, items and user id are null (bits 0-2), the step (int64) and the item count
#: (int32), little-endian.
_HEAD = np.dtype([("nulls", "u1"), ("t", "<i8"), ("n", "<i4")])


def _list_row_bytes(
    batch: Any, layout: _Layout, rows: tuple[Any, ...]
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Each row's digest bytes (one row per event, integer steps), built with NumPy from
    Arrow's buffers: :data:`_HEAD`, each item's bytes followed by 0xff (0xfd for a null
    item), then the user id's bytes; rows apart by a line feed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t, t_given, _, offsets, values, users = rows
    n = batch.num_rows
    icol = batch.column(layout.items)
    list_valid = arrow_valid(icol)
    counts = np.diff(offsets)
    if not (pa.types.is_string(values.type)):
        values = pc.cast(values, pa.string())
    item_valid = arrow_valid(values)
    voff = _offsets(values)
    item_len = np.diff(voff)
    vdata = _data(values)
    nitems = int(counts.sum())
    per_item = np.zeros(nitems + 1, dtype=np.int64)  # bytes before each item (in its input)
    np.cumsum(item_len + 1, out=per_item[1:])
    row_items = per_item[offsets[1:]] - per_item[offsets[:-1]]
    if users is not None:
        uoff = _offsets(users)
        user_len = np.diff(uoff)
        user_valid = arrow_valid(users)
    else:
        user_len = np.zeros(n, dtype=np.int64)
        user_valid = np.ones(n, dtype=bool)
    size = _HEAD.itemsize
    lengths = size + row_items + user_len
    # a line feed between rows, as between the lines of JSON Lines: a step's rows are
    # then one slice of the buffer (what step_input joins them into)
    ends = np.cumsum(lengths + 1) - 1
    starts = ends - lengths
    out = np.full(int(ends[-1]) if n else 0, 10, dtype=np.uint8)
    head = np.zeros(n, dtype=_HEAD)
    head["nulls"] = (~t_given) | ((~list_valid) << 1) | ((~user_valid) << 2)
    head["t"] = t
    head["n"] = counts
    out[(starts[:, None] + np.arange(size)).ravel()] = head.view(np.uint8)
    if nitems:
        row_of = np.repeat(np.arange(n), counts)
        at = starts[row_of] + size + per_item[:-1] - per_item[offsets[:-1]][row_of]
        _scatter(out, at, vdata, voff, item_len)
        out[at + item_len] = np.where(item_valid, 0xFF, 0xFD).astype(np.uint8)
    if users is not None and user_len.any():
        _scatter(out, starts + size + row_items, _data(users), uoff, user_len)
    return out.tobytes(), starts, ends


def _offsets(arr: Any) -> np.ndarray:
    """The value offsets of a string array (int32), as int64."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr) + 1, dtype=np.int64)
    raw = np.frombuffer(buf, dtype=np.int32)
    return raw[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)


def _data(arr: Any) -> np.ndarray:
    """The data buffer of a string array, as bytes."""
    buf = arr.buffers()[2]
    return np.zeros(0, np.uint8) if buf is None else np.frombuffer(buf, dtype=np.uint8)


def _scatter(
    out: np.ndarray, at: np.ndarray, data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> None:
    """Copy ``data[offsets[k]:offsets[k] + lengths[k]]`` to ``out[at[k]:]`` for every k
    (the items lie one after another in ``data``).

    In blocks of consecutive items of about :data:`_SCATTER_BYTES` of data: the index
    arrays of a block take 16 bytes a byte of it, so a block bounds them (review 103: one
    400 MB item, from a 13 KB Parquet file, took 8.3 GB at once); an item larger than a
    block is one slice copy."""
    total = int(lengths.sum())
    if not total:
        return
    ends = np.cumsum(lengths)
    k = 0
    n = lengths.size
    while k < n:
        before = int(ends[k - 1]) if k else 0
        stop = max(k + 1, int(np.searchsorted(ends, before + _SCATTER_BYTES, side="right")))
        size = int(ends[stop - 1]) - before
        lo = int(offsets[k])
        if stop == k + 1:  # one item (a large one): a slice copy
            a = int(at[k])
            out[a : a + size] = data[lo : lo + size]
        elif size:
            shift = np.repeat(at[k:stop] - (offsets[k:stop] - lo), lengths[k:stop])
            out[np.arange(size, dtype=np.int64) + shift] = data[lo : lo + size]
        k = stop


#: The bytes of item data :func:`_scatter` copies with one set of index arrays.
_SCATTER_BYTES = 1 << 20


def _per_item_records(batches: Iterator[tuple[_Layout, Any]]) -> Iterator[RawEvent]:
    """The events of an input of one row per item (see the module docstring), in the
    order of their first rows; a row without a step or an event id is a record alone.

    Every row is held until the input ends (an event's rows may stand anywhere), as
    its cells, each distinct string once: a row's bytes (its cells as JSON) are made
    again when its record is given. Review 117: a 48 KB file of 200,000 rows repeating
    one 16 KB item (a dictionary) held a string and the bytes of each row, 17 GB."""
    events: dict[tuple[int, Any, Any], _ItemEvent] = {}
    records: deque[_ItemEvent | _LoneRow] = deque()
    strings: dict[str, str] = {}  # one string per distinct text (the rows are held)

    def once(value: Any) -> Any:
        return strings.setdefault(value, value) if type(value) is str else value

    row = 0
    for layout, batch in batches:
        if not layout.per_item:
            raise ValueError("the input's files mix one row per event and one row per item")
        times = _time_values(batch.column(layout.time))
        assert layout.event is not None
        eids = _pylist(batch.column(layout.event))
        items = _pylist(batch.column(layout.items))
        users = _pylist(batch.column(layout.user)) if layout.user is not None else None
        for i in range(batch.num_rows):
            row += 1
            cells = (
                once(times[i]),
                once(eids[i]),
                once(items[i]),
                None if users is None else once(users[i]),
            )
            # (its JSON text holds a lone surrogate only where a string cell does)
            if not all(valid_text(c) for c in cells if isinstance(c, str)):
                records.append(_LoneRow(row, NOT_UTF8, cells))  # as that line of JSON Lines
                continue
            t, err = _row_step(times[i], layout)
            if err is None and (eids[i] is None or eids[i] == ""):  # (as an empty CSV cell:
                err = f"the event id column {layout.event!r} is null or empty"  # not one event)
            user = cells[3]
            if err is None and users is not None and not _user_id(user):
                err = (
                    f'the user id "{layout.user}" must be a non-empty string, got '
                    f"{shorten(json.dumps(user))}"
                )
            if err is not None:  # no event to belong to: a record alone
                records.append(_LoneRow(row, err, cells))
                continue
            assert t is not None
            # at user level an event is one id of one user in one step: no user's rows
            # can join, or spoil, another user's event. An id is its text, as in CSV:
            # 5 in one file and "5" in another are one event (review 117: a column
            # typed int64 in one file and string in the next split an event in two,
            # each part under --max-items)
            key = (t, user, str(eids[i]))
            event = events.get(key)
            if event is None:
                event = events[key] = _ItemEvent(row, t, user)
                records.append(event)
            event.add(cells, strings)
    events.clear()
    while records:  # each record's rows let go as it is given
        yield records.popleft().record()


def _row_raw(cells: tuple[Any, ...]) -> bytes:
    """A row's bytes for the keyed digest: its cells ``[time, event id, item, user id]``
    as JSON text (bytes that are not UTF-8 as they are)."""
    return raw_bytes(json.dumps(cells, ensure_ascii=False))


def _row_step(value: Any, layout: _Layout) -> tuple[int | None, str | None]:
    """The step of a row's time value, or why it has none (JSON Lines' messages)."""
    if layout.clock is not None:
        if value is None:
            return None, f'an event needs a "{layout.time}" timestamp (--time-field)'
        return timestamp_step(value, layout.clock, "its timestamp")
    if value is None:
        return None, 'an event needs a time step "t"'
    return parse_t(value)


def _user_id(user: Any) -> bool:
    """Whether a row's user id is one: a non-empty string of valid text."""
    return isinstance(user, str) and bool(user) and valid_text(user)


class _ItemEvent:
    """The rows of one event (one id of one user in one step) of an input of one row per
    item; ``user`` is None at event level."""

    __slots__ = ("line", "t", "items", "user", "rows")

    def __init__(self, line: int, t: int, user: str | None) -> None:
        self.line, self.t, self.user = line, t, user
        self.items: list[str] = []
        self.rows: list[tuple[Any, ...]] = []

    def add(self, cells: tuple[Any, ...], strings: dict[str, str]) -> None:
        """Take one more row (its cells: time, event id, item, user id)."""
        self.rows.append(cells)
        item = cells[2]
        if item is not None:
            text = str(item)
            self.items.append(strings.setdefault(text, text))

    def record(self) -> RawEvent:
        raw = b"\n".join(map(_row_raw, self.rows))
        return RawEvent(self.line, self.t, tuple(self.items), None, self.user, raw=raw)


class _LoneRow:
    """A row of an input of one row per item that is a record alone (``error`` says
    why: no step, no event id, no user id, not UTF-8)."""

    __slots__ = ("line", "error", "cells")

    def __init__(self, line: int, error: str, cells: tuple[Any, ...]) -> None:
        self.line, self.error, self.cells = line, error, cells

    def record(self) -> RawEvent:
        return RawEvent(self.line, None, None, self.error, raw=_row_raw(self.cells))
