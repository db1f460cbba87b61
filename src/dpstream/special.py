"""The normal distribution's functions from SciPy, without ``scipy.special``'s package.

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream.

The keyed Gaussian noise (``ndtri``, the inverse of the normal CDF), UnkBase's
and SparseGumb's thresholds (``ndtr``) and the (epsilon, delta) conversions
(``log_ndtr``) need three of SciPy's compiled functions, and their exact bits
matter: they fix tau and every noise value, so a resumed stream must get the
same doubles. Importing ``scipy.special`` for them loads its package of ~240
modules (an array-API layer, docstring parsers, ``importlib.metadata``): about
17 MB of every command's resident memory and 0.1 s of its start. This module
imports only the extension modules that hold the three functions
(``scipy/special/_ufuncs``, ``_special_ufuncs`` and what they import, and
``cython_special``, whose capsule hands ``ndtri`` to dpstream's C loops) and
returns those very ufunc objects: ``scipy.special.ndtri is ndtri`` once the
package is imported too. When the package is already imported, or anything
goes wrong, it imports the package as before (which takes any of those modules
already loaded).

The extension modules are put in ``sys.modules`` under their own names, as
the package's import would put them (a compiled module cannot be initialised
twice), and the package's name is held by a bare placeholder only while they
load, under the import system's lock on that name, so that another thread's
``import scipy.special`` waits and then loads the real package, which takes
the extension modules already loaded. One difference remains: those modules
are not attributes of the package imported after (``scipy.special.cython_special``
after ``import scipy.special.cython_special`` is missing); ``from scipy.special
import cython_special`` and ``sys.modules`` find them.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from typing import Any

_PACKAGE = "scipy.special"


def _from_package() -> dict[str, Any]:
    import scipy.special as package
    from scipy.special import cython_special

    return {
        "ndtr": package.ndtr,
        "log_ndtr": package.log_ndtr,
        "ndtri": package.ndtri,
        "cython_special": cython_special,
    }


def _module_lock(name: str) -> Any:
    """The import system's lock on ``name`` (held while a module of that name loads)."""
    bootstrap: Any = importlib._bootstrap  # type: ignore[attr-defined]
    return bootstrap._ModuleLockManager(name)


def _without_package() -> dict[str, Any] | None:
    """The functions from the extension modules alone, or None (then: the package)."""
    import scipy

    folder = [p + "/special" for p in scipy.__path__]
    with _module_lock(_PACKAGE):
        if _PACKAGE in sys.modules:  # imported meanwhile: use it
            return None
        spec = importlib.machinery.ModuleSpec(_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = folder
        # "being initialised": another thread's import of the name then waits on the
        # module lock held here; it may still hold the placeholder after (CPython's
        # import reads sys.modules before it waits), so the placeholder hands its
        # attributes on to the real package once the window is closed
        spec._initializing = True  # type: ignore[attr-defined]
        placeholder = importlib.util.module_from_spec(spec)
        window = {"open": True}

        def forward(name: str) -> Any:
            if window["open"]:  # the extension modules' own imports: no such name
                raise AttributeError(name)
            return getattr(importlib.import_module(_PACKAGE), name)

        placeholder.__getattr__ = forward  # type: ignore[method-assign]
        sys.modules[_PACKAGE] = placeholder
        try:
            ufuncs = importlib.import_module(_PACKAGE + "._ufuncs")
            special_ufuncs = importlib.import_module(_PACKAGE + "._special_ufuncs")
            found = {
                "ndtr": special_ufuncs.ndtr,
                "log_ndtr": special_ufuncs.log_ndtr,
                "ndtri": ufuncs.ndtri,
                "cython_special": importlib.import_module(_PACKAGE + ".cython_special"),
            }
        except Exception:
            # what loaded stays in sys.modules (the package's own modules, from its
            # own files: a compiled one cannot load twice), and the package loads
            return None
        finally:
            sys.modules.pop(_PACKAGE, None)
            window["open"] = False
    return found


def _try_without_package() -> dict[str, Any] | None:
    try:
        return _without_package()
    except Exception:  # pragma: no cover - a private import API that changed
        return None


def _functions() -> dict[str, Any]:
    found = None if _PACKAGE in sys.modules else _try_without_package()
    return found if found is not None else _from_package()


_found = _functions()

#: the standard normal CDF: ``scipy.special.ndtr`` itself (a NumPy ufunc)
ndtr: Any = _found["ndtr"]
#: the log of the standard normal CDF: ``scipy.special.log_ndtr`` itself
log_ndtr: Any = _found["log_ndtr"]
#: the inverse of the standard normal CDF: ``scipy.special.ndtri`` itself
ndtri: Any = _found["ndtri"]
#: ``scipy.special.cython_special``: its ``__pyx_capi__`` holds ``ndtri``'s C function
cython_special: Any = _found["cython_special"]
del _found
