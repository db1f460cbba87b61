"""Line numbers of a text input read by Spark, without a Python RDD.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.read_jsonl`. Spark reads
a file (or the files of a directory) in splits, and packs the splits into
partitions by size, so the order of the partitions is not the order of the lines.
Each line's place is found from what Spark knows of it, all in the JVM:

* its split: the hidden metadata columns ``_metadata.file_path`` and
  ``_metadata.file_block_start`` (a split's byte offset in its file; a line
  belongs to exactly one split, and the lines of a split come before those of
  the next split of its file);
* its row within the split: ``monotonically_increasing_id()`` holds the row's
  index in its partition in its low 33 bits, and the rows of one split are
  read one after another, so the row's index less the split's first index is
  its place in the split (the partition index, the high bits, is left out: it
  need not be the same in two jobs of one plan, the row index is).

The lines are marked with their split and row as they are read, and parsed
and cached with their marks; a job over the cache counts the lines of each
split and finds its first row index (a row per split, collected to the
driver); the splits are put in order (files by their paths relative to the
input, as the Parquet reader sorts a directory's files, then by offset) and
their counts prefix-summed into each split's first line number, joined back
as a broadcast table: ``pos``, from 0, is then exact over the whole input.
Both the count and the numbers are read from the one cached pass, so they
cannot disagree.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

from .frames import local_frame

__all__ = ["split_marks", "split_shifts", "with_pos", "numbered"]

#: The low bits of ``monotonically_increasing_id()``: the row's index in its partition.
_ROW_BITS = (1 << 33) - 1


def _is_uri(path: str) -> bool:
    """Whether ``path`` is a URI (``file:``, ``hdfs://...``), not a plain local path."""
    return "://" in path or path.startswith("file:")


def _path_key(uri: str, root: str) -> list[str]:
    """A file's sort key: its path relative to the input (a folder, or a URI of one on
    any file system), by components; a lone local file's name."""
    path = unquote(urlparse(uri).path) if _is_uri(uri) else uri
    if _is_uri(root):
        rel = os.path.relpath(path, urlparse(root).path or "/")
    elif os.path.isdir(root):
        rel = os.path.relpath(path, root)
    else:
        rel = os.path.basename(path)
    return rel.split(os.sep)


def split_marks(lines: DataFrame) -> DataFrame:
    """``lines`` (a text scan: ``value``) with each line's split and row in it (``_file``,
    ``_block``, ``_row``), for :func:`numbered` once the lines are parsed (and cached)."""
    return lines.select(
        "value",
        F.col("_metadata.file_path").alias("_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().bitwiseAND(F.lit(_ROW_BITS)).alias("_row"),
    )


def split_shifts(
    marked: DataFrame, root: str, **aggs: Any
) -> tuple[list[tuple[str, int, int]], list[Any]]:
    """One job over ``marked`` (rows of :func:`split_marks`, best cached): each split's
    (file, block, shift), its first line's number less its first row index, in input
    order; and the split's row of counts with the aggregates ``aggs`` (name: column,
    over its rows) as well, in the same order, for the caller to combine."""
    splits = (
        marked.groupBy("_file", "_block")
        .agg(
            F.count(F.lit(1)).alias("_n"),
            F.min("_row").alias("_first"),
            *(col.alias(name) for name, col in aggs.items()),
        )
        .collect()
    )
    if not _is_uri(root):
        root = os.path.abspath(root)
    splits.sort(key=lambda s: (_path_key(s["_file"], root), s["_block"]))
    table: list[tuple[str, int, int]] = []
    base = 0
    for s in splits:
        table.append((s["_file"], int(s["_block"]), base - int(s["_first"])))
        base += int(s["_n"])
    return table, splits


def with_pos(
    spark: SparkSession, marked: DataFrame, table: list[tuple[str, int, int]]
) -> DataFrame:
    """``marked`` with ``pos``, each line's place in the input from 0 (the shifts of
    :func:`split_shifts` joined as a broadcast table), instead of its marks."""
    shifts = local_frame(spark, table, "_file string, _block long, _shift long")
    rest = [c for c in marked.columns if c not in ("_file", "_block", "_row")]
    return marked.join(F.broadcast(shifts), ["_file", "_block"]).select(
        (F.col("_row") + F.col("_shift")).alias("pos"), *rest
    )


def numbered(spark: SparkSession, marked: DataFrame, root: str) -> DataFrame:
    """``marked`` (rows of :func:`split_marks`, best cached: it is read twice) with
    ``pos``, each line's place in the input from 0, instead of its marks (see the
    module docstring)."""
    return with_pos(spark, marked, split_shifts(marked, root)[0])
