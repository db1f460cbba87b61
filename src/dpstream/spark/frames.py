"""Frames of the driver's small lists, read by the JVM from Arrow tables.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command` and
:mod:`dpstream.spark.order`. ``createDataFrame`` of a Python list runs a job of
Python tasks of its own (PySpark re-pickles the rows it parallelized), on plain
Python workers, not the Arrow ones a run warms: about a second of fixed cost per
run. An Arrow table becomes a local relation with no Python job.
"""

from __future__ import annotations

from typing import Any

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["local_frame"]


def local_frame(
    spark: SparkSession, rows: list[tuple[Any, ...]], schema: str, *, sliced: bool = False
) -> DataFrame:
    """``spark.createDataFrame(rows, schema)`` without its Python worker job: a list
    crosses to the JVM pickled, and PySpark re-pickles it in a job of Python tasks
    (about a second of fixed cost per frame on a small run), where an Arrow table
    (PySpark 4 and later) is read by the JVM itself. Same rows, in the same order.

    The Arrow frame's rows are cut into partitions otherwise; with ``sliced``,
    the rows are in the partitions ``createDataFrame`` gives them
    (:func:`_parallelized`), for a frame that is written: its part files stay
    those of a list."""
    if not hasattr(spark, "_create_from_arrow_table"):  # PySpark 3.5; Spark Connect
        return spark.createDataFrame(rows, schema)
    import pyarrow as pa

    struct = T._parse_datatype_string(schema)
    assert isinstance(struct, T.StructType)
    arrow = {T.LongType: pa.int64(), T.DoubleType: pa.float64(), T.StringType: pa.string()}
    fields = [pa.field(f.name, arrow[type(f.dataType)]) for f in struct.fields]
    try:
        if not sliced:
            columns = list(zip(*rows, strict=True)) if rows else [()] * len(fields)
            table = pa.Table.from_arrays(
                [pa.array(list(c), type=f.type) for c, f in zip(columns, fields, strict=True)],
                schema=pa.schema(fields),
            )
            return spark.createDataFrame(table, struct)
        # a row per batch of parallelize (a local relation is cut by rows): the
        # batches fall in its partitions, and each is exploded where it is
        batches = _parallelized(rows, spark.sparkContext.defaultParallelism)
        names = [f.name for f in fields]
        nested_rows = [[dict(zip(names, r, strict=True)) for r in b] for b in batches]
        table = pa.table({"_rows": pa.array(nested_rows, pa.list_(pa.struct(fields)))})
    except (UnicodeEncodeError, pa.ArrowException):  # a str that is not UTF-8 (a lone surrogate)
        return spark.createDataFrame(rows, schema)
    nested = T.StructType([T.StructField("_rows", T.ArrayType(struct))])
    return spark.createDataFrame(table, nested).select(F.inline("_rows"))


def _parallelized(rows: list[Any], slices: int) -> list[list[Any]]:
    """The batches in which ``SparkContext.parallelize(rows)`` ships ``rows``, of
    ``max(1, min(len // slices, 1024))`` rows: Spark cuts the list of batches into
    ``slices`` partitions (``ParallelCollectionRDD``) as it cuts a local relation's
    rows, so a frame of a row per batch has the batches in the same partitions."""
    size = max(1, min(len(rows) // slices, 1024))
    return [rows[i : i + size] for i in range(0, len(rows), size)]
