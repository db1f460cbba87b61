"""Test-only crash points: where the kill harness (``tests/test_kill_points.py``) kills a run.

Layer 6 of dpstream (the edges: the state and the files a run publishes).

Inert unless the environment variable ``DPSTREAM_TEST_KILL_AT`` is set (no
user sets it; nothing here changes what a run writes). When it is, this
process sends itself SIGKILL:

* ``sql:N``: just before the N-th SQLite statement on a state file (every
  connection opened through :func:`watch`, counted in order);
* ``write:N``: just before the N-th write of a file the run publishes (every
  write made through :func:`write` or :func:`write_fd`: the releases, the
  metadata sidecar, the release ledger);
* ``torn:N``: after the first half of the N-th write has reached the file.

Every file a run publishes is written through :func:`write`, so a write added
later is enumerated by the harness as soon as it goes through it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Callable
from typing import IO, Any

ENV = "DPSTREAM_TEST_KILL_AT"

_counts: dict[str, int] = {}
_armed: tuple[int, str] | None = None  # (pid, setting) the counts belong to


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    global _armed
    if _armed != (os.getpid(), spec):  # a new process (a fork) or setting: count anew
        _armed = (os.getpid(), spec)
        _counts.clear()
    kind, _, n = spec.partition(":")
    return kind, int(n)


def _reached(counter: str, n: int) -> bool:
    _counts[counter] = _counts.get(counter, 0) + 1
    return _counts[counter] == n


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def watch(db: sqlite3.Connection) -> None:
    """Count the statements of ``db`` (``sql:N`` kills before the N-th); inert if unset."""
    target = _target()
    if target is None or target[0] != "sql":
        return
    n = target[1]

    def before(_statement: str) -> None:
        if _reached("sql", n):
            _die()

    db.set_trace_callback(before)


def _crash_point(write_half: Callable[[], None]) -> None:
    """The ``write:N`` and ``torn:N`` points of one write: kill before it, or after
    ``write_half()`` has put its first half in the file; nothing when unset."""
    target = _target()
    if target is not None and target[0] in ("write", "torn") and _reached("write", target[1]):
        if target[0] == "torn":
            write_half()
        _die()


def write(fh: IO[Any], data: Any) -> None:
    """``fh.write(data)``, with the crash points ``write:N`` and ``torn:N``."""

    def half() -> None:
        fh.write(data[: len(data) // 2])
        fh.flush()

    _crash_point(half)
    fh.write(data)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_fd(fd: int, data: bytes) -> None:
    """All of ``data`` to the file descriptor ``fd`` (``os.write`` until done), with
    the same crash points as :func:`write` (the release ledger's appends)."""
    _crash_point(lambda: _write_all(fd, memoryview(data)[: len(data) // 2]))
    _write_all(fd, data)
