"""The input of ``dpstream run --engine spark``: JSON Lines or Parquet events, read by
Spark with the local engine's decisions.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command`. Both readers
give one row per record, (pos, t, items, error, user), ``pos`` the record's place
in the input from 0 (its line, or its row over the files in sorted order), each
decided as the local engine decides it (plain records taken as they are, the
others given to the local one-line parser, which words their messages):

* :func:`~dpstream.spark.read_jsonl.read_events_jsonl`: JSON Lines (a file, a
  ``*.gz``, a directory), numbered by :mod:`dpstream.spark.order`;
* :func:`~dpstream.spark.read_parquet.read_events_parquet`: Parquet of one row
  per event with integer steps.
"""

from __future__ import annotations

from .read_jsonl import EVENT_SCHEMA, read_events_jsonl
from .read_parquet import read_events_parquet

__all__ = ["EVENT_SCHEMA", "read_events_jsonl", "read_events_parquet"]
