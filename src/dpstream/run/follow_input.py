"""Where a followed input ends at an instant, and where each of its lines ends.

Layer 6 of dpstream (used by :mod:`dpstream.run.follow`). ``--follow`` closes step t
at the input's size when t falls due: a line counts in its step when its last byte
was written by the due instant (plus ``--lateness``), however long the reader takes
to parse what came before it. So which events a step holds depends on when each was
written, never on how many others were written near it (a backlog that the reader
parses slowly used to move the cut later, so one event's presence could decide
whether another counted).

:class:`FollowedInput` reads the input's bytes itself and knows the byte offset at
which each line ends; :meth:`FollowedInput.size_now` is how many bytes the input
holds now (a regular file's size; for a pipe, a socket or a terminal, the bytes read
so far plus those waiting to be read, taken under one lock with the reads).
:class:`DueSizes` is a thread that reads that size at each step's due instant.
"""

from __future__ import annotations

import fcntl
import io
import os
import select
import stat
import struct
import termios
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["DueSizes", "FollowedInput", "TakenLines"]

_BOM = b"\xef\xbb\xbf"
_TICK = 0.05  # the longest the due-size thread sleeps before it reads the clock again


class _CountingReader(io.RawIOBase):
    """The raw bytes of a file descriptor, counted; for an input that is not a regular
    file, each read happens under ``lock`` (after waiting for data outside it), so that
    bytes read plus bytes waiting is exact whenever the lock is held."""

    def __init__(self, fd: int, regular: bool) -> None:
        super().__init__()
        self.fd = fd
        self.regular = regular
        self.lock = threading.Lock()
        self.count = 0
        self.head = b""  # the input's first bytes (a byte-order mark?)
        self.let_go = False

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def readinto(self, buffer: Any) -> int:
        if not self.regular:
            select.select([self.fd], [], [])  # data or the end: the read below won't block
        with self.lock:
            if self.let_go:  # the run is over and may close the descriptor: never read
                return 0  # a number the system may have given to another file since
            data = os.read(self.fd, len(buffer))
            n = len(data)
            buffer[:n] = data
            self.count += n
        if len(self.head) < len(_BOM):
            self.head += data[: len(_BOM) - len(self.head)]
        return n


def _bytes_waiting(fd: int) -> int:
    """How many bytes a pipe, socket or terminal holds unread (``FIONREAD``)."""
    got = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", got)[0])


class FollowedInput:
    """A followed input's text lines, each with the byte offset it ends at.

    ``text``: the stream the run opened (a file or stdin, not read yet). When it has a
    file descriptor whose size can be told (a regular file, or an input that answers
    ``FIONREAD``), its bytes are read here and :attr:`sized` is true; otherwise (a
    stream without a descriptor) lines are read from ``text`` and :meth:`size_now` is
    None, and the follower falls back to closing a due step once the reader has
    caught up. Lines are split and decoded as :func:`dpstream.io.open_input` does.
    """

    def __init__(self, text: Any) -> None:
        self.text = text
        self.end = 0  # the byte offset at which the last line read ends
        self._raw: _CountingReader | None = None
        self._bom_checked = False
        fd = _plain_fd(text)
        if fd is None:
            return
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        if not regular:
            try:
                _bytes_waiting(fd)
            except OSError:  # an input that cannot say what it holds: the fallback
                return
        elif os.lseek(fd, 0, os.SEEK_CUR) != 0:  # read already: its lines are elsewhere
            return
        from ..io.records import text_stream

        self._raw = _CountingReader(fd, regular)
        self.text = text_stream(io.BufferedReader(self._raw, buffer_size=1 << 16))

    @property
    def sized(self) -> bool:
        """Whether :meth:`size_now` tells the input's size."""
        return self._raw is not None

    def size_now(self) -> int | None:
        """How many bytes the input holds now (None: it cannot say)."""
        raw = self._raw
        if raw is None:
            return None
        if raw.regular:
            return os.fstat(raw.fd).st_size
        with raw.lock:
            return raw.count + _bytes_waiting(raw.fd)

    def consumed(self) -> int:
        """The bytes read from the input so far (every line that ends within them has
        been read; 0 when the input is not :attr:`sized`)."""
        return self._raw.count if self._raw is not None else 0

    def readline(self) -> str:
        """The next line (or what there is of it), its end counted in :attr:`end`."""
        line = self.text.readline()
        if line:
            if not self._bom_checked and self._raw is not None:
                self._bom_checked = True
                if self._raw.head == _BOM:  # the decoder dropped it: its bytes still count
                    self.end += len(_BOM)
            self.end += len(line.encode("utf-8", "surrogateescape"))
        return line

    def close(self) -> None:
        """Stop reading the descriptor (it stays the run's to close): a reader thread still
        waiting on a pipe then reads nothing, even once the number is another file's."""
        if self._raw is not None:
            with self._raw.lock:
                self._raw.let_go = True


def _plain_fd(text: Any) -> int | None:
    """The descriptor under ``text`` when it is a plain file or stdin read as text (not a
    decompressed ``.gz``: its descriptor holds other bytes than its lines)."""
    if not isinstance(text, io.TextIOWrapper):
        return None
    buffer = text.buffer
    if not isinstance(buffer, io.BufferedReader) or not isinstance(buffer.raw, io.FileIO):
        return None
    try:
        return text.fileno()
    except (OSError, ValueError):
        return None


class DueSizes:
    """A thread that reads the input's size once each step falls due on the clock.

    Step t's size is what :meth:`FollowedInput.size_now` gave at the first look at the
    clock that found t due: at its due instant, give or take the thread's wake-up (a
    step already due when the run starts gets the size the input has then). The
    follower asks :meth:`size_of`; sizes never shrink as t grows.
    """

    def __init__(
        self,
        clock: Any,
        first_t: int,
        until: int,
        size_now: Callable[[], int | None],
        now: Callable[[], Any],
        stop: threading.Event,
    ) -> None:
        self._clock, self._until, self._size_now, self._now = clock, until, size_now, now
        self._stop = stop
        self._t = first_t
        self._ranges: deque[tuple[int, int]] = deque()  # (last step, size), in step order
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="dpstream-due-sizes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._t <= self._until and not self._stop.is_set():
                now = self._now()
                due = self._clock.due(now)
                if due >= self._t:
                    size = self._size_now()
                    assert size is not None
                    last = min(due, self._until)
                    with self._lock:
                        self._ranges.append((last, size))
                    self._t = last + 1
                    continue
                wait = (self._clock.end_of(self._t) + self._clock.lateness - now).total_seconds()
                self._stop.wait(min(max(wait, 0.0005), _TICK))
        except BaseException as exc:  # noqa: BLE001 - handed to the follower
            self.errors.append(exc)

    def size_of(self, t: int) -> int | None:
        """Step ``t``'s size, once it is due (None before); asks for steps in order."""
        with self._lock:
            ranges = self._ranges
            while ranges and ranges[0][0] < t:
                ranges.popleft()
            return ranges[0][1] if ranges else None


class TakenLines:
    """The records the follower has taken since the last step it closed: where each ends
    in the input and its line, so that a step closes at the last line that ends within
    the input's size at its due instant."""

    def __init__(self) -> None:
        self.seen = 0  # every line that ends within this many bytes has been taken
        self._ends: deque[int] = deque()
        self._lines: deque[int] = deque()
        self._closed = 0  # the line the last step closed at

    def take(self, line: int, end: int) -> None:
        """One record taken, at input line ``line``, ending at byte ``end``."""
        self._ends.append(end)
        self._lines.append(line)
        self.seen = max(self.seen, end)

    def caught_up(self, consumed: int) -> None:
        """The reader has read ``consumed`` bytes and handed over every line in them."""
        self.seen = max(self.seen, consumed)

    def line_within(self, size: int) -> int:
        """The line of the last record taken that ends within ``size`` bytes."""
        line = self._closed
        for end, at in zip(self._ends, self._lines, strict=True):  # in input order
            if end > size:
                break
            line = at
        return line

    def closed_at(self, line: int) -> None:
        """A step closed at ``line``: forget the records up to it."""
        self._closed = max(self._closed, line)
        while self._lines and self._lines[0] <= self._closed:
            self._ends.popleft()
            self._lines.popleft()
