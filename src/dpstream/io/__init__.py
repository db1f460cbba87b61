"""Reading events and writing releases: the file formats of the ``dpstream`` command.

Layer 6 of dpstream (the edges). One module per format, one parser per format:

* :mod:`~dpstream.io.records`: a record (:class:`RawEvent`) and the rules every
  input format shares (items, time steps, user ids, UTF-8, ``.gz``);
* :mod:`~dpstream.io.jsonl`: JSON Lines input, one line parser
  (:func:`parse_jsonl_line`), read in chunks (Arrow where it applies) or record
  by record; :mod:`~dpstream.io.lines`: an input as blocks of whole lines;
  :mod:`~dpstream.io.arrow`: the Arrow fast path;
* :mod:`~dpstream.io.csv`: CSV input, events grouped from their rows;
* :mod:`~dpstream.io.reading`: the input formats by name (:func:`read_events`);
* :mod:`~dpstream.io.chunks`: records as columns, and a step's input;
  :mod:`~dpstream.io.grouping`: which step every record counts in
  (:func:`group_steps`, ``ChunkGrouper``);
* :mod:`~dpstream.io.domain`: known-domain files (:func:`read_domain`);
* :mod:`~dpstream.io.text`: what the output formats share (the formats are
  described there); :mod:`~dpstream.io.jsonl_out`, :mod:`~dpstream.io.csv_out`,
  :mod:`~dpstream.io.parquet_out`: the writers; :mod:`~dpstream.io.output`:
  :func:`make_formatter`.

This package re-exports the public names of its modules that callers import
from ``dpstream.io``; :class:`KeyedTruncator` lives in
:mod:`dpstream.mechanisms.truncation`, beside the rule it applies.
"""

from __future__ import annotations

from ..mechanisms.truncation import KeyedTruncator
from .csv import MAX_CSV_ITEM_CHARS, read_csv
from .csv_out import CsvFormatter
from .domain import read_domain
from .grouping import group_steps
from .jsonl import parse_jsonl_line, read_jsonl
from .jsonl_out import JsonlFormatter, JsonlLongFormatter
from .output import make_formatter, output_path_kind, resolve_path
from .parquet_out import ParquetWriter
from .reading import read_events
from .records import RawEvent, guard_lines, open_input, raw_bytes
from .text import LONG_COLUMNS, STEP_END, STEP_START

__all__ = [
    "RawEvent",
    "MAX_CSV_ITEM_CHARS",
    "open_input",
    "guard_lines",
    "read_jsonl",
    "parse_jsonl_line",
    "raw_bytes",
    "read_csv",
    "read_events",
    "group_steps",
    "read_domain",
    "KeyedTruncator",
    "JsonlFormatter",
    "CsvFormatter",
    "JsonlLongFormatter",
    "ParquetWriter",
    "LONG_COLUMNS",
    "STEP_START",
    "STEP_END",
    "make_formatter",
    "output_path_kind",
    "resolve_path",
]
