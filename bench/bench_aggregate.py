"""Benchmark: UnkBase aggregate mode over many items, against the event-mode step.

Run by hand: ``python bench/bench_aggregate.py [--items 1000000] [--steps 8]``.

A stream where ``--items`` items have appeared (at step 1), then steps of 1,000
events of 3 items each. Per step, CPU time (the machine is shared) of:

* event mode: ``step_batch`` of the step's events (the floor: the goal is
  aggregate mode <= 1.5x this);
* aggregate mode from arrays, ``release(t, items, counts)``: items in the order
  of ``items_seen`` (new ones after them), and shuffled;
* aggregate mode from a pandas, a polars and an Arrow frame (columns item, count);
* aggregate mode from a Mapping (the form that was there before).

Every form is checked to release the same bits as event mode.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import dpstream as dps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    n, steps = args.items, args.steps
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    key = dps.NoiseKey.generate()
    rng = np.random.default_rng(0)  # simulation data only
    names = [f"item{i}" for i in range(n)]
    first = [[x] for x in names]
    batches = [
        [[names[j] for j in rng.integers(0, n, 3)] for _ in range(1000)] for _ in range(steps)
    ]

    def make() -> dps.UnknownDomainHistogram:
        return dps.UnknownDomainHistogram(steps + 1, max_items=3, key=key, epsilon=1.0, delta=1e-6)

    forms = (
        "event",
        "lists (items_seen order)",
        "arrays (items_seen order)",
        "arrays (shuffled)",
        "pandas",
        "polars",
        "arrow",
        "Mapping",
    )
    mechs = {f: make() for f in forms}
    for m in mechs.values():
        m.step_batch(first)
    seen = mechs["event"].items_seen
    counts = dict(zip(seen, mechs["event"].counts.tolist(), strict=True))
    cpu = {f: 0.0 for f in forms}
    perm = rng.permutation(n)
    for t, batch in enumerate(batches, 2):
        for ev in batch:
            for x in dict.fromkeys(ev):
                counts[x] += 1
        items = np.array(seen, dtype=object)
        values = np.array([counts[x] for x in seen], dtype=np.int64)
        inputs = {
            "event": (batch,),
            "lists (items_seen order)": (t, seen, values),
            "arrays (items_seen order)": (t, items, values),
            "arrays (shuffled)": (t, items[perm], values[perm]),
            "pandas": (t, pd.DataFrame({"item": seen, "count": values})),
            "polars": (t, pl.DataFrame({"item": seen, "count": values})),
            "arrow": (t, pa.table({"item": seen, "count": values})),
            "Mapping": (t, counts),
        }
        releases = {}
        for f in forms:
            m = mechs[f]
            start = time.process_time()
            releases[f] = m.step_batch(*inputs[f]) if f == "event" else m.release(*inputs[f])
            cpu[f] += time.process_time() - start
        ref = releases["event"]
        for f, rel in releases.items():
            assert (
                list(rel.items) == list(ref.items) and rel.values.tobytes() == ref.values.tobytes()
            ), f
    floor = cpu["event"] / steps
    print(f"UnkBase over {n:,} items, {steps} steps (CPU per step; same bits in every form)")
    for f in forms:
        per = cpu[f] / steps
        print(
            f"  {f:<28} {per * 1e3:8.1f} ms  {per / floor:5.2f}x event mode"
            + ("  (goal <= 1.5x)" if "order" in f else "")
        )


if __name__ == "__main__":
    main()
