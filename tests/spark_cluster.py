"""A real Spark standalone cluster on loopback, started from the PySpark pip package.

Test and benchmark infrastructure (no pytest here): tests/test_spark_cluster.py and
bench/bench_spark_cluster.py start one master and N workers with ``pyspark/bin/spark-class``
(the pip package has no ``sbin/start-master.sh``), on 127.0.0.1 with ports chosen by
the JVMs themselves (``--port 0``, ``--webui-port 0``: no race for a free port; the
ports are read back from the master's log). All logs, work and scratch directories
live under one directory given by the caller.

No stray JVMs: each daemon runs under ``timeout`` (a ceiling on its life, so a killed
pytest cannot leave a cluster behind for long) in a session of its own, and
:meth:`StandaloneCluster.stop` signals each whole process group (the worker's
executors and their Python daemons are in it), TERM first, KILL after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Ceiling on a daemon's life (seconds): ``timeout`` kills its process group after it.
MAX_LIFE_S = 1800

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def spark_class() -> Path:
    """``spark-class`` of the installed PySpark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


class ClusterError(RuntimeError):
    """The cluster did not come up (the message names the log to read)."""


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores each, on 127.0.0.1.

    ``env`` is the daemons' environment (executors inherit it; Spark adds the
    ``SPARK_*`` directories below). ``stop()`` must be called (or use ``with``).
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.root = Path(root)
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.timeout_s = timeout_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.worker_dirs = [self.root / f"worker{i}" for i in range(workers)]
        self.master_url = ""
        self.webui = ""
        self.env = {
            **(os.environ if env is None else env),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_CONF_DIR": str(self.root / "daemon-conf"),
        }
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        conf = self.root / "daemon-conf"
        conf.mkdir(exist_ok=True)
        # no REST submission server: it would take the fixed port 6066
        (conf / "spark-defaults.conf").write_text("spark.master.rest.enabled false\n")

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self, name: str, args: list[str]) -> Path:
        log = self.root / "logs" / f"{name}.log"
        with open(log, "wb") as fh:
            self.procs.append(
                subprocess.Popen(
                    ["timeout", "-k", "10", str(MAX_LIFE_S), str(spark_class()), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.root,
                    start_new_session=True,
                )
            )
        return log

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once all workers are ALIVE."""
        try:
            log = self._spawn(
                "master",
                ["org.apache.spark.deploy.master.Master"]
                + ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            )
            self._wait_for_master(log)
            for i, wdir in enumerate(self.worker_dirs):
                wdir.mkdir(parents=True, exist_ok=True)
                self._spawn(
                    f"worker{i}",
                    ["org.apache.spark.deploy.worker.Worker", self.master_url]
                    + ["--host", "127.0.0.1", "--cores", str(self.cores)]
                    + ["--memory", self.memory, "--webui-port", "0", "--work-dir", str(wdir)],
                )
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _deadline_check(self, deadline: float, what: str, log: Path) -> None:
        dead = [p.args for p in self.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            why = "a daemon exited" if dead else f"not within {self.timeout_s:.0f} s"
            raise ClusterError(f"Spark standalone cluster: {what} ({why}); {log}:\n{tail}")

    def _wait_for_master(self, log: Path) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            url, ui = _MASTER_URL.search(text), _MASTER_UI.search(text)
            if url and ui and "I have been elected leader" in text:
                self.master_url = url.group(1)
                self.webui = f"http://127.0.0.1:{ui.group(1)}"
                return
            self._deadline_check(deadline, "the master did not start", log)
            time.sleep(0.2)

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                alive = self.alive_workers()
            except OSError:
                alive = -1
            if alive == self.n_workers:
                return
            self._deadline_check(
                deadline,
                f"{max(alive, 0)} of {self.n_workers} workers registered",
                self.root / "logs" / "worker0.log",
            )
            time.sleep(0.2)

    def stop(self, grace_s: float = 20.0) -> None:
        """Signal every daemon's process group (TERM, then KILL what is left) and return
        once the groups are empty: the daemons, their executors and Python workers."""
        groups = [p.pid for p in self.procs]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                for p in self.procs:
                    p.poll()  # reap the direct children (their groups' leaders)
                if not any(_group_alive(g) for g in groups):
                    return
                time.sleep(0.1)

    def pids(self) -> list[int]:
        """The daemons' session ids (their process group ids)."""
        return [p.pid for p in self.procs]

    # ------------------------------------------------------------------ queries

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, running and completed applications)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=10) as resp:
            return json.loads(resp.read().decode("utf-8"))  # type: ignore[no-any-return]

    def alive_workers(self) -> int:
        return sum(1 for w in self.state()["workers"] if w["state"] == "ALIVE")

    def executors_of(self, app_id: str) -> dict[int, list[str]]:
        """Worker index -> the executor ids that worker launched for ``app_id``."""
        return {
            i: sorted(p.name for p in (wdir / app_id).iterdir()) if (wdir / app_id).is_dir() else []
            for i, wdir in enumerate(self.worker_dirs)
        }


def driver_conf(conf_dir: Path, event_log: Path, extra: Mapping[str, str] = {}) -> Path:
    """A ``SPARK_CONF_DIR`` for a driver: an uncompressed event log in ``event_log`` (which
    executor ran each task) and every core registered before the first job."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    event_log.mkdir(parents=True, exist_ok=True)
    settings = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        # wait (up to 30 s) for every executor before scheduling: all workers take part
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        **extra,
    }
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in settings.items())
    )
    return conf_dir


def tasks_per_executor(event_log: Path) -> tuple[str, dict[str, int]]:
    """(application id, finished tasks per executor id) from one application's event log."""
    logs = [p for p in event_log.iterdir() if p.name.startswith(("eventlog_v2_", "app-"))]
    if len(logs) != 1:
        raise AssertionError(f"expected one application's event log in {event_log}: {logs}")
    files = sorted(logs[0].glob("events_*")) if logs[0].is_dir() else [logs[0]]
    app_id, tasks = "", {}
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerApplicationStart":
                app_id = event["App ID"]
            elif event["Event"] == "SparkListenerTaskEnd":
                ex = event["Task Info"]["Executor ID"]
                tasks[ex] = tasks.get(ex, 0) + 1
    return app_id, tasks
