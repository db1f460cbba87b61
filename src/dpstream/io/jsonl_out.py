"""JSON Lines output: a line per step (``jsonl``) or a row per released item (``jsonl-long``).

Layer 6 of dpstream (an edge). The formats are described in
:mod:`dpstream.io.text`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ..mechanisms.base import Release
from .text import (
    JSON_SPECIAL,
    JSON_SPECIAL_BYTES,
    LONG_COLUMNS,
    Formatter,
    ItemText,
    LongFormatter,
    RowPieces,
    clock_values,
    int_rows,
    join_text,
    json_default,
    json_key,
    long_rows,
    meta_text,
    plain_int_rows,
    release_values,
    value_text,
)

__all__ = ["JsonlFormatter", "JsonlLongFormatter"]


class JsonlFormatter(Formatter):
    """``{"t": 3, "released": {item: count, ...}}`` per line (see the module docstring)."""

    name = "jsonl"

    def __init__(self, round_counts: bool = False) -> None:
        self.round_counts = round_counts
        self._keys = self._text = ItemText(json_key, JSON_SPECIAL, '"')

    def header(self) -> bytes:
        return b""

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as :meth:`_format_rows`, built by Arrow's string kernels."""
        import pyarrow.compute as pc

        tail = "}" + meta_text(release)
        head = f'{{"t": {int(release.t)}, "released": {{'
        if self.round_counts:
            pieces = RowPieces(
                b"", b": ", b"", b", ", head.encode(), (tail + "}\n").encode("utf-8")
            )
            whole = int_rows(self._keys, release, pieces)
            if whole is not None:
                return whole
        vals = value_text(release, self.round_counts)
        if vals is None:
            return None
        pairs = pc.binary_join_element_wise(self._keys(release.items), vals, ": ")
        return (head + join_text(pairs, ", ") + tail + "}\n").encode("utf-8")

    def _format_rows(self, release: Release) -> bytes:
        if self.round_counts and len(release.values):
            pieces = RowPieces(
                b'"',
                b'": ',
                b"",
                b", ",
                f'{{"t": {int(release.t)}, "released": {{'.encode(),
                ("}" + meta_text(release) + "}\n").encode("utf-8"),
            )
            whole = plain_int_rows(release.items, release.values, JSON_SPECIAL_BYTES, pieces)
            if whole is not None:
                return whole
        return self._format_dict(release)

    def _format_dict(self, release: Release) -> bytes:
        """The reference: the release as a dict through ``json.dumps``."""
        values = release_values(release, self.round_counts)
        released = {str(k): v for k, v in zip(release.items, values, strict=True)}
        obj: dict[str, Any] = {"t": int(release.t), "released": released}
        if release.meta:
            obj["meta"] = dict(release.meta)
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=json_default)
        if len(released) < len(values):
            # two items with one text (1 and "1"): a dict would keep only the last
            # pair; write one pair per item, as the columnar path does
            pairs = ", ".join(
                f"{json_key(k)}: {json.dumps(v, allow_nan=False)}"
                for k, v in zip(release.items, values, strict=True)
            )
            text = f'{{"t": {int(release.t)}, "released": {{{pairs}}}{meta_text(release)}}}'
        return (text + "\n").encode("utf-8")


class JsonlLongFormatter(LongFormatter):
    """The long format as JSON Lines: ``{"t", "item", "value", "noise_std"}`` per row
    (``item`` and ``value`` null for a step that releases no item), and with a public
    clock ``"step_start"`` and ``"step_end"``."""

    name = "jsonl-long"

    def _new_cells(self) -> ItemText:
        return ItemText(json_key, JSON_SPECIAL, '"')

    def header(self) -> bytes:
        return b""

    def _format_rows(self, release: Release) -> bytes:
        columns = LONG_COLUMNS + self._clock
        return "".join(
            json.dumps(dict(zip(columns, row, strict=True)), ensure_ascii=False, allow_nan=False)
            + "\n"
            for row in long_rows(release, self.round_counts, self.step_start, self.step_end)
        ).encode("utf-8")

    def _format_columns(self, release: Release) -> bytes | None:
        """The same bytes as the row by row path, built by Arrow's string kernels."""
        import pyarrow as pa
        import pyarrow.compute as pc

        std = release.meta.get("noise_std") if release.meta else None
        if isinstance(std, float) and not math.isfinite(std):
            return None
        head = f'{{"t": {int(release.t)}, "item": '
        clock = "".join(
            f', "{name}": {json.dumps(value)}'
            for name, value in zip(
                self._clock,
                clock_values(int(release.t), self.step_start, self.step_end),
                strict=True,
            )
        )
        tail = f', "noise_std": {json.dumps(std)}{clock}}}'
        joined = (
            int_rows(
                self._cells,
                release,
                RowPieces(head.encode(), b', "value": ', tail.encode(), b"\n", last=b"\n"),
            )
            if self.round_counts
            else None
        )
        if joined is not None:
            return joined
        vals = value_text(release, self.round_counts)
        if vals is None:
            return None
        n = len(vals)
        const = pa.array([head, ', "value": ', tail], pa.string())
        rows = pc.binary_join_element_wise(
            const.take(pa.array(np.zeros(n, np.int64))),
            self._cells(release.items),
            const.take(pa.array(np.ones(n, np.int64))),
            vals,
            const.take(pa.array(np.full(n, 2, np.int64))),
            "",
        )
        return (join_text(rows, "\n") + "\n").encode("utf-8")
