"""Where a followed input ends at an instant, and where each of its lines ends.

Layer 6 of dpstream (used by :mod:`dpstream.run.follow`). ``--follow`` closes step t
at the input's size when t falls due: a line counts in its step when its last byte
was written by the due instant (plus ``--lateness``), however long the reader takes
to parse what came before it. So which events a step holds depends on when each was
written, never on how many others were written near it (a backlog that the reader
parses slowly used to move the cut later, so one event's presence could decide
whether another counted).

:class:`FollowedInput` splits the input's bytes (:mod:`dpstream.run.follow_bytes`)
into lines itself, so it knows the byte offset at which each line ends and decodes
only whole lines (a character written in two parts is one character);
:meth:`FollowedInput.size_now` is how many bytes the input holds now.
:class:`DueSizes` is a thread that reads that size at each step's due instant, and
:class:`TakenLines` finds the last line within it.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..io.records import MAX_LINE_BYTES, OVERLONG_HEAD, OverlongLine
from .follow_bytes import PipeSpool, open_bytes

__all__ = ["DueSizes", "FollowedInput", "TakenLines"]

_BOM = b"\xef\xbb\xbf"
_TICK = 0.05  # the longest the due-size thread sleeps before it reads the clock again
_COMPACT = 1 << 20  # bytes handed out before the buffer is shifted down


class FollowedInput:
    """A followed input's lines, each with the byte offset it ends at.

    ``text``: the stream the run opened (a file or stdin, not read yet); ``path``: the
    ``--input`` it was opened by (``-``: stdin, which ends when it closes). When it has
    a file descriptor whose size can be told, its bytes are read here and split after
    each ``\\n`` (so ``\\r\\n`` too; a lone ``\\r`` does not end a line here, unlike a
    batch run's reader: whether it ended one would wait on the byte after it, which
    another event may write, or which may never come), decoded
    as UTF-8 with invalid bytes kept (``surrogateescape``) and a leading byte-order
    mark dropped; :attr:`sized` is then true. Otherwise (a stream without a
    descriptor) lines come from ``text``, :meth:`size_now` is None, and the follower
    falls back to closing a due step once the reader has caught up.
    """

    def __init__(self, text: Any, path: str = "-") -> None:
        self.text = text
        self.end = 0  # the byte offset at which the last line handed out ends
        self._buf = bytearray()  # bytes read and not handed out start at _buf[_start]
        self._start = 0
        self._base = 0  # the input offset of _buf[0]
        # _buf[_start:_scanned] holds no line end: each byte is searched once (review
        # 107: a long stretch with no line end was searched again at every read, 200 MB
        # of a crash's zero-filled tail took 79 s, quadratic)
        self._scanned = 0
        self._stdin = path == "-"
        self._partial = ""  # the fallback's line so far
        #: a line too long to read, being read past: its first bytes and its length so far
        self._long: tuple[bytes, int] | None = None
        self._last = b""  # the last byte read past (a \r that a \n may follow)
        self._text_ended = False
        fd = _plain_fd(text)
        self._source = open_bytes(fd, None if path == "-" else path) if fd is not None else None
        #: Whether reading all there is now says nothing of what is to come: a pipe (its
        #: writer may be slow), not a file or a stream read to its end.
        self.waits_for_writers = isinstance(self._source, PipeSpool)

    @property
    def sized(self) -> bool:
        """Whether :meth:`size_now` tells the input's size."""
        return self._source is not None

    def size_now(self) -> int | None:
        """How many bytes the input holds now (None: it cannot say). Raises
        :class:`~dpstream.errors.StateError` for a followed file that was rotated."""
        return self._source.size_now() if self._source is not None else None

    def backlog_size(self) -> int | None:
        """What the input held when the run started (for the steps already due then): a
        file's size; for a pipe, nothing it can vouch for
        (:meth:`dpstream.run.follow_bytes.PipeSpool.backlog_size`). None: it cannot say."""
        return self._source.backlog_size() if self._source is not None else None

    def consumed(self) -> int:
        """Where what was read ends (lines handed out, and a partial line after them):
        every line that ends within it has been handed out."""
        if self._source is None:
            return self.end
        return self._base + len(self._buf)

    def readline(self) -> str:
        """The next whole line; "" when there is none now, or at the end of the input
        (then, once, what is left of a last line without its line end). A line longer
        than :data:`~dpstream.io.records.MAX_LINE_BYTES` is an
        :class:`~dpstream.io.records.OverlongLine`: its first bytes, the rest read past
        and never held (as a batch run's reader does)."""
        if self._source is None:
            return self._text_line()
        while True:
            line = self._cut(False)
            if line is not None:
                return self._line(line)
            data = self._source.read()
            if not data:
                if self._source.at_end():
                    line = self._cut(True)
                    return self._line(line) if line is not None else ""
                return ""
            if self._start >= _COMPACT:
                del self._buf[: self._start]
                self._base += self._start
                self._scanned -= self._start
                self._start = 0
            self._buf += data

    def _text_line(self) -> str:
        """The fallback's next whole line, from ``text`` (which splits at line ends)."""
        while True:
            piece = self.text.readline()
            if piece == "":
                self._text_ended = True
                line = ""
                if self._stdin:  # the end: the last line, without its line end
                    line, self._partial = self._partial, ""
            elif (self._partial + piece).endswith("\n"):
                line, self._partial = self._partial + piece, ""
            else:
                self._partial += piece
                continue
            self.end += len(line.encode("utf-8", "surrogateescape"))
            return line

    def at_end(self) -> bool:
        """Whether the input has ended (stdin closed) and every line was handed out."""
        if self._source is None:
            return self._stdin and self._text_ended and not self._partial
        return self._source.at_end() and self._start == len(self._buf)

    def check(self) -> None:
        """Refuse a followed file that was rotated (see :mod:`dpstream.run.follow_bytes`)."""
        if self._source is not None:
            self._source.check()

    def _cut(self, ended: bool) -> bytes | None:
        """The next whole line of the buffer (with ``ended``, what is left too), or None.
        Of a line too long to read, only its first bytes are kept (:attr:`_long`)."""
        buf, start = self._buf, self._start
        if start == len(buf):
            if ended and self._long is not None:  # the input ends inside it
                self.end = self._base + start
                return b""
            return None
        nl = buf.find(b"\n", max(start, self._scanned))
        if nl >= 0:
            stop = nl + 1
        elif ended:
            stop = len(buf)
        else:
            self._scanned = len(buf)
            if self._long is not None or len(buf) - start > MAX_LINE_BYTES:
                self._read_past(len(buf))  # (review of 2026-11-28: a 1 GB line was held)
            return None
        line = bytes(buf[start:stop])
        self._start = stop
        self.end = self._base + stop
        return line

    def _read_past(self, stop: int) -> None:
        """Drop the buffer's bytes up to ``stop``, of a line too long to read: its first
        bytes and its length so far are kept in :attr:`_long`."""
        head, length = self._long if self._long is not None else (b"", 0)
        start = self._start
        if len(head) < OVERLONG_HEAD:
            head += bytes(self._buf[start : min(stop, start + OVERLONG_HEAD - len(head))])
        self._long = (head, length + stop - start)
        if stop > start:
            self._last = bytes(self._buf[stop - 1 : stop])
        self._start = self._scanned = stop

    def _line(self, line: bytes) -> str:
        """A line as text; the end of a line too long to read as its OverlongLine."""
        if self._long is None:
            return self._decode(line)
        head, length = self._long
        self._long = None
        body = line.rstrip(b"\r\n")
        if line == b"\n" and self._last == b"\r":
            length -= 1  # (a \r\n split between what was dropped and the rest)
        self._last = b""
        text = head.decode("utf-8", "surrogateescape")
        return OverlongLine(text, length + len(body))

    def _decode(self, line: bytes) -> str:
        if self.end == len(line) and line.startswith(_BOM):  # the input's first line
            line = line[len(_BOM) :]
        return line.decode("utf-8", "surrogateescape")

    def close(self) -> None:
        """Stop reading the descriptor (it stays the run's to close): a reader thread still
        waiting then reads nothing, even once the number is another file's."""
        if self._source is not None:
            self._source.let_go()


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

    Step t's size is what ``size_now`` gave at the first look at the clock that found t
    due: at its due instant, give or take the thread's wake-up. The steps already due
    at the first look (when the run starts) get ``backlog_size()``, what the input held
    then (:meth:`FollowedInput.backlog_size`). The follower asks :meth:`size_of`;
    sizes never shrink as t grows.
    """

    def __init__(
        self,
        clock: Any,
        first_t: int,
        until: int,
        size_now: Callable[[], int | None],
        now: Callable[[], Any],
        stop: threading.Event,
        backlog_size: Callable[[], int | None] | None = None,
    ) -> None:
        self._clock, self._until, self._size_now, self._now = clock, until, size_now, now
        self._backlog_size = backlog_size or size_now
        self._stop = stop
        self._t = first_t
        self._ranges: deque[tuple[int, int]] = deque()  # (last step, size), in step order
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="dpstream-due-sizes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            first = True
            while self._t <= self._until and not self._stop.is_set():
                now = self._now()
                due = self._clock.due(now)
                if due >= self._t:
                    size = self._backlog_size() if first else self._size_now()
                    assert size is not None
                    last = min(due, self._until)
                    with self._lock:
                        self._ranges.append((last, size))
                    self._t = last + 1
                    first = False
                    continue
                first = False
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
