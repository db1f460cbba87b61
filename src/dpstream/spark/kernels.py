"""What runs inside a Spark executor: keyed tree noise over a batch of items.

Pure NumPy/pandas (no PySpark import), so the arithmetic can be read and tested
on its own. Each function takes one pandas batch of items, as
``DataFrame.mapInPandas`` hands them over, and returns the released rows.

Bit-identity with the local engine is by construction, not by re-derivation:
every batch builds the local engine's own :class:`~dpstream.noise.NoiseSource`
and :class:`~dpstream.mechanisms.tree_noise.TreeNoise` for the mechanism's
tree purpose and advances it to the release step. ``TreeNoise`` performs the
same floating-point operations in the same order whether it reaches t one step
at a time or in one jump, so a batch of items on an executor gets exactly the
noise the local mechanism adds to the same items, and the released value is
the same int64 + float64 addition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..mechanisms.tree_noise import TreeNoise
from ..noise import NoiseKey, NoiseSource

__all__ = ["ReleaseSpec", "release_step_batch", "release_steps_batch"]

#: Mechanism names a spec may carry.
KNOWN = "KnownBase"
UNKNOWN = "UnkBase"


@dataclass(frozen=True)
class ReleaseSpec:
    """The parameters an executor needs, fixed on the driver (no secret inside).

    Built from the local mechanism class (see ``dpstream.spark.releases``), so
    the noise scale, base and threshold are the local engine's own numbers.

    Attributes:
        mechanism: ``"KnownBase"`` or ``"UnkBase"``.
        horizon: T.
        base: the tree base r.
        cell_std: the standard deviation of each tree cell's noise, sqrt(L_r) tau.
        purpose: the noise purpose of the stream's tree cells.
        threshold: UnkBase's m_delta (an item is released iff its noisy count is
            above it); ``None`` for KnownBase.
        remember: UnkBase only: an item released once stays released.
    """

    mechanism: str
    horizon: int
    base: int
    cell_std: float
    purpose: str
    threshold: float | None = None
    remember: bool = False

    def __post_init__(self) -> None:
        if self.mechanism not in (KNOWN, UNKNOWN):
            raise ValueError(f"mechanism must be {KNOWN!r} or {UNKNOWN!r}, got {self.mechanism!r}")
        if (self.mechanism == UNKNOWN) != (self.threshold is not None):
            raise ValueError("threshold is set for UnkBase and only for UnkBase")

    def tree_noise(self, source: NoiseSource, items: Sequence[object]) -> TreeNoise:
        """A fresh TreeNoise at t = 0 holding ``items`` (prepared under ``source``)."""
        noise = TreeNoise(source, self.horizon, self.base, self.cell_std)
        noise.add_items(source.prepare(items))
        return noise


def _items_list(column: pd.Series) -> list[object]:
    """Items as Python values (str, int, bytes), refusing nulls."""
    if column.isna().any():
        raise ValueError("the item column holds a null item")
    return column.tolist()


def _counts_array(column: pd.Series) -> np.ndarray:
    if column.isna().any():
        raise ValueError("the count column holds a null count")
    counts = column.to_numpy()
    if counts.dtype.kind not in "iu":
        raise TypeError(f"counts must be integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        raise ValueError("counts must be >= 0")
    return counts


def release_step_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: ReleaseSpec,
    key_bytes: bytes,
    t: int,
    item_col: str,
    count_col: str,
    shown_col: str | None = None,
) -> Iterator[pd.DataFrame]:
    """The noisy counts at step t of the (item, prefix count) rows of one partition.

    Yields every row with columns item, count, ``released`` (bool) and
    ``value`` (float64, the noisy count). KnownBase releases every row. UnkBase
    releases a row when its item has appeared (count > 0) and its noisy count
    is above the threshold, or, with ``remember``, when ``shown_col`` says the
    item was released at an earlier step; ``released`` is then the flag to
    carry to the next step.
    """
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), spec.purpose)
    for pdf in batches:
        if len(pdf) == 0:
            continue
        items = _items_list(pdf[item_col])
        counts = _counts_array(pdf[count_col])
        noise = spec.tree_noise(source, items)
        noise.advance(t)
        values = counts + noise.noise()
        if spec.mechanism == UNKNOWN:
            released = (counts > 0) & (values > spec.threshold)
            if spec.remember and shown_col is not None:
                released |= pdf[shown_col].fillna(False).to_numpy(dtype=bool)
        else:
            released = np.ones(len(pdf), dtype=bool)
        yield pd.DataFrame({item_col: pdf[item_col].reset_index(drop=True), count_col: counts,
                            "released": released, "value": values})


def _increment_matrix(ts: pd.Series, ns: pd.Series, steps: np.ndarray, n_items: int
                      ) -> np.ndarray:
    """Prefix counts at each release step, shape (len(steps), n_items), from per-item lists.

    Row i of ``ts``/``ns`` lists the steps at which item i's count grew and by
    how much. An increment at step s counts from the first release step >= s.
    """
    lengths = np.fromiter((0 if x is None else len(x) for x in ts), dtype=np.int64,
                          count=n_items)
    counts = np.zeros((len(steps), n_items), dtype=np.int64)
    if lengths.sum() == 0:
        return counts
    flat_t = np.concatenate([np.asarray(x, dtype=np.int64) for x in ts if x is not None
                             and len(x)])
    flat_n = np.concatenate([np.asarray(x, dtype=np.int64) for x in ns if x is not None
                             and len(x)])
    owner = np.repeat(np.arange(n_items), lengths)
    row = np.searchsorted(steps, flat_t, side="left")
    inside = row < len(steps)
    np.add.at(counts, (row[inside], owner[inside]), flat_n[inside])
    np.cumsum(counts, axis=0, out=counts)
    return counts


def release_steps_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: ReleaseSpec,
    key_bytes: bytes,
    steps: Sequence[int],
    item_col: str,
    ts_col: str,
    ns_col: str,
) -> Iterator[pd.DataFrame]:
    """Release every step in ``steps`` for the items of one partition, in one pass.

    Each row holds an item and two aligned lists: the steps at which its count
    grew (``ts_col``) and the increments (``ns_col``). The tree noise advances
    step by step through ``steps`` (the incremental path, bit-identical to the
    from-scratch one). Output columns: ``t``, item, ``value``.
    """
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), spec.purpose)
    steps_arr = np.asarray(sorted(steps), dtype=np.int64)
    for pdf in batches:
        n = len(pdf)
        if n == 0:
            continue
        items = _items_list(pdf[item_col])
        counts = _increment_matrix(pdf[ts_col], pdf[ns_col], steps_arr, n)
        noise = spec.tree_noise(source, items)
        shown = np.zeros(n, dtype=bool)
        item_series = pdf[item_col].reset_index(drop=True)
        for i, t in enumerate(steps_arr.tolist()):
            noise.advance(t)
            values = counts[i] + noise.noise()
            if spec.mechanism == UNKNOWN:
                keep = (counts[i] > 0) & (values > spec.threshold)
                if spec.remember:
                    shown |= keep
                    keep = shown.copy()
                if not keep.any():
                    continue
                yield pd.DataFrame({"t": np.full(int(keep.sum()), t, dtype=np.int64),
                                    item_col: item_series[keep].reset_index(drop=True),
                                    "value": values[keep]})
            else:
                yield pd.DataFrame({"t": np.full(n, t, dtype=np.int64), item_col: item_series,
                                    "value": values})
