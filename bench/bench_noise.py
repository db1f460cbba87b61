"""Benchmark: keyed noise and the KnownBase release step against NumPy's unkeyed normals.

Run by hand (it needs an idle core or two; numbers from a loaded machine wander):

    OPENBLAS_NUM_THREADS=1 python bench/bench_noise.py --items 1000000
    OPENBLAS_NUM_THREADS=1 python bench/bench_noise.py --items 10000000 --rounds 5 --memory
    python bench/bench_noise.py --before 6160f2b      # also time the code of a git revision
    python bench/bench_noise.py --threads 1,2         # the kernel on one and two threads

Ratios are taken against a baseline measured in the same process, round by
round (each round times every contender for ``--steps`` steps right after the
baseline; the median of the per-round ratios is printed):

* floor: ``counts + rng.standard_normal(n)``, NumPy's unkeyed normals plus the
  addition to the counts: what an unkeyed mechanism pays per step at least.
* keyed draw: ``NoiseSource.gaussian`` of n items at one address (fresh output).
* KnownBase step: ``KnownDomainHistogram.release(t, counts)`` in aggregate mode
  over n items, T = 10^4 (base 5, 6 levels), consecutive steps.
* each of the two for every noise version in ``--versions`` (default 1,2: the
  inverse CDF and the ziggurat) and, with ``--threads 1,2``, every kernel
  thread count. ``--counter blt`` times KnownBase with the BLT counter instead
  of the paper's tree.
* with ``--before REV``: the same two contenders from the source of git
  revision REV (imported as a second package in this process).

Each contender is timed against a floor run measured right before it, by wall
time (the ratios that count) and by process CPU time (the last column: steadier
on a busy machine for one thread, but blind to what threads save).

``--memory`` measures the tree state per item: a ``TreeNoise`` holding n
prepared items (level sums, kept suffix rows, prepared ids) plus KnownBase's
int64 counts, by tracemalloc (NumPy reports its buffers to it) and by the
process RSS, after construction and as the peak over a few steps.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

import dpstream as dps
from dpstream import noise_kernel

HORIZON = 10_000


def rss_bytes() -> int:
    """Resident set size of this process now (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_revision(rev: str, into: Path):
    """Import ``src/dpstream`` of git revision ``rev`` as package ``dpstream_before``."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "src/dpstream"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "src" / "dpstream").rename(into / "dpstream_before")
    sys.path.insert(0, str(into))
    return importlib.import_module("dpstream_before")


def ids_array(n: int) -> np.ndarray:
    """n distinct 128-bit item ids without n Python objects (ids are what prepare_ids takes)."""
    ids = np.zeros((n, 2), dtype="<u8")
    ids[:, 0] = np.arange(n, dtype=np.uint64)
    return ids


class Contenders:
    """Everything a round times, built once.

    ``version``: the noise version (None: a package that has none, i.e. version 1);
    ``counter``: KnownBase's counter ("tree", the paper's, or "blt").
    """

    def __init__(
        self, pkg, n: int, key_bytes: bytes, version: int | None = None, counter: str = "tree"
    ) -> None:
        key = pkg.NoiseKey.from_bytes(key_bytes)
        self.source = pkg.NoiseSource(key, "/v2/bench/draw" if version == 2 else "bench/draw")
        self.prepared = self.source.prepare_ids(ids_array(n))
        # KnownBase over a domain of n ints; prepare() hashes them once (slow at 10^7)
        extra = {} if version is None else {"noise_version": version}
        try:
            self.hist = pkg.KnownDomainHistogram(
                range(n), HORIZON, max_items=1, key=key, rho=1.0, counter=counter, **extra
            )
        except TypeError:  # a revision from before the counter option: the tree
            self.hist = pkg.KnownDomainHistogram(
                range(n), HORIZON, max_items=1, key=key, rho=1.0, **extra
            )
        self.t = 0
        self.j = 0

    def draw(self, steps: int) -> None:
        for _ in range(steps):
            self.j += 1
            self.source.gaussian(self.prepared, 1, self.j)

    def step(self, counts: np.ndarray, steps: int) -> None:
        for _ in range(steps):
            self.t += 1
            self.hist.release(self.t, counts)


def timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn(*args)``.

    CPU time counts every thread: on a busy machine it is the steadier measure
    of the work one thread does, but it cannot show what threads save.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def speed(args: argparse.Namespace) -> None:
    n, steps = args.items, args.steps
    threads = (
        [int(x) for x in args.threads.split(",")] if args.threads else [noise_kernel.get_threads()]
    )
    key_bytes = dps.NoiseKey.generate().to_bytes()
    rng = np.random.default_rng(0)  # the unkeyed baseline only
    counts = np.zeros(n, dtype=np.int64)
    counts[rng.integers(0, n, n // 10)] += 1

    def floor(k: int) -> None:
        for _ in range(k):
            counts + rng.standard_normal(n)

    t0 = time.perf_counter()
    versions = [int(v) for v in args.versions.split(",")]
    sides = {v: Contenders(dps, n, key_bytes, v, args.counter) for v in versions}
    contenders: list[tuple[str, int | None, Contenders]] = [
        (f"v{v}, {th} thread{'s' if th > 1 else ''}", th, sides[v])
        for v in versions
        for th in threads
    ]
    if args.before:
        tmp = tempfile.TemporaryDirectory()
        before = Contenders(load_revision(args.before, Path(tmp.name)), n, key_bytes)
        contenders.append((f"before {args.before}", None, before))
    if 2 + args.rounds * len(threads) * steps > HORIZON:  # (per version: each has its own)
        raise SystemExit("rounds * steps * thread settings must stay below the horizon")
    print(
        f"items={n:,}  T={HORIZON}  counter={args.counter}  steps per round={steps}  "
        f"rounds={args.rounds}  "
        f"chunk={noise_kernel.CHUNK_ITEMS}  "
        f"(setup {time.perf_counter() - t0:.1f} s)"
    )
    before_warm = False
    for _, th, side in contenders:  # warm up: first steps, page faults, thread pool
        if th is not None:
            noise_kernel.set_threads(th)
        if th is not None or not before_warm:
            side.draw(1)
            before_warm = th is None
    for side in sides.values():
        side.step(counts, 1)
    if args.before:
        before.step(counts, 1)
    floor(2)

    # each contender against a floor timed right before it, round after round
    ratios: dict[str, list[tuple[float, float]]] = {}
    floor_ms: list[float] = []

    def against_floor(name: str, fn, *fn_args) -> None:
        base = timed(floor, steps)
        floor_ms.append(base[0] / steps * 1e3)
        took = timed(fn, *fn_args)
        ratios.setdefault(name, []).append((took[0] / base[0], took[1] / base[1]))

    for _ in range(args.rounds):
        for label, th, side in contenders:
            if th is not None:
                noise_kernel.set_threads(th)
            against_floor(f"keyed draw, {label}", side.draw, steps)
            against_floor(f"KnownBase step, {label}", side.step, counts, steps)
        gc.collect()
    med_floor = statistics.median(floor_ms)
    width = max(len(k) for k in ratios) + 1
    print(
        f"{'contender':<{width}} {'ms/step':>8} {'/ floor':>8} {'(min..max)':>12} "
        f"{'CPU / floor':>12}"
    )
    print(
        f"{'floor: normals + add':<{width}} {med_floor:8.2f} {1.0:8.2f} "
        f"{min(floor_ms):5.1f}..{max(floor_ms):<5.1f}ms {1.0:8.2f}"
    )
    for name, rs in ratios.items():
        wall = sorted(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        med = statistics.median(wall)
        print(
            f"{name:<{width}} {med * med_floor:8.2f} {med:8.2f} {wall[0]:6.2f}..{wall[-1]:<5.2f} "
            f"{cpu:8.2f}"
        )


def memory(args: argparse.Namespace) -> None:
    n = args.items
    pkg = dps
    if args.before:
        tmp = tempfile.TemporaryDirectory()
        pkg = load_revision(args.before, Path(tmp.name))
    tree_noise = importlib.import_module(pkg.__name__ + ".mechanisms.tree_noise")
    key = pkg.NoiseKey.generate()
    source = pkg.NoiseSource(key, "bench/memory")
    gc.collect()
    tracemalloc.start()
    rss0, traced0 = rss_bytes(), tracemalloc.get_traced_memory()[0]
    prepared = source.prepare_ids(ids_array(n))  # the ids are freed at once
    tree = tree_noise.TreeNoise(source, HORIZON, 5, 1.0)
    tree.add_items(prepared)
    del prepared
    counts = np.ones(n, dtype=np.int64)  # KnownBase's running counts (written: resident)
    gc.collect()
    traced1 = tracemalloc.get_traced_memory()[0]
    rss1 = rss_bytes()
    tracemalloc.reset_peak()
    for t in range(1, 7):  # six steps, one of them (t = 5) changes level 2
        if args.before:
            tree.advance(t)
            values = counts + tree.noise()
        else:
            values = tree.advance(t, counts)
        rss2 = rss_bytes()
        del values  # a release is handed on, not kept here
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"{'before ' + args.before if args.before else 'this code'}: tree state per item at "
        f"{n:,} items (T={HORIZON}, base 5, {tree.levels} levels): prepared id, level and "
        "suffix sums, int64 count"
    )
    print(
        f"  tracemalloc: {(traced1 - traced0) / n:6.1f} B at rest, "
        f"{(traced_peak - traced0) / n:6.1f} B peak during a step (with its 8-byte output)"
    )
    print(
        f"  RSS:         {(rss1 - rss0) / n:6.1f} B at rest, "
        f"{(rss2 - rss0) / n:6.1f} B after a step (with its output)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=64, help="steps per round and contender")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument(
        "--threads",
        default=None,
        help="kernel threads to time, e.g. 1,2 (default: the library's default)",
    )
    ap.add_argument("--chunk", type=int, default=None, help="items per kernel chunk")
    ap.add_argument(
        "--versions", default="1,2", help="noise versions to time (1: inverse CDF, 2: ziggurat)"
    )
    ap.add_argument(
        "--counter",
        default="tree",
        choices=("tree", "blt"),
        help="KnownBase's counter (default: the paper's tree)",
    )
    ap.add_argument(
        "--before",
        metavar="REV",
        help="also time git revision REV (with --memory: measure it instead)",
    )
    ap.add_argument("--memory", action="store_true", help="measure memory per item instead")
    args = ap.parse_args()
    if args.chunk is not None:
        noise_kernel.CHUNK_ITEMS = args.chunk
    if args.memory:
        memory(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
