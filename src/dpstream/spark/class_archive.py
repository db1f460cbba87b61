"""Keep the classes Spark's driver JVM loads in an archive, so later runs start faster.

Layer 6 of dpstream (an edge); see docs/architecture.md.

A Spark driver JVM loads and verifies some ten thousand classes as it starts and
as it runs its first jobs: on two cores, about half of the wall time of a short
``dpstream run --engine spark``. The JVM can write the classes it loaded to a
file when it exits (application class-data sharing, ``-XX:ArchiveClassesAtExit``,
Java 13 and later) and map that file when it starts again
(``-XX:SharedArchiveFile``), which skips the loading and verifying.

* The first Spark run of a Spark install writes the archive: its JVM saves
  its classes as it exits (100-170 MB, ten to twenty seconds once), and the
  command waits for it (:func:`finish`). Every later run maps it.
* The archive is named after what the JVM checks it against (the ``java``
  binary and ``libjvm.so``, Spark's jars, ``SPARK_HOME``: :func:`setup_key`),
  so another install writes its own. The JVM also checks the archive's header
  against itself and its class path and ignores, silently, an archive that
  does not match (extra jars, other options).
* Writing is the delicate part: the JVM refuses to start, or prints its errors
  on the command's output, when it is asked to write an archive under options
  it cannot write one with (an agent, ``-Xshare:off``, a Spark configuration
  directory on its class path). So an archive is written only when nothing but
  dpstream sets the driver JVM's options (no ``JAVA_TOOL_OPTIONS``,
  ``JDK_JAVA_OPTIONS``, ``_JAVA_OPTIONS``, ``SPARK_SUBMIT_OPTS``,
  ``PYSPARK_SUBMIT_ARGS``), and none is used when Spark's configuration
  directory holds files. A JVM that still fails to start while writing is
  started again without the archive, and a failed write is remembered
  (``spark-<key>.failed``) so that later runs do not try again.
* A damaged archive must never stop a run. The JVM crashes (SIGBUS) on an
  archive cut short, so an archive is kept only when the JVM exited normally
  and logged that it wrote the whole file, and its name carries its size,
  which each use checks. Region checksums (``-XX:+VerifySharedSpaces``) make
  the JVM ignore one whose bytes changed.
* The JVM maps the archive's classes as its own code, so an archive is used
  only from a directory of this user's that no one else can write, whose
  every parent directory belongs to this user or root and is writable by no
  one else (or is sticky, as ``/tmp``), and only when the archive is this
  user's file that no one else can write.
* The JVM's notes about the archive (which classes it could not keep, an
  archive it ignored) are turned off: they would go to the command's output.

``DPSTREAM_SPARK_CLASS_ARCHIVE`` chooses the directory (default
``$XDG_CACHE_HOME/dpstream/spark``, else ``~/.cache/dpstream/spark``); ``off``
turns the archive off. It needs PySpark 4 or later (which needs Java 17), a
driver this command starts itself (not under ``spark-submit`` or Spark
Connect), and a directory path of letters, digits and ``._/+-`` only.
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

from .output import process_alive

__all__ = ["ClassArchive", "ENV", "finish", "give_up", "prepare", "setup_key", "spark_conf_dir"]

#: The environment variable that places the archive (a directory) or turns it off.
ENV = "DPSTREAM_SPARK_CLASS_ARCHIVE"

_OFF = {"off", "0", "no", "false", "none"}

#: The JVM's notes about the archive go nowhere (see the module doc).
_QUIET = "-Xlog:cds*=off -Xlog:class+path*=off"

#: The line the JVM logs once it has written the whole archive (JDK 13 and later).
_WRITTEN = "Written dynamic archive"

#: Options another party gives the driver JVM: an archive is not written under them.
_OTHERS_OPTIONS = (
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "_JAVA_OPTIONS",
    "SPARK_SUBMIT_OPTS",
    "PYSPARK_SUBMIT_ARGS",
)

#: A driver this command does not start (``spark-submit``, Spark Connect).
_NOT_OUR_DRIVER = ("PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")

#: A partial archive (or its log) whose run has ended and that has not changed for this
#: long is left over from a run stopped while its JVM wrote it (a JVM writes one in
#: seconds, and the file grows while it does); past a day, whatever its process id says.
_STALE_PART_S = 600.0
_DEAD_PART_S = 86400.0

#: An archive unused for this long belongs to an install that is gone; a failed write
#: is tried again after it.
_UNUSED_S = 30 * 86400.0

#: Paths go into the JVM's option string, which the launcher splits on spaces and
#: ``-Xlog`` splits on colons: other paths get no archive (rather than quoting).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/+\-]*")

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
    """The archives' directory (absolute, links resolved), or None when
    ``DPSTREAM_SPARK_CLASS_ARCHIVE`` is off or the path is not plain."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        if chosen.strip().lower() in _OFF:
            return None
        path = os.path.expanduser(chosen)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(cache, "dpstream", "spark")
    if not os.path.isabs(path):  # "~" with no home: not the working directory
        return None
    path = os.path.realpath(path)
    return Path(path) if _PLAIN_PATH.fullmatch(path) else None


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


def _safe_parents(path: Path) -> bool:
    """Whether every directory above ``path`` belongs to this user or root and no one
    else can write it, or is sticky (as ``/tmp``): no one else can swap ``path``."""
    for parent in path.parents:
        try:
            st = os.lstat(parent)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.getuid()):
            return False
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return False
    return True


def _java() -> Path | None:
    """The ``java`` that Spark's launcher runs (``$JAVA_HOME/bin/java``, else the
    ``PATH``'s), its links resolved."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found else None


def _spark_home() -> Path:
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


def spark_conf_dir() -> Path:
    """Spark's configuration directory as its launcher finds it: ``SPARK_CONF_DIR``,
    else ``conf`` in ``SPARK_HOME``, which PySpark sets to its own package when it is
    unset. The launcher reads ``spark-defaults.conf`` there and puts the directory
    first on the driver's class path."""
    chosen = os.environ.get("SPARK_CONF_DIR")
    return Path(chosen) if chosen else _spark_home() / "conf"


def _conf_dir_has_files() -> bool:
    """Whether :func:`spark_conf_dir` holds anything: the JVM writes no archive with a
    directory that holds files on its class path, and ignores one for such a class
    path."""
    try:
        with os.scandir(spark_conf_dir()) as entries:
            return next(entries, None) is not None
    except NotADirectoryError:
        return True
    except OSError:
        return False


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
    ``libjvm.so``, and Spark's home and jars, which decide the JVM and its class path.
    Another install gets another archive."""
    import pyspark

    java = _java()
    parts = [pyspark.__version__, _stamp(java)]
    if java is not None:
        parts.append(_stamp(java.parent.parent / "lib" / "server" / "libjvm.so"))
    home = _spark_home()
    parts.append(str(home))
    try:
        parts += sorted(_stamp(p) for p in (home / "jars").iterdir())
    except OSError:
        parts.append("jars:missing")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _kept(directory: Path, key: str) -> Path | None:
    """This install's archive, when it is whole (its size the one in its name) and
    private; an archive of ours whose size is wrong is deleted."""
    for path in sorted(directory.glob(f"spark-{key}-*.jsa")):
        size = path.name[len(f"spark-{key}-") : -len(".jsa")]
        if not size.isdigit() or not _private(path, stat.S_IFREG):
            continue
        if os.lstat(path).st_size != int(size):
            path.unlink(missing_ok=True)
            continue
        return path
    return None


_PART = re.compile(r"spark-[0-9a-f]{16}\.(\d+)-[0-9a-f]{8}\.part(\.log)?")


def _tidy(directory: Path) -> None:
    """Delete partial archives of runs that stopped while their JVM wrote one, and
    archives no run has used (and failed writes not retried) for :data:`_UNUSED_S`."""
    now = time.time()
    for path in directory.iterdir():
        name = path.name
        if not name.startswith("spark-") or not _private(path, stat.S_IFREG):
            continue
        age = now - os.lstat(path).st_mtime
        part = _PART.fullmatch(name)
        if part is not None:
            gone = not process_alive(int(part.group(1)))
            stale = age > _DEAD_PART_S or (age > _STALE_PART_S and gone)
        else:
            stale = name.endswith((".jsa", ".failed")) and age > _UNUSED_S
        if stale:
            path.unlink(missing_ok=True)


def _pyspark_major() -> int:
    import pyspark

    head = pyspark.__version__.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _usable_directory() -> Path | None:
    """The archives' directory, created (``0700``) if missing, when it may be used."""
    directory = _directory()
    if directory is None or not _safe_parents(directory):
        return None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if not _private(directory, stat.S_IFDIR) or not _safe_parents(directory):
        return None
    return directory


def prepare() -> ClassArchive | None:
    """The driver JVM's use of the class archive for the run about to start: map this
    install's archive if there is one, else write it as the JVM exits when it can (see
    the module doc). None when the archive is off or cannot be used here."""
    if any(os.environ.get(name) for name in _NOT_OUR_DRIVER):
        return None
    if _pyspark_major() < 4 or _conf_dir_has_files():
        return None
    directory = _usable_directory()
    if directory is None:
        return None
    key = setup_key()
    try:
        _tidy(directory)
        kept = _kept(directory, key)
        if kept is not None:
            os.utime(kept)  # in use: not tidied away
            options = f"-XX:SharedArchiveFile={kept} -XX:+VerifySharedSpaces {_QUIET}"
            return ClassArchive(options, directory, key)
        if (directory / f"spark-{key}.failed").exists():
            return None
    except OSError:
        return None
    if any(os.environ.get(name) for name in _OTHERS_OPTIONS):
        return None
    part = directory / f"spark-{key}.{os.getpid()}-{secrets.token_hex(4)}.part"
    log = Path(f"{part}.log")
    try:  # the JVM must be able to open its log, or it does not start
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        return None
    options = (
        f"-XX:ArchiveClassesAtExit={part} -XX:+VerifySharedSpaces {_QUIET} "
        f"-Xlog:cds+dynamic=info:file={log}::filecount=0"
    )
    _log.info(
        "Spark: this first run of this Spark install also saves the classes its JVM "
        f"loads (100-170 MB, in {directory}) as it exits, so that later runs start "
        f"faster; it takes 10-20 s once. {ENV}=off turns this off."
    )
    return ClassArchive(options, directory, key, saving=part, log=log)


def give_up(archive: ClassArchive) -> None:
    """Remember that this install's JVM could not write the archive (later runs do not
    try again for :data:`_UNUSED_S`), and delete what the attempt left."""
    try:
        (archive.directory / f"spark-{archive.key}.failed").touch(mode=0o600)
    except OSError:
        pass
    _discard(archive)


def _discard(archive: ClassArchive) -> None:
    """Delete the partial archive and its log, if any."""
    for path in (archive.saving, archive.log):
        if path is not None:
            path.unlink(missing_ok=True)


def _written(log: Path) -> bool:
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            return any(_WRITTEN in line for line in f)
    except OSError:
        return False


def finish(
    archive: ClassArchive, jvm: subprocess.Popen | None, timeout_s: float = 600.0
) -> Path | None:
    """At the command's end: stop the driver JVM, let it write the archive, and keep the
    archive when it is whole. Returns the archive kept, or None.

    ``jvm`` is the driver JVM's process (PySpark's gateway; None when it did not
    start). Closing its input makes it exit, writing the archive on its way out. The
    archive is kept (read-only, with its size in its name, after an fsync) only when
    the JVM exited with status 0 and logged that it wrote it whole; a JVM that did not
    is remembered (:func:`give_up`). An archive another run kept first is left as
    it is (it may be mapped by a running JVM)."""
    part, log = archive.saving, archive.log
    if part is None or log is None or jvm is None:
        _discard(archive)
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
            give_up(archive)
            return None
        with open(part, "rb") as f:
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        kept = archive.directory / f"spark-{archive.key}-{size}.jsa"
        os.chmod(part, 0o400)
        try:
            os.link(part, kept)  # never over an archive another run kept
        except FileExistsError:
            pass
        return kept
    except OSError:
        return None
    finally:
        _discard(archive)
