"""Utility of user-level releases against event-level ones, at the same epsilon and delta.

Run by hand: ``python bench/bench_user_level.py [--trials 5] [--plot FILE.png]``;
``--speed`` measures instead the CPU cost of ``dpstream run --user-field user`` against
``json.loads`` of its input (see :func:`speed`).

A simulated stream with heavy users: U users whose activity is Zipf (a few
users make many events), each event holding 1..3 items drawn from a Zipf
distribution over D items, spread uniformly over T steps. The same budget
(epsilon, delta) is spent by

* KnownBase per event (``--max-items 3``): it counts every event, but protects
  one event only; the table says what it gives the heaviest user (the exact
  Gaussian epsilon of that user's whole contribution, the group-privacy cost);
* KnownBase per user with several (L0, Linf) bounds: it protects each user
  entirely, drops what exceeds the bounds (a bias), and needs more noise
  (tau grows with sqrt(L0) Linf / sqrt(Delta0)).

Errors are at the last step T, mean over ``--trials`` keys (simulation mode:
keys from a fixed seed, never for a release): the relative error of the 20
items with the largest true counts against the raw stream's counts (what an
analyst wants: noise and the bias of dropped contributions), the same against
the bounded stream's counts (noise only), how many of the true top 20 are in
the released top 20, and the RMSE over all items.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os

import numpy as np

import dpstream as dps
from dpstream.bounding import ContributionBounder, UserBounds
from dpstream.privacy import gaussian_epsilon


def simulate(seed: int, users: int, items: int, horizon: int, events: int, user_zipf: float):
    """(per-step events as (user, items) lists) for the simulated stream."""
    rng = np.random.default_rng(seed)  # simulation data, not a release
    user_w = 1.0 / np.arange(1, users + 1) ** user_zipf
    item_w = 1.0 / np.arange(1, items + 1) ** 1.0
    who = rng.choice(users, size=events, p=user_w / user_w.sum())
    when = np.sort(rng.integers(1, horizon + 1, size=events))
    steps: list[list] = [[] for _ in range(horizon + 1)]
    for u, t in zip(who.tolist(), when.tolist(), strict=True):
        n = int(rng.integers(1, 4))
        chosen = rng.choice(items, size=n, replace=False, p=item_w / item_w.sum())
        steps[t].append((f"user{u}", [f"item{i}" for i in chosen.tolist()]))
    return steps


def raw_counts(steps, items: int) -> np.ndarray:
    counts = np.zeros(items, dtype=np.int64)
    for evs in steps:
        for _, its in evs:
            for it in its:
                counts[int(it[4:])] += 1
    return counts


def heaviest_user_epsilon(steps, items: int, tau: float, delta: float) -> tuple[int, float]:
    """The heaviest user's events, and the exact epsilon the event-level run gives them.

    That user changes item u's count by c_u (over all their events); KnownBase's
    table is a Gaussian mechanism on them with ratio sqrt(sum c_u^2) / tau (the
    worst placement, lemma in dpstream.bounding), so the user is protected at
    gaussian_epsilon(delta, that ratio).
    """
    per_user: dict[str, np.ndarray] = {}
    n_events: dict[str, int] = {}
    for evs in steps:
        for u, its in evs:
            c = per_user.setdefault(u, np.zeros(items, dtype=np.int64))
            for it in its:
                c[int(it[4:])] += 1
            n_events[u] = n_events.get(u, 0) + 1
    heavy = max(n_events, key=n_events.get)
    mu = math.sqrt(float(np.sum(per_user[heavy].astype(float) ** 2))) / tau
    return n_events[heavy], gaussian_epsilon(delta, mu)


def key_for(trial: int) -> dps.NoiseKey:
    return dps.NoiseKey.from_bytes(hashlib.sha256(f"bench-user-level:{trial}".encode()).digest())


def run(steps, config, key, items: int, horizon: int, eps: float, delta: float):
    domain = [f"item{i}" for i in range(items)]
    if config == "event":
        mech = dps.KnownDomainHistogram(
            domain, horizon, max_items=3, key=key, epsilon=eps, delta=delta
        )
        kept = steps
    else:
        l0, linf = config
        mech = dps.KnownDomainHistogram(
            domain,
            horizon,
            key=key,
            epsilon=eps,
            delta=delta,
            max_items_per_user=l0,
            max_count_per_item=linf,
        )
        bounder = ContributionBounder(UserBounds(l0, linf))  # bounded here: aggregate mode
        kept = []
        for evs in steps:
            out, pending = bounder.bound([(u.encode(), its) for u, its in evs])
            bounder.commit(pending)
            kept.append([(u, k) for (u, _), k in zip(evs, out, strict=True)])
    counts = raw_counts(kept, items)
    rel = mech.release(horizon, counts)  # aggregate mode at T (any step may be skipped)
    return mech, counts, np.asarray(rel.values)


def write_user_stream(path, events: int, steps: int, distinct: int, users: int) -> None:
    """The speed stream: ``{"t", "user", "items"}`` lines, 1..5 items (Zipf 1.1 over
    ``distinct`` items), users Zipf 0.8 over ``users`` (simulation data, seed 0)."""
    import json

    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 6, events)
    ranks = rng.zipf(1.1, int(sizes.sum())) % distinct
    user_w = 1.0 / np.arange(1, users + 1) ** 0.8
    who = rng.choice(users, size=events, p=user_w / user_w.sum()).tolist()
    per_step = max(1, events // steps)
    with open(path, "w", encoding="utf-8") as fh:
        pos, buf = 0, []
        for e, size in enumerate(sizes.tolist()):
            items = [f"item{r}" for r in ranks[pos : pos + size].tolist()]
            pos += size
            t = min(e // per_step + 1, steps)
            buf.append(json.dumps({"t": t, "user": f"user{who[e]}", "items": items}))
            if len(buf) >= 10000:
                fh.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            fh.write("\n".join(buf) + "\n")


def speed(args) -> None:
    """CPU of ``dpstream run -m unknown --user-field user`` against ``json.loads`` of every
    line, timed side by side in this process (``--rounds`` rounds, interleaved: a load
    spike hits both); prints the median ratio and its spread over the rounds, and the
    same run at event level (what the user ids and their bounds add)."""
    import contextlib
    import io
    import json
    import os
    import statistics
    import tempfile
    import time
    from pathlib import Path

    from dpstream.cli import main as cli_main

    work = Path(tempfile.mkdtemp(prefix="dps-bench-users-"))
    data = work / "events.jsonl"
    write_user_stream(data, args.events, args.horizon, args.items, args.users)
    key_path = work / "key"
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["keygen", str(key_path)])

    def loads() -> None:
        f = json.loads
        with open(data, encoding="utf-8") as fh:
            for line in fh:
                f(line)

    def run(users: bool = True) -> None:
        with contextlib.suppress(FileNotFoundError):  # the stream anew (a throwaway key)
            os.remove(f"{key_path}.ledger")
        argv = ["run", "--quiet", "-m", "unknown", "-T", str(args.horizon), "--max-items", "5"]
        if users:
            argv += ["--user-field", "user", "--max-items-per-user", "5"]
            argv += ["--max-count-per-item", "2"]
        argv += ["--epsilon", "1", "--delta", "1e-6"]
        argv += ["--key-file", str(key_path), "-i", str(data), "-o", str(work / "out.jsonl")]
        assert cli_main([*argv, "--force", "--no-fsync"]) == 0

    ratios, runs, floors, events = [], [], [], []
    for _ in range(args.rounds):
        a = time.process_time()
        loads()
        b = time.process_time()
        run()
        c = time.process_time()
        run(users=False)
        d = time.process_time()
        floors.append(b - a)
        runs.append(c - b)
        events.append((d - c) / (b - a))
        ratios.append((c - b) / (b - a))
    med = statistics.median(runs)
    print(
        f"{args.events:,} events of {args.users:,} users over {args.items:,} items, "
        f"T = {args.horizon}; {args.rounds} rounds"
    )
    print(f"json.loads:     {statistics.median(floors):6.2f} s CPU (median)")
    print(
        f"run --user-field: {med:6.2f} s CPU (median), {args.events / med:,.0f} events/s: "
        f"{statistics.median(ratios):.2f}x json.loads (rounds {min(ratios):.2f}x-"
        f"{max(ratios):.2f}x; goal <= 3x)"
    )
    print(
        f"the same run at event level (no --user-field): {statistics.median(events):.2f}x "
        f"json.loads (rounds {min(events):.2f}x-{max(events):.2f}x)"
    )


def main() -> None:
    # throwaway keys whose ledgers each round removes: keep them out of the user's key
    # registry (which would warn of a removed ledger at every round), here and in children
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--speed",
        action="store_true",
        help="time `dpstream run --user-field` against json.loads instead (defaults "
        "then: 10^6 events, 10^5 items, 10^5 users, T = 1000)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--speed: rounds")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--users", type=int, default=None, help="20,000 (--speed: 10^5)")
    parser.add_argument(
        "--user-zipf", type=float, default=0.8, help="Zipf exponent of the users' activity"
    )
    parser.add_argument("--items", type=int, default=None, help="500 (--speed: 10^5)")
    parser.add_argument("--horizon", type=int, default=1000)
    parser.add_argument("--events", type=int, default=None, help="10^5 (--speed: 10^6)")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--plot", default=None, help="write a bar chart to this PNG")
    args = parser.parse_args()
    big = args.speed
    args.users = args.users or (100_000 if big else 20_000)
    args.items = args.items or (100_000 if big else 500)
    args.events = args.events or (1_000_000 if big else 100_000)
    if big:
        speed(args)
        return
    steps = simulate(1, args.users, args.items, args.horizon, args.events, args.user_zipf)
    truth = raw_counts(steps, args.items)
    top = np.argsort(-truth)[:20]
    configs = ["event", (1, 1), (3, 1), (3, 5), (10, 5), (10, 20)]
    print(
        f"stream: {args.events} events of {args.users} users (Zipf {args.user_zipf:g}) over "
        f"{args.items} "
        f"items (Zipf 1.0), T = {args.horizon}; (epsilon, delta) = ({args.epsilon:g}, "
        f"{args.delta:g}); errors at t = T, mean of {args.trials} keys"
    )
    header = (
        f"{'unit':<7}{'L0':>4}{'Linf':>5}{'tau':>8}{'noise std':>10}{'kept':>7}"
        f"{'top-20 rel. err':>16}{'(noise only)':>13}{'top-20 found':>13}"
        f"{'RMSE all':>10}"
    )
    print(header)
    rows = []
    for config in configs:
        rel_err, noise_err, found, rmse = [], [], [], []
        for trial in range(args.trials):
            mech, kept, values = run(
                steps, config, key_for(trial), args.items, args.horizon, args.epsilon, args.delta
            )
            rel_err.append(float(np.mean(np.abs(values[top] - truth[top]) / truth[top])))
            ktop = np.argsort(-kept)[:20]
            noise_err.append(float(np.mean(np.abs(values[ktop] - kept[ktop]) / kept[ktop])))
            found.append(len(set(np.argsort(-values)[:20].tolist()) & set(top.tolist())) / 20)
            rmse.append(float(np.sqrt(np.mean((values - truth) ** 2))))
        std = mech.noise_std_at(args.horizon)
        unit, l0, linf = ("event", "-", "-") if config == "event" else ("user", *config)
        frac = kept.sum() / truth.sum()
        rows.append((unit, l0, linf, mech.tau, std, frac, np.mean(rel_err), np.mean(found)))
        print(
            f"{unit:<7}{l0!s:>4}{linf!s:>5}{mech.tau:>8.2f}{std:>10.1f}{frac:>7.0%}"
            f"{np.mean(rel_err):>16.1%}{np.mean(noise_err):>13.1%}{np.mean(found):>13.0%}"
            f"{np.mean(rmse):>10.1f}"
        )
        if config == "event":
            n, eps_heavy = heaviest_user_epsilon(steps, args.items, mech.tau, args.delta)
            print(
                f"{'':7}the event-level run protects its heaviest user ({n} events) only "
                f"at epsilon = {eps_heavy:.1f} (delta {args.delta:g})"
            )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["per event" if r[0] == "event" else f"user L0={r[1]} Linf={r[2]}" for r in rows]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.bar(labels, [100 * r[7] for r in rows], color=["#888"] + ["#3a7"] * (len(rows) - 1))
        ax.set_ylabel("true top 20 found (%)")
        ax.set_title(f"same budget (epsilon={args.epsilon:g}, delta={args.delta:g})")
        ax.tick_params(axis="x", labelrotation=25, labelsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
