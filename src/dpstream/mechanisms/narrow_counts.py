"""True counts kept as int32 while the largest fits, int64 from then on.

A mechanism's true counts are its largest per-item array after the noise state;
int32 halves them (4 bytes per item) for every stream whose largest count stays
below 2^31 - 1, which is nearly all. The switch is decided by the exact largest
count (each mechanism tracks it), never by the stream's volume, and a wider
array is made before any value that needs it is written, so no count is ever
truncated. Releases add the counts to float64 noise: an int32 and an int64 count
of the same value convert to the same float64, so the releases are the same bits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INT32_MAX", "widened", "store"]

#: The largest count an int32 array of counts holds (a module global so that
#: tests can lower it).
INT32_MAX = int(np.iinfo(np.int32).max)


def widened(counts: np.ndarray, top: int) -> np.ndarray:
    """``counts`` itself while its type holds ``top``, else an int64 copy of it."""
    if top > INT32_MAX and counts.dtype != np.int64:
        return counts.astype(np.int64)
    return counts


def store(dest: np.ndarray, counts: np.ndarray, top: int) -> np.ndarray:
    """Copy ``counts`` (whose largest value is ``top``) into ``dest``, a mechanism's
    own array of the same shape, and return the array that now holds them: ``dest``
    while its type holds ``top``, else a new int64 array (``dest`` is overwritten
    whole, so it is not copied first). A caller's array is never kept."""
    if top > INT32_MAX and dest.dtype != np.int64:
        dest = np.empty(counts.shape, dtype=np.int64)
    np.copyto(dest, counts, casting="unsafe")  # safe: every value is <= top
    return dest
