"""The release ledger's file: opened 0600 for appends, locked, read in ranges, made durable.

Layer 6 of dpstream (the edges); stdlib only. The format and the rules are
:mod:`dpstream.ledger`'s; this module is the file under them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

from .errors import LedgerError

try:
    import fcntl
except ImportError:  # Windows: no flock (two runs must not append to one ledger at once)
    fcntl = None  # type: ignore[assignment]

__all__ = ["check_ledger_file", "locked", "open_ledger_file", "read_range"]


def check_ledger_file(path: str, *, fsync: bool = True) -> None:
    """Open (creating it if missing) and close the ledger at ``path``: refuse, before a
    run touches anything, a ledger it could not write or that others may write."""
    os.close(open_ledger_file(path, fsync=fsync))


def open_ledger_file(path: str, *, fsync: bool) -> int:
    """The ledger's descriptor for reading and appending; created 0600 if missing."""
    created = not os.path.exists(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LedgerError(
            f"cannot open the release ledger {path!r}: {exc.strerror}; pass --ledger PATH "
            "to keep it elsewhere (on storage that is never restored from a backup)"
        ) from None
    mode = os.fstat(fd).st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise PermissionError(
            f"release ledger {path!r} can be written by other users (mode "
            f"{stat.S_IMODE(mode):04o}): whoever can write it can roll it back; run "
            f"`chmod 600 {path}`"
        )
    if created and fsync:
        _fsync_dir(path)
    return fd


@contextlib.contextmanager
def locked(fd: int, *, exclusive: bool) -> Iterator[None]:
    """``flock`` the ledger: appends exclusive, reads shared (no lock without fcntl)."""
    if fcntl is None:
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


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
