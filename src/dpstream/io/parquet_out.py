"""Parquet output: the long format in row groups (needs pyarrow).

Layer 6 of dpstream (an edge). The format is described in
:mod:`dpstream.io.text`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..mechanisms.base import Release
from .text import ItemText, clock_columns, clock_values, long_rows

__all__ = ["ParquetWriter"]


class ParquetWriter:
    """The long format as Parquet (needs pyarrow: ``pip install 'dpstream[parquet]'``).

    One row group per batch of steps; the file is created with the first rows and
    complete when closed. It cannot be truncated and resumed like a text output,
    so a run with ``--state`` writes JSON Lines or CSV (convert afterwards).
    ``before_open`` is called right before the file is made (a check that may raise).
    """

    name = "parquet"

    def __init__(
        self,
        path: str,
        round_counts: bool = False,
        *,
        rows_per_group: int = 65536,
        step_start: Callable[[int], str] | None = None,
        step_end: Callable[[int], str] | None = None,
        before_open: Callable[[], None] | None = None,
    ) -> None:
        self._before_open = before_open
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                "--output-format parquet needs pyarrow: pip install 'dpstream[parquet]'"
            ) from None
        self.round_counts = round_counts
        self._pa = pa
        # a public clock: step_start and step_end columns (ISO-8601)
        self.step_start, self.step_end = step_start, step_end
        self._schema = pa.schema(
            [
                ("t", pa.int64()),
                ("item", pa.string()),
                ("value", pa.int64() if round_counts else pa.float64()),
                ("noise_std", pa.float64()),
                *((name, pa.string()) for name in clock_columns(step_start, step_end)),
            ]
        )
        self._path = path
        self._pq = pq
        self._writer: Any = None  # opened with the first rows: a run refused before any
        # release leaves no file behind (and no empty file in the way of the next run)
        self._rows: list[tuple[Any, ...]] = []  # empty steps, row by row
        self._batches: list[Any] = []  # releases as tables, in order
        self._pending = 0
        self._rows_per_group = rows_per_group
        self._items = ItemText(str)

    def write(self, release: Release) -> None:
        """Add one release's rows (written out a row group at a time)."""
        if len(release.values) == 0:  # an empty step is one row with no item and no value
            self._rows.extend(long_rows(release, self.round_counts, self.step_start, self.step_end))
        else:
            self._flush_rows()
            self._batches.append(self._table(release))
            self._pending += len(release.values)
        if self._pending + len(self._rows) >= self._rows_per_group:
            self._flush()

    def _table(self, release: Release) -> Any:
        """A release of at least one item as an Arrow table of the long format."""
        pa = self._pa
        n = len(release.values)
        std = release.meta.get("noise_std") if release.meta else None
        values = np.asarray(release.values, dtype=np.float64)
        if self.round_counts:
            values = np.rint(values).astype(np.int64)
        clock = [
            pa.array([when], pa.string()).take(pa.array(np.zeros(n, np.int64)))
            for when in clock_values(int(release.t), self.step_start, self.step_end)
        ]
        return pa.table(
            [
                pa.array(np.full(n, int(release.t), dtype=np.int64)),
                self._items(release.items),
                pa.array(values, type=self._schema[2].type),
                pa.array(
                    np.full(n, np.nan if std is None else float(std)), mask=np.full(n, std is None)
                ),
                *clock,
            ],
            schema=self._schema,
        )

    def _flush_rows(self) -> None:
        if self._rows:
            cols = list(zip(*self._rows, strict=True))
            self._batches.append(
                self._pa.table(
                    [
                        self._pa.array(c, type=f.type)
                        for c, f in zip(cols, self._schema, strict=True)
                    ],
                    schema=self._schema,
                )
            )
            self._pending += len(self._rows)
            self._rows = []

    def _flush(self) -> None:
        self._flush_rows()
        if self._batches:
            if self._writer is None:
                if self._before_open is not None:  # e.g. the path still leads where it did
                    self._before_open()
                # the item column is written plain (Snappy still compresses it): a
                # dictionary and min/max statistics of up to a domain's items in every
                # row group cost more than the rest of the file (3x the writer's CPU
                # over a 10^5-item domain) and saved nothing measurable in size
                others = [name for name in self._schema.names if name != "item"]
                self._writer = self._pq.ParquetWriter(
                    self._path, self._schema, use_dictionary=others, write_statistics=others
                )
            self._writer.write_table(self._pa.concat_tables(self._batches))
            self._batches, self._pending = [], 0

    def close(self) -> None:
        """Write the rows held and complete the file (none if no row was ever given)."""
        self._flush()
        if self._writer is not None:
            self._writer.close()
