"""``dpstream run --engine spark`` on Parquet input: the local engine's releases.

A Parquet file and a directory of partitions (several files, read on their own and
numbered in sorted order) give, on Spark, the long table the local engine writes for
the same events in JSON Lines (and in Parquet), invalid rows and user ids included;
what Spark does not read (one row per item, timestamps) is refused before the job.

Skips as tests/test_spark.py does (PySpark and a Java runtime are needed).
"""

from __future__ import annotations

import os
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
