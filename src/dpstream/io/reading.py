"""The input formats by name: records, or chunks, from JSON Lines, CSV or Parquet.

Layer 6 of dpstream (an edge). :func:`read_events` yields records
(:class:`~dpstream.io.records.RawEvent`) and :func:`read_chunks` chunks
(:class:`~dpstream.io.chunks.Chunk`) of the format named by
``--input-format``, read by that format's one parser
(:mod:`dpstream.io.jsonl`, :mod:`dpstream.io.csv`, :mod:`dpstream.io.parquet`:
chunks only, from a path).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..clock import StepClock
from .chunks import Chunk
from .csv import read_csv, read_csv_chunks
from .jsonl import read_jsonl, read_jsonl_chunks
from .lines import line_texts
from .parquet import read_parquet_chunks
from .records import RawEvent

__all__ = ["read_events", "read_chunks"]


def read_events(
    stream: Iterable[str],
    fmt: str,
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
    **csv_options: Any,
) -> Iterator[RawEvent]:
    """Dispatch on ``fmt`` (``"jsonl"`` or ``"csv"``); ``time_field`` with ``clock``:
    steps from timestamps (a JSON field, or the CSV column of that name);
    ``implicit``: every JSON line is a step (CSV needs a time column);
    ``user_field``: each event's user id (a JSON field, or the CSV column)."""
    if fmt == "jsonl":
        return read_jsonl(
            stream, time_field=time_field, clock=clock, implicit=implicit, user_field=user_field
        )
    options = _csv_options(time_field, clock, implicit, user_field, csv_options)
    if fmt == "csv":
        return read_csv(stream, **options)
    raise ValueError(f"input format must be 'jsonl' or 'csv', got {fmt!r}")


def read_chunks(
    stream: Any,
    fmt: str,
    name: str = "input",
    *,
    time_field: str | None = None,
    clock: StepClock | None = None,
    implicit: bool = False,
    user_field: str | None = None,
    **csv_options: Any,
) -> Iterator[Chunk]:
    """The records of :func:`read_events` (the same options) in chunks: JSON Lines with
    integer steps through the columnar reader, the other inputs record by record.
    ``name`` names the input in errors (a truncated ``.gz``)."""
    if fmt == "jsonl":
        return read_jsonl_chunks(
            stream,
            name,
            time_field=time_field,
            clock=clock,
            implicit=implicit,
            user_field=user_field,
        )
    if fmt == "parquet":  # ``stream``: the path of a file or a directory
        if implicit:
            raise ValueError(
                "--implicit-time is for JSON Lines: give each Parquet row its step "
                "(a time column, or --time-field for timestamps)"
            )
        columns = {k: v for k, v in csv_options.items() if k != "delimiter"}
        return read_parquet_chunks(
            stream, time_field=time_field, clock=clock, user_field=user_field, **columns
        )
    options = _csv_options(time_field, clock, implicit, user_field, csv_options)
    if fmt == "csv":
        return read_csv_chunks(line_texts(stream, name, ends=True), **options)
    raise ValueError(f"input format must be 'jsonl', 'csv' or 'parquet', got {fmt!r}")


def _csv_options(
    time_field: str | None,
    clock: StepClock | None,
    implicit: bool,
    user_field: str | None,
    csv_options: dict[str, Any],
) -> dict[str, Any]:
    """The options of :func:`~dpstream.io.csv.read_csv` for a run's time mode and user
    ids (``--implicit-time`` is refused: the rows of a CSV event are not a step each)."""
    if implicit:
        raise ValueError(
            "--implicit-time is for JSON Lines: the rows of a CSV event are not "
            "a step each; give --time-column or --time-field"
        )
    if user_field is not None:
        csv_options = {**csv_options, "user_column": user_field}
    if clock is not None:
        csv_options = {**csv_options, "time_column": time_field, "clock": clock}
    return csv_options
