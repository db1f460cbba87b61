"""dpstream.rootfind.brentq: SciPy's Brent root finder without ``scipy.optimize``'s package.

The root's bits fix tau, so the function must give exactly the double that
``scipy.optimize.brentq`` gives (the reference, imported here only) for the same
function, bracket and tolerances; and it must raise where SciPy raises.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq as scipy_brentq

from dpstream import rootfind
from dpstream.privacy import calibration, conversions

from .test_start import loaded_after

SRC = str(Path(__file__).resolve().parents[1] / "src")
EPS4 = 4 * np.finfo(float).eps


def _same(a: float, b: float) -> bool:
    return np.float64(a).view(np.int64) == np.float64(b).view(np.int64)


def test_the_compiled_routine_is_loaded() -> None:
    """On this SciPy the loader finds the C routine (else every test below compares
    SciPy with itself through the fallback)."""
    assert rootfind._zeros() is not None


def test_random_brackets_give_scipys_bits() -> None:
    """Cubics, exponentials and steep logistics with random roots and brackets, at
    the tolerances the package uses."""
    rng = np.random.default_rng(20261127)
    tolerances = [(1e-300, 1e-15), (1e-14, 1e-15), (1e-300, EPS4), (2e-12, EPS4), (1e-6, 1e-9)]
    checked = 0
    for _ in range(400):
        root = float(rng.normal() * 10.0 ** rng.integers(-6, 7))
        width = float(10.0 ** rng.uniform(-3, 3))
        a, b = root - width * rng.uniform(0.01, 1), root + width * rng.uniform(0.01, 1)
        kind = int(rng.integers(3))
        s = float(rng.uniform(0.1, 50))
        if kind == 0:
            f = lambda x, r=root, s=s: (x - r) * ((x - r) ** 2 + s)  # noqa: E731
        elif kind == 1:
            f = lambda x, r=root, s=s, w=width: math.expm1(s * (x - r) / w)  # noqa: E731
        else:
            f = lambda x, r=root, s=s: math.tanh(s * (x - r))  # noqa: E731
        xtol, rtol = tolerances[int(rng.integers(len(tolerances)))]
        maxiter = 500
        ours = rootfind.brentq(f, a, b, xtol=xtol, rtol=rtol, maxiter=maxiter)
        theirs = scipy_brentq(f, a, b, xtol=xtol, rtol=rtol, maxiter=maxiter)
        assert _same(ours, theirs), (kind, root, a, b, xtol, rtol, ours, theirs)
        checked += 1
    assert checked == 400


def test_the_calibration_curves_give_scipys_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package's own inversions, once through the loaded routine and once through
    scipy.optimize.brentq itself (the fallback), give the same doubles."""
    cases = [(eps, delta) for eps in (0.1, 0.5, 1.0, 3.0, 10.0) for delta in (1e-9, 1e-6, 1e-3)]

    def run() -> list[float]:
        out = []
        for eps, delta in cases:
            out.append(calibration.rho_for_epsilon_delta(eps, delta))
            out.append(calibration._mu_for_gaussian.__wrapped__(eps, delta))  # uncached
            out.append(conversions.epsilon_cks(eps / 10.0, delta))
            out.append(conversions.gaussian_epsilon(delta, 1.0 / eps))
        return out

    ours = run()
    monkeypatch.setitem(rootfind._state, "zeros", None)  # the fallback: scipy.optimize
    theirs = run()
    assert [np.float64(x).view(np.int64) for x in ours] == [
        np.float64(x).view(np.int64) for x in theirs
    ]


@pytest.mark.parametrize(
    ("f", "a", "b", "kw", "error"),
    [
        (lambda x: x - 1.0, 2.0, 3.0, {}, ValueError),  # no sign change
        (lambda x: x, -1.0, 1.0, {"xtol": 0.0}, ValueError),
        (lambda x: x, -1.0, 1.0, {"rtol": 1e-17}, ValueError),
        (lambda x: float("nan") if x > 0.1 else -1.0, -1.0, 1.0, {}, ValueError),
        (lambda x: x**3 - 2.0, 0.0, 2.0, {"maxiter": 2}, RuntimeError),
    ],
)
def test_errors_are_scipys(f, a, b, kw, error) -> None:
    with pytest.raises(error):
        scipy_brentq(f, a, b, **kw)
    with pytest.raises(error):
        rootfind.brentq(f, a, b, **kw)


def test_a_known_domain_plan_leaves_scipy_optimize_unloaded() -> None:
    """Calibrating a run (here ``plan -m known`` with an (epsilon, delta) target) no
    longer loads ``scipy.optimize``'s ~300 modules (about 23 MB of a run's memory);
    the probe sees SciPy itself, so it can tell."""
    argv = ["plan", "-m", "known", "--domain-size", "10", "--horizon", "8"]
    status, loaded = loaded_after([*argv, "--max-items", "1", "--epsilon", "1", "--delta", "1e-6"],
                                  ("scipy", "scipy.optimize"))  # fmt: skip
    assert status in (0, None) and loaded == ["scipy"]
