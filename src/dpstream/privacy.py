"""Privacy guarantees, conversions between them, and calibration of the noise scale.

This is layer 1 of dpstream: pure functions and immutable values, no noise and no
I/O. Every mechanism of the library states its cost here, so that the number a
mechanism reports in ``mechanism.privacy`` and the number ``dpstream plan`` prints
are computed by the same code.

The analyses of the paper are in zero-concentrated DP (zCDP, Bun & Steinke 2016):
all mechanisms of dpstream are ``rho``-zCDP with ``rho(tau) = a / tau**2`` for a
mechanism-specific coefficient ``a`` (KnownBase ``a = Delta0 / 2``, SparseGumb
``a = k + 1/2``, or ``k`` with no sparse-vector round, MetaAlgo with Gumbel
selection ``a = k``, BinMech ``a = 1 / 2``). zCDP composes by adding ``rho`` (paper, lem:zCDP_Comp).

Three ways of turning ``rho`` into an (epsilon, delta)-DP claim are provided,
from loosest to tightest:

* ``"bun-steinke"``: ``epsilon = rho + 2 sqrt(rho ln(1/delta))``, the paper's
  eq:epsilon (Bun & Steinke 2016).
* ``"cks2020"``: the conversion of Canonne, Kamath & Steinke 2020 ("The Discrete
  Gaussian for Differential Privacy", Corollary 13), valid for any rho-zCDP
  mechanism and never worse than the first one here (we take the minimum).
* ``"gaussian-exact"``: the exact privacy profile of the Gaussian mechanism
  (Balle & Wang 2018, "Improving the Gaussian mechanism", Theorem 8), valid only
  for a mechanism that *is* a Gaussian mechanism with ratio ``mu`` of l2
  sensitivity to noise standard deviation (then ``rho = mu**2 / 2``).

Floating-point policy: noise scales are rounded up and privacy
parameters down. Every calibration result is checked against the forward
formula after it is computed and nudged in the safe direction until the check
passes.

Example:
    >>> from dpstream.privacy import calibrate_tau, guarantee_for_tau
    >>> tau = calibrate_tau(a=1.5, epsilon=1.0, delta=1e-6)  # Delta0 = 3
    >>> g = guarantee_for_tau(tau=tau, a=1.5, delta=1e-6, mechanism="KnownBase",
    ...                       theorem="lem: KnownBase (Delta0/(2 tau^2)-zCDP)")
    >>> g.epsilon <= 1.0
    True
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Literal

from scipy.special import log_ndtr

from dpstream.errors import BudgetExhaustedError

__all__ = [
    "CONVERSIONS",
    "DEFAULT_DELTA",
    "ApproxDP",
    "Budget",
    "PrivacyGuarantee",
    "PrivacyLedger",
    "ZCDP",
    "calibrate_tau",
    "delta_bun_steinke",
    "delta_cks",
    "epsilon_bun_steinke",
    "epsilon_cks",
    "gaussian_delta",
    "gaussian_epsilon",
    "guarantee_for_tau",
    "mu_for_gaussian",
    "resolve_budget",
    "rho_for_epsilon_delta",
    "tau_for_rho",
]

DEFAULT_DELTA: float = 1e-6
"""The delta at which a mechanism reports its (epsilon, delta) claim when the user
gave ``rho=`` or ``tau=`` rather than ``epsilon=`` and ``delta=``.

The mechanism is then calibrated in zCDP and its guarantee is exactly
``rho``-zCDP; the (epsilon, delta) pair is only a translation for readers who
think in approximate DP, and ``1e-6`` is a conventional, conservative choice for
it. It does not influence the noise.
"""

CONVERSIONS: tuple[str, ...] = ("gaussian-exact", "cks2020", "bun-steinke")
"""Names of the analyses that turn a zCDP parameter into an (epsilon, delta) claim."""

# Guards for the iterative "nudge until the forward check passes" loops: each step
# multiplies the moving quantity by (1 +- 2**-52 * 2**i), so a few dozen steps cover
# any realistic rounding error; more means the forward formula is broken.
_MAX_NUDGES = 200


# --------------------------------------------------------------------------- validation


def _brentq(f: Any, a: float, b: float, **kw: Any) -> float:
    """SciPy's Brent root finder, imported on first use: ``scipy.optimize`` is ~0.2 s
    of a command's start, and only calibration needs it."""
    from scipy.optimize import brentq

    return brentq(f, a, b, **kw)


def _check_real(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise ``TypeError`` if it is not a real number.

    ``bool`` (and ``numpy.bool_``) are rejected although Python treats ``True`` as
    1: a flag passed where a privacy parameter belongs is a bug, not a budget.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


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


# --------------------------------------------------------------------------- guarantees


@dataclass(frozen=True)
class ZCDP:
    """A rho-zCDP guarantee (Bun & Steinke 2016).

    Attributes:
        rho: The zCDP parameter, positive and finite. Guarantees compose by adding
            ``rho`` (paper, lem:zCDP_Comp).
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_positive("rho", self.rho))

    def __str__(self) -> str:
        return f"rho-zCDP with rho={self.rho:.6g}"


@dataclass(frozen=True)
class ApproxDP:
    """An (epsilon, delta)-DP guarantee.

    Attributes:
        epsilon: Non-negative and finite.
        delta: In [0, 1); 0 means pure epsilon-DP.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_nonnegative("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _check_half_open_unit("delta", self.delta))

    def __str__(self) -> str:
        return f"(epsilon={self.epsilon:.6g}, delta={self.delta:.3g})-DP"


#: The privacy units, and the neighbour relation each guarantee is for.
UNITS = {
    "event": "two streams are neighbours when one event's items are replaced by none, at "
             "the same time step (the release clock, and so which steps are released, is "
             "public and the same for both)",
    "user": "two streams are neighbours when all events of one user (within the "
            "contribution bounds) are replaced by empty ones, at the same time steps",
}


@dataclass(frozen=True, kw_only=True)
class PrivacyGuarantee:
    """What a mechanism reports as ``mechanism.privacy``: its zCDP cost and the
    (epsilon, delta)-DP claim derived from it.

    A mechanism is ``rho_delta``-approximate ``rho``-zCDP (paper, defn:zCDP); for
    the pure zCDP mechanisms ``rho_delta`` is 0. The (epsilon, delta) claim
    includes ``rho_delta`` in ``delta``: epsilon was computed from ``rho`` at
    ``delta - rho_delta`` (paper, lem after eq:epsilon: delta-approximate rho-zCDP
    gives (epsilon(rho, delta'), delta + delta')-DP).

    All fields are keyword-only, so that two floats cannot be swapped by position.

    Attributes:
        rho: zCDP parameter of the mechanism's Gaussian / exponential part.
        rho_delta: The delta paid outside the zCDP analysis (e.g. ``Delta0 *
            delta`` for UnkBase's unknown-domain threshold); 0 for pure zCDP.
        epsilon: The epsilon of the claimed (epsilon, delta)-DP guarantee.
        delta: The total delta of that claim, ``rho_delta`` included.
        conversion: The analysis that gave epsilon from rho: one of
            ``"gaussian-exact"``, ``"cks2020"``, ``"bun-steinke"``.
        mechanism: The mechanism's name, e.g. ``"KnownBase"``.
        theorem: The paper's label of the privacy theorem, e.g.
            ``"lem: KnownBase (Delta0/(2 tau^2)-zCDP)"``.
        unit: What the guarantee hides: ``"event"`` (two streams are neighbours
            when one event's items are replaced by none, at the same time
            step, so the release clock is unchanged) or ``"user"`` (all of one
            user's bounded contributions). See :attr:`neighbours`.
    """

    rho: float
    rho_delta: float = 0.0
    epsilon: float
    delta: float
    conversion: str
    mechanism: str
    theorem: str
    unit: str = "event"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_positive("rho", self.rho))
        object.__setattr__(self, "rho_delta", _check_half_open_unit("rho_delta", self.rho_delta))
        object.__setattr__(self, "epsilon", _check_nonnegative("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _check_open_unit("delta", self.delta))
        if self.rho_delta >= self.delta:
            raise ValueError(
                f"delta must exceed rho_delta (the total delta includes it), got "
                f"delta={self.delta!r} and rho_delta={self.rho_delta!r}"
            )
        _check_str("conversion", self.conversion)
        if self.conversion not in CONVERSIONS:
            raise ValueError(
                f"conversion must be one of {CONVERSIONS}, got conversion={self.conversion!r}"
            )
        _check_str("mechanism", self.mechanism)
        _check_str("theorem", self.theorem)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {tuple(UNITS)}, got unit={self.unit!r}")

    def plain(self) -> str:
        """The guarantee in plain words, for people (no paper labels): e.g.
        ``"epsilon = 1, delta = 1e-06 per event (rho-zCDP with rho = 0.028)"``."""
        text = (f"epsilon = {self.epsilon:.6g}, delta = {self.delta:.3g} per {self.unit} "
                f"(rho-zCDP with rho = {self.rho:.6g}")
        if self.rho_delta > 0.0:
            text += f", plus {self.rho_delta:.3g} of delta for what the noise cannot hide"
        return text + ")"

    @property
    def neighbours(self) -> str:
        """The neighbour relation the guarantee is for, in words."""
        return UNITS[self.unit]

    @property
    def zcdp(self) -> ZCDP:
        """The zCDP part of the guarantee (without ``rho_delta``)."""
        return ZCDP(self.rho)

    @property
    def approx_dp(self) -> ApproxDP:
        """The claimed (epsilon, delta)-DP guarantee."""
        return ApproxDP(self.epsilon, self.delta)

    def to_dict(self) -> dict[str, float | str]:
        """Return the guarantee as a JSON-serialisable dict (field name -> value)."""
        return asdict(self)

    def __str__(self) -> str:
        if self.rho_delta > 0.0:
            zcdp = (
                f"rho_delta-approximate rho-zCDP with rho={self.rho:.6g}, "
                f"rho_delta={self.rho_delta:.3g}"
            )
        else:
            zcdp = f"rho-zCDP with rho={self.rho:.6g}"
        return (
            f"{zcdp}; (epsilon={self.epsilon:.6g}, delta={self.delta:.3g})-DP via "
            f"{self.conversion}, per {self.unit} [{self.mechanism}, {self.theorem}]"
        )


# --------------------------------------------------------------------------- conversions


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
    return min(1.0, math.exp(-((epsilon - rho) ** 2) / (4.0 * rho)))


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
    else:
        alpha = _brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
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
    return max(0.0, min(_cks_epsilon(rho, delta), epsilon_bun_steinke(rho, delta)))


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
    alpha = _brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
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
    log_d = _cks_log_delta(rho, epsilon)
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
    log_a = log_ndtr(-epsilon / mu + mu / 2.0)
    log_b = epsilon + log_ndtr(-epsilon / mu - mu / 2.0)
    d_low = (log_b - log_a) - _LOG_TERM_REL_ERR * (abs(log_a) + abs(log_b) + 1.0)
    if d_low >= 0.0:  # the exact delta is >= 0 and d <= 0 exactly: delta is 0
        return 0.0
    phi_x_up = math.exp(log_a) * (1.0 + _LOG_TERM_REL_ERR * (abs(log_a) + 1.0))
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
    while _gaussian_delta(hi, mu) > delta:
        hi *= 2.0
    eps = _brentq(lambda e: _gaussian_delta(e, mu) - delta, 0.0, hi, xtol=1e-15, rtol=1e-15)

    def ok(e: float) -> bool:
        return _gaussian_delta(e, mu) <= delta

    if not ok(eps):
        eps = _nudge(eps, +1, ok, "gaussian_epsilon")
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


def _nudge(x: float, direction: int, ok: Any, what: str) -> float:
    """Move ``x`` in ``direction`` (+1 up, -1 down) in growing relative steps until
    ``ok(x)`` holds; used to make a root found by brentq conservative."""
    step = 2.0**-52
    for _ in range(_MAX_NUDGES):
        if ok(x):
            return x
        x = x * (1.0 + direction * step) if x != 0.0 else direction * 5e-324
        step = min(step * 2.0, 0.5)
    raise ArithmeticError(f"{what}: could not make the result conservative")  # pragma: no cover


# --------------------------------------------------------------------------- calibration


def tau_for_rho(rho: float, a: float) -> float:
    """Smallest noise scale tau with ``a / tau**2 <= rho``.

    Args:
        rho: Target zCDP parameter, > 0.
        a: The mechanism's coefficient in ``rho(tau) = a / tau**2``, > 0.

    Returns:
        ``sqrt(a / rho)`` rounded up in the last place (and further if needed),
        so the achieved rho never exceeds the target in floating point.
    """
    rho = _check_positive("rho", rho)
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
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_open_unit("delta", delta)
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
    rho = _brentq(lambda r: epsilon_cks(r, delta) - epsilon, lo, hi, xtol=1e-300, rtol=1e-15)
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
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_open_unit("delta", delta)
    lo, hi = 1.0, 1.0
    while _gaussian_delta(epsilon, lo) > delta:
        lo /= 2.0
    while _gaussian_delta(epsilon, hi) <= delta:
        hi *= 2.0
    mu = _brentq(lambda m: _gaussian_delta(epsilon, m) - delta, lo, hi, xtol=1e-300, rtol=1e-15)
    return _nudge(mu, -1, lambda m: _gaussian_delta(epsilon, m) <= delta, "mu_for_gaussian")


def calibrate_tau(
    *,
    a: float,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    gaussian_exact: bool = False,
) -> float:
    """Smallest noise scale tau that meets a privacy target, by the tightest valid analysis.

    The mechanism is ``a / tau**2``-zCDP. With ``rho=`` the answer is
    :func:`tau_for_rho`. With ``epsilon=`` and ``delta=``:

    * ``gaussian_exact=True`` -- only for a mechanism that is exactly a Gaussian
      mechanism with ``mu = sqrt(2 a) / tau`` (e.g. KnownBase's partial-sum table):
      ``tau = sqrt(2 a) / mu_for_gaussian(epsilon, delta)``, rounded up.
    * otherwise the CKS20 conversion: ``tau_for_rho(rho_for_epsilon_delta(...))``.

    Args:
        a: Coefficient of the mechanism, > 0.
        rho: Target zCDP parameter; exclusive with ``epsilon``/``delta``.
        epsilon: Target epsilon, > 0; needs ``delta``.
        delta: Target delta, in (0, 1); needs ``epsilon``.
        gaussian_exact: Whether the exact Gaussian curve applies.

    Returns:
        tau > 0.

    Raises:
        TypeError: A non-numeric argument.
        ValueError: Out-of-range values, or not exactly one target given.
    """
    a = _check_positive("a", a)
    budget = resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=None)
    if budget.kind == "rho":
        assert budget.rho is not None
        return tau_for_rho(budget.rho, a)
    assert budget.epsilon is not None and budget.delta is not None
    eps, dlt = budget.epsilon, budget.delta
    if gaussian_exact:
        sens = math.sqrt(2.0 * a)
        tau = math.nextafter(sens / mu_for_gaussian(eps, dlt), math.inf)
        while _gaussian_delta(eps, sens / tau) > dlt:
            tau = math.nextafter(tau, math.inf)
        return tau
    tau = tau_for_rho(rho_for_epsilon_delta(eps, dlt, "cks2020"), a)
    while epsilon_cks(a / (tau * tau), dlt) > eps:  # pragma: no cover - belt and braces
        tau = math.nextafter(tau, math.inf)
    return tau


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
    rho = a / (tau * tau)
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


# --------------------------------------------------------------------------- budgets


BudgetKind = Literal["rho", "epsilon-delta", "tau"]


@dataclass(frozen=True)
class Budget:
    """The privacy argument of a mechanism after :func:`resolve_budget` checked it.

    Exactly one form is set: ``kind == "rho"`` (``rho``), ``"epsilon-delta"``
    (``epsilon`` and ``delta``) or ``"tau"`` (a noise scale chosen by the user);
    the other fields are ``None``.
    """

    kind: BudgetKind
    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    tau: float | None = None

    def __post_init__(self) -> None:
        expected = {
            "rho": ("rho",),
            "epsilon-delta": ("epsilon", "delta"),
            "tau": ("tau",),
        }
        if self.kind not in expected:
            raise ValueError(f"kind must be one of {tuple(expected)}, got kind={self.kind!r}")
        for name in ("rho", "epsilon", "delta", "tau"):
            value = getattr(self, name)
            if (value is not None) != (name in expected[self.kind]):
                raise ValueError(
                    f"a Budget of kind {self.kind!r} needs exactly {expected[self.kind]}, "
                    f"got {name}={value!r}"
                )

    @property
    def reporting_delta(self) -> float:
        """The delta at which to state the (epsilon, delta) claim: the user's delta,
        or :data:`DEFAULT_DELTA` for the rho and tau forms."""
        return self.delta if self.delta is not None else DEFAULT_DELTA

    def calibrate(self, a: float, *, gaussian_exact: bool = False) -> float:
        """The noise scale tau for a mechanism with coefficient ``a``.

        The user's tau for ``kind == "tau"``, else :func:`calibrate_tau`.
        """
        if self.kind == "tau":
            assert self.tau is not None
            return self.tau
        return calibrate_tau(
            a=a, rho=self.rho, epsilon=self.epsilon, delta=self.delta, gaussian_exact=gaussian_exact
        )


def resolve_budget(
    *,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    tau: float | None = None,
) -> Budget:
    """Check a mechanism's privacy keyword arguments and say which form was given.

    Every mechanism accepts ``rho=``, or ``epsilon=`` with ``delta=``, or ``tau=``
    (a raw noise scale), and exactly one of these forms.

    Args:
        rho: Target zCDP parameter, positive and finite.
        epsilon: Target epsilon, positive and finite; needs ``delta``.
        delta: Target delta, in (0, 1); needs ``epsilon``.
        tau: Noise scale, positive and finite.

    Returns:
        A :class:`Budget` with the values converted to ``float``.

    Raises:
        TypeError: A given value is not a real number (``bool`` is not one).
        ValueError: No form, more than one form, ``epsilon`` without ``delta``
            or the reverse, or a value out of range; the message names the
            parameter and the value received.
    """
    given = {
        name: value
        for name, value in (("rho", rho), ("epsilon", epsilon), ("delta", delta), ("tau", tau))
        if value is not None
    }
    for name, value in given.items():
        _check_real(name, value)
    forms = [
        form
        for form, present in (
            ("rho", rho is not None),
            ("epsilon-delta", epsilon is not None or delta is not None),
            ("tau", tau is not None),
        )
        if present
    ]
    usage = "give exactly one of rho=, epsilon= with delta=, or tau="
    if not forms:
        raise ValueError(f"{usage} (got none of rho, epsilon, delta, tau)")
    if len(forms) > 1:
        got = [f"{name}={value!r}" for name, value in given.items()]
        listed = ", ".join(got[:-1]) + " and " + got[-1]
        raise ValueError(f"{usage} (got {listed})")
    kind = forms[0]
    if kind == "rho":
        return Budget(kind="rho", rho=_check_positive("rho", rho))
    if kind == "tau":
        return Budget(kind="tau", tau=_check_positive("tau", tau))
    if delta is None:
        raise ValueError(f"epsilon={epsilon!r} needs delta= as well (got delta=None)")
    if epsilon is None:
        raise ValueError(f"delta={delta!r} needs epsilon= as well (got epsilon=None)")
    return Budget(
        kind="epsilon-delta",
        epsilon=_check_positive("epsilon", epsilon),
        delta=_check_open_unit("delta", delta),
    )


# --------------------------------------------------------------------------- composition


class PrivacyLedger:
    """Adds up the zCDP costs of composed mechanisms (paper, lem:zCDP_Comp).

    The total is kept as an exactly rounded sum (``math.fsum``) of the entries,
    and a spend is refused, before anything is recorded, if it would push the
    total past the budget.

    Args:
        rho_budget: The total rho allowed, positive and finite; ``None`` records
            without a limit.

    Example:
        >>> ledger = PrivacyLedger(rho_budget=1.0)
        >>> ledger.spend(0.25, "counter")
        >>> ledger.spent, ledger.remaining
        (0.25, 0.75)
    """

    def __init__(self, rho_budget: float | None = None) -> None:
        self._budget = None if rho_budget is None else _check_positive("rho_budget", rho_budget)
        self._entries: list[tuple[str, float]] = []
        self._spent = 0.0

    @property
    def rho_budget(self) -> float | None:
        """The total rho allowed, or ``None``."""
        return self._budget

    @property
    def spent(self) -> float:
        """The rho spent so far."""
        return self._spent

    @property
    def remaining(self) -> float | None:
        """The rho still available (never negative), or ``None`` without a budget."""
        if self._budget is None:
            return None
        return max(0.0, self._budget - self._spent)

    @property
    def entries(self) -> tuple[tuple[str, float], ...]:
        """The recorded spends as ``(label, rho)`` pairs, oldest first."""
        return tuple(self._entries)

    def spend(self, rho: float, label: str) -> None:
        """Record a rho-zCDP cost under ``label``.

        Args:
            rho: The cost, positive and finite.
            label: What it pays for (shown in plans and errors).

        Raises:
            TypeError: ``rho`` not a real number or ``label`` not a str.
            ValueError: ``rho`` not positive and finite.
            BudgetExhaustedError: The new total would exceed ``rho_budget``;
                nothing is recorded then.
        """
        rho = _check_positive("rho", rho)
        _check_str("label", label)
        total = math.fsum([r for _, r in self._entries] + [rho])
        if self._budget is not None and total > self._budget:
            raise BudgetExhaustedError(
                f"spending rho={rho!r} for {label!r} would bring the total to {total!r}, "
                f"over the budget rho_budget={self._budget!r} (spent {self._spent!r})"
            )
        self._entries.append((label, rho))
        self._spent = total

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(rho_budget={self._budget!r}, spent={self._spent!r}, "
            f"entries={len(self._entries)})"
        )
