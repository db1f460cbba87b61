"""Brent's bounded minimiser of a function of one variable, without ``scipy.optimize``.

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream.

UnkBase splits its delta between the threshold and the Gaussian noise with a
one-dimensional search (:func:`dpstream.mechanisms.unknown.calibrate_unknown`),
and the split fixes tau to its last bit: a resumed stream must draw the noise
it drew before, so every version must find the same point. That search used
``scipy.optimize.minimize_scalar(method="bounded")``, whose import loads some
300 modules (linear algebra, sparse matrices, array-API layers): about 23 MB of
a batch run's resident memory and 0.2 s of its start, for a loop of thirty
lines of arithmetic.

:func:`bounded_minimum` is that loop: Brent's method for a minimum (R. P.
Brent, *Algorithms for Minimization without Derivatives*, 1973, ch. 5; the
procedure ``fmin`` of Forsythe, Malcolm and Moler, *Computer Methods for
Mathematical Computations*, 1977), golden-section steps with parabolic
interpolation through the three best points. It takes the same floating-point
steps as SciPy's bounded method, including the tolerance's constant, the square
root of 2.2e-16 (not the exact machine epsilon), so the point and its value are
the same doubles; ``tests/test_minimize.py`` holds them equal, bit for bit, to
SciPy's on the calibration's objective and on random functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Minimum", "bounded_minimum"]

#: The fraction of an interval a golden-section step moves: (3 - sqrt(5)) / 2.
_GOLDEN = 0.5 * (3.0 - math.sqrt(5.0))
#: The relative part of the tolerance: the square root of 2.2e-16, the constant
#: SciPy's bounded method uses (its last bits set where the search stops).
_SQRT_EPS = math.sqrt(2.2e-16)


class Minimum(NamedTuple):
    """Where :func:`bounded_minimum` stopped: the point, its value, the evaluations."""

    x: float
    fun: float
    evaluations: int
    converged: bool


def _sign_or_one(value: float) -> float:
    """-1.0 for a negative value, else 1.0 (zero counts as positive)."""
    return -1.0 if value < 0.0 else 1.0


def bounded_minimum(
    f: Callable[[float], float],
    lo: float,
    hi: float,
    *,
    xatol: float = 1e-5,
    max_evaluations: int = 500,
) -> Minimum:
    """A local minimum of ``f`` on ``[lo, hi]`` by Brent's method.

    The interval shrinks until the best point is known within
    ``sqrt(2.2e-16) |x| + xatol / 3`` (twice that over the interval's half), or
    ``max_evaluations`` values of ``f`` were taken (``converged`` is then False).
    ``f`` is never evaluated outside ``[lo, hi]``. A NaN value leaves
    ``converged`` False. Raises ValueError when ``lo > hi`` or a bound is not
    finite.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"the bounds must be finite numbers (got {lo!r}, {hi!r})")
    if lo > hi:
        raise ValueError(f"the lower bound {lo!r} is above the upper bound {hi!r}")
    a, b = float(lo), float(hi)
    # x: the best point so far; w: the second best; v: the one before w.
    x = w = v = a + _GOLDEN * (b - a)
    fx = float(f(x))
    fw = fv = fx
    evaluations = 1
    step = 0.0  # the step just taken
    before = 0.0  # the step taken the time before (the parabola must beat half of it)
    fu = math.inf
    converged = True
    while True:
        mid = 0.5 * (a + b)
        tol1 = _SQRT_EPS * abs(x) + xatol / 3.0
        tol2 = 2.0 * tol1
        if not abs(x - mid) > tol2 - 0.5 * (b - a):  # (a NaN stops here too)
            break
        golden = True
        if abs(before) > tol1:
            # the parabola through (v, fv), (w, fw), (x, fx): its vertex is x + p / q
            r = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            p = (x - v) * q - (x - w) * r
            q = 2.0 * (q - r)
            if q > 0.0:
                p = -p
            q = abs(q)
            older = before
            before = step
            if abs(p) < abs(0.5 * q * older) and p > q * (a - x) and p < q * (b - x):
                golden = False
                step = (p + 0.0) / q
                u = x + step
                if (u - a) < tol2 or (b - u) < tol2:
                    step = tol1 * _sign_or_one(mid - x)
        if golden:
            before = (a - x) if x >= mid else (b - x)
            step = _GOLDEN * before
        # never a step shorter than the tolerance
        u = x + _sign_or_one(step) * max(abs(step), tol1)
        fu = float(f(u))
        evaluations += 1
        if fu <= fx:
            if u >= x:
                a = x
            else:
                b = x
            v, fv = w, fw
            w, fw = x, fx
            x, fx = u, fu
        else:
            if u < x:
                a = u
            else:
                b = u
            if fu <= fw or w == x:
                v, fv = w, fw
                w, fw = u, fu
            elif fu <= fv or v == x or v == w:
                v, fv = u, fu
        if evaluations >= max_evaluations:
            converged = False
            break
    if math.isnan(x) or math.isnan(fx) or math.isnan(fu):
        converged = False
    return Minimum(x, fx, evaluations, converged)
