"""The numbers ``dpstream plan`` prints: what a budget buys, before it is spent.

Layer 6 of dpstream; the words ``plan`` prints are :mod:`dpstream.plan_text`.
Every number is read from a mechanism built with the
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

if TYPE_CHECKING:
    from .mechanisms.protocol import ContinualMechanism

__all__ = [
    "Z95",
    "Z95_ONE_SIDED",
    "counter_comparison",
    "noise_std_worst",
    "describe",
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

    ``build(horizon)`` returns the mechanism for that horizon with the same budget. A
    coarser horizon the settings cannot take (a given ``--base`` past its largest
    base, review 113: ``plan`` refused what ``run`` takes) is left out.
    """
    out, seen = [], set()
    for c in COARSER:
        h = -(-horizon // c)
        if h in seen:
            continue
        seen.add(h)
        try:
            mech = build(h)
        except ValueError:
            if c == 1:  # the run's own horizon: its problem is the plan's
                raise
            continue
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
    rows = []
    for n in sorted(set(MAX_ITEMS_CHOICES) | {int(given)}):
        try:
            std = float(std_for(n))
        except ValueError:  # (review 106: a value these settings cannot take, say with
            if n == given:  # --threshold-delta paid n times past --delta, ended the plan)
                raise
            continue  # left out of the hint
        rows.append({"max_items": n, "noise_std_worst": std})
    return rows


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


def _domain_size(mech: Any) -> int | None:
    """How many items ``mech``'s known domain holds (None: no known domain), from its
    item table where it has one: ``domain`` makes a new list of every item."""
    index = getattr(mech, "domain_index", None)
    if index is not None:
        return len(index)
    domain = getattr(mech, "domain", None)
    return None if domain is None else len(domain)


def _user_fields(mech: Any) -> dict[str, Any]:
    """The user-level bounds of a description (none at event level)."""
    bounds = mech.user_bounds
    if bounds is None:
        return {}
    return {
        "max_items_per_user": bounds.max_items_per_user,
        "max_count_per_item": bounds.max_count_per_item,
        "user_bounds": bounds.describe(),
    }


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
    out.update(_user_fields(mech))
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
    size = _domain_size(mech)
    if size is not None:
        out["domain_size"] = size
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
    out.update(_user_fields(mech))
    if hasattr(mech, "max_items"):
        out["max_items"] = mech.max_items
    size = _domain_size(mech)
    if size is not None:
        out["domain_size"] = size
    if hasattr(mech, "threshold_at"):
        out["threshold"] = float(mech.threshold)
        out["threshold_delta"] = float(mech.threshold_delta)
    return out
