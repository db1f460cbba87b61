"""Matrix-factorization counters: buffered linear Toeplitz (BLT) strategies.

Layer 3 of dpstream (the floor of ``tree``). A continual counter releases the
prefix sums s = A x of a stream x_1..x_T, A the T x T lower-triangular matrix
of ones. Any factorization A = B C gives a counter: add Gaussian noise to the
strategy C x and post-process with B,

    B (C x + z) = A x + B z,    z ~ N(0, sigma^2 I).

It is the Gaussian mechanism on C x, so one event (each of at most Delta0
items' x changes by 1 at one step j) costs rho = Delta0 max_j ||C e_j||^2 /
(2 sigma^2), and the count released at t has variance sigma^2 ||row_t(B)||^2.
The r-ary tree is one such factorization; this module provides a better one.

A *buffered linear Toeplitz* (BLT) strategy with k buffers is the
lower-triangular Toeplitz C whose first column is c_0 = 1 and

    c_n = sum_i omega_i theta_i^(n-1)        (n >= 1),

with decays 0 < theta_1 < ... < theta_k < 1 and scales omega_i > 0
(Dvijotham, McMahan, Pillutla, Steinke and Thakurta, "Efficient and
Near-Optimal Noise Generation for Streaming Differential Privacy", FOCS 2024;
McKenna, "Scaling up the Banded Matrix Factorization Mechanism for
Differentially Private ML", 2024, for the streamed, memory-bounded
factorization mechanisms BLT belongs to). Its generating function
C(x) = 1 + sum_i omega_i x / (1 - theta_i x) is rational of degree k, so
C^-1 is again a BLT (Dvijotham et al., Lemma 5.2), with decays lambda_p and
scales omega'_p:

* lambda_p are the roots of sum_i omega_i / (theta_i - lambda) = 1 (the poles of
  1/C). With omega > 0 there is one root below theta_1 and one between each pair
  of consecutive thetas, so 0 < lambda_1 < theta_1 < lambda_2 < ... < theta_k
  when sum_i omega_i / theta_i < 1 (the "Pillutla score" condition, which keeps
  every lambda positive);
* omega'_p = prod_i (lambda_p - theta_i) / prod_(q != p) (lambda_p - lambda_q) < 0,
  and, symmetrically, omega_i = prod_p (theta_i - lambda_p) / prod_(j != i)
  (theta_i - theta_j) (partial fractions of prod(1 - lambda x) / prod(1 - theta x)).

Streamed noise. The noise of one item, B z = A C^-1 z, needs k buffers: with
u = C^-1 z found by forward substitution through C's own buffers,

    u_t = z_t - sum_i omega_i buf_i,    buf_i <- theta_i buf_i + u_t,    y_t = y_(t-1) + u_t,

y_t is the noise released at t: k + 1 floats of state and one fresh keyed
Gaussian z_t per item and step (:func:`stream_step`).

Exact numbers in closed form. With u_i = 1 - theta_i and v_p = 1 - lambda_p
(kept as complements so that decays near 1 lose no digits) and
G_m(x) = sum_(n < m) x^n:

* sensitivity: max_j ||C e_j||^2 = ||C e_1||^2 (every column of a lower
  Toeplitz matrix is a truncation of the first) = 1 + sum_(i,j) omega_i omega_j
  G_(T-1)(theta_i theta_j);
* B = A C^-1 is Toeplitz with column b_n = c_B + sum_p a_p lambda_p^n,
  c_B = 1 / C(1) = 1 / (1 + sum_i omega_i / u_i), a_p = -omega'_p / v_p > 0,
  so ||row_t(B)||^2 = sum_(n < t) b_n^2 = t c_B^2 + 2 c_B sum_p a_p G_t(lambda_p)
  + sum_(p,q) a_p a_q G_t(lambda_p lambda_q), increasing in t.

Every term of both sums is positive, so they are accurate to a few ulps for any
horizon. The sensitivity that privacy depends on is nevertheless computed from
the strategy's coefficients themselves, ``fsum(c_n^2)`` over the O(T k) column
(:meth:`BLTStrategy.strategy_column`), for every horizon up to
:data:`COLUMN_LIMIT`; the closed form is used beyond it and for the optimiser.
Neither ever comes from an optimiser's reported objective.

Fitting. :func:`fit_blt` minimises the worst-case variance factor
V(T) = max_t ||row_t(B)||^2 max_j ||C e_j||^2 over the 2k interlaced points
lambda_1 < theta_1 < ... < theta_k (a parameterisation in which omega > 0 and
0 < lambda < 1 hold by construction), with SciPy. V is within 1.3x of the lower
bound :func:`lower_bound` (which holds for every factorization, Toeplitz or not,
and approaches (1 + ln(T)/pi)^2 as T grows; Henzinger, Upadhyay and Upadhyay,
SODA 2023, whose square-root factorization A^(1/2) A^(1/2) BLT approximates
with few buffers). :func:`blt_for_horizon` reads fitted parameters from a table
shipped with dpstream (``data/blt_table.json``, written by
``bench/fit_blt_table.py``, for 1 to 4 buffers) at the grid horizon H >= T
next to T, so the parameters never depend on the optimiser of the running
process; the exact numbers are then computed for T itself.

Example:
    >>> from dpstream.factorization import blt_for_horizon, lower_bound
    >>> s = blt_for_horizon(1000)
    >>> s.buffers
    4
    >>> round(s.worst_case_variance, 1), round(lower_bound(1000), 2)
    (10.7, 8.42)
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import operator
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from . import compiled
from ._checks import check_int
from .rootfind import brentq

__all__ = [
    "BLTStrategy",
    "COLUMN_LIMIT",
    "DEFAULT_BUFFERS",
    "MAX_BLT_HORIZON",
    "blt_for_horizon",
    "blt_unbounded",
    "unbounded_std_ratio",
    "fit_blt",
    "grid_horizon",
    "lower_bound",
    "prefix_nuclear_norm",
    "state_factor",
    "stream_step",
]

#: A vector of floats: a sequence, or a 1-d float array (what a fit produces).
FloatVector = Sequence[float] | npt.NDArray[np.float64]

#: Buffers per item of the default BLT.
DEFAULT_BUFFERS = 4
#: Largest supported buffer count (more buffers gain little and fit badly).
MAX_BUFFERS = 10
#: Horizons up to this get their sensitivity from the O(T k) strategy column.
COLUMN_LIMIT = 1 << 24
#: Largest horizon a BLT counter supports: the fitted decays must stay
#: representable below 1 in float64 (1 - theta ~ 1/T).
MAX_BLT_HORIZON = 1 << 40
#: The fitted grid: 2^j and 3 * 2^(j-1), so the grid horizon H >= T is at most 1.5 T.
_GRID_MAX_EXP = 40
_TABLE_FILE = "blt_table.json"


# ----------------------------------------------------------------------- helpers


def _geometric_sum(m: float, one_minus_x: np.ndarray) -> np.ndarray:
    """G_m(x) = sum_(n < m) x^n for x = 1 - one_minus_x in [0, 1), elementwise.

    Written as -expm1(m log1p(-e)) / e, accurate for x near 1 and any m.
    """
    e = np.asarray(one_minus_x, dtype=np.float64)
    if m <= 0:
        return np.zeros_like(e)
    return -np.expm1(float(m) * np.log1p(-e)) / e


def _one_minus_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 - (1 - a)(1 - b) = a + b - a b for all pairs, without cancellation."""
    return a[:, None] + b[None, :] - a[:, None] * b[None, :]


def _scales_from_pair(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """omega_i = prod_p (theta_i - lambda_p) / prod_(j != i) (theta_i - theta_j), in complements.

    theta_i - lambda_p = v_p - u_i and theta_i - theta_j = u_j - u_i. With the
    roles of (u, v) swapped this gives the inverse scales omega'_p.
    """
    num = np.prod(v[None, :] - u[:, None], axis=1)
    diff = u[None, :] - u[:, None]
    np.fill_diagonal(diff, 1.0)
    return num / np.prod(diff, axis=1)


def _inverse_complements(u: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """The complements v_p = 1 - lambda_p of C^-1's decays, ascending.

    Roots of g(v) = sum_i omega_i / (v - u_i) - 1 (theta_i - lambda = v - u_i):
    g falls from +inf to -inf between consecutive u's (one root each) and from
    +inf to -1 above the largest u (one more root). Found by bisection-safe
    Brent on each bracket, to full precision.
    """
    order = np.argsort(u)
    us = u[order]
    om = omega[order]

    def g(x: float) -> float:
        return float(np.sum(om / (x - us))) - 1.0

    roots = []
    for p in range(len(us)):
        lo = math.nextafter(float(us[p]), math.inf)
        if p + 1 < len(us):
            hi = math.nextafter(float(us[p + 1]), -math.inf)
        else:
            hi = float(us[p]) + float(np.sum(om)) + 1.0  # g(hi) < 0 there
        while g(lo) <= 0.0:  # pragma: no cover - only for a pole closer than an ulp
            lo = math.nextafter(lo, math.inf)
        roots.append(brentq(g, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500))
    return np.array(roots[::-1], dtype=np.float64)  # descending v: ascending lambda


def _check_parameters(theta: FloatVector, omega: FloatVector) -> tuple[np.ndarray, np.ndarray]:
    th = np.asarray(theta, dtype=np.float64)
    om = np.asarray(omega, dtype=np.float64)
    if th.ndim != 1 or om.ndim != 1 or th.shape != om.shape or not 1 <= th.size <= MAX_BUFFERS:
        raise ValueError(
            f"theta and omega must be two sequences of the same length "
            f"1..{MAX_BUFFERS}, got {th.shape} and {om.shape}"
        )
    if not (np.all(np.isfinite(th)) and np.all(th > 0) and np.all(th < 1)):
        raise ValueError(f"theta (buffer decays) must lie in (0, 1), got {th.tolist()}")
    if th.size > 1 and not np.all(np.diff(th) > 0):
        raise ValueError(f"theta must be strictly increasing, got {th.tolist()}")
    if not (np.all(np.isfinite(om)) and np.all(om > 0)):
        raise ValueError(f"omega (buffer scales) must be positive, got {om.tolist()}")
    score = math.fsum((om / th).tolist())
    if not score < 1.0:
        raise ValueError(f"sum(omega / theta) must be < 1 so that C^-1 decays, got {score!r}")
    return th, om


# ----------------------------------------------------------------------- the strategy


class BLTStrategy:
    """A BLT factorization A = B C of the T x T prefix-sum matrix, with its exact numbers.

    Args:
        theta: the k buffer decays of C, strictly increasing in (0, 1).
        omega: the k buffer scales of C, positive, with sum(omega / theta) < 1.
        horizon: T, the number of steps the numbers below are stated for.
        fitted_horizon: the horizon the parameters were fitted for (information
            only; every number is computed for ``horizon``).
        unbounded: state the sensitivity for every horizon (its limit, see
            :meth:`sensitivity_squared_limit`) rather than for ``horizon``: a
            stream with no planned end (:func:`blt_unbounded`).

    Attributes:
        theta, omega: the parameters (tuples of floats; they define C exactly).
        inverse_theta, inverse_omega: the BLT parameters of C^-1 (lambda, omega').
        horizon, fitted_horizon, buffers.

    Nothing here is random; :func:`stream_step` turns Gaussians into B z.
    """

    __slots__ = (
        "theta",
        "omega",
        "horizon",
        "fitted_horizon",
        "inverse_theta",
        "inverse_omega",
        "_unbounded",
        "_u",
        "_v",
        "_bias",
        "_a",
        "_sens2",
    )

    def __init__(
        self,
        theta: FloatVector,
        omega: FloatVector,
        horizon: int,
        *,
        fitted_horizon: int | None = None,
        unbounded: bool = False,
    ) -> None:
        th, om = _check_parameters(theta, omega)
        self.horizon = check_int("horizon", horizon, 1)
        if not isinstance(unbounded, bool):
            raise TypeError(f"unbounded must be a bool, got {unbounded!r}")
        self._unbounded = unbounded
        self.fitted_horizon = (
            self.horizon
            if fitted_horizon is None
            else check_int("fitted_horizon", fitted_horizon, 1)
        )
        self.theta = tuple(float(x) for x in th)
        self.omega = tuple(float(x) for x in om)
        self._u = 1.0 - th  # exact for theta >= 1/2 (Sterbenz)
        self._v = _inverse_complements(self._u, om)
        self.inverse_theta = tuple(float(x) for x in 1.0 - self._v)
        inv_om = _scales_from_pair(self._v, self._u)
        self.inverse_omega = tuple(float(x) for x in inv_om)
        # B's column: b_n = bias + sum_p a_p lambda_p^n
        self._bias = 1.0 / (1.0 + math.fsum((om / self._u).tolist()))
        self._a = -inv_om / self._v
        self._sens2: float | None = None

    # -- identity ------------------------------------------------------------------
    @property
    def unbounded(self) -> bool:
        """Whether the sensitivity is the limit over every horizon (a stream with no
        planned end, :func:`blt_unbounded`) rather than the sum up to ``horizon``."""
        return getattr(self, "_unbounded", False)  # (a snapshot from before the flag)

    @property
    def buffers(self) -> int:
        """k, the number of buffers (floats of state per item besides the running sum)."""
        return len(self.theta)

    def fingerprint(self) -> str:
        """The parameters, exactly (``float.hex``): what a noise purpose must carry."""
        text = "blt:" + ",".join(x.hex() for x in self.theta + self.omega)
        return text + ";unbounded" if self.unbounded else text

    def at_horizon(self, horizon: int) -> BLTStrategy:
        """The same C (same parameters) stated for another horizon (an unbounded
        strategy stays unbounded: its sensitivity is the limit whatever the horizon)."""
        return BLTStrategy(
            self.theta,
            self.omega,
            horizon,
            fitted_horizon=self.fitted_horizon,
            unbounded=self.unbounded,
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "theta": list(self.theta),
            "omega": list(self.omega),
            "horizon": self.horizon,
            "fitted_horizon": self.fitted_horizon,
        }
        if self.unbounded:
            d["unbounded"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BLTStrategy:
        return cls(
            d["theta"],
            d["omega"],
            d["horizon"],
            fitted_horizon=d.get("fitted_horizon"),
            unbounded=bool(d.get("unbounded")),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BLTStrategy):
            return NotImplemented
        return (self.theta, self.omega, self.horizon) == (other.theta, other.omega, other.horizon)

    def __hash__(self) -> int:
        return hash((self.theta, self.omega, self.horizon))

    def __repr__(self) -> str:
        return (
            f"BLTStrategy(buffers={self.buffers}, horizon={self.horizon}, "
            f"fitted_horizon={self.fitted_horizon}, V={self.worst_case_variance:.4g})"
        )

    # -- columns (O(T k)) ------------------------------------------------------------
    def _length(self, n: int | None) -> int:
        return self.horizon if n is None else check_int("n", n, 0)

    def _column(
        self, n: int | None, rates: Sequence[float], weights: Sequence[float]
    ) -> np.ndarray:
        """x_0 .. x_(n-1) of a BLT matrix's first column (n defaults to T): x_0 = 1 and
        x_j = sum_i weights_i rates_i^(j-1) for j >= 1, summed in the order of the buffers."""
        n = self._length(n)
        out = np.zeros(n)
        if n:
            out[0] = 1.0
        powers = np.arange(max(n - 1, 0), dtype=np.float64)
        for rate, weight in zip(rates, weights, strict=True):
            out[1:] += weight * np.power(rate, powers)
        return out

    def strategy_column(self, n: int | None = None) -> np.ndarray:
        """c_0 .. c_(n-1), the first column of C (n defaults to T)."""
        return self._column(n, self.theta, self.omega)

    def noise_column(self, n: int | None = None) -> np.ndarray:
        """d_0 .. d_(n-1), the first column of C^-1 (n defaults to T)."""
        return self._column(n, self.inverse_theta, self.inverse_omega)

    def noise_matrix(self, n: int | None = None) -> np.ndarray:
        """B = A C^-1 restricted to steps 1..n (n defaults to T): the n x n lower-triangular
        Toeplitz matrix of the column b_j = d_0 + ... + d_j. The noise released at steps
        t and t' (held from step 1) has covariance sigma^2 (B B^T)[t-1, t'-1]."""
        b = np.cumsum(self.noise_column(n))
        lag = np.subtract.outer(np.arange(b.size), np.arange(b.size))
        return np.where(lag >= 0, b[np.clip(lag, 0, None)], 0.0)

    def variance_factors(self, n: int | None = None) -> np.ndarray:
        """||row_t(B)||^2 for t = 1..n (n defaults to T), from the O(T k) noise column.

        The released count at t has variance sigma^2 times this.
        """
        b = np.cumsum(self.noise_column(n))
        return np.cumsum(b * b)

    # -- exact numbers -------------------------------------------------------------------
    def sensitivity_squared_closed_form(self, horizon: int | None = None) -> float:
        """max_j ||C e_j||^2 by the closed form (all terms positive), for T or ``horizon``."""
        T = self.horizon if horizon is None else check_int("horizon", horizon, 1)
        om = np.asarray(self.omega)
        e = _one_minus_product(self._u, self._u)
        terms = (om[:, None] * om[None, :] * _geometric_sum(T - 1, e)).ravel()
        return math.fsum([1.0, *terms.tolist()])

    def sensitivity_squared_limit(self) -> float:
        """sup_T max_j ||C e_j||^2 = sum_(n >= 0) c_n^2 = 1 + sum_(i,j) omega_i omega_j /
        (1 - theta_i theta_j): the closed form at T = infinity (all terms positive, so
        it bounds the sum up to every finite T)."""
        om = np.asarray(self.omega)
        e = _one_minus_product(self._u, self._u)
        terms = (om[:, None] * om[None, :] / e).ravel()
        return math.fsum([1.0, *terms.tolist()])

    @property
    def sensitivity_squared(self) -> float:
        """max_j ||C e_j||^2 = sum_(n < T) c_n^2: from the strategy column for T <=
        :data:`COLUMN_LIMIT` (math.fsum), from the closed form beyond. For an
        ``unbounded`` strategy, the limit T -> infinity
        (:meth:`sensitivity_squared_limit`): valid for a stream of any length."""
        if self._sens2 is None:
            if self.unbounded:
                self._sens2 = self.sensitivity_squared_limit()
            elif self.horizon <= COLUMN_LIMIT:
                c = self.strategy_column()
                self._sens2 = math.fsum((c * c).tolist())
            else:
                self._sens2 = self.sensitivity_squared_closed_form()
        return self._sens2

    @property
    def sensitivity(self) -> float:
        """max_j ||C e_j||, the l2 sensitivity of C x to one step's increment of 1."""
        return math.sqrt(self.sensitivity_squared)

    def variance_factor(self, t: int) -> float:
        """||row_t(B)||^2 = sum_(n < t) b_n^2 in closed form (O(k^2)), for 1 <= t <= T."""
        t = check_int("t", t, 1)
        if t > self.horizon:
            raise ValueError(f"t must be <= horizon ({self.horizon}), got {t}")
        v, a, bias = self._v, self._a, self._bias
        terms = [t * bias * bias]
        terms += (2.0 * bias * a * _geometric_sum(t, v)).tolist()
        e = _one_minus_product(v, v)
        terms += (a[:, None] * a[None, :] * _geometric_sum(t, e)).ravel().tolist()
        return math.fsum(terms)

    @property
    def max_variance_factor(self) -> float:
        """max_t ||row_t(B)||^2 = ||row_T(B)||^2 (the row norms grow with t)."""
        return self.variance_factor(self.horizon)

    @property
    def worst_case_variance(self) -> float:
        """V = max_t ||row_t(B)||^2 max_j ||C e_j||^2: the largest variance of a
        released count in units of tau^2 = sigma^2 / max_j ||C e_j||^2."""
        return self.max_variance_factor * self.sensitivity_squared


#: stream_step works through the items in blocks of this many, so that the
#: 4k + 1 elementwise passes of a step run in cache (about 2x faster at 10^6 items).
_STEP_BLOCK = 1 << 14


def stream_step(
    theta: Sequence[float],
    omega: Sequence[float],
    buffers: np.ndarray,
    total: np.ndarray,
    z: np.ndarray,
) -> None:
    """One step of the streamed noise B z for many items, in place.

    ``buffers`` has shape (k, n), ``total`` and ``z`` shape (n,) (``z`` is
    overwritten with u = C^-1 z at this step). The operations, per item and in
    this order: acc = omega_0 buf_0 + omega_1 buf_1 + ...; u = z - acc;
    buf_i = theta_i buf_i + u; total += u. Elementwise IEEE arithmetic, so an
    item's values do not depend on which other items share the arrays (or on
    the blocking): a step over many items, over one, or replayed from scratch
    give the same bits.
    """
    if compiled.blt_step(theta, omega, buffers, total, z):
        return  # (the same operations in C, one pass per item)
    k = len(theta)
    n = z.shape[0]
    if k == 0:
        total += z
        return
    th = np.asarray(theta, dtype=np.float64)[:, None]
    block = min(n, _STEP_BLOCK)
    acc = np.empty(block)
    tmp = np.empty(block)
    for lo in range(0, n, _STEP_BLOCK):
        hi = min(lo + _STEP_BLOCK, n)
        m = hi - lo
        buf = buffers[:, lo:hi]
        u = z[lo:hi]
        a, b = acc[:m], tmp[:m]
        np.multiply(buf[0], omega[0], out=a)
        for i in range(1, k):
            np.multiply(buf[i], omega[i], out=b)
            a += b
        np.subtract(u, a, out=u)
        buf *= th
        buf += u
        total[lo:hi] += u


# ----------------------------------------------------------------------- state of a late item


def state_factor(strategy: BLTStrategy, steps: int) -> tuple[tuple[float, ...], ...]:
    """A lower-triangular (k + 1) x (k + 1) factor F of the streamed noise's state after
    ``steps`` steps: F F^T = Sigma_n, the covariance of x_n = (buf_1, ..., buf_k, y_n)
    when z_1..z_n are i.i.d. N(0, 1) (scale it by sigma for N(0, sigma^2) draws).

    What it is for: an item that joins a stream at step s (an unknown domain's
    item, first seen then) has had no count before s, so its state at s - 1 is
    exactly x_(s-1), a centred Gaussian vector with covariance sigma^2
    Sigma_(s-1); drawing it as sigma F w, w ~ N(0, I_(k+1)), and running the
    steps s, s+1, ... from there gives noise with the joint law of an item held
    from step 1 (:meth:`~dpstream.mechanisms.blt_noise.BLTNoise.join_items`), in
    O(k^2) per item instead of s - 1 steps.

    How: one step of :func:`stream_step` is the linear map x_t = M x_(t-1) + e z_t,
    M = [[diag(theta) - 1 omega^T, 0], [-omega^T, 1]], e = (1, ..., 1), so
    Sigma_n = sum_(j < n) M^j e e^T M^jT, with Sigma_(2n) = Sigma_n + M^n Sigma_n M^nT
    and Sigma_(n+1) = M Sigma_n M^T + e e^T. The factor is carried through these
    doublings in square-root form, never forming Sigma: each update writes the
    new covariance as A A^T for A = [F, M^n F] or [M F, e] and re-triangularises A
    by a Householder QR of A^T (F_new = R^T). That is O(k^3 log n), keeps F F^T
    positive semi-definite by construction and needs no pivot: a state of rank
    below k + 1 (n < k + 1 steps: n draws span at most n directions) simply gives
    zero columns, where a Cholesky of a computed Sigma would meet tiny negative
    pivots. Plain Python floats in a fixed order (no BLAS), so every process and
    machine computes the same bits: the factor is part of the released noise.
    Cached per (strategy parameters, n).
    """
    n = check_int("steps", steps, 0)
    return _state_factor(strategy.theta, strategy.omega, n)


@functools.lru_cache(maxsize=16)
def _state_factor(
    theta: tuple[float, ...], omega: tuple[float, ...], n: int
) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(row) for row in _doubling_state(theta, omega, n)[0])


@functools.lru_cache(maxsize=4096)
def _doubling_state(
    theta: tuple[float, ...], omega: tuple[float, ...], n: int
) -> tuple[list[list[float]], list[list[float]]]:
    """(F, M^n) after the doublings of ``bin(n)``, from those of ``bin(n >> 1)``.

    The doublings read the bits of n from the most significant: the state after
    the leading bits of n is that of ``n >> 1``, followed by one doubling (and
    one step when n is odd). Taking it from a cache of recent n therefore runs
    the very operations of the whole loop, in the same order (the same bits),
    with one doubling per new n instead of log2 n: an unknown domain's items
    join at consecutive steps. Read-only results (shared by the cache).
    """
    k = len(theta)
    d = k + 1
    if n == 0:
        return [[0.0] * d for _ in range(d)], [
            [1.0 if i == j else 0.0 for j in range(d)] for i in range(d)
        ]
    factor, power = _doubling_state(theta, omega, n >> 1)
    # n -> 2n: Sigma + P Sigma P^T, P = M^n
    factor = _triangular(_side_by_side(factor, _matmul(power, factor)))
    power = _matmul(power, power)
    if n & 1:  # n -> n + 1: M Sigma M^T + e e^T
        trans = [
            [(theta[i] if i == j else 0.0) - omega[j] for j in range(k)] + [0.0] for i in range(k)
        ]
        trans.append([-w for w in omega] + [1.0])
        ones = [[1.0] for _ in range(d)]
        factor = _triangular(_side_by_side(_matmul(trans, factor), ones))
        power = _matmul(trans, power)
    return factor, power


def _matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    # (fsum is correctly rounded: map(mul) feeds it the very products the generator did)
    cols = list(zip(*b, strict=True))
    if any(len(row) != len(b) for row in a):
        raise ValueError("_matmul: the inner dimensions differ")
    return [[math.fsum(map(operator.mul, row, col)) for col in cols] for row in a]


def _side_by_side(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [ra + rb for ra, rb in zip(a, b, strict=True)]


def _triangular(a: list[list[float]]) -> list[list[float]]:
    """A lower-triangular L (d x d, diagonal >= 0) with L L^T = A A^T, A of shape d x p
    (p >= d), by Householder QR of A^T = Q R: A A^T = R^T R, L = R^T."""
    d, p = len(a), len(a[0])
    x = [list(col) for col in zip(*a, strict=True)]  # A^T, p x d
    for j in range(d):
        v = [x[i][j] for i in range(j, p)]
        norm = math.sqrt(math.fsum(map(operator.mul, v, v)))
        if norm == 0.0:
            continue
        alpha = -math.copysign(norm, v[0])
        v[0] -= alpha  # |v[0]| = |x_jj| + norm > 0: no cancellation
        vv = math.fsum(map(operator.mul, v, v))
        for c in range(j + 1, d):
            f = 2.0 * math.fsum(map(operator.mul, v, [row[c] for row in x[j:]])) / vv
            for i in range(len(v)):
                x[j + i][c] -= f * v[i]
        x[j][j] = alpha
        for i in range(j + 1, p):
            x[i][j] = 0.0
    # R is the top d x d block of x; L = R^T, each column's sign flipped to a diagonal >= 0
    sign = [-1.0 if x[j][j] < 0 else 1.0 for j in range(d)]
    return [[sign[j] * x[j][i] if j <= i else 0.0 for j in range(d)] for i in range(d)]


# ----------------------------------------------------------------------- lower bound


def prefix_nuclear_norm(horizon: int) -> float:
    """||A||_*, the sum of the singular values of the T x T prefix-sum matrix.

    A^-1 = I - S (S the down-shift), so A^-T A^-1 is tridiagonal (2 on the
    diagonal but 1 in its last entry, -1 beside it), whose eigenvalues are
    4 sin^2((2j - 1) pi / (2 (2T + 1))), j = 1..T; the singular values of A are
    their inverse square roots.
    """
    T = check_int("horizon", horizon, 1)
    j = np.arange(1, T + 1, dtype=np.float64)
    sv = 0.5 / np.sin((2.0 * j - 1.0) * np.pi / (4.0 * T + 2.0))
    return math.fsum(sv.tolist())


def lower_bound(horizon: int) -> float:
    """(||A||_* / T)^2: no factorization A = B C (Gaussian linear counter) has a smaller V.

    For any A = B C, max_t ||row_t(B)|| max_j ||C e_j|| >= ||A||_* / T (the
    factorization-norm bound gamma_2(A) >= ||A||_* / sqrt(m n) for an m x n A;
    see Henzinger, Upadhyay and Upadhyay, SODA 2023, and Matousek, Nikolov and
    Talwar 2020).
    """
    T = check_int("horizon", horizon, 1)
    return (prefix_nuclear_norm(T) / T) ** 2


# ----------------------------------------------------------------------- fitting


def _pair_from_params(p: np.ndarray) -> np.ndarray:
    """2k complements, decreasing, from unconstrained parameters:
    s_0 = -softplus(p_0), s_j = s_(j-1) - exp(p_j), complements exp(s)."""
    s = np.empty_like(p)
    s[0] = -np.logaddexp(0.0, p[0])
    s[1:] = s[0] - np.cumsum(np.exp(p[1:]))
    return np.exp(s)


def _params_from_pair(comps: np.ndarray) -> np.ndarray:
    s = np.log(comps)
    p = np.empty_like(s)
    p[0] = np.log(np.expm1(-s[0]))
    p[1:] = np.log(-np.diff(s))
    return p


def _objective_from_pair(comps: np.ndarray, horizon: int) -> float:
    """V(T) in closed form for the BLT with complements v_1 > u_1 > v_2 > ... > u_k."""
    v = comps[0::2]
    u = comps[1::2]
    om = _scales_from_pair(u, v)
    inv_om = _scales_from_pair(v, u)
    sens2 = 1.0 + float(
        np.sum(om[:, None] * om[None, :] * _geometric_sum(horizon - 1, _one_minus_product(u, u)))
    )
    bias = 1.0 / (1.0 + float(np.sum(om / u)))
    a = -inv_om / v
    err = (
        horizon * bias * bias
        + 2.0 * bias * float(np.sum(a * _geometric_sum(horizon, v)))
        + float(np.sum(a[:, None] * a[None, :] * _geometric_sum(horizon, _one_minus_product(v, v))))
    )
    return sens2 * err


#: Fitting keeps consecutive log-complements at least this far apart (a pair
#: closer than that is a buffer that cancels, and only costs digits).
_MIN_LOG_GAP = 1e-3


def _penalised(p: np.ndarray, horizon: int) -> float:
    if not np.all(np.isfinite(p)):
        return 1e30
    comps = _pair_from_params(p)
    if comps[-1] < 1e-2 / horizon or comps[-1] <= 4e-16 or np.any(p[1:] < math.log(_MIN_LOG_GAP)):
        return 1e30
    with np.errstate(all="ignore"):
        value = _objective_from_pair(comps, horizon)
    return math.log(value) if math.isfinite(value) and value > 0 else 1e30


def _strategy_from_pair(comps: np.ndarray, horizon: int, fitted: int) -> BLTStrategy:
    v = comps[0::2]
    u = comps[1::2]
    om = _scales_from_pair(u, v)
    theta = 1.0 - u
    order = np.argsort(theta)
    return BLTStrategy(theta[order], om[order], horizon, fitted_horizon=fitted)


def _default_starts(horizon: int, buffers: int) -> list[np.ndarray]:
    starts = [
        np.geomspace(0.5, 0.5 / horizon, 2 * buffers),
        np.geomspace(0.8, 0.05 / horizon, 2 * buffers),
        np.geomspace(0.3, 2.0 / horizon, 2 * buffers),
    ]
    return [c for c in starts if np.all(np.diff(np.log(c)) < -_MIN_LOG_GAP)]


def fit_blt(
    horizon: int, buffers: int = DEFAULT_BUFFERS, *, starts: Sequence[FloatVector] | None = None
) -> BLTStrategy:
    """Fit a BLT with ``buffers`` buffers minimising V(T) = max_t ||row_t(B)||^2 max_j ||C e_j||^2.

    Nelder-Mead then BFGS (SciPy) on the closed-form V over the interlaced
    decays of C and C^-1, from a few deterministic starts (plus ``starts``,
    decreasing complement sequences 1 - lambda_1 > 1 - theta_1 > ..., e.g. a
    neighbouring horizon's fit). Takes about a second; :func:`blt_for_horizon`
    reads shipped fits instead. The returned strategy's numbers are recomputed
    exactly from its parameters, not taken from the optimiser.
    """
    T = check_int("horizon", horizon, 2)
    k = check_int("buffers", buffers, 1)
    if k > MAX_BUFFERS:
        raise ValueError(f"buffers must be <= {MAX_BUFFERS}, got {k}")
    if T > MAX_BLT_HORIZON:
        raise ValueError(f"horizon must be <= 2**40 for a BLT counter, got {T}")
    from scipy import optimize  # on first use: ~0.2 s of a command's start

    candidates = _default_starts(T, k) + [np.asarray(c, dtype=np.float64) for c in starts or ()]
    best_x, best_f = None, math.inf
    for comps in candidates:
        x0 = _params_from_pair(comps)
        if _penalised(x0, T) >= 1e30:
            continue
        r = optimize.minimize(
            _penalised,
            x0,
            args=(T,),
            method="Nelder-Mead",
            options={"maxiter": 400 * k, "xatol": 1e-10, "fatol": 1e-14},
        )
        r2 = optimize.minimize(_penalised, r.x, args=(T,), method="BFGS")
        for x, f in ((r.x, r.fun), (r2.x, r2.fun)):
            if f < best_f:
                best_x, best_f = x, f
    if best_x is None:  # pragma: no cover - the default starts are always feasible
        raise RuntimeError(f"no feasible start for horizon={T}, buffers={k}")
    return _strategy_from_pair(_pair_from_params(best_x), T, T)


def grid_horizon(horizon: int) -> int:
    """The smallest fitted-grid horizon >= T: 2^j or 3 * 2^(j-1) (at most 1.5 T), >= 2."""
    T = check_int("horizon", horizon, 1)
    if T > MAX_BLT_HORIZON:
        raise ValueError(f"horizon must be <= 2**40 for a BLT counter, got {T}")
    if T <= 2:
        return 2
    p = 1 << (T - 1).bit_length()  # smallest power of two >= T
    three = 3 * (p >> 2)
    return three if three >= T else p


def grid_horizons(maximum: int = MAX_BLT_HORIZON) -> list[int]:
    """Every grid horizon up to ``maximum`` (what the shipped table holds)."""
    out = []
    for j in range(1, _GRID_MAX_EXP + 1):
        for h in (3 * (1 << (j - 2)) if j >= 2 else 0, 1 << j):
            if 2 <= h <= maximum and h not in out:
                out.append(h)
    return sorted(out)


@functools.cache
def _table() -> dict[tuple[int, int], tuple[tuple[float, ...], tuple[float, ...]]]:
    try:
        text = (resources.files("dpstream") / "data" / _TABLE_FILE).read_text("utf-8")
    except FileNotFoundError:  # pragma: no cover - a broken install
        return {}
    data = json.loads(text)
    return {
        (int(e["horizon"]), int(e["buffers"])): (tuple(e["theta"]), tuple(e["omega"]))
        for e in data["entries"]
    }


@functools.lru_cache(maxsize=256)
def _fitted_parameters(grid: int, buffers: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    hit = _table().get((grid, buffers))
    if hit is not None:
        return hit
    s = fit_blt(grid, buffers)
    return s.theta, s.omega


def blt_for_horizon(horizon: int, buffers: int = DEFAULT_BUFFERS) -> BLTStrategy:
    """The BLT dpstream uses for horizon T: fitted at the grid horizon H >= T, stated for T.

    The parameters come from the shipped table (every grid horizon, 1 to 4
    buffers), or, for 5 to 10 buffers, from :func:`fit_blt` at H, once per
    process (and then from this machine's SciPy). Using the fit for H >= T
    instead of T costs less than 0.5% of V; every number of the result is
    computed for T.
    """
    T = check_int("horizon", horizon, 1)
    k = check_int("buffers", buffers, 1)
    if k > MAX_BUFFERS:
        raise ValueError(f"buffers must be <= {MAX_BUFFERS}, got {k}")
    return _strategy_for(T, k)


@functools.lru_cache(maxsize=64)
def _strategy_for(horizon: int, buffers: int) -> BLTStrategy:
    # cached: the O(T k) sensitivity is computed once per (T, k) and process
    grid = grid_horizon(horizon)
    theta, omega = _fitted_parameters(grid, buffers)
    return BLTStrategy(theta, omega, horizon, fitted_horizon=grid)


#: The BLT for streams with no planned end (:func:`blt_unbounded`): 4 buffers fitted
#: by ``bench/fit_blt_unbounded.py`` to keep the standard deviation at every t in
#: [UNBOUNDED_FIT_RANGE] within the smallest factor of the std that the BLT fitted for
#: horizon t (:func:`blt_for_horizon`) has at its own last step. Exact (``float.hex``).
UNBOUNDED_THETA = (
    "0x1.f83edef764c15p-1",
    "0x1.fff8e3f477642p-1",
    "0x1.fffffdb78bb73p-1",
    "0x1.ffffffffb7aa3p-1",
)
UNBOUNDED_OMEGA = (
    "0x1.9a87391d43692p-3",
    "0x1.23e72c8490b95p-7",
    "0x1.292cd9329dfdbp-12",
    "0x1.6d3b9e35fd588p-18",
)
#: The steps the unbounded fit was made for (its worst ratio is reached at their ends).
UNBOUNDED_FIT_RANGE = (96, MAX_BLT_HORIZON)


def blt_unbounded() -> BLTStrategy:
    """The BLT of a stream with no planned end: one C for every t, its sensitivity the
    limit T -> infinity.

    Why it is private for every t: the keyed draws are calibrated to
    sup_T max_j ||C e_j||^2 = sum_(n >= 0) c_n^2
    (:meth:`BLTStrategy.sensitivity_squared_limit`), which bounds the
    sensitivity of the strategy over the first T steps for every T, so the
    Gaussian mechanism on C x is the stated rho-zCDP at every step, whatever the
    stream's length. Its horizon is :data:`MAX_BLT_HORIZON` = 2^40 (the step
    counter's limit; the variance numbers are stated up to it).

    Why these parameters: the fit for one horizon (even 2^40) puts its noise
    where that horizon's last step needs it, and is 2.4x the std of the BLT
    fitted for t = 100 at t = 100. These were fitted (``bench/fit_blt_unbounded.py``)
    to minimise the largest ratio, over t in :data:`UNBOUNDED_FIT_RANGE`, of
    the std of a count at t (sigma ||row_t(B)||, sigma from the limit
    sensitivity) to the std of :func:`blt_for_horizon` (t) at its last step, at
    the same tau: at most about 1.5 (table in docs/counters.md). Same state
    as the default BLT: 4 buffers and the running sum per item.
    """
    return _unbounded_strategy()


@functools.cache
def _unbounded_strategy() -> BLTStrategy:
    theta = tuple(float.fromhex(x) for x in UNBOUNDED_THETA)
    omega = tuple(float.fromhex(x) for x in UNBOUNDED_OMEGA)
    return BLTStrategy(
        theta, omega, MAX_BLT_HORIZON, fitted_horizon=MAX_BLT_HORIZON, unbounded=True
    )


def unbounded_std_ratio(t: int) -> float:
    """The std of a count at step t under :func:`blt_unbounded`, over the std of
    :func:`blt_for_horizon` (t) at its last step t, at the same tau (the cost of not
    knowing the end): sqrt(S_inf ||row_t(B)||^2 / V(t)), S_inf the limit sensitivity."""
    t = check_int("t", t, 1)
    s = blt_unbounded()
    return math.sqrt(
        s.sensitivity_squared * s.variance_factor(t) / blt_for_horizon(t).worst_case_variance
    )


def write_table(
    path: str, horizons: Sequence[int], buffers: int = DEFAULT_BUFFERS, *, warm_start: bool = True
) -> list[dict[str, Any]]:
    """Fit every horizon for ``buffers`` buffers and write them into the table JSON at ``path``.

    The file's other entries (other buffer counts, and other horizons of this
    one) are kept as they are, so refitting some entries never moves the noise of
    the others. ``warm_start``: start each fit also from the
    previous horizon's (how the default 4-buffer entries were made); without it each
    entry is exactly what :func:`fit_blt` gives at run time, which is how the 1- to
    3-buffer entries were made, so a process that fitted them before they were
    shipped draws the same noise.
    """
    entries: list[dict[str, Any]] = []
    previous: BLTStrategy | None = None
    for h in sorted(horizons):
        starts = []
        if previous is not None and warm_start:
            starts.append(_pair_of(previous))
        s = fit_blt(h, buffers, starts=starts)
        previous = s
        entries.append(
            {
                "horizon": h,
                "buffers": buffers,
                "theta": list(s.theta),
                "omega": list(s.omega),
                "V": s.worst_case_variance,
            }
        )
    kept: list[dict[str, Any]] = []
    fitted = {(buffers, e["horizon"]) for e in entries}
    with contextlib.suppress(FileNotFoundError):
        with open(path, encoding="utf-8") as fh:
            kept = [
                e
                for e in json.load(fh)["entries"]
                if (int(e["buffers"]), int(e["horizon"])) not in fitted
            ]
    every = sorted(kept + entries, key=lambda e: (int(e["buffers"]), int(e["horizon"])))
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(
            {
                "about": "BLT parameters fitted by dpstream.factorization.fit_blt; "
                "regenerate with bench/fit_blt_table.py",
                "entries": every,
            },
            fh,
            indent=1,
        )
        fh.write("\n")
    return entries


def _pair_of(s: BLTStrategy) -> np.ndarray:
    """The decreasing complements 1 - lambda_1 > 1 - theta_1 > ... of a strategy (a fit start)."""
    v = np.sort(s._v)[::-1]
    u = np.sort(s._u)[::-1]
    out = np.empty(2 * s.buffers)
    out[0::2] = v
    out[1::2] = u
    return out
