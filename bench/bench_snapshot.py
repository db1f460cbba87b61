"""Benchmark: dump + load of a run's snapshot (``dpstream.snapshot``).

Run by hand: ``python bench/bench_snapshot.py [--items 100000] [--old PATH]``.
Times ``dump_snapshot`` then ``load_snapshot`` of (mechanism, publisher), as
``dpstream run --state`` saves them, for a KnownBase over ``--items`` domain
items after 10 steps and an UnkBase after 100 steps of events drawn from
``--items`` words. With ``--old PATH`` (another version's ``snapshot.py``, e.g.
the pickle format of 0.3.0.dev0) both are timed on the same objects in the same
process, alternately, and their ratio is printed (machines are noisy; ratios
travel better than seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from typing import Any

import numpy as np

import dpstream.snapshot as current
from dpstream.cli import build_mechanism
from dpstream.noise import NoiseKey
from dpstream.postprocess import ReadableCounts


def _module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("dpstream._bench_old_snapshot", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "dpstream"
    spec.loader.exec_module(mod)
    return mod


def _states(items: int) -> dict[str, Any]:
    key = NoiseKey.generate()
    words = [f"item-{i}" for i in range(items)]
    rng = np.random.default_rng(3)  # simulated events: benchmark data, not a release
    known = build_mechanism(
        "known", {"horizon": 1000, "stream": "s", "rho": 1.0, "max_items": 2}, key, words
    )
    pk = ReadableCounts(clamp=True, round_counts=True)
    for _ in range(10):
        pk(known.step_batch(rng.choice(words, size=(2000, 2)).tolist()))
    unk = build_mechanism(
        "unknown",
        {
            "horizon": 1000,
            "stream": "s",
            "rho": 1.0,
            "max_items": 2,
            "threshold_delta": 1e-6,
            "remember": True,
        },
        key,
        None,
    )
    pu = ReadableCounts(clamp=True, round_counts=True, ranked=True)
    for _ in range(100):
        pu(unk.step_batch(rng.choice(words, size=(1000, 2)).tolist()))
    return {
        "key": key,
        f"KnownBase, {items:,} items": (known, pk),
        f"UnkBase after 100 steps, {len(unk._table):,} items": (unk, pu),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--old", help="another snapshot.py to compare with")
    args = ap.parse_args()
    formats = {"new": current}
    if args.old:
        formats["old"] = _module(args.old)
    states = _states(args.items)
    key = states.pop("key")
    for name, obj in states.items():
        times: dict[str, list[float]] = {label: [] for label in formats}
        size = {}
        for _ in range(args.reps):
            for label, mod in formats.items():
                start = time.perf_counter()
                blob = mod.dump_snapshot(obj, key, b"context")
                mod.load_snapshot(blob, key, b"context")
                times[label].append(time.perf_counter() - start)
                size[label] = len(blob)
        line = ", ".join(
            f"{label} {min(t) * 1e3:.1f} ms ({size[label] / 1e6:.2f} MB)"
            for label, t in times.items()
        )
        if "old" in times:
            line += f"; new/old {min(times['new']) / min(times['old']):.2f}"
        print(f"{name}: dump+load {line}")


if __name__ == "__main__":
    main()
