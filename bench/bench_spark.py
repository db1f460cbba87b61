"""Benchmark: KnownBase releases on Spark (local[2]) against the local engine.

Run by hand (needs the ``spark`` extra and Java):
``python bench/bench_spark.py [--items 1000000] [--steps 8] [--master local[2]]``.

Throughput is item-releases per second (items x steps / wall time), for:

* local: ``KnownDomainHistogram.release(t, counts)`` over all items, step
  after step (the construction, which hashes every item once, is shown apart
  and also amortised over the steps);
* spark step: ``SparkKnownBase.release(t, counts_df)`` on a cached DataFrame of
  (item, count), written to Spark's ``noop`` sink (every value computed,
  nothing stored), one job per step: each step re-hashes the items in the
  executors, since nothing is kept between jobs;
* spark run: ``SparkKnownBase.run(events, domain, steps=...)``, all steps in
  one job from a DataFrame of timed events (the ``dpstream run --engine spark``
  path), written to the ``noop`` sink: one shuffle by item, then each
  partition hashes its items once and advances their tree noise step by step;
* spark stream: ``start_stream`` over a file source, one file per step,
  staged, then ``release_through(t)`` step by step, KnownBase over the whole
  domain: the time of one step's release (steps 2.. only: step 1 hashes every
  item by necessity), snapshot and release written to Parquet in a
  temporary directory.

Ratios are against the local engine's amortised step, measured in the same
process (machines are noisy; ratios travel better than seconds).

``--run-events N`` measures the whole command instead: ``dpstream run`` (local)
against ``dpstream run --engine spark --master local[2]`` on the same JSON Lines
file of N events (``-m unknown``, 1 to 3 of 1,000 items per event, steps of
10,000 events, 5% tricky lines: an escape or an integer item, which the local
reader parses line by line), each a fresh process,
``--rounds`` times alternating: events/s of each and the ratio spark/local,
median over the rounds with its range. With ``--read-only`` the readers alone
on that file: the local chunked reader against ``read_events_jsonl`` cached and
counted, in one session.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import dpstream as dps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--horizon", type=int, default=10_000)
    ap.add_argument("--events-per-step", type=int, default=20_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--stream-items",
        type=int,
        default=None,
        help="domain size of the streaming case (default: --items)",
    )
    ap.add_argument("--only-stream", action="store_true", help="skip the step and run cases")
    ap.add_argument(
        "--run-events", type=int, default=None, help="time the whole command on N events instead"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--read-only",
        action="store_true",
        help="with --run-events: time the input readers alone (Spark's read, cached and "
        "counted, against the local chunked reader), in one session",
    )
    # throwaway keys, each run with a ledger of its own (or its ledger removed between
    # rounds): keep them out of the user's key registry, here and in child processes
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    args = ap.parse_args()
    if args.run_events:
        _run_case(args.run_events, args.rounds, args.master, args.read_only)
        return
    n, steps, T = args.items, args.steps, args.horizon

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    from dpstream.spark import SparkKnownBase

    key = dps.NoiseKey.generate()
    rng = np.random.default_rng(0)  # simulated data only
    increments = [rng.integers(0, n, args.events_per_step) for _ in range(steps)]

    # -- local engine -------------------------------------------------------------
    t0 = time.perf_counter()
    local = dps.KnownDomainHistogram(range(n), T, max_items=1, key=key, rho=1.0)
    build_s = time.perf_counter() - t0
    counts = np.zeros(n, dtype=np.int64)
    t0 = time.perf_counter()
    for t in range(1, steps + 1):
        np.add.at(counts, increments[t - 1], 1)
        local.release(t, counts)
    local_step_s = (time.perf_counter() - t0) / steps
    local_amortised_s = local_step_s + build_s / steps

    # -- Spark ---------------------------------------------------------------------
    spark = (
        SparkSession.builder.master(args.master)
        .appName("dpstream bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if args.only_stream:
        stream_s = _stream_case(spark, key, T, args.stream_items or n, steps, increments)
        spark.stop()
        ns = args.stream_items or n
        print(
            f"items={ns:,} steps={steps} T={T} local step + build/{steps}: "
            f"{local_amortised_s * ns / n * 1e3:.1f} ms (scaled to {ns:,} items)"
        )
        print(
            f"spark stream per micro-batch: {stream_s * 1e3:.1f} ms  "
            f"ratio {local_amortised_s * ns / n / stream_s:5.2f}x"
        )
        return
    remote = SparkKnownBase(spark, T, max_items=1, key=key, rho=1.0, domain=range(n))
    counts_df = (
        spark.range(n).select(F.col("id").alias("item"), (F.col("id") % 7).alias("count")).cache()
    )
    counts_df.count()
    remote.release(1, counts_df, assume_unique=True).write.format("noop").mode(
        "overwrite"
    ).save()  # warm-up (Python workers, Arrow)
    t0 = time.perf_counter()
    for t in range(2, steps + 2):
        remote.release(t, counts_df, assume_unique=True).write.format("noop").mode(
            "overwrite"
        ).save()
    spark_step_s = (time.perf_counter() - t0) / steps

    import pandas as pd

    ev = pd.DataFrame(
        {
            "t": np.repeat(np.arange(1, steps + 1), args.events_per_step),
            "items": [[int(i)] for inc in increments for i in inc],
        }
    )
    events = spark.createDataFrame(ev, "t long, items array<long>").cache()
    events.count()
    domain = spark.range(n).select(F.col("id").alias("item")).cache()
    domain.count()
    runner = SparkKnownBase(spark, T, max_items=1, key=key, rho=1.0, domain=domain)
    t0 = time.perf_counter()
    runner.run(events, domain, steps=range(1, steps + 1)).write.format("noop").mode(
        "overwrite"
    ).save()
    spark_run_s = (time.perf_counter() - t0) / steps
    stream_s = _stream_case(spark, key, T, args.stream_items or n, steps, increments)
    spark.stop()

    def rate(s: float) -> str:
        return f"{n / s / 1e6:7.2f} M item-releases/s"

    print(f"items={n:,}  steps={steps}  T={T}  base={local.base}  master={args.master}")
    print(f"local construct (hash {n:,} items once): {build_s:7.2f} s")
    print(f"local step:             {local_step_s * 1e3:9.1f} ms  {rate(local_step_s)}")
    print(
        f"local step + build/{steps}:  {local_amortised_s * 1e3:9.1f} ms  "
        f"{rate(local_amortised_s)}  (baseline = 1.00)"
    )
    print(
        f"spark step (one job):   {spark_step_s * 1e3:9.1f} ms  {rate(spark_step_s)}  "
        f"ratio {local_amortised_s / spark_step_s:5.2f}x"
    )
    print(
        f"spark run (all steps):  {spark_run_s * 1e3:9.1f} ms  {rate(spark_run_s)}  "
        f"ratio {local_amortised_s / spark_run_s:5.2f}x"
    )
    ns = args.stream_items or n
    print(
        f"spark stream ({ns:,} items, per micro-batch): {stream_s * 1e3:9.1f} ms  "
        f"{ns / stream_s / 1e6:7.2f} M item-releases/s  "
        f"ratio {local_amortised_s * ns / n / stream_s:5.2f}x"
    )
    print("ratio = local time / spark time (> 1: Spark is faster)")


def _stream_case(spark, key, horizon: int, n: int, steps: int, increments) -> float:
    """Median per-micro-batch time of ``start_stream`` (KnownBase, n domain items), steps 2..."""
    import json
    import os
    import tempfile

    import pandas as pd
    from pyspark.sql import functions as F  # noqa: N812

    from dpstream.spark import SparkKnownBase
    from dpstream.spark.streaming import start_stream

    with tempfile.TemporaryDirectory(prefix="dpstream-bench-") as tmp:
        src = os.path.join(tmp, "in")
        os.mkdir(src)
        for t, inc in enumerate(increments, start=1):
            path = os.path.join(src, f"step-{t:04d}.json")
            with open(path, "w") as f:
                f.write("\n".join(json.dumps({"t": t, "items": [int(i) % n]}) for i in inc) + "\n")
            os.utime(path, (1_700_000_000 + 60 * t, 1_700_000_000 + 60 * t))
        domain = spark.createDataFrame(pd.DataFrame({"item": np.arange(n, dtype=np.int64)}))
        domain = domain.select(F.col("item")).cache()
        domain.count()
        mech = SparkKnownBase(spark, horizon, max_items=1, key=key, rho=1.0, domain=domain)
        events = (
            spark.readStream.schema("t long, items array<long>")
            .option("maxFilesPerTrigger", 1)
            .json(src)
        )
        rel = start_stream(
            mech,
            events,
            output_path=os.path.join(tmp, "out"),
            checkpoint_location=os.path.join(tmp, "ckpt"),
            domain=domain,
            trigger={"availableNow": True},
        )
        rel.awaitTermination()  # staging; then each step's release, timed
        times = []
        for t in range(1, len(increments) + 1):
            start = time.perf_counter()
            rel.release_through(t)
            if t >= 2:
                times.append(time.perf_counter() - start)
    return float(np.median(times))


def _run_case(n: int, rounds: int, master: str, read_only: bool = False) -> None:
    """Events/s of ``dpstream run`` on each engine over one file of ``n`` events (or of
    the readers alone)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    rng = np.random.default_rng(1)  # simulated data only
    with tempfile.TemporaryDirectory(prefix="dpstream-bench-run-") as tmp:
        inp = os.path.join(tmp, "events.jsonl")
        sizes = rng.integers(1, 4, n)
        items = rng.integers(0, 1000, int(sizes.sum()))
        tricky = rng.random(n) < 0.05
        with open(inp, "w") as f:
            at = 0
            for i in range(n):
                its = [f"item-{k}" for k in items[at : at + sizes[i]].tolist()]
                at += int(sizes[i])
                t = i // 10_000 + 1
                if tricky[i]:  # an escape (json.dumps writes \u00e9) or an integer item
                    its[0] = its[0] + "\u00e9" if i % 2 else int(items[at - 1])
                f.write(json.dumps({"t": t, "items": its}) + "\n")
        if read_only:
            _read_case(inp, n, rounds, master)
            return
        key = os.path.join(tmp, "k.key")
        subprocess.run([sys.executable, "-m", "dpstream", "keygen", key], check=True)
        horizon = n // 10_000 + 1
        base = [sys.executable, "-m", "dpstream", "run", "-q", "-m", "unknown", "-T"]
        base += [str(horizon), "--max-items", "3", "--rho", "1", "--threshold-delta", "1e-6"]
        base += ["--key-file", key, "-i", inp]
        # untimed: the first Spark run of an install writes the driver JVM's class
        # archive as it exits (once; docs/spark.md), which no later run pays
        warm = os.path.join(tmp, "warm-up")
        warm_argv = [*base, "--engine", "spark", "--master", master, "-o", warm]
        subprocess.run([*warm_argv, "--ledger", warm + ".ledger"], check=True)
        rates: dict[str, list[float]] = {"local": [], "spark": []}
        for r in range(rounds):
            for name in ("local", "spark"):
                out = os.path.join(tmp, f"{name}-{r}" + (".csv" if name == "local" else ""))
                extra = ["--engine", "spark", "--master", master] if name == "spark" else []
                argv = [*base, *extra, "-o", out, "--ledger", out + ".ledger"]
                t0 = time.perf_counter()
                subprocess.run(argv, check=True)
                rates[name].append(n / (time.perf_counter() - t0))
        _report(f"dpstream run, {n:,} events", rounds, master, rates, "events")


def _read_case(inp: str, n: int, rounds: int, master: str) -> None:
    """Events/s of the readers alone: the local chunked reader, and Spark's
    ``read_events_jsonl`` cached and counted (one session, warmed up by a first read)."""
    from dpstream.io import open_input
    from dpstream.io.reading import read_chunks
    from dpstream.spark.events import read_events_jsonl
    from dpstream.spark.session import start_session

    spark = start_session(master)
    spark.sparkContext.setLogLevel("ERROR")
    read_events_jsonl(spark, inp).cache().unpersist()  # warm-up (JVM, Python workers)
    rates: dict[str, list[float]] = {"local": [], "spark": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        with open_input(inp) as f:
            got = sum(len(c) for c in read_chunks(f, "jsonl"))
        rates["local"].append(got / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        df = read_events_jsonl(spark, inp).cache()
        got = df.count()
        rates["spark"].append(got / (time.perf_counter() - t0))
        df.unpersist()
    spark.stop()
    _report(f"readers alone, {n:,} lines", rounds, master, rates, "lines")


def _report(title: str, rounds: int, master: str, rates: dict[str, list[float]], unit: str) -> None:
    """Each engine's median rate with its range, and the median ratio spark/local over
    the rounds (each round's two runs side by side)."""
    ratios = [s / loc for s, loc in zip(rates["spark"], rates["local"], strict=True)]
    print(f"{title}, {rounds} rounds, spark --master {master}")
    for name, vals in rates.items():
        print(
            f"{name:>5}: median {np.median(vals) / 1e3:8.1f} k {unit}/s "
            f"(range {min(vals) / 1e3:.1f}-{max(vals) / 1e3:.1f})"
        )
    print(
        f"ratio spark/local: median {np.median(ratios):.3f} "
        f"(range {min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
