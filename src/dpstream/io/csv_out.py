"""CSV output: the long format, a row per released item per step.

Layer 6 of dpstream (an edge). The format is described in
:mod:`dpstream.io.text`.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from ..mechanisms.base import Release
from .text import (
    CSV_SPECIAL,
    LONG_COLUMNS,
    ItemText,
    LongFormatter,
    RowPieces,
    clock_values,
    int_rows,
    join_text,
    long_rows,
    value_text,
)

__all__ = ["CsvFormatter"]


def _csv_cell(item: Any) -> str:
    """An item as the csv module writes it (quoted when it must be)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([str(item), ""])  # as one field of a row
    return buf.getvalue()[:-2]


class CsvFormatter(LongFormatter):
    """The long format as CSV: a ``t,item,value,noise_std`` header, then one row per
    released item per step (and ``step_start,step_end`` with a public clock); a step
    that releases no item writes one row with empty ``item`` and ``value``, so every
    step of the clock is in the file."""

    name = "csv"

    def _new_cells(self) -> ItemText:
        return ItemText(_csv_cell, CSV_SPECIAL)

    def header(self) -> bytes:
        return (",".join((*LONG_COLUMNS, *self._clock)) + "\n").encode()

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as :meth:`_format_rows`, built by Arrow's string kernels."""
        import pyarrow as pa
        import pyarrow.compute as pc

        std = release.meta.get("noise_std") if release.meta else None
        std_text = "" if std is None else repr(std) if isinstance(std, float) else str(std)
        for when in clock_values(int(release.t), self.step_start, self.step_end):
            std_text += "," + when  # ISO-8601 text: nothing a CSV writer quotes
        rows = (
            int_rows(
                self._cells,
                release,
                RowPieces(
                    f"{int(release.t)},".encode(), b",", f",{std_text}".encode(), b"\n", last=b"\n"
                ),
            )
            if self.round_counts
            else None
        )
        if rows is not None:
            return rows
        vals = value_text(release, self.round_counts)
        if vals is None:
            return None
        n = len(vals)
        rows = pc.binary_join_element_wise(
            pa.array([str(int(release.t))] * 1, pa.string()).take(pa.array(np.zeros(n, np.int64))),
            self._cells(release.items),
            vals,
            pa.array([std_text], pa.string()).take(pa.array(np.zeros(n, np.int64))),
            ",",
        )
        return (join_text(rows, "\n") + "\n").encode("utf-8")

    def _format_rows(self, release: Release) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in long_rows(release, self.round_counts, self.step_start, self.step_end):
            writer.writerow(
                ["" if v is None else repr(v) if isinstance(v, float) else v for v in row]
            )
        return buf.getvalue().encode("utf-8")
