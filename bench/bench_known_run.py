"""Benchmark: ``dpstream run -m known`` over a large domain, and its output formatting.

Run by hand: ``python bench/bench_known_run.py [--domain 100000] [--steps 100]``.

Every step releases every domain item, so the output is as large as the
domain times the steps. Prints the CPU time of the run per step for each
output format, and, in the same process, the CPU time of the step's release
alone (``KnownDomainHistogram.release`` from an array) and of formatting one
release of the domain's size: the goal is that formatting does not dominate.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    import dpstream as dps
    from dpstream.cli import main as cli_main
    from dpstream.io import make_formatter

    work = Path(tempfile.mkdtemp(prefix="dps-known-"))
    names = [f"drug{i}" for i in range(args.domain)]
    (work / "domain.txt").write_text("\n".join(names) + "\n")
    rng = np.random.default_rng(0)  # simulation data only
    with open(work / "ev.jsonl", "w") as fh:
        for t in range(1, args.steps + 1):
            for _ in range(1000):
                fh.write(
                    json.dumps(
                        {"t": t, "items": [names[j] for j in rng.integers(0, args.domain, 3)]}
                    )
                    + "\n"
                )
    key = work / "k.key"
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["keygen", str(key)])
    base = [
        "run",
        "--quiet",
        "-m",
        "known",
        "-T",
        str(args.steps),
        "--domain",
        str(work / "domain.txt"),
        "--max-items",
        "3",
        "--rho",
        "1",
        "--key-file",
        str(key),
        "-i",
        str(work / "ev.jsonl"),
        "--force",
    ]
    print(
        f"-m known, {args.domain:,} domain items, {args.steps} steps of 1,000 events (CPU per step)"
    )
    for fmt, ext in (
        ("jsonl", "jsonl"),
        ("csv", "csv"),
        ("jsonl-long", "jsonl"),
        ("parquet", "parquet"),
    ):
        out = work / f"out.{ext}"
        argv = [*base, "-o", str(out), "--output-format", fmt]
        per = cpu(lambda argv=argv: cli_main(argv)) / args.steps
        size = out.stat().st_size / args.steps / 1e6
        print(f"  run, {fmt:<11} {per * 1e3:8.1f} ms  ({size:.1f} MB per step)")
    h = dps.KnownDomainHistogram(
        names, args.steps, max_items=3, key=dps.NoiseKey.generate(), rho=1.0
    )
    counts = np.zeros(args.domain, dtype=np.int64)
    rel = None
    release_s = 0.0
    for t in range(1, 11):
        counts[rng.integers(0, args.domain, 3000)] += 1
        start = time.process_time()
        rel = h.release(t, counts)
        release_s += time.process_time() - start
    release_s /= 10
    print(f"  release alone    {release_s * 1e3:8.1f} ms  (baseline 1.00)")
    rel = dps.Release(t=rel.t, items=rel.items, values=rel.values, meta={"noise_std": 3.2})
    for fmt in ("jsonl", "csv", "jsonl-long"):
        f = make_formatter(fmt, True)
        f.format(rel)  # the domain's text is encoded once per run
        per = min(cpu(lambda f=f: f.format(rel)) for _ in range(5))
        print(f"  format, {fmt:<9} {per * 1e3:8.1f} ms  {per / release_s:5.2f}x the release")


if __name__ == "__main__":
    main()
