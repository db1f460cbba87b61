"""dpstream.special: SciPy's normal-distribution functions without scipy.special's package.

The functions must be SciPy's very ufuncs (their bits fix tau and every noise value),
the package must still import and work afterwards (a compiled module cannot load
twice), and a failure part-way must fall back to the package.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np

from dpstream import special

from .conftest import fresh_python


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; the JSON it prints last."""
    return json.loads(fresh_python(code).stdout.strip().splitlines()[-1])


def test_the_functions_are_the_normal_distributions():
    """Against independent closed forms from the standard library.

    ``ndtr(x) = erfc(-x / sqrt 2) / 2``: math.erfc is within ~1 ulp, but the
    argument ``x / sqrt 2`` is rounded (relative error <= 2^-53), and erfc's relative
    sensitivity to its argument z is about 2z^2 (d log erfc / dz ~ -2z); so the two
    sides may differ by ~(2 + x^2) * 2^-53 relative: the tolerance is
    4e-16 * (1 + x^2), 1.2e-14 at |x| = 8 (measured: at most 2.7e-16 * (1 + x^2)).
    ``log_ndtr`` is compared where its log is well conditioned (a relative error r of
    the CDF moves the log by r, which is small against |log| >= log 2 for x <= 0);
    for x > 0, against ``log1p(-erfc(x / sqrt 2) / 2)``, absolute. ``ndtri`` against
    ``NormalDist.inv_cdf`` (Wichura's AS241, ~1e-16 relative), whose values are at
    most 4.8 here: 1e-14 absolute. A wrong function (a logistic CDF, a normal of
    another scale) misses each by orders of magnitude."""
    xs = np.linspace(-8.0, 8.0, 161)
    cdf = np.array([0.5 * math.erfc(-x / math.sqrt(2.0)) for x in xs])
    assert np.all(np.abs(special.ndtr(xs) / cdf - 1) <= 4e-16 * (1 + xs**2))
    low = xs <= 0
    assert np.allclose(special.log_ndtr(xs[low]), np.log(cdf[low]), rtol=1e-14, atol=0)
    upper = np.array([math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0))) for x in xs[~low]])
    assert np.allclose(special.log_ndtr(xs[~low]), upper, rtol=1e-13, atol=1e-18)
    ps = np.linspace(1e-6, 1 - 1e-6, 201)
    inverse = np.array([statistics.NormalDist().inv_cdf(p) for p in ps])
    assert np.allclose(special.ndtri(ps), inverse, rtol=0, atol=1e-14)


def test_a_run_leaves_the_package_unloaded_and_it_imports_after():
    """Importing dpstream's noise loads the extension modules, not the package; the
    package then imports, holds the same ufunc objects, and works (scipy.stats too)."""
    got = _python(
        "import sys, json\n"
        "import dpstream.noise, dpstream.special as s\n"
        "before = 'scipy.special' in sys.modules\n"
        "import scipy.special, scipy.stats\n"
        "print(json.dumps({'before': before,\n"
        "  'same': [scipy.special.ndtri is s.ndtri, scipy.special.ndtr is s.ndtr,\n"
        "           scipy.special.log_ndtr is s.log_ndtr,\n"
        "           sys.modules['scipy.special.cython_special'] is s.cython_special],\n"
        "  'ppf': float(scipy.stats.norm.ppf(0.975)), 'erf': float(scipy.special.erf(0.5))}))"
    )
    assert got["before"] is False
    assert got["same"] == [True, True, True, True]
    assert math.isclose(got["ppf"], statistics.NormalDist().inv_cdf(0.975), rel_tol=1e-14)
    assert math.isclose(got["erf"], math.erf(0.5), rel_tol=1e-15)


def test_a_package_imported_first_is_used():
    got = _python(
        "import sys, json\n"
        "import scipy.special\n"
        "import dpstream.special as s\n"
        "print(json.dumps([scipy.special.ndtri is s.ndtri, scipy.special.ndtr is s.ndtr,\n"
        "                  scipy.special.log_ndtr is s.log_ndtr]))"
    )
    assert got == [True, True, True]


def test_a_failure_while_loading_falls_back_to_the_package():
    """``cython_special`` refused while the placeholder holds the package's name: the
    package is imported (taking the modules already loaded) and the functions are its."""
    got = _python(
        "import sys, json, importlib.abc\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    refused = 0\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        pkg = sys.modules.get('scipy.special')\n"
        "        if name == 'scipy.special.cython_special' and pkg is not None \\\n"
        "                and getattr(pkg, '__file__', None) is None:\n"
        "            Refuse.refused += 1\n"
        "            raise ImportError('refused by the test')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import dpstream.special as s\n"
        "import scipy.special\n"
        "print(json.dumps({'refused': Refuse.refused,\n"
        "  'package': getattr(sys.modules['scipy.special'], '__file__', None) is not None,\n"
        "  'same': scipy.special.ndtri is s.ndtri and scipy.special.ndtr is s.ndtr,\n"
        "  'cs': sys.modules['scipy.special.cython_special'] is s.cython_special,\n"
        "  'value': float(s.ndtri(0.5))}))"
    )
    assert got == {"refused": 1, "package": True, "same": True, "cs": True, "value": 0.0}


def test_another_thread_importing_the_package_meanwhile_waits_for_it():
    """Review 88: while the extension modules load under the placeholder, another
    thread's ``from scipy.special import gammaln`` got the bare placeholder (an
    ImportError, or a package without its functions for good). The placeholder is
    marked as initialising, so that thread waits on the import lock and then loads the
    real package. The loading thread holds the window open until the other thread has
    started its import (the test can then only be weaker on a slow machine, never
    wrong: a thread that comes after the window always gets the real package)."""
    got = _python(
        "import sys, json, threading, time, importlib.abc\n"
        "started = threading.Event()\n"
        "class Hold(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'scipy.special._ufuncs' and threading.current_thread().name == 'a':\n"
        "            started.wait(10); time.sleep(0.3)  # the other thread is importing\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hold())\n"
        "import scipy\n"
        "out = {}\n"
        "def a():\n"
        "    import dpstream.special\n"
        "def b():\n"
        "    while 'scipy.special' not in sys.modules:\n"
        "        time.sleep(0.001)\n"
        "    started.set()\n"
        "    try:\n"
        "        from scipy.special import gammaln\n"
        "        out['b'] = float(gammaln(3.0))\n"
        "    except Exception as e:\n"
        "        out['b'] = repr(e)\n"
        "tb = threading.Thread(target=b, name='b'); tb.start()\n"
        "ta = threading.Thread(target=a, name='a'); ta.start()\n"
        "ta.join(); tb.join()\n"
        "real = hasattr(sys.modules['scipy.special'], 'gammaln')\n"
        "print(json.dumps({'b': out['b'], 'real': real}))"
    )
    assert got == {"b": math.log(2.0), "real": True}
