"""Where ``dpstream run --engine spark`` writes: its output directory, checked before the
run and put in place whole.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command`. The local engine
refuses an output that holds releases unless ``--force``, before it reads a line; the
Spark engine does the same, so an existing directory stops the run before the release
ledger records anything (and before the input is read), not at the end in Spark's
``PATH_ALREADY_EXISTS``.

* :func:`check_output`: an output that exists is refused without ``force``, as soon as
  the session has started (the path resolved by Hadoop's file system, as Spark's
  writer resolves it: a path without a scheme may be on HDFS).
* :func:`write_table`: a local output is written to a hidden directory beside it and
  renamed into place when Spark has committed it, so the path holds either the earlier
  output or the whole new one, never a job's half (a run stopped while writing leaves
  the hidden directory, named for its process, which the next run on that output
  deletes once that process is gone). With ``force`` the earlier output is moved aside
  first and deleted once the new one is in place. A URI is written by Spark's own
  writer (``errorifexists``, or ``overwrite`` with ``force``: Spark deletes the earlier
  output and then writes).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Sequence
from typing import Any

from ..errors import StateError

__all__ = ["check_output", "write_table"]

#: The hidden directories a run writes beside its output: ``.<name>.dpstream-<pid>-<hex>``.
_PART = re.compile(r"^\.(?P<name>.+)\.dpstream-(?P<pid>\d+)-[0-9a-f]{8}(?P<old>\.old)?$")


#: What a Spark job writes in its output directory: part files, their checksums, the
#: commit markers and a half-written job's ``_temporary``. ``--force`` replaces only a
#: directory that holds nothing else, so a mistyped ``-o`` never deletes a folder of
#: other files (the key, the ledger, the input).
_SPARK_ENTRY = re.compile(
    r"^(part-[^/]*|\.part-[^/]*\.crc|_SUCCESS|\._SUCCESS\.crc|_temporary|_started_\d+|_committed_\d+)$"
)


def _refuse(out: str) -> StateError:
    return StateError(
        f"output {out!r} exists: pass --force to replace it (a release already "
        "published from it still counts against the budget), or name a new --output"
    )


def _not_ours(out: str, why: str) -> StateError:
    return StateError(
        f"--output {out!r} {why}: --force replaces only a directory of a Spark run's part "
        "files; name a new --output"
    )


def check_output(
    spark: Any, out: str, force: bool, others: Sequence[tuple[str, str | None]] = ()
) -> str | None:
    """Refuse an output that exists, unless ``force``; with ``force``, refuse one that is
    not a directory of a Spark run's part files (:data:`_SPARK_ENTRY`) or that holds
    one of ``others`` ((option, path): the input, the key, the ledger, ...). Refuse a
    local output whose directory cannot be made or written (tried: a directory made
    and removed beside it). Returns the output's path on this machine when Spark's file
    system for it is the local one (a ``file:`` URI, or a path without a scheme when
    that is Spark's default file system), else None.

    The path is resolved as Spark's writer resolves it (Hadoop's file system of the
    session), so ``out`` relative to the working directory, ``file:/x`` and
    ``hdfs://...`` are each checked where the releases would go. Everything here runs
    before the run reads its input or records anything."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(out)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    qualified = fs.makeQualified(path)
    if str(qualified.toUri().getScheme()) != "file":
        if fs.exists(path):
            if not force:
                raise _refuse(out)
            if not fs.getFileStatus(path).isDirectory():
                raise _not_ours(out, "is a file")
            for status in fs.listStatus(path):
                name = str(status.getPath().getName())
                if not _SPARK_ENTRY.match(name):
                    raise _not_ours(out, f"holds {name!r}")
        return None
    local = os.path.abspath(str(qualified.toUri().getPath()))
    if os.path.lexists(local):
        if not force:
            raise _refuse(out)
        _check_replaceable(out, local, others)
    else:
        _check_writable(out, local)
    return local


def _check_replaceable(out: str, local: str, others: Sequence[tuple[str, str | None]]) -> None:
    """Refuse to replace ``local`` unless it is a directory of part files holding none of
    ``others``."""
    if os.path.islink(local) or not os.path.isdir(local):
        raise _not_ours(out, "is not a directory" if not os.path.islink(local) else "is a link")
    for entry in os.scandir(local):
        if not _SPARK_ENTRY.match(entry.name):
            raise _not_ours(out, f"holds {entry.name!r}")
    root = os.path.realpath(local)
    for option, other in others:
        if other and other != "-":
            where = os.path.realpath(other)
            if where == root or where.startswith(root + os.sep):
                raise _not_ours(out, f"holds {option} {other!r}")


def _check_writable(out: str, local: str) -> None:
    """Make the output's parent directories and try writing in the last one."""
    parent = os.path.dirname(local)
    try:
        os.makedirs(parent, exist_ok=True)
        probe = os.path.join(parent, f".{os.path.basename(local)}.dpstream-{os.getpid()}-probe")
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        raise StateError(
            f"--output {out!r} cannot be written: {exc.strerror or exc} "
            f"({exc.filename or parent!r})"
        ) from None


def _writer(table: Any, fmt: str, mode: str) -> Any:
    writer = table.write.mode(mode)
    if fmt == "jsonl-long":
        return lambda out: writer.option("ignoreNullFields", False).json(out)
    if fmt == "csv":  # RFC 4180 as the local engine writes it: each item as it is
        w = writer.option("header", True).option("escape", '"')
        w = w.option("ignoreLeadingWhiteSpace", False).option("ignoreTrailingWhiteSpace", False)
        return lambda out: w.csv(out)
    return writer.parquet


def write_table(table: Any, fmt: str, out: str, local: str | None, force: bool) -> None:
    """Write ``table`` (the releases) to ``out`` as ``fmt`` part files; ``local``: its
    path on this machine, from :func:`check_output` (see the module)."""
    try:
        _write(table, fmt, out, local, force)
    except StateError:
        raise
    except Exception as exc:  # Spark's (a Py4J error): one line, not the JVM's stack
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise StateError(
            f"could not write the releases to {out!r}: {lines[0][:300]}; the release "
            "ledger already records this run, so run it again with --force once the "
            "output can be written"
        ) from None


def _write(table: Any, fmt: str, out: str, local: str | None, force: bool) -> None:
    if local is None:
        _writer(table, fmt, "overwrite" if force else "errorifexists")(out)
        return
    path = local
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _tidy(parent, name)
    stem = os.path.join(parent, f".{name}.dpstream-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        _writer(table, fmt, "errorifexists")("file://" + stem)
        _put_in_place(stem, path, force)
    except BaseException:
        shutil.rmtree(stem, ignore_errors=True)
        raise


def _put_in_place(new: str, path: str, force: bool) -> None:
    """Rename the written directory ``new`` to ``path``; an earlier output there (only
    with ``force``) is renamed aside first and deleted after."""
    old = None
    if os.path.lexists(path):
        if not force:  # written since the check: another run's, keep it
            raise _refuse(path)
        old = f"{new}.old"
        os.rename(path, old)
    os.rename(new, path)
    _fsync_dir(os.path.dirname(path))
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)


def _tidy(parent: str, name: str) -> None:
    """Delete what runs on ``name`` that are gone left beside it: a half-written output,
    or an earlier one renamed aside and not yet deleted when its run stopped."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            m = _PART.match(entry.name)
            if m is None or m["name"] != name or _alive(int(m["pid"])):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
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
