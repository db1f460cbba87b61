"""The bytes of a followed input, and how many it holds at an instant.

Layer 6 of dpstream (used by :mod:`dpstream.run.follow_input`). Two sources:

* :class:`FileBytes`, a regular file (by path, or stdin redirected from one): read at
  the parser's pace; its size is the file's size, and a size below what was read, or
  a path that now names another file, is a rotation the run stops at.
* :class:`PipeSpool`, a pipe, a FIFO, a socket or a terminal: a thread drains it into
  a private temporary file as fast as bytes arrive, and the parser reads that file at
  its own pace. So what the input holds at an instant (the bytes drained plus those
  waiting in the pipe, taken under the drain's lock) is set by when the writer wrote,
  never by how far the parser has got: a writer is never held back by a backlog of
  other events waiting to be parsed.

Both stop reading once the run lets them go (:meth:`let_go`), under the lock the reads
take, so a thread still waiting cannot read a descriptor number that the run has
closed and the system has given to another file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import stat
import struct
import tempfile
import termios
import threading
import time

from ..errors import StateError

__all__ = ["FileBytes", "PipeSpool", "bytes_waiting", "open_bytes"]

_READ = 1 << 16
_TRIM = 1 << 24  # spooled bytes handed out before the spool is emptied (once caught up)

_LOG = logging.getLogger("dpstream")


def bytes_waiting(fd: int) -> int:
    """How many bytes a pipe, socket or terminal holds unread (``FIONREAD``)."""
    got = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", got)[0])


def _rotated(path: str, how: str) -> StateError:
    return StateError(
        f"the input {path!r} was {how} while it was followed (rotated?): --follow reads "
        "one file from its first line, and a resumed run reads it again from there. "
        "Rotate the input between runs only, and follow a new file as a new stream "
        "(a new --state and --output)"
    )


class FileBytes:
    """A regular file's bytes from its start. ``path``: the name it was opened by, checked
    for rotation (None: stdin redirected from the file, followed as the file is)."""

    def __init__(self, fd: int, path: str | None) -> None:
        self.fd, self.path = fd, path
        self.read_count = 0
        self._lock = threading.Lock()
        self._let_go = False

    def read(self) -> bytes:
        """The next bytes there are now (b"": none now)."""
        with self._lock:
            if self._let_go:
                return b""
            data = os.read(self.fd, _READ)
            self.read_count += len(data)
        return data

    def at_end(self) -> bool:
        """Never: a file may always grow, stdin redirected from one too (were its end
        where the reader first met it, how long the backlog took to parse would decide
        whether an event appended meanwhile is read)."""
        return False

    def backlog_size(self) -> int:
        """What the file held when the run started, for the steps already due then: its
        size now."""
        return self.size_now()

    def size_now(self) -> int:
        """The file's size now (a rotation raises :class:`~dpstream.errors.StateError`)."""
        return self._checked().st_size

    def check(self) -> None:
        """Refuse a file truncated below what was read, or whose path now names another
        file (moved and made again): what came after would be lost or read from the
        middle, and a resumed run, which reads the input again from its first line,
        would not find the lines its steps closed at."""
        self._checked()

    def _checked(self) -> os.stat_result:
        """The followed file's status, once :meth:`check` finds it not rotated."""
        # what was read is taken before the file's size: read after it, by the reader's
        # thread while the due-sizes thread asks, it can pass a size taken a moment
        # earlier of a file that only grew (review 115: a live run stopped as "truncated")
        read = self.read_count
        held = os.fstat(self.fd)
        if held.st_size < read:
            raise _rotated(self.path or "-", "truncated")
        if self.path is None:
            return held
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise _rotated(self.path, "moved or replaced")
        return held

    def let_go(self) -> None:
        with self._lock:
            self._let_go = True


class PipeSpool:
    """A pipe (or FIFO, socket, terminal) drained into a private temporary file by a
    thread, as fast as its writer writes; :meth:`read` gives the spooled bytes in order.

    ``ends``: the input ends when its writers close it (stdin); a FIFO followed by its
    path does not (its next writer goes on). What was handed out is dropped from the
    spool whenever the reader has caught up, so it holds the backlog, not the stream.
    """

    def __init__(self, fd: int, *, ends: bool = True) -> None:
        bytes_waiting(fd)  # an input that cannot say what it holds is refused here
        self.fd, self._ends = fd, ends
        self._spool = tempfile.TemporaryFile(prefix="dpstream-follow-")  # 0600, unlinked
        self._lock = threading.Lock()
        self._drained = 0  # bytes moved from the pipe to the spool
        self._read_at = 0  # bytes of the spool handed out
        self._spool_base = 0  # the input offset of the spool's first byte
        self._eof = False
        self._let_go = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="dpstream-drain", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        spool = self._spool.fileno()
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                with self._lock:
                    if self._let_go:
                        return
                    if not ready:
                        continue
                    data = os.read(self.fd, _READ)  # there is data (or the end): no wait
                    if data:
                        os.pwrite(spool, data, self._drained - self._spool_base)
                        self._drained += len(data)
                        continue
                    if self._ends:
                        self._eof = True
                        return
                # a FIFO's writers all closed: wait for the next one (reads say "end"
                # at once until then)
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - raised by the reader's next read
            self._error = exc
        finally:
            if self._error is not None or self._let_go:
                self._eof = True

    def read(self) -> bytes:
        """The next spooled bytes (b"": none now)."""
        if self._error is not None:
            raise self._error
        with self._lock:
            n = min(self._drained - self._read_at, _READ)
            if self._let_go:
                return b""
            if n <= 0:
                if self._read_at - self._spool_base >= _TRIM:  # all handed out: drop it
                    self._spool.truncate(0)
                    self._spool_base = self._read_at
                return b""
            data = os.pread(self._spool.fileno(), n, self._read_at - self._spool_base)
            self._read_at += len(data)
            return data

    def at_end(self) -> bool:
        """Whether the writer has closed the pipe (stdin) and every byte was handed out."""
        with self._lock:
            return self._eof and self._read_at == self._drained

    def size_now(self) -> int:
        """The bytes the input holds now: drained, or waiting in the pipe."""
        with self._lock:
            if self._eof or self._let_go:
                return self._drained
            return self._drained + bytes_waiting(self.fd)

    def backlog_size(self) -> int:
        """What the input held, as far as the run can tell, for the steps already due
        when it starts: nothing. A pipe cannot tell when its bytes were written, and
        its writer may be blocked with more (a pipe holds 64 KB): any cut there would
        let how much other events weigh, or when they came, decide whether an event
        counts. So the events of the steps due before a run starts are late when they
        come from a pipe (a resumed run's recorded steps still close where they did);
        a backlog is given as a file. Said in a warning (review 111: a backlog piped
        in released its steps empty, with "0 events, 0 skipped")."""
        _LOG.warning(
            "steps already due when the run started count no event read from a pipe "
            "(a pipe cannot tell when its bytes were written): their events are late, "
            "and are not read if the run ends there. Give a backlog as a file "
            "(-i FILE --follow)"
        )
        return 0

    def check(self) -> None:
        """A pipe cannot be rotated."""

    def let_go(self) -> None:
        with self._lock:
            self._let_go = True
        self._spool.close()


def open_bytes(fd: int, path: str | None) -> FileBytes | PipeSpool | None:
    """The source of a followed descriptor, or None when its size cannot be told (a
    regular file read already, an input that does not answer ``FIONREAD``)."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        if os.lseek(fd, 0, os.SEEK_CUR) != 0:
            return None
        return FileBytes(fd, path)
    try:
        return PipeSpool(fd, ends=path is None)
    except OSError:
        return None
