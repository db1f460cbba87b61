"""Where ``dpstream run --engine spark`` writes: its output directory, checked before the
run and put in place whole.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command`. The local engine
refuses an output that holds releases unless ``--overwrite`` (or ``--force``), before
it reads a line; the Spark engine does the same, so an existing directory stops the
run before the release ledger records anything (and before the input is read), not at
the end in Spark's ``PATH_ALREADY_EXISTS``.

* :func:`check_output`: an output that exists is refused without ``force``, as soon as
  the session has started (the path resolved by Hadoop's file system, as Spark's
  writer resolves it: a path without a scheme may be on HDFS).
* :func:`write_table`: a local output is written to a hidden directory beside it and
  renamed into place when Spark has committed it, so the path holds either the earlier
  output or the whole new one, never a job's half (a run stopped while writing leaves
  the hidden directory, named for the output, its host and process, which a later run
  on that output deletes once that process is gone, or after a week when it ran on
  another host or in another PID namespace). With ``force`` the earlier output is
  checked again, moved aside and deleted once the new one is in place. A URI is
  written by Spark's own writer (``errorifexists``, or ``overwrite`` with ``force``:
  Spark deletes the earlier output and then writes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import StateError

__all__ = ["OutputPlace", "check_output", "write_table"]

#: What a Spark job writes in its output directory, each a regular file: part files
#: (``part-00000-<uuid>-c000.json``, compressed too), their checksums and the commit
#: markers. ``--overwrite`` replaces only a directory that holds nothing else, so a
#: mistyped ``-o`` never deletes a folder of other files (the key, the ledger, the input).
_SPARK_FILE = re.compile(
    r"^(\.?part-\d{5}[-.][^/]*|_SUCCESS|\._SUCCESS\.crc|_started_\d+|_committed_\d+)$"
)
#: The hidden directories a run writes beside its output:
#: ``.dpstream-<output>-<where>-<pid>-<random>`` (and ``.old``): ``output`` a digest of the
#: output's name (a long name stays short), ``where`` one of the host and PID namespace.
_HIDDEN = re.compile(
    r"^\.dpstream-(?P<name>[0-9a-f]{12})-(?P<where>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}(\.old)?$"
)
#: A hidden directory of another host or PID namespace is deleted after this long.
FOREIGN_AGE_S = 7 * 86400


@dataclass(frozen=True)
class OutputPlace:
    """Where the releases go: ``local``, the output's path on this machine (None: another
    file system, written by Spark's own writer), and ``guarded``, the local paths of the
    run's other files, which ``--overwrite`` must never delete with it."""

    local: str | None
    guarded: tuple[str, ...] = ()


def _refuse(out: str) -> StateError:
    return StateError(
        f"output {out!r} exists: pass --overwrite to replace it (a release already "
        "published from it still counts against the budget), or name a new --output"
    )


def _not_ours(out: str, why: str) -> StateError:
    return StateError(
        f"--output {out!r} {why}: --overwrite replaces only a directory of a Spark run's part "
        "files; name a new --output"
    )


def check_output(
    spark: Any, out: str, force: bool, others: Sequence[tuple[str, str | None]] = ()
) -> OutputPlace:
    """Refuse an output that exists, unless ``force``; with ``force``, refuse one that is
    not a directory of a Spark run's part files (:data:`_SPARK_FILE`) or that holds one
    of ``others`` ((option, path): the input, the key, the ledger, ...). Refuse a local
    output whose directory cannot be made or written (tried: a directory made and
    removed beside it).

    Paths are resolved as Spark resolves them (Hadoop's file system of the session:
    ``out`` relative to the working directory, ``file:/x``, ``hdfs://...``, ``..``
    removed from the text) and, on this machine, also with their links followed.
    Everything here runs before the run reads its input or records anything."""
    fs, qualified = _qualified(spark, out)
    if str(qualified.toUri().getScheme()) != "file":
        if fs.exists(qualified):
            if not force:
                raise _refuse(out)
            if not fs.getFileStatus(qualified).isDirectory():
                raise _not_ours(out, "is a file")
            for status in fs.listStatus(qualified):
                name = str(status.getPath().getName())
                if not status.isFile() or not _SPARK_FILE.match(name):
                    raise _not_ours(out, f"holds {name!r}")
        return OutputPlace(None)
    local = os.path.abspath(str(qualified.toUri().getPath()))
    guarded = tuple(p for _, other in others if other and other != "-"
                    for p in _local_forms(spark, other))  # fmt: skip
    if os.path.lexists(local):
        if not force:
            raise _refuse(out)
        _check_replaceable(out, local, guarded)
    _check_writable(out, local)
    return OutputPlace(local, guarded)


def _qualified(spark: Any, path: str) -> tuple[Any, Any]:
    """Hadoop's file system of ``path`` and the path as Spark resolves it."""
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs, fs.makeQualified(hpath)


def _local_forms(spark: Any, path: str) -> set[str]:
    """The forms of a local path that may name the same file: as Hadoop resolves it (a
    ``file:`` URI, ``..`` removed from the text) and as the operating system does (links
    followed); none for a path on another file system."""
    forms = set()
    try:
        _, qualified = _qualified(spark, path)
        if str(qualified.toUri().getScheme()) == "file":
            text = os.path.abspath(str(qualified.toUri().getPath()))
            forms |= {text, os.path.realpath(text)}
    except Exception:  # not a path Hadoop reads: the operating system's forms only
        pass
    if ":" not in path.split("/", 1)[0]:  # no scheme: the operating system's path too
        forms |= {os.path.abspath(path), os.path.realpath(path)}
    return forms


def _check_replaceable(out: str, local: str, guarded: Sequence[str]) -> None:
    """Refuse to replace ``local`` unless it is a directory of a Spark run's part files
    (regular files) holding none of ``guarded``."""
    if os.path.islink(local) or not os.path.isdir(local):
        raise _not_ours(out, "is not a directory" if not os.path.islink(local) else "is a link")
    for entry in os.scandir(local):
        if not entry.is_file(follow_symlinks=False) or not _SPARK_FILE.match(entry.name):
            raise _not_ours(out, f"holds {entry.name!r}")
    roots = {local, os.path.realpath(local)}
    for where in guarded:
        if any(where == root or where.startswith(root + os.sep) for root in roots):
            raise _not_ours(out, f"holds {where!r}, one of the run's own files")


def _check_writable(out: str, local: str) -> None:
    """Make the output's parent directories and try making a directory of the hidden
    names' length in the last one."""
    parent = os.path.dirname(local)
    try:
        os.makedirs(parent, exist_ok=True)
        probe = _hidden_name(parent, os.path.basename(local)) + ".old"
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        raise StateError(
            f"--output {out!r} cannot be written: {exc.strerror or exc} "
            f"({exc.filename or parent!r})"
        ) from None


def _hidden_name(parent: str, name: str) -> str:
    """A new hidden directory's path for the output ``name`` in ``parent``."""
    where, pid = host_namespace(), os.getpid()
    return os.path.join(
        parent, f".dpstream-{_digest(name, 12)}-{where}-{pid}-{secrets.token_hex(4)}"
    )


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:n]


def host_namespace() -> str:
    """This host and PID namespace, as 8 hex digits (whose pids :func:`_tidy` may test)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return _digest(f"{socket.gethostname()}/{ns}", 8)


def _writer(table: Any, fmt: str, mode: str) -> Any:
    writer = table.write.mode(mode)
    if fmt == "jsonl-long":
        return lambda out: writer.option("ignoreNullFields", False).json(out)
    if fmt == "csv":  # RFC 4180 as the local engine writes it: each item as it is
        w = writer.option("header", True).option("escape", '"')
        w = w.option("ignoreLeadingWhiteSpace", False).option("ignoreTrailingWhiteSpace", False)
        # an item that is the empty string as an empty field, as the local engine's csv
        # module writes it (Spark's default wrote `""`; review 114)
        w = w.option("emptyValue", "")
        return lambda out: w.csv(out)
    return writer.parquet


def write_table(table: Any, fmt: str, out: str, place: OutputPlace, force: bool) -> None:
    """Write ``table`` (the releases) to ``out`` as ``fmt`` part files, where ``place``
    (from :func:`check_output`) says (see the module)."""
    try:
        _write(table, fmt, out, place, force)
    except StateError:
        raise
    except Exception as exc:  # Spark's (a Py4J error): one line, not the JVM's stack
        raise StateError(
            f"could not write the releases to {out!r}: {jvm_cause(exc)}; the release "
            "ledger already records this run, so run it again with --force once the "
            "output can be written"
        ) from None


def jvm_cause(exc: BaseException) -> str:
    """The first line of the deepest cause of a failure in the JVM (Py4J's own first
    line names only the call), else of ``exc``."""
    java = getattr(exc, "java_exception", None)
    text = str(exc)
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            text = str(java.toString())
        except Exception:  # the JVM is gone: what Python has
            pass
    caused = re.findall(r"Caused by: ([^\n]+)", text)
    lines = [caused[-1]] if caused else text.strip().splitlines() or [type(exc).__name__]
    return lines[0].strip()[:300]


def _write(table: Any, fmt: str, out: str, place: OutputPlace, force: bool) -> None:
    if place.local is None:
        _writer(table, fmt, "overwrite" if force else "errorifexists")(out)
        return
    path = place.local
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _tidy(parent, name)
    stem = _hidden_name(parent, name)
    try:
        _writer(table, fmt, "errorifexists")("file://" + stem)
        _put_in_place(stem, path, out, place, force)
    except BaseException:
        shutil.rmtree(stem, ignore_errors=True)
        raise


def _put_in_place(new: str, path: str, out: str, place: OutputPlace, force: bool) -> None:
    """Rename the written directory ``new`` to ``path``; an earlier output there (only
    with ``force``, checked again now) is renamed aside first and deleted after."""
    old = None
    if os.path.lexists(path):
        if not force:  # written since the check: another run's, keep it
            raise _refuse(out)
        _check_replaceable(out, path, place.guarded)  # what is there now
        old = f"{new}.old"
        os.rename(path, old)
    os.rename(new, path)
    _fsync_dir(os.path.dirname(path))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _tidy(parent: str, name: str) -> None:
    """Delete what runs on the output ``name`` that are gone left beside it: a
    half-written output, or an earlier one renamed aside and not yet deleted when its
    run stopped. A directory of another host or PID namespace (whose process this one
    cannot see) only once it is a week old.

    A run stopped between its two renames (the earlier output renamed aside, the new
    one, whole, not yet in its place: ``name`` is missing) is finished first: its new
    output is put in place (review 105: both were deleted), or, were it missing, the
    earlier one is put back."""
    mine = _digest(name, 12)
    gone: list[str] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            m = _HIDDEN.match(entry.name)
            if m is None or m["name"] != mine or not entry.is_dir(follow_symlinks=False):
                continue
            if maker_gone(m["where"], int(m["pid"]), entry.stat(follow_symlinks=False)):
                gone.append(entry.path)
    path = os.path.join(parent, name)
    for aside in (p for p in gone if p.endswith(".old")):
        if os.path.lexists(path):
            break
        new = aside.removesuffix(".old")  # written whole before the earlier was moved
        os.rename(new if new in gone else aside, path)
        _fsync_dir(parent)
    for leftover in gone:
        if os.path.lexists(leftover):
            shutil.rmtree(leftover, ignore_errors=True)


def maker_gone(where: str, pid: int, info: os.stat_result) -> bool:
    """Whether the run that made a folder (named with its :func:`host_namespace` tag
    ``where`` and ``pid``; ``info`` its ``lstat``) is gone: a pid of this host and PID
    namespace that no process has, or a folder of another namespace (whose processes
    this one cannot see) that is :data:`FOREIGN_AGE_S` old."""
    if where == host_namespace():
        return not process_alive(pid)
    return time.time() - info.st_mtime >= FOREIGN_AGE_S


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` of this host and PID namespace exists (one of another
    user counts, as does a pid reused since: a folder it may own is left alone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process: alive
        return True
    return True


def _fsync_dir(path: str) -> None:
    """Make a directory's entries durable (its part files' names, a rename into it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
