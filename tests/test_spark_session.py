"""`dpstream run --engine spark` from a virtual environment that is not activated (a cron job).

Spark starts its Python workers with ``PYSPARK_PYTHON`` or the first ``python3``
on the ``PATH``. Here the ``PATH`` holds only the base interpreter of this
test's virtual environment, which has no dpstream, as a crontab's ``PATH`` would:
a local master must still run (the workers use the driver's interpreter), and a
worker interpreter without dpstream is refused with a clear message before
anything is written.

Skips as tests/test_spark.py does (no PySpark, no Java); CI sets
``DPSTREAM_REQUIRE_SPARK=1``, which turns a skip into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpstream import cli
from dpstream.spark.session import is_local_master

from .conftest import fixed_key, own_ledger, require_spark

_JAVA = require_spark()

pytestmark = pytest.mark.spark

_BASE_PYTHON = Path(sys.base_prefix, "bin", "python3")


def _cron_env() -> dict[str, str]:
    """The environment of a cron job: no venv on the PATH, no PYSPARK_PYTHON."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")
    }
    java_dir = str(Path(_JAVA).resolve().parent)
    env["PATH"] = os.pathsep.join([str(_BASE_PYTHON.parent), java_dir, "/usr/bin", "/bin"])
    return env


def _base_has_no_dpstream() -> bool:
    probe = subprocess.run(
        [str(_BASE_PYTHON), "-c", "import dpstream"], capture_output=True, env=_cron_env()
    )
    return probe.returncode != 0


@pytest.fixture
def run_args(tmp_path: Path) -> list[str]:
    if sys.prefix == sys.base_prefix or not _BASE_PYTHON.exists():
        pytest.skip("needs a virtual environment whose base interpreter has no dpstream")
    if not _base_has_no_dpstream():
        pytest.skip("the base interpreter imports dpstream: the failure cannot be shown here")
    fixed_key("spark-session").save(tmp_path / "k.key")
    events = [{"t": 1, "items": ["a", "b"]}, {"t": 2, "items": ["b"]}, {"t": 4, "items": ["a"]}]
    (tmp_path / "domain.txt").write_text("a\nb\n")
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return [
        "run",
        "-m",
        "known",
        "--domain",
        str(tmp_path / "domain.txt"),
        "--horizon",
        "4",
        "--max-items",
        "2",
        "--rho",
        "0.5",
        "--key-file",
        str(tmp_path / "k.key"),
        "-i",
        str(tmp_path / "events.jsonl"),
        "-q",
    ]


def _spark_rows(out: Path) -> list[dict]:
    rows = []
    for part in sorted(out.glob("part-*")):
        rows += [json.loads(line) for line in part.read_text().splitlines() if line]
    return rows


def test_local_master_uses_the_driver_interpreter(run_args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "spark_out"
    done = subprocess.run(
        [sys.executable, "-m", "dpstream", *run_args, "--engine", "spark"]
        + ["--master", "local[1]", "-o", str(out), *own_ledger(out)],
        capture_output=True,
        text=True,
        env=_cron_env(),
        timeout=600,
    )
    # before the fix, every task failed: "ModuleNotFoundError: No module named 'dpstream'"
    assert done.returncode == 0, done.stderr[-3000:]
    local = tmp_path / "local.jsonl"
    assert cli.main([*run_args, "-o", str(local), *own_ledger(local)]) == 0
    want = [json.loads(line) for line in local.read_text().splitlines()]
    got = _spark_rows(out)
    assert sorted({r["t"] for r in got}) == [r["t"] for r in want] == [1, 2, 3, 4]
    for rel in want:
        rows = {r["item"]: r["value"] for r in got if r["t"] == rel["t"]}
        assert rows == rel["released"] and set(rows) == {"a", "b"}


def test_worker_without_dpstream_is_refused_before_writing(
    run_args: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "spark_out"
    env = {**_cron_env(), "PYSPARK_PYTHON": str(_BASE_PYTHON)}
    done = subprocess.run(
        [sys.executable, "-m", "dpstream", *run_args, "--engine", "spark"]
        + ["--master", "local[1]", "-o", str(out), *own_ledger(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 1
    assert "Python workers cannot import dpstream" in done.stderr
    assert "PYSPARK_PYTHON" in done.stderr
    # the last word is dpstream's one line (Spark's own log above it is Spark's)
    assert done.stderr.strip().splitlines()[-1].startswith("dpstream: error: Spark master")
    assert not out.exists()
    assert not Path(f"{out}.ledger").exists()  # the check runs before the noise scope


def test_worker_with_dpstream_but_no_pandas_is_refused_in_one_line(
    run_args: list[str], tmp_path: Path
) -> None:
    """A worker interpreter that imports dpstream but not pandas (here the base
    interpreter with dpstream's sources on PYTHONPATH, as ``spark.submit.pyFiles``
    would ship them) is refused by the check, in one line, before anything is written.
    ``import dpstream`` is lazy: the version alone passed, and the run failed later
    with a worker traceback (seen on a standalone cluster)."""
    import dpstream

    src = str(Path(dpstream.__file__).resolve().parents[1])
    env = {**_cron_env(), "PYTHONPATH": src}
    probe = subprocess.run(
        [str(_BASE_PYTHON), "-c", "import dpstream, pandas"],
        capture_output=True,
        text=True,
        env=env,
    )
    if "No module named 'pandas'" not in probe.stderr:
        pytest.skip("the base interpreter imports pandas: the failure cannot be shown here")
    out = tmp_path / "spark_out"
    done = subprocess.run(
        [sys.executable, "-m", "dpstream", *run_args, "--engine", "spark"]
        + ["--master", "local[1]", "-o", str(out), *own_ledger(out)],
        capture_output=True,
        text=True,
        env={**env, "PYSPARK_PYTHON": str(_BASE_PYTHON)},
        timeout=600,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dpstream: error: Spark master local[1]"), done.stderr[-3000:]
    assert "No module named 'pandas'" in last
    assert not out.exists()


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://host:7077", False),
        ("yarn", False),
        ("k8s://https://host:443", False),
        ("localhost", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert is_local_master(master) is local


@pytest.mark.parametrize(
    ("line", "sets"),
    [
        ("spark.driver.defaultJavaOptions -XX:+UseG1GC\n", True),
        ("spark.driver.defaultJavaOptions=-XX:+UseG1GC\n", True),
        ("  spark.driver.defaultJavaOptions:\n", True),
        ("spark.driver.defaultJavaOptionsX -Y\n", False),
        ("# spark.driver.defaultJavaOptions -Y\nspark.ui.enabled false\n", False),
    ],
)
def test_local_java_options_yield_to_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, sets: bool
) -> None:
    """dpstream gives a local master's JVM its own default options only when the
    operator's Spark configuration does not set them."""
    from dpstream.spark.session import _operator_sets

    key = "spark.driver.defaultJavaOptions"
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert not _operator_sets(key)  # no spark-defaults.conf
    (tmp_path / "spark-defaults.conf").write_text(line)
    assert _operator_sets(key) is sets
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--conf {key}=-Xss4m pyspark-shell")
    assert _operator_sets(key)


def test_a_commands_session_has_no_ui_unless_the_operator_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's session runs without the Spark UI (one run, no one watching),
    and keeps the operator's own setting when there is one."""
    from dpstream.spark.session import session_defaults

    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session_defaults("local[2]") == {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    assert session_defaults("yarn") == {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
    }
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.ui.enabled true\nspark.sql.inMemoryColumnarStorage.compressed true\n"
    )
    assert "spark.ui.enabled" not in session_defaults("local[2]")
    assert "spark.sql.inMemoryColumnarStorage.compressed" not in session_defaults("local[2]")


_KILLED_SHUFFLE = """
import glob, os, signal, stat, sys
from dpstream.spark import session
spark = session.start_session("local[1]")
jvm = spark.sparkContext._jvm
local = jvm.org.apache.spark.util.Utils.getLocalDir(spark.sparkContext._jsc.sc().conf())
local = os.path.dirname(local)  # (Spark's own folder is made inside it)
print("jvmtmp", jvm.java.lang.System.getProperty("java.io.tmpdir"))
spark.range(0, 1000, 1, 4).selectExpr("id % 7 AS k").groupBy("k").count().collect()
blocks = glob.glob(os.path.join(local, "**", "blockmgr-*"), recursive=True)
print("local", local, "mode", oct(stat.S_IMODE(os.stat(local).st_mode)))
print("temp", spark.sparkContext._temp_dir)
print("blocks", len(blocks))
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)  # as a kill: no exit handler runs
"""


def test_spark_scratch_files_stay_in_a_private_folder_a_later_run_removes(tmp_path: Path) -> None:
    """Review 105: on a local master Spark kept its shuffle blocks (true counts, user ids)
    in /tmp/blockmgr-* folders others could read, whatever TMPDIR said, and PySpark's
    broadcast of the key in /tmp/spark-*; a SIGKILL left both for good. They now go to
    a folder of the run's own, mode 0700, under TMPDIR; the next start removes the
    folders of processes that are gone, and keeps a live process's or a link."""
    from dpstream.spark.output import FOREIGN_AGE_S, host_namespace
    from dpstream.spark.session import LOCAL_DIR_PREFIX, tidy_local_dirs

    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_DIRS",)}
    env.update(TMPDIR=str(tmp), PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                      env.get("PATH", "")]))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _KILLED_SHUFFLE], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == -9, done.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    local = Path(out["local"].split(" mode ")[0])
    assert local.parent == tmp and local.name.startswith(LOCAL_DIR_PREFIX)
    assert out["local"].endswith("mode 0o700")
    assert Path(out["temp"]).is_relative_to(local)  # PySpark's broadcasts (the key)
    assert Path(out["jvmtmp"]) == local  # the JVM's own folders (spark-*, artifacts-*)
    assert "will be overridden" not in done.stderr  # (spark.local.dir's warning)
    assert int(out["blocks"]) >= 1 and local.is_dir()  # left by the kill
    assert not list(tmp.glob("blockmgr-*")) and not list(tmp.glob("spark-*"))
    here = host_namespace()
    live = tmp / f"{LOCAL_DIR_PREFIX}{here}-{os.getpid()}-live"  # this process: alive
    live.mkdir()
    os.symlink(local, tmp / f"{LOCAL_DIR_PREFIX}{here}-999999999-link")
    # another host or PID namespace (a container sharing TMPDIR): its pids are not ours
    # to test, so its folder goes only once it is a week old
    young, old = (tmp / f"{LOCAL_DIR_PREFIX}0badc0de-{n}-x" for n in (1, 2))
    young.mkdir()
    old.mkdir()
    week_ago = time.time() - FOREIGN_AGE_S - 60
    os.utime(old, (week_ago, week_ago))
    assert sorted(tidy_local_dirs(str(tmp))) == sorted([str(local), str(old)])
    assert not local.exists() and not old.exists() and live.is_dir() and young.is_dir()
    assert (tmp / f"{LOCAL_DIR_PREFIX}{here}-999999999-link").is_symlink()


def test_what_would_stop_the_jvm_is_refused_in_one_line(monkeypatch, tmp_path: Path) -> None:
    """Review 114 (low): a master nobody listens on took a minute and a page of Java's
    stack ("Cannot call methods on a stopped SparkContext"), and a misspelt master or
    no Java ended in "Java gateway process exited". Each is now said before a JVM
    starts; a standalone master that answers passes."""
    import socket

    from dpstream.spark.session import check_master

    check_master("local[2]")
    for bad in ("foo", "localhost", "local[two]", "spark://", "spark://host"):
        with pytest.raises(ValueError, match="no Spark master URL|is not HOST:PORT"):
            check_master(bad)
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    with pytest.raises(ValueError, match="--master yarn needs HADOOP_CONF_DIR"):
        check_master("yarn")
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    closed = socket.create_server(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()  # a port nothing listens on (the kernel refuses a connection at once)
    try:
        with pytest.raises(ValueError, match="no Spark master answers there"):
            check_master(f"spark://127.0.0.1:{free}")
        check_master(f"spark://127.0.0.1:{free},127.0.0.1:{port}")  # one of two answers
    finally:
        listening.close()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match="needs Java 17 or later: no `java` on the PATH"):
        check_master("local[2]")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="has no bin/java"):
        check_master("local[2]")
    # review 116: a Java that Spark's spark-env.sh names is Spark's to find
    monkeypatch.delenv("JAVA_HOME")
    (tmp_path / "spark-env.sh").write_text("export JAVA_HOME=/opt/jdk-17\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    check_master("local[2]")


def test_the_jvms_lines_go_through_the_commands_log(tmp_path: Path) -> None:
    """Review 114 (low): with --log-format json (and --quiet) a Spark run wrote log4j's
    and the launcher's lines to stderr as they were, 8 lines no log collector reads as
    JSON. The JVM's stderr now goes through the command's log: every line is a JSON
    record, Spark's warnings are information (kept out by --quiet), and the run's own
    summary is there."""
    fixed_key("spark-session-log").save(tmp_path / "k.key")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["b"]}\n')
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "dpstream", "run", "-m", "unknown", "-T", "2", "--max-items",
            "1", "--rho", "1", "--threshold-delta", "1e-3", "--key-file", str(tmp_path / "k.key"),
            "-i", str(tmp_path / "ev.jsonl"), "--engine", "spark", "--master", "local[1]",
            "--log-format", "json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    said = {}
    for quiet in (False, True):
        target = out.with_name(f"out-{quiet}")
        done = subprocess.run(
            [*argv, *(["--quiet"] if quiet else []), "-o", str(target), *own_ledger(target)],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        said[quiet] = [json.loads(line) for line in done.stderr.splitlines()]  # each JSON
    assert any("steps (t = 1..2)" in r["message"] for r in said[False])
    assert all(r["level"] in ("warning", "error") for r in said[True])


def test_a_jvm_that_fails_to_start_says_why(tmp_path: Path) -> None:
    """Review 116 (low-medium): once the JVM's stderr went through the command's log, the
    lines of a JVM that failed to start (here "Invalid maximum heap size: -Xmx1q") were
    debug lines, never shown: only "Java gateway process exited" was. They are said as
    warnings when the session does not start."""
    fixed_key("spark-session-jvm").save(tmp_path / "k.key")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n')
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.driver.memory 1q\n")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "SPARK_CONF_DIR": str(conf),
    }
    done = subprocess.run(
        [sys.executable, "-m", "dpstream", "run", "-m", "unknown", "-T", "2", "--max-items",
         "1", "--rho", "1", "--threshold-delta", "1e-3", "--key-file", str(tmp_path / "k.key"),
         "-i", str(tmp_path / "ev.jsonl"), "--engine", "spark", "--master", "local[1]",
         "-o", str(out), *own_ledger(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Spark: Invalid maximum heap size: -Xmx1q" in done.stderr, done.stderr[-2000:]
