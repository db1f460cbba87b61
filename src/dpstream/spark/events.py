"""The input of ``dpstream run --engine spark``: a JSON Lines file read by Spark, each line
through the local engine's own parser.

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

__all__ = ["read_events_jsonl"]

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
