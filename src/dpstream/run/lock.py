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

A Spark run (:mod:`dpstream.spark.command`) takes the same lock when its output (a
directory) is a local path (:func:`local_path`), so a Spark run and a local run on one
output exclude each other too. A release ledger is refused where an output lock is
held (:func:`output_in_use`): it is the output of a run in progress.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
import urllib.parse
from collections.abc import Iterator

from ..errors import StateError

try:
    import fcntl
except ImportError:  # Windows: no flock (two runs must not write one output at once)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "check_target",
    "local_path",
    "lock_path",
    "output_in_use",
    "output_lock",
    "refuse_foreign_link",
    "regular_or_new",
    "same_file",
]


def lock_path(output: str) -> str:
    """The lock file of output file ``output``: ``.NAME.lock`` beside the file it names
    (its symbolic links resolved, so that two names of one file share one lock)."""
    head, name = os.path.split(os.path.realpath(output))
    return os.path.join(head, f".{name}.lock")


def refuse_foreign_link(path: str, what: str) -> None:
    """Refuse ``path`` when the walk to it follows a symbolic link another user may have
    planted: in a folder others (its group, or all) may write, made by neither this user
    nor root (in a sticky one, such as ``/tmp``: nor the folder's owner, as the kernel's
    ``fs.protected_symlinks`` has it). Review 103 and 104: the kernel's protection is
    off on some machines, and does not cover a folder that is not sticky, or a team's
    group-writable one. A link in a folder of another user's own (a deploy account's
    ``current`` link) is followed: that user controls the folder anyway. dpstream
    resolves an output's links itself to write beside its target (a temporary file
    renamed onto it, a lock file), so the kernel never gets to refuse them, and another
    user's link there would choose where this user's file is written. The path is walked
    as the kernel walks it: a part at a time, ``..`` after the link before it is
    followed, and through the parts of each link's own target."""
    whole = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    todo = whole.split(os.sep)[1:]
    here = os.sep
    links = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        try:
            info = os.lstat(step)
        except OSError:  # nothing there (yet), or not ours to see: walked on as a name,
            here = step  # as realpath does (a `..` after it goes back to here)
            continue
        if not stat.S_ISLNK(info.st_mode):
            here = step
            continue
        links += 1
        if links > 40:  # as the kernel's ELOOP
            raise ValueError(f"{what} {path!r}: too many symbolic links along the way")
        folder = os.stat(here)
        me = os.geteuid()
        shared = bool(folder.st_mode & (stat.S_IWOTH | stat.S_IWGRP))  # sticky or not
        trusted = (me, folder.st_uid) if folder.st_mode & stat.S_ISVTX else (me, 0)
        if shared and info.st_uid not in trusted:
            raise ValueError(
                f"{what} {path!r} goes through a symbolic link another user made in a "
                f"folder others may write ({step!r}): refusing to follow it (write to a "
                "path of your own)"
            )
        target = os.readlink(step)
        if os.path.isabs(target):
            here = os.sep
        todo = [*target.split(os.sep), *todo]


def regular_or_new(path: str) -> bool:
    """Whether ``path`` is a regular file (or nothing yet), not a pipe or a device
    (``/dev/null``, ``/dev/stdout``): only such an output takes a lock, a sidecar, or
    a read of what it holds (reading a pipe would wait for a writer)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (also through links and hard links;
    False when one of them does not exist yet and their resolved names differ)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def local_path(output: str) -> str | None:
    """The path on this machine that a Spark output names: a path without a scheme as
    it is, a ``file:`` URI's path; None for another file system (``hdfs:``, ``s3a:``)."""
    if ":" not in output.split("/", 1)[0]:
        return output
    if output.split(":", 1)[0].lower() == "file":
        return urllib.parse.urlsplit(output).path or None
    return None


def output_in_use(output: str) -> bool:
    """Whether another process holds the lock of output ``output`` now (a run writing
    it). Tested with a shared lock taken and dropped at once on the lock file, when one
    is there (nothing is made or removed); the lock of this process's own open files
    counts as another's."""
    if fcntl is None:
        return False
    try:
        fd = os.open(lock_path(output), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # none there (no run took it), or not a file this run may open
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the shared lock, if taken
    return False


def _lockable(output: str, directory: bool) -> bool:
    """Whether ``output`` takes a lock (not ``-``, a pipe or a device; a directory only
    when it is a Spark run's output)."""
    if output == "-" or fcntl is None:
        return False
    return regular_or_new(output) or (directory and os.path.isdir(output))


@contextlib.contextmanager
def output_lock(output: str, *, directory: bool = False) -> Iterator[None]:
    """Hold the lock of output file ``output`` (none for ``-`` or a device) while the
    block runs; refuse (:class:`StateError`) when another run holds it. ``directory``:
    ``output`` is a Spark run's directory (which an existing one is locked as too).

    The lock is the lock file beside the file the name resolves to (a new output
    too). When that folder takes no new file, it is the output itself (which must
    exist: the run could not make one there), locked on a descriptor open for
    writing (as NFS needs). :func:`check_target` then refuses to open the output by
    a name that has come to resolve to another file since. Two hard links of one
    output in two folders have two lock files: write each output by one name.
    """
    if not _lockable(output, directory):
        yield
        return
    refuse_foreign_link(output, "--output")
    resolved = os.path.realpath(output)
    held: list[tuple[int, str | None]] = []
    try:
        path = lock_path(output)
        try:
            held.append((_acquire(output, path), path))
        except OSError as exc:
            if exc.errno not in _NO_NEW_FILE or not os.path.isfile(resolved):
                raise OSError(exc.errno, exc.strerror, output) from None
            held.append((_lock_output(output, resolved), None))
        token = _target.set(resolved)
        try:
            yield
        finally:
            _target.reset(token)
    finally:
        for fd, lock_file in reversed(held):
            if lock_file is not None:
                _remove_if_lock_file(fd, lock_file)
            os.close(fd)


def check_target(output: str) -> None:
    """Refuse to open ``output`` when the run holds the lock of another file: its name
    (a link, a folder's link) has come to lead elsewhere since the lock was taken,
    where another run may be writing."""
    target = _target.get()
    if target is not None and output != "-" and os.path.realpath(output) != target:
        raise StateError(
            f"output file {output!r} leads to {os.path.realpath(output)!r} now, not to "
            f"{target!r} as when this run locked it (a link changed): refusing to write"
        )


_target: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)


def _remove_if_lock_file(fd: int, path: str) -> None:
    """Remove lock file ``path`` (held on ``fd``) when it is still that empty file."""
    try:
        info = os.fstat(fd)
        if os.path.samestat(info, os.stat(path, follow_symlinks=False)) and info.st_size == 0:
            os.unlink(path)
    except OSError:  # removed while held, or a folder that forbids it
        pass


def _lock_output(output: str, resolved: str) -> int:
    """The output file itself, opened for writing (not truncated) and locked by this run."""
    fd = os.open(resolved, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    _flock_or_refuse(fd, f"another run (or process) holds a lock on output file {output!r}")
    return fd


def _flock_or_refuse(fd: int, holder: str) -> None:
    """Lock ``fd`` (exclusive, at once) or close it and refuse, saying ``holder``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateError(
            f"{holder}: refusing to start a second one, which would mix their "
            "releases; wait for it to finish, or write elsewhere"
        ) from None
    except BaseException:
        os.close(fd)
        raise


#: the errors of a folder that takes no new file (the lock then goes beside the name given)
_NO_NEW_FILE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _open_lock(path: str) -> int:
    """The lock file ``path``: made (mode 0644, so that another user's run can take the
    lock a killed run left) or the one there, which must be an empty regular file (a
    file of content at that name is never locked, nor later removed). Open for writing
    where the run may (NFS locks only such a descriptor), else read-only."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | nofollow, 0o644)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | nofollow)
        except PermissionError:  # another user's: locked read-only (flock allows it)
            fd = os.open(path, os.O_RDONLY | nofollow)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != 0:
            os.close(fd)
            raise StateError(
                f"{path!r} is the lock file's name of this output, but holds something "
                "else (a lock file is empty): move it, or write the output elsewhere"
            ) from None
        return fd
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o644)
    return fd


def _acquire(output: str, path: str) -> int:
    """The descriptor of the lock file ``path``, locked by this run."""
    vanished = 0
    while True:
        try:
            fd = _open_lock(path)
        except FileNotFoundError:
            vanished += 1  # removed between the two opens: make it again (a folder such
            if os.path.isdir(os.path.dirname(path)) and vanished < 100:  # as /proc, where
                continue  # no file can be made, says "no such file" every time)
            raise
        _flock_or_refuse(fd, f"another run is writing output file {output!r} (it holds {path!r})")
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            return fd
        os.close(fd)  # its holder removed it as it finished: lock the file there now
