"""Parquet events read by Spark with the local engine's decisions.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.events`. The local
Parquet reader (:mod:`dpstream.io.parquet`) takes a row by its columns when
JSON Lines' rules plainly take it (a step >= 1, a list of items none of them
null, a non-empty user id) and writes every other row as its JSON Lines object
for the one-line parser, which decides it and words its message. Here the same:
the plain rows are selected with a SQL filter over the typed columns, the
others (few: the invalid ones) go through
:func:`dpstream.io.jsonl.parse_jsonl_line` in ``mapInPandas`` batches, as the
same JSON object.

A row's number is its file's first row number (the rows of the files before
it, in the sorted order of :func:`dpstream.io.parquet.parquet_files`, counted
from the files' footers on the driver) plus its index in its file, Spark's
``_metadata.row_index``: no Python RDD, no shuffle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pandas as pd

from ..io.chunks import INT64_MAX
from ..io.jsonl import parse_jsonl_line
from ..io.parquet import escaped_text
from .paths import literal_col, literal_path, readable_by_spark, strict_reader
from .read_jsonl import EVENT_SCHEMA

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["read_events_parquet"]


def read_events_parquet(
    spark: SparkSession,
    path: str,
    *,
    time_column: str | None = None,
    item_column: str | None = None,
    event_column: str = "event",
    user_field: str | None = None,
) -> DataFrame:
    """Parse a Parquet file or directory (integer steps, a list column of items) as the
    local engine does: (pos, t, items, error, user) as
    :func:`dpstream.spark.read_jsonl.read_events_jsonl` gives, ``pos`` a row's place
    over the files in sorted order (see the module docstring).

    Columns are checked on the driver (the local reader's errors); one row per item and
    timestamps are refused (they run on the local engine).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..io.parquet import _layout, parquet_files

    frames = []
    offset = 0
    for name in parquet_files(path):
        readable_by_spark(name)
        try:
            meta = pq.ParquetFile(name)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{name!r} is not a Parquet file ({exc})") from None
        _check_case(spark, name, meta.schema_arrow.names)
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
        user = (
            literal_col(user_field).cast("string")
            if user_field is not None
            else F.lit(None).cast("string")
        )
        table = strict_reader(spark).parquet(literal_path(name))
        if not table.inputFiles():  # Spark skips "_x" and ".x" even given by name
            raise ValueError(
                f"--engine spark cannot read {name!r}: Spark skips files whose names "
                "begin with '_' or '.'; rename it or run it on the local engine"
            )
        step = literal_col(layout.time)
        if pa.types.is_uint64(meta.schema_arrow.field(layout.time).type):
            # past int64 is past any horizon below 2^63 - 1: kept as the largest (a null
            # stays null: F.least would skip it)
            big = F.lit(INT64_MAX).cast(step_type(table, layout.time))
            step = F.when(step > big, big).otherwise(step)
        frames.append(
            table.select(
                (_row_index(table) + F.lit(offset)).alias("pos"),
                step.cast("long").alias("t"),
                literal_col(layout.items).cast("array<string>").alias("items"),
                user.alias("user"),
            )
        )
        offset += meta.metadata.num_rows
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    plain = (
        F.col("t").isNotNull()
        & (F.col("t") >= 1)
        & F.col("items").isNotNull()
        & ~F.exists("items", lambda x: x.isNull())
    )
    plain = plain & F.forall("items", _utf8)
    if user_field is not None:
        plain = plain & F.col("user").isNotNull() & (F.length("user") > 0) & _utf8(F.col("user"))
    plain = F.coalesce(plain, F.lit(False))
    fast = rows.where(plain).select(
        "pos", "t", "items", F.lit(None).cast("string").alias("error"), "user"
    )
    slow = (
        rows.where(~plain)
        .select(  # the strings' bytes: one that is not UTF-8 is the parser's to word
            "pos",
            F.col("t").cast("string").alias("t"),
            F.col("items").cast("array<binary>").alias("items"),
            F.col("user").cast("binary").alias("user"),
        )
        .mapInPandas(lambda b: _parse_rows(b, user_field), EVENT_SCHEMA)
    )
    return fast.unionByName(slow)


def _row_index(table: DataFrame) -> Any:
    """A row's index in its file: Spark's hidden ``_metadata.row_index``, asked for as a
    metadata column where PySpark can (4.0), so that a data column named ``_metadata``
    does not hide it."""
    if hasattr(table, "metadataColumn"):
        return table.metadataColumn("_metadata").getField("row_index")
    return F.col("_metadata.row_index")


def step_type(table: DataFrame, name: str) -> Any:
    """The Spark type of the column ``name`` of ``table`` (a Parquet ``uint64`` is read
    as ``decimal(20,0)``)."""
    return next(f.dataType for f in table.schema.fields if f.name == name)


def _check_case(spark: SparkSession, name: str, columns: list[str]) -> None:
    """Refuse a file two of whose columns differ only in case (``t`` and ``T``): Spark
    matches names ignoring case (unless ``spark.sql.caseSensitive``) and cannot read it,
    where the local engine reads each column by its name."""
    if str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true":
        return
    seen: dict[str, str] = {}
    for col in columns:
        other = seen.setdefault(col.lower(), col)
        if other != col:
            raise ValueError(
                f"--engine spark cannot read {name!r}: its columns {other!r} and {col!r} "
                "differ only in case, which Spark does not tell apart; rename one, or run "
                "the input on the local engine"
            )


def _utf8(text: Any) -> Any:
    """Whether a string's bytes are UTF-8 (Spark does not check a Parquet file's): by
    Spark's ``is_valid_utf8`` where it has it (4.0), else by a decode and encode that
    gives the same bytes back only for UTF-8 (3.5 replaces what it cannot decode)."""
    if hasattr(F, "is_valid_utf8"):
        return F.is_valid_utf8(text)
    raw = text.cast("binary")
    return F.encode(F.decode(raw, "UTF-8"), "UTF-8") == raw


def _parse_rows(batches: Iterator[pd.DataFrame], user_field: str | None) -> Iterator[pd.DataFrame]:
    """Each row (pos, t as text, items and user as bytes) as its event's JSON Lines object
    (a null is a missing field, as the local Parquet reader writes it) through the
    one-line parser."""
    for pdf in batches:
        ts: list[Any] = []
        items: list[Any] = []
        errors: list[Any] = []
        users: list[Any] = []
        cols = zip(
            pdf["pos"].tolist(),
            pdf["t"].tolist(),
            pdf["items"].tolist(),
            pdf["user"].tolist(),
            strict=True,
        )
        for pos, t, its, uid in cols:
            obj: dict[str, Any] = {}
            if t is not None:  # the step as text: exact whatever its size
                obj["t"] = int(t)
            if its is not None:
                obj["items"] = [escaped_text(x) for x in list(its)]
            if user_field is not None and uid is not None:
                obj[user_field] = escaped_text(uid)
            line = json.dumps(obj, ensure_ascii=False)
            rec = parse_jsonl_line(line, pos + 1, user_field=user_field)
            assert rec is not None
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
