"""The numbers ``dpstream plan`` prints: what a budget buys, before it is spent.

Layer 6 of dpstream. Every number is read from a mechanism built with the
given parameters (and a throw-away key: no release is made), so the plan and
a run report exactly the same tau, base, threshold and guarantee; the few
derived numbers are closed forms stated below.

* noise std at the worst step: ``tau * sqrt(max_t |I_t(r)| * L_r)`` (the
  count at t has variance |I_t| L_r tau^2, ``thm:BinMechUtility``); for
  top-k the counters run with ``tau_2 = sqrt(s + 1) tau``; with a BLT counter
  ``sigma * max_t ||row_t(B)||`` = tau sqrt(V) (``dpstream.factorization``);
* both counters at the same budget (they calibrate to the same tau): the
  worst-step std of the tree (base r, or r*) and of the BLT for T;
* half-width of a 95% interval of one count: ``1.959964 * std``;
* unknown domain: the threshold of step t is m_t = 1 + sqrt(|I_t| L_r) tau
  Phi^-1(1 - delta/T); an item whose true count is m_t is shown at t with
  probability 1/2, one whose count is ``m_t + 1.644854 * std_t`` with
  probability 95% (printed at the worst step and at the median step, the
  median taken over t = 1..T, or over 200,001 evenly spaced t for a longer
  horizon); the same numbers for horizons T/c (c steps merged into one) show
  what a coarser step buys;
* the inverse (``--target-error E``): tau = E / (1.959964 * std at tau = 1),
  the noise std being proportional to tau.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .factorization import MAX_BLT_HORIZON, blt_for_horizon
from .mechanisms.unknown import threshold_profile
from .tree import max_cells, num_levels, optimal_base, paper_variance_factor
from .tree import worst_case_variance_factor as _wcvf
from .words import plain_mechanism

if TYPE_CHECKING:
    from .mechanisms.protocol import ContinualMechanism

__all__ = [
    "explain",
    "Z95",
    "Z95_ONE_SIDED",
    "counter_comparison",
    "noise_std_worst",
    "describe",
    "format_plan",
    "tau_for_target",
    "threshold_profile",
    "coarser_steps",
    "COARSER",
    "max_items_hint",
    "MAX_ITEMS_CHOICES",
]

#: The --max-items values ``plan`` compares (with the one given).
MAX_ITEMS_CHOICES = (1, 2, 5, 10, 20, 50, 100)

#: The step merges ``plan`` shows for the unknown domain (c steps into one: e.g.
#: 7 days into a week, 24 hours into a day, 30 days into a month).
COARSER = (1, 2, 7, 24, 30)

#: Phi^-1(0.975): a two-sided 95% interval is +-Z95 standard deviations.
Z95 = 1.959963984540054
#: Phi^-1(0.95): one-sided 95%.
Z95_ONE_SIDED = 1.6448536269514722


def noise_std_worst(mech: ContinualMechanism) -> float:
    """The largest std of a released count over t <= T, for any dpstream mechanism."""
    return float(mech.noise_std_worst)


def tau_for_target(target_error: float, std_at_unit_tau: float) -> float:
    """The tau whose worst-step 95% half-width is ``target_error``."""
    if not (math.isfinite(target_error) and target_error > 0):
        raise ValueError(f"--target-error must be positive, got {target_error!r}")
    return target_error / (Z95 * std_at_unit_tau)


def _base_reason(horizon: int, base: int, given: bool) -> str:
    if given:
        return f"base {base}, as given by --base"
    star = optimal_base(horizon)
    if base == star:
        return (
            f"base {base}, the one with the least noise at the worst step for "
            f"--horizon {horizon} (worst-case factor {paper_variance_factor(horizon, base)})"
        )
    return f"base {base}, chosen by the mechanism"


def counter_comparison(mech: Any) -> dict[str, float] | None:
    """The worst-step std of a count with each counter at ``mech``'s budget (same tau).

    ``None`` for a mechanism with no choice of counter (unknown domain, meta, a
    stream with no planned end).
    """
    if mech.counter is None or mech.unbounded:
        return None
    horizon = int(mech.horizon)
    tau = float(getattr(mech, "tau_2", mech.tau))
    strategy = mech.strategy
    if strategy is None and horizon <= MAX_BLT_HORIZON:
        strategy = blt_for_horizon(horizon)
    tree_base = mech.base if mech.base is not None else optimal_base(horizon)
    out = {"tree": tau * math.sqrt(_wcvf(horizon, tree_base))}
    if strategy is not None:
        out["blt"] = tau * math.sqrt(strategy.worst_case_variance)
    out[mech.counter] = noise_std_worst(mech)  # the run's own number, exactly
    return out


def coarser_steps(build: Any, horizon: int) -> list[dict[str, Any]]:
    """UnkBase's thresholds if c steps were merged into one (horizon ceil(T / c)).

    ``build(horizon)`` returns the mechanism for that horizon with the same budget.
    """
    out, seen = [], set()
    for c in COARSER:
        h = -(-horizon // c)
        if h in seen:
            continue
        seen.add(h)
        mech = build(h)
        prof = threshold_profile(mech)
        out.append(
            {
                "merge": c,
                "horizon": h,
                "base": None if mech.base is None else int(mech.base),
                "threshold_typical": prof["threshold_typical"],
                "threshold_worst": prof["threshold_worst"],
            }
        )
    return out


def max_items_hint(std_for: Any, given: int) -> list[dict[str, Any]]:
    """The noise std at the worst step for several --max-items values, same budget.

    ``std_for(n)`` builds the mechanism with max_items = n and returns its std.
    KnownBase's noise grows as sqrt(max_items) (sensitivity sqrt(Delta0 L_r)).
    """
    values = sorted(set(MAX_ITEMS_CHOICES) | {int(given)})
    return [{"max_items": n, "noise_std_worst": float(std_for(n))} for n in values]


#: The steps at which ``plan`` shows the noise of a stream with no planned end.
UNBOUNDED_STEPS = (10, 100, 1_000, 10_000, 100_000, 1_000_000)


def unbounded_profile(mech: Any) -> dict[str, Any]:
    """A stream with no planned end: the std of a count at the steps
    :data:`UNBOUNDED_STEPS` (it grows with t), its ratio to the std the BLT fitted for
    horizon t would have at t (same tau: what not knowing the end costs), and for
    UnkBase the threshold m_t there."""
    from .factorization import unbounded_std_ratio

    out: dict[str, Any] = {
        "noise_std_at": {str(t): float(mech.noise_std_at(t)) for t in UNBOUNDED_STEPS},
        "std_ratio_to_fitted": {str(t): unbounded_std_ratio(t) for t in UNBOUNDED_STEPS},
    }
    if hasattr(mech, "threshold_at"):
        out["threshold_at"] = {str(t): float(mech.threshold_at(t)) for t in UNBOUNDED_STEPS}
    return out


def describe(mech: Any, *, name: str, base_given: bool) -> dict[str, Any]:
    """A JSON-ready description of ``mech``'s costs and accuracy."""
    if mech.unbounded:
        return _describe_unbounded(mech, name)
    horizon = int(mech.horizon)
    base = None if mech.base is None else int(mech.base)
    std = noise_std_worst(mech)
    strategy = mech.strategy
    out: dict[str, Any] = {
        "mechanism": name,
        "algorithm": getattr(mech, "mechanism_name", type(mech).__name__),
        "horizon": horizon,
        "counter": mech.counter or "tree",
        "base": base,
        "base_reason": None if base is None else _base_reason(horizon, base, base_given),
        "levels": None if base is None else num_levels(horizon, base),
        "max_cells": None if base is None else max_cells(horizon, base),
        "tau": float(mech.tau),
        "noise_std_worst": std,
        "ci95_half_width": Z95 * std,
        "privacy": mech.privacy.to_dict(),
        "unit": mech.privacy.unit,
    }
    bounds = mech.user_bounds
    if bounds is not None:
        out.update(
            max_items_per_user=bounds.max_items_per_user,
            max_count_per_item=bounds.max_count_per_item,
            user_bounds=bounds.describe(),
        )
    if strategy is not None:
        out.update(
            buffers=strategy.buffers,
            fitted_horizon=strategy.fitted_horizon,
            worst_case_variance=strategy.worst_case_variance,
        )
    counters = counter_comparison(mech)
    if counters is not None:
        out["counters_noise_std_worst"] = counters
    if hasattr(mech, "max_items"):
        out["max_items"] = mech.max_items
    if hasattr(mech, "domain") and mech.domain is not None:
        out["domain_size"] = len(mech.domain)
    threshold = getattr(mech, "threshold", None)
    if isinstance(threshold, (int, float)):
        out["threshold"] = float(threshold)
        out["threshold_delta"] = float(mech.threshold_delta)
        if hasattr(mech, "threshold_for_cells"):
            prof = threshold_profile(mech)
            out.update(prof)
            out["occurrences_to_show_half"] = math.ceil(prof["threshold_worst"])
            out["occurrences_to_show_95"] = math.ceil(
                prof["threshold_worst"] + Z95_ONE_SIDED * prof["std_worst"]
            )
            out["occurrences_to_show_half_typical"] = math.ceil(prof["threshold_typical"])
        else:
            out["occurrences_to_show_half"] = math.ceil(threshold)
            out["occurrences_to_show_95"] = math.ceil(threshold + Z95_ONE_SIDED * std)
    if hasattr(mech, "switches"):
        out["k"] = int(mech.k)
        out["switches"] = int(mech.switches)
        out["eta"] = float(mech.eta_at(1)) if hasattr(mech, "eta_at") else None
        if getattr(mech, "wait", False):
            out["start_eta"] = float(mech.start_eta_at(1))
        out["tau_1"] = float(getattr(mech, "tau_1", float("nan")))
        out["tau_2"] = float(getattr(mech, "tau_2", float("nan")))
    elif hasattr(mech, "k") and getattr(mech, "k", None) is not None:
        out["k"] = int(mech.k)
    for attr in ("oneshot", "kbar"):
        if getattr(mech, attr, None) is not None:
            out[attr] = (
                getattr(mech, attr)
                if isinstance(getattr(mech, attr), (str, int))
                else str(getattr(mech, attr))
            )
    return out


def _describe_unbounded(mech: Any, name: str) -> dict[str, Any]:
    """:func:`describe` for a stream with no planned end (``horizon`` is None, the
    numbers are stated per step t; "worst" is at the step limit 2^40)."""
    std = noise_std_worst(mech)
    strategy = mech.strategy
    out: dict[str, Any] = {
        "mechanism": name,
        "algorithm": getattr(mech, "mechanism_name", type(mech).__name__),
        "horizon": None,
        "unbounded": True,
        "step_limit": int(mech.horizon),
        "counter": "blt",
        "base": None,
        "tau": float(mech.tau),
        "noise_std_worst": std,
        "ci95_half_width": Z95 * std,
        "privacy": mech.privacy.to_dict(),
        "unit": mech.privacy.unit,
        "buffers": strategy.buffers,
        "fitted_horizon": strategy.fitted_horizon,
        **unbounded_profile(mech),
    }
    bounds = mech.user_bounds
    if bounds is not None:
        out.update(
            max_items_per_user=bounds.max_items_per_user,
            max_count_per_item=bounds.max_count_per_item,
            user_bounds=bounds.describe(),
        )
    if hasattr(mech, "max_items"):
        out["max_items"] = mech.max_items
    if getattr(mech, "domain", None) is not None:
        out["domain_size"] = len(mech.domain)
    if hasattr(mech, "threshold_at"):
        out["threshold"] = float(mech.threshold)
        out["threshold_delta"] = float(mech.threshold_delta)
    return out


def _format_unbounded(info: dict[str, Any]) -> list[str]:
    """The lines of ``plan`` that differ for a stream with no planned end."""
    stds = ", ".join(f"{int(t):,}: {v:.4g}" for t, v in info["noise_std_at"].items())
    ratios = ", ".join(f"{int(t):,}: {v:.2f}x" for t, v in info["std_ratio_to_fitted"].items())
    lines = [
        f"counter       a BLT matrix factorization, {info['buffers']} buffers per item, "
        "fitted for streams with no planned end (its noise is calibrated for every t)",
        f"count error   std of a count at step t (it grows with t): {stds}; "
        f"{info['noise_std_worst']:.4g} at step 2^40, the limit",
        f"vs. a horizon std at t over that of a run with --horizon t (same budget): {ratios}",
    ]
    if "threshold_at" in info:
        ms = ", ".join(f"{int(t):,}: {v:.4g}" for t, v in info["threshold_at"].items())
        lines.append(
            f"threshold     an item is shown at step t once its noisy count passes m_t "
            f"(--threshold-delta {info['threshold_delta']:.3g}, spent as delta/(t(t+1)) at "
            f"step t so that it sums to at most delta over all t): {ms}"
        )
    return lines


def explain(info: dict[str, Any]) -> str:
    """``dpstream plan --explain``: where each number comes from, with the paper's labels
    (Cardoso and Rogers, *Differentially Private Histograms under Continual Observation*)."""
    p = info["privacy"]
    lines = [
        "paper         Cardoso and Rogers, Differentially Private Histograms under Continual "
        "Observation: Streaming Selection into the Unknown",
        f"algorithm     {plain_mechanism(info['algorithm'])} ({info['algorithm']})",
        f"guarantee     (the paper's result: {p['theorem']})",
        f"conversion    rho-zCDP to (epsilon, delta) by {p['conversion']} (gaussian-exact: "
        "Balle and Wang 2018; cks2020: Canonne, Kamath and Steinke; bun-steinke: Bun and "
        "Steinke 2016)",
    ]
    if info.get("counter") == "blt":
        lines.append(
            "counter       buffered linear Toeplitz factorization A = B C (Dvijotham, "
            "McMahan, Pillutla, Steinke and Thakurta 2024): one Gaussian per item and "
            "step; sensitivity max_j ||C e_j||, variance at t sigma^2 ||row_t(B)||^2"
        )
    else:
        lines.append(
            f"counter       the tree counter with base r (BinMech, Algorithm 1): L_r = "
            f"{info['levels']} levels, noise N(0, L_r tau^2) per cell; the base r* "
            "minimises (r - 1) L_r^2 (eq:opt_base)"
        )
    if info.get("unbounded"):
        lines.append(
            "no end        sigma from the limit sensitivity sum_(n >= 0) c_n^2, which "
            "bounds max_j ||C e_j|| for every horizon; the threshold of step t "
            "spends delta/(t(t+1)), and sum_t 1/(t(t+1)) = 1"
        )
    if "threshold" in info and info.get("counter") == "blt":
        lines.append(
            "threshold     per step m_t = 1 + sigma ||row_t(B)|| Phi^-1(1 - delta/T), "
            "the std of a count at t in place of the tree's (eq:threshold, "
            "lem:badOutcomes); items first seen at s draw their noise state at s-1 "
            "from its exact law"
        )
    elif "threshold" in info:
        lines.append(
            "threshold     m_delta = 1 + tau L_r sqrt(r - 1) Phi^-1(1 - delta/T) "
            "(eq:threshold, lem:badOutcomes); per step m_t with |I_t| cells in place "
            "of (r - 1) L_r, never above m_delta"
        )
    if "switches" in info:
        lines.append(
            "top-k         top-k with switches (SparseGumb, algo:sparseGumb): Gumbel "
            "selections with noise "
            "tau_2, a sparse-vector switch test with noise tau_1 (Lyu, Su and Li 2017, "
            "Alg. 1)"
        )
    return "\n".join(lines)


def format_plan(info: dict[str, Any]) -> str:
    """The plan in plain words (``explain`` gives the paper's labels): one line per part,
    each part stated by its own function below, in this order."""
    lines = [
        *_plan_head(info),
        *_plan_error(info),
        *_plan_threshold(info),
        *_plan_top_k(info),
        *_plan_max_items(info),
    ]
    if "target_error" in info:
        lines.append(
            f"target        a 95% half-width of {info['target_error']:.4g} needs tau = "
            f"{info['tau']:.6g}, i.e. the budget above"
        )
    return "\n".join(lines)


def _plan_counter(info: dict[str, Any]) -> list[str]:
    """The counter line: the BLT factorization or the tree (none for an unbounded stream)."""
    if info.get("unbounded"):
        return []
    if info.get("counter") == "blt":
        k = info["buffers"]
        return [
            f"counter       a BLT matrix factorization, {k} buffer{'s' * (k != 1)} per "
            f"item (fitted for --horizon {info['fitted_horizon']}): worst-case variance "
            f"{info['worst_case_variance']:.4g} times the noise scale squared"
        ]
    return [
        f"counter       a tree of {info['base_reason']}; {info['levels']} levels, "
        f"at most {info['max_cells']} noisy cells per count"
    ]


def _plan_head(info: dict[str, Any]) -> list[str]:
    """The mechanism, its counter, the noise scale, the guarantee and its unit."""
    p = info["privacy"]
    unit = info.get("unit", "event")
    plain = (
        f"epsilon = {p['epsilon']:.6g}, delta = {p['delta']:.3g} per {unit} (rho-zCDP "
        f"with rho = {p['rho']:.6g}; converted by {p['conversion']})"
    )
    if info.get("unbounded"):
        plain += ", for all t"
    horizon = (
        "no --horizon: a stream with no planned end (at most 2^40 steps)"
        if info.get("unbounded")
        else f"--horizon {info['horizon']}"
    )
    return [
        f"mechanism     {info['mechanism']}: {plain_mechanism(info['algorithm'])}, {horizon}",
        *_plan_counter(info),
        f"noise scale   {info['tau']:.6g}",
        f"privacy       {plain}",
        *(
            [
                f"unit          per user: {info['user_bounds']} over the whole stream (later "
                "contributions dropped); the guarantee hides all of one user's events"
            ]
            if unit == "user"
            else []
        ),
    ]


def _plan_error(info: dict[str, Any]) -> list[str]:
    """The error of a count (or the unbounded stream's profile) and the counters compared."""
    if info.get("unbounded"):
        lines = _format_unbounded(info)
    else:
        lines = [
            f"count error   std {info['noise_std_worst']:.4g} at the worst step; a 95% "
            f"interval is the released count +- {info['ci95_half_width']:.4g}"
        ]
    counters = info.get("counters_noise_std_worst")
    if counters and len(counters) > 1:
        lines.append(
            f"counters      at this budget, std at the worst step: tree {counters['tree']:.4g}, "
            f"blt {counters['blt']:.4g} (this run: --counter {info['counter']})"
        )
    return lines


def _plan_threshold(info: dict[str, Any]) -> list[str]:
    """The discovery threshold of an unknown domain, and with coarser steps."""
    lines = []
    if "threshold_worst" in info:
        lines.append(
            f"threshold     an item is shown at a step once its noisy count passes that "
            f"step's threshold (--threshold-delta {info['threshold_delta']:.3g}): "
            f"{info['threshold_typical']:.4g} at the median step, "
            f"{info['threshold_worst']:.4g} at the worst (never above "
            f"{info['threshold']:.4g}, the single threshold of the paper); items need about "
            f"{info['occurrences_to_show_half_typical']} occurrences to be shown half the time "
            f"at the median step, {info['occurrences_to_show_half']} at the worst step, "
            f"{info['occurrences_to_show_95']} to be shown 95% of the time at any step"
        )
    elif "threshold" in info and not info.get("unbounded"):
        lines.append(
            f"threshold     {info['threshold']:.4g} (--threshold-delta "
            f"{info['threshold_delta']:.3g}): items need about {info['occurrences_to_show_half']} "
            f"occurrences to be shown (half the time at the worst step), "
            f"{info['occurrences_to_show_95']} to be shown 95% of the time"
        )
    for row in info.get("coarser_steps", []):
        if row["merge"] == 1:
            lines.append(
                "coarser steps the thresholds if c steps were merged into one (same "
                "budget, --horizon divided by c):"
            )
        base = "" if row["base"] is None else f", --base {row['base']}"
        lines.append(
            f"              c = {row['merge']:>2}: --horizon {row['horizon']}{base}: "
            f"threshold {row['threshold_typical']:.4g} at the median step, "
            f"{row['threshold_worst']:.4g} at the worst"
        )
    return lines


def _plan_top_k(info: dict[str, Any]) -> list[str]:
    """Top-k's switches, eta and first list, and the choice between the top-k mechanisms."""
    lines = []
    if "switches" in info:
        lines.append(
            f"top-k         --k {info['k']}, at most {info['switches']} switches of the list"
            + (
                " (the default for --horizon: the smallest s with 8^s >= T; give --switches "
                "to change it)"
                if info.get("switches_default")
                else ""
            )
            + "; "
            f"an item outside it must lead by --eta {info['eta']:.4g}; noise scale of the "
            f"selection {info['tau_2']:.4g}, of the switch test {info['tau_1']:.4g}"
        )
        if "start_eta" in info:
            lines.append(
                f"first list    none ('not yet') until the {info['k']}-th largest count clears "
                f"about {info['start_eta']:.4g} (plus sparse-vector noise)"
            )
    if "choice" in info:
        lines.append(f"top-k choice  {info['choice']}")
    if info.get("max_items_break_even", 0) >= 1:
        lines.append(
            f"top-k choice  if every event holds at most {info['max_items_break_even']} items, "
            "the top-k from the known-domain histogram (free post-processing of the whole "
            "noisy histogram) lists an item at a smaller count than top-k with switches needs "
            "for this budget: give --max-items "
            "to compare"
        )
    return lines


def _plan_max_items(info: dict[str, Any]) -> list[str]:
    """How the noise grows with --max-items, and how to pick it."""
    if "max_items_hint" not in info:
        return []
    rows = ", ".join(
        f"{r['max_items']}: {r['noise_std_worst']:.3g}" for r in info["max_items_hint"]
    )
    sparse = info.get("candidates_noise_std", {}).get("SparseGumb")
    worst = "step 2^40, the limit" if info.get("unbounded") else "the worst step"
    return [
        "max items     every event may hold at most --max-items items; more are refused, "
        "or cut with --on-invalid truncate, which undercounts the items of large events "
        "(the run summary reports the share of item occurrences dropped). The noise grows "
        f"with it (std at {worst}, --max-items: std): {rows}"
        + (f" (top-k with switches, any event size: {sparse:.3g})" if sparse else "")
        + ". Pick it near a high percentile (e.g. the 95th) of your events' sizes."
    ]
