"""The chunked keyed-noise kernel: noise for many items, one cache-sized chunk at a time.

Layer 2, under :mod:`dpstream.noise` (which defines the values and owns the
keys). A step of a mechanism over n items draws n values per tree cell that
changed. Done over the whole batch at once, every stage (tweak XOR, AES, the
53-bit uniform, the inverse CDF, the addition into the running sums) reads and
writes an n-long temporary in main memory, and at 10^7 items the step is bound
by that traffic. Here the same stages run over ``CHUNK_ITEMS`` items at a time
in per-thread scratch buffers that stay in a core's L2 cache, so main memory
sees only the prepared ids read once and the destination read and written once.

Every stage performs, per item, exactly the floating-point operations of the
whole-batch definition (:meth:`dpstream.noise.NoiseSource.to_uniform` and its
siblings), in the same order, so the values are the same bits whatever the
chunk size, the number of threads, or where an item falls in a chunk.
``tests/test_noise_kernel.py`` checks that against an independent per-block
implementation of the PRF.

Threads: the AES of ``cryptography`` and SciPy's ``ndtri`` release the GIL,
so chunks can run on several cores (:func:`set_threads`). Every value is a pure
function of its address and every chunk writes its own slice of the output,
so the result does not depend on the number of threads or on scheduling.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .special import ndtri
from .ziggurat import normals_into, uniforms_from_words

__all__ = [
    "CHUNK_ITEMS",
    "DISTRIBUTIONS",
    "THREADS_ENV",
    "ZIGGURAT",
    "Workspace",
    "chunk_bounds",
    "encrypt_chunk",
    "get_threads",
    "noise_chunk",
    "retry_words",
    "run_tasks",
    "set_threads",
    "tweak_tile",
    "workspace",
]

#: Items per chunk. A chunk's scratch (two 16-byte blocks and two floats per
#: item, ~0.8 MB at 16384) fits a core's L2 cache with room for the rows it
#: updates; larger chunks spill, much smaller ones pay NumPy's per-call cost.
CHUNK_ITEMS = 16384

#: The distributions the kernel draws (see :class:`dpstream.noise.NoiseSource`).
DISTRIBUTIONS = ("uniform", "gaussian", "laplace", "gumbel")
#: The kernel's name for noise version 2's Gaussian (the ziggurat,
#: :mod:`dpstream.ziggurat`); "gaussian" is version 1's inverse CDF.
ZIGGURAT = "gaussian-v2"


def chunk_bounds(n: int, chunk: int | None = None) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` covering ``range(n)`` in chunks of ``chunk`` items."""
    size = CHUNK_ITEMS if chunk is None else chunk
    if size < 1:
        raise ValueError(f"chunk must be >= 1, got {size}")
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def tweak_tile(w0: int, w1: int, items: int) -> np.ndarray:
    """The tweak words (w0, w1) repeated for ``items`` items, flat.

    XOR against a (2,)-shaped tweak broadcast over (n, 2) runs NumPy's inner
    loop two elements at a time (~5 ns per item); against a flat tile of the
    same length it is one vector loop.
    """
    tile = np.empty((max(items, 1), 2), dtype="<u8")
    tile[:, 0] = w0
    tile[:, 1] = w1
    return tile.reshape(-1)


class Workspace:
    """Scratch buffers for one chunk, owned by one thread (~40 bytes per item in use)."""

    __slots__ = ("size", "x", "u", "raw", "blocks", "f", "g")

    def __init__(self, size: int) -> None:
        self.size = size
        self.x = np.empty(2 * size, dtype="<u8")  # prepared id XOR tweak
        self.u = self.x[:size]  # the 53-bit integers, once x has been encrypted
        # cryptography's update_into wants block_size - 1 spare bytes after the data
        self.raw = bytearray(16 * size + 15)
        self.blocks = np.frombuffer(self.raw, dtype="<u8", count=2 * size).reshape(size, 2)
        self.f = np.empty(size)
        self.g = np.empty(size)


_local = threading.local()


def workspace(size: int) -> Workspace:
    """This thread's workspace for chunks of up to ``size`` items."""
    ws = getattr(_local, "ws", None)
    if ws is None or ws.size < size:
        ws = Workspace(size)
        _local.ws = ws
    return ws


def encrypt_chunk(enc: Any, words: np.ndarray, tile: np.ndarray, ws: Workspace) -> np.ndarray:
    """AES-ECB of ``words XOR tile`` for a chunk of prepared ids; a view into ``ws``.

    ``words`` is the chunk's (c, 2) slice of the prepared ids (C-contiguous),
    ``tile`` a :func:`tweak_tile` of at least c items.
    """
    c = words.shape[0]
    x = ws.x[: 2 * c]
    np.bitwise_xor(words.reshape(-1), tile[: 2 * c], out=x)
    enc.update_into(x.data.cast("B"), ws.raw)
    return ws.blocks[:c]


def retry_words(retry_enc: Any, rows: np.ndarray) -> np.ndarray:
    """The first word of AES(block) under the retry key, for (k, 2) blocks."""
    if retry_enc is None:
        raise ValueError("the ziggurat needs the purpose's retry encryptor")
    raw = bytearray(rows.nbytes + 15)
    n = retry_enc.update_into(np.ascontiguousarray(rows, "<u8").data.cast("B"), raw)
    return np.frombuffer(raw, dtype="<u8", count=n // 8)[0::2]


def noise_chunk(
    enc: Any,
    words: np.ndarray,
    tile: np.ndarray,
    distribution: str,
    scale: float,
    out: np.ndarray,
    accumulate: bool,
    ws: Workspace,
    retry_enc: Any = None,
) -> None:
    """Noise of one chunk of items at one address, written or added to ``out``.

    ``out`` (float64, c contiguous values) receives the values, or with
    ``accumulate`` has them added (``out += z``, as the tree's running sums).
    The operations per item are those of ``NoiseSource.to_<distribution>``:

    * uniform: ``u`` = :func:`dpstream.ziggurat.uniforms_from_words` of word0
    * gaussian: ``ndtri(u)``, then ``* scale`` unless scale is 1
    * laplace: ``v = u - 0.5``; ``(-scale * sign(v)) * log1p(-2 |v|)``
    * gumbel: ``-scale * log(-log(u))``
    * gaussian-v2 (:data:`ZIGGURAT`): :func:`dpstream.ziggurat.normals_into`
      of the blocks, with ``retry_enc`` (the purpose's retry AES) for the
      rare restarts, then ``* scale`` unless scale is 1
    """
    c = out.shape[0]
    blocks = encrypt_chunk(enc, words, tile, ws)
    if distribution == ZIGGURAT:
        f = ws.f[:c] if accumulate else out
        size = ws.size
        scratch = (ws.u, ws.x[size : 2 * size].view(np.int64), ws.g)
        normals_into(blocks, f, lambda rows: retry_words(retry_enc, rows), scratch)
        if scale != 1.0:
            np.multiply(f, scale, out=f)
        if accumulate:
            np.add(out, f, out=out)
        return
    f = ws.f[:c] if accumulate else out
    uniforms_from_words(blocks[:, 0], out=f, shifted=ws.u[:c])
    if distribution == "gaussian":
        ndtri(f, out=f)
        if scale != 1.0:
            np.multiply(f, scale, out=f)
    elif distribution == "laplace":
        np.subtract(f, 0.5, out=f)
        g = ws.g[:c]
        np.sign(f, out=g)
        np.multiply(-scale, g, out=g)
        np.abs(f, out=f)
        np.multiply(-2.0, f, out=f)
        np.log1p(f, out=f)
        np.multiply(g, f, out=f)
    elif distribution == "gumbel":
        np.log(f, out=f)
        np.negative(f, out=f)
        np.log(f, out=f)
        np.multiply(-scale, f, out=f)
    elif distribution != "uniform":
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    if accumulate:
        np.add(out, f, out=out)


# -- threads over chunks ------------------------------------------------------------

#: Environment variable that sets the default number of kernel threads.
THREADS_ENV = "DPSTREAM_NOISE_THREADS"
#: Fewer tasks than this per thread and a call stays on the calling thread
#: (handing work to a pool costs tens of microseconds).
_MIN_TASKS_PER_THREAD = 2


def _available_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _default_threads() -> int:
    """``$DPSTREAM_NOISE_THREADS`` if set, else 1.

    One thread by default: on idle cores two threads make a large step ~1.7x
    faster, but on a machine whose cores are already busy (a shared CI host,
    a Spark executor running a task per core) they make it slower, as the
    threads wait for each other's GIL hand-overs.
    """
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return 1
    try:
        threads = int(text)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer, got {text!r}")
    return threads


_threads = _default_threads()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool_after_fork() -> None:
    """A forked child has none of the parent's pool threads: start afresh."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def get_threads() -> int:
    """How many threads the kernel spreads a large batch over (see :func:`set_threads`)."""
    return _threads


def set_threads(threads: int | None) -> int:
    """Use ``threads`` threads for large batches (``None``: one per CPU); returns the old value.

    The default is 1, or ``$DPSTREAM_NOISE_THREADS``. The values do not depend
    on it (each is a pure function of its address and every chunk writes its
    own slice). It pays on a machine with idle cores (the inverse CDF and AES
    run outside the GIL) and costs on one whose cores are busy. A batch of
    fewer than ``2 * threads`` chunks stays on the calling thread.
    ``bench/bench_noise.py --threads 1,2`` measures the difference.
    """
    global _threads, _pool
    old = _threads
    if threads is None:
        threads = _available_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int or None, got {threads!r}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    with _pool_lock:
        if threads != _threads and _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None
        _threads = threads
    return old


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=_threads - 1,
                thread_name_prefix="dpstream-noise",
                initializer=_mark_pool_thread,
            )
        return _pool


def _mark_pool_thread() -> None:
    _local.pool_thread = True


def run_tasks(count: int, task: Callable[[int, int], None]) -> None:
    """Run ``task(lo, hi)`` over ``range(count)``, on the kernel's threads.

    With one thread (or few tasks) this is ``task(0, count)`` on the calling
    thread. Otherwise the calling thread and pool threads claim one task at a
    time (``task(i, i + 1)``) until none is left, so a pool thread that the
    operating system does not run promptly delays the call by one task at
    most. All tasks have finished when this returns, and the first exception
    raised by any of them is re-raised.
    """
    threads = min(_threads, count // _MIN_TASKS_PER_THREAD)
    if threads <= 1 or getattr(_local, "pool_thread", False):  # no waiting on the own pool
        if count:
            task(0, count)
        return
    pool = _executor()
    lock = threading.Lock()
    next_task = [0]
    failed: list[BaseException] = []

    def work() -> None:
        while not failed:
            with lock:
                i = next_task[0]
                next_task[0] = i + 1
            if i >= count:
                return
            try:
                task(i, i + 1)
            except BaseException as exc:
                failed.append(exc)
                raise

    futures: list[Future[None]] = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.exception()  # wait
    if failed:
        raise failed[0]
