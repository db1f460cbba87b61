"""What every one-shot mechanism shares: its result type, input parsing and checks.

Noise addressing (the one-shot convention of dpstream): a call builds
``NoiseSource(key, purpose)`` and draws, per item, at address
``(level=0, index=0, draw=d)`` with one draw number per stage --
:data:`GUMBEL_DRAW` for a Gumbel selection, :data:`GAUSSIAN_DRAW` for the
Gaussian counts -- and a threshold's noise with ``source.scalar`` at the same
draw numbers. So the stages of one item are independent, and two calls with
different purposes are independent. **Never call a one-shot function twice with
the same key and purpose on different histograms**: the noise would repeat and
the difference of the outputs would be exact. That is why ``purpose`` has no
default.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .._checks import series_items
from ..noise import canonical_item

__all__ = [
    "GAUSSIAN_DRAW",
    "GUMBEL_DRAW",
    "OneShotRelease",
    "UnknownDomainResult",
    "check_tau",
    "histogram_arrays",
]

#: Draw number of the Gumbel (selection) noise of a one-shot call.
GUMBEL_DRAW = 0
#: Draw number of the Gaussian (count) noise of a one-shot call.
GAUSSIAN_DRAW = 1


@dataclass(frozen=True, eq=False)
class OneShotRelease:
    """The output of a one-shot mechanism.

    Attributes:
        items: the released items: for a top-k or unknown-domain mechanism in
            release order (largest noisy value first), else in input order.
        values: their noisy counts (float64, read-only), aligned with ``items``,
            or ``None`` when only a selection was asked for (``with_counts=False``).
        hit_threshold: for the unknown-domain mechanisms, whether the list ended
            at the noisy threshold (the paper's ``bot`` output): always True for
            UnkGauss, which returns everything above it; for UnkGumb, True when
            fewer than k items beat it. ``None`` for the known-domain mechanisms.
    """

    items: tuple[Hashable, ...]
    values: np.ndarray | None
    hit_threshold: bool | None = None

    @cached_property
    def counts(self) -> dict[Hashable, float]:
        """``item -> noisy count``, in release order (needs ``values``)."""
        if self.values is None:
            raise ValueError("this release holds the selection only (with_counts=False)")
        return dict(zip(self.items, self.values.tolist(), strict=True))

    def rounded(self) -> OneShotRelease:
        """The same release with counts rounded to integers: publish this (see
        :meth:`dpstream.Release.rounded` for the floating-point reason)."""
        values = None if self.values is None else np.rint(self.values).astype(np.int64)
        return OneShotRelease(self.items, values, self.hit_threshold)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        if self.values is None:
            body = ", ".join(repr(it) for it in self.items[:5])
        else:
            body = ", ".join(f"{it!r}: {v:.2f}" for it, v in list(self.counts.items())[:5])
        more = "" if len(self) <= 5 else f", ... ({len(self)} items)"
        tail = "" if self.hit_threshold is None else f", hit_threshold={self.hit_threshold}"
        return f"OneShotRelease({{{body}{more}}}{tail})"


#: The result of the unknown-domain mechanisms: the same type under a second name, so that
#: code that imports this name keeps working.
UnknownDomainResult = OneShotRelease


def check_tau(tau: object) -> float:
    """The noise scale: a positive, finite real number."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float, np.integer, np.floating)):
        raise TypeError(f"tau must be a real number, got {type(tau).__name__} {tau!r}")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be positive and finite, got tau={tau!r}")
    return float(tau)


def histogram_arrays(
    counts: object, items: Sequence[Hashable] | None = None
) -> tuple[list[Hashable], np.ndarray]:
    """A histogram as (canonical items, int64 counts).

    Accepts a Mapping ``item -> count`` (or a pandas Series indexed by item, read
    as that Mapping, never by position), a pair ``(items, counts)`` of parallel
    sequences, or an integer array with ``items=`` aligned with it. Items must
    be distinct str, int or bytes (two equal items would share noise, making
    their difference exact); counts must be ints >= 0.
    """
    counts = series_items(counts)
    if isinstance(counts, Mapping):
        if items is not None:
            raise ValueError("give items= only with an array of counts, not with a Mapping")
        item_list, raw = list(counts.keys()), list(counts.values())
    elif items is None and isinstance(counts, tuple) and len(counts) == 2:
        if isinstance(counts[0], (str, bytes)):
            raise TypeError("counts as a pair must be (items, counts), two sequences")
        item_list, raw = list(counts[0]), list(counts[1])
        if len(item_list) != len(raw):
            raise ValueError(
                f"items and counts must have the same length, got {len(item_list)} and {len(raw)}"
            )
    elif items is not None:
        if isinstance(items, (str, bytes)):
            raise TypeError("items must be a collection of items, not a single string")
        item_list = list(items)
        arr = np.asarray(counts)
        if arr.shape != (len(item_list),):
            raise ValueError(
                f"counts must have one entry per item ({len(item_list)}), got shape {arr.shape}"
            )
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"counts must be integers, got dtype {arr.dtype}")
        raw = arr.astype(np.int64).tolist()
    else:
        raise TypeError(
            "counts must be a Mapping item -> count, a pair (items, counts), or an array "
            f"with items= (the domain, aligned with it); got {type(counts).__name__}"
        )
    try:
        item_list = [canonical_item(item) for item in item_list]
    except TypeError as exc:
        raise TypeError(f"items: {exc}") from None
    if len(set(item_list)) != len(item_list):
        raise ValueError("items must be distinct")
    for item, value in zip(item_list, raw, strict=True):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"counts must be integers, got {value!r} for item {item!r}")
    arr = np.array(raw, dtype=np.int64) if raw else np.zeros(0, dtype=np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError("counts must be >= 0")
    return item_list, arr
