"""Figure 5 (not in the paper): the counters, tree against BLT, against the lower bound.

Pure arithmetic, no randomness. For a horizon T, V is the largest variance of
a released count over t <= T in units of tau^2 = 1/(2 rho), one item per
event, at the same rho-zCDP:

* the r-ary tree (the paper's BinMech, ``dpstream.tree``): V = max_t |I_t(r)| L_r,
  for the binary mechanism r = 2 and for r* = argmin (r-1) L_r^2;
* the BLT factorization dpstream uses (``dpstream.factorization.blt_for_horizon``,
  4 buffers): V = max_t ||row_t(B)||^2 max_j ||C e_j||^2, from its exact coefficients;
* the lower bound for every factorization A = B C (any Gaussian linear counter):
  (||A||_* / T)^2, ||A||_* from the singular values of the prefix-sum matrix.
"""

from __future__ import annotations

import time

import numpy as np

from ..factorization import blt_for_horizon, lower_bound
from ..tree import optimal_base, worst_case_variance_factor
from .common import Claim, Context, FigureResult, fmt, md_table, pyplot, save_figure

__all__ = ["run", "compute", "claims_from_variances"]

FIGURE = "fig5_counters.png"
REFERENCE_T = (10, 10**2, 10**3, 10**4, 10**5, 10**6)
#: The range of horizons the 1.3x claim is about.
CLAIM_T = (10**3, 10**6)
WITHIN = 1.3
#: "about 2.6-3x the noise standard deviation" (issue 11), read as 2.4..3.2.
STD_RATIO = (2.4, 3.2)


def horizon_grid(points: int) -> np.ndarray:
    """Distinct integer horizons, log-spaced over 10 .. 10^6, with the powers of 10."""
    grid = np.round(np.logspace(1, 6, points)).astype(np.int64)
    return np.unique(np.concatenate([grid, np.array(REFERENCE_T, dtype=np.int64)]))


def compute(horizons: np.ndarray) -> dict[str, np.ndarray]:
    """V of the tree (r = 2, r*), of the BLT and the lower bound, at each T."""
    n = len(horizons)
    out = {name: np.empty(n) for name in ("base2", "rstar", "blt", "bound")}
    for i, T in enumerate(int(x) for x in horizons):
        out["base2"][i] = worst_case_variance_factor(T, 2)
        out["rstar"][i] = worst_case_variance_factor(T, optimal_base(T))
        out["blt"][i] = blt_for_horizon(T).worst_case_variance
        out["bound"][i] = lower_bound(T)
    out["T"] = np.asarray(horizons)
    return out


def claims_from_variances(
    horizons: np.ndarray, rstar: np.ndarray, blt: np.ndarray, bound: np.ndarray
) -> list[Claim]:
    """The claims of issue 11 about the BLT counter, judged from the computed V."""
    horizons = np.asarray(horizons)
    rstar, blt, bound = np.asarray(rstar), np.asarray(blt), np.asarray(bound)
    sel = (horizons >= CLAIM_T[0]) & (horizons <= CLAIM_T[1])
    ratio = blt / bound
    worst = float(ratio[sel].max())
    worst_t = int(horizons[sel][int(np.argmax(ratio[sel]))])
    at = ", ".join(
        f"T=10^{int(round(np.log10(T)))}: {float(ratio[horizons == T][0]):.3f}"
        for T in REFERENCE_T
        if (horizons == T).any()
    )
    claims = [
        Claim(
            statement=f"the BLT counter's worst-case variance V is within {WITHIN}x of the lower "
            "bound (||A||_*/T)^2 for T = 10^3 .. 10^6",
            measured=(
                f"V_BLT / bound: at most {worst:.3f} (at T={worst_t}) over "
                f"{int(sel.sum())} grid points in 10^3..10^6; {at}"
            ),
            criterion=f"HOLDS if V_BLT <= {WITHIN} x bound at every grid point in 10^3..10^6",
            verdict="HOLDS" if worst <= WITHIN else "DIFFERS",
        )
    ]
    std_ratio = np.sqrt(rstar / blt)
    lo, hi = float(std_ratio[sel].min()), float(std_ratio[sel].max())
    ok = STD_RATIO[0] <= lo and hi <= STD_RATIO[1]
    claims.append(
        Claim(
            statement='"every dpstream release today carries about 2.6-3x the noise standard '
            'deviation it needs" (tree at r* against BLT, same rho)',
            measured=(
                f"sqrt(V_tree(r*) / V_BLT) ranges over {lo:.2f}..{hi:.2f} for T in 10^3..10^6"
            ),
            criterion=f"HOLDS if the ratio stays within {STD_RATIO[0]}..{STD_RATIO[1]} there",
            verdict="HOLDS" if ok else "DIFFERS",
        )
    )
    better = blt < rstar
    valid = bool(np.all(blt >= bound * (1 - 1e-12)) and np.all(rstar >= bound * (1 - 1e-12)))
    claims.append(
        Claim(
            statement="the BLT counter has the lower worst-case noise for every horizon T >= 2 "
            "(so dpstream makes it the default), and no counter beats the lower bound",
            measured=(
                f"V_BLT < V_tree(r*) at {int(better.sum())} of {len(horizons)} grid points "
                f"(T in {int(horizons.min())}..{int(horizons.max())}); both >= the bound "
                f"everywhere: {valid}"
            ),
            criterion="HOLDS if V_BLT < V_tree(r*) at every grid point and both respect the bound",
            verdict="HOLDS" if bool(better.all()) and valid else "DIFFERS",
        )
    )
    return claims


def plot(data: dict[str, np.ndarray], path) -> None:
    plt = pyplot()

    T = data["T"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    series = (
        ("base2", "tree, r = 2 (binary mechanism)", "tab:gray", "-"),
        ("rstar", "tree, r* (paper)", "black", "-"),
        ("blt", "BLT, 4 buffers (dpstream default)", "tab:blue", "-"),
        ("bound", "lower bound (||A||_*/T)^2", "tab:red", "--"),
    )
    for key, label, color, ls in series:
        axes[0].plot(T, data[key], ls, color=color, lw=1.8, label=label)
        if key != "bound":
            axes[1].plot(T, data[key] / data["bound"], ls, color=color, lw=1.8, label=label)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("V = max_t Var(count at t) / tau^2")
    axes[0].set_title("worst-case variance of a count, same rho-zCDP", fontsize=10)
    axes[1].axhline(WITHIN, ls=":", color="tab:red", lw=1, label=f"{WITHIN} x bound")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("V / lower bound")
    axes[1].set_title("relative to the lower bound for any factorization", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("horizon T")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle("Figure 5: continual counters, tree against BLT factorization (computed)")
    save_figure(fig, path)


def run(ctx: Context) -> FigureResult:
    """Compute, plot and judge figure 5."""
    start = time.perf_counter()
    points = 30 if ctx.quick else 120
    ctx.log(f"figure 5: tree and BLT counters over {points} horizons")
    data = compute(horizon_grid(points))
    plot(data, ctx.out_dir / FIGURE)
    claims = claims_from_variances(data["T"], data["rstar"], data["blt"], data["bound"])
    rows = []
    for T in REFERENCE_T:
        i = int(np.nonzero(data["T"] == T)[0][0])
        rows.append(
            [
                f"10^{int(round(np.log10(T)))}",
                fmt(data["base2"][i]),
                fmt(data["rstar"][i]),
                fmt(data["blt"][i]),
                fmt(data["bound"][i]),
                fmt(data["blt"][i] / data["bound"][i]),
                fmt(np.sqrt(data["rstar"][i] / data["blt"][i])),
            ]
        )
    table = md_table(
        [
            "T",
            "V tree r=2",
            "V tree r*",
            "V BLT",
            "lower bound",
            "BLT / bound",
            "std ratio r* / BLT",
        ],
        rows,
    )
    return FigureResult(
        key="counters",
        title="Figure 5 (counters): the tree against a BLT factorization",
        figure=FIGURE,
        caption=(
            "Largest variance of a released count over t <= T, in units of tau^2 = "
            "1/(2 rho) (one item per event, same zCDP), for the binary tree, the tree "
            "at the paper's r*, the BLT factorization dpstream uses by default, and the "
            "lower bound (||A||_*/T)^2 that holds for every factorization of the "
            "prefix-sum matrix A. Right: each divided by the bound."
        ),
        parameters={
            "horizons": f"{len(data['T'])} distinct integers log-spaced over 10..10^6 "
            "(plus the powers of 10)",
            "BLT": "dpstream.factorization.blt_for_horizon(T): 4 buffers, fitted at the "
            "grid horizon >= T, V computed exactly for T",
            "noise": "none (exact arithmetic on the factorizations; tau cancels)",
        },
        claims=claims,
        tables=[table],
        seconds=time.perf_counter() - start,
    )
