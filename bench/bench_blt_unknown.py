"""Benchmark: an unknown-domain (UnkBase) step where many items join, at t = 10 and t = 1,000.

Run by hand: ``python bench/bench_blt_unknown.py [--new-items 100000] [--repeat 5]``.

With the BLT counter an item first seen at s draws its noise state at s - 1
from its exact law (O(k^2) per item, ``BLTNoise.join_items``) instead of
replaying steps 1..s-1, so a step with many joining items should cost about
the same at any s. Printed, all measured in this process (ratios travel better
than seconds between machines; best of ``--repeat``, the t = 10 and t = 1,000
runs interleaved so a shared machine's load hits both alike):

* the time of ``UnknownDomainHistogram.release(t, ...)`` with ``--new-items``
  items first seen at t (aggregate mode, no earlier items), BLT counter, at
  t = 10 and t = 1,000, and their ratio (the goal: <= 2);
* the same with the tree counter, for scale;
* replaying steps 1..999 for the same items (``BLTNoise.add_items`` at
  t = 1,000), what a joining item cost before.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dpstream as dps
from dpstream.mechanisms.blt_noise import BLTNoise
from dpstream.mechanisms.unknown import UnknownDomainHistogram
from dpstream.noise import NoiseSource


def join_step(counter: str, t: int, items: list[str], key: dps.NoiseKey) -> float:
    """Seconds of the release at t where every item of ``items`` is first seen."""
    u = UnknownDomainHistogram(
        2000, max_items=1, key=key, tau=1.0, threshold_delta=1e-6, counter=counter
    )
    if t > 1:
        u.release(t - 1, {})  # no item yet: a jump over the empty steps
    counts = np.ones(len(items), dtype=np.int64)
    start = time.perf_counter()
    u.release(t, items, counts)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-items", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    key = dps.NoiseKey.generate()
    items = [f"item-{i}" for i in range(args.new_items)]
    join_step("blt", 10, items[:1000], key)  # warm-up: imports, kernel threads, fits
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.repeat):
        for counter in ("blt", "tree"):
            for t in (10, 1000):
                dt = join_step(counter, t, items, key)
                best[counter, t] = min(best.get((counter, t), float("inf")), dt)
    print(
        f"{args.new_items} items first seen at step t (UnkBase release, aggregate mode, "
        f"best of {args.repeat})"
    )
    for counter in ("blt", "tree"):
        a, b = best[counter, 10], best[counter, 1000]
        print(
            f"  {counter:4s}: t = 10 {a * 1e3:8.1f} ms   t = 1,000 {b * 1e3:8.1f} ms   "
            f"ratio {b / a:.2f}"
        )
    ratio = best["blt", 1000] / best["blt", 10]
    print(f"  BLT t = 1,000 / t = 10: {ratio:.2f} (goal <= 2)")
    u = UnknownDomainHistogram(
        2000, max_items=1, key=key, tau=1.0, threshold_delta=1e-6, counter="blt"
    )
    source = NoiseSource(key, u.noise_purpose)
    prepared = source.prepare(items)
    replay = BLTNoise(source, u.strategy, u.sigma)
    replay.advance(999)
    replay.advance(1000)
    start = time.perf_counter()
    replay.add_items(prepared)
    took = time.perf_counter() - start
    print(
        f"  before (replaying steps 1..1,000 for each item): {took * 1e3:8.1f} ms, "
        f"{took / best['blt', 1000]:.0f}x the joined step"
    )


if __name__ == "__main__":
    main()
