"""Memory and speed of user-level contribution bounding (``dpstream.bounding``).

Run by hand: ``python bench/bench_bounding.py [--users 200000]``.

* memory per tracked user: ``tracemalloc`` around feeding ``--users`` users,
  each contributing to ``items`` distinct items (1, 3, 10), divided by the
  number of users (the bounder's state: the 16-byte keyed hash, the kept items
  and their counts), for the columnar bounder that mechanisms hold
  (``mechanisms.user_bounder.ColumnBounder``) and its event-at-a-time twin
  (``bounding.ContributionBounder``);
* speed: a KnownBase step of 1,000 events at user level against the same
  events at event level, in the same process (a ratio, not a time).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

import dpstream as dps
from dpstream.bounding import ContributionBounder, UserBounds, UserHasher
from dpstream.mechanisms.user_bounder import ColumnBounder


def memory_per_user(users: int, items: int, cls: type = ColumnBounder) -> float:
    rng = np.random.default_rng(1)  # simulated ids and items (benchmark data)
    hasher = UserHasher(dps.NoiseKey.generate())
    names = [f"item-{i}" for i in range(10_000)]
    batch = [
        (hasher(f"user-{u}"), tuple(names[j] for j in rng.integers(0, 10_000, items)))
        for u in range(users)
    ]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    bounder = cls(UserBounds(max_items_per_user=10, max_count_per_item=5))
    for start in range(0, users, 10_000):
        _, pending = bounder.bound(batch[start : start + 10_000])
        bounder.commit(pending)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(bounder) == users
    return (after - before) / users


def step_ratio(repeats: int = 20) -> float:
    rng = np.random.default_rng(2)
    domain = [f"d{i}" for i in range(1000)]
    key = dps.NoiseKey.generate()
    events = [[domain[j] for j in rng.choice(1000, 3, replace=False)] for _ in range(1000)]
    users = [(f"u{rng.integers(0, 5000)}", e) for e in events]
    ev = dps.KnownDomainHistogram(domain, 10_000, max_items=3, key=key, rho=1.0)
    us = dps.KnownDomainHistogram(
        domain, 10_000, key=key, rho=1.0, max_items_per_user=20, max_count_per_item=1_000_000
    )
    times = {"event": 0.0, "user": 0.0}
    for _ in range(repeats):
        t0 = time.perf_counter()
        ev.step_batch(events)
        t1 = time.perf_counter()
        us.step_batch(users)
        t2 = time.perf_counter()
        times["event"] += t1 - t0
        times["user"] += t2 - t1
    return times["user"] / times["event"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200_000)
    args = parser.parse_args()
    print(f"{'items per user':>15} {'bytes per tracked user (columnar, event-at-a-time)':>52}")
    for items in (1, 3, 10):
        col = memory_per_user(args.users, items)
        one = memory_per_user(args.users, items, ContributionBounder)
        print(f"{items:>15} {col:>40.0f} {one:>11.0f}")
    print(f"KnownBase step of 1,000 events: user level / event level time = {step_ratio():.2f}")


if __name__ == "__main__":
    main()
