"""``dpstream run --engine spark`` on a real standalone cluster: the local engine's values.

One master and two workers are started from the PySpark pip package on 127.0.0.1 for
this module (tests/spark_cluster.py). The real command line runs as a subprocess with
a cron-like environment (no virtual environment on the ``PATH`` of the driver or the
workers; the workers' interpreter named by ``PYSPARK_PYTHON``, as docs/spark.md says
to set on a cluster) on the bundled FAA reports, event level and user level, and must
write, value by value, the long table ``dpstream run --engine local`` writes. The
run's event log and the workers' directories must show that each worker ran an
executor that finished tasks: a run the cluster did not serve fails here. The two
runs go at once (one core of each worker each) to keep the module's time down.

Skips like tests/test_spark.py (no PySpark or no Java), and fails instead when
``DPSTREAM_REQUIRE_SPARK=1``."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from .conftest import SPARK_REQUIRED, fixed_key, own_ledger, require_spark

pytestmark = pytest.mark.spark

_JAVA = require_spark(pandas=True)
if shutil.which("timeout") is None:  # coreutils: the cluster's ceiling on its life
    if SPARK_REQUIRED:
        raise RuntimeError("DPSTREAM_REQUIRE_SPARK=1 but coreutils' timeout is missing")
    pytest.skip("no `timeout` command to bound the cluster's life", allow_module_level=True)

import pandas as pd  # noqa: E402

from .spark_cluster import StandaloneCluster, driver_conf, tasks_per_executor  # noqa: E402

FAA = Path(str(resources.files("dpstream") / "data" / "birdstrikes.jsonl.gz"))
#: The two cluster runs must finish within this (they take ~1-3 min on 2 shared cores).
RUN_TIMEOUT_S = 600


def _minimal_path() -> str:
    """A cron job's PATH: Java and the system's tools, no virtual environment."""
    return os.pathsep.join([str(Path(_JAVA).resolve().parent), "/usr/bin", "/bin"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Two workers of two cores each; each run takes one core of each worker
    (``spark.cores.max=2``, ``spark.executor.cores=1``), so the two runs of this module
    go at once and each has two executor JVMs, one per worker."""
    root = tmp_path_factory.mktemp("spark-cluster")
    drop = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = _minimal_path()  # the workers' `python3` has no dpstream (nor pandas)
    with StandaloneCluster(root, workers=2, cores=2, memory="2g", env=env) as c:
        pgids = c.pids()
        yield c
    # teardown: no daemon of this cluster is left (their process groups are empty)
    assert len(pgids) == 3
    for pgid in pgids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def _cron_env(conf: Path) -> dict[str, str]:
    """A cron job's environment: no venv on the PATH, only what a cluster run must set."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "JAVA_HOME", "DPSTREAM_KEY_REGISTRY")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PATH"] = _minimal_path()
    env["PYSPARK_PYTHON"] = sys.executable  # the workers' interpreter (docs/spark.md)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # executors connect back to the driver here
    env["SPARK_CONF_DIR"] = str(conf)
    return env


def _long_table(path: Path) -> pd.DataFrame:
    files = sorted(path.glob("part-*.csv")) if path.is_dir() else [path]
    assert files, f"no output in {path}"
    # exact floats (round_trip); the empty item of a step that released nothing stays ""
    na = {"value": [""], "noise_std": [""]}
    read = {"keep_default_na": False, "na_values": na, "float_precision": "round_trip"}
    frame = pd.concat(pd.read_csv(p, **read) for p in files)
    return frame.sort_values(["t", "item"]).reset_index(drop=True)


def _faa_args(tmp: Path) -> list[str]:
    """Event level, unknown domain (UnkBase, the BLT): 10,000 FAA reports, 656 weeks."""
    horizon = max(json.loads(line)["t"] for line in gzip.open(FAA, "rt"))
    return ["-m", "unknown", "-T", str(horizon), "--max-items", "2", "--rho", "0.5"] + [
        "--threshold-delta",
        "1e-6",
        "-i",
        str(FAA),
    ]


def _per_airport_args(tmp: Path) -> list[str]:
    """User level, known domain: each airport is a user that reports species."""
    inp, domain = tmp / "per_airport.jsonl", tmp / "species.txt"
    species: set[str] = set()
    with gzip.open(FAA, "rt") as src, open(inp, "w") as dst:
        for line in src:
            obj = json.loads(line)
            airport = next(i for i in obj["items"] if i.startswith("airport:"))
            kind = [i for i in obj["items"] if i.startswith("species:")]
            species.update(kind)
            dst.write(json.dumps({"t": obj["t"], "user": airport, "items": kind}) + "\n")
    domain.write_text("".join(f"{s}\n" for s in sorted(species)))
    horizon = max(json.loads(line)["t"] for line in inp.open())
    return ["-m", "known", "-T", str(horizon), "--domain", str(domain), "--tau", "0.5"] + [
        "--user-field",
        "user",
        "--max-items-per-user",
        "3",
        "--max-count-per-item",
        "2",
        "-i",
        str(inp),
    ]


CASES = {"faa": _faa_args, "per_airport": _per_airport_args}


@pytest.fixture(scope="module")
def runs(cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory):
    """Each case on the cluster (the two at once) and on the local engine: case -> its dir."""
    key = tmp_path_factory.mktemp("key") / "k.key"
    fixed_key("spark-cluster").save(key)
    dirs, spark_runs = {}, {}
    for name, make_args in CASES.items():
        tmp = dirs[name] = tmp_path_factory.mktemp(name)
        argv = [sys.executable, "-m", "dpstream", "run", "-q", "--key-file", str(key)]
        argv += [*make_args(tmp), "--no-round"]
        spark = tmp / "spark_out.csv"
        conf = driver_conf(
            tmp / "conf",
            tmp / "eventlog",
            {
                "spark.cores.max": "2",
                "spark.executor.cores": "1",
                "spark.executor.memory": "768m",
                "spark.sql.shuffle.partitions": "4",
            },
        )
        with open(tmp / "spark.stderr", "w") as err:
            spark_runs[name] = subprocess.Popen(
                [*argv, "--engine", "spark", "--master", cluster.master_url]
                + ["-o", str(spark), *own_ledger(spark)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=_cron_env(conf),
            )
        (tmp / "argv").write_text(json.dumps(argv))
    try:
        for tmp in dirs.values():  # the local engine meanwhile
            local = tmp / "local.csv"
            argv = json.loads((tmp / "argv").read_text())
            done = subprocess.run(
                [*argv, "--engine", "local", "-o", str(local), *own_ledger(local)],
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        deadline = time.monotonic() + RUN_TIMEOUT_S  # for both runs together
        for name, proc in spark_runs.items():
            left = max(1.0, deadline - time.monotonic())
            (dirs[name] / "spark.rc").write_text(str(proc.wait(timeout=left)))
    finally:
        for proc in spark_runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return dirs


@pytest.mark.parametrize("case", list(CASES))
def test_cluster_releases_the_local_engines_values(cluster, runs, case) -> None:
    """FAA reports (event level, UnkBase) and per airport (user level, KnownBase): the
    cluster writes the local engine's long table, value by value, every step included."""
    tmp = runs[case]
    rc = int((tmp / "spark.rc").read_text())
    assert rc == 0, (tmp / "spark.stderr").read_text()[-3000:]
    want, got = _long_table(tmp / "local.csv"), _long_table(tmp / "spark_out.csv")
    assert (want["item"] != "").any()  # something was released
    argv = json.loads((tmp / "argv").read_text())
    horizon = int(argv[argv.index("-T") + 1])
    assert set(want["t"]) == set(range(1, horizon + 1))  # every step, empty ones too
    pd.testing.assert_frame_equal(got, want, check_dtype=False, check_exact=True)


@pytest.mark.parametrize("case", list(CASES))
def test_both_workers_ran_tasks_of_the_run(cluster, runs, case) -> None:
    """The cluster served the run: on each worker, one executor of the run's application
    finished tasks (from the run's event log), and every task ran on those two; nothing
    ran in a driver-side executor, as it would on a local master. (Under load a master
    may launch another executor on a worker as the driver shuts down; it runs no task.)"""
    tmp = runs[case]
    assert int((tmp / "spark.rc").read_text()) == 0
    app_id, tasks = tasks_per_executor(tmp / "eventlog")
    executors = cluster.executors_of(app_id)
    assert cluster.alive_workers() == 2
    assert sorted(executors) == [0, 1]
    ran = {i: [e for e in ids if tasks.get(e, 0) >= 1] for i, ids in executors.items()}
    assert all(len(ids) == 1 for ids in ran.values()), (executors, tasks)
    assert set(tasks) == {ids[0] for ids in ran.values()}, (executors, tasks)
    assert "driver" not in tasks
