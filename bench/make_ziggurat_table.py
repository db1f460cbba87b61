"""Compute the ziggurat table dpstream ships (src/dpstream/data/ziggurat256.json).

Run by hand: ``python bench/make_ziggurat_table.py`` (needs mpmath, a dev
dependency). The table is computed at 60 significant digits and rounded to
float64 once, so every machine reads the same bits (libm's ``exp``/``log``
differ between platforms in the last bit; a table computed at import would
not). ``tests/test_ziggurat.py`` recomputes it and checks the equal-area
property the sampler's exactness rests on.

The ziggurat of Marsaglia and Tsang (2000) for f(x) = exp(-x^2/2), x >= 0,
with N = 256 regions of equal area v: a base region (the rectangle
[0, r] x [0, f(r)] plus the tail beyond r) and 255 rectangles stacked on it.
``x[i]`` is the right edge of region i (``x[0] = v / f(r)``, the base
region's width as if it were a rectangle; ``x[1] = r``; ``x[256] = 0``) and
``f[i] = f(x[i])``; ``fast_limit[i]`` is the fast path's bound on the
53-bit integer (see :func:`fast_limit`). r is the root of "the top rectangle has area v", found
by bisection at full precision.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import mpmath

TABLE = Path(__file__).resolve().parent.parent / "src" / "dpstream" / "data" / "ziggurat256.json"
LAYERS = 256


def density(x):
    return mpmath.exp(-x * x / 2)


def tail_area(r):
    """The integral of f from r to infinity."""
    return mpmath.sqrt(mpmath.pi / 2) * mpmath.erfc(r / mpmath.sqrt(2))


def edges(r):
    """(x[0..N], v) for base edge r, or None when the stack runs past the top."""
    v = r * density(r) + tail_area(r)
    x = [v / density(r), r]
    for _ in range(2, LAYERS):
        y = v / x[-1] + density(x[-1])
        if y >= 1:
            return None, v
        x.append(mpmath.sqrt(-2 * mpmath.log(y)))
    x.append(mpmath.mpf(0))
    return x, v


def top_excess(r):
    """Area of the top rectangle minus v (positive: r too large)."""
    x, v = edges(r)
    if x is None:
        return mpmath.mpf(-1)
    return x[LAYERS - 1] * (1 - density(x[LAYERS - 1])) - v


def solve() -> tuple[list, object, object]:
    lo, hi = mpmath.mpf(3), mpmath.mpf(4)
    assert top_excess(lo) < 0 < top_excess(hi)
    for _ in range(400):
        mid = (lo + hi) / 2
        if top_excess(mid) > 0:
            hi = mid
        else:
            lo = mid
    r = (lo + hi) / 2
    x, v = edges(r)
    return x, v, r


def fast_limit(edge: float, next_edge: float) -> float:
    """The largest double <= 2^53 next_edge / edge, from the float64 edges as shipped.

    The sampler's fast path takes ``k + 1/2 < fast_limit[i]``, which then
    implies ``u x[i] < x[i+1]`` exactly (u = (k + 1/2) 2^-53): the point lies
    in the part of region i that is under the curve.
    """
    exact = mpmath.mpf(2) ** 53 * mpmath.mpf(next_edge) / mpmath.mpf(edge)
    value = float(exact)  # nearest; step down if it rounded up
    if mpmath.mpf(value) > exact:
        value = math.nextafter(value, 0.0)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(TABLE))
    args = ap.parse_args()
    mpmath.mp.dps = 60
    x, v, r = solve()
    table = {
        "about": "ziggurat for exp(-x^2/2), 256 regions of equal area; "
        "made by bench/make_ziggurat_table.py; floats are float.hex",
        "layers": LAYERS,
        "r": float(r).hex(),
        "area": float(v).hex(),
        # P(Z > r) for a standard normal: the tail's share of the whole density
        "tail_probability": float(mpmath.erfc(r / mpmath.sqrt(2)) / 2).hex(),
        "x": [float(e).hex() for e in x],
        "f": [float(density(e)).hex() for e in x],
        "fast_limit": [fast_limit(float(x[i]), float(x[i + 1])).hex() for i in range(LAYERS)],
    }
    Path(args.out).write_text(json.dumps(table, indent=1) + "\n", encoding="ascii")
    print(
        f"r = {mpmath.nstr(r, 20)}, v = {mpmath.nstr(v, 20)}, "
        f"top excess {mpmath.nstr(top_excess(r), 5)} -> {args.out}"
    )


if __name__ == "__main__":
    main()
