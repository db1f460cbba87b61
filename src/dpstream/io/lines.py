"""An input as blocks of whole lines: their bytes, and where each line starts and ends.

Layer 6 of dpstream (an edge). :func:`line_blocks` reads a text stream for the
chunked JSON Lines parser (:mod:`dpstream.io.jsonl`): a stream over bytes (a
file, a ``.gz``, stdin) as bytes, as much as is there at each read, cut after
its last line feed; another text stream a chunk of lines at a time. Line
terminators are ``\\n``, ``\\r\\n`` or ``\\r``, as text mode with ``newline=""``
reads them; a byte-order mark that opens the input is dropped (``utf-8-sig``).
A truncated or corrupt ``.gz`` is an error naming the last line read.
:func:`arrow_line_block` makes a block of lines another reader has already cut
(an Arrow array of them: the lines a Spark task reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .records import raw_bytes

__all__ = ["LineBlock", "line_blocks", "arrow_line_block", "BOM", "CHUNK_LINES"]

#: Lines per block of a text stream that is not over bytes.
CHUNK_LINES = 1 << 15


@dataclass
class LineBlock:
    """Consecutive whole lines of the input: line ``i`` is ``buf[starts[i]:ends[i]]``
    (without its terminator), ``text(i)`` its text; ``strict``: ``buf`` is valid
    UTF-8; ``done``: the input's lines before the block."""

    buf: bytes
    starts: np.ndarray
    ends: np.ndarray
    strict: bool
    text: Callable[[int], str]
    done: int


def line_blocks(stream: Any, name: str, chunk_bytes: int) -> Iterator[LineBlock]:
    """The lines of ``stream`` in blocks of about ``chunk_bytes`` bytes (``name``
    names the input in errors)."""
    binary = getattr(stream, "buffer", None)
    if binary is not None and hasattr(binary, "read1"):
        yield from _binary_blocks(binary, name, chunk_bytes)
        return
    done = 0
    while True:
        lines = _read_lines(stream, name, chunk_bytes, done)
        if not lines:
            return
        yield _text_block(lines, done)
        done += len(lines)


def _read_lines(stream: Any, name: str, hint: int, done: int) -> list[str]:
    """The next lines of a text stream (about ``hint`` bytes, or :data:`CHUNK_LINES`
    lines); a truncated or corrupt ``.gz`` is an error naming the last line read."""
    import gzip
    import zlib

    try:
        if hasattr(stream, "readlines"):
            return stream.readlines(hint)
        out = []
        for line in stream:
            out.append(line)
            if len(out) >= CHUNK_LINES:
                break
        return out
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(
            f"input {name!r}: the compressed file is truncated or corrupt after line {done} ({exc})"
        ) from None


BOM = b"\xef\xbb\xbf"


def _binary_blocks(binary: Any, name: str, chunk_bytes: int) -> Iterator[LineBlock]:
    """The blocks of a binary stream, each of whole lines (a byte-order mark at the
    start is dropped, as ``utf-8-sig`` does)."""
    import gzip
    import zlib

    done = 0
    tail: list[bytes] = []  # the line read in part, in its pieces: joined once, when whole
    at_start = True
    while True:
        try:
            data = binary.read1(chunk_bytes)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"input {name!r}: the compressed file is truncated or corrupt "
                f"after line {done} ({exc})"
            ) from None
        if (
            data
            and not at_start
            and b"\n" not in data
            and b"\r" not in data[:-1]
            and not (tail and tail[-1].endswith(b"\r"))  # (a lone \r ends a line now)
        ):
            tail.append(data)  # (review 103: joined at every read, a 600 MB line took
            continue  # 278 s, quadratic; now each byte is copied once more, when whole)
        buf = b"".join([*tail, data]) if tail else data
        tail = []
        if at_start and (len(buf) >= 3 or not data):
            at_start = False
            if buf.startswith(BOM):  # a byte-order mark opens the input (utf-8-sig)
                buf = buf[3:]
        if not data:
            if buf:
                yield _bytes_block(buf, done)
            return
        # the last line end: a \n, or a lone \r (one not last in the buffer, where a
        # \n may follow; review 111: a file of \r endings was one block, its memory
        # that of the whole input)
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1))
        if at_start or cut < 0:
            tail = [buf]
            continue
        if cut + 1 < len(buf):
            tail = [buf[cut + 1 :]]
        block = _bytes_block(buf[: cut + 1], done)
        done += block.starts.size
        yield block


def _bytes_block(buf: bytes, done: int) -> LineBlock:
    """Whole lines of bytes (the last one may lack its terminator)."""
    if b"\r" not in buf:
        ends = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10)
        if not buf.endswith(b"\n"):
            ends = np.append(ends, len(buf))
        starts = np.empty_like(ends)
        if ends.size:
            starts[0] = 0
            starts[1:] = ends[:-1] + 1
    else:  # terminators \n, \r\n or \r, as text mode with newline="" reads them
        import re

        st, en, pos = [], [], 0
        for m in re.finditer(rb"\r\n|\r|\n", buf):
            st.append(pos)
            en.append(m.start())
            pos = m.end()
        if pos < len(buf):
            st.append(pos)
            en.append(len(buf))
        starts, ends = np.asarray(st, np.int64), np.asarray(en, np.int64)
    return _block_of(buf, starts.astype(np.int64), ends.astype(np.int64), done)


def _block_of(buf: bytes, starts: np.ndarray, ends: np.ndarray, done: int) -> LineBlock:
    """The block of lines ``buf[starts[i]:ends[i]]``: ``strict`` when ``buf`` is valid
    UTF-8; ``text(i)`` decodes line i with ``surrogateescape``."""
    strict = buf.isascii()
    if not strict:
        try:
            buf.decode("utf-8")
            strict = True
        except UnicodeDecodeError:
            pass

    def text(i: int) -> str:
        return buf[int(starts[i]) : int(ends[i])].decode("utf-8", "surrogateescape")

    return LineBlock(buf, starts, ends, strict, text, done)


def _text_block(lines: list[str], done: int) -> LineBlock:
    """Lines of text (each with its terminator, but maybe the last)."""
    bufs = [raw_bytes(line.rstrip("\r\n")) for line in lines]
    sizes = np.fromiter(map(len, bufs), np.int64, len(bufs))
    ends = np.cumsum(sizes + 1) - 1
    buf = b"\n".join(bufs) + b"\n"
    strict = True
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        strict = False
    return LineBlock(buf, ends - sizes, ends, strict, lambda i: lines[i], done)


def arrow_line_block(lines: Any, done: int = 0) -> LineBlock:
    """A block of the lines in ``lines``, an Arrow binary (or string) array without
    nulls, each line without its terminator: their bytes joined by line feeds in one
    buffer, as :func:`line_blocks` gives a file's. ``text(i)`` decodes line i as
    ``bytes.decode("utf-8", "surrogateescape")`` does, as the lines' own reader would."""
    import pyarrow as pa

    if lines.null_count:
        raise ValueError("a line is null")
    if pa.types.is_large_binary(lines.type) or pa.types.is_large_string(lines.type):
        width = np.int64
    else:
        width = np.int32
    n = len(lines)
    if n == 0:
        return LineBlock(b"", np.zeros(0, np.int64), np.zeros(0, np.int64), True, str, done)
    _, off_buf, data_buf = lines.buffers()
    offsets = np.frombuffer(
        off_buf, dtype=width, count=n + 1, offset=lines.offset * width().itemsize
    )
    offsets = offsets.astype(np.int64)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    data = data[int(offsets[0]) : int(offsets[-1])]
    offsets -= offsets[0]
    # line i's bytes move right by i (the line feeds before it), and a line feed follows it
    buf = np.insert(data, offsets[1:], 10).tobytes()
    shift = np.arange(n, dtype=np.int64)
    return _block_of(buf, offsets[:-1] + shift, offsets[1:] + shift, done)
