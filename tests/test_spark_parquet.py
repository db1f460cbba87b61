"""``dpstream run --engine spark`` on Parquet input: the local engine's releases.

A Parquet file and a directory of partitions (several files, read on their own and
numbered in sorted order) give, on Spark, the long table the local engine writes for
the same events in JSON Lines (and in Parquet), invalid rows and user ids included;
what Spark does not read (one row per item, timestamps) is refused before the job.

Skips as tests/test_spark.py does (PySpark and a Java runtime are needed).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from .conftest import own_ledger
from .test_parquet_input import SCHEMA, UNKNOWN, USERS, _events, _jsonl, _partitions

pytestmark = pytest.mark.spark

if os.environ.get("DPSTREAM_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: Spark cannot start", allow_module_level=True)

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from dpstream.cli import main  # noqa: E402

from .conftest import fixed_key  # noqa: E402

T = 12


def _table(path: Path) -> pd.DataFrame:
    """A long CSV output (a file, or Spark's directory of parts) sorted by (t, item)."""
    parts = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    frame = pd.concat(pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in parts)
    return frame.sort_values(["t", "item"], na_position="first").reset_index(drop=True)


@pytest.mark.parametrize("users", [False, True])
def test_spark_reads_parquet_as_the_local_engine(tmp_path, users):
    key = tmp_path / "k.key"
    fixed_key("spark-parquet").save(key)
    rows = _events(8, n=600)
    for i, row in enumerate(rows):  # many users: user-level bounding leaves counts to release
        if row["user"]:
            row["user"] = f"u{i % 300}"
    _jsonl(rows, tmp_path / "e.jsonl")
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, tmp_path / "e.parquet", row_group_size=64)
    _partitions(table, tmp_path / "lake", [150, 151, 420])
    extra = [*UNKNOWN, "--on-invalid", "skip", "--max-invalid", "50%"]
    if users:
        extra += USERS

    def run(src: str, out: Path, *engine: str) -> pd.DataFrame:
        argv = ["run", "--quiet", "-T", str(T), "--key-file", str(key), "-i", str(tmp_path / src)]
        assert main([*argv, *extra, *engine, "-o", str(out), *own_ledger(out)]) == 0
        return _table(out)

    local = run("e.jsonl", tmp_path / "local.csv")
    assert len(local) > T
    assert local.equals(run("e.parquet", tmp_path / "local-parquet.csv"))
    for src in ("e.parquet", "lake"):
        got = run(src, tmp_path / f"spark-{src}.csv", "--engine", "spark", "--master", "local[2]")
        pd.testing.assert_frame_equal(got, local, check_dtype=False)


def test_spark_refuses_what_it_does_not_read_parquet(tmp_path, capsys):
    key = tmp_path / "k.key"
    fixed_key("spark-parquet").save(key)
    pq.write_table(
        pa.table({"t": [1, 1], "event": ["a", "a"], "item": ["x", "y"]}), tmp_path / "r.parquet"
    )
    out = tmp_path / "out"
    argv = ["run", "-T", "3", "--key-file", str(key), *UNKNOWN, "--engine", "spark", "-o", str(out)]
    assert main([*argv, "-i", str(tmp_path / "r.parquet"), *own_ledger(out)]) == 1
    assert "one row per item runs on the local engine" in capsys.readouterr().err
    assert not out.exists()
    pq.write_table(
        pa.table({"ts": ["2026-03-01T01:00Z"], "items": [["x"]]}), tmp_path / "c.parquet"
    )
    clock = ["--time-field", "ts", "--step", "1h", "--start", "2026-03-01T00:00Z"]
    assert main([*argv, *clock, "-i", str(tmp_path / "c.parquet"), *own_ledger(out)]) == 1
    assert "timestamps (--time-field) in Parquet run on the local engine" in capsys.readouterr().err
    assert not out.exists()
    # review finding: columns "t" and "T" failed with Spark's AnalysisException
    pq.write_table(pa.table({"t": [1], "T": [2], "items": [["x"]]}), tmp_path / "case.parquet")
    assert main([*argv, "-i", str(tmp_path / "case.parquet"), *own_ledger(out)]) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(
        "its columns 't' and 'T' differ only in case, which Spark does not "
        "tell apart; rename one, or run the input on the local engine"
    ), said
    assert not out.exists() and not Path(f"{out}.ledger").exists()


def test_a_column_name_with_a_dot_is_that_column_not_a_struct_field(tmp_path):
    """Review finding (privacy): Spark took ``--user-field user.id`` as the field ``id``
    of a struct column ``user`` (a different id per row: each event its own user, while
    the output claimed per-user bounds), and ``--time-column ev.step`` as ``ev``'s
    ``step``. The local engine reads the columns named so; Spark now does too. (And a
    ``uint64`` step past int64 stopped both engines; it is past the horizon.)"""
    key = tmp_path / "k.key"
    fixed_key("spark-dots").save(key)
    n = 240
    table = pa.table(
        {
            # uint64 steps, one past int64: past the horizon (Spark's cast overflowed)
            "ev.step": pa.array([2**64 - 1] + [1 + i % 4 for i in range(1, n)], pa.uint64()),
            "ev": pa.array([{"step": 4 - i % 4} for i in range(n)]),  # other steps
            "items": pa.array([[f"i{i % 5}", f"i{i % 7}"] for i in range(n)]),
            "user.id": [f"u{i % 6}" for i in range(n)],  # 6 real users
            "user": pa.array([{"id": f"row{i}"} for i in range(n)]),  # one per row
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    argv = ["run", "--quiet", "-T", "4", "--key-file", str(key), "-i", str(tmp_path / "d.parquet")]
    argv += ["-m", "unknown", "--max-items", "2", "--rho", "1e6", "--threshold-delta", "1e-6"]
    argv += ["--time-column", "ev.step", "--user-field", "user.id"]
    argv += ["--max-items-per-user", "2", "--max-count-per-item", "1"]
    tables = []
    on_spark = ["--engine", "spark", "--master", "local[2]"]
    for out, engine in ((tmp_path / "l.csv", []), (tmp_path / "s.csv", on_spark)):
        assert main([*argv, *engine, "-o", str(out), *own_ledger(out)]) == 0
        tables.append(_table(out))
    local, spark = tables
    # 6 users, each kept for at most 2 items once: at most 12 contributions in all
    assert 0 < local[local["t"] == 4]["value"].sum() <= 12
    pd.testing.assert_frame_equal(spark, local, check_dtype=False)


def test_strings_that_are_not_utf8_are_invalid_records_on_both_engines(tmp_path, capsys):
    """Review finding: Parquet items whose bytes are not UTF-8 passed Spark's read as
    plain events and crashed the release after the ledger's claim (a rerun refused),
    and user ids so were taken as users (the local engine stopped on the codec). Both
    engines now skip such rows as invalid records, or stop at the same one in the
    same words with ``--on-invalid error``."""
    from .test_parquet_input import _not_utf8_table

    key = tmp_path / "k.key"
    fixed_key("spark-utf8").save(key)
    rows = _events(3, n=400, invalid=False)
    for i, row in enumerate(rows):
        row["user"] = f"u{i % 150}"
    table = _not_utf8_table(rows, {5: b"\xff\xfe", 90: b"\xed\xa0\x80"}, {9: b"u\xff"})
    pq.write_table(table, tmp_path / "e.parquet")
    argv = ["run", "-T", str(T), "--key-file", str(key), "-i", str(tmp_path / "e.parquet")]
    argv += [*UNKNOWN, *USERS]
    on_spark = ["--engine", "spark", "--master", "local[2]"]
    tables, said = [], []
    for out, engine in ((tmp_path / "l.csv", []), (tmp_path / "s.csv", on_spark)):
        capsys.readouterr()
        assert main([*argv, *engine, "-o", str(out), *own_ledger(out)]) == 0
        said.append(re.findall(r"\d+ skipped \(.*\)|\d+ invalid skipped", capsys.readouterr().err))
        tables.append(_table(out))
        capsys.readouterr()
        err = out.with_name(out.name + "-error")
        assert (
            main([*argv, *engine, "--on-invalid", "error", "-o", str(err), *own_ledger(err)]) == 1
        )
        said.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert not (tmp_path / "s.csv-error").exists()
    assert not (tmp_path / "s.csv-error.ledger").exists()  # refused before any claim
    pd.testing.assert_frame_equal(tables[1], tables[0], check_dtype=False)
    assert said[0] == ["3 skipped (3 not valid UTF-8)"] and said[2] == ["3 invalid skipped"]
    assert (
        said[1]
        == said[3]
        == (
            "dpstream: error: input line 6: not valid UTF-8 (--verbose-errors shows the "
            "record's content) (see --on-invalid)"
        )
    )


def test_spark_reads_the_item_columns_the_local_engine_reads(tmp_path, capsys):
    """Review 72: a list column of no element type (every list empty) and a fixed-size
    list column release on Spark what the local engine releases; a file with both
    ``items`` and ``item`` is refused on Spark too unless --item-column names one."""
    key = tmp_path / "k.key"
    fixed_key("spark-items").save(key)
    n = 120
    steps = pa.array([1 + i % 4 for i in range(n)], pa.int64())
    pairs = [[f"i{i % 5}", f"i{5 + i % 3}"] for i in range(n)]
    files = {
        "empty": pa.table({"t": steps, "items": pa.array([[]] * n, pa.list_(pa.null()))}),
        "fixed": pa.table({"t": steps, "items": pa.array(pairs, pa.list_(pa.string(), 2))}),
        "both": pa.table(
            {
                "t": steps,
                "items": pairs,
                "item": [p[0] for p in pairs],
                "event": [f"e{i}" for i in range(n)],
            }
        ),  # fmt: skip
    }
    for name, table in files.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
    argv = ["run", "--quiet", "-T", "4", "--key-file", str(key), *UNKNOWN]
    on_spark = ["--engine", "spark", "--master", "local[2]"]
    out = tmp_path / "refused.csv"
    both = ["-i", str(tmp_path / "both.parquet")]
    assert main([*argv, *both, *on_spark, "-o", str(out), *own_ledger(out)]) == 1
    assert "both a column 'items'" in capsys.readouterr().err
    assert not out.exists()
    for name, extra in (("empty", []), ("fixed", []), ("both", ["--item-column", "items"])):
        src = ["-i", str(tmp_path / f"{name}.parquet"), *extra]
        tables = []
        for engine in ("local", "spark"):
            out = tmp_path / f"{name}-{engine}.csv"
            flags = on_spark if engine == "spark" else []
            assert main([*argv, *src, *flags, "-o", str(out), *own_ledger(out)]) == 0
            tables.append(_table(out))
        pd.testing.assert_frame_equal(tables[1], tables[0], check_dtype=False)
