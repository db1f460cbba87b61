"""Optional compiled loops (the C module ``dpstream._loops``), the same bits as their NumPy twins.

Layer 1: NumPy and the C module; nothing else of dpstream. A few hot loops of
the noise are a sequence of short NumPy passes over a chunk: the ziggurat's
fast path is eight of them for what is, per value, one table look-up, one
comparison and one multiplication. In C, such a loop reads each block once.
The module also holds the item table's hash, probe and compare loops
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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["ENV", "MIN_ITEMS", "enabled", "loops", "numpy_only", "ziggurat"]

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

    return loops


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


def ziggurat(blocks: np.ndarray, out: np.ndarray, table: Any, pending: np.ndarray,
             close: np.ndarray) -> tuple[int, int, int] | None:
    """The ziggurat over a chunk, compiled, but for three rare kinds of points.

    Writes every block's value into ``out`` (see :func:`dpstream.ziggurat.normals_into`)
    except for points it leaves to the caller with ``out = +-u x[i]``: points
    above the curve (to restart) at ``pending[:n_restart]``, points in the tail
    region at ``pending[c - n_tail:]``, and points within a few ulps of the curve
    (to decide exactly) at ``close[:n_close]``. Returns ``(n_restart, n_tail,
    n_close)``, or None (nothing written) when the chunk is small, the loops
    are off, or the blocks are not in the machine's byte order (the ``"<u8"``
    blocks of a big-endian machine: the C loop reads native words).
    """
    if blocks.shape[0] < MIN_ITEMS or not blocks.dtype.isnative:
        return None
    loops = _loops()
    if loops is None:
        return None
    return loops.ziggurat(blocks, out, table.scaled, table.limit, table.bottom, table.rise,
                          pending, close)
