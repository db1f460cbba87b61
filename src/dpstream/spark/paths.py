"""How the Spark engine hands the input's paths and column names to Spark.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.read_jsonl` and
:mod:`dpstream.spark.read_parquet`. Spark's readers take a path as a Hadoop glob
and may skip what they cannot read; the local engine reads the one file it is
named, and refuses a broken one. So:

* :func:`literal_path` escapes the glob characters: ``day[1].jsonl`` is that
  file, not ``day1.jsonl``, and ``events-{a,b}`` one folder, not two;
* :func:`strict_reader` reads with ``ignoreCorruptFiles`` and
  ``ignoreMissingFiles`` off, whatever the session's configuration says: a
  truncated ``.gz`` stops the run, as it does on the local engine, instead of
  releasing the events before the damage;
* :func:`input_files` lists a local directory's files on the driver (every
  file at any depth but those whose names, or their folders' names, begin
  with ``.`` or ``_``: the rule of
  :func:`dpstream.io.parquet.folder_files`), for the reader to be given that
  explicit list: Spark's own listing infers ``key=value`` partitions, which
  hides the files beside such a folder (or fails on a plain folder beside it);
* :func:`literal_col` names a column by its whole name: ``user.id`` is the
  column of that name, not the field ``id`` of a struct column ``user`` (the
  local engine reads a Parquet file's columns by their names, dots and all).
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["input_files", "literal_col", "literal_path", "readable_by_spark", "strict_reader"]

#: The characters a Hadoop glob gives a meaning (``\\`` escapes the next one).
_GLOB = re.compile(r"([\\\[\]{}*?])")


def literal_path(path: str) -> str:
    """``path`` with its Hadoop glob characters escaped, so that Spark reads that very
    file or folder."""
    return _GLOB.sub(r"\\\1", path)


def input_files(path: str) -> list[str] | None:
    """The files the run reads for ``path`` on the local file system: ``[path]`` for a
    file, a directory's files as :func:`dpstream.io.parquet.folder_files` finds them for
    the Parquet reader (whatever their suffix), sorted by their paths relative to it
    (the order :mod:`dpstream.spark.order` numbers lines in); None for a path Spark reads from
    another file system (a URI with a scheme), which Spark lists itself. A ``file:``
    URI is a local path: listed here too (links followed, a file reached twice
    refused, as for a plain path), and its files are given as paths. A folder holding
    two files of the same bytes, a file beside its compressed twin, or an editor's
    backup is refused: Spark would count their events twice."""
    from ..io.parquet import folder_files, refuse_copies
    from ..run.lock import local_path

    readable_by_spark(path)
    local = local_path(path)  # a file: URI's path; the path itself without a scheme
    if local is None:
        return None
    if not os.path.isdir(local):
        readable_by_spark(local)
        return [local]
    files = folder_files(local)
    for f in files:
        readable_by_spark(f)
    refuse_copies(local, files)  # (review 105: a copy counted its events twice)
    _refuse_twins(local, files)
    return files


#: The endings of backups an editor or a tool leaves beside a file.
_BACKUP = ("~", ".bak", ".orig", ".rej")
#: The suffixes of the files Spark (Hadoop) reads decompressed.
_COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


def _refuse_twins(folder: str, files: list[str]) -> None:
    """Refuse a folder holding a file beside its compressed twin (``day1.jsonl`` and
    ``day1.jsonl.gz``) or a backup (``day1.jsonl~``, ``.bak``, ``#day1.jsonl#``): Spark
    reads every file, so their events would count twice (review 105: 3,000 events
    released as 8,990). A copy under another name with other bytes (another line end,
    compressed under another name) is not seen: give Spark a folder of the day's files."""
    names = set(files)
    for name in files:
        base = os.path.basename(name)
        if name.endswith(_BACKUP) or (base.startswith("#") and base.endswith("#")):
            raise ValueError(
                f"--input {folder!r}: {name!r} is a backup (a name ending in "
                f"{', '.join(repr(b) for b in _BACKUP)}, or an editor's #name#): Spark "
                "would read its events with the file's; remove it"
            )
        for suffix in _COMPRESSED:
            if name.endswith(suffix) and name[: -len(suffix)] in names:
                raise ValueError(
                    f"--input {folder!r}: {name!r} is {name[: -len(suffix)]!r} compressed "
                    "(a twin?): Spark would read the events of both; remove one"
                )


def readable_by_spark(path: str) -> None:
    """Refuse (ValueError, one line) a local file Spark cannot name: Hadoop reads a
    ``:`` in a path as a URI's scheme (``Relative path in absolute URI``), whatever is
    escaped or made absolute, so ``2026-01-01T00:00.jsonl`` would fail inside Spark."""
    from ..run.lock import local_path

    # a local name as it is (``ev:1.jsonl`` would pass for a URI of scheme "ev"), else a
    # file: URI's path (None: another file system's, where ':' is Hadoop's to judge)
    local = path if os.path.lexists(path) else local_path(path)
    if local is not None and ":" in os.path.abspath(local):
        raise ValueError(
            f"--engine spark cannot read {path!r}: Spark (Hadoop) takes a ':' in a file's "
            "path for a URI's scheme; rename it (or its folder), or run it on the local "
            "engine"
        )


def literal_col(name: str) -> Any:
    """The top-level column named ``name``, whatever it holds: quoted in backticks (a
    backtick doubled), so that Spark reads no dot as a path into a struct and no
    other character as part of an expression."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)

    return F.col("`" + name.replace("`", "``") + "`")


def strict_reader(spark: Any) -> Any:
    """``spark.read`` that fails on a corrupt or vanished file (the per-read options win
    over the session's ``spark.sql.files.ignore*Files``)."""
    return spark.read.option("ignoreCorruptFiles", "false").option("ignoreMissingFiles", "false")
