"""Brent's root finder, SciPy's compiled routine without ``scipy.optimize``'s package.

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream.

The calibration of every run (``dpstream.privacy``), SparseGumb's threshold and
the BLT factorization invert a monotone function with Brent's method, and the
exact bits of each root matter: they fix tau, and so the noise a resumed stream
draws. ``scipy.optimize.brentq`` gives those bits, but importing
``scipy.optimize`` loads some 300 modules (linear algebra, sparse matrices,
array-API layers): about 23 MB of a batch run's resident memory and 0.2 s of
its start, for one C function. :func:`brentq` loads that function's extension
module (``scipy/optimize/_zeros``, a plain C module that imports nothing) from
its file and calls it with the arguments ``scipy.optimize.brentq`` passes it,
so the root is the same double; when the file is missing or its signature
changed, it falls back to ``scipy.optimize.brentq`` itself. The tests hold the
two equal, bit for bit, on the calibration's curves and on random brackets.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# scipy.optimize.brentq's smallest allowed relative tolerance, 4 machine epsilons
_RTOL_MIN = 4 * 2.220446049250313e-16

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _load_zeros() -> Any:
    """SciPy's ``_zeros`` extension module loaded from its file, or None.

    The module is not put in ``sys.modules``: a later ``import scipy.optimize``
    loads its own copy as usual.
    """
    try:
        import scipy

        folder = Path(scipy.__file__).parent / "optimize"
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = folder / f"_zeros{suffix}"
            if path.is_file():
                break
        else:
            return None
        name = "scipy.optimize._zeros"
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        if spec is None:  # pragma: no cover - a file that is there has a spec
            return None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        # the call scipy.optimize.brentq makes, on a root it must find exactly
        probe = module._brentq(lambda x: x - 0.5, 0.0, 1.0, 1e-12, _RTOL_MIN, 100, (), False, True)
        if probe != 0.5:
            return None  # pragma: no cover - another signature: use the package
        return module
    except Exception:  # pragma: no cover - any failure: the package's brentq
        return None


def _zeros() -> Any:
    with _lock:
        if "zeros" not in _state:
            _state["zeros"] = _load_zeros()
        return _state["zeros"]


def brentq(
    f: Callable[[float], float],
    a: float,
    b: float,
    *,
    xtol: float = 2e-12,
    rtol: float = _RTOL_MIN,
    maxiter: int = 100,
) -> float:
    """A root of ``f`` in ``[a, b]`` by Brent's method, as ``scipy.optimize.brentq``.

    ``f(a)`` and ``f(b)`` must differ in sign. The result is within
    ``xtol + rtol * |root|`` of a root. Raises ValueError for a bad tolerance,
    a bracket without a sign change or a NaN value of ``f``, and RuntimeError
    when ``maxiter`` iterations do not converge (the messages are SciPy's).
    """
    zeros = _zeros()
    if zeros is None:
        from scipy.optimize import brentq as scipy_brentq

        return float(scipy_brentq(f, a, b, xtol=xtol, rtol=rtol, maxiter=maxiter))
    if not xtol > 0:
        raise ValueError(f"xtol too small ({xtol:g} <= 0)")
    if not rtol >= _RTOL_MIN:
        raise ValueError(f"rtol too small ({rtol:g} < {_RTOL_MIN:g})")

    def checked(x: float) -> float:
        fx = f(x)
        if math.isnan(fx):
            raise ValueError(f"The function value at x={x} is NaN; solver cannot continue.")
        return fx

    return float(zeros._brentq(checked, a, b, xtol, rtol, int(maxiter), (), False, True))
