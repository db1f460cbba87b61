"""Benchmark: Parquet input against JSON Lines input of the same events.

Run by hand: ``python bench/bench_parquet.py [--events 1000000] [--steps 1000]``.

The stream is :mod:`bench_ingest`'s (``--events`` events of 1 to 5 Zipf items,
``--events / --steps`` per step), written as JSON Lines and as one Parquet file
(Snappy, the default row groups). Prints CPU times (process time: the machine is
shared), the best of ``--repeat``, and the ratio Parquet / JSON Lines (below 1:
Parquet is faster):

* the reader alone: every chunk of the run's reader
  (:func:`dpstream.io.jsonl.read_jsonl_chunks`,
  :func:`dpstream.io.parquet.read_parquet_chunks`);
* ``dpstream run -m unknown`` end to end (the same releases, checked byte for byte).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import make_stream  # noqa: E402 (the bench directory is no package)


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def best(fn, repeat: int) -> float:
    return min(cpu(fn) for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-run", action="store_true", help="time the readers only")
    # throwaway keys, each run with a ledger of its own (or its ledger removed between
    # rounds): keep them out of the user's key registry, here and in child processes
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"
    args = ap.parse_args()

    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from dpstream.cli import main as cli_main
    from dpstream.io import open_input
    from dpstream.io.jsonl import read_jsonl_chunks
    from dpstream.io.parquet import read_parquet_chunks

    work = Path(tempfile.mkdtemp(prefix="dps-bench-parquet-"))
    jsonl, parquet = work / "events.jsonl", work / "events.parquet"
    make_stream(jsonl, args.events, args.steps, args.distinct)
    pq.write_table(pj.read_json(jsonl), parquet)
    key_path = work / "key"
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["keygen", str(key_path)])
    print(
        f"{args.events:,} events, {args.steps} steps: JSON Lines {jsonl.stat().st_size / 1e6:.1f} "
        f"MB, Parquet {parquet.stat().st_size / 1e6:.1f} MB"
    )

    def read_json_lines() -> None:
        with open_input(str(jsonl)) as fh:
            n = sum(len(c) for c in read_jsonl_chunks(fh))
        assert n == args.events, n

    def read_parquet() -> None:
        n = sum(len(c) for c in read_parquet_chunks(str(parquet)))
        assert n == args.events, n

    rj, rp = best(read_json_lines, args.repeat), best(read_parquet, args.repeat)
    print(
        f"reader:          JSON Lines {rj:6.2f} s  Parquet {rp:6.2f} s  "
        f"Parquet/JSON Lines {rp / rj:.2f}  ({args.events / rp / 1e6:.2f} M events/s)"
    )
    if args.no_run:
        return

    def run(src: Path, out: Path) -> None:
        for p in (out, Path(f"{out}.meta.json"), Path(f"{key_path}.ledger")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
        argv = [
            "run", "--quiet", "-m", "unknown", "-T", str(args.steps), "--max-items", "5",
            "--epsilon", "1", "--delta", "1e-6", "--key-file", str(key_path),
            "-i", str(src), "-o", str(out), "--force", "--no-fsync",
        ]  # fmt: skip
        assert cli_main(argv) == 0

    out_j, out_p = work / "out-jsonl.jsonl", work / "out-parquet.jsonl"
    tj = best(lambda: run(jsonl, out_j), args.repeat)
    tp = best(lambda: run(parquet, out_p), args.repeat)
    assert out_j.read_bytes() == out_p.read_bytes(), "the releases differ"
    print(
        f"dpstream run:    JSON Lines {tj:6.2f} s  Parquet {tp:6.2f} s  "
        f"Parquet/JSON Lines {tp / tj:.2f}  (the same release bytes)"
    )


if __name__ == "__main__":
    main()
