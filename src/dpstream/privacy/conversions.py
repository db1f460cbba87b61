"""Conversions of a zCDP guarantee into an (epsilon, delta)-DP claim, and back.

Layer 1 of dpstream (docs/architecture.md): pure functions. Three analyses
turn ``rho`` into an (epsilon, delta) claim, from loosest to tightest:

* ``"bun-steinke"``: ``epsilon = rho + 2 sqrt(rho ln(1/delta))``, the paper's
  eq:epsilon (Bun & Steinke 2016).
* ``"cks2020"``: the conversion of Canonne, Kamath & Steinke 2020 ("The Discrete
  Gaussian for Differential Privacy", Corollary 13), valid for any rho-zCDP
  mechanism and never worse than the first one here (we take the minimum).
* ``"gaussian-exact"``: the exact privacy profile of the Gaussian mechanism
  (Balle & Wang 2018, "Improving the Gaussian mechanism", Theorem 8), valid only
  for a mechanism that *is* a Gaussian mechanism with ratio ``mu`` of l2
  sensitivity to noise standard deviation (then ``rho = mu**2 / 2``).

Each comes with its inverse in delta (the delta at a given epsilon). Every
value is rounded to the safe side: an epsilon or a delta is never below the
exact one.
"""

from __future__ import annotations

import math
from typing import Any

from ..rootfind import brentq
from ..special import log_ndtr
from ._checks import _check_nonnegative, _check_open_unit, _check_positive
from ._roots import _nudge


def epsilon_bun_steinke(rho: float, delta: float) -> float:
    """Epsilon of a rho-zCDP mechanism at ``delta`` by the paper's eq:epsilon.

    ``epsilon = rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke 2016, Prop. 1.3).
    Simple and valid, but loose; kept because the paper states its theorems with it.

    Args:
        rho: zCDP parameter, > 0.
        delta: Target delta, in (0, 1).

    Returns:
        The epsilon such that rho-zCDP implies (epsilon, delta)-DP.
    """
    rho = _check_positive("rho", rho)
    delta = _check_open_unit("delta", delta)
    return rho + 2.0 * math.sqrt(rho * -math.log(delta))


def delta_bun_steinke(rho: float, epsilon: float) -> float:
    """Inverse of :func:`epsilon_bun_steinke` in delta: the delta at ``epsilon``.

    Solving ``epsilon = rho + 2 sqrt(rho ln(1/delta))`` gives
    ``delta = exp(-(epsilon - rho)**2 / (4 rho))`` for ``epsilon >= rho``, and the
    bound says nothing (delta = 1) below that.
    """
    rho = _check_positive("rho", rho)
    epsilon = _check_nonnegative("epsilon", epsilon)
    if epsilon <= rho:
        return 1.0
    half = (epsilon - rho) / (2.0 * math.sqrt(rho))  # delta = exp(-half^2)
    return 0.0 if half > 1e150 else min(1.0, math.exp(-half * half))  # (half^2 overflows)


def _cks_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    """CKS20 epsilon bound at a single Renyi order ``alpha > 1``.

    ``alpha rho + (ln(1/delta) + (alpha-1) ln(1-1/alpha) - ln(alpha)) / (alpha-1)``.
    Any ``alpha > 1`` gives a valid epsilon; the tightest is the infimum.
    """
    am1 = alpha - 1.0
    return alpha * rho + (log_inv_delta + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1


def _cks_epsilon(rho: float, delta: float) -> float:
    """Unclamped CKS20 epsilon (without the min with Bun-Steinke); inputs validated.

    The derivative of the bound in alpha is ``rho - ln(1/(alpha delta)) / (alpha-1)**2``,
    which is strictly increasing on alpha > 1, negative as alpha -> 1 (delta < 1)
    and positive at ``alpha = 1 + sqrt(ln(1/delta) / rho)``. So the bound has a
    single stationary point, its minimum, found by brentq on the derivative's
    numerator ``rho (alpha-1)**2 - ln(1/(alpha delta))``.
    """
    log_inv_delta = -math.log(delta)

    def slope(alpha: float) -> float:
        return rho * (alpha - 1.0) ** 2 - log_inv_delta + math.log(alpha)

    hi = 1.0 + math.sqrt(log_inv_delta / rho)
    lo = 1.0 + 1e-12 * (hi - 1.0)
    if slope(lo) >= 0.0:  # only for extreme inputs; the minimum is at alpha ~ 1
        alpha = lo
    elif slope(hi) <= 0.0:  # rounding at an extreme rho (~1e18): alpha - 1 ~ 1e-9 is lost
        alpha = hi  # in 1 + ...; any alpha > 1 gives a valid bound, and this one is ~optimal
    else:
        alpha = brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
    return _cks_epsilon_at(alpha, rho, log_inv_delta)


def epsilon_cks(rho: float, delta: float) -> float:
    """Epsilon of a rho-zCDP mechanism at ``delta`` by Canonne, Kamath & Steinke 2020.

    CKS20 (Corollary 13) show that rho-zCDP implies (epsilon, delta)-DP with
    ``epsilon = inf_{alpha > 1} alpha rho + (ln(1/delta) + (alpha-1) ln(1-1/alpha)
    - ln(alpha)) / (alpha-1)``. This is the tightest conversion valid for every
    rho-zCDP mechanism that we use. The infimum is computed exactly up to
    floating point (see :func:`_cks_epsilon`), and the result is the minimum of
    it and :func:`epsilon_bun_steinke`, both being valid, so it never exceeds
    the paper's eq:epsilon.

    Args:
        rho: zCDP parameter, > 0.
        delta: Target delta, in (0, 1).

    Returns:
        The epsilon such that rho-zCDP implies (epsilon, delta)-DP, >= 0.
    """
    rho = _check_positive("rho", rho)
    delta = _check_open_unit("delta", delta)
    try:
        cks = _cks_epsilon(rho, delta)
    except (ArithmeticError, ValueError):  # a rho so large that alpha rounds to 1 (review
        cks = math.inf  # 112: "math domain error"): Bun-Steinke's bound alone, still valid
    return max(0.0, min(cks, epsilon_bun_steinke(rho, delta)))


def _cks_log_delta(rho: float, epsilon: float) -> float:
    """Log of the CKS20 delta at ``epsilon``, minimised over alpha; inputs validated.

    ``ln delta(alpha) = (alpha-1)(alpha rho - epsilon) + alpha ln(1-1/alpha)
    - ln(alpha-1)``, whose derivative ``(2 alpha - 1) rho - epsilon + ln(1-1/alpha)``
    is strictly increasing from -inf (alpha -> 1) to +inf: one minimum, found by
    brentq on the derivative.
    """

    def slope(alpha: float) -> float:
        return (2.0 * alpha - 1.0) * rho - epsilon + math.log1p(-1.0 / alpha)

    def log_delta(alpha: float) -> float:
        am1 = alpha - 1.0
        return am1 * (alpha * rho - epsilon) + alpha * math.log1p(-1.0 / alpha) - math.log(am1)

    hi = 2.0
    while slope(hi) <= 0.0:
        hi *= 2.0
    lo = 1.0 + 1e-12
    if slope(lo) >= 0.0:
        return log_delta(lo)
    alpha = brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
    return log_delta(alpha)


def delta_cks(rho: float, epsilon: float) -> float:
    """Smallest delta such that rho-zCDP implies (epsilon, delta)-DP, by CKS20.

    CKS20 (Corollary 13): ``delta = inf_{alpha > 1} exp((alpha-1)(alpha rho -
    epsilon)) / (alpha-1) * (1 - 1/alpha)**alpha``. As in :func:`epsilon_cks`, the
    result is the minimum of this and the Bun-Steinke delta, capped at 1; the two
    functions are inverses of each other.

    Args:
        rho: zCDP parameter, > 0.
        epsilon: Target epsilon, >= 0.

    Returns:
        delta in (0, 1].
    """
    rho = _check_positive("rho", rho)
    epsilon = _check_nonnegative("epsilon", epsilon)
    try:
        log_d = _cks_log_delta(rho, epsilon)
    except (ArithmeticError, ValueError):  # extreme inputs (review 112: OverflowError):
        log_d = 0.0  # Bun-Steinke's bound alone, still valid
    cks = 1.0 if log_d >= 0.0 else math.exp(log_d)
    return min(1.0, cks, delta_bun_steinke(rho, epsilon))


#: Bound on the rounding error of one log-space term, in units of its magnitude:
#: log_ndtr, the additions and exp are each accurate to a few ulp; 64 ulp is a
#: generous allowance (the result is only ever made larger by it).
_LOG_TERM_REL_ERR = 64 * 2.0**-52


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """Balle-Wang delta, rounded UP; inputs validated. See :func:`gaussian_delta`.

    ``Phi(x) - e^eps Phi(y) = Phi(x) (1 - exp(d))`` with ``d = log_b - log_a <= 0``
    is computed in log space (no overflow for big eps). For small mu the two
    logs nearly cancel and ``d`` carries an absolute error up to about
    ``ulp * (|log_a| + |log_b|)``, a large relative error in ``1 - exp(d)``.
    So the value returned is an upper bound: ``d`` is lowered by its error bound
    and ``Phi(x)`` raised by its own, which keeps every calibration built on
    this function conservative (it is never below the exact delta).
    """
    x, y = -epsilon / mu + mu / 2.0, -epsilon / mu - mu / 2.0
    log_a, log_y = log_ndtr(x), log_ndtr(y)
    log_b = epsilon + log_y
    # The allowance is the larger of two bounds on d's error. The first, of size
    # |log_a| + |log_b|, is the one dpstream always used: it holds wherever log_b's two
    # terms do not cancel much, and keeps every calibration of the usual range (mu up to
    # hundreds) to the bit. The second holds everywhere: log_y's own error carries into
    # log_b unchanged (at a large mu log_b is two terms of size epsilon that cancel),
    # and x and y are computed with an error of a few ulp of epsilon / mu + mu / 2 (x's
    # two terms cancel near the root), which log_ndtr's slope there (<= |arg| + 1)
    # multiplies. (Review 97: with the first alone the bound failed from mu ~ 2e3, and
    # --tau 1e-9 claimed (5e17, 1e-6) for a true delta of 0.79.)
    ulp = 2.0**-52
    spread = ulp * (epsilon / mu + mu / 2.0)
    arg_a, arg_b = spread * (abs(x) + 1.0), spread * (abs(y) + 1.0)
    logs = 16.0 * ulp * (abs(log_a) + abs(log_b) + abs(log_y) + 1.0)
    err = max(_LOG_TERM_REL_ERR * (abs(log_a) + abs(log_b) + 1.0), logs + arg_a + arg_b)
    d_low = (log_b - log_a) - err
    if d_low >= 0.0:  # the exact delta is >= 0 and d <= 0 exactly: delta is 0
        return 0.0
    err_a = max(_LOG_TERM_REL_ERR * (abs(log_a) + 1.0), 16.0 * ulp * (abs(log_a) + 1.0) + arg_a)
    if err_a < 2.0**-20:  # (as always: Phi(x) times 1 + its error bound)
        phi_x_up = math.exp(log_a) * (1.0 + err_a)
    else:  # e^(log_a + err) rounded up, at most 1
        phi_x_up = math.exp(min(0.0, log_a + err_a)) * (1.0 + 2.0**-48)
    return min(1.0, float(phi_x_up * -math.expm1(d_low)))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact delta of a Gaussian mechanism at ``epsilon`` (Balle & Wang 2018, Thm 8).

    For a mechanism that adds N(0, sigma^2) to a query with l2 sensitivity Delta,
    and ``mu = Delta / sigma``, the smallest delta for which it is
    (epsilon, delta)-DP is ``Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu -
    mu/2)``. The second term is evaluated in log space (``log_ndtr``) so that
    ``e^epsilon`` never overflows.

    Args:
        epsilon: >= 0.
        mu: Sensitivity divided by noise standard deviation, > 0. The mechanism
            is ``mu**2 / 2``-zCDP.

    Returns:
        delta in [0, 1).
    """
    epsilon = _check_nonnegative("epsilon", epsilon)
    mu = _check_positive("mu", mu)
    return _gaussian_delta(epsilon, mu)


def _climb(ok: Any) -> float:
    """The smallest power of two (from the smallest normal float up) at which ``ok``
    holds. For a root of the Gaussian curve found at 0, or so close to it that the
    nudge's relative steps cannot leave it: near epsilon = 0 the curve is flat to
    within its rounding allowance, and a tiny target delta' puts the root there."""
    e = 2.0**-1022
    while not ok(e):
        if e > 2.0**1000:  # pragma: no cover - ok holds at the bracket's end
            raise ArithmeticError("gaussian_epsilon: could not make the result conservative")
        e *= 2.0
    return e


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Smallest epsilon at which a Gaussian mechanism with ratio ``mu`` is
    (epsilon, delta)-DP: the inverse of :func:`gaussian_delta` in epsilon.

    ``gaussian_delta`` decreases strictly in epsilon, so brentq finds the root;
    the result is then moved up until ``gaussian_delta(result, mu) <= delta``
    holds in floating point, so the claim is never too optimistic.

    Args:
        delta: Target delta, in (0, 1).
        mu: Sensitivity divided by noise standard deviation, > 0.

    Returns:
        epsilon >= 0.
    """
    delta = _check_open_unit("delta", delta)
    mu = _check_positive("mu", mu)
    if _gaussian_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while not math.isfinite(hi) or _gaussian_delta(hi, mu) > delta:
        if not math.isfinite(hi):  # (review 98: mu past ~1e154 looped for ever)
            raise ValueError(f"gaussian_epsilon: mu={mu!r} is too large for float arithmetic")
        hi *= 2.0
    eps = brentq(lambda e: _gaussian_delta(e, mu) - delta, 0.0, hi, xtol=1e-15, rtol=1e-15)

    def ok(e: float) -> bool:
        return _gaussian_delta(e, mu) <= delta

    if not ok(eps):
        try:
            eps = _nudge(eps, +1, ok, "gaussian_epsilon")
        except ArithmeticError:  # a root at 0 or subnormal: the growing steps start too low
            eps = _climb(ok)
    # brentq stops within its tolerance of the root and the nudge moves in growing
    # steps: look at the floats just below for the smallest one that passes (any
    # passing value is a valid claim; the check is not monotone at the ulp level),
    # so a calibrated target reads back exactly.
    best, probe = eps, eps
    for _ in range(64):
        probe = math.nextafter(probe, 0.0)
        if probe < 0.0:
            break
        if ok(probe):
            best = probe
    return best
