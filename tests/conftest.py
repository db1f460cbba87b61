"""Shared test helpers: fixed keys (tests are deterministic) and statistical tolerances."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpstream import NoiseKey

#: Number of standard errors a statistical test allows. For a statistic that is
#: (approximately) normal, |Z| > 5 happens with probability 5.7e-7 under the
#: null, so an honest implementation fails it about once in two million runs,
#: while any error of a few percent in a scale shows up at the sample sizes used.
Z_TOL = 5.0


#: the package's sources, for a fresh interpreter that must import this checkout
SRC_DIR = str(Path(__file__).resolve().parents[1] / "src")


def fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout (checked: status 0)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC_DIR},
        check=True,
    )


def fixed_key(label: str) -> NoiseKey:
    """A deterministic key for tests (never do this for a release)."""
    return NoiseKey.from_bytes(hashlib.sha256(b"dpstream-test:" + label.encode()).digest())


#: CI sets it: a Spark test that cannot run (no PySpark, pandas or Java) fails instead of
#: skipping.
SPARK_REQUIRED = os.environ.get("DPSTREAM_REQUIRE_SPARK") == "1"


def require_spark(*, pandas: bool = False) -> str:
    """At a Spark test module's top: skip the module without PySpark (and pandas, when
    asked) or a Java runtime, or fail under ``DPSTREAM_REQUIRE_SPARK=1`` (CI). Returns
    the ``java`` that Spark's launcher runs (``$JAVA_HOME/bin/java``, else the
    ``PATH``'s)."""
    import shutil
    from pathlib import Path

    try:
        import pyspark  # noqa: F401

        if pandas:
            import pandas as pd  # noqa: F401
    except ImportError:
        if SPARK_REQUIRED:
            raise
        pytest.skip("PySpark is not installed (pip install -e '.[spark]')", allow_module_level=True)
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home, "bin", "java")) if home else shutil.which("java")
    if java is None or not Path(java).exists():
        if SPARK_REQUIRED:
            raise RuntimeError("DPSTREAM_REQUIRE_SPARK=1 but no Java runtime is on PATH")
        pytest.skip("no Java runtime (java not on PATH, JAVA_HOME unset): Spark cannot start",
                    allow_module_level=True)  # fmt: skip
    return java


@pytest.fixture(autouse=True, scope="session")
def _spark_class_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' Spark runs keep the driver JVM's class archive
    (``dpstream.spark.class_archive``) in a directory of this test session's, not in
    the user's cache: the first run that starts a JVM writes it, later runs map it."""
    name = "DPSTREAM_SPARK_CLASS_ARCHIVE"
    if name in os.environ:
        yield
        return
    os.environ[name] = str(tmp_path_factory.mktemp("spark-class-archive"))
    yield
    os.environ.pop(name, None)


@pytest.fixture(autouse=True, scope="module")
def _module_key_registry() -> Iterator[None]:
    """No key registry (``dpstream.ledger_registry``) for the runs of a module's
    module-scoped fixtures (autouse: set before them); never the user's. See
    :func:`_key_registry`."""
    name, before = "DPSTREAM_KEY_REGISTRY", os.environ.get("DPSTREAM_KEY_REGISTRY")
    os.environ[name] = "off"
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


@pytest.fixture(autouse=True)
def _key_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key registry is off in tests, never the user's: its rule, one ledger a key,
    rightly refuses what many tests do on purpose (a reference run of the same key and
    settings over neighbouring input, with a ledger of its own: :func:`own_ledger`), as
    an operator does with ``DPSTREAM_KEY_REGISTRY=off``. The registry's own tests, and
    the normal runs they check it lets through, take :func:`key_registry`."""
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", "off")


@pytest.fixture
def key_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """A key registry of the test's own (a folder): its runs record their keys' ledgers."""
    folder = str(tmp_path_factory.mktemp("key-registry"))
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", folder)
    return folder


@pytest.fixture
def key() -> NoiseKey:
    return fixed_key("default")


def own_ledger(output: object) -> list[str]:
    """``--ledger`` beside ``output``: a run a test compares with another run of the same
    key and settings (neighbouring inputs, daily runs against one run, a crash against
    an uninterrupted run) keeps its own release ledger. One ledger would rightly refuse
    the second run: the same noise on other data publishes the difference."""
    return ["--ledger", f"{output}.ledger"]


#: UnkBase as the command-line tests run it: two items an event, rho = 1, and the delta
#: of its discovery threshold.
UNKNOWN_CLI = ["-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta", "1e-3"]


def run_unknown(key: object, src: object, out: object, *more: str) -> int:
    """``dpstream run -q`` of :data:`UNKNOWN_CLI` over ``src`` into ``out`` with ``key``
    (a path) and a ledger of its own (:func:`own_ledger`), then ``more``: the exit status."""
    from dpstream.cli import main

    return main(
        [
            "run",
            "-q",
            *UNKNOWN_CLI,
            "--key-file",
            str(key),
            "-i",
            str(src),
            "-o",
            str(out),
            *own_ledger(out),
            *more,
        ]
    )


def run_on_clock(key: object, src: object, out: object, start: str, step: str, *more: str) -> int:
    """:func:`run_unknown` of events timestamped in their ``ts`` field, on the clock of
    ``--start start --step step``, written as CSV (with each step's dates)."""
    return run_unknown(
        key, src, out, "--output-format", "csv", "--time-field", "ts", "--step", step,
        "--start", start, *more,
    )  # fmt: skip


def day_event_lines(
    day: int, *, steps_per_day: int, words: list[str], events_per_step: tuple[int, int], seed: int
) -> list[str]:
    """JSON Lines events of one "day" of a daily stream: each step of the day gets a
    random number of events (``events_per_step`` as [low, high)) of 1 or 2 of ``words``.
    Simulated test data from a seeded generator, never a release."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed + day)
    lines = []
    for t in range((day - 1) * steps_per_day + 1, day * steps_per_day + 1):
        for _ in range(int(rng.integers(*events_per_step))):
            items = rng.choice(words, size=int(rng.integers(1, 3)), replace=False)
            lines.append(json.dumps({"t": t, "items": items.tolist()}) + "\n")
    return lines


def assert_spark_csv_matches(local_csv: object, spark_dir: object) -> None:
    """The Spark engine's CSV part files in ``spark_dir`` hold the rows of the local
    engine's ``local_csv`` (sorted by step and item), and some step released an item."""
    from pathlib import Path

    import pandas as pd

    want = pd.read_csv(str(local_csv)).sort_values(["t", "item"]).reset_index(drop=True)
    have = (
        pd.concat(pd.read_csv(p) for p in sorted(Path(str(spark_dir)).glob("*.csv")))
        .sort_values(["t", "item"])
        .reset_index(drop=True)
    )
    assert want["item"].notna().any()
    pd.testing.assert_frame_equal(have, want, check_dtype=False)


#: A run's exit code and peak resident memory (MB), printed by a fresh process. The peak
#: of that process's own memory (VmHWM), not ``ru_maxrss``: Linux keeps ``ru_maxrss``
#: across ``exec``, so a child of the test process would start at the test process's
#: own peak.
_PEAK = """
import sys
from dpstream.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as fh:
    peak = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
print(code, peak // 1024)
"""


def run_peak(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, int, str]:
    """``dpstream`` with ``argv`` in a fresh process: its exit code, its peak resident
    memory in MB and its stderr (the test is skipped where Linux's /proc is not)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak of a process's memory is read from Linux's /proc")
    env = {**os.environ, "DPSTREAM_KEY_REGISTRY": "off", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv], env=env, capture_output=True, text=True
    )
    code, peak = map(int, done.stdout.split())
    return code, peak, done.stderr


def with_option(argv: list[str], flag: str, *value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (a flag without a value when none): its
    earlier value replaced, as the command line refuses an option given twice."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 1 + len(value)
            continue
        out.append(argv[i])
        i += 1
    return [*out, flag, *value]
