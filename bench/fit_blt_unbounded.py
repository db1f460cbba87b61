"""Fit the BLT dpstream uses for streams with no planned end (``blt_unbounded``).

Run by hand: ``python bench/fit_blt_unbounded.py`` (a few minutes). It fits the 4
buffers of one BLT C whose keyed draws are calibrated to the limit sensitivity
sum_(n >= 0) c_n^2 (valid for every T), minimising the largest ratio, over the
grid horizons t in [--low, 2^40], of the variance of a count at t to V(t) of
``blt_for_horizon(t)`` (the BLT fitted for horizon t, at its last step): a soft
maximum (log-sum-exp) of the log ratios, Nelder-Mead then Powell, started from
the 2^20 fit. It prints the parameters (``float.hex``, for
``factorization.UNBOUNDED_THETA`` / ``UNBOUNDED_OMEGA``) and, with ``--table``
only, the std ratios of the shipped parameters at t = 10 .. 10^9 (the table
in docs/counters.md).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpstream import factorization as fz


def _ratios(comps: np.ndarray, ts: list[int], ref: np.ndarray) -> np.ndarray:
    """Variance ratios at ts of the BLT with interlaced complements ``comps``."""
    v, u = comps[0::2], comps[1::2]
    om = fz._scales_from_pair(u, v)
    inv_om = fz._scales_from_pair(v, u)
    sens = 1.0 + float(np.sum(om[:, None] * om[None, :] / fz._one_minus_product(u, u)))
    bias = 1.0 / (1.0 + float(np.sum(om / u)))
    a = -inv_om / v
    vv = fz._one_minus_product(v, v)
    err = [
        t * bias * bias
        + 2 * bias * float(np.sum(a * fz._geometric_sum(t, v)))
        + float(np.sum(a[:, None] * a[None, :] * fz._geometric_sum(t, vv)))
        for t in ts
    ]
    return sens * np.array(err) / ref


def fit(low: int, buffers: int = fz.DEFAULT_BUFFERS) -> fz.BLTStrategy:
    from scipy import optimize

    ts = [t for t in fz.grid_horizons() if t >= low]
    ref = np.array(
        [
            (lambda s: s.sensitivity_squared_closed_form() * s.max_variance_factor)(
                fz.blt_for_horizon(t, buffers)
            )
            for t in ts
        ]
    )

    def objective(p: np.ndarray) -> float:
        if not np.all(np.isfinite(p)):
            return 1e30
        comps = fz._pair_from_params(p)
        if comps[-1] <= 4e-16 or np.any(p[1:] < math.log(fz._MIN_LOG_GAP)):
            return 1e30
        with np.errstate(all="ignore"):
            r = np.log(_ratios(comps, ts, ref))
        if not np.all(np.isfinite(r)):
            return 1e30
        m = float(r.max())
        return m + math.log(float(np.sum(np.exp(200 * (r - m))))) / 200

    x = fz._params_from_pair(fz._pair_of(fz.blt_for_horizon(1 << 20, buffers)))
    for _ in range(3):
        x = optimize.minimize(
            objective,
            x,
            method="Nelder-Mead",
            options={"maxiter": 4000, "xatol": 1e-10, "fatol": 1e-14},
        ).x
    x = optimize.minimize(objective, x, method="Powell").x
    comps = fz._pair_from_params(x)
    return fz._strategy_from_pair(comps, fz.MAX_BLT_HORIZON, fz.MAX_BLT_HORIZON)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--low",
        type=int,
        default=fz.UNBOUNDED_FIT_RANGE[0],
        help="the smallest step the fit cares for",
    )
    ap.add_argument("--table", action="store_true", help="only print the shipped fit's table")
    args = ap.parse_args()
    if not args.table:
        s = fit(args.low)
        print("UNBOUNDED_THETA =", tuple(x.hex() for x in s.theta))
        print("UNBOUNDED_OMEGA =", tuple(x.hex() for x in s.omega))
    print(f"{'t':>12} {'std ratio':>10}   (blt_unbounded at t / blt_for_horizon(t) at t)")
    for e in range(1, 10):
        print(f"{10**e:>12,} {fz.unbounded_std_ratio(10**e):>10.3f}")


if __name__ == "__main__":
    main()
