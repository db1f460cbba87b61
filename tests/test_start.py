"""The command starts without what it does not use, and the package's names load lazily.

``dpstream --help`` and ``--version`` must not import NumPy, SciPy, pandas, Arrow
or cryptography (seconds of a shared machine's start, issue 31). This is checked on
the modules a fresh interpreter holds after the command, never on its speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import fresh_python

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("numpy", "scipy", "pandas", "pyarrow", "cryptography")

#: Run ``dpstream ARGV`` in this interpreter as ``python -m dpstream`` does, then print
#: (on the real stderr, after the command's own output) which of MODULES it imported.
PROBE = """
import json, runpy, sys
modules = json.loads(sys.argv[2])
sys.argv = ["dpstream", *json.loads(sys.argv[1])]
status = None
try:
    runpy.run_module("dpstream", run_name="__main__")
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "loaded": [m for m in modules if m in sys.modules]}),
      file=sys.__stderr__)
"""


def loaded_after(argv: list[str], modules: tuple[str, ...]) -> tuple[int, list[str]]:
    """Run ``dpstream ARGV`` in a fresh interpreter: its exit status, and which of
    ``modules`` it imported."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(list(modules))],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        check=False,
    )
    last = proc.stderr.strip().splitlines()[-1]
    found = json.loads(last)
    return found["status"], found["loaded"]


def _heavy_after(argv: list[str]) -> tuple[int, list[str]]:
    return loaded_after(argv, HEAVY)


@pytest.mark.parametrize(
    "argv",
    [[], ["--help"], ["--version"], ["run", "--help"], ["plan", "--help"], ["view", "--help"]],
)
def test_help_and_version_import_nothing_heavy(argv):
    status, heavy = _heavy_after(argv)
    assert status in (0, None)
    assert heavy == []


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a command that builds a mechanism imports NumPy and SciPy."""
    argv = ["plan", "-m", "known", "--domain-size", "10", "--horizon", "8", "--max-items", "1"]
    status, heavy = _heavy_after([*argv, "--rho", "1"])
    assert status in (0, None)
    assert "numpy" in heavy and "scipy" in heavy


def test_every_public_name_loads_and_is_the_defining_modules():
    import importlib

    import dpstream

    for name in dpstream.__all__:
        value = getattr(dpstream, name)
        where = dpstream._WHERE[name]
        module = importlib.import_module(where, "dpstream")
        assert value is (module if where == f".{name}" else getattr(module, name))
        assert name in dir(dpstream)
    assert sorted(dpstream.__all__) == sorted(dpstream._WHERE)
    assert dpstream.bounding is importlib.import_module("dpstream.bounding")  # any submodule
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = dpstream.no_such_name


def test_from_import_works_in_a_fresh_interpreter():
    code = (
        "import sys; from dpstream import *; from dpstream import __version__, TreeCounter; "
        "assert 'numpy' in sys.modules; import dpstream; "
        "assert set(dpstream.__all__) <= set(dir(dpstream)); print(TreeCounter.__name__)"
    )
    assert fresh_python(code).stdout.strip() == "TreeCounter"


def test_view_names_load_lazily():
    import dpstream.view as view
    from dpstream.view.model import ViewModel
    from dpstream.view.server import ViewServer

    assert view.ViewModel is ViewModel
    assert view.ViewServer is ViewServer
    assert set(view.__all__) <= set(dir(view))


def test_the_views_z95_is_the_plans():
    """The view states the 95% quantile itself (it imports no mechanism): the same number."""
    from statistics import NormalDist

    from dpstream.planning import Z95
    from dpstream.view.model import Z95 as VIEW_Z95

    assert VIEW_Z95 == Z95
    assert abs(Z95 - NormalDist().inv_cdf(0.975)) < 1e-15
