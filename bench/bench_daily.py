"""Incremental runs: what a resume inside day 17 costs, against one run over all 30 days.

A stream of 30 "days" (JSON Lines files, explicit steps) is released one day per
``dpstream run --state`` invocation with ``--until``. Day 17 is then killed
mid-way and resumed: the resume starts from the snapshot saved after day 16 and
replays day 17's steps only, so its time does not grow with the days before.
Printed: the whole-stream run, the sum of the 30 daily runs, and the resume of
day 17, as seconds and as ratios against the whole run (same process, same
machine; run by hand: ``python bench/bench_daily.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpstream import NoiseKey
from dpstream.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _write_days(base: Path, days: int, steps: int, events: int, items: int) -> None:
    rng = np.random.default_rng(7)  # simulated events: benchmark data, not a release
    p = np.arange(1, items + 1, dtype=float) ** -1.1
    p /= p.sum()
    with open(base / "all.jsonl", "w") as whole:
        for d in range(1, days + 1):
            lines = []
            for t in range((d - 1) * steps + 1, d * steps + 1):
                draws = rng.choice(items, size=(events, 2), p=p)
                lines += [
                    json.dumps({"t": t, "items": [f"w{a}", f"w{b}"]}) + "\n" for a, b in draws
                ]
            text = "".join(lines)
            (base / f"day{d:02d}.jsonl").write_text(text)
            whole.write(text)


def main_bench() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--steps", type=int, default=24, help="steps per day")
    ap.add_argument("--events", type=int, default=200, help="events per step")
    ap.add_argument("--items", type=int, default=5000)
    # throwaway keys, each run with a ledger of its own (or its ledger removed between
    # rounds): keep them out of the user's key registry, here and in child processes
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dpstream-daily-"))
    try:
        _write_days(base, args.days, args.steps, args.events, args.items)
        NoiseKey.generate().save(base / "k.key")
        horizon = args.days * args.steps
        common = [
            "run",
            "-q",
            "-m",
            "unknown",
            "-T",
            str(horizon),
            "--max-items",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--key-file",
            str(base / "k.key"),
            "--no-fsync",
        ]
        start = time.perf_counter()
        # the reference keeps its own release ledger: the daily runs draw the same noise
        assert (
            main(
                [
                    *common,
                    "-i",
                    str(base / "all.jsonl"),
                    "-o",
                    str(base / "ref.jsonl"),
                    "--ledger",
                    str(base / "ref.ledger"),
                ]
            )
            == 0
        )
        whole = time.perf_counter() - start

        out, state = base / "out.jsonl", base / "s.sqlite"

        def day_args(d: int) -> list[str]:
            until = [] if d == args.days else ["--until", str(d * args.steps)]
            return [
                *common,
                "-i",
                str(base / f"day{d:02d}.jsonl"),
                "-o",
                str(out),
                "--state",
                str(state),
                *until,
            ]

        daily = 0.0
        killed = min(17, args.days // 2 + 1)  # the day killed mid-way (17 of 30 days)
        for d in range(1, killed):
            start = time.perf_counter()
            assert main(day_args(d)) == 0
            daily += time.perf_counter() - start
        env = {**os.environ, "PYTHONPATH": SRC}
        proc = subprocess.Popen([sys.executable, "-m", "dpstream", *day_args(killed)], env=env)
        target = (killed - 1) * args.steps + args.steps // 2
        while out.read_bytes().count(b"\n") < target and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        start = time.perf_counter()
        assert main(day_args(killed)) == 0
        resume = time.perf_counter() - start
        daily += resume
        for d in range(killed + 1, args.days + 1):
            start = time.perf_counter()
            assert main(day_args(d)) == 0
            daily += time.perf_counter() - start
        same = out.read_bytes() == (base / "ref.jsonl").read_bytes()
        print(
            f"{args.days} days x {args.steps} steps x {args.events} events/step "
            f"({args.days * args.steps * args.events:,} events), unknown domain"
        )
        print(f"one run over all days      {whole:7.2f} s  1.00x")
        print(f"{args.days} daily runs, summed      {daily:7.2f} s  {daily / whole:.2f}x")
        print(
            f"resume of day {killed} (killed)  {resume:7.2f} s  {resume / whole:.3f}x "
            f"(one day is {1 / args.days:.3f} of the stream)"
        )
        print(f"daily output == one run's: {same}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main_bench()
