"""Benchmark: library ``UnknownDomainHistogram.step_batch`` (issue 31: >= 2M item
occurrences/s).

Run by hand: ``python bench/bench_step_batch.py [--events 1000000] [--rounds 5]``.
The stream: ``--events`` events of 1 to 5 items (3 on average), the items Zipf
(exponent 1.1) over ``--distinct`` names (10^5, ``item{rank}``), pre-parsed into
lists by ``json.loads`` (one str object per occurrence, as a reader gives them),
cut into steps of ``--batch`` events (10^3 and 10^4 by default: 1,000 and 100
steps over 10^6 events). For the BLT default counter and ``counter="tree"``
it prints item occurrences per second of CPU time (``time.process_time``), the
median over the rounds with the spread (min-max), and the ratio of the CPU time
to a floor measured in the same round of the same process: a dict lookup +
``bincount`` of the same occurrences, step by step (the least an exact
histogram of these steps costs in Python).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import dpstream as dps


def make_batches(events: int, distinct: int, batch: int, seed: int = 0) -> list[list[list[str]]]:
    """The stream (simulation data: NumPy's PCG64 is fine here), as steps of events."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, events)
    ranks = rng.zipf(1.1, int(sizes.sum())) % distinct
    names = [f"item{i}" for i in range(distinct)]
    flat = [names[r] for r in ranks.tolist()]
    evs, pos = [], 0
    for s in sizes.tolist():
        evs.append(flat[pos : pos + s])
        pos += s
    evs = json.loads(json.dumps(evs))  # one str object per occurrence, as a parser gives
    return [evs[i : i + batch] for i in range(0, events, batch)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--distinct", type=int, default=100_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    key = dps.NoiseKey.generate()
    for batch in args.batch:
        batches = make_batches(args.events, args.distinct, batch)
        occurrences = sum(len(e) for b in batches for e in b)

        def floor() -> None:
            index: dict[str, int] = {}
            counts = np.zeros(0, dtype=np.int64)
            for b in batches:  # noqa: B023 (run within the iteration)
                pos = [index.setdefault(i, len(index)) for e in b for i in e]
                counts = np.bincount(np.asarray(pos, dtype=np.int64), minlength=len(index))
            assert counts.sum() >= 0

        def library(counter: str) -> None:
            h = dps.UnknownDomainHistogram(
                len(batches),  # noqa: B023
                max_items=5,
                key=key,
                epsilon=1.0,
                delta=1e-6,
                counter=counter,
            )
            for b in batches:  # noqa: B023
                h.step_batch(b)

        library("blt")  # warm-up: the BLT fit, the kernel's threads
        times: dict[str, list[float]] = {"floor": [], "blt": [], "tree": []}
        for _ in range(args.rounds):
            for name in times:
                start = time.process_time()
                floor() if name == "floor" else library(name)
                times[name].append(time.process_time() - start)
        print(
            f"{args.events:,} events, {occurrences:,} occurrences, {len(batches)} steps of "
            f"{batch:,} events, {args.rounds} rounds"
        )
        for name, secs in times.items():
            rates = [occurrences / s / 1e6 for s in secs]
            ratios = [s / f for s, f in zip(secs, times["floor"], strict=True)]
            label = "floor: dict + bincount" if name == "floor" else f"step_batch ({name})"
            print(
                f"  {label:24s} {statistics.median(rates):5.2f}M occurrences/s "
                f"({min(rates):.2f}-{max(rates):.2f})  {statistics.median(ratios):5.2f}x floor "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )
    print("goal: >= 2M occurrences/s")


if __name__ == "__main__":
    main()
