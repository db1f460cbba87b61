"""Spark's own JSON Lines reader makes the local parser's decisions, line for line.

The Spark engine takes the lines it can prove plain as orjson parses them and
gives the others to the local one-line parser; a corpus
of tricky lines (escapes, unicode, numbers as items, ``01``, ``1e2``, huge
integers, duplicate keys, missing fields, null items, byte-order marks, blank
lines, arrays, nested fields, steps below 1, invalid UTF-8, users of each type)
must give the records, steps, items, user ids and messages of the local reader,
in every time mode, and the same releases, invalid counts and first bad line on
the command line. Line numbers must be exact over many splits and the files of
a directory. Skips like tests/test_spark.py (no PySpark or no Java).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from dpstream.io.chunks import INT64_MAX
from dpstream.io.jsonl import read_jsonl
from dpstream.io.records import guard_lines, open_input

from .conftest import assert_spark_csv_matches, fixed_key, own_ledger

pytestmark = pytest.mark.spark

if os.environ.get("DPSTREAM_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: Spark cannot start", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402

from dpstream.clock import StepClock  # noqa: E402
from dpstream.spark.read_jsonl import plain_event, read_events_jsonl  # noqa: E402

#: Lines (bytes, without their line feed) each engine must decide the same way.
TRICKY: list[bytes] = [
    b'{"t": 1, "items": ["a", "b"]}',
    b'{"t":2,"items":["a"],"user":"u1"}',
    b'{ "t" : 2 , "items" : [ "sp" , "aces" ] , "user" : "u2" }',
    b'{"t": 3, "items": ["caf\\u00e9"], "user": "u1"}',
    '{"t": 3, "items": ["café", "ａ", "😀"], "user": "ü"}'.encode(),
    b'{"t": 3, "items": ["a\\"b", "c\\\\d", "\\/"], "user": "u1"}',
    b'{"t": 4, "items": [5, "a"], "user": "u1"}',
    b'{"t": 4, "items": [123456789012345678901234567890], "user": "u1"}',
    b'{"t": 4, "items": [1.5], "user": "u1"}',
    b'{"t": 4, "items": [1e2], "user": "u1"}',
    b'{"t": 4, "items": [true], "user": "u1"}',
    b'{"t": 4, "items": [{"a": 1}], "user": "u1"}',
    b'{"t": 4, "items": ["a", null], "user": "u1"}',
    b'{"t": 4, "items": null, "user": "u1"}',
    b'{"t": 4, "items": "a", "user": "u1"}',
    b'{"t": 4, "items": [], "user": "u3"}',
    b'{"t": 01, "items": ["a"], "user": "u1"}',
    b'{"t": 1e2, "items": ["a"], "user": "u1"}',
    b'{"t": 1.0, "items": ["a"], "user": "u1"}',
    b'{"t": -0, "items": ["a"], "user": "u1"}',
    b'{"t": 0, "items": ["a"], "user": "u1"}',
    b'{"t": -3, "items": ["a"], "user": "u1"}',
    b'{"t": "6", "items": ["a"], "user": "u1"}',
    b'{"t": true, "items": ["a"], "user": "u1"}',
    b'{"t": null, "items": ["a"], "user": "u1"}',
    b'{"t": 999999999999999999, "items": ["a"], "user": "u1"}',
    b'{"t": 1234567890123456789, "items": ["a"], "user": "u1"}',
    b'{"t": 123456789012345678901234567890, "items": ["a"], "user": "u1"}',
    b'{"t": 5, "t": 6, "items": ["a"], "user": "u1"}',
    b'{"t": 5, "items": ["a"], "items": ["b"], "user": "u1"}',
    b'{"t": 5, "items": ["a"], "user": "u1", "user": "u2"}',
    b'{"T": 5, "t": 6, "Items": ["x"], "items": ["b"], "User": "v", "user": "u1"}',
    b'{"items": ["a"], "user": "u1"}',
    b'{"t": 5, "user": "u1"}',
    b'{"t": 5, "items": ["a"]}',
    b'{"t": 5, "items": ["a"], "user": ""}',
    b'{"t": 5, "items": ["a"], "user": 5}',
    b'{"t": 5, "items": ["a"], "user": null}',
    b'{"t": 5, "items": ["a"], "user": ["u1"]}',
    b'{"t": 5, "items": ["a"], "user": {"id": "u1"}}',
    b'{"t": 5, "items": ["a"], "user": "u\\u00e9"}',
    b'{"t": 5, "items": ["\\ud800"], "user": "u1"}',
    b'{"t": 5, "items": ["a"], "user": "\\udc00"}',
    b'{"t": 5, "items": ["a\\u0000b"], "user": "u1"}',
    b'{"t": 5, "items": ["a\tb"], "user": "u1"}',
    b'{"t": 5, "items": ["a\xffb"], "user": "u1"}',
    b'{"t": 5, "items": ["a\xef\xbf\xbdb"], "user": "u1"}',
    b'{"t": 5, "items": ["\xe2\x80\xa8"], "user": "u1"}',
    b'\xef\xbb\xbf{"t": 5, "items": ["bom"], "user": "u1"}',
    b"",
    b"   ",
    b"\t",
    b'  {"t": 6, "items": ["padded"], "user": "u1"}  ',
    b'{"t": 6, "items": ["crlf"], "user": "u1"}\r',
    b'{"t": 6, "items": ["a"], "user": "u1", "meta": {"x": [1, {"y": 2.5}]}, "n": 00}',
    b'{"t": 6, "items": ["a"], "user": "u1", "meta": {"x": [1, {"y": 2.5}]}}',
    b'{"t": 6, "items": ["a"], "user": "u1", "n": 12, "ok": true, "no": null, "s": ["x"]}',
    b'{"t": 6, "items": ["a"], "user": "u1",}',
    b'{"t": 6 "items": ["a"], "user": "u1"}',
    b'{"t": 6, "items": ["a"], "user": "u1"} trailing',
    b'{"t": 6, "items": ["a"], "user": "u1"}{"t": 7}',
    b"{'t': 6, 'items': ['a'], 'user': 'u1'}",
    b'{"t": NaN, "items": ["a"], "user": "u1"}',
    b'{"t": 6, "items": ["a"], "user": "u1", "x": Infinity}',
    b'{"t": 6, "items": ["a"], "user": "u1" /* c */}',
    b'{t: 6, "items": ["a"], "user": "u1"}',
    b'{"t": 6, "items": ["a","b","c","d","e","f"], "user": "u4"}',
    b'{"t": 7, "items": ["' + b"long" * 300 + b'"], "user": "u1"}',
    b'{"t": 7, "items": ["a"], "user": "u1", "deep": ' + b"[" * 300 + b"]" * 300 + b"}",
    b'["a", "b"]',
    b'["a", 5, null]',
    b"[]",
    b'"just a string"',
    b"42",
    b"null",
    b"{}",
    b"{",
    b'{"t": 8, "items": ["a"], "user": "u1"}',
    b'{"ts": "2026-03-01T01:30:00Z", "t": 2, "items": ["clock"], "user": "u1"}',
    b'{"ts": 1772328600, "items": ["epoch"], "user": "u1"}',
    b'{"ts": "2026-03-01 02:00+01:00", "items": ["offset"], "user": "u1"}',
    b'{"ts": "2026-02-28T23:00:00Z", "items": ["early"], "user": "u1"}',
    b'{"ts": "yesterday", "items": ["bad"], "user": "u1"}',
    b'{"ts": true, "items": ["bad"], "user": "u1"}',
]

CLOCK = ("ts", "2026-03-01T00:00:00Z", "1h")


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dpstream-read-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _write(path: Path, lines: list[bytes], *, bom: bool = False) -> None:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"".join(x + b"\n" for x in lines))


def _local(paths: list[Path], **mode) -> dict[int, tuple]:
    """The local reader's records by line number over ``paths`` in order: (t, items,
    error, user); a line that is no record is absent."""
    out: dict[int, tuple] = {}
    done = 0
    for path in paths:
        with open_input(str(path)) as f:
            lines = list(guard_lines(f, str(path)))
        for rec in read_jsonl(lines, **mode):
            t = None if mode.get("implicit") else rec.t
            t = None if t is None else min(t, INT64_MAX)
            out[done + rec.line] = (t, rec.items, rec.error, rec.user)
        done += len(lines)
    return out


def _spark(spark, path: Path, **mode) -> dict[int, tuple]:
    """Spark's rows as :func:`_local` gives records (a row with error "" is no record)."""
    rows = read_events_jsonl(spark, str(path), **mode).collect()
    assert len({row.pos for row in rows}) == len(rows)
    out: dict[int, tuple] = {}
    for row in rows:
        if row.error == "":
            continue
        t = None if mode.get("implicit") else row.t
        items = None if row["items"] is None else tuple(row["items"])
        out[row.pos + 1] = (t, items, row.error, row.user)
    return out


MODES = {
    "steps": {},
    "users": {"user_field": "user"},
    "implicit": {"implicit": True},
    "implicit-users": {"implicit": True, "user_field": "user"},
    "clock-users": {
        "time_field": CLOCK[0],
        "clock": StepClock.parse(CLOCK[1], CLOCK[2]),
        "user_field": "user",
    },
}


@pytest.mark.parametrize("mode", list(MODES))
def test_tricky_lines_get_the_local_decisions(spark, tmp_path, mode) -> None:
    """Every line of the corpus: the same record (or none), step, items, user id and
    message on Spark as on the local reader, in each time mode; the plain lines
    are numerous enough that the fast path is used (many records in it)."""
    lines = [*TRICKY, *TRICKY[::-1]]
    path = tmp_path / "tricky.jsonl"
    _write(path, lines, bom=True)
    want = _local([path], **MODES[mode])
    got = _spark(spark, path, **MODES[mode])
    assert sum(v[2] is None for v in want.values()) >= 6  # events, not only errors
    assert sum(v[2] is not None for v in want.values()) >= 10
    if mode in ("steps", "users"):  # lines the fast path takes (the other modes: none)
        user = MODES[mode].get("user_field")
        assert sum(plain_event(line, user) is not None for line in lines) >= 40
    for line in sorted(set(want) | set(got)):
        assert got.get(line) == want.get(line), (line, lines[(line - 1) % len(lines)])


def test_line_numbers_are_exact_over_splits_and_files(spark, tmp_path) -> None:
    """A directory of files of different sizes, read in splits of ~1 KB (Spark packs
    them into partitions by size, not by name): each line's number is its place over
    the files in the order of their paths, and an invalid line says which it is."""
    folder = tmp_path / "lake"
    folder.mkdir()
    names = ["a.jsonl", "b-x.jsonl", "b.jsonl", "c.jsonl"]
    sizes = [40, 400, 5, 130]
    paths = []
    k = 0
    for name, size in zip(names, sizes, strict=True):
        lines = []
        for _ in range(size):
            k += 1
            line = {"t": k, "items": [f"i{k}"]}
            lines.append(json.dumps(line).encode() if k % 37 else b'{"t": 0, "items": []}')
        paths.append(folder / name)
        _write(paths[-1], lines)
    conf = {"spark.sql.files.maxPartitionBytes": "1024", "spark.sql.files.openCostInBytes": "1"}
    old = {name: spark.conf.get(name) for name in conf}
    for name, value in conf.items():
        spark.conf.set(name, value)
    try:
        got = _spark(spark, folder)
        text = spark.read.text(str(folder))
        splits = text.select("_metadata.file_path", "_metadata.file_block_start").distinct()
        assert splits.count() > text.rdd.getNumPartitions() > 8  # splits packed together
    finally:
        for name, value in old.items():
            spark.conf.set(name, value)
    assert got == _local(paths)
    assert len(got) == sum(sizes)
    assert sorted(line for line, rec in got.items() if rec[2] is None) == [
        line for line in range(1, k + 1) if line % 37
    ]


@pytest.mark.parametrize("users", [False, True])
def test_command_line_on_the_corpus_matches_the_local_engine(
    spark, tmp_path, capsys, users
) -> None:
    """The whole run on the corpus: the same releases and skipped count on both engines,
    and with ``--on-invalid error`` the same first bad line."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-read").save(key)
    lines = [*TRICKY, *TRICKY]
    inp = tmp_path / "in.jsonl"
    _write(inp, lines)
    common = ["run", "-m", "unknown", "-T", "10", "--rho", "2", "--threshold-delta", "1e-3"]
    common += ["--key-file", str(key), "-i", str(inp), "--no-clamp"]
    if users:
        common += ["--user-field", "user", "--max-items-per-user", "3"]
        common += ["--max-count-per-item", "1"]
    else:
        common += ["--max-items", "3"]

    def run(out: Path, *extra: str) -> int:
        return cli.main([*common, *extra, "-o", str(out), *own_ledger(out)])

    on_spark = ["--engine", "spark", "--master", "local[2]"]
    skip = ["--on-invalid", "skip", "--max-invalid", "100%"]
    capsys.readouterr()
    assert run(tmp_path / "local.csv", *skip) == 0
    local_skipped = re.findall(
        r"invalid events: 0 truncated, (\d+) skipped", capsys.readouterr().err
    )
    spark_out = tmp_path / "spark.csv"
    assert run(spark_out, *skip, *on_spark) == 0
    spark_skipped = re.findall(r"\((\d+) invalid skipped\)", capsys.readouterr().err)
    assert len(local_skipped) == 1
    assert int(local_skipped[0]) > 40
    assert spark_skipped == local_skipped
    first_bad = []
    for name, engine in (("local-error.csv", []), ("spark-error", on_spark)):
        assert run(tmp_path / name, "--on-invalid", "error", *engine) != 0
        first_bad.append(re.findall(r"input line (\d+)", capsys.readouterr().err))
    assert not (tmp_path / "spark-error").exists()  # stopped before anything is written
    assert len(first_bad[0]) == 1
    assert first_bad[1] == first_bad[0]
    assert_spark_csv_matches(tmp_path / "local.csv", spark_out)


@pytest.mark.parametrize("name", ["_events.jsonl", ".events.jsonl"])
def test_an_input_spark_would_skip_is_refused_not_read_as_empty(spark, tmp_path, name) -> None:
    """Review finding: Spark skips files named "_x" or ".x" even when given by name, so
    the run released noise over no events; now it is refused (the local engine reads
    such a file)."""
    path = tmp_path / name
    _write(path, [b'{"t": 1, "items": ["a"]}'])
    assert len(_local([path])) == 1
    with pytest.raises(ValueError, match="finds no file.*run it on the local engine"):
        read_events_jsonl(spark, str(path))
    folder = tmp_path / "only-hidden"
    (folder / "_sub").mkdir(parents=True)
    _write(folder / "_sub" / "e.jsonl", [b'{"t": 1, "items": ["a"]}'])
    _write(folder / ".e.jsonl", [b'{"t": 1, "items": ["a"]}'])
    # the local engine reads no JSON Lines folder: no advice to run it there
    with pytest.raises(ValueError, match="finds no file.*rename its files$"):
        read_events_jsonl(spark, str(folder))


def test_a_directory_is_read_file_by_file_without_partition_discovery(spark, tmp_path) -> None:
    """Review finding: Spark's partition discovery read only the ``k=1/`` folder of a
    directory that also held files at its top (they were lost, silently), and a plain
    ``sub/`` beside ``k=1/`` failed with a traceback. Now every file of the directory
    at any depth (the Parquet reader's rule: names beginning with '_' or '.' left out)
    is read, in the order of their paths, each line numbered over them all."""
    folder = tmp_path / "mixed"
    (folder / "k=1").mkdir(parents=True)
    (folder / "_skip").mkdir()
    files = {"a.jsonl": 3, "k=1/e.jsonl": 4, "z.jsonl": 2, "_u.jsonl": 1, "_skip/x.jsonl": 1}
    k = 0
    for name, n in files.items():
        lines = []
        for _ in range(n):
            k += 1
            lines.append(json.dumps({"t": k, "items": [name], "user": f"u{k}"}).encode())
        _write(folder / name, lines)
    read = [folder / "a.jsonl", folder / "k=1" / "e.jsonl", folder / "z.jsonl"]
    got = _spark(spark, folder, user_field="user")
    assert got == _local(read, user_field="user")
    assert len(got) == 9 and {rec[1][0] for rec in got.values()} == {
        "a.jsonl",
        "k=1/e.jsonl",
        "z.jsonl",
    }
    (folder / "sub").mkdir()
    _write(folder / "sub" / "d.jsonl", [b'{"t": 1, "items": ["d"]}'])
    read.insert(2, folder / "sub" / "d.jsonl")
    assert _spark(spark, folder, user_field="user") == _local(read, user_field="user")
    # by a file: URI the same files in the same order (review 68: Spark listed them
    # itself and ordered them by their names alone); a linked folder is followed, in
    # the order of its path (review 89: it was left out without a word)
    (tmp_path / "elsewhere").mkdir()
    _write(tmp_path / "elsewhere" / "0.jsonl", [b'{"t": 1, "items": ["linked"]}'])
    os.symlink(tmp_path / "elsewhere", folder / "linked")
    read.insert(2, folder / "linked" / "0.jsonl")
    got = _spark(spark, Path(folder.as_uri()), user_field="user")
    assert got == _local(read, user_field="user")


def test_a_compression_the_local_engine_does_not_inflate_is_refused(spark, tmp_path) -> None:
    """Review finding: Spark inflates .bz2 while the local engine reads its bytes as they
    are (invalid lines): the two engines would see different events."""
    import bz2

    for name in ("events.jsonl.bz2", "events.jsonl.BZ2"):  # Hadoop's codecs ignore case
        path = tmp_path / name
        path.write_bytes(bz2.compress(b'{"t": 1, "items": ["a"]}\n'))
        with pytest.raises(ValueError, match="compressed otherwise"):
            read_events_jsonl(spark, str(path))
        path.unlink()


@pytest.mark.parametrize("field", ["T", "Items", "ITEMS"])
def test_a_user_field_named_like_t_or_items_in_another_case(spark, tmp_path, field) -> None:
    """Review finding: Spark matches field names ignoring case, so a user field "T" beside
    "t" was ambiguous in the fast path and the job failed; the local parser decides."""
    path = tmp_path / "case.jsonl"
    _write(
        path,
        [
            json.dumps({"t": 1, "items": ["a"], field: "alice"}).encode(),
            json.dumps({"t": 2, "items": ["b"]}).encode(),
        ],
    )
    want = _local([path], user_field=field)
    assert _spark(spark, path, user_field=field) == want
    assert want[1][3] == "alice" and want[2][2] is not None  # an event, then an error


#: Day steps in Paris: the clocks change on 2026-03-29, so steps 29.. begin an hour
#: earlier in UTC than a zone without daylight saving (Lagos, +01 all year) puts them.
PARIS_DAYS = StepClock.parse("2026-03-01T00:00[Europe/Paris]", "1d")


def _days(path: Path) -> None:
    """An event at 22:30Z on each day of March and early April: 23:30 in Paris before
    the change, 00:30 of the next day after it (by Lagos's rules still 23:30)."""
    days = [f"2026-03-{d:02d}" for d in range(1, 32)] + ["2026-04-01", "2026-04-02"]
    path.write_text(
        "".join(json.dumps({"ts": f"{d}T22:30:00Z", "items": [d]}) + "\n" for d in days)
    )


def test_workers_with_the_drivers_zone_rules_date_events_as_the_local_reader(
    spark, tmp_path
) -> None:
    """A named-zone clock with ``through``: the workers check their zone database against
    the driver's digest (the same here) and give every event the local reader's step."""
    from dpstream.spark.read_jsonl import zone_rules

    path = tmp_path / "days.jsonl"
    _days(path)
    assert zone_rules(PARIS_DAYS, 40) is not None  # the check runs
    with pytest.raises(ValueError, match="needs through="):  # it cannot be left out
        read_events_jsonl(spark, str(path), time_field="ts", clock=PARIS_DAYS)
    got = _spark(spark, path, time_field="ts", clock=PARIS_DAYS, through=40)
    want = _local([path], time_field="ts", clock=PARIS_DAYS)
    assert got == want
    # from the change on, 22:30Z is 00:30 of the next day in Paris (step 29 gets none;
    # by Lagos's rules each would be in its own day's step: 28, 29, 30, 31)
    assert [want[n][0] for n in (28, 29, 30, 31)] == [28, 30, 31, 32]


def test_a_worker_with_other_zone_rules_is_refused_before_writing(tmp_path) -> None:
    """The workers (not the driver) find Europe/Paris with Lagos's rules, through
    ``spark.executorEnv.PYTHONTZPATH``, as on a cluster whose workers hold another
    ``tzdata``. Without the check they would put the events of Mar 29 to 31 in other
    steps than the driver dates in the output; the run is refused, nothing written."""
    import subprocess
    import sys
    from importlib import resources

    tz = tmp_path / "tz" / "Europe"
    tz.mkdir(parents=True)
    lagos = resources.files("tzdata.zoneinfo.Africa").joinpath("Lagos").read_bytes()
    (tz / "Paris").write_bytes(lagos)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.executorEnv.PYTHONTZPATH {tmp_path / 'tz'}\n")
    events = tmp_path / "days.jsonl"
    _days(events)
    fixed_key("zones").save(tmp_path / "k.key")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dpstream", "run", "-m", "unknown", "-T", "40"]
        + ["--max-items", "1", "--epsilon", "1", "--delta", "1e-6"]
        + ["--key-file", str(tmp_path / "k.key"), "-i", str(events), "-o", str(out)]
        + ["--time-field", "ts", "--start", "2026-03-01T00:00[Europe/Paris]", "--step", "1d"]
        + ["--engine", "spark", "--master", "local[1]", "-q", *own_ledger(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "SPARK_CONF_DIR": str(conf)},
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dpstream: error: this Spark worker's time zone database"), last
    assert "steps 1 to 40 of the time zone Europe/Paris" in last
    assert not out.exists()


def test_glob_characters_in_an_input_name_are_the_names_own(spark, tmp_path) -> None:
    """Review finding: Spark took ``--input day[1].jsonl`` as a Hadoop glob and read
    ``day1.jsonl`` instead (and ``{a,b}`` as two folders); the local engine reads the
    file it is named. Now the name is escaped: the same records on both engines."""
    literal = tmp_path / "day[1].jsonl"
    _write(literal, [b'{"t": 1, "items": ["named"]}'])
    _write(tmp_path / "day1.jsonl", [b'{"t": 1, "items": ["other"]}'] * 2)
    assert _spark(spark, literal) == _local([literal]) == {1: (1, ("named",), None, None)}
    folder = tmp_path / "in{a,b}*"
    folder.mkdir()
    _write(folder / "x.jsonl", [b'{"t": 2, "items": ["d"]}'])
    assert _spark(spark, folder) == _local([folder / "x.jsonl"])


def test_an_upper_case_gz_is_inflated_by_both_engines(spark, tmp_path) -> None:
    """Review finding: Hadoop inflates ``.GZ`` (its codecs ignore case) while the local
    engine read its bytes as lines; both inflate it now."""
    import gzip

    path = tmp_path / "events.jsonl.GZ"
    path.write_bytes(gzip.compress(b'{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["b"]}\n'))
    want = {1: (1, ("a",), None, None), 2: (2, ("b",), None, None)}
    assert _local([path]) == want
    assert _spark(spark, path) == want


def test_a_truncated_gz_stops_the_read_whatever_the_session_ignores(
    spark, tmp_path, capsys
) -> None:
    """Review finding: with ``spark.sql.files.ignoreCorruptFiles`` on in the operator's
    configuration, Spark released the events before the damage of a truncated ``.gz``,
    which the local engine refuses. The engine's reads now fail on it in any case."""
    import gzip

    data = gzip.compress(b"".join(b'{"t": 1, "items": ["a%d"]}\n' % i for i in range(5000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        _local([path])
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    try:
        with pytest.raises(Exception, match="(?i)unexpected end|EOF|corrupt|FAILED_READ"):
            read_events_jsonl(spark, str(path)).count()
    finally:
        spark.conf.unset("spark.sql.files.ignoreCorruptFiles")
    # the command says so in one line (it was Spark's stack of traces)
    from dpstream import cli

    fixed_key("spark-cut").save(tmp_path / "k.key")
    out = tmp_path / "out"
    capsys.readouterr()
    args = ["run", "-m", "unknown", "-T", "4", "--max-items", "1", "--rho", "1"]
    args += ["--threshold-delta", "1e-3", "--key-file", str(tmp_path / "k.key")]
    args += ["-i", str(path), "-o", str(out), "--engine", "spark", "--master", "local[2]"]
    assert cli.main([*args, *own_ledger(out)]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("dpstream: error: input ") and "truncated or corrupt" in last, last
    assert not out.exists()
    # review finding: a .gz padded with zero bytes, which the local engine reads, was
    # refused with "the local engine refuses it too"
    padded = tmp_path / "padded.jsonl.gz"
    padded.write_bytes(gzip.compress(b'{"t": 1, "items": ["a"]}\n') + bytes(512))
    assert _local([padded]) == {1: (1, ("a",), None, None)}
    args[args.index(str(path))] = str(padded)
    assert cli.main([*args, *own_ledger(out)]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "but reads a .gz padded with zero bytes after its data" in last, last
    assert not out.exists()


def test_too_many_invalid_records_are_refused_as_on_the_local_engine(
    spark, tmp_path, capsys
) -> None:
    """Review finding: the Spark engine never applied ``--max-invalid`` (5% by default):
    an input mostly past the horizon, say, was released with its few valid events.
    Now it counts the invalid records by cause as the local engine does, and refuses
    with the same message, before anything is written; a larger ``--max-invalid``
    lets both release."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-guard").save(key)
    inp = tmp_path / "in.jsonl"
    lines = [b'{"t": 1, "items": ["a"]}', b'{"t": 2, "items": ["a", "b"]}', b"{"]
    lines += [b'{"t": 50, "items": ["a"]}', b'{"t": 3, "items": ["a", "b", "c", "d"]}']
    lines += [b'{"t": 12, "items": ["a"]}']  # after --until 10: a later run's, not counted
    _write(inp, lines)
    common = ["run", "-m", "unknown", "-T", "20", "--until", "10", "--max-items", "3"]
    common += ["--rho", "2", "--threshold-delta", "1e-3", "--key-file", str(key), "-i", str(inp)]
    on_spark = ["--engine", "spark", "--master", "local[2]"]

    def refusal(out: Path, *extra: str) -> str:
        capsys.readouterr()
        assert cli.main([*common, *extra, "-o", str(out), *own_ledger(out)]) != 0
        assert not out.exists()
        return next(x for x in capsys.readouterr().err.splitlines() if "are invalid" in x)

    local = refusal(tmp_path / "local.csv")
    assert "3 of 5 input records (60.0%) are invalid" in local
    assert "1 more are for steps after --until 10" in local
    assert refusal(tmp_path / "spark", *on_spark) == local
    for out, engine in ((tmp_path / "l2.csv", []), (tmp_path / "s2", on_spark)):
        assert (
            cli.main([*common, "--max-invalid", "60%", *engine, "-o", str(out), *own_ledger(out)])
            == 0
        )


@pytest.mark.parametrize(
    "lines, mechanism",
    [
        # too many items first, a parse error after it
        (
            [b'{"t": 1, "items": ["a", "b", "c", "d"]}', b"{", b'{"t": 2, "items": ["a"]}'],
            "unknown",
        ),
        # the only invalid record has too many items
        ([b'{"t": 1, "items": ["a"]}', b'{"t": 2, "items": ["a", "b", "c", "d"]}'], "unknown"),
        # a step past the horizon (after every step), then too many items
        ([b'{"t": 50, "items": ["a"]}', b'{"t": 3, "items": ["a", "b", "c", "d"]}'], "unknown"),
        # an item outside the domain, in an event that is also too large
        ([b'{"t": 1, "items": ["a"]}', b'{"t": 2, "items": ["a", "z", "b", "c"]}'], "known"),
        # review 95: too many items, all in the domain (Spark said one was outside it)
        (
            [b'{"t": 1, "items": ["a"]}', b'{"t": 1, "items": ["a", "b", "c", "a", "b", "d"]}'],
            "known-3",
        ),  # fmt: skip
    ],
)
def test_on_invalid_error_stops_at_the_local_engines_record_in_its_words(
    spark, tmp_path, capsys, lines, mechanism
) -> None:
    """Review finding: with ``--on-invalid error`` Spark ordered only parse errors, so it
    named another line than the local engine, and an event with too many items or an
    item outside the domain failed in the workers with Spark's stack of traces. Now both
    engines stop at the same record, with the same one-line message."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-error").save(key)
    inp = tmp_path / "in.jsonl"
    _write(inp, lines)
    (tmp_path / "domain.txt").write_text("a\nb\nc\n")
    (tmp_path / "domain4.txt").write_text("a\nb\nc\nd\n")
    max_items = "2" if mechanism == "known-3" else "3"
    name = mechanism.split("-")[0]
    args = ["run", "-m", name, "-T", "10", "--max-items", max_items, "--rho", "2"]
    if mechanism == "known":
        args += ["--domain", str(tmp_path / "domain.txt")]
    elif mechanism == "known-3":
        args += ["--domain", str(tmp_path / "domain4.txt")]
    else:
        args += ["--threshold-delta", "1e-3"]
    args += ["--key-file", str(key), "-i", str(inp), "--on-invalid", "error"]
    said = []
    for out, engine in ((tmp_path / "l.csv", []), (tmp_path / "s", ["--engine", "spark"])):
        capsys.readouterr()
        assert cli.main([*args, *engine, "-o", str(out), *own_ledger(out)]) != 0
        said.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert not (tmp_path / "s").exists()  # (the local engine released the steps before)
    assert said[0].startswith("dpstream: error: input line "), said
    assert said[1] == said[0]


def test_a_file_name_with_a_colon_is_refused_in_one_line(spark, tmp_path, capsys) -> None:
    """Review 95: Hadoop reads a ':' in a path as a URI's scheme, so an input named
    ``2026-01-01T00:00.jsonl`` (or a Parquet file of a folder) failed inside Spark with
    a Java traceback. It is refused before anything is read or recorded, in one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-colon").save(key)
    named = tmp_path / "2026-01-01T00:00.jsonl"
    named.write_text('{"t": 1, "items": ["a"]}\n')
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"t": [1], "items": [["a"]]}), lake / "part:1.parquet")
    args = ["run", "-m", "unknown", "-T", "2", "--max-items", "1", "--rho", "1"]
    args += ["--threshold-delta", "1e-6", "--key-file", str(key), "--engine", "spark"]
    for given in (named, lake):
        out = tmp_path / f"out-{given.name}"
        capsys.readouterr()
        assert cli.main([*args, "-i", str(given), "-o", str(out), *own_ledger(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "takes a ':' in a file's path" in err[0], err
        assert not out.exists()


@pytest.mark.parametrize(
    ("second", "writes", "words"),
    [
        ("day1 (copy).jsonl", "same", "holds the same bytes as"),
        ("day1.jsonl.gz", "gzip", "compressed"),
        ("day1.jsonl~", "older", "is a backup"),
        ("#day1.jsonl#", "older", "is a backup"),
        ("day1.jsonl.bak", "older", "is a backup"),
    ],
)
def test_a_jsonl_folder_with_a_copy_or_a_twin_is_refused(tmp_path, second, writes, words):
    """Review 105: Spark read every file of a JSON Lines folder, so a copy of a day's
    file, its gzipped twin or an editor's backup counted its events twice (3,000 events
    released as 6,000 or 8,990, exit 0), where the Parquet reader refuses a copy. A
    folder of distinct days is read as before."""
    import gzip

    from dpstream.spark.paths import input_files

    folder = tmp_path / "in"
    folder.mkdir()
    body = "".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2, 3))
    (folder / "day1.jsonl").write_text(body)
    (folder / "day2.jsonl").write_text(body.replace('"a"', '"b"'))
    assert [Path(f).name for f in input_files(str(folder))] == ["day1.jsonl", "day2.jsonl"]
    data = {"same": body.encode(), "gzip": gzip.compress(body.encode()),
            "older": body[:-20].encode()}[writes]  # fmt: skip
    (folder / second).write_bytes(data)
    with pytest.raises(ValueError, match=re.escape(words)):
        input_files(str(folder))
    with pytest.raises(ValueError, match=re.escape(words)):
        input_files("file://" + str(folder))


def test_a_jsonl_folder_with_a_copy_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys):
    """Review 108: the folder's copy was refused only once the Spark session had started
    (17 s in); it is refused before a JVM starts, as a link reached twice is."""
    from dpstream import cli
    from dpstream.spark import command

    def no_session(*_: object, **__: object) -> None:
        raise AssertionError("a session started")

    monkeypatch.setattr(command, "start_session", no_session)
    folder = tmp_path / "in"
    folder.mkdir()
    body = "".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2, 3))
    (folder / "day1.jsonl").write_text(body)
    (folder / "day1 (copy).jsonl").write_text(body)
    key = tmp_path / "k.key"
    fixed_key("spark-read").save(key)
    argv = ["run", "-q", "-m", "unknown", "-T", "3", "--max-items", "1", "--rho", "1",
            "--threshold-delta", "1e-3", "--key-file", str(key), "-i", str(folder),
            "-o", str(tmp_path / "out"), "--engine", "spark", "--master", "local[2]"]  # fmt: skip
    capsys.readouterr()
    assert cli.main(argv) == 1
    assert "holds the same bytes as" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
