"""Each input format's one parser gives the same records as chunks and one at a time.

:func:`dpstream.io.reading.read_chunks` (what a batch run reads) against
:func:`dpstream.io.reading.read_events` (the record-at-a-time readers), in every
time mode and format: the same records, lines, steps, items, user ids, messages
and raw bytes. The integer-step JSON Lines case goes through the chunked parser
(Arrow where it applies), the others through the record fallback inside each
format's module.
"""

from __future__ import annotations

import datetime as dt
import io
import json

import numpy as np
import pytest

from dpstream.clock import StepClock
from dpstream.io.reading import read_chunks, read_events

CLOCK = StepClock(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), dt.timedelta(hours=1))

JSONL = "\n".join(
    [
        '{"t": 1, "items": ["a", "b"], "ts": "2026-01-01T00:10:00Z", "u": "x"}',
        '{"t": 2, "items": ["a", 5], "ts": "2026-01-01T01:10:00Z", "u": "y"}',
        "",
        '["c"]',
        '{"t": 0, "items": ["a"], "ts": "2025-12-31T23:00:00Z", "u": ""}',
        "not json",
        '{"t": 3, "items": ["\\ud800"], "ts": "2026-01-01T02:00:00Z", "u": "x"}',
        '{"items": ["d"], "ts": "soon", "u": 7}',
        '{"t": 3, "items": ["e", "e"], "ts": "2026-01-01T02:59:59Z", "u": "z"}',
    ]
    + [f'{{"t": {4 + i // 3}, "items": ["k{i % 5}"], "u": "w{i}"}}' for i in range(40)]
)

CSV = "\n".join(
    [
        "event,item,time,ts,u",
        "e1,a,1,2026-01-01T00:10:00Z,x",
        "e2,b,2,2026-01-01T01:10:00Z,y",
        "e1,c,1,2026-01-01T00:20:00Z,x",
        "e3,d,0,2025-12-31T23:00:00Z,y",
        "e5,e,3,2026-01-01T02:00:00Z,z",
        "e5,f,3,2026-01-01T02:30:00Z,q",
        "e6,,x,2026-01-01T02:00:00Z,z",
        "e7,g,4",
        'e4,"broken,3,2026-01-01T02:00:00Z,z',
    ]
)

CASES = [
    ("jsonl", JSONL, {}),
    ("jsonl", JSONL, {"implicit": True}),
    ("jsonl", JSONL, {"user_field": "u"}),
    ("jsonl", JSONL, {"time_field": "ts", "clock": CLOCK}),
    ("csv", CSV, {"time_column": "time"}),
    ("csv", CSV, {"time_column": "time", "user_field": "u"}),
    ("csv", CSV, {"time_field": "ts", "clock": CLOCK}),
]


def _from_chunks(chunks) -> list[tuple]:
    out = []
    for ch in chunks:
        for i in range(len(ch)):
            a, b = int(ch.offsets[i]), int(ch.offsets[i + 1])
            items = None if i in ch.errors else tuple(ch.items[c] for c in ch.codes[a:b])
            user = None if ch.users is None else ch.users[i]
            raw = ch.buf[int(ch.starts[i]) : int(ch.ends[i])]
            out.append((int(ch.lines[i]), int(ch.t[i]), items, ch.errors.get(i), user, raw))
    return out


@pytest.mark.parametrize(("fmt", "text", "options"), CASES)
def test_chunks_hold_the_records_of_the_record_readers(fmt, text, options):
    want = [
        (r.line, r.t or 0, r.items, r.error, r.user, r.raw)
        for r in read_events(io.StringIO(text, newline=""), fmt, **options)
    ]
    assert len(want) >= 5 and any(w[3] for w in want) and any(w[3] is None for w in want)
    got = _from_chunks(read_chunks(io.StringIO(text, newline=""), fmt, **options))
    assert got == want


def test_read_chunks_refuses_what_read_events_refuses():
    for reader in (read_events, read_chunks):
        with pytest.raises(ValueError, match="implicit-time is for JSON Lines"):
            list(reader(io.StringIO(CSV), "csv", implicit=True))
        with pytest.raises(ValueError, match="input format must be"):
            list(reader(io.StringIO(CSV), "xml"))


# -- user ids through the chunked JSON Lines reader (Arrow where it applies) -------------

GOOD_USER_LINES = [
    '{"t": 1, "user": "alice", "items": ["a", "b"]}',
    '{"user": "bob", "t": 1, "items": ["a"], "x": {"user": 3}}',
    '{"t": 2, "items": ["c", "c"], "user": "ålice 用户"}',
    '{"t": 2, "items": [], "user": "alice"}',
    '{"t": 3, "items": ["d", 7], "user": "9"}',
]

#: Lines that give another record, or another message, than a plain user id.
ADVERSARIAL_USER_LINES = [
    '{"t": 2, "items": ["a"]}',  # no user id
    '{"t": 2, "items": ["a"], "user": null}',
    '{"t": 2, "items": ["a"], "user": ""}',
    '{"t": 2, "items": ["a"], "user": true}',
    '{"t": 2, "items": ["a"], "user": 1.5}',
    '{"t": 2, "items": ["a"], "user": 42}',
    '{"t": 2, "items": ["a"], "user": 123456789012345678901234567890}',
    '{"t": 2, "items": ["a"], "user": ["alice"]}',
    '{"t": 2, "items": ["a"], "user": {"id": "alice"}}',
    '{"t": 2, "items": ["a"], "user": "alice", "user": "bob"}',  # json.loads: the last
    '{"t": 2, "items": ["a"], "user": "\\u00e9ve"}',
    '{"t": 2, "items": ["a"], "user": "\\ud800"}',
    '{"t": 0, "items": ["a"], "user": "alice"}',
    '{"t": 2, "items": [null], "user": "alice"}',
    '{"t": 2, "user": "alice"}',
    '["a"]',
    '{"t": 2, "items": ["a"], "User": "alice"}',
]


def _user_records(text: str, *, binary: bool, chunk_bytes: int = 1 << 21) -> list[tuple]:
    from dpstream.io.jsonl import read_jsonl_chunks

    stream = (
        io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8", newline="")
        if binary
        else io.StringIO(text, newline="")
    )
    return _from_chunks(read_jsonl_chunks(stream, user_field="user", chunk_bytes=chunk_bytes))


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("bad", ADVERSARIAL_USER_LINES)
def test_user_ids_read_in_chunks_are_the_record_readers(bad, binary):
    text = "\n".join([*GOOD_USER_LINES, bad, *GOOD_USER_LINES]) + "\n"
    want = [
        (r.line, r.t or 0, r.items, r.error, r.user, r.raw)
        for r in read_events(io.StringIO(text, newline=""), "jsonl", user_field="user")
    ]
    assert _user_records(text, binary=binary) == want
    assert _user_records(text, binary=binary, chunk_bytes=64) == want


def test_plain_user_ids_go_through_arrow_and_give_the_record_readers_records(monkeypatch):
    """Chunks of plain lines never reach the per-line parser (Arrow reads the users),
    and give what the record readers give, in chunks that cut the input anywhere."""
    pytest.importorskip("pyarrow")
    from dpstream.io import jsonl

    rng = np.random.default_rng(4)  # simulated input data
    lines = [
        json.dumps(
            {
                "t": 1 + i // 7,
                "user": f"u{int(rng.integers(0, 9))}é",
                "items": [f"i{int(x)}" for x in rng.integers(0, 6, int(rng.integers(0, 4)))],
            },
            ensure_ascii=False,
        )
        for i in range(300)
    ]
    text = "\n".join(lines) + "\n"
    want = [
        (r.line, r.t or 0, r.items, r.error, r.user, r.raw)
        for r in read_events(io.StringIO(text, newline=""), "jsonl", user_field="user")
    ]
    calls = []
    real = jsonl.parse_jsonl_line
    monkeypatch.setattr(jsonl, "parse_jsonl_line", lambda *a, **k: calls.append(a) or real(*a, **k))
    for chunk_bytes in (1 << 21, 700, 97):
        assert _user_records(text, binary=True, chunk_bytes=chunk_bytes) == want
    assert calls == []


@pytest.mark.parametrize("large", [False, True])
def test_arrow_line_block_holds_each_line_as_given(large) -> None:
    """A block of lines from an Arrow array (a slice of a larger one, as a Spark task's
    batch can be): each line's bytes and text as given, joined by line feeds; ``strict``
    only when every line is valid UTF-8."""
    import pyarrow as pa

    from dpstream.io.lines import arrow_line_block

    lines = [b"skip", b'{"t": 1}', b"", b"caf\xc3\xa9", b"", b"x\xffy", b"last"]
    arr = pa.array(lines, pa.large_binary() if large else pa.binary()).slice(1, 5)
    block = arrow_line_block(arr, done=7)
    got = [block.buf[a:b] for a, b in zip(block.starts.tolist(), block.ends.tolist(), strict=True)]
    assert got == lines[1:6] and block.done == 7
    assert block.buf == b"\n".join(lines[1:6]) + b"\n"
    assert [block.text(i) for i in range(5)] == [
        x.decode("utf-8", "surrogateescape") for x in lines[1:6]
    ]
    assert not block.strict and arrow_line_block(arr.slice(0, 4)).strict
    assert arrow_line_block(arr.slice(0, 0)).starts.size == 0
