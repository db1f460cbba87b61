"""dpstream.minimize.bounded_minimum: Brent's bounded minimiser without ``scipy.optimize``.

UnkBase's split of delta fixes tau to its last bit, so the minimiser must stop at
exactly the point (and value) that ``scipy.optimize.minimize_scalar(method="bounded")``
(the reference, imported here only) stops at, for the same function, bounds and
tolerance, and after as many evaluations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dpstream.mechanisms import unknown
from dpstream.minimize import Minimum, bounded_minimum

from .test_start import loaded_after


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def _scipy_minimum(f, lo: float, hi: float, *, xatol: float = 1e-5, max_evaluations: int = 500):
    res = minimize_scalar(
        f, bounds=(lo, hi), method="bounded", options={"xatol": xatol, "maxiter": max_evaluations}
    )
    return Minimum(float(res.x), float(res.fun), int(res.nfev), bool(res.success))


def _same(ours: Minimum, theirs: Minimum) -> bool:
    return (_bits(ours.x), _bits(ours.fun), ours.evaluations, ours.converged) == (
        _bits(theirs.x),
        _bits(theirs.fun),
        theirs.evaluations,
        theirs.converged,
    )


def test_random_functions_give_scipys_bits() -> None:
    """Smooth, flat, kinked and many-dipped functions with minima inside, at and
    outside the bounds, over intervals from 1e-3 to 1e3 wide, at tolerances from
    1e-10 to 1e-1 (parabolic and golden steps, steps at the bounds and the
    shortest step all taken); a few hit the evaluation cap."""
    rng = np.random.default_rng(20261127)
    kinds = set()
    capped = 0
    for case in range(600):
        centre = float(rng.normal() * 10.0 ** rng.integers(-3, 4))
        width = float(10.0 ** rng.uniform(-3, 3))
        lo = centre - width * float(rng.uniform(0.0, 1.5))
        hi = centre + width * float(rng.uniform(0.0, 1.5))
        s = float(rng.uniform(0.1, 20))
        kind = case % 5
        kinds.add(kind)
        if kind == 0:
            f = lambda x, c=centre, s=s: s * (x - c) ** 2 + math.cos(x)  # noqa: E731
        elif kind == 1:
            f = lambda x, c=centre, s=s: abs(x - c) * s  # noqa: E731
        elif kind == 2:
            f = lambda x, c=centre, w=width: math.sin(7 * (x - c) / w) + ((x - c) / w) ** 2  # noqa: E731
        elif kind == 3:
            f = lambda x, c=centre, s=s: math.cosh(s * (x - c) / 1e3)  # noqa: E731 (flat)
        else:
            f = lambda x, c=centre: -math.exp(-((x - c) ** 2))  # noqa: E731 (flat far away)
        xatol = float(10.0 ** rng.uniform(-10, -1))
        cap = 500 if case % 7 else int(rng.integers(3, 12))
        ours = bounded_minimum(f, lo, hi, xatol=xatol, max_evaluations=cap)
        theirs = _scipy_minimum(f, lo, hi, xatol=xatol, max_evaluations=cap)
        assert _same(ours, theirs), (case, kind, centre, lo, hi, xatol, cap, ours, theirs)
        capped += not ours.converged
    assert kinds == {0, 1, 2, 3, 4}
    assert capped > 0  # the cap was reached and reported as SciPy reports it


def test_the_calibration_gives_scipys_tau(monkeypatch: pytest.MonkeyPatch) -> None:
    """UnkBase's (tau, threshold delta) over a sweep of budgets, event sizes, horizons,
    bases and Linf, once with bounded_minimum and once with SciPy's minimiser in its
    place: the same doubles (so a stream resumed after the change draws the same noise)."""
    cases = [
        dict(epsilon=eps, delta=delta, max_items=m, horizon=h, base=r, max_count=c)
        for eps in (0.05, 0.5, 1.0, 4.0, 20.0)
        for delta in (1e-12, 1e-6, 1e-3)
        for m, c in ((1, 1), (5, 1), (40, 3))
        for h, r in ((8, 2), (1000, 4), (10**6, 7))
    ]

    def run() -> list[tuple[int, int]]:
        return [tuple(map(_bits, unknown.calibrate_unknown_domain(**kw))) for kw in cases]

    ours = run()
    monkeypatch.setattr(unknown, "bounded_minimum", _scipy_minimum)
    theirs = run()
    assert len(ours) == 135 and ours == theirs


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="above the upper bound"):
        bounded_minimum(abs, 1.0, 0.0)
    with pytest.raises(ValueError, match="finite"):
        bounded_minimum(abs, 0.0, math.inf)


def test_nan_values_end_unconverged_as_scipys() -> None:
    """A function that is NaN everywhere (reported unconverged), or past a point: SciPy's
    point, value, evaluations and verdict."""
    for f in (lambda x: math.nan, lambda x: x * x if x < 0.5 else math.nan):
        ours = bounded_minimum(f, 0.0, 1.0)
        theirs = _scipy_minimum(f, 0.0, 1.0)
        assert _same(ours, theirs), (ours, theirs)
    assert not bounded_minimum(lambda x: math.nan, 0.0, 1.0).converged


def test_an_unknown_domain_plan_leaves_scipy_optimize_unloaded() -> None:
    """Calibrating UnkBase (``plan -m unknown``) no longer loads ``scipy.optimize``'s
    ~300 modules; the probe sees SciPy itself, so it can tell."""
    argv = ["plan", "-m", "unknown", "--horizon", "1000", "--max-items", "5"]
    status, loaded = loaded_after([*argv, "--epsilon", "1", "--delta", "1e-6"],
                                  ("scipy", "scipy.optimize"))  # fmt: skip
    assert status in (0, None) and loaded == ["scipy"]
