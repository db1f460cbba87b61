"""Optional compiled loops (the C module ``dpstream._loops``), the same bits as their NumPy twins.

Layer 1: NumPy and the C module; nothing else of dpstream. A few hot loops of
the noise are a sequence of short NumPy passes over a chunk: the ziggurat's
fast path is eight of them for what is, per value, one table look-up, one
comparison and one multiplication. In C, such a loop reads each block once.
The module also hashes items (SHA-256 and keyed BLAKE2b, the bytes of
:mod:`hashlib`, with the x86 SHA extensions where the CPU has them) and holds
the item table's hash, probe and compare loops
(:mod:`dpstream.mechanisms.item_table`), which find items among the stored
UTF-8 bytes without a Python object per stored item.
Each C loop performs, per element, the IEEE double operations of its NumPy
twin in the same order (it is compiled with ``-ffp-contract=off`` and without
fast-math), so whether it runs never changes a value: ``tests/test_compiled.py``
checks that bit for bit against the NumPy path.

The C module is built by ``pip install`` when a C compiler is there, and is
optional: without it, dpstream runs the NumPy code (same values, slower). Why
C and not Numba: the loops are small, and Numba would add ~140 MB of resident
memory and ~0.2 s to load to every process that draws a large batch.

``$DPSTREAM_COMPILED`` decides, once per process:

* ``0``: the NumPy path;
* ``1``: the C loops, and an error if they are not built (CI sets this);
* unset: the C loops when built, else the NumPy path, silently.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = [
    "ENV",
    "blt_step",
    "MIN_ITEMS",
    "enabled",
    "fingerprint_sum",
    "item_digests_into",
    "loops",
    "ndtri_check_points",
    "ndtri_enabled",
    "numpy_only",
    "ziggurat",
    "ziggurat_restarts",
]

#: Environment variable: "0" turns the compiled loops off, "1" requires them.
ENV = "DPSTREAM_COMPILED"
#: Chunks smaller than this stay on the NumPy path (a call's set-up costs ~1 us).
MIN_ITEMS = 64

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _mode() -> str:
    text = os.environ.get(ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{ENV} must be 0, 1 or unset, got {text!r}")
    return text


def _build() -> Any:
    """Import the compiled module; raises ImportError when it was not built."""
    from . import _loops as loops

    _state["ndtri"] = _attach_ndtri(loops)
    return loops


def ndtri_check_points() -> np.ndarray:
    """Where the C loops' ndtri must give the ufunc's bits before they use it.

    The uniforms ``((w >> 11) + 1/2) 2^-53`` of 8192 words spread over 64 bits
    (the restarts' inputs), the same times the ziggurat's tail probability
    (the tail's inputs, see :mod:`dpstream.ziggurat`), and the extremes.
    """
    w = np.arange(1, 8193, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    u = ((w >> np.uint64(11)).view(np.int64) + 0.5) * 2.0**-53
    k = np.array([0, 1, 2**52 - 1, 2**52, 2**53 - 2, 2**53 - 1], dtype=np.int64)
    edges = np.concatenate([(k + 0.5) * 2.0**-53, [1e-300, 1e-20, 0.975]])
    return np.concatenate([u, u * _TAIL_PROBABILITY, edges])


#: About P(Z > r) of the shipped ziggurat (data/ziggurat256.json), for the check
#: points: only that they cover the tail's range matters, not the last digit.
_TAIL_PROBABILITY = 1.29e-4


def _attach_ndtri(loops: Any) -> bool:
    """Hand SciPy's ndtri to the C loops if it gives the ufunc's bits; whether it did.

    ``scipy.special.cython_special`` exports, as a capsule, the C function that
    the ``scipy.special.ndtri`` ufunc runs. With it the ziggurat's rare points
    (the tail, the restarts) are drawn in C instead of by a dozen NumPy calls
    per chunk. It is checked on :func:`ndtri_check_points` first: any bit that
    differs from the ufunc, or a SciPy without the capsule, and the C loops
    leave those points to the NumPy code (the same values, more slowly).
    """
    try:
        from .special import cython_special, ndtri

        loops.set_ndtri(cython_special.__pyx_capi__["ndtri"])
        p = ndtri_check_points()
        got = np.empty_like(p)
        loops.ndtri_into(p, got)
        if np.array_equal(got.view(np.int64), ndtri(p).view(np.int64)):
            return True
    except Exception:  # any failure: the NumPy code, as before
        pass
    loops.set_ndtri(None)
    return False


def _loops() -> Any:
    """The compiled loops, or None when they are off or unavailable."""
    loops = _state.get("loops", False)
    if loops is not False:
        return loops
    with _lock:
        if "loops" in _state:
            return _state["loops"]
        mode = _mode()
        if mode == "0":
            _state["loops"] = None
        else:
            try:
                _state["loops"] = _build()
            except Exception:
                if mode == "1":
                    raise
                _state["loops"] = None
        return _state["loops"]


def loops() -> Any:
    """The C module when the loops are on, else None (for code that calls it directly)."""
    return _loops()


def enabled() -> bool:
    """Whether the compiled loops run in this process."""
    return _loops() is not None


def ndtri_enabled() -> bool:
    """Whether the compiled loops draw the ziggurat's tail and restarts themselves
    (SciPy's ndtri in C, checked against the ufunc: see :func:`_attach_ndtri`)."""
    return _loops() is not None and bool(_state.get("ndtri"))


@contextmanager
def numpy_only() -> Iterator[None]:
    """Run the NumPy path inside the block, for tests and benchmarks that compare the two.

    Process-wide (not per thread): meant for a test or a benchmark, not for
    code that runs beside other work.
    """
    _loops()
    saved = _state["loops"]
    _state["loops"] = None
    try:
        yield
    finally:
        _state["loops"] = saved


def _in_place(a: np.ndarray, dtype: type, size: int) -> bool:
    """Whether the C loops can write ``a`` where it is: a writable C-contiguous
    vector of at least ``size`` native ``dtype`` values."""
    return (
        a.ndim == 1
        and a.shape[0] >= size
        and a.dtype == dtype
        and a.dtype.isnative
        and a.flags.c_contiguous
        and a.flags.writeable
    )


def ziggurat(
    blocks: np.ndarray, out: np.ndarray, table: Any, pending: np.ndarray, close: np.ndarray
) -> tuple[int, int, int] | None:
    """The ziggurat over a chunk, compiled, but for three rare kinds of points.

    Writes every block's value into ``out`` (see :func:`dpstream.ziggurat.normals_into`)
    except for points it leaves to the caller with ``out = +-u x[i]``: points
    above the curve (to restart) at ``pending[:n_restart]``, points in the tail
    region at ``pending[c - n_tail:]`` (none when :func:`ndtri_enabled`: then
    the C loop draws them), and points within a few ulps of the curve (to
    decide exactly) at ``close[:n_close]``. Returns ``(n_restart, n_tail,
    n_close)``, or None (nothing written) when the chunk is small, the loops
    are off, the blocks are not (c, 2) uint64 in the machine's byte order (the
    ``"<u8"`` blocks of a big-endian machine: the C loop reads native words),
    or ``out`` (c values), ``pending`` or ``close`` (at least c) are not
    writable C-contiguous native float64 and int64 vectors: the NumPy path then
    computes them as it is given them. Blocks in another layout (rows taken
    with a step) are read from a C-contiguous copy: the same words.
    """
    c = blocks.shape[0]
    if (
        c < MIN_ITEMS
        or blocks.shape != (c, 2)
        or blocks.dtype != np.uint64
        or not blocks.dtype.isnative
        or out.shape != (c,)
        or not _in_place(out, np.float64, c)
        or not _in_place(pending, np.int64, c)
        or not _in_place(close, np.int64, c)
    ):
        return None
    loops = _loops()
    if loops is None:
        return None
    return loops.ziggurat(
        np.ascontiguousarray(blocks),
        out,
        table.scaled,
        table.limit,
        table.bottom,
        table.rise,
        pending,
        close,
        table.tail_probability,
    )


def ziggurat_restarts(words: np.ndarray, pending: np.ndarray, out: np.ndarray) -> bool:
    """``out[pending[i]] = ndtri(u(words[i]))`` in C, u the uniform of
    :func:`dpstream.ziggurat.uniforms_from_words`; False (nothing
    written) when the loops or their ndtri are off, or ``out`` is not a
    writable C-contiguous native float64 vector (the NumPy path writes it where
    it is). ``words`` and ``pending`` are read from copies when they share
    memory with ``out`` (the C loop refuses that; NumPy reads them before it
    writes)."""
    if not ndtri_enabled() or not _in_place(out, np.float64, 0):
        return False
    words = np.ascontiguousarray(words, dtype=np.uint64)
    pending = np.ascontiguousarray(pending, dtype=np.int64)
    if np.may_share_memory(words, out):
        words = words.copy()
    if np.may_share_memory(pending, out):
        pending = pending.copy()
    _loops().ziggurat_restarts(words, pending, out)
    return True


def fingerprint_sum(
    items: list[Any] | tuple[Any, ...], prefix: bytes, encode: Callable[[Any], bytes]
) -> int | None:
    """``sum(int.from_bytes(sha256(prefix + encode(x)).digest()[:16], "big"))`` mod
    2^128 over ``items`` in C, or None (nothing computed) when the loops are off.

    ``encode`` must be :func:`dpstream.noise.encode_item`: the C loop encodes str,
    int and bytes items by its rules itself and calls ``encode`` for the others.
    """
    loops = _loops()
    if loops is None:
        return None
    hi, lo = loops.sha256_sum(items, prefix, encode)
    return (int(hi) << 64) | int(lo)


def item_digests_into(
    items: list[Any] | tuple[Any, ...],
    key: bytes,
    encode: Callable[[Any], bytes],
    out: np.ndarray,
) -> bool:
    """``blake2b(encode(x), key=key, digest_size=16)`` of every item in C, into the
    ``(len(items), 2)`` ``"<u8"`` rows ``out`` (the digests' bytes); False (nothing
    written) when the loops are off or the machine is big-endian. ``encode``: as
    :func:`fingerprint_sum`.
    """
    loops = _loops()
    if loops is None or sys.byteorder != "little":
        return False
    loops.blake2b_ids(items, key, encode, out)
    return True


def blt_step(
    theta: Sequence[float],
    omega: Sequence[float],
    buffers: np.ndarray,
    total: np.ndarray,
    z: np.ndarray,
) -> bool:
    """:func:`dpstream.factorization.stream_step` in C (one pass over each item's
    state instead of 4k + 1 NumPy passes; the same operations, so the same bits), or
    False (nothing changed) when the loops are off or an array is not native
    float64 in the layout the loop reads (rows of ``buffers`` contiguous; ``total``
    and ``z`` contiguous)."""
    loops = _loops()
    if loops is None:
        return False
    for a in (buffers, total, z):
        if a.dtype != np.float64 or not a.dtype.isnative:
            return False
    if buffers.ndim != 2:
        return False
    if buffers.shape[0] and (buffers.strides[1] != 8 or buffers.strides[0] % 8):
        return False  # (no buffers, none read: any strides)
    if not (total.flags.c_contiguous and z.flags.c_contiguous):
        return False
    loops.blt_step(
        np.asarray(theta, dtype=np.float64), np.asarray(omega, dtype=np.float64), buffers, total, z
    )
    return True


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest ``values``, largest first; among equal values
    the smaller index first (so the choice is a function of the values alone).

    ``values``: float64. A NaN (no release has one) ranks below every number,
    and the NaNs' order is NumPy's: the compiled loop leaves such a call to the
    NumPy twin. The compiled loop keeps a heap of k indices in one pass (O(n log k)); the NumPy
    twin is ``argpartition`` at the k-th value, then the tied values at the
    boundary taken by smaller index.
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    n = values.shape[0]
    k = max(0, min(int(k), n))
    loops = _loops()
    if loops is not None and values.dtype.isnative:
        out = np.empty(k, dtype=np.int64)
        if loops.top_k(values, out):
            return out
    return _top_k_numpy(values, k)


def _top_k_numpy(values: np.ndarray, k: int) -> np.ndarray:
    """:func:`top_k` with NumPy only (its twin, the same indices)."""
    n = values.shape[0]
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k < n and np.isnan(values).any():
        idx = np.argpartition(-values, k - 1)[:k]  # NaN sorts last, as below
    elif k < n:
        neg = -values
        kth = neg[np.argpartition(neg, k - 1)[k - 1]]  # the k-th largest value, negated
        above = np.flatnonzero(neg < kth)
        tied = np.flatnonzero(neg == kth)[: k - above.shape[0]]
        idx = np.concatenate([above, tied])
    else:
        idx = np.arange(n)
    return idx[np.lexsort((idx, -values[idx]))].astype(np.int64, copy=False)
