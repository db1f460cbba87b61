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


def _event(length: int) -> bytes:
    """A valid event line of exactly ``length`` bytes (at least 26)."""
    pad = length - len(b'{"t": 1, "items": [""]}')
    return b'{"t": 1, "items": ["' + b"a" * pad + b'"]}'


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_a_line_longer_than_the_limit_is_an_invalid_record_in_every_reader(monkeypatch, end):
    """A line longer than MAX_LINE_BYTES is the invalid record "line too long", its
    first OVERLONG_HEAD bytes what the digest reads, in the chunked reader (for reads of
    any size: the line is read past, or caught by the parser when it came whole) and in
    the record reader of text; the lines around it keep their numbers and records. The
    expectation is the input split at its terminators, line by line."""
    from dpstream.io import jsonl, lines, records

    for module in (jsonl, lines, records):
        monkeypatch.setattr(module, "MAX_LINE_BYTES", 100, raising=False)
        monkeypatch.setattr(module, "OVERLONG_HEAD", 8, raising=False)
    sizes = [30, 150, 100, 101, 40, 999, 26]
    data = end.join(_event(n) for n in sizes) + end + _event(120)  # the last one unended
    want = []
    for k, n in enumerate([*sizes, 120]):
        line = _event(n)
        if n > 100:
            message = f"line too long ({n:,} bytes, more than 100): not read"
            want.append((k + 1, message, line[:8]))
        else:
            want.append((k + 1, None, line))

    def chunked(size: int) -> list[tuple]:
        out = []
        for ch in jsonl.read_jsonl_chunks(_Text(data, size), "test", chunk_bytes=size):
            for i in range(len(ch)):
                raw = ch.buf[int(ch.starts[i]) : int(ch.ends[i])]
                out.append((int(ch.lines[i]), ch.errors.get(i), raw))
        return out

    for size in (1, 7, 64, 1000, 1 << 16):
        assert chunked(size) == want, size
    for size in (1, 7, 64, 1000, 1 << 16):  # the record reader (timestamps, --implicit-time)
        got = [
            (r.line, r.error, r.raw)
            for r in jsonl.read_jsonl(lines.line_texts(_Text(data, size), "test", size))
        ]
        assert got == want, size


def test_a_gzip_of_one_huge_line_is_read_in_bounded_memory(tmp_path):
    """A 1 MB .gz held a 1 GB line whole: 6.4 GB to parse it, and 57 s. Here a 256 MB
    line (a 256 KB file) in a fresh process (its own peak, VmHWM): before, about 1.6 GB
    (6.4 times the line, as measured on the 1 GB one); now the line is read past in
    blocks and the run peaks near its floor (about 110-170 MB). The test allows 400 MB,
    a quarter of the peak before."""
    import gzip

    from .conftest import fixed_key, run_peak

    data = tmp_path / "bomb.jsonl.gz"
    with gzip.open(data, "wb", compresslevel=6) as fh:
        fh.write(b'{"t": 1, "items": ["a"]}\n{"t": 1, "items": ["')
        block = b"a" * (1 << 20)
        for _ in range(256):
            fh.write(block)
        fh.write(b'"]}\n{"t": 2, "items": ["b"]}\n')
    assert data.stat().st_size < 1 << 20
    key = tmp_path / "k.key"
    fixed_key("lines").save(key)
    out = tmp_path / "out.jsonl"
    argv = [
        "run", "--quiet", "-m", "unknown", "--max-items", "2", "--rho", "1",
        "--threshold-delta", "1e-6", "-T", "2", "--key-file", str(key), "-i", str(data),
        "-o", str(out), "--ledger", f"{out}.ledger", "--on-invalid", "skip",
        "--max-invalid", "0.5", "--log-format", "json",
    ]  # fmt: skip
    status, peak, err = run_peak(argv)
    assert status == 0, err
    assert peak < 400, peak
    assert "line too long" in err
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_lines_beside_one_too_long_keep_their_own_terminators(monkeypatch, end):
    """With their terminators (as CSV reads them: a quoted field may hold one), the lines
    of a block that also holds a line too long to read are the input's, terminator
    and all, whether the long line was read past or came whole in one read."""
    from dpstream.io import jsonl, lines, records
    from dpstream.io.records import OverlongLine

    for module in (jsonl, lines, records):
        monkeypatch.setattr(module, "MAX_LINE_BYTES", 100, raising=False)
        monkeypatch.setattr(module, "OVERLONG_HEAD", 8, raising=False)
    rows = [b"a,1", b"b" * 150, b'c,"x', b'y"', b"d" * 101, b"e,2"]
    data = end.join(rows) + end
    want = [(r + end).decode() if len(r) <= 100 else r[:8].decode() for r in rows]
    for size in (1, 7, 64, 1000, 1 << 16):
        got = list(lines.line_texts(_Text(data, size), "test", size, ends=True))
        assert got == want, size
        assert [isinstance(x, OverlongLine) for x in got] == [len(r) > 100 for r in rows]
