"""Benchmark: one KnownBase release step over many items, against one keyed draw.

Run by hand: ``python bench/bench_known.py [--items 1000000] [--steps 60]``.
Prints ratios against a baseline measured in the same process (machines are
noisy; ratios travel better than seconds):

* step / draw: the amortised time of one KnownBase step (aggregate mode, all
  items) over the time to draw one keyed N(0, 1) value for every item. The
  design goal is <= 3.
* event ingest: item occurrences per second through ``step_batch``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dpstream as dps
from dpstream.noise import NoiseSource


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--horizon", type=int, default=10_000)
    args = ap.parse_args()
    n, steps = args.items, args.steps
    key = dps.NoiseKey.generate()
    domain = np.arange(n).tolist()

    src = NoiseSource(key, "bench/draw")
    t0 = time.perf_counter()
    prepared = src.prepare(domain)
    prep_s = time.perf_counter() - t0
    draw_s = best_of(lambda: src.gaussian(prepared, 1, 1), 5)

    t0 = time.perf_counter()
    h = dps.KnownDomainHistogram(domain, args.horizon, max_items=1, key=key, rho=1.0)
    build_s = time.perf_counter() - t0
    counts = np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(0)  # simulation data only
    start = time.perf_counter()
    for t in range(1, steps + 1):
        counts[rng.integers(0, n, 1000)] += 1
        h.release(t, counts)
    step_s = (time.perf_counter() - start) / steps

    # event ingest: 200 steps of 500 events with up to 3 items each
    h2 = dps.KnownDomainHistogram(range(10_000), 1000, max_items=3, key=key, rho=1.0)
    events = [[list(rng.choice(10_000, 3, replace=False)) for _ in range(500)] for _ in range(40)]
    occurrences = sum(len(e) for batch in events for e in batch)
    start = time.perf_counter()
    for batch in events:
        h2.step_batch(batch)
    ingest_s = time.perf_counter() - start

    print(f"items={n:,}  base={h.base}  levels={h.levels}  steps={steps}")
    print(f"prepare ids (once):        {prep_s:8.3f} s   construct KnownBase: {build_s:.3f} s")
    print(f"keyed draw of {n:,}:  {draw_s * 1e3:8.1f} ms  (baseline = 1.00)")
    print(
        f"KnownBase step, amortised: {step_s * 1e3:8.1f} ms  ratio {step_s / draw_s:5.2f}x"
        "  (goal <= 3x)"
    )
    print(
        f"event ingest: {occurrences / ingest_s:,.0f} item-occurrences/s "
        f"({occurrences:,} occurrences in {ingest_s:.2f} s, incl. release over 10^4 items)"
    )


if __name__ == "__main__":
    main()
