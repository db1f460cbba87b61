"""The input of ``dpstream run --engine spark``: a JSON Lines file read by Spark, each line
through the local engine's own parser; or Parquet files read by ``spark.read.parquet``,
each row through that parser as its JSON Lines object (as the local Parquet reader words
its invalid rows).

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..io import read_jsonl

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["read_events_jsonl", "read_events_parquet"]

_EVENT_SCHEMA = T.StructType(
    [
        T.StructField("pos", T.LongType(), False),
        T.StructField("t", T.LongType(), True),
        T.StructField("items", T.ArrayType(T.StringType(), False), True),
        T.StructField("error", T.StringType(), True),
        T.StructField("user", T.StringType(), True),
    ]
)


def _parse_lines(batches, time_field=None, clock=None, implicit=False, user_field=None):
    """Each text line through the local engine's own JSON Lines parser (with implicit
    time, a line's step is its place in the file, set by the caller)."""
    for pdf in batches:
        ts, items, errors, users = [], [], [], []
        for line in pdf["value"].tolist():
            recs = list(
                read_jsonl(
                    [line],
                    time_field=time_field,
                    clock=clock,
                    implicit=implicit,
                    user_field=user_field,
                )
            )
            if not recs:  # blank line
                ts.append(None)
                items.append(None)
                errors.append("")
                users.append(None)
                continue
            rec = recs[0]
            ts.append(rec.t)
            items.append(None if rec.items is None else list(rec.items))
            errors.append(rec.error)
            users.append(rec.user)
        yield pd.DataFrame(
            {
                "pos": pdf["pos"].to_numpy(),
                "t": pd.array(ts, dtype="Int64"),
                "items": items,
                "error": errors,
                "user": users,
            }
        )


def read_events_jsonl(
    spark: SparkSession,
    path: str,
    *,
    time_field: str | None = None,
    clock: Any = None,
    implicit: bool = False,
    user_field: str | None = None,
) -> DataFrame:
    """Parse a JSON Lines events file (``*.gz`` too) as the local engine does.

    Returns (pos, t, items, error, user): ``pos`` the line's place in the file,
    ``error`` the parse problem (``""`` for a blank line, null for an event).
    With ``time_field`` and ``clock`` (a :class:`dpstream.clock.StepClock`),
    ``t`` is the step of the event's timestamp on that public clock; with
    ``implicit``, every line is a step: ``t`` is its line number (blank and
    broken lines too, as invalid records of their steps). With ``user_field``,
    ``user`` is each event's user id (an event without a valid one is an error
    row).
    """
    lines = spark.read.text(path)
    indexed = lines.rdd.zipWithIndex().map(lambda row: (row[1], row[0][0]))
    df = spark.createDataFrame(indexed, "pos long, value string")
    parsed = df.mapInPandas(
        lambda b: _parse_lines(b, time_field, clock, implicit, user_field), _EVENT_SCHEMA
    )
    if implicit:
        parsed = parsed.withColumn("t", F.col("pos") + 1)
    return parsed


def _rows_as_lines(batches, user_field=None):
    """Each Parquet row (pos, t, items[, user]) as the JSON Lines object of its event (a
    null is a missing field, as the local Parquet reader writes it)."""
    import json

    for pdf in batches:
        lines = []
        users = pdf["user"].tolist() if user_field is not None else None
        for k, (t, items) in enumerate(zip(pdf["t"].tolist(), pdf["items"].tolist(), strict=True)):
            obj: dict[str, Any] = {}
            if t is not None and not pd.isna(t):
                obj["t"] = int(t)
            if items is not None:
                obj["items"] = [None if x is None else str(x) for x in list(items)]
            if users is not None and users[k] is not None:
                obj[user_field] = users[k]
            lines.append(json.dumps(obj, ensure_ascii=False))
        yield pd.DataFrame({"pos": pdf["pos"].to_numpy(), "value": lines})


def _numbered(offset: int) -> Any:
    """(row, index in its file) -> (pos, *row): a row numbered after ``offset`` rows."""

    def number(pair: Any) -> tuple[Any, ...]:
        return (pair[1] + offset, *pair[0])

    return number


def read_events_parquet(
    spark: SparkSession,
    path: str,
    *,
    time_column: str | None = None,
    item_column: str = "item",
    event_column: str = "event",
    user_field: str | None = None,
) -> DataFrame:
    """Parse a Parquet file or directory (integer steps, a list column of items) as the
    local engine does: the same (pos, t, items, error, user) as
    :func:`read_events_jsonl`, ``pos`` a row's place over the files in sorted order
    (each file is read on its own and numbered after the rows of the files before it,
    so the order is the local reader's, whatever order Spark lists the files in).

    Columns are checked on the driver (the local reader's errors); one row per item and
    timestamps are refused (they run on the local engine).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..io.parquet import _layout, parquet_files

    frames = []
    offset = 0
    for name in parquet_files(path):
        try:
            meta = pq.ParquetFile(name)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{name!r} is not a Parquet file ({exc})") from None
        layout = _layout(
            meta.schema_arrow,
            f"the Parquet input {name!r}",
            time_column=time_column,
            item_column=item_column,
            event_column=event_column,
            time_field=None,
            clock=None,
            user_field=user_field,
        )
        if layout.per_item:
            raise ValueError(
                "--engine spark reads Parquet of one row per event (a list column of "
                "items); one row per item runs on the local engine"
            )
        cols = [
            F.col(layout.time).cast("long").alias("t"),
            F.col(layout.items).cast("array<string>").alias("items"),
        ]
        if user_field is not None:
            cols.append(F.col(user_field).cast("string").alias("user"))
        df = spark.read.parquet(name).select(*cols)
        indexed = df.rdd.zipWithIndex().map(_numbered(offset))
        schema = "pos long, t long, items array<string>" + (
            ", user string" if user_field is not None else ""
        )
        frames.append(spark.createDataFrame(indexed, schema))
        offset += meta.metadata.num_rows
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    return rows.mapInPandas(
        lambda b: _parse_lines(_rows_as_lines(b, user_field), user_field=user_field),
        _EVENT_SCHEMA,
    )
