"""Benchmark: one BLT counter step over many items, against one keyed draw and the tree step.

Run by hand: ``python bench/bench_blt.py [--items 1000000] [--steps 30]``.
Prints ratios against baselines measured in the same process (ratios travel
better than seconds between machines):

* BLT step / draw: one step of streamed BLT noise (``BLTNoise.advance``: a keyed
  N(0, sigma^2) draw per item, then k = 4 buffer updates) over the keyed draw of
  the same number of Gaussians alone. The design goal is <= 1.5x.
* BLT step / tree step: against ``TreeNoise.advance`` at the noise-optimal base,
  amortised over the same steps.
* memory per item: the float state each counter keeps (plus the 16-byte prepared id).
* a newly seen item: BLT replays steps 1..t for it (t keyed draws), the tree draws
  the |I_t| cells; timed for a batch of new items at a few t (the unknown-domain
  question: how much does a BLT cost when 10^5 items appear per step?).
* the V table: worst-case variance of tree (base 2, r*), BLT and the lower bound.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dpstream as dps
from dpstream.factorization import blt_for_horizon, lower_bound
from dpstream.mechanisms.blt_noise import BLTNoise
from dpstream.mechanisms.tree_noise import TreeNoise
from dpstream.noise import NoiseSource
from dpstream.tree import num_levels, optimal_base, worst_case_variance_factor


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
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--horizon", type=int, default=10_000)
    ap.add_argument("--new-items", type=int, default=100_000)
    args = ap.parse_args()
    n, steps, T = args.items, args.steps, args.horizon
    key = dps.NoiseKey.generate()
    src = NoiseSource(key, "bench/blt")
    prepared = src.prepare(np.arange(n).tolist())
    strategy = blt_for_horizon(T)
    blt = BLTNoise(src, strategy, 1.3)
    blt.add_items(prepared)
    r = optimal_base(T)
    tree = TreeNoise(NoiseSource(key, "bench/tree"), T, r, 1.3)
    tree.add_items(prepared)
    # interleaved, so that the load of a shared machine hits all three alike
    draws, blts, trees = [], [], []
    for t in range(1, steps + 1):
        start = time.perf_counter()
        src.gaussian(prepared, 0, t, scale=1.3)
        draws.append(time.perf_counter() - start)
        start = time.perf_counter()
        blt.advance(t)
        blts.append(time.perf_counter() - start)
        start = time.perf_counter()
        tree.advance(t)
        trees.append(time.perf_counter() - start)
    draw_s, blt_s = float(np.median(draws)), float(np.median(blts))
    tree_s = float(np.mean(trees))  # the tree's step cost varies with t: amortised

    blt_bytes = (blt._buffers[:, :n].nbytes + blt._total[:n].nbytes) / n
    tree_bytes = (tree._level_sum[:, :n].nbytes + tree._suffix[:, :n].nbytes) / n
    print(
        f"items={n:,}  T={T}  BLT buffers={strategy.buffers}  tree base r*={r} "
        f"(L={num_levels(T, r)})  steps={steps}"
    )
    print(f"keyed draw of {n:,} Gaussians: {draw_s * 1e3:8.1f} ms  (median; baseline = 1.00)")
    print(
        f"BLT step (median):         {blt_s * 1e3:8.1f} ms  ratio {blt_s / draw_s:5.2f}x "
        "(goal <= 1.5x)"
    )
    print(
        f"tree step (amortised):     {tree_s * 1e3:8.1f} ms  ratio {tree_s / draw_s:5.2f}x;"
        f"  BLT / tree = {blt_s / tree_s:4.2f}"
    )
    print(
        f"state per item: BLT {blt_bytes:.0f} bytes ({strategy.buffers + 1} floats), "
        f"tree {tree_bytes:.0f} bytes (2 x {num_levels(T, r)} floats); "
        "both + 16 bytes of prepared id"
    )

    m = args.new_items
    new = src.prepare(np.arange(n, n + m).tolist())
    print(
        f"\na batch of {m:,} newly seen items at step t (BLT replays t steps, tree draws "
        "the cells of I_t):"
    )
    for t in (10, 100, 1000):
        b = BLTNoise(src, strategy, 1.3)
        b.advance(t)
        blt_new = best_of(lambda b=b: BLTNoise.add_items(b, new), 1)
        tr = TreeNoise(NoiseSource(key, "bench/tree"), T, r, 1.3)
        tr.advance(t)
        tree_new = best_of(lambda tr=tr: TreeNoise.add_items(tr, new), 1)
        print(
            f"  t={t:>5}: BLT {blt_new:8.2f} s ({blt_new / (m / n * draw_s) / t:4.2f}x of "
            f"t draws), tree {tree_new:6.3f} s; BLT / tree = {blt_new / tree_new:6.1f}"
        )

    print("\nworst-case variance V (units of tau^2 = 1/(2 rho)) against the lower bound:")
    print(f"{'T':>9} {'tree r=2':>9} {'tree r*':>9} {'BLT':>7} {'bound':>7} {'BLT/bound':>9}")
    for h in (10**3, 10**4, 10**5, 10**6):
        s = blt_for_horizon(h)
        lb = lower_bound(h)
        print(
            f"{h:>9} {worst_case_variance_factor(h, 2):>9} "
            f"{worst_case_variance_factor(h, optimal_base(h)):>9} "
            f"{s.worst_case_variance:>7.2f} {lb:>7.2f} {s.worst_case_variance / lb:>9.3f}"
        )


if __name__ == "__main__":
    main()
