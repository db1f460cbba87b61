"""How the Spark engine hands the input's paths to Spark's file readers.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.read_jsonl` and
:mod:`dpstream.spark.read_parquet`. Spark's readers take a path as a Hadoop glob
and may skip what they cannot read; the local engine reads the one file it is
named, and refuses a broken one. So:

* :func:`literal_path` escapes the glob characters: ``day[1].jsonl`` is that
  file, not ``day1.jsonl``, and ``events-{a,b}`` one folder, not two;
* :func:`strict_reader` reads with ``ignoreCorruptFiles`` and
  ``ignoreMissingFiles`` off, whatever the session's configuration says: a
  truncated ``.gz`` stops the run, as it does on the local engine, instead of
  releasing the events before the damage.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["literal_path", "strict_reader"]

#: The characters a Hadoop glob gives a meaning (``\\`` escapes the next one).
_GLOB = re.compile(r"([\\\[\]{}*?])")


def literal_path(path: str) -> str:
    """``path`` with its Hadoop glob characters escaped, so that Spark reads that very
    file or folder."""
    return _GLOB.sub(r"\\\1", path)


def strict_reader(spark: Any) -> Any:
    """``spark.read`` that fails on a corrupt or vanished file (the per-read options win
    over the session's ``spark.sql.files.ignore*Files``)."""
    return spark.read.option("ignoreCorruptFiles", "false").option("ignoreMissingFiles", "false")
