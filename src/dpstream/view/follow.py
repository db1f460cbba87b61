"""Following a releases file as it grows: complete lines only, from a byte offset.

The writer (``dpstream run``) appends one line per time step and flushes it;
a reader polling the file may see the last line half written. A
:class:`FileFollower` hands out only complete lines (ending in a newline) and
keeps its offset at the start of an incomplete one, so that line is read
again, whole, at the next poll. It also notices when the file is replaced or
rewritten (a new run over the same path, a resumed run that truncated it, a
rewrite in place of the same length): then it starts again from the beginning.

Memory: one line at a time (plus one read block), never the whole file; a
line longer than ``max_line_bytes`` is skipped without being held.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Line", "FileFollower", "iter_lines", "MAX_LINE_BYTES"]

#: A line longer than this (bytes) is reported as too long and skipped; a
#: release of 10^6 items of 20-character names is about 30 MB.
MAX_LINE_BYTES = 256 * 1024 * 1024

_BLOCK = 1 << 20
_SIGNATURE_BYTES = 64
#: The first bytes of the file kept to tell a rewrite in place (another run's first
#: release) from an append.
_HEAD_BYTES = 256


@dataclass(frozen=True)
class Line:
    """One complete line: its bytes (``None`` if longer than the limit), number and end offset."""

    data: bytes | None
    number: int
    end: int


def iter_lines(
    fh: object,
    start: int,
    end: int | None,
    first_number: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[Line]:
    """The complete lines of binary file ``fh`` from byte ``start``, up to byte ``end``.

    A last line without a newline (before ``end`` or the end of the file) is
    not yielded. ``end=None`` reads to the end of the file as it is now.
    """
    fh.seek(start)  # type: ignore[attr-defined]
    pos = start
    number = first_number
    parts: list[bytes] = []
    held = 0
    too_long = False
    while end is None or pos < end:
        want = _BLOCK if end is None else min(_BLOCK, end - pos)
        block = fh.read(want)  # type: ignore[attr-defined]
        if not block:
            return
        i = 0
        while True:
            j = block.find(b"\n", i)
            if j < 0:
                rest = block[i:]
                if not too_long:
                    held += len(rest)
                    if held > max_line_bytes:
                        too_long, parts, held = True, [], 0
                    else:
                        parts.append(rest)
                pos += len(rest)
                break
            piece = block[i : j + 1]
            pos += len(piece)
            if too_long or held + len(piece) > max_line_bytes:
                yield Line(None, number, pos)
            else:
                parts.append(piece)
                yield Line(b"".join(parts), number, pos)
            number += 1
            parts, held, too_long = [], 0, False
            i = j + 1


class FileFollower:
    """Reads the complete lines appended to ``path`` since the last call.

    Attributes:
        offset: bytes consumed (the end of the last complete line read).
        lines: complete lines consumed.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES
    ) -> None:
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self.offset = 0
        self.lines = 0
        self._ident: tuple[int, int] | None = None
        self._signature = b""
        self._head = b""
        #: a digest of the bytes read (0..offset), to tell a rewrite of the same length
        self._digest = hashlib.blake2b(digest_size=32)
        #: (mtime_ns, ctime_ns, size) of the file when it was last read or verified
        self._stamp: tuple[int, int, int] | None = None

    def _forget(self) -> None:
        """Start again from the beginning (the file was replaced or rewritten)."""
        self.offset, self.lines, self._signature, self._head = 0, 0, b"", b""
        self._digest = hashlib.blake2b(digest_size=32)
        self._stamp = None

    def check(self) -> str:
        """``"missing"``, ``"not-regular"`` (a pipe or a device: never opened, as opening
        a pipe waits for a writer and a device never ends), ``"reset"`` (replaced or
        rewritten: read again from 0) or ``"same"``.

        A rewrite in place (``run --force``, ``cp``) keeps the inode and may grow past
        the offset within a poll; it is told by the bytes before the offset or by the
        file's first bytes (another run's first release). One that leaves the file no
        longer than what was read (a corrected run of the same length: same first
        bytes, same tail) is told by its time stamps: when the file's mtime or ctime
        changed and it has not grown past the offset, the bytes read are read again
        and compared with a digest of them kept as they were read. A file that grows
        is never read again: its new bytes are past the offset."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "missing"
        if not stat.S_ISREG(st.st_mode):
            if self._ident is not None or self.offset:
                self._ident = None
                self._forget()
            return "not-regular"
        ident = (st.st_dev, st.st_ino)
        replaced = self._ident is not None and ident != self._ident
        if not replaced and self.offset:
            replaced = (
                st.st_size < self.offset
                or self._read_signature() != self._signature
                or self._read_head(len(self._head)) != self._head
            )
            stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if not replaced and st.st_size <= self.offset and stamp != self._stamp:
                replaced = not self._same_as_read()  # touched, or rewritten in place?
                if not replaced:
                    self._stamp = stamp  # verified: not read again until it changes again
        self._ident = ident
        if replaced:
            self._forget()
            return "reset"
        return "same"

    def read_lines(self) -> Iterator[Line]:
        """The complete lines after :attr:`offset`, advancing it line by line."""
        try:  # (not blocking: a pipe put in the file's place since check() is refused)
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return
        with os.fdopen(fd, "rb") as fh:
            try:
                for line in iter_lines(fh, self.offset, None, self.lines + 1, self.max_line_bytes):
                    start, self.offset, self.lines = self.offset, line.end, line.number
                    if line.data is not None:
                        self._digest.update(line.data)
                        self._signature = (self._signature + line.data)[-_SIGNATURE_BYTES:]
                    else:  # not held: its bytes are read again for the digest (rare)
                        self._hash_range(self._digest, start, line.end, fh)
                        self._signature = self._read_signature(fh)
                    if len(self._head) < min(self.offset, _HEAD_BYTES):
                        self._head = self._read_head(min(self.offset, _HEAD_BYTES), fh)
                    yield line
            finally:
                # the time stamps of what was read: a later change that does not grow
                # the file past the offset is checked against the digest (check())
                st = os.fstat(fh.fileno())
                self._stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    def _same_as_read(self) -> bool:
        """Whether the file's first :attr:`offset` bytes are still those read (re-read and
        hashed: only when its time stamps changed and it did not grow)."""
        digest = hashlib.blake2b(digest_size=32)
        try:  # (not blocking: a pipe put in the file's place is not read)
            fh = os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK), "rb")
        except OSError:
            return False
        try:
            with fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    return False
                if not self._hash_range(digest, 0, self.offset, fh):
                    return False
        except OSError:
            return False
        return digest.digest() == self._digest.digest()

    @staticmethod
    def _hash_range(digest: Any, start: int, end: int, fh: Any) -> bool:
        """Add bytes ``start..end`` of ``fh`` to ``digest`` (its position kept); False if
        the file ends before ``end``."""
        pos = fh.tell()
        try:
            fh.seek(start)
            while start < end:
                block = fh.read(min(_BLOCK, end - start))
                if not block:
                    return False
                digest.update(block)
                start += len(block)
            return True
        finally:
            fh.seek(pos)

    def _read_head(self, n: int, fh: object = None) -> bytes:
        """The file's first ``n`` bytes (to tell another run's file from this one)."""
        return self._read_range(0, n, fh)

    def _read_signature(self, fh: object = None) -> bytes:
        """The bytes just before :attr:`offset` (to tell an append from a rewrite)."""
        return self._read_range(max(0, self.offset - _SIGNATURE_BYTES), self.offset, fh)

    def _read_range(self, start: int, end: int, fh: object = None) -> bytes:
        """The file's bytes from ``start`` to ``end`` (b"" when it cannot be read), from
        ``fh`` when given (its position kept), else from the file opened anew."""
        if end <= start:
            return b""
        try:
            if fh is None:
                with open(self.path, "rb") as own:
                    own.seek(start)
                    return own.read(end - start)
            pos = fh.tell()  # type: ignore[attr-defined]
            fh.seek(start)  # type: ignore[attr-defined]
            data = fh.read(end - start)  # type: ignore[attr-defined]
            fh.seek(pos)  # type: ignore[attr-defined]
            return bytes(data)
        except OSError:
            return b""
