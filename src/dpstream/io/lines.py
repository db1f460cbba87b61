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

from .records import MAX_LINE_BYTES, OVERLONG_HEAD, OverlongLine, raw_bytes

__all__ = ["LineBlock", "line_blocks", "line_texts", "arrow_line_block", "BOM", "CHUNK_LINES"]

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
    #: a line longer than MAX_LINE_BYTES: its index -> its length (``buf`` holds its
    #: first bytes; ``text`` gives it as an :class:`~dpstream.io.records.OverlongLine`)
    overlong: dict[int, int] | None = None


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


def line_texts(
    stream: Any, name: str, chunk_bytes: int = 1 << 20, *, ends: bool = False
) -> Iterator[str]:
    """Each line of ``stream`` as text, as :func:`line_blocks` cuts them (for the readers
    that parse one record at a time), with its terminator when ``ends`` (CSV: a quoted
    field may hold one) and without it otherwise: a line longer than
    :data:`~dpstream.io.records.MAX_LINE_BYTES` is an
    :class:`~dpstream.io.records.OverlongLine` (never with its terminator), never held
    whole."""
    binary = getattr(stream, "buffer", None)
    over_bytes = binary is not None and hasattr(binary, "read1")
    for block in line_blocks(stream, name, chunk_bytes):
        if not ends or not over_bytes:  # (a stream of text: its lines as they came)
            yield from map(block.text, range(block.starts.size))
            continue
        starts = block.starts.tolist()
        nexts = [*starts[1:], len(block.buf)]
        long = block.overlong or {}
        for i, (a, b) in enumerate(zip(starts, nexts, strict=True)):
            # (a block's last line ends at the buffer's end: blocks are cut after a
            # terminator, and the input's last line may have none)
            yield block.text(i) if i in long else block.buf[a:b].decode("utf-8", "surrogateescape")


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
    start is dropped, as ``utf-8-sig`` does). A line longer than
    :data:`~dpstream.io.records.MAX_LINE_BYTES` is a block of its own that holds its
    first bytes only: the rest is read past, never held (a ``.gz`` of 1 MB held a
    1 GB line)."""
    import gzip
    import zlib

    def read() -> bytes:
        try:
            return binary.read1(chunk_bytes)  # type: ignore[no-any-return]
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"input {name!r}: the compressed file is truncated or corrupt "
                f"after line {done} ({exc})"
            ) from None

    done = 0
    tail: list[bytes] = []  # the line read in part, in its pieces: joined once, when whole
    held = 0  # the bytes in tail
    at_start = True
    pending: bytes | None = None  # bytes read after an overlong line's end
    while True:
        data = pending or read()
        pending = None
        if (
            data
            and not at_start
            and b"\n" not in data
            and b"\r" not in data[:-1]
            and not (tail and tail[-1].endswith(b"\r"))  # (a lone \r ends a line now)
        ):
            tail.append(data)  # (review 103: joined at every read, a 600 MB line took
            held += len(data)  # 278 s, quadratic; now each byte is copied once more)
            if held > MAX_LINE_BYTES and not data.endswith(b"\r"):
                head = b"".join(tail)[:OVERLONG_HEAD]
                length, pending = _read_past_line(read, held)
                yield _overlong_block(head, length, done)
                done += 1
                tail, held = [], 0
                if pending is None:
                    return
            continue
        buf = b"".join([*tail, data]) if tail else data
        tail, held = [], 0
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
            tail, held = [buf], len(buf)
            continue
        if cut + 1 < len(buf):
            tail = [buf[cut + 1 :]]
            held = len(tail[0])
        block = _bytes_block(buf[: cut + 1], done)
        done += block.starts.size
        yield block


def _read_past_line(read: Callable[[], bytes], length: int) -> tuple[int, bytes | None]:
    """Read to the end of a line ``length`` bytes of which are read: its length, and the
    bytes read after its terminator (None: the input ended with it)."""
    lf_next = False  # the line ended with \r at the end of a read: a \n may follow
    while True:
        data = read()
        if not data:
            return length, None
        if lf_next:
            return length, data[1:] if data.startswith(b"\n") else data
        ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        if not ends:
            length += len(data)
            continue
        at = min(ends)
        length += at
        after = at + 1
        if data[at] == 13:  # \r: with a \n after it, one terminator
            if after == len(data):
                lf_next = True
                continue
            if data[after] == 10:
                after += 1
        return length, data[after:]


def _overlong_block(head: bytes, length: int, done: int) -> LineBlock:
    """The block of one line too long to read: its first bytes, and its length."""
    block = _block_of(head, np.zeros(1, np.int64), np.full(1, len(head), np.int64), done)
    block.overlong = {0: length}
    return block


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
    starts, ends = starts.astype(np.int64), ends.astype(np.int64)
    lengths = ends - starts
    if lengths.size and int(lengths.max()) > MAX_LINE_BYTES:  # (one that came whole)
        return _heads_only(buf, starts, ends, done)
    return _block_of(buf, starts, ends, done)


def _heads_only(buf: bytes, starts: np.ndarray, ends: np.ndarray, done: int) -> LineBlock:
    """The block with each line longer than :data:`MAX_LINE_BYTES` cut to its first
    bytes, as when it is read past (:func:`_overlong_block`): what a record's digest
    reads never depends on how the input came in reads. Each line keeps its own
    terminator (CSV reads them)."""
    pieces, overlong = [], {}
    new_starts, new_ends, at = [], [], 0
    firsts = starts.tolist()
    nexts = [*firsts[1:], len(buf)]
    for i, (a, b, nxt) in enumerate(zip(firsts, ends.tolist(), nexts, strict=True)):
        cut = b
        if b - a > MAX_LINE_BYTES:
            overlong[i] = b - a
            cut = a + OVERLONG_HEAD
        pieces += [buf[a:cut], buf[b:nxt]]  # the line (or its head), its terminator
        new_starts.append(at)
        new_ends.append(at + cut - a)
        at += cut - a + nxt - b
    block = _block_of(
        b"".join(pieces), np.asarray(new_starts, np.int64), np.asarray(new_ends, np.int64), done
    )
    block.overlong = overlong
    return block


def _block_of(buf: bytes, starts: np.ndarray, ends: np.ndarray, done: int) -> LineBlock:
    """The block of lines ``buf[starts[i]:ends[i]]``: ``strict`` when ``buf`` is valid
    UTF-8; ``text(i)`` decodes line i with ``surrogateescape`` (a line too long to read
    as an :class:`~dpstream.io.records.OverlongLine`, once the block's ``overlong``
    says so)."""
    strict = buf.isascii()
    if not strict:
        try:
            buf.decode("utf-8")
            strict = True
        except UnicodeDecodeError:
            pass

    def text(i: int) -> str:
        line = buf[int(starts[i]) : int(ends[i])].decode("utf-8", "surrogateescape")
        if block.overlong and i in block.overlong:
            return OverlongLine(line, block.overlong[i])
        return line

    block = LineBlock(buf, starts, ends, strict, text, done)
    return block


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
