"""Keep the classes Spark's driver JVM loads in an archive, so later runs start faster.

Layer 6 of dpstream (an edge); see docs/architecture.md.

A Spark driver JVM loads and verifies some ten thousand classes as it starts and
as it runs its first jobs: on two cores, about half of the wall time of a short
``dpstream run --engine spark``. The JVM can write the classes it loaded to a
file when it exits (application class-data sharing, ``-XX:ArchiveClassesAtExit``,
Java 13 and later) and map that file when it starts again
(``-XX:SharedArchiveFile``), which skips the loading and verifying.

* The first Spark run of a Spark install writes the archive: its JVM saves
  its classes as it exits (about 160 MB, ten to twenty seconds once), and the
  command waits for it (:func:`finish`). Every later run maps it.
* The archive is named after what the JVM checks it against (the ``java``
  binary, Spark's jars, the operator's Spark settings: :func:`setup_key`), so
  another install writes its own. The JVM also checks the archive's header
  against itself and its class path and ignores an archive that does not
  match.
* A damaged archive must never stop a run. The JVM crashes (SIGBUS) on an
  archive cut short, so an archive is kept only when the JVM exited normally
  and logged that it wrote the whole file, and its name carries its size,
  which each use checks. Region checksums (``-XX:+VerifySharedSpaces``) make
  the JVM ignore one whose bytes changed.
* The JVM maps the archive's classes as its own code, so an archive is used
  only from a directory of this user's that no one else can write, and only
  when it is this user's file that no one else can write (as ``ssh`` treats
  its keys).
* The JVM's notes about the archive (which classes it could not keep, an
  archive it ignored) are turned off: they would go to the command's output.

``DPSTREAM_SPARK_CLASS_ARCHIVE`` chooses the directory (default
``$XDG_CACHE_HOME/dpstream/spark``, else ``~/.cache/dpstream/spark``); ``off``
turns the archive off. It needs PySpark 4 or later (which needs Java 17).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClassArchive", "ENV", "finish", "prepare", "setup_key"]

#: The environment variable that places the archive (a directory) or turns it off.
ENV = "DPSTREAM_SPARK_CLASS_ARCHIVE"

_OFF = {"off", "0", "no", "false", "none"}

#: The JVM's notes about the archive go nowhere (see the module doc).
_QUIET = "-Xlog:cds*=off -Xlog:class+path*=off"

#: The line the JVM logs once it has written the whole archive (JDK 13 and later).
_WRITTEN = "Written dynamic archive"

#: A partial archive (or its log) whose run has ended and that has not changed for this
#: long is left over from a run stopped while its JVM wrote it (a JVM writes one in
#: seconds, and the file grows while it does).
_STALE_PART_S = 600.0

#: An archive unused for this long belongs to an install that is gone.
_UNUSED_S = 30 * 86400.0

#: Paths go into the JVM's option string, which the launcher splits on spaces and
#: ``-Xlog`` splits on colons: other paths get no archive (rather than quoting).
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+\-]+")

_log = logging.getLogger("dpstream.spark")


@dataclass(frozen=True)
class ClassArchive:
    """What the driver JVM of a run does with the class archive.

    Attributes:
        java_options: options for the driver JVM's command line.
        directory: where archives are kept.
        key: :func:`setup_key` of this install.
        saving: the partial archive the JVM writes as it exits (None when it maps one);
            :func:`finish` checks it and keeps it.
        log: the JVM's log of the writing (None when it maps one).
    """

    java_options: str
    directory: Path
    key: str
    saving: Path | None = None
    log: Path | None = None


def _directory() -> Path | None:
    """The archives' directory, or None when ``DPSTREAM_SPARK_CLASS_ARCHIVE`` is off."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        if chosen.strip().lower() in _OFF or not chosen.strip():
            return None
        return Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "dpstream" / "spark"


def _private(path: Path, kind: int) -> bool:
    """Whether ``path`` is this user's file of ``kind`` (stat.S_IFDIR or S_IFREG) that
    no one else can write, not through a symbolic link."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_IFMT(st.st_mode) == kind
        and st.st_uid == os.getuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _java() -> Path | None:
    """The ``java`` that Spark's launcher runs (``$JAVA_HOME/bin/java``, else the
    ``PATH``'s), its links resolved."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found else None


def _spark_jars() -> Path:
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _spark_conf_file() -> Path | None:
    home = os.environ.get("SPARK_HOME")
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (os.path.join(home, "conf") if home else None)
    return Path(conf_dir) / "spark-defaults.conf" if conf_dir else None


def _stamp(path: Path | None) -> str:
    """A file's identity for the key: its path, size and modification time."""
    if path is None:
        return "-"
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def setup_key() -> str:
    """What an archive is valid for, as 16 hex digits: the ``java`` binary and its
    ``libjvm.so``, Spark's jars, and the operator's Spark settings (``SPARK_HOME``,
    ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``), which decide the JVM and its
    class path. Another install gets another archive."""
    import pyspark

    java = _java()
    parts = [pyspark.__version__, _stamp(java)]
    if java is not None:
        parts.append(_stamp(java.parent.parent / "lib" / "server" / "libjvm.so"))
    jars = _spark_jars()
    try:
        parts += sorted(_stamp(p) for p in jars.iterdir())
    except OSError:
        parts.append(f"{jars}:missing")
    conf = _spark_conf_file()
    try:
        parts.append(conf.read_text(errors="replace") if conf else "-")
    except OSError:
        parts.append("-")
    parts += [os.environ.get("SPARK_HOME", "-"), os.environ.get("PYSPARK_SUBMIT_ARGS", "-")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _kept(directory: Path, key: str) -> Path | None:
    """This install's archive, when it is whole (its size the one in its name) and
    private; an archive whose size is wrong is deleted."""
    for path in sorted(directory.glob(f"spark-{key}-*.jsa")):
        size = path.name[len(f"spark-{key}-") : -len(".jsa")]
        if not size.isdigit() or not _private(path, stat.S_IFREG):
            continue
        if os.lstat(path).st_size != int(size):
            path.unlink(missing_ok=True)
            continue
        return path
    return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


_PART = re.compile(r"spark-[0-9a-f]{16}\.(\d+)-[0-9a-f]{8}\.part(\.log)?")


def _tidy(directory: Path) -> None:
    """Delete partial archives of runs that stopped while their JVM wrote one, and
    archives no run has used for :data:`_UNUSED_S` (an install that is gone)."""
    now = time.time()
    for path in directory.iterdir():
        name = path.name
        if not name.startswith("spark-") or not _private(path, stat.S_IFREG):
            continue
        age = now - os.lstat(path).st_mtime
        part = _PART.fullmatch(name)
        if part is not None:
            stale = age > _STALE_PART_S and not _running(int(part.group(1)))
        else:
            stale = name.endswith(".jsa") and age > _UNUSED_S
        if stale:
            path.unlink(missing_ok=True)


def _pyspark_major() -> int:
    import pyspark

    head = pyspark.__version__.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def prepare() -> ClassArchive | None:
    """The driver JVM's use of the class archive for the run about to start: map this
    install's archive if there is one, else write it as the JVM exits. None when the
    archive is off, PySpark is older than 4, or the directory is not private to this
    user (see the module doc)."""
    directory = _directory()
    if directory is None or _pyspark_major() < 4:
        return None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    directory = Path(os.path.abspath(directory))
    if not _private(directory, stat.S_IFDIR) or not _PLAIN_PATH.fullmatch(str(directory)):
        return None
    key = setup_key()
    try:
        _tidy(directory)
        kept = _kept(directory, key)
        if kept is not None:
            os.utime(kept)  # in use: not tidied away
            options = f"-XX:SharedArchiveFile={kept} -XX:+VerifySharedSpaces {_QUIET}"
            return ClassArchive(options, directory, key)
    except OSError:
        return None
    part = directory / f"spark-{key}.{os.getpid()}-{secrets.token_hex(4)}.part"
    log = Path(f"{part}.log")
    options = (
        f"-XX:ArchiveClassesAtExit={part} -XX:+VerifySharedSpaces {_QUIET} "
        f"-Xlog:cds+dynamic=info:file={log}"
    )
    _log.info(
        "Spark: this first run of this Spark install also saves the classes its JVM "
        f"loads (about 160 MB, in {directory}) as it exits, so that later runs start "
        f"faster; it takes 10-20 s once. {ENV}=off turns this off."
    )
    return ClassArchive(options, directory, key, saving=part, log=log)


def _written(log: Path) -> bool:
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            return any(_WRITTEN in line for line in f)
    except OSError:
        return False


def finish(archive: ClassArchive, jvm: subprocess.Popen, timeout_s: float = 600.0) -> Path | None:
    """At the command's end: stop the driver JVM, let it write the archive, and keep the
    archive when it is whole. Returns the archive kept, or None.

    ``jvm`` is the driver JVM's process (PySpark's gateway). Closing its input makes it
    exit, writing the archive on its way out. The archive is kept (read-only, renamed
    with its size in its name, after an fsync) only when the JVM exited with status 0
    and logged that it wrote it whole; else it is deleted."""
    part, log = archive.saving, archive.log
    if part is None or log is None:
        return None
    try:
        if jvm.stdin is not None:
            jvm.stdin.close()
        try:
            status = jvm.wait(timeout_s)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait()
            return None
        except KeyboardInterrupt:  # the JVM goes on writing; a later run tidies its file
            return None
        if status != 0 or not _written(log) or not _private(part, stat.S_IFREG):
            return None
        with open(part, "rb") as f:
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        kept = archive.directory / f"spark-{archive.key}-{size}.jsa"
        os.chmod(part, 0o400)
        os.replace(part, kept)
        for other in archive.directory.glob(f"spark-{archive.key}-*.jsa"):
            if other != kept:
                other.unlink(missing_ok=True)
        return kept
    except OSError:
        return None
    finally:
        part.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
