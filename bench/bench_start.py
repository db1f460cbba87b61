"""Benchmark: how long the ``dpstream`` command takes to start.

Run by hand: ``python bench/bench_start.py [--rounds 15] [--src DIR ...]``.
Each command runs as a fresh process (``python -m dpstream ...``) ``--rounds``
times, interleaved so that a busy moment of a shared machine falls on every
command alike; the figure is the median wall time, with the spread (min-max),
and the ratio to the floor ``python -c pass`` measured in the same rounds, after one
untimed round that caches the modules' bytecode (as pip does at install). With
several ``--src`` (e.g. the sources before and after a change), each is put
first on ``PYTHONPATH`` in turn, in the same rounds. It also lists the heavy
modules each command imports (``sys.modules`` at exit).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "scipy", "pandas", "pyarrow", "cryptography")
PLAN = [
    "plan",
    "-m",
    "unknown",
    "--horizon",
    "1000",
    "--max-items",
    "3",
    "--epsilon",
    "1",
    "--delta",
    "1e-6",
]
KNOWN = [*PLAN[:2], "known", *PLAN[3:], "--domain-size", "100000"]
COMMANDS = {
    "python -c pass (floor)": ["-c", "pass"],
    "numpy + scipy imports plan needs": [
        "-c",
        "import numpy, scipy.special, cryptography.hazmat.primitives.ciphers",
    ],
    "dpstream --version": ["-m", "dpstream", "--version"],
    "dpstream --help": ["-m", "dpstream", "--help"],
    "dpstream run --help": ["-m", "dpstream", "run", "--help"],
    "dpstream plan -m unknown ...": ["-m", "dpstream", *PLAN],
    # a known domain of 10^5 placeholder items (--domain-size): hashed and tabled once
    "dpstream plan -m known ...": ["-m", "dpstream", *KNOWN],
    "dpstream plan -m top-k ...": ["-m", "dpstream", *KNOWN[:2], "top-k", *KNOWN[3:], "--k", "10"],
}
#: Print the heavy modules a command imported, at exit (the command's own output is dropped).
PROBE = (
    "import atexit, runpy, sys\n"
    f"atexit.register(lambda: print(*[m for m in {HEAVY!r} if m in sys.modules], "
    "file=sys.__stderr__))\n"
    "sys.argv = ['dpstream', *sys.argv[1:]]\n"
    "runpy.run_module('dpstream', run_name='__main__')\n"
)


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    # as an installed package starts: with its modules' bytecode cached (pip compiles it
    # at install; PYTHONDONTWRITEBYTECODE would recompile every module at every start)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _once(python: str, argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, *argv], env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command (>= 10)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time")
    parser.add_argument(
        "--src",
        type=Path,
        action="append",
        help="a source directory put first on PYTHONPATH (repeatable; default: ./src)",
    )
    args = parser.parse_args()
    srcs = args.src or [Path(__file__).resolve().parents[1] / "src"]
    times: dict[tuple[int, str], list[float]] = {}
    for src in srcs:  # a round untimed: writes the bytecode caches
        for argv in COMMANDS.values():
            _once(args.python, argv, _env(src))
    for _ in range(args.rounds):
        for i, src in enumerate(srcs):
            env = _env(src)
            for name, argv in COMMANDS.items():
                times.setdefault((i, name), []).append(_once(args.python, argv, env))
    for i, src in enumerate(srcs):
        print(f"\n{src} ({args.rounds} rounds; seconds: median [min-max], x floor)")
        floor = statistics.median(times[i, "python -c pass (floor)"])
        for name, argv in COMMANDS.items():
            ts = times[i, name]
            med = statistics.median(ts)
            heavy = ""
            if argv[:2] == ["-m", "dpstream"]:
                probe = subprocess.run(
                    [args.python, "-c", PROBE, *argv[2:]],
                    env=_env(src),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    check=True,
                )
                heavy = "  imports: " + (probe.stderr.strip() or "none of " + ", ".join(HEAVY))
            print(
                f"  {name:30s} {med:6.3f} [{min(ts):.3f}-{max(ts):.3f}] {med / floor:5.1f}x{heavy}"
            )


if __name__ == "__main__":
    main()
