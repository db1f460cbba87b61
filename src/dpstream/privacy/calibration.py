"""Calibration: the inverse curves, and the guarantee a noise scale gives.

Layer 1 of dpstream (docs/architecture.md): pure functions. All mechanisms of
dpstream are ``rho``-zCDP with ``rho(tau) = a / tau**2`` for a
mechanism-specific coefficient ``a`` (KnownBase ``a = Delta0 / 2``, SparseGumb
``a = k + 1/2``, or ``k`` with no sparse-vector round, MetaAlgo with Gumbel
selection ``a = k``, BinMech ``a = 1 / 2``). This module finds the smallest tau
for a rho (:func:`tau_for_rho`), the largest rho or Gaussian ``mu`` within an
(epsilon, delta) target (:func:`rho_for_epsilon_delta`,
:func:`mu_for_gaussian`), and states the guarantee at a given tau
(:func:`guarantee_for_tau`; at another delta, :func:`guarantee_at_delta`), so
that the number a mechanism reports and the number ``dpstream plan`` prints are
computed by the same code.

Floating-point policy: noise scales are rounded up and privacy
parameters down. Every calibration result is checked against the forward
formula after it is computed and nudged in the safe direction until the check
passes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

from ..rootfind import brentq
from ._checks import (
    CKS_RHO_MAX,
    GAUSSIAN_RHO_MAX,
    RHO_RANGE,
    _check_budget_range,
    _check_delta_range,
    _check_half_open_unit,
    _check_open_unit,
    _check_positive,
)
from ._roots import _nudge
from .conversions import (
    _cks_epsilon,
    _gaussian_delta,
    epsilon_bun_steinke,
    epsilon_cks,
    gaussian_epsilon,
)
from .guarantees import PrivacyGuarantee


def tau_for_rho(rho: float, a: float) -> float:
    """Smallest noise scale tau with ``a / tau**2 <= rho``.

    Args:
        rho: Target zCDP parameter, > 0.
        a: The mechanism's coefficient in ``rho(tau) = a / tau**2``, > 0.

    Returns:
        ``sqrt(a / rho)`` rounded up in the last place (and further if needed),
        so the achieved rho never exceeds the target in floating point.
    """
    rho = _check_budget_range("rho", _check_positive("rho", rho))
    a = _check_positive("a", a)
    tau = math.nextafter(math.sqrt(a / rho), math.inf)
    while a / (tau * tau) > rho:
        tau = math.nextafter(tau, math.inf)
    return tau


def rho_for_epsilon_delta(
    epsilon: float, delta: float, conversion: Literal["cks2020", "bun-steinke"] = "cks2020"
) -> float:
    """Largest rho whose (epsilon, delta) conversion stays within ``epsilon`` at ``delta``.

    Args:
        epsilon: Target epsilon, > 0.
        delta: Target delta, in (0, 1).
        conversion: ``"cks2020"`` (tightest for a general zCDP mechanism, the
            default) or ``"bun-steinke"`` (the paper's eq:epsilon, closed form
            ``rho = (sqrt(epsilon + ln(1/delta)) - sqrt(ln(1/delta)))**2``).
            For ``"gaussian-exact"`` use :func:`mu_for_gaussian` instead: the
            exact Gaussian curve is not a function of rho alone for other
            mechanisms.

    Returns:
        rho > 0 with ``epsilon_<conversion>(rho, delta) <= epsilon``, rounded down.

    Raises:
        ValueError: For an unknown conversion or out-of-range targets.
    """
    epsilon = _check_budget_range("epsilon", _check_positive("epsilon", epsilon))
    delta = _check_delta_range(_check_open_unit("delta", delta))
    log_inv_delta = -math.log(delta)
    # Closed-form Bun-Steinke inverse, written without cancellation:
    # sqrt(eps + L) - sqrt(L) = eps / (sqrt(eps + L) + sqrt(L)).
    rho_bs = (epsilon / (math.sqrt(epsilon + log_inv_delta) + math.sqrt(log_inv_delta))) ** 2
    if conversion == "bun-steinke":
        return _nudge(
            rho_bs, -1, lambda r: epsilon_bun_steinke(r, delta) <= epsilon, "rho_for_epsilon_delta"
        )
    if conversion != "cks2020":
        raise ValueError(
            f"conversion must be 'cks2020' or 'bun-steinke', got conversion={conversion!r}"
        )
    # epsilon_cks <= epsilon_bun_steinke, so rho_bs is (about) a lower bracket.
    lo = _nudge(rho_bs, -1, lambda r: epsilon_cks(r, delta) <= epsilon, "rho_for_epsilon_delta")
    hi = 2.0 * lo
    while epsilon_cks(hi, delta) <= epsilon:
        lo, hi = hi, 2.0 * hi
    if epsilon_cks(lo, delta) == epsilon:
        return lo
    rho = brentq(lambda r: epsilon_cks(r, delta) - epsilon, lo, hi, xtol=1e-300, rtol=1e-15)
    return _nudge(rho, -1, lambda r: epsilon_cks(r, delta) <= epsilon, "rho_for_epsilon_delta")


def mu_for_gaussian(epsilon: float, delta: float) -> float:
    """Largest ``mu`` (sensitivity / noise std) at which a Gaussian mechanism is
    (epsilon, delta)-DP by the exact curve of Balle & Wang 2018.

    ``gaussian_delta(epsilon, mu)`` increases strictly in mu, so brentq finds the
    root; the result is then moved down until ``gaussian_delta(epsilon, mu) <=
    delta`` holds in floating point.

    Args:
        epsilon: Target epsilon, > 0.
        delta: Target delta, in (0, 1).

    Returns:
        mu > 0.
    """
    epsilon = _check_budget_range("epsilon", _check_positive("epsilon", epsilon))
    delta = _check_delta_range(_check_open_unit("delta", delta))
    try:
        return _mu_for_gaussian(epsilon, delta)
    except RuntimeError:  # brentq did not converge: the curve is flat in floating point
        raise ValueError(
            f"epsilon={epsilon!r} is outside what the calibration supports at a delta of "
            f"{delta:g} (the part of delta the exact Gaussian curve is solved at): the "
            "curve cannot be solved there in float arithmetic (near epsilon = 0 its delta "
            "is computed to about 1e-14, far above so small a delta); give a larger "
            "epsilon or delta"
        ) from None


@functools.lru_cache(maxsize=4096)
def _mu_for_gaussian(epsilon: float, delta: float) -> float:
    """:func:`mu_for_gaussian` of checked arguments, remembered: a pure function of two
    floats, asked again for the same pair whenever a mechanism is built anew with the
    same budget (UnkBase's threshold split tries the same 37 splits at every horizon
    ``plan`` shows; ``-m top-k`` builds its candidates)."""
    lo, hi = 1.0, 1.0
    while _gaussian_delta(epsilon, lo) > delta:
        lo /= 2.0
    while _gaussian_delta(epsilon, hi) <= delta:
        hi *= 2.0
    mu = brentq(lambda m: _gaussian_delta(epsilon, m) - delta, lo, hi, xtol=1e-300, rtol=1e-15)
    return _nudge(mu, -1, lambda m: _gaussian_delta(epsilon, m) <= delta, "mu_for_gaussian")


def guarantee_for_tau(
    *,
    tau: float,
    a: float,
    delta: float,
    mechanism: str,
    theorem: str,
    gaussian_exact: bool = False,
    rho_delta: float = 0.0,
    target_epsilon: float | None = None,
) -> PrivacyGuarantee:
    """The guarantee a mechanism gives at noise scale ``tau``.

    ``rho = a / tau**2``; epsilon is computed at ``delta - rho_delta`` (the part of
    delta left for the zCDP conversion) by the exact Gaussian curve with ``mu =
    sqrt(2 a) / tau`` if ``gaussian_exact``, else by :func:`epsilon_cks`. The
    ``conversion`` field names the analysis that actually gave the epsilon
    (``"bun-steinke"`` in the rare regime where it beats CKS20).

    Args:
        tau: Noise scale, > 0.
        a: Coefficient of the mechanism, > 0.
        delta: Total delta of the claim, in (0, 1), > ``rho_delta``. Use
            :data:`DEFAULT_DELTA` when the user calibrated with ``rho=`` or ``tau=``.
        mechanism: Name of the mechanism.
        theorem: The paper's label of the privacy theorem.
        gaussian_exact: Whether the mechanism is exactly a Gaussian mechanism.
        rho_delta: Delta paid outside the zCDP analysis, in [0, delta).
        target_epsilon: the epsilon tau was calibrated for, if any. The inverse
            curves are solved numerically, so the epsilon read back can exceed
            the target by rounding noise although tau meets it; the target is
            stated whenever the forward formula confirms it.

    Returns:
        The :class:`PrivacyGuarantee`.
    """
    tau = _check_positive("tau", tau)
    a = _check_positive("a", a)
    delta = _check_open_unit("delta", delta)
    rho_delta = _check_half_open_unit("rho_delta", rho_delta)
    if rho_delta >= delta:
        raise ValueError(
            f"delta must exceed rho_delta, got delta={delta!r} and rho_delta={rho_delta!r}"
        )
    if not isinstance(gaussian_exact, bool):
        raise TypeError(f"gaussian_exact must be a bool, got {gaussian_exact!r}")
    delta = _check_delta_range(delta)
    square = tau * tau
    rho = a / square if square > 0.0 else math.inf
    high = GAUSSIAN_RHO_MAX if gaussian_exact else CKS_RHO_MAX
    # see _checks: where the conversions fail; below, a rounding under the smallest rho
    # (tau_for_rho rounds tau up), far above where tau**2 = a / rho overflows
    if not RHO_RANGE[0] / 2.0 <= rho <= high:
        raise ValueError(
            f"tau={tau!r} gives rho = a / tau^2 = {rho:g} (a = {a:g}), outside the range "
            f"the calibration supports ({RHO_RANGE[0] / 2.0:g} <= rho <= {high:g}): "
            + (
                "the noise would be so small that the conversion to (epsilon, delta) "
                "fails in float arithmetic"
                if rho > high
                else "the noise would be so large that its variance overflows float arithmetic"
            )
        )
    # Remaining delta for the conversion, rounded down so the claim stays valid.
    conv_delta = delta - rho_delta
    if conv_delta + rho_delta > delta:
        conv_delta = math.nextafter(conv_delta, 0.0)
    if gaussian_exact:
        mu = math.sqrt(2.0 * a) / tau
        epsilon = gaussian_epsilon(conv_delta, mu)
        conversion = "gaussian-exact"
        if target_epsilon is not None and target_epsilon < epsilon:
            if _gaussian_delta(_check_positive("target_epsilon", target_epsilon), mu) <= conv_delta:
                epsilon = float(target_epsilon)
    else:
        bs = epsilon_bun_steinke(rho, conv_delta)
        cks = max(0.0, _cks_epsilon(rho, conv_delta))
        epsilon, conversion = (cks, "cks2020") if cks <= bs else (bs, "bun-steinke")
        if target_epsilon is not None and target_epsilon < epsilon:
            if epsilon_cks(rho, conv_delta) <= _check_positive("target_epsilon", target_epsilon):
                epsilon = float(target_epsilon)
    return PrivacyGuarantee(
        rho=rho,
        rho_delta=rho_delta,
        epsilon=epsilon,
        delta=delta,
        conversion=conversion,
        mechanism=mechanism,
        theorem=theorem,
    )


def guarantee_at_delta(guarantee: PrivacyGuarantee, delta: float) -> PrivacyGuarantee:
    """``guarantee`` with its (epsilon, delta) claim stated at another total ``delta``.

    The zCDP cost (``rho``, ``rho_delta``), the unit and the theorem are unchanged;
    epsilon is computed from ``rho`` at ``delta - rho_delta`` by the conversion the
    guarantee names (the exact Gaussian curve with mu = sqrt(2 rho), the better of
    CKS20 and Bun-Steinke, or Bun-Steinke alone when the theorem states that one),
    as :func:`guarantee_for_tau` does. ``dpstream plan --target-error`` uses it to
    state a mechanism built at a noise scale at the delta the user asked for, not at
    :data:`DEFAULT_DELTA`.

    Raises ValueError when ``rho_delta`` leaves no part of ``delta`` to the conversion.
    """
    delta = _check_open_unit("delta", delta)
    if not guarantee.rho_delta < delta:
        raise ValueError(
            f"delta must exceed rho_delta (the delta paid outside zCDP), got delta={delta!r} "
            f"and rho_delta={guarantee.rho_delta!r}"
        )
    if guarantee.conversion == "bun-steinke":
        conv = delta - guarantee.rho_delta
        if conv + guarantee.rho_delta > delta:
            conv = math.nextafter(conv, 0.0)
        epsilon, conversion = epsilon_bun_steinke(guarantee.rho, conv), "bun-steinke"
    else:
        at = guarantee_for_tau(  # rho = a / tau^2 with tau = 1: a is rho itself
            tau=1.0,
            a=guarantee.rho,
            delta=delta,
            rho_delta=guarantee.rho_delta,
            gaussian_exact=guarantee.conversion == "gaussian-exact",
            mechanism=guarantee.mechanism,
            theorem=guarantee.theorem,
        )
        epsilon, conversion = at.epsilon, at.conversion
    return dataclasses.replace(guarantee, epsilon=epsilon, delta=delta, conversion=conversion)
