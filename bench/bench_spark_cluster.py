"""Benchmark: ``dpstream run`` events/s, local engine against Spark local[2] and a real
standalone cluster of 1 and 2 workers.

Run by hand from the repository root (PySpark and Java 17 needed; about 10 minutes at
the defaults on 2 cores)::

    python bench/bench_spark_cluster.py [--events 1000000] [--steps 1000]
        [--distinct 100000] [--rounds 3]

The stream is bench/bench_ingest.py's (``make_stream``): ``--events`` JSON Lines events
of 1 to 5 items from ``--distinct`` Zipf(1.1) items over ``--steps`` steps, run with
``-m unknown --max-items 5 --epsilon 1 --delta 1e-6`` (the default counter, the BLT).
Each configuration runs the real command line as a child process, so the time is the
wall time of the whole command (interpreter, JVM and executor start included) and
events/s is ``--events`` over it. The configurations use the same 2 cores:

* ``local``: ``dpstream run`` (the local engine, one process);
* ``local[2]``: ``--engine spark --master 'local[2]'`` (one JVM, two task threads);
* ``1 worker x 2 cores``: a standalone master and one worker of 2 cores (one
  executor JVM running two tasks at a time);
* ``2 workers x 1 core``: a master and two workers of 1 core each (two executor JVMs).

Drivers and executors get 2 GB each (``spark.driver.memory``,
``spark.executor.memory``). The clusters are started once (tests/spark_cluster.py,
loopback, ports chosen by the JVMs) and stopped at the end. Rounds are interleaved (a
load spike on the shared machine hits every configuration of a round) and each
configuration's ratio to the local engine is taken within its round; the table gives
the median over ``--rounds`` rounds and the spread (min-max) of the seconds and ratios.
Prints a markdown table for docs/spark.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.spark_cluster: the cluster helper

from bench_ingest import make_stream  # noqa: E402

from tests.spark_cluster import StandaloneCluster  # noqa: E402

MEMORY = "2g"


def _run(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one command (it must succeed)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the median and spread)")
    # throwaway keys, each run with a ledger of its own (or its ledger removed between
    # rounds): keep them out of the user's key registry, here and in child processes
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dps-bench-cluster-"))
    data = work / "events.jsonl"
    make_stream(data, args.events, args.steps, args.distinct)
    key = work / "key"
    subprocess.run(
        [sys.executable, "-m", "dpstream", "keygen", str(key)], check=True, capture_output=True
    )
    conf = work / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.driver.memory {MEMORY}\nspark.executor.memory {MEMORY}\n"
        # every executor registered before the first job: all workers take part
        "spark.scheduler.minRegisteredResourcesRatio 1.0\n"
    )
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,  # the workers' interpreter (docs/spark.md)
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(conf),
    }
    common = [sys.executable, "-m", "dpstream", "run", "-q", "--key-file", str(key)]
    common += ["-m", "unknown", "-T", str(args.steps), "--max-items", "5"]
    common += ["--epsilon", "1", "--delta", "1e-6", "-i", str(data)]

    cluster_env = {k: v for k, v in env.items() if k != "SPARK_CONF_DIR"}
    clusters = {
        "1 worker x 2 cores": StandaloneCluster(
            work / "c1", workers=1, cores=2, memory=MEMORY, env=cluster_env
        ),
        "2 workers x 1 core": StandaloneCluster(
            work / "c2", workers=2, cores=1, memory=MEMORY, env=cluster_env
        ),
    }
    try:
        for c in clusters.values():
            c.start()
        masters = {"local[2]": "local[2]", **{k: c.master_url for k, c in clusters.items()}}
        names = ["local", *masters]
        # untimed: the first Spark run of an install writes the driver JVM's class
        # archive as it exits (once; docs/spark.md), which no later run pays
        warm = work / "warm-up"
        _run([*common, "--engine", "spark", "--master", "local[2]", "-o", str(warm),
              "--ledger", f"{warm}.ledger"], env)  # fmt: skip
        seconds: dict[str, list[float]] = {n: [] for n in names}
        ratios: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names:
                out = work / "out"  # a file (local engine) or a directory (Spark)
                shutil.rmtree(out, ignore_errors=True)
                out.unlink(missing_ok=True)
                Path(f"{out}.ledger").unlink(missing_ok=True)  # a fresh stream each run
                engine = (
                    ["--engine", "local"]
                    if name == "local"
                    else ["--engine", "spark", "--master", masters[name]]
                )
                argv = [*common, *engine, "-o", str(out), "--ledger", f"{out}.ledger"]
                seconds[name].append(_run(argv, env))
                print(f"round {r + 1} {name}: {seconds[name][-1]:.1f} s", file=sys.stderr)
            for name in names:
                ratios[name].append(seconds["local"][-1] / seconds[name][-1])
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(work, ignore_errors=True)

    def spread(xs: list[float], fmt: str) -> str:
        return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    print(
        f"\n{args.events:,} events, {args.distinct:,} items, T = {args.steps}, "
        f"{args.rounds} rounds; median (min-max)\n"
    )
    print("| configuration | seconds | events/s | ratio to local |")
    print("| --- | --- | --- | --- |")
    for name in names:
        rate = [args.events / s for s in seconds[name]]
        print(
            f"| {name} | {spread(seconds[name], '{:.1f}')} | "
            f"{spread(rate, '{:,.0f}')} | {spread(ratios[name], '{:.2f}')} |"
        )


if __name__ == "__main__":
    main()
