"""Start the Spark session of ``dpstream run --engine spark`` with Python workers that run dpstream.

Layer 6 of dpstream (an edge); see docs/architecture.md.

Spark starts its Python workers with ``PYSPARK_PYTHON``, or else the first
``python3`` on the ``PATH``. A cron job that calls a virtual environment's
``dpstream`` without activating it therefore gets workers from the system's
interpreter, which has no dpstream: every task fails with
``ModuleNotFoundError`` deep inside a Java stack trace.

* For a local master (``local``, ``local[N]``, ``local-cluster[...]``) the
  workers run on this machine, so they use the driver's own interpreter
  (``spark.pyspark.python``), unless the operator set one.
* On a local master, Spark's scratch files (shuffle blocks that hold true counts and
  user ids, PySpark's broadcast files that hold the key) go to a folder of the run's
  own, mode 0700, under ``TMPDIR`` (:func:`private_local_dir`), unless the operator
  sets ``spark.local.dir`` or ``SPARK_LOCAL_DIRS``. Spark's own default is the JVM's
  ``/tmp`` with folders others may read, whatever ``TMPDIR`` says, and a killed run
  left them there for good (review 105); the next run removes such a folder of a
  process that is gone.
* For any master, one small job (one task per core on a local master, whose
  workers the run reuses) checks before anything is read that a worker
  imports the same dpstream version as the driver (the keyed noise is
  computed in the workers: another version could draw other noise than the
  local engine) and says what to set when it does not.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..errors import DPStreamError
from . import class_archive

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["WorkerPythonError", "check_workers", "is_local_master", "start_session"]


class WorkerPythonError(DPStreamError):
    """Spark's Python workers cannot run this dpstream."""


def is_local_master(master: str) -> bool:
    """True when every Spark worker of ``master`` runs on this machine."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


#: The driver JVM's default options on a local master, where that one JVM also runs
#: the tasks: the client JIT compiler only. A run is short and its Python workers do
#: most of the work; the optimizing compiler's threads compete with them for the
#: cores while the JVM warms up (measured 15-25% of a run's wall time on 2 cores).
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
_JAVA_KEY = "spark.driver.defaultJavaOptions"


def _operator_sets(key: str) -> bool:
    """Whether the operator gives ``key`` to Spark (``spark-defaults.conf`` in Spark's
    configuration directory, :func:`class_archive.spark_conf_dir`, or
    ``PYSPARK_SUBMIT_ARGS``): then dpstream leaves it as it is."""
    if key in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    try:
        with open(class_archive.spark_conf_dir() / "spark-defaults.conf", encoding="utf-8") as f:
            return any(re.split(r"[\s=:]", line.strip(), maxsplit=1)[0] == key for line in f)
    except OSError:
        return False


#: The Spark UI: off for a command's session (one run, no one watching it), which
#: spares its web server and listeners (under a second of a short run, measured).
_UI_KEY = "spark.ui.enabled"


#: Whether cached frames are compressed. A run caches the partial counts of its
#: (step, item) pairs and its releases, each read once or twice and then dropped; on
#: a local master, where the same cores parse the input, compressing them cost more
#: than it saved: 1.5-1.9 s of a 2 x 10^6-event run's 5.7-6.1 s counting job (the
#: job took 4.3 s with the cache uncompressed, as long as with no cache at all).
_CACHE_COMPRESSION_KEY = "spark.sql.inMemoryColumnarStorage.compressed"


def session_defaults(master: str) -> dict[str, str]:
    """The settings dpstream gives the session it starts on ``master``: no progress bar,
    no UI, and on a local master the driver JVM's :data:`LOCAL_JAVA_OPTIONS` and
    uncompressed caches (:data:`_CACHE_COMPRESSION_KEY`); all but the first only when
    the operator does not set them (:func:`_operator_sets`)."""
    conf = {"spark.ui.showConsoleProgress": "false"}
    if not _operator_sets(_UI_KEY):
        conf[_UI_KEY] = "false"
    if is_local_master(master) and not _operator_sets(_JAVA_KEY):
        conf[_JAVA_KEY] = LOCAL_JAVA_OPTIONS
    if is_local_master(master) and not _operator_sets(_CACHE_COMPRESSION_KEY):
        conf[_CACHE_COMPRESSION_KEY] = "false"
    return conf


#: Where Spark keeps its scratch files (shuffle blocks, PySpark's broadcasts).
_LOCAL_DIR_KEY = "spark.local.dir"
#: The driver JVM's options after its defaults (the operator's, when set).
_EXTRA_JAVA_KEY = "spark.driver.extraJavaOptions"
#: The name of a run's own scratch folder under ``TMPDIR``: this prefix, the pid, "-".
LOCAL_DIR_PREFIX = "dpstream-spark-"


def private_local_dir() -> str:
    """A new folder for Spark's scratch files, mode 0700 under ``TMPDIR``, removed when
    the process exits; first removes such folders this user's dead processes left (a
    run killed with SIGKILL, or by the kernel for memory, runs no exit handler)."""
    from .output import host_namespace

    base = tempfile.gettempdir()
    tidy_local_dirs(base)
    prefix = f"{LOCAL_DIR_PREFIX}{host_namespace()}-{os.getpid()}-"
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    atexit.register(shutil.rmtree, path, True)  # (before the session: runs after its stop)
    return path


def tidy_local_dirs(base: str) -> list[str]:
    """Remove the scratch folders (:func:`private_local_dir`) in ``base`` that this user's
    processes made and that are gone; returns their paths. A folder of a live process,
    of another user, or that is a link is left as it is; one of another host or PID
    namespace (a container sharing ``TMPDIR``, whose processes this one cannot see)
    only once it is a week old."""
    from .output import maker_gone

    gone: list[str] = []
    pattern = re.compile(re.escape(LOCAL_DIR_PREFIX) + r"([0-9a-f]{8})-([0-9]+)-[A-Za-z0-9_]+")
    try:
        entries = list(os.scandir(base))
    except OSError:
        return gone
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if not maker_gone(match.group(1), int(match.group(2)), info):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        gone.append(entry.path)
    return gone


#: The master URLs Spark takes (its SparkContext's forms).
_MASTER = re.compile(
    r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]"
    r"|spark://[^/\s]+|yarn|k8s://\S+"
)


def check_master(master: str) -> None:
    """Refuse (ValueError, one line) what would stop a JVM's start with a page of Java's
    words (review 114: a master nobody listens on took 66 s and 132 lines of a stack,
    ending in "Cannot call methods on a stopped SparkContext"; a misspelt master and a
    missing Java both ended in "Java gateway process exited"): no Java, a master that
    is no Spark master URL, YARN without its configuration, a standalone master that
    no host of its URL answers on."""
    import socket

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if (not java or not os.access(java, os.X_OK)) and not _spark_env_sets_java():
        where = (
            f"JAVA_HOME={java_home!r} has no bin/java"
            if java_home
            else ("no `java` on the PATH, and JAVA_HOME is not set")
        )
        raise ValueError(
            f"--engine spark needs Java 17 or later: {where}; install a JDK (Debian: "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )
    if not _MASTER.fullmatch(master):
        raise ValueError(
            f"--master {master!r} is no Spark master URL: local, local[N], local[*], "
            "spark://HOST:PORT, yarn or k8s://HOST:PORT"
        )
    if master == "yarn" and not (
        os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")
    ):
        raise ValueError(
            "--master yarn needs HADOOP_CONF_DIR (or YARN_CONF_DIR): the folder of the "
            "cluster's configuration files"
        )
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        addresses = []
        for host in hosts:
            name, _, port = host.rpartition(":")
            if not port.isdigit() or not name:
                raise ValueError(f"--master {master!r}: {host!r} is not HOST:PORT")
            addresses.append((name.strip("[]"), int(port)))
        for address in addresses:
            try:
                socket.create_connection(address, timeout=5).close()
                return
            except OSError:
                continue
        raise ValueError(
            f"--master {master!r}: no Spark master answers there (nothing listening on "
            f"{', '.join(hosts)}): start the master, or check its URL"
        )


def _spark_env_sets_java() -> bool:
    """Whether Spark's ``spark-env.sh`` (in ``SPARK_CONF_DIR``, else the install's
    ``conf``) sets ``JAVA_HOME``, as Spark's launch scripts let it (review 116: such a
    Java was refused)."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    for folder in (os.environ.get("SPARK_CONF_DIR"), os.path.join(home, "conf")):
        if not folder:
            continue
        try:
            with open(os.path.join(folder, "spark-env.sh"), encoding="utf-8") as fh:
                if "JAVA_HOME" in fh.read(1 << 16):
                    return True
        except (OSError, UnicodeDecodeError):
            continue
    return False


def start_session(master: str, app_name: str = "dpstream run") -> SparkSession:
    """A session on ``master`` whose Python workers are checked to run this dpstream,
    with :func:`session_defaults`.

    When it starts the driver JVM, the JVM maps the class archive of this Spark
    install, or writes it as it exits (:mod:`dpstream.spark.class_archive`; the
    process then waits for it at exit). A JVM that fails to start while asked to
    write the archive is started again without it."""
    from pyspark import SparkContext

    if SparkContext._gateway is None:  # a JVM to start: what would stop it, in words
        check_master(master)
    conf = session_defaults(master)
    if (
        is_local_master(master)
        and not _operator_sets(_LOCAL_DIR_KEY)
        and not os.environ.get("SPARK_LOCAL_DIRS")
    ):
        scratch = private_local_dir()
        if (
            SparkContext._gateway is None  # a JVM to start: its temporary folder too
            and not _operator_sets(_EXTRA_JAVA_KEY)
            and re.fullmatch(r"[\w./+=@,-]+", scratch)  # one word in the JVM's options
        ):
            # Spark's own scratch folder defaults to the JVM's, and the JVM's other
            # folders (spark-*, artifacts-*) go there too; spark.local.dir would leave
            # those in /tmp and print a warning that it may be overridden (review 108)
            conf[_EXTRA_JAVA_KEY] = f"-Djava.io.tmpdir={scratch}"
        else:  # the JVM runs already (its folder is set): Spark's scratch files only
            conf[_LOCAL_DIR_KEY] = scratch
    archive = None
    if SparkContext._gateway is None and not _operator_sets(_JAVA_KEY):  # a JVM to start
        archive = class_archive.prepare()
    chosen = os.environ.get("PYSPARK_PYTHON")
    with _jvm_stderr_logged():
        spark = _started(master, app_name, conf, chosen, archive)
    check_workers(spark, master, chosen)
    return spark


def _started(
    master: str,
    app_name: str,
    conf: dict[str, str],
    chosen: str | None,
    archive: class_archive.ClassArchive | None,
) -> SparkSession:
    """The session of :func:`start_session`, its JVM given the class archive's options
    (started again without them if it fails to start with them)."""
    if archive is None:
        spark = _get_or_create(master, app_name, conf, chosen)
    else:
        options = f"{conf.get(_JAVA_KEY, '')} {archive.java_options}".strip()
        if archive.saving is not None:
            # registered first: a run stopped while its JVM starts still tidies up
            atexit.register(_save_class_archive, archive)
        try:
            spark = _get_or_create(master, app_name, {**conf, _JAVA_KEY: options}, chosen)
        except Exception:
            if archive.saving is None:
                raise
            class_archive.give_up(archive)  # the options it cannot write an archive under
            atexit.unregister(_save_class_archive)
            spark = _get_or_create(master, app_name, conf, chosen)
    return spark


_jvm_log = logging.getLogger("dpstream.spark.jvm")
#: A log4j line's level (Spark's default layout: ``yy/MM/dd HH:mm:ss LEVEL Class: ...``).
_JVM_LEVEL = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
#: JVM levels as the command's log levels: Spark's warnings (a loopback host name, no
#: native Hadoop library) are information to a dpstream operator; its errors warnings.
_LEVELS = {"ERROR": logging.WARNING, "FATAL": logging.WARNING, "WARN": logging.INFO}


class _JvmLines:
    """The JVM's stderr lines that are not log4j's, held while the JVM starts: said as
    warnings when it fails to start (review 116: "Invalid maximum heap size: -Xmx1q",
    a Java too old, "Failed to find Spark jars" were never shown), at debug level
    otherwise (the launcher's notes of every start)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starting = True
        self.held: list[str] = []

    def take(self, line: str) -> None:
        with self.lock:
            if self.starting:
                self.held.append(line)
                return
        _jvm_log.debug(f"Spark: {line}")

    def started(self) -> list[str]:
        """The lines held while the JVM started; from now on lines go to debug."""
        with self.lock:
            self.starting, held, self.held = False, self.held, []
        return held


def _log_jvm_lines(fd: int, lines: _JvmLines) -> None:
    """The reader of the JVM's stderr: each line to the ``dpstream.spark.jvm`` logger (so
    ``--log-format json`` gives JSON and ``--quiet`` keeps warnings only; review 114:
    log4j's and the launcher's lines went to stderr as they were). It reads until the
    JVM closes it, whatever a line holds, so the JVM never blocks on a full pipe."""
    with open(fd, "rb", buffering=0, closefd=True) as pipe:
        for raw in iter(pipe.readline, b""):
            try:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.strip():
                    continue
                found = _JVM_LEVEL.match(line)
                if found is None:
                    lines.take(line)
                    continue
                _jvm_log.log(_LEVELS.get(found.group(1), logging.DEBUG), f"Spark: {line}")
            except Exception:  # noqa: BLE001 - a line that cannot be logged is dropped
                continue


@contextlib.contextmanager
def _jvm_stderr_logged() -> Iterator[None]:
    """While a session starts: a JVM launched then writes its stderr to a pipe that
    :func:`_log_jvm_lines` reads (PySpark's ``launch_gateway`` takes Popen's arguments;
    ours are given through the name its context module calls), not to this process's
    stderr, which stays the command's own."""
    from pyspark import SparkContext

    module = sys.modules[SparkContext.__module__]
    launch = getattr(module, "launch_gateway", None)
    if launch is None:  # another PySpark: its JVM writes to stderr as before
        yield
        return

    failed: list[str] = []  # the last words of a JVM that failed to start

    def launch_logged(conf: Any = None, popen_kwargs: Any = None) -> Any:
        read, write = os.pipe()  # one per JVM (a failed start is tried again)
        lines = _JvmLines()
        reader = threading.Thread(
            target=_log_jvm_lines, args=(read, lines), name="dpstream-jvm-stderr", daemon=True
        )
        reader.start()
        kwargs = dict(popen_kwargs or {})
        kwargs.setdefault("stderr", write)
        try:
            gateway = launch(conf, kwargs)
        except BaseException:
            os.close(write)  # the JVM is gone: its last words are read to their end
            reader.join(timeout=5)
            failed[:] = lines.started()
            raise
        os.close(write)  # the JVM holds its own end: the reader ends when the JVM does
        for line in lines.started():
            _jvm_log.debug(f"Spark: {line}")
        return gateway

    module.launch_gateway = launch_logged  # type: ignore[attr-defined]
    try:
        yield
    except BaseException:  # the session did not start: why, in the JVM's words
        for line in failed:
            _jvm_log.warning(f"Spark: {line}")
        raise
    else:  # (a start tried again without the class archive's options, and started)
        for line in failed:
            _jvm_log.debug(f"Spark: {line}")
    finally:
        module.launch_gateway = launch  # type: ignore[attr-defined]


def _get_or_create(
    master: str, app_name: str, conf: dict[str, str], chosen: str | None
) -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not is_local_master(master) or chosen:
        return builder.getOrCreate()
    # PySpark reads the workers' interpreter from the environment when its context
    # starts (not from spark.pyspark.python): set it for that moment only
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        return builder.getOrCreate()
    finally:
        del os.environ["PYSPARK_PYTHON"]


def _save_class_archive(archive: class_archive.ClassArchive) -> None:
    """At exit: stop the session, then let its JVM write the class archive (or delete
    what a JVM that never started left)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    jvm = getattr(SparkContext._gateway, "proc", None)
    if context is not None:
        try:
            context.stop()
        except Exception:  # a broken session still lets its JVM exit and write
            pass
    class_archive.finish(archive, jvm)


def _worker_version(_: Any) -> tuple[str, str]:
    """Run in a worker: the dpstream version it imports and its interpreter.

    It imports what the run's tasks import too (NumPy, pandas, PyArrow): a worker
    that has dpstream but not these (``import dpstream`` loads them lazily) fails
    here, with one line, rather than in the middle of the run."""
    import sys as worker_sys

    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    import dpstream

    return dpstream.__version__, worker_sys.executable


def _worker_versions(batches: Iterator[Any]) -> Iterator[Any]:
    """Run in a worker as an Arrow map (``mapInArrow``): :func:`_worker_version` as a
    one-row batch."""
    version, python = _worker_version(None)
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"version": [version], "python": [python]})


def _warm_tasks(spark: SparkSession, master: str) -> int:
    """How many tasks the check runs: one per core on a local master (each starts a
    worker the run's tasks then reuse), one elsewhere."""
    if not is_local_master(master):
        return 1
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return 1


def check_workers(spark: SparkSession, master: str, chosen: str | None = None) -> None:
    """Raise :class:`WorkerPythonError` unless a worker imports this dpstream version.

    A worker that cannot import dpstream (or NumPy, pandas, PyArrow) fails, and a
    worker with another version is refused, before the run reads its input.
    ``chosen`` is the operator's ``PYSPARK_PYTHON``, if any (for the advice).

    The check is an Arrow map, as the run's own Python stages are: Spark keeps
    those workers (their imports done) for the run's tasks, where a plain RDD
    map would start workers of another kind. On a local master it runs one task
    per core, so that every worker the run uses is started (and checked) here.
    """
    from dpstream import __version__

    tasks = _warm_tasks(spark, master)
    try:
        got = (
            spark.range(0, tasks, 1, tasks)
            .mapInArrow(_worker_versions, "version string, python string")
            .collect()
        )
    except Exception as exc:  # Py4JJavaError or PythonException: both carry the cause as text
        raise WorkerPythonError(_advice(master, _plain_cause(spark, exc), chosen)) from None
    for version, python in got:
        if version == __version__:
            continue
        raise WorkerPythonError(
            _advice(
                master,
                f"its Python workers ({python}) import dpstream {version}, "
                f"the driver runs dpstream {__version__}",
                chosen,
            )
        )


def _plain_cause(spark: SparkSession, exc: BaseException) -> str:
    """Why the check failed, worded from a plain one-task map when it fails too: PySpark
    imports PyArrow for an Arrow map before the check's own imports run, and the first
    module a worker lacks is the one to name."""
    try:
        spark.sparkContext.parallelize([0], 1).map(_worker_version).collect()
    except Exception as plain:
        return _cause(plain)
    return _cause(exc)


def _cause(exc: BaseException) -> str:
    text = str(exc)
    if "No module named 'dpstream'" in text or 'No module named "dpstream"' in text:
        return "its Python workers cannot import dpstream"
    last = [line.strip() for line in text.splitlines() if line.strip()]
    detail = last[-1][:200] if last else type(exc).__name__
    return f"a test task failed in its Python workers ({detail})"


def _advice(master: str, cause: str, chosen: str | None) -> str:
    if is_local_master(master) and chosen:
        where = (
            f"PYSPARK_PYTHON={chosen} has no dpstream {_version()}: unset it (the "
            f"driver's own interpreter is then used) or point it to {sys.executable}"
        )
    elif is_local_master(master):
        where = f"the driver's interpreter is {sys.executable}"
    else:
        where = (
            f"install dpstream {_version()} with its spark extra on every worker and set "
            "PYSPARK_PYTHON, in this command's environment, to that interpreter's path; "
            "see docs/spark.md"
        )
    return f"Spark master {master}: {cause}. {where}."


def _version() -> str:
    from dpstream import __version__

    return __version__
