"""Choosing the writer of a run's releases, and the output's path.

Layer 6 of dpstream (an edge).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .csv_out import CsvFormatter
from .jsonl_out import JsonlFormatter, JsonlLongFormatter

__all__ = ["make_formatter", "output_path_kind", "resolve_path"]


def make_formatter(
    fmt: str,
    round_counts: bool = False,
    step_start: Callable[[int], str] | None = None,
    step_end: Callable[[int], str] | None = None,
) -> JsonlFormatter | CsvFormatter | JsonlLongFormatter:
    """The release formatter for ``fmt``: ``"jsonl"`` (a line per step), ``"csv"`` or
    ``"jsonl-long"`` (a row per released item per step). ``step_start`` and ``step_end``
    (a run's public clock: t to when step t begins and ends, ISO-8601) add
    ``step_start`` and ``step_end`` columns to the long formats."""
    if fmt == "jsonl":
        return JsonlFormatter(round_counts)
    if fmt == "csv":
        return CsvFormatter(round_counts, step_start, step_end)
    if fmt == "jsonl-long":
        return JsonlLongFormatter(round_counts, step_start, step_end)
    raise ValueError(f"output format must be 'jsonl', 'csv' or 'jsonl-long', got {fmt!r}")


def output_path_kind(path: str) -> str:
    """``"stdout"`` for ``-``, else ``"file"`` (a helper for messages)."""
    return "stdout" if path == "-" else "file"


def resolve_path(path: str) -> str:
    """An absolute path for ``path`` (``-`` stays ``-``): what the checkpoint records."""
    return path if path == "-" else str(Path(path).resolve())
