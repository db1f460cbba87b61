"""Benchmark: ``dpstream run`` end to end, and library ingest, against json.loads.

Run by hand: ``python bench/bench_ingest.py [--events 1000000] [--steps 1000]
[--mechanism {unknown,known,top-k}]``.

The stream: ``--events`` JSON Lines events ``{"t": .., "items": [..]}`` with 1 to
5 items each (3 on average), drawn from ``--distinct`` items with Zipf(1.1)
popularity, ``--events / --steps`` events per step. Prints CPU times (process
time, the machine is shared) as ratios against floors measured in the same
process, repeated ``--repeat`` times (the best of each, and the per-round ratios):

* reading the lines alone, and ``json.loads`` of every line (the floor the
  command is held to: the goal is ``run`` <= 2x ``json.loads``, 2.5x for known and
  top-k);
* ``dpstream run -m MECHANISM --state`` (write-ahead state, keyed digests) and
  without ``--state``, in events/s, with the median and spread of the per-round
  ratios (each round times ``json.loads`` and the run side by side). ``--mechanism``:
  ``unknown`` (``--max-items 5``), ``known`` (``--domain``, a file of the
  ``--distinct`` items written here, ``--max-items 5``) or ``top-k`` (the same
  domain, ``--k 10``, ``--max-items 5`` and no ``--switches``: the command chooses
  between top-k with switches and top-k from a histogram); the counter is the
  default for T (BLT);
* a json.loads script and ``dpstream run`` as whole processes (interpreter start
  and imports included);
* library ingest (``--mechanism unknown`` only): ``UnknownDomainHistogram.step_batch``
  on the same events (pre-parsed), in item occurrences/s (goal >= 2M/s per core),
  against a dict lookup + ``bincount`` of the same occurrences.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_stream(path: Path, events: int, steps: int, distinct: int, seed: int = 0) -> None:
    """Write the benchmark stream (simulation data: NumPy's PCG64 is fine here)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, events)
    ranks = rng.zipf(1.1, int(sizes.sum())) % distinct
    per_step = max(1, events // steps)
    names = [f"item{i}" for i in range(distinct)]
    with open(path, "w", encoding="utf-8") as fh:
        pos = 0
        buf = []
        for e, size in enumerate(sizes.tolist()):
            items = [names[r] for r in ranks[pos : pos + size].tolist()]
            pos += size
            buf.append(json.dumps({"t": min(e // per_step + 1, steps), "items": items}))
            if len(buf) >= 10000:
                fh.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            fh.write("\n".join(buf) + "\n")


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def child_cpu(argv: list[str]) -> float:
    """User + system CPU of one child process, start to exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best(fn, repeat: int) -> float:
    return min(cpu(fn) for _ in range(repeat))


def main() -> None:
    # throwaway keys whose ledgers each round removes: keep them out of the user's key
    # registry (which would warn of a removed ledger at every round), here and in children
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (the median and spread)")
    ap.add_argument("--mechanism", choices=("unknown", "known", "top-k"), default="unknown")
    ap.add_argument("--no-library", action="store_true")
    args = ap.parse_args()

    import dpstream as dps
    from dpstream.cli import main as cli_main

    work = Path(tempfile.mkdtemp(prefix="dps-bench-"))
    data = work / "events.jsonl"
    make_stream(data, args.events, args.steps, args.distinct)
    domain = work / "domain.txt"
    domain.write_text("".join(f"item{i}\n" for i in range(args.distinct)), encoding="utf-8")
    # the events hold 1 to 5 items (--max-items 5); known and top-k read the domain
    mech_args = ["-m", args.mechanism, "-T", str(args.steps), "--max-items", "5"]
    if args.mechanism != "unknown":
        mech_args += ["--domain", str(domain)]
    if args.mechanism == "top-k":
        mech_args += ["--k", "10"]
    key_path = work / "key"
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["keygen", str(key_path)])
    lines = data.read_text(encoding="utf-8").splitlines()
    n_events = len(lines)
    occurrences = sum(line.count('"item') - 1 for line in lines)  # not the "items" key

    def read_lines() -> None:
        with open(data, encoding="utf-8") as fh:
            for _ in fh:
                pass

    def json_loads() -> None:
        loads = json.loads
        with open(data, encoding="utf-8") as fh:
            for line in fh:
                loads(line)

    def run(state: bool) -> None:
        out = work / "out.jsonl"
        st = work / "state.sqlite"
        # a throwaway key: each timed run starts its stream anew (the ledger too)
        for p in (
            out,
            st,
            Path(str(st) + "-wal"),
            Path(str(st) + "-shm"),
            Path(f"{key_path}.ledger"),
        ):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
        argv = [
            "run",
            "--quiet",
            *mech_args,
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--key-file",
            str(key_path),
            "-i",
            str(data),
            "-o",
            str(out),
            "--force",
            "--no-fsync",
        ]
        if state:
            argv += ["--state", str(st)]
        rc = cli_main(argv)
        assert rc == 0, rc

    # the keyed noise of the run (TreeNoise), timed inside one run: the part of the
    # run that is the mechanism's own arithmetic, not input or output
    from dpstream.mechanisms import tree_noise

    noise_cpu = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            start = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                noise_cpu[0] += time.process_time() - start

        return wrapper

    originals = {name: getattr(tree_noise.TreeNoise, name) for name in ("advance", "add_items")}
    if args.mechanism == "unknown":
        for name, fn in originals.items():
            setattr(tree_noise.TreeNoise, name, timed(fn))
        try:
            run(False)
        finally:
            for name, fn in originals.items():
                setattr(tree_noise.TreeNoise, name, fn)

    results: dict[str, float] = {}
    rounds: dict[str, list[float]] = {}
    for _ in range(args.repeat):  # interleaved: a load spike hits every path alike
        for name, fn in (
            ("read", read_lines),
            ("json", json_loads),
            ("run", lambda: run(False)),
            ("run_state", lambda: run(True)),
        ):
            rounds.setdefault(name, []).append(cpu(fn))
            results[name] = min(rounds[name])

    floor = results["json"]
    goal = "2x" if args.mechanism == "unknown" else "2.5x"
    print(
        f"{n_events:,} events, {occurrences:,} item occurrences, {args.distinct:,} distinct "
        f"items (Zipf), {args.steps:,} steps; dpstream run {' '.join(mech_args[:2])}, "
        f"{args.repeat} rounds"
    )
    print(
        f"read lines:            {results['read']:7.2f} s CPU  "
        f"{n_events / results['read']:>12,.0f} events/s"
    )
    print(f"json.loads (floor):    {floor:7.2f} s CPU  {n_events / floor:>12,.0f} events/s  1.00x")
    for name in ("run", "run_state"):
        label = "dpstream run" + (" --state" if name == "run_state" else "")
        print(
            f"{label:<22} {results[name]:7.2f} s CPU  {n_events / results[name]:>12,.0f} "
            f"events/s  {results[name] / floor:5.2f}x json.loads (best of each)"
        )
        # the same ratio within each round (run and json.loads timed side by side):
        # its spread shows how much of a difference this machine can resolve
        ratios = [r / j for r, j in zip(rounds[name], rounds["json"], strict=True)]
        print(
            f"{'':<22} per round: median {float(np.median(ratios)):.2f}x "
            f"[{min(ratios):.2f}x-{max(ratios):.2f}x] (goal <= {goal})"
        )
    if args.mechanism == "unknown":  # TreeNoise, timed in the unknown run only
        rest = results["run"] - noise_cpu[0]
        print(
            f"  of which keyed noise:  {noise_cpu[0]:7.2f} s CPU (TreeNoise, one run); the rest "
            f"{rest:.2f} s = {rest / floor:.2f}x json.loads"
        )
    # whole processes, as a user runs them: the interpreter's start and every import
    # count, on both sides (a script that only json.loads the lines is the floor)
    loads_script = (
        "import json, sys\nloads = json.loads\n"
        "with open(sys.argv[1], encoding='utf-8') as fh:\n"
        "    for line in fh:\n        loads(line)\n"
    )
    cli = [
        sys.executable,
        "-m",
        "dpstream",
        "run",
        "--quiet",
        *mech_args,
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--key-file",
        str(key_path),
        "-i",
        str(data),
        "-o",
        str(work / "out.jsonl"),
        "--force",
        "--no-fsync",
    ]
    proc: dict[str, list[float]] = {"json": [], "run": []}
    for _ in range(args.repeat):
        proc["json"].append(child_cpu([sys.executable, "-c", loads_script, str(data)]))
        with contextlib.suppress(FileNotFoundError):  # the stream anew (a throwaway key)
            os.remove(f"{key_path}.ledger")
        proc["run"].append(child_cpu(cli))
    pj, pr = min(proc["json"]), min(proc["run"])
    print(
        f"as processes:  json.loads script {pj:5.2f} s CPU, dpstream run {pr:5.2f} s CPU "
        f"({n_events / pr:,.0f} events/s): {pr / pj:.2f}x"
    )
    if args.no_library or args.mechanism != "unknown":
        return
    # library ingest on the same events, parsed and grouped beforehand
    steps: dict[int, list[list[str]]] = {}
    for line in lines:
        obj = json.loads(line)
        steps.setdefault(obj["t"], []).append(obj["items"])
    batches = [steps.get(t, []) for t in range(1, args.steps + 1)]
    key = dps.NoiseKey.generate()

    def library() -> None:
        u = dps.UnknownDomainHistogram(
            args.steps, max_items=5, key=key, epsilon=1.0, delta=1e-6, noise_version=2
        )  # as run's new streams
        for batch in batches:
            u.step_batch(batch)

    def floor_lookup() -> None:
        index: dict[str, int] = {}
        counts = np.zeros(0, dtype=np.int64)
        for batch in batches:
            pos = [index.setdefault(i, len(index)) for e in batch for i in e]
            counts = np.bincount(np.asarray(pos, dtype=np.int64), minlength=len(index))
        assert counts.sum() >= 0

    lib = best(library, args.repeat)
    flo = best(floor_lookup, args.repeat)
    noise_cpu[0] = 0.0
    for name, fn in originals.items():
        setattr(tree_noise.TreeNoise, name, timed(fn))
    try:
        library()
    finally:
        for name, fn in originals.items():
            setattr(tree_noise.TreeNoise, name, fn)
    print(
        f"library step_batch:    {lib:7.2f} s CPU  {occurrences / lib:>12,.0f} occurrences/s "
        f"(goal >= 2M/s)  {lib / flo:5.2f}x dict lookup + bincount "
        f"({occurrences / flo:,.0f}/s)"
    )
    rest = lib - noise_cpu[0]
    print(
        f"  of which keyed noise:  {noise_cpu[0]:7.2f} s CPU; the rest {rest:.2f} s = "
        f"{occurrences / rest:,.0f} occurrences/s, {rest / flo:.2f}x the floor"
    )


if __name__ == "__main__":
    main()
