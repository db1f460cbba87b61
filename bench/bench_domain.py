"""Benchmark: building a known domain of 10^6 items (issue 31, item 6).

Run by hand: ``python bench/bench_domain.py [--items 1000000] [--rounds 5]``.
Every figure is CPU time (``time.process_time``), the median over the rounds
with the spread (min-max) beside it, and a ratio to a floor measured in the same
round of the same process (machines are noisy; ratios travel better):

* floor: ``{item: i for i, item in enumerate(items)}``, a plain Python index of
  the domain (what any known-domain mechanism has to do at least once);
* ``read_domain`` of the domain file (one item per line);
* ``KnownDomainHistogram(items, 1000, max_items=3, rho=1)`` (the BLT default)
  with the compiled loops, its parts (canonical items, the item table, the
  domain tag's SHA-256 fingerprints, the keyed BLAKE2b item ids), and the same
  build on the Python path (``compiled.numpy_only``: hashlib, the same values);
* the run edge's ``_domain_sha256`` (``json.dumps`` of the whole domain, then
  SHA-256), which ``dpstream run --domain`` adds for resume checks.

Items: ``item{i}`` with one in 20 non-ASCII (``café-{i}``), 9-13 UTF-8 bytes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dpstream as dps
from dpstream import compiled
from dpstream.io import read_domain
from dpstream.mechanisms.base import domain_items
from dpstream.mechanisms.item_table import domain_table
from dpstream.mechanisms.known import domain_tag
from dpstream.noise import NoiseSource


def cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def show(name: str, secs: list[float], floor: list[float]) -> None:
    ratios = [s / f for s, f in zip(secs, floor, strict=True)]
    print(
        f"{name:34s} {statistics.median(secs):7.3f} s ({min(secs):.3f}-{max(secs):.3f})"
        f"  {statistics.median(ratios):6.2f}x floor ({min(ratios):.2f}-{max(ratios):.2f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.items
    items = [f"café-{i}" if i % 20 == 0 else f"item{i}" for i in range(n)]
    key = dps.NoiseKey.generate()
    source = NoiseSource(key, "bench/domain")
    print(f"{n:,} items, {args.rounds} rounds, compiled loops: {compiled.enabled()}")
    try:
        from dpstream.run_command import _domain_sha256  # the run edge's, if still there
    except ImportError:  # pragma: no cover - moved by a later change
        _domain_sha256 = None

    def build() -> object:
        return dps.KnownDomainHistogram(items, 1000, max_items=3, key=key, rho=1.0)

    def build_python() -> object:
        with compiled.numpy_only():
            return build()

    cases: dict[str, Callable[[], object]] = {
        "read_domain (file)": lambda: None,  # replaced below (needs the file)
        "KnownDomainHistogram (C loops)": build,
        "  domain_items": lambda: domain_items(items),
        "  domain_table": lambda: domain_table(items),
        "  domain_tag (SHA-256)": lambda: domain_tag(items),
        "  item_ids (keyed BLAKE2b)": lambda: source.item_ids(items),
        "KnownDomainHistogram (Python path)": build_python,
    }
    if _domain_sha256 is not None:
        cases["run edge: _domain_sha256"] = lambda: _domain_sha256(items)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "domain.txt"
        path.write_text("\n".join(items) + "\n", encoding="utf-8")
        cases["read_domain (file)"] = lambda: read_domain(str(path))
        floor: list[float] = []
        secs: dict[str, list[float]] = {name: [] for name in cases}
        build()  # warm-up: imports, the BLT strategy's first fit, the kernel's threads
        for _ in range(args.rounds):
            floor.append(cpu(lambda: {item: i for i, item in enumerate(items)}))
            for name, fn in cases.items():
                secs[name].append(cpu(fn))
    print(
        f"{'floor: dict index':34s} {statistics.median(floor):7.3f} s "
        f"({min(floor):.3f}-{max(floor):.3f})"
    )
    for name in cases:
        show(name, secs[name], floor)
    print("goal: KnownDomainHistogram of 10^6 items <= 1 s CPU")


if __name__ == "__main__":
    main()
