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
    """An item as the csv module writes it (quoted when it must be: a comma, a quote, a
    line feed or a carriage return in it; RFC 4180, so a reader never splits its row)."""
    buf = io.StringIO()
    # "\r\n" as the terminator, so that a bare "\r" is quoted as well as a "\n"
    csv.writer(buf, lineterminator="\r\n").writerow([str(item), ""])  # one field of a row
    return buf.getvalue()[:-3]


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
        # "\r\n" as the csv module's terminator, so that it quotes a bare "\r" (RFC
        # 4180), then "\n" at each row's end as the file has it
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\r\n")
        rows = []
        for row in long_rows(release, self.round_counts, self.step_start, self.step_end):
            writer.writerow(
                ["" if v is None else repr(v) if isinstance(v, float) else v for v in row]
            )
            rows.append(buf.getvalue()[:-2] + "\n")
            buf.seek(0)
            buf.truncate()
        return "".join(rows).encode("utf-8")
