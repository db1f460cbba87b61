"""Argument checks of the privacy parameters (private to :mod:`dpstream.privacy`).

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream. Every
module of the package validates rho, epsilon, delta, tau and the coefficient
``a`` the same way, with the parameter's name and the value received in the
message, so the checks live once, here. (The int checks shared by every layer
are in ``dpstream._checks``.)
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _check_real(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise ``TypeError`` if it is not a real number.

    ``bool`` (and ``numpy.bool_``) are rejected although Python treats ``True`` as
    1: a flag passed where a privacy parameter belongs is a bug, not a budget.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int past the float range (10**400): out of range, in words
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]


def _check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it is finite and > 0."""
    x = _check_real(name, value)
    if not (math.isfinite(x) and x > 0.0):
        raise ValueError(f"{name} must be positive and finite, got {name}={value!r}")
    return x


def _check_nonnegative(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it is finite and >= 0."""
    x = _check_real(name, value)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be non-negative and finite, got {name}={value!r}")
    return x


def _check_open_unit(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in (0, 1)."""
    x = _check_real(name, value)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {name}={value!r}")
    return x


def _check_half_open_unit(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in [0, 1)."""
    x = _check_real(name, value)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={value!r}")
    return x


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    return value


# -- the range of budgets the calibration's float arithmetic supports -----------------
#
# Every mechanism is rho-zCDP with rho = a / tau**2 and a >= 1/2 (KnownBase Delta0/2,
# BinMech 1/2, SparseGumb k or k + 1/2, a user's L0 Linf**2 / 2). Where the arithmetic
# fails, and so the bounds:
#
# * rho too large (the noise too small). The CKS20 conversion minimises over Renyi
#   orders alpha in (1, 1 + sqrt(L / rho)], L = ln(1/delta); once sqrt(L / rho) nears
#   2**-53 the bracket's end 1 + sqrt(L / rho) rounds to 1 and ln(1 - 1/alpha) is ln(0)
#   ("math domain error"; -m top-k at rho = 1e40, or at --tau 1e-150). Measured: it
#   fails from rho / L ~ 4e31 on (2**106 ~ 8e31), for every delta up to 1 - 1e-12.
#   Closer to 1 (1 - delta ~ 1e-15, L ~ 1e-16: delta holds no digits of L) it fails at
#   any rho from 1e-8 on, so DELTA_MAX = 1 - 1e-12; then L >= 1e-12 and rho < 4e19 is
#   safe. RHO_MAX = 1e15 leaves 4 decades for rho_for_epsilon_delta's bracket (up to
#   twice its root) and for a mechanism's larger coefficient a; guarantee_for_tau, which
#   knows a, refuses only rho > CKS_RHO_MAX = 1e19 there (the exact Gaussian curve
#   evaluates to rho ~ 1e307: GAUSSIAN_RHO_MAX = 1e300; its error bound covers the
#   cancellations of a large mu, and is checked against mpmath up to mu = 4e9, rho = 8e18).
# * rho too small (the noise too large): tau = sqrt(a / rho) and the variances a run
#   reports (multiples of tau**2) overflow to inf near a / rho = 1.8e308 (--rho 1e-310
#   gave tau = inf). RHO_MIN = 1e-200 leaves tau**2 = a * 1e200 finite for any a below
#   1e108.
# * epsilon: the rho an (epsilon, delta) target gives lies between the Bun-Steinke
#   inverse (epsilon / (sqrt(epsilon + L) + sqrt(L)))**2 >= epsilon**2 / (4 (epsilon + L))
#   and about epsilon, so EPSILON_MAX = RHO_MAX, and EPSILON_MIN = 1e-98 gives rho >=
#   1e-196 / (4 * 745) > RHO_MIN at the smallest float delta (L <= 745). Below, the
#   Bun-Steinke start underflows to 0 (--epsilon 1e-300: rho = 0, or brentq's "Failed
#   to converge" on the exact Gaussian curve); above, the bracket of the exact Gaussian
#   curve's mu divides by an underflowed 0 (--epsilon 1e300: ZeroDivisionError).
# * tau: a given tau is converted, never solved for, so its lower end is where the
#   conversion itself fails: rho = a / tau**2 <= CKS_RHO_MAX at a = 1/2 (the smallest
#   coefficient) needs tau >= sqrt(0.5 / CKS_RHO_MAX) = 2.24e-10 (tests and checks of
#   exact counts run at --tau 1e-9: rho = a * 1e18); its upper end is rho >= RHO_MIN:
#   tau <= sqrt(0.5 / RHO_MIN) = 7.1e99. TAU_RANGE is inside [2.24e-10, 7.1e99]. A
#   mechanism with a larger a is checked at its own rho (guarantee_for_tau): tau =
#   1e-300 divided by tau**2 = 0 (ZeroDivisionError) and tau = 1e-160 (tau**2
#   subnormal, rho = inf) never returned.
#
# Inside these ranges nothing changes: a budget that calibrates gives the same tau as
# before the ranges were checked (but at the ends the exact Gaussian curve's error bound
# widened, review 97: epsilon 1e15, and delta within 1e-12 of 1).
RHO_RANGE = (1e-200, 1e15)
EPSILON_RANGE = (1e-98, 1e15)
TAU_RANGE = (2.3e-10, 1e99)
DELTA_MAX = 1.0 - 1e-12
CKS_RHO_MAX = 1e19
GAUSSIAN_RHO_MAX = 1e300

_WHY = {
    "rho": (
        "the noise would be so large that its variance overflows float arithmetic",
        "the noise would be so small that the conversion to (epsilon, delta) fails in "
        "float arithmetic (its Renyi order 1 + sqrt(ln(1/delta)/rho) rounds to 1)",
    ),
    "epsilon": (
        "its rho (about epsilon^2 / (4 ln(1/delta))) would be below 1e-200, where the "
        "noise's variance overflows float arithmetic",
        "its rho (about epsilon) would be above 1e15, where the conversion to "
        "(epsilon, delta) fails in float arithmetic",
    ),
    "tau": (
        "the noise would be so small that rho = a / tau^2 is above 1e19 (at a = 1/2), "
        "where the conversion to (epsilon, delta) fails in float arithmetic",
        "the noise would be so large that rho = a / tau^2 is below 1e-200, where its "
        "variance overflows float arithmetic",
    ),
}
_RANGES = {"rho": RHO_RANGE, "epsilon": EPSILON_RANGE, "tau": TAU_RANGE}


def budget_range_problem(name: str, value: float, *, label: str | None = None) -> str | None:
    """Why ``value`` of the budget parameter ``name`` (``"rho"``, ``"epsilon"`` or
    ``"tau"``; a positive finite float) is outside the range the calibration supports,
    or ``None`` when it is inside. ``label`` names it in the message (``--rho``;
    default ``name=``)."""
    low, high = _RANGES[name]
    if low <= value <= high:
        return None
    shown = f"{name}={value!r}" if label is None else f"{label} {value!r}"
    why = _WHY[name][0 if value < low else 1]
    return (
        f"{shown} is outside the range the calibration supports ({low:g} <= {name} <= "
        f"{high:g}): {why}"
    )


def delta_range_problem(delta: float, *, label: str = "delta=") -> str | None:
    """Why a delta in (0, 1) is too close to 1 for the conversions, or ``None``."""
    if delta <= DELTA_MAX:
        return None
    return (
        f"{label}{delta!r} is outside the range the calibration supports (delta <= 1 - "
        "1e-12): ln(1/delta) keeps too few digits for the conversion to (epsilon, delta) "
        "in float arithmetic (and a delta so near 1 promises nothing)"
    )


def _check_delta_range(delta: float) -> float:
    """``delta`` (checked in (0, 1)) if it is at most :data:`DELTA_MAX`; else ValueError."""
    problem = delta_range_problem(delta)
    if problem is not None:
        raise ValueError(problem)
    return delta


def _check_budget_range(name: str, value: float) -> float:
    """``value`` (checked positive and finite) if it is inside the range of ``name``;
    else ``ValueError`` saying the range and why."""
    problem = budget_range_problem(name, value)
    if problem is not None:
        raise ValueError(problem)
    return value
