"""Benchmark: memory per tracked item of UnkBase, SparseGumb (top-k) and KnownBase.

Run by hand: ``python bench/bench_memory.py [--items 200000] [--horizon 1000]``.

Each mechanism is built and fed ``--items`` distinct items (names made inside
the measured region and then dropped by the caller, so the mechanism's own
references keep them: their bytes count). Reported per item:

* tracemalloc: the bytes Python allocated and still holds;
* RSS: the growth of the process's resident set (measured in a fresh
  subprocess per mechanism, after a warm-up, so earlier work does not blur it,
  and after ``malloc_trim``, so memory freed but kept by the allocator does not
  count);
* the NumPy arrays of the state (noise sums, counts, prepared ids), from
  their ``nbytes``: the part that must exist.

Goals (issue 16): <= 96 B/item UnkBase, <= 64 B/item SparseGumb and KnownBase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tracemalloc

import numpy as np


def _arrays_nbytes(obj: object, seen: set[int] | None = None, depth: int = 0) -> int:
    """The bytes of the NumPy arrays reachable from ``obj`` (its attributes, lists, dicts)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.base is None else 0
    total = 0
    if isinstance(obj, dict):
        for v in obj.values():
            total += _arrays_nbytes(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple)) and obj and not isinstance(obj[0], (str, int)):
        for v in obj:
            total += _arrays_nbytes(v, seen, depth + 1)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        for name in list(getattr(obj, "__dict__", {})) + list(getattr(obj, "__slots__", ())):
            if hasattr(obj, name):
                total += _arrays_nbytes(getattr(obj, name), seen, depth + 1)
    return total


def build(kind: str, n: int, horizon: int) -> object:
    import dpstream as dps

    key = dps.NoiseKey.from_bytes(bytes(32))
    names = [f"item-{i:08d}" for i in range(n)]
    if kind == "unknown":
        m = dps.UnknownDomainHistogram(horizon, max_items=1, key=key, epsilon=1.0, delta=1e-6)
        m.step_batch([[x] for x in names])
    elif kind == "topk":
        m = dps.ContinualTopK(names, horizon, k=10, switches=5, eta=1.0, key=key, rho=1.0)
        m.step_batch([[x] for x in names[:1000]])
    else:
        m = dps.KnownDomainHistogram(names, horizon, max_items=1, key=key, rho=1.0)
        m.step_batch([[x] for x in names[:1000]])
    del names
    return m


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def trimmed_rss() -> int:
    """RSS after a collection and glibc's ``malloc_trim`` (memory freed but kept by the
    allocator, such as the test's own item names, handed back first)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def child(kind: str, n: int, horizon: int) -> None:
    build(kind, 1000, horizon)  # warm-up: imports, caches, code paths
    before = trimmed_rss()
    m = build(kind, n, horizon)
    after = trimmed_rss()
    tracemalloc.start()
    m2 = build(kind, n, horizon)
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(json.dumps({"rss": (after - before) / n, "traced": traced / n,
                      "arrays": _arrays_nbytes(m2) / n, "alive": m is not None}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--horizon", type=int, default=1000)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.items, args.horizon)
        return
    goals = {"unknown": 96, "topk": 64, "known": 64}
    names = {"unknown": "UnkBase", "topk": "SparseGumb (top-k)", "known": "KnownBase"}
    print(f"bytes per item, {args.items:,} items, T = {args.horizon:,}")
    for kind in ("unknown", "topk", "known"):
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--items",
                              str(args.items), "--horizon", str(args.horizon)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        print(f"  {names[kind]:<20} tracemalloc {r['traced']:6.0f}  RSS {r['rss']:6.0f}  "
              f"NumPy state {r['arrays']:6.0f}  (goal <= {goals[kind]})")


if __name__ == "__main__":
    main()
