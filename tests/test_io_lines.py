"""The line reader of binary inputs (:func:`dpstream.io.lines.line_blocks`): the same
lines whatever the size of the reads, a line read in many pieces included.

Review 103: the part of a line read so far was joined to each new read, so one long
line cost time quadratic in its length (a 600 KB gzip of one 600 MB line: 278 s). The
pieces are now kept and joined once, when the line is whole; these tests hold the
lines to those of one read of the whole input, for reads down to one byte.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from dpstream.io.lines import line_blocks


class _Reads(io.RawIOBase):
    """A binary stream that gives at most ``size`` bytes a read (as a pipe may)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        piece = self.data[self.at : self.at + min(self.size, n if n > 0 else self.size)]
        self.at += len(piece)
        return piece


class _Text:
    def __init__(self, data: bytes, size: int) -> None:
        self.buffer = _Reads(data, size)


def _lines(data: bytes, size: int, chunk: int) -> list[bytes]:
    out = []
    for block in line_blocks(_Text(data, size), "test", chunk):
        out += [
            block.buf[a:b] for a, b in zip(block.starts.tolist(), block.ends.tolist(), strict=True)
        ]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_lines_are_the_same_for_any_size_of_read(seed):
    rng = np.random.default_rng(seed)  # test data
    pieces = []
    for _ in range(int(rng.integers(1, 30))):
        length = int(rng.choice([0, 1, 2, 5, 40, 3000]))
        pieces.append(bytes(rng.integers(97, 123, length, dtype=np.uint8)))
    data = (b"\xef\xbb\xbf" if seed % 2 else b"") + b"\n".join(pieces)
    data += b"\n" if seed % 3 else b""
    body = data[3:] if seed % 2 else data
    want = body.split(b"\n")
    if body.endswith(b"\n"):
        want.pop()
    if not body:
        want = []
    assert _lines(data, len(data) + 1, 1 << 20) == want
    for size in (1, 2, 3, 7, 64, 4096):
        assert _lines(data, size, size) == want, size


def test_a_long_line_read_in_many_pieces_is_one_line():
    line = b"x" * 200_000
    data = b'{"a": 1}\n' + line + b"\nend\n"
    assert _lines(data, 1000, 1000) == [b'{"a": 1}', line, b"end"]


@pytest.mark.parametrize("end", [b"\r", b"\r\n", b"\n"])
def test_lines_ended_by_any_terminator_come_in_blocks_of_the_read_size(end):
    """Review 111: a file of lone-\\r line ends was one block (blocks were cut at \\n only),
    so a 78 MB input took 1.27 GB. Every terminator cuts blocks now, and a \\r\\n split
    between two reads stays one line end (the lines are those of the whole input)."""
    lines = [b'{"t": %d, "items": ["a"]}' % i for i in range(2000)]
    data = end.join(lines) + end
    for size in (1, 7, 64, 1000):
        blocks = list(line_blocks(_Text(data, size), "test", size))
        assert len(blocks) > len(data) // (2 * max(size, 40))  # never one block
        assert max(len(b.buf) for b in blocks) <= size + 2 * max(len(x) for x in lines)
        assert _lines(data, size, size) == lines
