"""Benchmark: memory per tracked item of UnkBase, SparseGumb (top-k) and KnownBase.

Run by hand: ``python bench/bench_memory.py [--items 200000] [--horizon 1000]``.

Each mechanism is built and fed ``--items`` distinct items (names made inside
the measured region and then dropped by the caller, so the mechanism's own
references keep them: their bytes count). Reported per item:

* tracemalloc: the bytes Python allocated and still holds;
* RSS: the growth of the process's resident set (measured in a fresh
  subprocess per mechanism, after a warm-up, so earlier work does not blur it,
  and after ``malloc_trim``, so memory freed but kept by glibc does not
  count). Python's own allocator keeps a 1 MiB arena as long as one object in it
  lives, so the freed input leaves some of its memory resident (about 8 bytes per
  item with no mechanism at all); "RSS, input made before" makes the names and
  events before the first reading, so only what the mechanism adds to a
  process that holds its input counts (a mechanism without the compact table,
  ``DPSTREAM_COMPILED=0``, keeps the input's str objects, which that column
  then misses);
* the NumPy arrays of the state (noise sums, counts, prepared ids), from
  their ``nbytes``: the part that must exist;
* step peak: what one more step allocates on top of that, at its peak
  (tracemalloc), per item: the arrays of the step's counts and values.

Goals (issue 16): <= 96 B/item UnkBase, <= 64 B/item SparseGumb and KnownBase.
KnownBase is measured with its default 4-buffer BLT counter and with 2 and 1
buffers (``--blt-buffers``: 8 bytes less state per buffer, a little more noise).

``--run``: the peak RSS of a whole batch ``dpstream run -m unknown`` (without and
with ``--state``) over the stream of ``bench/bench_ingest.py`` (``--events`` JSON
Lines events, 1 to 5 items each from ``--distinct`` Zipf(1.1) items, ``--steps``
steps; 10^6 events make 55 MB), and over the same stream with 2x and 4x the events
over the same items and steps (``--scales``); first over 1,000 events (the floor:
what the libraries and the mechanism take whatever the input). Each run is a fresh process; its
peak is the kernel's ``ru_maxrss`` of that child. Goal (issue 31): <= 150 MB at
1x, and doubling the events adds <= 20%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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


#: Items of the warm-up build: enough chunks that the noise kernel starts its worker
#: threads and their scratch (a per-process cost, not a per-item one).
WARM_UP_ITEMS = 100_000


def make_input(n: int) -> tuple[list[str], list[list[str]]]:
    """The item names and one-item events the mechanisms are fed."""
    names = [f"item-{i:08d}" for i in range(n)]
    return names, [[x] for x in names]


def build(
    kind: str, n: int, horizon: int, given: tuple[list[str], list[list[str]]] | None = None
) -> object:
    """Mechanism ``kind`` fed ``n`` items (from ``given``, or from input made and dropped here)."""
    import dpstream as dps

    key = dps.NoiseKey.generate()
    names, events = make_input(n) if given is None else given
    if kind == "unknown":
        m = dps.UnknownDomainHistogram(horizon, max_items=1, key=key, epsilon=1.0, delta=1e-6)
        m.step_batch(events)
    elif kind == "topk":
        m = dps.ContinualTopK(names, horizon, k=10, switches=5, eta=1.0, key=key, rho=1.0)
        m.step_batch(events[:1000])
    else:  # "known", or "known:K" for a K-buffer BLT counter
        _, _, buffers = kind.partition(":")
        counter = dps.factorization.blt_for_horizon(horizon, int(buffers)) if buffers else None
        m = dps.KnownDomainHistogram(names, horizon, max_items=1, key=key, rho=1.0, counter=counter)
        m.step_batch(events[:1000])
    del names, events
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


def child(kind: str, n: int, horizon: int, input_before: bool) -> None:
    build(kind, WARM_UP_ITEMS, horizon)  # warm-up: imports, caches, threads, code paths
    given = make_input(n) if input_before else None
    before = trimmed_rss()
    m = build(kind, n, horizon, given)
    after = trimmed_rss()
    out = {"rss": (after - before) / n, "alive": m is not None}
    if not input_before:
        tracemalloc.start()
        m2 = build(kind, n, horizon)
        out["traced"] = tracemalloc.get_traced_memory()[0] / n
        # the transient peak of one more step (1,000 one-item events of items it has)
        events = [[f"item-{i:08d}"] for i in range(min(n, 1000))]
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        m2.step_batch(events)
        out["step_peak"] = (tracemalloc.get_traced_memory()[1] - held) / n
        tracemalloc.stop()
        out["arrays"] = _arrays_nbytes(m2) / n
    print(json.dumps(out))


def _run_child(kind: str, args: argparse.Namespace, input_before: bool) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--items",
        str(args.items),
        "--horizon",
        str(args.horizon),
    ] + (["--input-before"] if input_before else [])
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def peak_rss_mb(argv: list[str]) -> float:
    """The peak resident set of one child process running ``argv``, in MB (10^6 B)."""
    import os

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[3:5]} exited with status {proc.returncode}")
    return usage.ru_maxrss * 1024 / 1e6  # ru_maxrss is in KiB on Linux


def run_rss(args: argparse.Namespace) -> None:
    """The peak RSS of batch runs over 1x, 2x, 4x the events (see the module doc)."""
    import os
    import tempfile
    from pathlib import Path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ingest import make_stream

    work = Path(tempfile.mkdtemp(prefix="dps-bench-mem-"))
    key = work / "key"
    subprocess.run([sys.executable, "-m", "dpstream", "keygen", str(key)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    scales = [int(x) for x in args.scales.split(",")]
    print(f"peak RSS (MB) of `dpstream run -m unknown`, {args.steps:,} steps, "
          f"{args.distinct:,} items; events x {args.events:,}")  # fmt: skip
    print(f"  {'events':>10} {'input MB':>9} {'no --state':>11} {'--state':>9}")
    base: dict[bool, float] = {}
    # the floor: the same command over 1,000 events (the interpreter, NumPy, SciPy,
    # Arrow and the mechanism's fixed costs: what no input adds)
    for scale in [0, *scales]:
        data = work / f"events-{scale}.jsonl"
        make_stream(data, args.events * scale or 1000, args.steps, args.distinct)
        row = []
        for state in (False, True):
            best = []
            for _ in range(args.repeat):
                for p in work.glob("out*"):
                    p.unlink()
                for p in work.glob("key.ledger*"):
                    p.unlink()
                for p in work.glob("state*"):
                    p.unlink()
                argv = [
                    sys.executable, "-m", "dpstream", "run", "--quiet", "-m", "unknown",
                    "-T", str(args.steps), "--max-items", "5", "--epsilon", "1",
                    "--delta", "1e-6", "--key-file", str(key), "-i", str(data),
                    "-o", str(work / "out.jsonl"), "--force", "--no-fsync",
                ]  # fmt: skip
                if state:
                    argv += ["--state", str(work / "state.sqlite")]
                if args.memory:
                    argv += ["--memory", args.memory]
                best.append(peak_rss_mb(argv))
            peak = min(best)
            if scale:
                base.setdefault(state, peak)
            row.append(f"{peak:7.0f}" + (f" ({peak / base[state] - 1:+.0%})" if scale > 1 else ""))
        size = data.stat().st_size / 1e6
        print(f"  {args.events * scale or 1000:>10,} {size:>9.1f} {row[0]:>11} {row[1]:>9}")
        data.unlink()


def main() -> None:
    # throwaway keys whose ledgers each round removes: keep them out of the user's key
    # registry (which would warn of a removed ledger at every round), here and in children
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="peak RSS of batch runs (issue 31)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=100_000)
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--memory", default=None, help="--memory SIZE for the runs")
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--horizon", type=int, default=1000)
    ap.add_argument("--child", default=None)
    ap.add_argument("--input-before", action="store_true")
    args = ap.parse_args()
    if args.run:
        run_rss(args)
        return
    if args.child:
        child(args.child, args.items, args.horizon, args.input_before)
        return
    goals = {"unknown": 96, "topk": 64, "known": 64, "known:2": 64, "known:1": 64}
    names = {
        "unknown": "UnkBase",
        "topk": "SparseGumb (top-k)",
        "known": "KnownBase",
        "known:2": "KnownBase, 2 buffers",
        "known:1": "KnownBase, 1 buffer",
    }
    print(f"bytes per item, {args.items:,} items, T = {args.horizon:,}")
    print(
        f"  {'':<22} {'tracemalloc':>11} {'RSS':>6} {'RSS, input made before':>23} "
        f"{'NumPy state':>12} {'step peak':>10}"
    )
    for kind in names:
        r = _run_child(kind, args, False)
        pre = _run_child(kind, args, True)
        print(
            f"  {names[kind]:<22} {r['traced']:>11.0f} {r['rss']:>6.0f} {pre['rss']:>23.0f} "
            f"{r['arrays']:>12.0f} {r['step_peak']:>10.0f}  (goal <= {goals[kind]})"
        )


if __name__ == "__main__":
    main()
