"""One run at a time writes an output: an exclusive lock, held for the whole run.

Layer 6 of dpstream (a run's setup). Two runs writing one output file at once would
both pass the check that it holds no releases yet, both record their scope and budget
in the release ledger, and leave a file of interleaved lines. So a local run takes an
exclusive ``flock`` on a lock file beside its output (``.NAME.lock``, beside the file a
symbolic link names) before it opens its state, checks its output or touches the
ledger, and holds it until its last byte is written: a second run is refused at once,
before it records anything.

The kernel drops the lock when its holder dies (a SIGKILL too), so a lock file left by
a killed run stops no one: the next run takes the lock on it. A run that finishes
removes the lock file while it still holds the lock, and a run that locked a file
since removed locks the new one instead (two runs never hold locks on two files of
one name). ``--output -`` (stdout) takes none, nor does a system without ``fcntl``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ..errors import StateError

try:
    import fcntl
except ImportError:  # Windows: no flock (two runs must not write one output at once)
    fcntl = None  # type: ignore[assignment]

__all__ = ["lock_path", "output_lock"]


def lock_path(output: str) -> str:
    """The lock file of output file ``output``: ``.NAME.lock`` beside the file it names
    (its symbolic links resolved, so that two names of one file share one lock)."""
    head, name = os.path.split(os.path.realpath(output))
    return os.path.join(head, f".{name}.lock")


@contextlib.contextmanager
def output_lock(output: str) -> Iterator[None]:
    """Hold the lock of output file ``output`` (none for ``-``) while the block runs;
    refuse (:class:`StateError`) when another run holds it."""
    if output == "-" or fcntl is None:
        yield
        return
    path = lock_path(output)
    fd = _acquire(output, path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # removed while held (see the module's doc)
            os.unlink(path)
        os.close(fd)


def _acquire(output: str, path: str) -> int:
    """The descriptor of the lock file ``path``, locked by this run."""
    flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o666)  # the umask applies, as to the output
        except OSError as exc:  # say the output, which is what the operator named
            raise OSError(exc.errno, exc.strerror, output) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(
                f"another run is writing output file {output!r} (it holds {path!r}): "
                "refusing to start a second one, which would mix their releases; wait "
                "for it to finish, or write elsewhere"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            return fd
        os.close(fd)  # its holder removed it as it finished: lock the file there now
