"""The release ledger's file: opened 0600 for appends, locked, read in ranges, made durable.

Layer 6 of dpstream (the edges); stdlib only, but for the output lock's test
(:func:`dpstream.run.lock.output_in_use`). The format and the rules are
:mod:`dpstream.ledger`'s; this module is the file under them.

Its lock is never waited for in silence, nor for ever: a run appends one short line
under it, so a lock held longer is another process's (an operator's ``flock LEDGER
cmd``, a hung run). The run then says once on stderr that it waits, and refuses
(:class:`LedgerError`) once :data:`LEDGER_WAIT_S` seconds have passed (the
environment variable ``DPSTREAM_LEDGER_WAIT`` sets another limit; 0: refuse at
once). A ledger path that is the output of a run in progress (its output lock held)
is refused before it is opened: its lines would go into that run's releases.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterator

from .errors import LedgerError
from .run.lock import lock_path, output_in_use, refuse_foreign_link

try:
    import fcntl
except ImportError:  # Windows: no flock (two runs must not append to one ledger at once)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LEDGER_WAIT_S",
    "WAIT_ENV",
    "check_ledger_file",
    "locked",
    "open_ledger_file",
    "read_range",
    "wait_limit",
]

#: How long (seconds) a run waits for the ledger's lock that another process holds.
LEDGER_WAIT_S = 60.0
#: The environment variable that sets another wait (seconds; 0: refuse at once).
WAIT_ENV = "DPSTREAM_LEDGER_WAIT"
#: A lock held this long (seconds) is not another run's short append: the run says it waits.
_QUIET_S = 0.5

_log = logging.getLogger("dpstream.ledger")
_now = time.monotonic  # the clock and the pause of the wait (a test's own in tests)
_sleep = time.sleep


#: How every line of a ledger starts (the step, scope and budget lines of
#: :mod:`dpstream.ledger` and :mod:`dpstream.budget`); a torn first line is a prefix.
LINE_KINDS = (b"L1 ", b"S1 ", b"B1 ")


def opens_ledger(head: bytes) -> bool:
    """Whether ``head``, the first bytes of a file, can open a release ledger: a line
    kind, or a prefix of one (a torn first line, maybe closed with a NUL on an
    append-only ledger)."""
    first = head.split(b"\0")[0][:3]
    return bool(first) and any(kind.startswith(first) for kind in LINE_KINDS)


def check_ledger_file(path: str, *, fsync: bool = True) -> None:
    """Open (creating it if missing) and close the ledger at ``path``: refuse, before a
    run touches anything, a ledger it could not write or that others may write."""
    os.close(open_ledger_file(path, fsync=fsync))


def open_ledger_file(path: str, *, fsync: bool) -> int:
    """The ledger's descriptor for reading and appending; created 0600 if missing.
    Refused (:class:`LedgerError`) when ``path`` is the output of a run in progress."""
    if output_in_use(path):
        raise LedgerError(
            f"the release ledger {path!r} is the output file of a run in progress (another "
            f"process holds its output lock {lock_path(path)!r}): ledger lines would go "
            "into that run's releases; pass --ledger the key's ledger, not a run's --output"
        )
    refuse_foreign_link(path, "the release ledger")  # (review 103: followed one, made
    created = not os.path.exists(path)  # by another user, to where that user chose)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LedgerError(
            f"cannot open the release ledger {path!r}: {exc.strerror}; pass --ledger PATH "
            "to keep it elsewhere (on storage that is never restored from a backup)"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a device or a pipe: no ledger to read or append to
        os.close(fd)
        raise LedgerError(
            f"the release ledger {path!r} is not a regular file (a device or a pipe): "
            "pass --ledger a file"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise PermissionError(
            f"release ledger {path!r} can be written by other users (mode "
            f"{stat.S_IMODE(mode):04o}): whoever can write it can roll it back; run "
            f"`chmod 600 {path}`"
        )
    head = os.pread(fd, 3, 0)
    if head and not opens_ledger(head):
        os.close(fd)
        raise LedgerError(
            f"{path!r} is not a release ledger (its first line is no ledger line): it may "
            "be a run's output, state or sidecar, which ledger lines would corrupt; pass "
            "--ledger the key's ledger (or a new file)"
        )
    if created and fsync:
        _fsync_dir(path)
    return fd


@contextlib.contextmanager
def locked(
    fd: int, *, exclusive: bool, path: str = "", wait: float | None = None
) -> Iterator[None]:
    """``flock`` the ledger ``path`` open on ``fd``: appends exclusive, reads shared (no
    lock without fcntl). Held by another process, it is waited for ``wait`` seconds at
    most (None: :func:`wait_limit`), then refused (:class:`LedgerError`)."""
    if fcntl is None:
        yield
        return
    _flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, path, wait)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def wait_limit() -> float:
    """The seconds a run waits for the ledger's lock: ``DPSTREAM_LEDGER_WAIT``, else
    :data:`LEDGER_WAIT_S`."""
    text = os.environ.get(WAIT_ENV, "").strip()
    if not text:
        return LEDGER_WAIT_S
    try:
        limit = float(text)
    except ValueError:
        limit = -1.0
    if not 0 <= limit < float("inf"):
        raise ValueError(f"{WAIT_ENV}={text!r}: give the seconds to wait for the ledger (>= 0)")
    return limit


def _flock(
    fd: int, op: int, path: str, wait: float | None, what: str = "the release ledger"
) -> None:
    """Take the lock ``op`` on ``fd``, polling while another process holds it; say once
    that the run waits (once it waited :data:`_QUIET_S`), refuse after ``wait`` s.
    ``what`` names the file in the messages (the key registry's entry uses it too)."""
    limit = wait_limit() if wait is None else wait
    start = _now()
    pause = 0.01
    said = False
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = _now() - start
        if waited >= limit:
            raise LedgerError(
                f"{what} {path!r} is locked by another process (a run that "
                f"hangs, or a command run under `flock {path}`), still after {limit:g} s: "
                f"refusing to wait longer. Let that process finish (`fuser -v {path}` "
                f"names it), or set {WAIT_ENV}=SECONDS to wait longer"
            )
        if not said and waited >= _QUIET_S:
            _log.warning(
                f"waiting for {what} {path}, locked by another process (up to {limit:g} s in all)"
            )
            said = True
        _sleep(min(pause, limit - waited))
        pause = min(2 * pause, 0.5)


def read_range(fd: int, start: int, end: int) -> bytes:
    parts = []
    while start < end:
        block = os.pread(fd, min(1 << 24, end - start), start)
        if not block:
            break
        parts.append(block)
        start += len(block)
    return b"".join(parts)


def _fsync_dir(path: str) -> None:
    """Make the new ledger's directory entry durable."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
