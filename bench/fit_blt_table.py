"""Fit the BLT table dpstream ships (src/dpstream/data/blt_table.json).

Run by hand after changing the fitting code: ``python bench/fit_blt_table.py``.
Fits :func:`dpstream.factorization.fit_blt` at every grid horizon (2^j and
3 * 2^(j-1), 2 .. 2^40) for each buffer count asked for (``--buffers 1 2 3 4``),
and prints V, the lower bound and their ratio; the table's entries for other
buffer counts stay as they are. The shipped table was made with
``--buffers 4`` (each fit warm-started from the previous horizon's) and
``--buffers 1 2 3 --cold`` (each fit exactly as ``fit_blt`` runs it, which is
what a process fitted for those counts before they were shipped). The
mechanisms recompute every number from the parameters when they load them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dpstream.factorization import DEFAULT_BUFFERS, grid_horizons, lower_bound, write_table

TABLE = Path(__file__).resolve().parent.parent / "src" / "dpstream" / "data" / "blt_table.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buffers", type=int, nargs="+", default=[DEFAULT_BUFFERS])
    ap.add_argument(
        "--cold",
        action="store_true",
        help="fit each horizon from the default starts only (no warm start)",
    )
    ap.add_argument("--out", default=str(TABLE))
    args = ap.parse_args()
    for buffers in args.buffers:
        start = time.perf_counter()
        entries = write_table(args.out, grid_horizons(), buffers, warm_start=not args.cold)
        print(
            f"{buffers} buffers: {len(entries)} horizons fitted in "
            f"{time.perf_counter() - start:.1f} s -> {args.out}"
        )
        print(f"{'T':>15} {'V':>9} {'ratio to lower bound':>22}")
        for e in entries:
            h = e["horizon"]
            if h <= 1 << 22:  # the lower bound sums T singular values
                print(f"{h:>15} {e['V']:>9.4f} {e['V'] / lower_bound(h):>22.4f}")
            else:
                print(f"{h:>15} {e['V']:>9.4f}")


if __name__ == "__main__":
    main()
