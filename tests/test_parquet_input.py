"""Parquet input (``-i FILE.parquet``, ``-i DIR``) against JSON Lines of the same events.

* the Parquet reader gives JSON Lines' records: the same lines (row numbers), steps,
  items, user ids and messages, invalid rows included;
* a run over a Parquet file, a directory of partitions (several files, several row
  groups) or one row per item writes the same bytes (releases and sidecar) as a run
  over the JSON Lines file, with integer steps, a clock and user ids;
* a resumed run over Parquet equals one run;
* a missing column, a column of the wrong type and an empty file are refused before
  anything is written; ``--engine spark`` refuses Parquet input.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpstream.cli import main
from dpstream.io import open_input
from dpstream.io.jsonl import read_jsonl_chunks
from dpstream.io.parquet import parquet_files, read_parquet_chunks, refuse_copies

from .conftest import fixed_key, own_ledger, run_peak

T = 12
WORDS = [f"w{i}" for i in range(25)]
START = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)

UNKNOWN = ["-m", "unknown", "--max-items", "3", "--rho", "1", "--threshold-delta", "1e-6"]
USERS = ["--user-field", "user", "--max-items-per-user", "3", "--max-count-per-item", "2"]


def _events(seed: int, n: int = 1500, *, invalid: bool = True) -> list[dict]:
    """Simulated events (a seeded generator; never a release): dicts whose None values
    are missing JSON fields and Parquet nulls, some of them invalid records."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = 1 + i * T // n
        items = [str(x) for x in rng.choice(WORDS, size=int(rng.integers(0, 4)))]
        rows.append({"t": t, "items": items, "user": f"u{int(rng.integers(0, 40))}"})
    if invalid:  # what JSON Lines refuses, written as both formats can hold it
        rows[3]["t"] = 0
        rows[10]["t"] = None
        rows[20]["items"] = None
        rows[30]["items"] = ["w1", None]
        rows[40]["t"] = -4
        rows[50]["user"] = ""
        rows[60]["user"] = None
        rows[70]["t"] = T + 5  # past the horizon
    return rows


def _jsonl(rows: list[dict], path, time_key: str = "t") -> None:
    with open(path, "w") as fh:
        for row in rows:
            obj = {("t" if k == "t" else k): v for k, v in row.items() if v is not None}
            if time_key != "t" and "t" in obj:
                obj[time_key] = obj.pop("t")
            fh.write(json.dumps(obj) + "\n")


SCHEMA = pa.schema([("t", pa.int64()), ("items", pa.list_(pa.string())), ("user", pa.string())])


def _table(rows: list[dict], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _partitions(table: pa.Table, root, cuts: list[int]) -> None:
    """The table as a data lake: files under partition directories, in the sorted order
    of their paths (written out of order, each in small row groups)."""
    bounds = [0, *cuts, table.num_rows]
    parts = list(range(len(bounds) - 1))
    for k in reversed(parts):  # written last to first: the order is the paths'
        where = root / f"part={k:02d}"
        where.mkdir(parents=True)
        pq.write_table(
            table.slice(bounds[k], bounds[k + 1] - bounds[k]), where / "data.parquet",
            row_group_size=97,
        )  # fmt: skip
    (root / "_SUCCESS").write_text("")


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "k.key"
    fixed_key("parquet-input").save(path)
    return path


def _run(key_path, src, out, *extra) -> int:
    # one --dataset for both formats: the sidecar names it, and the files' names differ
    return main(
        [
            "run", "--quiet", "-T", str(T), "--key-file", str(key_path),
            "-i", str(src), "-o", str(out), *own_ledger(out), "--dataset", "events",
            *extra,
        ]
    )  # fmt: skip


def _same_files(a, b) -> None:
    assert a.read_bytes() == b.read_bytes()
    meta_a, meta_b = (p.with_name(p.name + ".meta.json") for p in (a, b))
    assert meta_a.exists() and meta_a.read_bytes() == meta_b.read_bytes()


def _flat(chunks) -> list[tuple]:
    """Every record of some chunks: (line, step, error, items, user)."""
    out = []
    for ch in chunks:
        users = ch.users
        for k in range(len(ch)):
            lo, hi = int(ch.offsets[k]), int(ch.offsets[k + 1])
            items = tuple(ch.items[c] for c in ch.codes[lo:hi].tolist())
            user = None if users is None else users[k]
            out.append((int(ch.lines[k]), int(ch.t[k]), ch.errors.get(k), items, user))
    return out


@pytest.mark.parametrize("users", [False, True])
def test_the_reader_gives_json_lines_records_and_messages(tmp_path, users):
    rows = _events(1)
    _jsonl(rows, tmp_path / "e.jsonl")
    pq.write_table(_table(rows), tmp_path / "e.parquet", row_group_size=200)
    user = "user" if users else None
    with open_input(str(tmp_path / "e.jsonl")) as fh:
        want = _flat(read_jsonl_chunks(fh, user_field=user))
    got = _flat(read_parquet_chunks(str(tmp_path / "e.parquet"), user_field=user))
    assert len(got) == len(rows)
    assert got == want
    assert sum(e is not None for _, _, e, _, _ in got) >= (6 if users else 4)


def _not_utf8_table(rows: list[dict], bad_items: dict[int, bytes], bad_users: dict[int, bytes]):
    """``rows`` as a Parquet table whose strings at the given rows are those bytes (not
    UTF-8: a Parquet writer need not check; Arrow does not)."""
    items = [[x.encode() for x in r["items"]] for r in rows]
    for i, raw in bad_items.items():
        items[i] = [b"ok", raw]
    users = [r["user"].encode() for r in rows]
    for i, raw in bad_users.items():
        users[i] = raw
    offsets = pa.array(np.cumsum([0] + [len(x) for x in items]), pa.int32())
    flat = pa.array([x for r in items for x in r], pa.binary()).view(pa.string())
    return pa.table(
        {
            "t": pa.array([r["t"] for r in rows], pa.int64()),
            "items": pa.ListArray.from_arrays(offsets, flat),
            "user": pa.array(users, pa.binary()).view(pa.string()),
        }
    )


@pytest.mark.parametrize(("users", "many"), [(False, False), (True, False), (True, True)])
def test_strings_that_are_not_utf8_are_invalid_records_as_in_json_lines(tmp_path, users, many):
    """Review finding: an item or a user id of a Parquet string column whose bytes are
    not UTF-8 stopped the run with Python's codec error. Now such a row is an invalid
    record, with the message of the JSON Lines line of the same bytes. (``many``: more
    such rows in one batch than are encoded one by one, so the batch is encoded whole
    after the first 64.)"""
    rows = _events(2, n=300, invalid=False)
    bad_items = {5: b"\xff\xfe", 77: b"\xed\xa0\x80"}  # a stray byte; an encoded surrogate
    bad_users = {9: b"u\xff", 200: b"\xc3"}
    if many:
        bad_users.update({i: b"v\xfe" for i in range(100, 300, 2)})
    pq.write_table(_not_utf8_table(rows, bad_items, bad_users), tmp_path / "e.parquet")
    with open(tmp_path / "e.jsonl", "wb") as fh:  # the same events, the same bytes
        for i, row in enumerate(rows):
            line = json.dumps(row).encode()
            if i in bad_items:
                line = line.replace(
                    json.dumps(row["items"]).encode(), b'["ok", "' + bad_items[i] + b'"]'
                )
            if users and i in bad_users:  # (a column the run does not read is not checked)
                line = line.replace(f'"{row["user"]}"'.encode(), b'"' + bad_users[i] + b'"')
            fh.write(line + b"\n")
    user = "user" if users else None
    with open_input(str(tmp_path / "e.jsonl")) as fh:
        want = _flat(read_jsonl_chunks(fh, user_field=user))
    got = _flat(read_parquet_chunks(str(tmp_path / "e.parquet"), user_field=user))
    assert got == want and len(got) == len(rows)
    bad = [line for line, _, err, _, _ in got if err is not None]
    assert all(err == "the line is not valid UTF-8" for _, _, err, _, _ in got if err)
    assert bad == sorted(i + 1 for i in [*bad_items, *(bad_users if users else [])])


def test_unsigned_steps_past_int64_are_past_the_horizon(tmp_path, key_path, capsys):
    """Review finding: a ``uint64`` step >= 2^63 stopped the run with Arrow's "Integer
    value ... not in range"; it is past any horizon, as that step in JSON Lines."""
    rows = _events(4, n=200, invalid=False)
    rows[3]["t"], rows[4]["t"] = 2**63, 2**64 - 1
    rows[5]["t"] = None  # a null step is a missing one, not the largest (review 68)
    _jsonl(rows, tmp_path / "e.jsonl")
    schema = pa.schema(
        [("t", pa.uint64()), ("items", pa.list_(pa.string())), ("user", pa.string())]
    )
    pq.write_table(_table(rows, schema), tmp_path / "e.parquet")
    for src in ("e.jsonl", "e.parquet"):
        assert _run(key_path, tmp_path / src, tmp_path / f"{src}.csv", *UNKNOWN) == 0
    _same_files(tmp_path / "e.jsonl.csv", tmp_path / "e.parquet.csv")
    # the first invalid record is worded as JSON Lines words it (the null step, not a
    # step "9223372036854775807 past the horizon")
    said = []
    for src in ("e.jsonl", "e.parquet"):
        capsys.readouterr()
        out = tmp_path / f"{src}.err.csv"
        assert _run(key_path, tmp_path / src, out, *UNKNOWN, "--on-invalid", "error") != 0
        said.append(capsys.readouterr().err.replace(str(tmp_path / src), "SRC"))
    assert said[0] == said[1] and "input line 6: not a valid event" in said[0]


def test_integer_items_are_their_decimal_text(tmp_path):
    rows = [{"t": 1 + i % 3, "items": [i % 7, 10**12 + i]} for i in range(50)]
    _jsonl(rows, tmp_path / "e.jsonl")
    schema = pa.schema([("t", pa.int32()), ("items", pa.list_(pa.int64()))])
    pq.write_table(_table(rows, schema), tmp_path / "e.parquet")
    with open_input(str(tmp_path / "e.jsonl")) as fh:
        want = _flat(read_jsonl_chunks(fh))
    assert _flat(read_parquet_chunks(str(tmp_path / "e.parquet"))) == want


@pytest.mark.parametrize(
    "extra",
    [
        UNKNOWN,
        ["-m", "unknown", "--counter", "tree", *UNKNOWN[2:]],
        [
            "-m",
            "top-k",
            "--k",
            "3",
            "--domain",
            "DOMAIN",
            "--max-items",
            "3",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
        ],
        [*UNKNOWN, *USERS],
    ],
    ids=["unknown", "tree", "top-k", "users"],
)
def test_file_and_partitions_release_the_bytes_of_json_lines(tmp_path, key_path, extra):
    rows = _events(2)
    _jsonl(rows, tmp_path / "e.jsonl")
    table = _table(rows)
    pq.write_table(table, tmp_path / "e.parquet", row_group_size=128)
    _partitions(table, tmp_path / "lake", [400, 401, 1100])
    assert [
        os.path.basename(os.path.dirname(p)) for p in parquet_files(str(tmp_path / "lake"))
    ] == [
        "part=00",
        "part=01",
        "part=02",
        "part=03",
    ]
    (tmp_path / "domain.txt").write_text("\n".join(WORDS) + "\n")
    extra = [str(tmp_path / "domain.txt") if a == "DOMAIN" else a for a in extra]
    outs = {}
    for name in ("e.jsonl", "e.parquet", "lake"):
        outs[name] = tmp_path / f"out-{name}.jsonl"
        assert _run(key_path, tmp_path / name, outs[name], *extra) == 0
    _same_files(outs["e.jsonl"], outs["e.parquet"])
    _same_files(outs["e.jsonl"], outs["lake"])
    assert len(outs["e.jsonl"].read_text().splitlines()) == T


def test_parquet_output_of_parquet_input_is_the_bytes_of_json_lines(tmp_path, key_path):
    rows = _events(3)
    _jsonl(rows, tmp_path / "e.jsonl")
    pq.write_table(_table(rows), tmp_path / "e.parquet")
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN) == 0
    assert _run(key_path, tmp_path / "e.parquet", b, *UNKNOWN) == 0
    assert pq.read_table(a).equals(pq.read_table(b))


@pytest.mark.parametrize("kind", ["timestamp", "iso", "epoch", "timestamp-ns"])
def test_timestamps_on_the_clock_release_the_bytes_of_json_lines(tmp_path, key_path, kind):
    rng = np.random.default_rng(4)
    rows = _events(4, invalid=False)
    whens = [
        START + dt.timedelta(seconds=int(s))
        for s in np.sort(rng.integers(-600, T * 3600, len(rows)))
    ]
    for row, when in zip(rows, whens, strict=True):
        row["t"] = when.isoformat().replace("+00:00", "Z")
    _jsonl(rows, tmp_path / "e.jsonl", time_key="ts")
    if kind == "iso":
        ts, typ = [r["t"] for r in rows], pa.string()
    elif kind == "epoch":
        ts, typ = [int(w.timestamp()) for w in whens], pa.int64()
    else:
        unit = "ns" if kind == "timestamp-ns" else "us"
        ts, typ = whens, pa.timestamp(unit, tz="UTC")
    table = pa.table(
        {
            "ts": pa.array(ts, typ),
            "items": pa.array([r["items"] for r in rows], pa.list_(pa.string())),
        }
    )
    pq.write_table(table, tmp_path / "e.parquet")
    clock = ["--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN, *clock) == 0
    assert _run(key_path, tmp_path / "e.parquet", b, *UNKNOWN, *clock) == 0
    _same_files(a, b)


@pytest.mark.parametrize("typ", [pa.float32(), pa.float16(), "float32-dictionary"])
def test_a_float32_or_float16_time_field_is_refused_before_any_release(
    tmp_path, key_path, capsys, typ
):
    """Attack 13: a float32 epoch-seconds column (24 bits: off by up to 64 s today) moved
    events to another step without a word (01:00:00 and 01:00:30 both read as 00:59:44,
    released in step 1 of an hourly clock, not step 2); a float16 holds no epoch seconds
    at all. Both are
    refused before anything is written, as is a dictionary of float32 (a categorical);
    float64 seconds of the same events release the bytes of JSON Lines."""
    seconds = [1772326800, 1772326830] * 5  # 01:00:00 and 01:00:30 UTC: step 2
    rows = [{"t": s, "items": ["w1"]} for s in seconds]
    _jsonl(rows, tmp_path / "e.jsonl", time_key="ts")
    items = pa.array([["w1"]] * len(seconds), pa.list_(pa.string()))
    if typ == "float32-dictionary":
        column, name = pa.array(seconds, pa.float64()).cast(pa.float32(), safe=False), "float32"
        column = column.dictionary_encode()
    else:  # (a float16 holds them as inf)
        column, name = pa.array(seconds, pa.float64()).cast(typ, safe=False), str(typ)
        name = {"float": "float32", "halffloat": "float16"}[name]
    pq.write_table(pa.table({"ts": column, "items": items}), tmp_path / "f.parquet")
    clock = ["--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z"]
    out = tmp_path / "f.jsonl"
    assert _run(key_path, tmp_path / "f.parquet", out, *UNKNOWN, *clock) == 1
    where = f"the Parquet input {str(tmp_path / 'f.parquet')!r}"
    assert capsys.readouterr().err == (
        f"dpstream: error: {where}: column 'ts' (--time-field) is {name}, which cannot hold "
        "epoch seconds exactly (events would move to another step): cast it to float64 or "
        "to int64 epoch seconds\n"
    )
    assert not out.exists() and not (tmp_path / "f.jsonl.meta.json").exists()
    ledger = tmp_path / "f.jsonl.ledger"  # opened, nothing recorded
    assert not ledger.exists() or ledger.read_bytes() == b""
    pq.write_table(
        pa.table({"ts": pa.array(seconds, pa.float64()), "items": items}), tmp_path / "d.parquet"
    )
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN, *clock) == 0
    assert _run(key_path, tmp_path / "d.parquet", b, *UNKNOWN, *clock) == 0
    _same_files(a, b)


def test_one_row_per_item_releases_the_bytes_of_json_lines(tmp_path, key_path):
    rows = _events(5, invalid=False)
    _jsonl(rows, tmp_path / "e.jsonl")
    flat = []
    for i, row in enumerate(rows):  # an empty event is one row with a null item
        for item in row["items"] or [None]:
            flat.append({"event": f"e{i}", "t": row["t"], "item": item, "user": row["user"]})
    rng = np.random.default_rng(5)
    rng.shuffle(flat)  # an event's rows may stand anywhere
    flat.sort(key=lambda r: r["t"])
    first = {}
    for k, r in enumerate(flat):
        first.setdefault(r["event"], k)
    # the events come out in the order of their first rows: the JSON Lines file too
    order = sorted(range(len(rows)), key=lambda i: first[f"e{i}"])
    _jsonl([rows[i] for i in order], tmp_path / "e.jsonl")
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "items.parquet", row_group_size=300)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN, *USERS) == 0
    assert _run(key_path, tmp_path / "items.parquet", b, *UNKNOWN, *USERS) == 0
    _same_files(a, b)


def test_daily_parquet_runs_equal_one_run(tmp_path, key_path):
    """Two runs with --state (steps 1..5 from one partition, then 6..T from the next)
    write the bytes of one run over both; a changed partition of released steps is
    refused, as a changed JSON Lines file is."""
    rows = [r for r in _events(6) if r["t"] is not None and 1 <= r["t"] <= T]
    table = _table(rows)
    cut = next(i for i, r in enumerate(rows) if r["t"] > 5)
    _partitions(table, tmp_path / "all", [cut])
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert _run(key_path, tmp_path / "all", one, *UNKNOWN) == 0
    state = ["--state", str(tmp_path / "s.db")]
    day1, day2 = tmp_path / "all" / "part=00", tmp_path / "all" / "part=01"
    assert _run(key_path, day1, two, *UNKNOWN, *state, "--until", "5") == 0
    assert _run(key_path, day2, two, *UNKNOWN, *state) == 0
    assert one.read_bytes() == two.read_bytes()
    # a resumed run re-reads the steps it released: their input must be unchanged
    three = tmp_path / "three.jsonl"
    state3 = ["--state", str(tmp_path / "s3.db")]
    assert _run(key_path, tmp_path / "all", three, *UNKNOWN, *state3, "--until", "5") == 0
    changed = [dict(r) for r in rows]
    changed[0]["items"] = ["changed"]
    (tmp_path / "all" / "part=00" / "data.parquet").unlink()
    pq.write_table(_table(changed).slice(0, cut), tmp_path / "all" / "part=00" / "data.parquet")
    assert _run(key_path, tmp_path / "all", three, *UNKNOWN, *state3) == 1


@pytest.mark.parametrize(
    "table, extra, message",
    [
        (pa.table({"t": [1], "things": [["a"]]}), [], "no column 'items' (a list of items"),
        (
            pa.table({"t": [1], "tags": [["a"]]}),
            ["--item-column", "items"],
            "no column 'items' (--item-column)",
        ),
        (pa.table({"step": [1], "items": [["a"]]}), [], "no column 't' (--time-column)"),
        (pa.table({"t": [1], "items": [["a"]]}), USERS, "no column 'user' (--user-field)"),
        (
            pa.table({"t": [1.5], "items": [["a"]]}),
            [],
            "column 't' (--time-column) is double, expected integer",
        ),
        (pa.table({"t": ["1"], "items": [["a"]]}), [], "column 't' (--time-column) is string"),
        (pa.table({"t": [1], "items": [[1.5]]}), [], "column 'items' (--item-column) is list<"),
        (
            pa.table({"t": [1], "items": [["a"]], "user": [3]}),
            USERS,
            "column 'user' (--user-field) is int64",
        ),
        (pa.table({"t": [1], "item": ["a"]}), [], "no column 'event' (--event-column)"),
    ],
)
def test_a_missing_or_mistyped_column_is_refused_before_any_release(
    tmp_path, key_path, capsys, table, extra, message
):
    pq.write_table(table, tmp_path / "e.parquet")
    out = tmp_path / "out.jsonl"
    assert _run(key_path, tmp_path / "e.parquet", out, *UNKNOWN, *extra) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_linked_partitions_count_once_and_a_partition_reached_twice_is_refused(
    tmp_path, key_path, capsys
):
    """Review 89: a partition folder that was a link was left out without a word (its
    events never counted); it is followed now, and a folder or file that two paths
    reach (so its events would count twice) is refused before anything is written."""
    rows = _events(3)
    table = _table(rows)
    _partitions(table, tmp_path / "whole", [700])
    _partitions(table, tmp_path / "held", [700])
    (tmp_path / "lake").mkdir()
    os.rename(tmp_path / "held" / "part=00", tmp_path / "lake" / "part=00")
    os.symlink(tmp_path / "held" / "part=01", tmp_path / "lake" / "part=01")
    found = parquet_files(str(tmp_path / "lake"))
    assert [os.path.relpath(p, tmp_path / "lake") for p in found] == [
        os.path.join("part=00", "data.parquet"),
        os.path.join("part=01", "data.parquet"),
    ]
    outs = [tmp_path / "out-whole.jsonl", tmp_path / "out-lake.jsonl"]
    assert _run(key_path, tmp_path / "whole", outs[0], *UNKNOWN) == 0
    assert _run(key_path, tmp_path / "lake", outs[1], *UNKNOWN) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()
    # the same folder by two links, a file linked beside itself, a hard link, a loop
    cases = {
        "twice": lambda d: os.symlink(tmp_path / "held" / "part=01", d / "part=02"),
        "file": lambda d: os.symlink(d / "part=00" / "data.parquet", d / "more.parquet"),
        "hard": lambda d: os.link(d / "part=00" / "data.parquet", d / "hard.parquet"),
        "loop": lambda d: os.symlink(d, d / "part=00" / "again"),
        # (review 91) a partition linked from storage that is not there: not left out
        "nothing": lambda d: os.symlink(tmp_path / "unmounted" / "part=02", d / "part=02"),
    }
    for name, make in cases.items():
        lake = tmp_path / f"lake-{name}"
        os.rename(tmp_path / "lake", lake)
        make(lake)
        out = tmp_path / f"out-{name}.jsonl"
        assert _run(key_path, lake, out, *UNKNOWN) == 1, name
        said = "cannot read" if name == "nothing" else "would count twice"
        assert said in capsys.readouterr().err, name
        assert not out.exists()
        for extra in ("part=02", "more.parquet", "hard.parquet", "part=00/again"):
            if os.path.lexists(lake / extra):
                os.remove(lake / extra)
        os.rename(lake, tmp_path / "lake")


def test_two_columns_of_one_name_are_refused_by_name(tmp_path, key_path, capsys):
    """Review 89: a file with two columns named as a column the run reads failed with a
    traceback (Arrow's KeyError); it is refused, naming the column, before any release."""
    arrays = [pa.array([1], pa.int64()), pa.array([["w1"]]), pa.array(["x"]), pa.array(["y"])]
    for names, extra, flag in (
        (["t", "items", "user", "user"], ["--user-field", "user"], "--user-field"),
        (["t", "items", "t", "user"], [], "--time-column"),
    ):
        pq.write_table(pa.Table.from_arrays(arrays, names=names), tmp_path / "d.parquet")
        bounds = ["--max-items-per-user", "1", "--max-count-per-item", "1"] if extra else []
        out = tmp_path / "out.jsonl"
        assert _run(key_path, tmp_path / "d.parquet", out, *UNKNOWN, *extra, *bounds) == 1
        err = capsys.readouterr().err
        assert f"2 columns are named {names[2]!r} ({flag})" in err and "Traceback" not in err
        assert not out.exists()


def test_an_empty_file_or_directory_is_refused(tmp_path, key_path, capsys):
    (tmp_path / "e.parquet").write_bytes(b"")
    out = tmp_path / "out.jsonl"
    assert _run(key_path, tmp_path / "e.parquet", out, *UNKNOWN) == 1
    assert "is not a Parquet file" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "x.parquet").write_bytes(b"not parquet")
    assert _run(key_path, tmp_path / "lake", out, *UNKNOWN) == 1
    assert "is not a Parquet file" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "none").mkdir()
    assert _run(key_path, tmp_path / "none", out, *UNKNOWN, "--input-format", "parquet") == 1
    assert "holds no *.parquet file" in capsys.readouterr().err


def test_a_file_of_no_rows_releases_every_step_empty(tmp_path, key_path):
    pq.write_table(_table([]), tmp_path / "e.parquet")
    (tmp_path / "e.jsonl").write_text("")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for empty in ("e.jsonl", "e.parquet"):  # (review 120: refused unless the run says so)
        assert _run(key_path, tmp_path / empty, a, *UNKNOWN) == 1
        assert not a.exists()
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN, "--allow-empty") == 0
    assert _run(key_path, tmp_path / "e.parquet", b, *UNKNOWN, "--allow-empty") == 0
    _same_files(a, b)


def test_follow_and_stdin_refuse_parquet_input(tmp_path, key_path, capsys):
    pq.write_table(_table(_events(7, n=100)), tmp_path / "e.parquet")
    out = tmp_path / "out.jsonl"
    clock = ["--time-field", "t", "--step", "1h", "--start", "2026-03-01T00:00Z", "--follow"]
    assert _run(key_path, tmp_path / "e.parquet", out, *UNKNOWN, *clock) == 2  # a setting's
    assert "not --follow" in capsys.readouterr().err
    assert _run(key_path, "-", out, *UNKNOWN, "--input-format", "parquet") == 2
    assert "not stdin" in capsys.readouterr().err
    assert not out.exists()


def test_digest_bytes_tell_apart_what_json_lines_would():
    """Rows that differ only in where an item ends, in a null, or in the user id have
    different digest bytes (a resumed run refuses a changed step)."""
    lists = [["ab", "c"], ["a", "bc"], ["abc"], [], [""], None, [None], ["", ""]]
    users = ["u", "u", "u", "u", "u", "u", "u", "u"]
    rows = [{"t": 1, "items": x, "user": u} for x, u in zip(lists, users, strict=True)]
    rows += [
        {"t": 1, "items": ["ab", "c"], "user": "v"},
        {"t": 1, "items": ["ab", "c"], "user": None},
    ]
    rows += [
        {"t": 2, "items": ["ab", "c"], "user": "u"},
        {"t": None, "items": ["ab", "c"], "user": "u"},
    ]
    for user_field in (None, "user"):
        chunks = list(_chunks_of(_table(rows), user_field))
        (chunk,) = chunks
        raws = [
            chunk.buf[s:e] for s, e in zip(chunk.starts.tolist(), chunk.ends.tolist(), strict=True)
        ]
        distinct = len(set(raws))
        assert distinct == len(rows) - (2 if user_field is None else 0), raws  # 0, 8, 9 alike


def _chunks_of(table: pa.Table, user_field):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "e.parquet")
        pq.write_table(table, path)
        yield from read_parquet_chunks(path, user_field=user_field)


def test_categorical_columns_are_read_as_their_values(tmp_path):
    """A pandas categorical (a dictionary-encoded column) of items and users reads as
    the plain strings."""
    import pandas as pd

    rows = [
        {
            "t": 1 + (i // 2) % 4,
            "event": f"e{i // 2}",
            "item": f"w{i % 5}",
            "user": f"u{(i // 2) % 3}",
        }
        for i in range(40)
    ]
    frame = pd.DataFrame(rows)
    plain = tmp_path / "plain.parquet"
    frame.to_parquet(plain, index=False)
    cat = tmp_path / "cat.parquet"
    frame.astype({"item": "category", "user": "category"}).to_parquet(cat, index=False)
    assert pa.types.is_dictionary(pq.read_schema(cat).field("item").type)
    want = _flat(read_parquet_chunks(str(plain), user_field="user"))
    assert _flat(read_parquet_chunks(str(cat), user_field="user")) == want
    assert len(want) == 20 and all(e is None for _, _, e, _, _ in want)


def test_items_and_item_columns_together_need_the_item_column_named(tmp_path, key_path, capsys):
    """Review finding (review 72): a file with both a list column ``items`` and a column
    ``item`` was counted from ``item`` (one row per item), where the default is
    documented as ``items``, else ``item``. Now it is refused before anything is read,
    naming both columns and the option that picks one; named, each layout gives the
    bytes of a file that has only that column."""
    rows = _events(7, n=300, invalid=False)
    table = pa.table(
        {
            "t": pa.array([r["t"] for r in rows], pa.int64()),
            "items": pa.array([r["items"] for r in rows], pa.list_(pa.string())),
            "item": pa.array([(r["items"] or [None])[0] for r in rows], pa.string()),
            "event": pa.array([f"e{i}" for i in range(len(rows))], pa.string()),
        }
    )
    pq.write_table(table, tmp_path / "both.parquet")
    out = tmp_path / "out.jsonl"
    assert _run(key_path, tmp_path / "both.parquet", out, *UNKNOWN) == 1
    err = capsys.readouterr().err
    assert "both a column 'items'" in err and "a column 'item'" in err
    assert "--item-column items or --item-column item" in err
    assert not out.exists()
    pq.write_table(table.drop_columns(["item", "event"]), tmp_path / "items.parquet")
    pq.write_table(table.drop_columns(["items"]), tmp_path / "item.parquet")
    for name, flag in (("items", "items"), ("item", "item")):
        a, b = tmp_path / f"a-{name}.jsonl", tmp_path / f"b-{name}.jsonl"
        assert _run(key_path, tmp_path / "both.parquet", a, *UNKNOWN, "--item-column", flag) == 0
        assert _run(key_path, tmp_path / f"{name}.parquet", b, *UNKNOWN, "--item-column", flag) == 0
        _same_files(a, b)
    # a config file's item-column names it too
    (tmp_path / "c.toml").write_text('item-column = "items"\n')
    c = tmp_path / "c.jsonl"
    assert (
        _run(key_path, tmp_path / "both.parquet", c, *UNKNOWN, "--config", str(tmp_path / "c.toml"))
        == 0
    )
    assert c.read_bytes() == (tmp_path / "a-items.jsonl").read_bytes()
    # naming items, what an unnamed run reads, keeps the stream's noise (review 75): the
    # same bytes as the unnamed run over the items-only file, and a stream begun
    # unnamed with --state goes on with --item-column items over a file with both
    plain = tmp_path / "plain.jsonl"
    assert _run(key_path, tmp_path / "items.parquet", plain, *UNKNOWN) == 0
    assert plain.read_bytes() == (tmp_path / "a-items.jsonl").read_bytes()
    first = table.slice(0, 150).drop_columns(["item", "event"])
    pq.write_table(first, tmp_path / "day1.parquet")
    pq.write_table(table.slice(150), tmp_path / "day2.parquet")
    day1, day2 = (table.column("t")[149].as_py(), table.column("t")[299].as_py())
    assert day1 < day2
    state = ["--state", str(tmp_path / "s.sqlite"), "--output-format", "jsonl"]
    d = tmp_path / "d.jsonl"
    assert _run(key_path, tmp_path / "day1.parquet", d, *UNKNOWN, *state, "--until", str(day1)) == 0
    assert (
        _run(key_path, tmp_path / "day2.parquet", d, *UNKNOWN, *state, "--item-column", "items")
        == 0
    )


def test_lists_of_no_type_and_fixed_size_lists_are_read_as_lists(tmp_path, key_path):
    """Review finding (review 72): a list column whose every list is empty (Arrow
    ``list<null>``, as pandas and polars write it), an item column whose every item is
    null, and a fixed-size list column (a polars Array) were refused as of another type;
    JSON Lines reads the same events. Now they give the bytes of JSON Lines."""
    empty = [{"t": 1 + i % T, "items": []} for i in range(40)]
    _jsonl(empty, tmp_path / "empty.jsonl")
    for typ in (pa.list_(pa.null()), pa.large_list(pa.null())):
        pq.write_table(
            pa.table({"t": pa.array([r["t"] for r in empty], pa.int64()),
                      "items": pa.array([[]] * len(empty), typ)}),
            tmp_path / "empty.parquet",
        )  # fmt: skip
        a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        assert _run(key_path, tmp_path / "empty.jsonl", a, *UNKNOWN, "--force") == 0
        assert _run(key_path, tmp_path / "empty.parquet", b, *UNKNOWN, "--force") == 0
        _same_files(a, b)
    # one row per item, every item null: each row an empty event
    per_item = pa.table(
        {
            "t": pa.array([r["t"] for r in empty], pa.int64()),
            "event": pa.array([f"e{i}" for i in range(len(empty))], pa.string()),
            "item": pa.nulls(len(empty)),
        }
    )
    pq.write_table(per_item, tmp_path / "null-items.parquet")
    c = tmp_path / "c.jsonl"
    assert _run(key_path, tmp_path / "null-items.parquet", c, *UNKNOWN) == 0
    _same_files(a, c)
    # fixed-size lists (two items per event)
    rows = [{"t": 1 + i * T // 300, "items": [f"w{i % 7}", f"w{i % 5 + 7}"]} for i in range(300)]
    _jsonl(rows, tmp_path / "fixed.jsonl")
    items = pa.array([r["items"] for r in rows], pa.list_(pa.string(), 2))
    pq.write_table(
        pa.table({"t": pa.array([r["t"] for r in rows], pa.int64()), "items": items}),
        tmp_path / "fixed.parquet",
    )
    d, e = tmp_path / "d.jsonl", tmp_path / "e.jsonl"
    assert _run(key_path, tmp_path / "fixed.jsonl", d, *UNKNOWN) == 0
    assert _run(key_path, tmp_path / "fixed.parquet", e, *UNKNOWN) == 0
    _same_files(d, e)


def _bad(values: list[bytes]) -> pa.Array:
    """Strings whose bytes need not be UTF-8 (Arrow does not check)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_one_row_per_item_strings_that_are_not_utf8_are_invalid_records(tmp_path, key_path):
    """Review finding (review 72): an item, an event id or a user id that is not UTF-8
    in a file of one row per item (and a time string on a clock, below) stopped the run
    with Python's codec error. Now such a row is an invalid record alone (as a CSV row
    is), with the message of the one-row-per-event layout, and the run goes on."""
    from dpstream.io.parquet import read_parquet_records

    n = 60
    items = [b"w1"] * n
    events = [f"e{i // 2}".encode() for i in range(n)]
    users = [f"u{i // 2}".encode() for i in range(n)]
    items[5], events[12], users[31] = b"w\xff", b"e\xfe", b"\xc3"
    table = pa.table(
        {
            "t": pa.array([1 + i * T // n for i in range(n)], pa.int64()),
            "event": _bad(events),
            "item": _bad(items),
            "user": _bad(users),
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    recs = list(read_parquet_records(str(tmp_path / "items.parquet"), user_field="user"))
    bad = [(r.line, r.error) for r in recs if r.error is not None]
    assert bad == [(k + 1, "the line is not valid UTF-8") for k in (5, 12, 31)]
    good = {(1 + i * T // n, events[i]) for i in range(n) if i not in (5, 12, 31)}
    assert len(recs) == len(good) + 3  # the other rows of those events are events still
    out = tmp_path / "out.jsonl"
    assert (
        _run(key_path, tmp_path / "items.parquet", out, *UNKNOWN, *USERS, "--max-invalid", "0.2")
        == 0
    )


@pytest.mark.parametrize("per_item", [False, True])
def test_clock_times_that_are_not_utf8_are_invalid_records(tmp_path, per_item):
    """Review finding (review 72): a time string that is not UTF-8 on a clock stopped the
    run with Python's codec error; now its row is the invalid record of that JSON Lines
    line ("the line is not valid UTF-8")."""
    from dpstream.clock import StepClock

    n = 50
    ts = [f"2026-03-01T{i % 12:02d}:30:00Z".encode() for i in range(n)]
    ts[7], ts[40] = b"2026-03-01T\xff", b"\xfe"
    with open(tmp_path / "e.jsonl", "wb") as fh:
        for i in range(n):
            fh.write(b'{"ts": "' + ts[i] + b'", "items": ["w1"]}\n')
    cols = {"ts": _bad(ts)}
    if per_item:
        cols |= {"event": [f"e{i}" for i in range(n)], "item": ["w1"] * n}
    else:
        cols["items"] = [["w1"]] * n
    pq.write_table(pa.table(cols), tmp_path / "e.parquet")
    clock = StepClock.parse("2026-03-01T00:00Z", "1h")
    with open_input(str(tmp_path / "e.jsonl")) as fh:
        want = _flat(read_jsonl_chunks(fh, time_field="ts", clock=clock))
    got = _flat(read_parquet_chunks(str(tmp_path / "e.parquet"), time_field="ts", clock=clock))
    assert got == want and len(got) == n
    assert [(line, err) for line, _, err, _, _ in got if err] == [
        (8, "the line is not valid UTF-8"),
        (41, "the line is not valid UTF-8"),
    ]


def test_one_row_per_item_at_user_level_an_event_is_one_id_of_one_user(tmp_path):
    """Review 81: rows of two users under one event id made the whole event invalid, so
    one user's rows could cancel other users' events. Each user's rows under an id are
    that user's event; a row without a user id is a record alone."""
    from dpstream.io.parquet import read_parquet_records

    table = pa.table(
        {
            "event": ["x", "x", "y", "x", "y"],
            "t": [1, 1, 1, 1, 1],
            "item": ["a", "b", "c", "d", "e"],
            "user": ["u", "w", None, "u", "v"],
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    recs = list(read_parquet_records(str(tmp_path / "items.parquet"), user_field="user"))
    assert [(r.line, r.t, r.items, r.user) for r in recs if r.error is None] == [
        (1, 1, ("a", "d"), "u"),
        (2, 1, ("b",), "w"),
        (5, 1, ("e",), "v"),
    ]
    assert [(r.line, "non-empty string" in r.error) for r in recs if r.error] == [(3, True)]


def test_one_row_per_item_rows_of_an_empty_or_null_event_id_are_records_alone(tmp_path):
    """Review 91: rows whose event id was "" (a CSV's empty cell kept as text by
    pyarrow's or pandas's CSV reader) merged into one event, as the CSV reader no
    longer does; each is now an invalid record alone, as a null id is."""
    from dpstream.io.parquet import read_parquet_records

    table = pa.table(
        {
            "event": ["", "", "x", None, "", "x"],
            "t": [1, 1, 1, 1, 2, 1],
            "item": ["a", "b", "c", "d", "e", "f"],
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    recs = list(read_parquet_records(str(tmp_path / "items.parquet")))
    assert [(r.line, r.t, r.items) for r in recs if r.error is None] == [(3, 1, ("c", "f"))]
    bad = [(r.line, "event id column 'event' is null or empty" in r.error) for r in recs if r.error]
    assert bad == [(1, True), (2, True), (4, True), (5, True)]


def test_one_row_per_item_an_event_id_is_its_text_whatever_its_files_type(tmp_path):
    """Review 117 (high): a lake whose event-id column was int64 in one file and string in
    the next split an event in two (5 and "5"), each part within --max-items: an event
    of 4 items passed --max-items 2. An id is its text, as in CSV: one event."""
    from dpstream.io.parquet import read_parquet_records

    folder = tmp_path / "lake"
    folder.mkdir()
    part = {"t": [1, 1], "item": ["a", "b"]}
    pq.write_table(pa.table({"event": [5, 5], **part}), folder / "part-0.parquet")
    part = {"t": [1, 1], "item": ["c", "d"]}
    pq.write_table(pa.table({"event": ["5", "5"], **part}), folder / "part-1.parquet")
    recs = list(read_parquet_records(str(folder)))
    assert [(r.line, r.t, r.items) for r in recs] == [(1, 1, ("a", "b", "c", "d"))]


@pytest.mark.parametrize(
    "log,what",
    [("_delta_log", "Delta Lake"), (".hoodie", "Apache Hudi"), ("metadata", "Apache Iceberg")],
)
def test_a_table_formats_folder_is_refused(tmp_path, key_path, log, what):
    """Review 117 (medium): a Delta table's folder was read as plain Parquet files, and the
    files an OPTIMIZE had replaced (kept until VACUUM) counted their events again (50
    events released as 100). A table format's folder, or one inside it, is refused in
    words, before anything is written; a plain lake is read as before."""
    table = tmp_path / "table"
    (table / "date=1").mkdir(parents=True)
    pq.write_table(_table(_events(117, 50, invalid=False)), table / "date=1" / "p.parquet")
    (table / log).mkdir()
    if log == "metadata":
        (table / log / "v1.metadata.json").write_text("{}")
    for given in (table, table / "date=1"):
        out = tmp_path / "o.jsonl"
        with pytest.raises(ValueError, match=f"is an? {what} table.s folder"):
            parquet_files(str(given))
        assert _run(key_path, given, out, *UNKNOWN) == 1
        assert not out.exists()
    shutil.rmtree(table / log)
    assert _run(key_path, table, tmp_path / "plain.jsonl", *UNKNOWN) == 0


def test_int96_times_outside_nanoseconds_range_are_not_wrapped_into_a_step(tmp_path):
    """Review 117 (medium): INT96 timestamps (Spark's default) were read in nanoseconds,
    which wrap an instant outside 1677-2262 around: events of 2610 counted in a step of
    2025. Read in microseconds, they are past the clock's end, as in JSON Lines."""
    from dpstream.clock import StepClock
    from dpstream.io.parquet import read_parquet_records

    times = [dt.datetime(2025, 11, 10, 12), dt.datetime(2610, 6, 1), dt.datetime(9999, 12, 31)]
    table = pa.table({"ts": pa.array(times, pa.timestamp("us", tz="UTC")), "items": [["a"]] * 3})
    pq.write_table(table, tmp_path / "i96.parquet", use_deprecated_int96_timestamps=True)
    assert pq.ParquetFile(tmp_path / "i96.parquet").schema.column(0).physical_type == "INT96"
    clock = StepClock.parse("2025-11-01T00:00Z", "1d")
    recs = list(read_parquet_records(str(tmp_path / "i96.parquet"), time_field="ts", clock=clock))
    assert recs[0].error is None and recs[0].t == 10
    assert all(r.t is None or r.t > 10**5 for r in recs[1:]), [(r.t, r.error) for r in recs]


def test_the_digest_bytes_copy_items_in_bounded_blocks_as_a_loop_would():
    """Review 103: the item bytes of a Parquet batch were copied with index arrays of 16
    bytes a byte of data, all at once (a 13 KB file of one 400 MB item took 8.3 GB).
    They are copied in blocks now; the result is the plain loop's (brute force), for
    items of every size around the block's and a block of one large item."""
    from dpstream.io import parquet as pq_io

    rng = np.random.default_rng(103)  # test data
    for _ in range(200):
        n = int(rng.integers(1, 40))
        lengths = rng.choice([0, 1, 3, 50, 2000], size=n).astype(np.int64)
        if rng.random() < 0.3:
            lengths[rng.integers(n)] = int(rng.integers(1, 3 * pq_io._SCATTER_BYTES))
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths)
        offsets += int(rng.integers(0, 5))  # a sliced array's data starts further on
        data = rng.integers(0, 256, size=int(offsets[-1]) + 3, dtype=np.uint8)
        at = np.cumsum(np.r_[0, (lengths + rng.integers(0, 3, size=n))[:-1]]).astype(np.int64)
        got = np.zeros(int(at[-1] + lengths[-1]) + 2, np.uint8)
        want = got.copy()
        pq_io._scatter(got, at, data, offsets, lengths)
        for k in range(n):
            want[at[k] : at[k] + lengths[k]] = data[offsets[k] : offsets[k] + lengths[k]]
        assert np.array_equal(got, want)


def test_a_pipe_named_like_a_parquet_file_in_the_input_folder_is_refused(tmp_path, key_path):
    """Review 103: a FIFO named *.parquet in an input folder hung the run for ever (the
    Parquet reader waited on it); it is refused before it is opened."""
    folder = tmp_path / "lake"
    folder.mkdir()
    pq.write_table(_table([{"t": 1, "items": ["a"]}]), folder / "part-0.parquet")
    os.mkfifo(folder / "part-1.parquet")
    with pytest.raises(ValueError, match="is not a regular file"):
        list(read_parquet_chunks(str(folder)))


def test_a_copy_of_a_parquet_file_in_the_input_folder_is_refused(tmp_path):
    """Review 102: `part-0 (copy).parquet` beside `part-0.parquet` counted its events
    twice, exit 0. Files of the same bytes under one input folder are refused."""
    folder = tmp_path / "lake"
    folder.mkdir()
    pq.write_table(_table([{"t": 1, "items": ["a"]}]), folder / "part-0.parquet")
    pq.write_table(_table([{"t": 2, "items": ["b"]}]), folder / "part-1.parquet")
    assert len(parquet_files(str(folder))) == 2  # same size, other bytes: fine
    shutil.copyfile(folder / "part-0.parquet", folder / "part-0 (copy).parquet")
    with pytest.raises(ValueError, match="holds the same bytes as .*a copy"):
        parquet_files(str(folder))


def test_files_of_no_events_may_be_alike_in_an_input_folder(tmp_path):
    """Review 108: a folder's quiet hours (empty files, or Parquet files of no rows, which
    are byte-identical) were refused as copies whose events would count twice."""
    folder = tmp_path / "lake"
    folder.mkdir()
    pq.write_table(_table([{"t": 1, "items": ["a"]}]), folder / "h01.parquet")
    empty = _table([{"t": 1, "items": ["a"]}]).slice(0, 0)
    pq.write_table(empty, folder / "h02.parquet")
    pq.write_table(empty, folder / "h03.parquet")
    assert (folder / "h02.parquet").read_bytes() == (folder / "h03.parquet").read_bytes()
    assert len(parquet_files(str(folder))) == 3
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    for name, body in (
        ("h01.jsonl", '{"t": 1, "items": ["a"]}\n'),
        ("h02.jsonl", ""),
        ("h03.jsonl", ""),
        ("h04.jsonl", "\n"),
        ("h05.jsonl", "\n"),
    ):
        (jsonl / name).write_text(body)  # fmt: skip
    refuse_copies(str(jsonl), sorted(str(p) for p in jsonl.iterdir()))  # no refusal
    (jsonl / "h06.jsonl").write_text('{"t": 1, "items": ["a"]}\n')  # a copy of h01
    with pytest.raises(ValueError, match="holds the same bytes as"):
        refuse_copies(str(jsonl), sorted(str(p) for p in jsonl.iterdir()))


@pytest.mark.parametrize("typ", [pa.timestamp("s"), pa.timestamp("us", tz="UTC"), pa.date32()])
def test_a_time_python_cannot_hold_is_an_invalid_record_as_in_json_lines(
    tmp_path, key_path, capsys, typ
):
    """Review 111: a timestamp past the year 9999 (or such a date) stopped the run with an
    OverflowError traceback; JSON Lines counts the same instant as an invalid record
    (its timestamp). Now both release the same bytes and skip it."""
    good, far = dt.datetime(2026, 3, 1, 1, tzinfo=dt.timezone.utc), 253402300800
    if typ == pa.date32():
        values = pa.array([19417 + 0, 2932897 + 10], pa.date32())  # 2023-03-01, year 10000
        epoch = [int(dt.datetime(2023, 3, 1, tzinfo=dt.timezone.utc).timestamp()), far + 864000]
    else:
        unit = 1 if typ.unit == "s" else 10**6
        values = pa.array([int(good.timestamp()) * unit, far * unit], typ)
        epoch = [int(good.timestamp()), far]
    pq.write_table(pa.table({"ts": values, "items": [["a"], ["b"]]}), tmp_path / "e.parquet")
    lines = [json.dumps({"ts": s, "items": [i]}) for s, i in zip(epoch, "ab", strict=True)]
    (tmp_path / "e.jsonl").write_text("\n".join(lines) + "\n")
    start = "2023-03-01T00:00Z" if typ == pa.date32() else "2026-03-01T00:00Z"
    clock = ["--time-field", "ts", "--step", "1d", "--start", start, "--max-invalid", "1"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _run(key_path, tmp_path / "e.jsonl", a, *UNKNOWN, *clock) == 0
    assert _run(key_path, tmp_path / "e.parquet", b, *UNKNOWN, *clock) == 0
    assert a.read_bytes() == b.read_bytes()


def test_a_time_zone_python_does_not_know_is_refused_in_one_line(tmp_path, key_path, capsys):
    """Review 111: a timestamp column whose zone is not a name Python knows ended in a
    pytz traceback."""
    ts = pa.array([1772323200], pa.timestamp("s", "Mars/Phobos"))
    pq.write_table(pa.table({"ts": ts, "items": [["a"]]}), tmp_path / "e.parquet")
    clock = ["--time-field", "ts", "--step", "1d", "--start", "2026-03-01T00:00Z"]
    assert _run(key_path, tmp_path / "e.parquet", tmp_path / "o.jsonl", *UNKNOWN, *clock) == 1
    err = capsys.readouterr().err
    assert "time zone 'Mars/Phobos' is not one Python knows" in err and err.count("\n") == 1


def test_a_clocked_user_or_time_column_named_items_is_refused_in_words(tmp_path):
    """Review 117 (low): with a clock each row is read as the JSON Lines object of its
    event, whose items are "items": a user (or time) column of that name, the items
    being another column, overwrote them, and every record was "malformed". Refused
    in words; with integer steps (read by columns) such a name is taken."""
    from dpstream.clock import StepClock
    from dpstream.io.parquet import read_parquet_records

    times = pa.array([dt.datetime(2026, 3, 1, 1)] * 2, pa.timestamp("us", tz="UTC"))
    table = pa.table({"ts": times, "tags": [["a"], ["b"]], "items": ["u1", "u2"]})
    pq.write_table(table, tmp_path / "c.parquet")
    clock = StepClock.parse("2026-03-01T00:00Z", "1h")
    with pytest.raises(ValueError, match="--user-field 'items' is a name the reader gives"):
        list(
            read_parquet_records(
                str(tmp_path / "c.parquet"), time_field="ts", clock=clock,
                item_column="tags", user_field="items",
            )
        )  # fmt: skip
    stepped = pa.table({"t": [1, 2], "tags": [["a"], ["b"]], "items": ["u1", "u2"]})
    pq.write_table(stepped, tmp_path / "s.parquet")
    recs = list(
        read_parquet_records(str(tmp_path / "s.parquet"), item_column="tags", user_field="items")
    )
    assert [(r.t, r.items, r.user) for r in recs] == [(1, ("a",), "u1"), (2, ("b",), "u2")]


def _long_string_rows(n: int, size: int, per_item: bool) -> pa.Table:
    """``n`` rows that repeat two strings of ``size`` characters: one row per event
    (``t``, ``items``, ``user``) or one row per item (``t``, ``event``, ``item``,
    ``user``), in 8 steps. The strings are dictionary arrays (each long string held
    once here too); written with ``store_schema=False`` they read back as strings."""
    long_a = pa.array(["a" * size])
    users = pa.DictionaryArray.from_arrays(
        pa.array([1 if i % 3 else 0 for i in range(n)], pa.int32()), pa.array(["u", "b" * size])
    )
    t = pa.array([1 + i % 8 for i in range(n)], pa.int64())
    if per_item:
        item = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), long_a)
        event = pa.array([i % 50 for i in range(n)], pa.int64())
        return pa.table({"t": t, "event": event, "item": item, "user": users})
    words = pa.DictionaryArray.from_arrays(
        pa.array(np.tile(np.array([0, 1], np.int32), n)), pa.array(["a" * size, "w1"])
    )
    items = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), words)
    return pa.table({"t": t, "items": items, "user": users})


@pytest.mark.parametrize("encoding", ["dictionary", "plain", "categorical"])
def test_long_repeated_strings_are_decoded_a_bounded_batch_at_a_time(
    tmp_path, monkeypatch, encoding
):
    """Review 117: a dictionary of one long string under 65,536 indices (a 2 KB file)
    was decoded a whole batch at once, 1 GB. Each batch now decodes to at most
    BATCH_BYTES of strings (or is one row); the records are the rows as Arrow reads the
    whole table (a brute-force reading, row by row)."""
    import dpstream.io.parquet as reader

    monkeypatch.setattr(reader, "BATCH_BYTES", 1 << 16)
    table = _long_string_rows(3000, 1000, per_item=False)
    path = tmp_path / "long.parquet"
    pq.write_table(  # categorical: the dictionary types stored (pandas categoricals)
        table,
        path,
        use_dictionary=encoding != "plain",
        compression="zstd",
        row_group_size=2000,
        store_schema=encoding == "categorical",
    )
    assert pa.types.is_dictionary(pq.read_schema(path).field("user").type) == (
        encoding == "categorical"
    )
    settings = dict(
        time_column=None, item_column=None, event_column="event", time_field=None,
        clock=None, user_field="user",
    )  # fmt: skip
    sizes = []
    for _, batch in reader._batches(str(path), settings):
        items = sum(len(x) for row in batch.column("items").to_pylist() for x in row)
        users = sum(len(u) for u in batch.column("user").to_pylist())
        sizes.append((batch.num_rows, items + users))
    assert sum(n for n, _ in sizes) == 3000
    # rows of 1,002 + 1,000 (or 1) characters: 32 rows (64,064 bytes) fit under 65,536
    assert all(n == 1 or size <= 1 << 16 for n, size in sizes), sizes
    assert len(sizes) >= 3000 * 1000 // (1 << 16)
    want = [
        (i + 1, row["t"], None, tuple(row["items"]), row["user"])
        for i, row in enumerate(pq.read_table(path).to_pylist())
    ]
    assert _flat(read_parquet_chunks(str(path), user_field="user")) == want


def test_one_row_per_item_holds_each_long_string_once(tmp_path):
    """Review 117: one row per item holds every row until the input ends; a file of one
    long item repeated held a copy of it, and of the row's bytes, per row (17 GB for a
    48 KB file). The records are those of a brute-force grouping of the rows."""
    table = _long_string_rows(2000, 1000, per_item=True)
    path = tmp_path / "long.parquet"
    pq.write_table(table, path, row_group_size=700, store_schema=False)
    groups: dict[tuple, list[int]] = {}
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        groups.setdefault((row["t"], row["user"], str(row["event"])), []).append(i)
    want = [
        (first[0] + 1, rows[first[0]]["t"], None, tuple(rows[i]["item"] for i in first), user)
        for (_, user, _), first in sorted(groups.items(), key=lambda kv: kv[1][0])
    ]
    chunks = list(read_parquet_chunks(str(path), user_field="user"))
    assert _flat(chunks) == want
    # each chunk's bytes are bounded (records of long rows are not held 4,096 at once)
    from dpstream.io.chunks import CHUNK_RAW_BYTES

    longest = max(len(b"\n".join([b"x" * 1100] * len(ix))) for ix in groups.values())
    assert all(len(ch.buf) <= CHUNK_RAW_BYTES + longest for ch in chunks)


@pytest.mark.parametrize("per_item", [False, True])
def test_a_small_file_of_long_repeated_strings_runs_in_bounded_memory(tmp_path, key_path, per_item):
    """End to end (a fresh process, its peak resident memory): 100,000 rows repeating
    an 8 KB string decode to 800 MB. Before, the run peaked at 2.0 GB (one row per
    event) and 4.6 GB (one row per item); now each batch and chunk holds at most 8 MB
    of strings, and every distinct string is held once (peaks of 230-310 MB). 500 MB
    is 1.6 times that, and a quarter of the smallest peak before."""
    path = tmp_path / "long.parquet"
    table = _long_string_rows(100_000, 8192, per_item)
    pq.write_table(table, path, compression="zstd", store_schema=False)
    assert path.stat().st_size < 1 << 20  # a small file
    out = tmp_path / "out.jsonl"
    argv = [
        "run", "--quiet", "-T", "8", "--key-file", str(key_path), "-i", str(path),
        "-o", str(out), *own_ledger(out), *UNKNOWN,
    ]  # fmt: skip
    code, peak_mb, err = run_peak(argv)
    assert code == 0, err
    assert peak_mb < 500, peak_mb
    assert len(out.read_text().splitlines()) == 8


@pytest.mark.parametrize("item", ["", None, 7, "abc"])
def test_rows_of_many_items_are_read_a_bounded_number_of_items_at_a_time(
    tmp_path, monkeypatch, item
):
    """Review 118: a 20 KB file of 65,536 rows of 3,000 empty strings each (or nulls, or
    integers) was read 65,536 rows at a time, 196 M items, and failed with NumPy's
    MemoryError after 4.8 GB. A batch now holds at most BATCH_VALUES items (or one row),
    sized from the row group's counts of values before it is read; the records are
    the rows as Arrow reads the whole table."""
    import dpstream.io.parquet as reader

    monkeypatch.setattr(reader, "BATCH_VALUES", 10_000)
    rows, width = 4000, 300
    typ = pa.int64() if isinstance(item, int) else pa.string()
    values = pa.array([item] * (rows * width), typ)
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
    table = pa.table(
        {"t": pa.array(1 + np.arange(rows) % 6), "items": pa.ListArray.from_arrays(offsets, values)}
    )
    path = tmp_path / "wide.parquet"
    pq.write_table(table, path, compression="zstd")
    settings = dict(
        time_column=None, item_column=None, event_column="event", time_field=None,
        clock=None, user_field=None,
    )  # fmt: skip
    counts = [
        (b.num_rows, sum(len(r) for r in b.column("items").to_pylist()))
        for _, b in reader._batches(str(path), settings)
    ]
    assert sum(n for n, _ in counts) == rows
    assert all(n == 1 or k <= 10_000 for n, k in counts), counts
    want = [
        (i + 1, r["t"], "null item" if item is None else None, r["items"])
        for i, r in enumerate(table.to_pylist())
    ]
    got = _flat(read_parquet_chunks(str(path)))
    assert len(got) == rows
    for (line, t, err, items, _), (wline, wt, werr, witems) in zip(got, want, strict=True):
        assert (line, t) == (wline, wt)
        if werr is None:
            assert err is None and items == tuple(str(x) for x in witems)
        else:
            assert err is not None and items == ()


def test_a_column_named_like_the_items_leaf_does_not_take_its_place(tmp_path, monkeypatch):
    """Review 118: the string leaves read dictionary-encoded were found by dotted path,
    so a top-level column named ``items.list.element`` took the place of the list
    column's leaf, which was read plain and decoded whole. Leaves are now counted from
    the schema: the batches are cut as they are without that column."""
    import dpstream.io.parquet as reader

    monkeypatch.setattr(reader, "BATCH_BYTES", 1 << 16)
    table = _long_string_rows(3000, 1000, per_item=False)
    table = table.append_column("items.list.element", pa.array(["x"] * 3000))
    path = tmp_path / "dots.parquet"
    pq.write_table(table, path, store_schema=False, row_group_size=3000)
    settings = dict(
        time_column=None, item_column=None, event_column="event", time_field=None,
        clock=None, user_field=None,
    )  # fmt: skip
    sizes = [
        (b.num_rows, sum(len(x) for r in b.column("items").to_pylist() for x in r))
        for _, b in reader._batches(str(path), settings)
    ]
    assert len(sizes) > 1 and all(n == 1 or k <= 1 << 16 for n, k in sizes), sizes


def test_a_column_named_with_a_dot_beside_a_struct_of_that_name_is_read(tmp_path):
    """Arrow reads a struct ``ev`` beside the column ``ev.step`` that a run asks for (its
    leaf has that dotted path): the reader leaves it be, and the records are those of
    the columns named (the strings read dictionary-encoded and decoded back)."""
    n = 40
    table = pa.table(
        {
            "ev.step": pa.array([1 + i % 4 for i in range(n)], pa.uint64()),
            "ev": pa.array([{"step": 4 - i % 4} for i in range(n)]),
            "items": pa.array([[f"i{i % 5}", f"i{i % 7}"] for i in range(n)]),
            "user.id": [f"u{i % 6}" for i in range(n)],
            "user": pa.array([{"id": f"row{i}"} for i in range(n)]),
        }
    )
    path = tmp_path / "dots.parquet"
    pq.write_table(table, path)
    got = _flat(read_parquet_chunks(str(path), time_column="ev.step", user_field="user.id"))
    want = [(i + 1, 1 + i % 4, None, (f"i{i % 5}", f"i{i % 7}"), f"u{i % 6}") for i in range(n)]
    assert got == want
