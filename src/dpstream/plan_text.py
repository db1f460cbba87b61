"""The plan in words: what ``dpstream plan`` prints from :func:`dpstream.planning.describe`.

Layer 6 of dpstream (the command line). :func:`format_plan` says each number in
plain words, one part per function (the mechanism and its guarantee, the error of a
count, the discovery threshold, top-k, the events' size); :func:`explain`
(``--explain``) says where each comes from, with the paper's labels.
"""

from __future__ import annotations

from typing import Any

from .privacy.guarantees import outside_zcdp_words
from .words import plain_mechanism

__all__ = ["explain", "format_plan"]


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
    outside = outside_zcdp_words(p.get("rho_delta", 0.0))  # the threshold's share
    plain = (
        f"epsilon = {p['epsilon']:.6g}, delta = {p['delta']:.3g} per {unit} (rho-zCDP "
        f"with rho = {p['rho']:.6g}{outside}; converted by {p['conversion']})"
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
    hint = info["max_items_hint"]
    sparse = info.get("candidates_noise_std", {}).get("SparseGumb")
    worst = "step 2^40, the limit" if info.get("unbounded") else "the worst step"
    if "epsilon" in hint[0]:  # --target-error: the noise is fixed, the budget grows
        deltas = {r["delta"] for r in hint if r["delta"] is not None}
        same = len(deltas) == 1

        def budget(r: dict[str, Any]) -> str:
            if r["epsilon"] is None:
                return "none"
            return f"{r['epsilon']:.3g}" + ("" if same else f" at delta {r['delta']:.3g}")

        rows = ", ".join(f"{r['max_items']}: {budget(r)}" for r in hint)
        at = f" at delta = {deltas.pop():.3g}" if same else ""
        grows = (
            "The target fixes the noise; the budget it needs grows with it (epsilon"
            f"{at}, --max-items: epsilon): {rows}"
        )
        if any(r["epsilon"] is None for r in hint):
            grows += " (none: --threshold-delta, paid once per item, takes all of delta)"
    else:
        rows = ", ".join(f"{r['max_items']}: {r['noise_std_worst']:.3g}" for r in hint)
        grows = f"The noise grows with it (std at {worst}, --max-items: std): {rows}" + (
            f" (top-k with switches, any event size: {sparse:.3g})" if sparse else ""
        )
    return [
        "max items     every event may hold at most --max-items items; more are refused, "
        "or cut with --on-invalid truncate, which undercounts the items of large events "
        f"(the run summary reports the share of item occurrences dropped). {grows}"
        ". Pick it near a high percentile (e.g. the 95th) of your events' sizes."
    ]
