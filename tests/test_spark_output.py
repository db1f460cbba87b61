"""The Spark engine's output directory (``dpstream.spark.output``): refused when it
exists (without ``--force``) before the run reads or claims anything, replaced whole
with ``--force``, and never left half-written at its path.

The file-system half runs without Spark (a stand-in table whose writer makes part
files or fails); the command-line half runs real ``dpstream run --engine spark``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpstream.errors import StateError
from dpstream.spark import output

from .conftest import fixed_key


class _Writer:
    """What ``table.write.mode(m)`` gives: ``.json/.csv/.parquet(path)`` make a directory
    of part files, as Spark's committer does, or fail half-way when ``fail``."""

    def __init__(self, rows: list[str], fail: bool, calls: list[tuple[str, str]]) -> None:
        self.rows, self.fail, self.calls = rows, fail, calls
        self.mode_ = ""

    def mode(self, mode: str) -> _Writer:
        self.mode_ = mode
        return self

    def option(self, *_: object) -> _Writer:
        return self

    def json(self, path: str) -> None:
        self.calls.append((self.mode_, path))
        local = path.removeprefix("file://")
        os.makedirs(local)
        Path(local, "part-00000.json").write_text("".join(r + "\n" for r in self.rows[:1]))
        if self.fail:
            raise RuntimeError("executor lost")
        Path(local, "part-00001.json").write_text("".join(r + "\n" for r in self.rows[1:]))
        Path(local, "_SUCCESS").write_text("")

    csv = parquet = json


class _Table:
    def __init__(self, rows: list[str], fail: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.write = _Writer(rows, fail, self.calls)


def _rows(path: Path) -> list[str]:
    return sorted(line for p in path.glob("part-*") for line in p.read_text().splitlines() if line)


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".dpstream-" in p.name)


def test_a_new_output_is_written_beside_it_and_renamed_into_place(tmp_path) -> None:
    out = tmp_path / "sub" / "out"
    table = _Table(['{"t":1}', '{"t":2}'])
    output.write_table(table, "jsonl-long", str(out), output.OutputPlace(str(out)), force=False)
    assert _rows(out) == ['{"t":1}', '{"t":2}'] and (out / "_SUCCESS").exists()
    # Spark wrote to a hidden sibling of the output (a file: URI), never to the path itself
    ((mode, written),) = table.calls
    assert mode == "errorifexists" and written.startswith(f"file://{out.parent}/.dpstream-")
    assert _hidden(out.parent) == []


def test_a_failed_write_leaves_the_earlier_output_as_it_was(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000.json").write_text('{"t":9}\n')
    with pytest.raises(StateError, match="could not write the releases to .*: executor lost"):
        output.write_table(
            _Table(['{"t":1}', '{"t":2}'], fail=True), "csv", str(out), _at(out), True
        )
    assert _rows(out) == ['{"t":9}'] and _hidden(tmp_path) == []


def test_force_replaces_the_earlier_output_whole(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00007.json").write_text('{"t":9}\n')
    (out / ".part-00007.json.crc").write_text("")
    output.write_table(_Table(['{"t":1}', '{"t":2}']), "parquet", str(out), _at(out), True)
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS",
        "part-00000.json",
        "part-00001.json",
    ]
    assert _hidden(tmp_path) == []


def test_an_output_made_while_the_job_ran_is_kept_without_force(tmp_path) -> None:
    """Another run wrote the path after this one's check: this one refuses to replace it,
    and deletes only its own hidden directory."""
    out = tmp_path / "out"

    class _Racing(_Table):
        def __init__(self) -> None:
            super().__init__(['{"t":1}'])
            inner = self.write.json

            def json(path: str) -> None:
                out.mkdir()
                (out / "theirs").write_text("x")
                inner(path)

            self.write.json = json  # type: ignore[method-assign]

    with pytest.raises(StateError, match="exists: pass --overwrite"):
        output.write_table(_Racing(), "jsonl-long", str(out), _at(out), False)
    assert [p.name for p in out.iterdir()] == ["theirs"] and _hidden(tmp_path) == []
    # with --force too: what stands there when the job ends is checked again
    (out / "part-00000.json").write_text("{}\n")
    with pytest.raises(StateError, match="holds 'theirs'"):
        output.write_table(_Racing2(out), "jsonl-long", str(out), _at(out), True)
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.json", "theirs"]
    assert _hidden(tmp_path) == []


class _Racing2(_Table):
    """A writer during whose job another file appears in the output."""

    def __init__(self, out: Path) -> None:
        super().__init__(['{"t":1}'])
        inner = self.write.json

        def json(path: str) -> None:
            (out / "theirs").write_text("x")
            inner(path)

        self.write.json = json  # type: ignore[method-assign]


def test_what_a_stopped_run_left_beside_the_output_is_deleted_once_its_process_is_gone(
    tmp_path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now (reused only after the kernel wraps around)
    mine, here = output._digest("out", 12), output.host_namespace()
    dead = f".dpstream-{mine}-{here}-{gone.pid}-0123abcd"
    for name in (dead, f"{dead}.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-00000.json").write_text("{}\n")
    live = f".dpstream-{mine}-{here}-{os.getppid()}-89abcdef"  # a running process's
    other = f".dpstream-{output._digest('other', 12)}-{here}-{gone.pid}-0123abcd"  # not ours
    # another host's or PID namespace's: its pid means nothing here, kept for a week
    foreign = f".dpstream-{mine}-{'0' * 8 if here != '0' * 8 else '1' * 8}-{gone.pid}-0123abcd"
    stale = foreign.replace("0123abcd", "fedcba98")
    user_file = f".dpstream-{mine}-{here}-{gone.pid}-00000000"  # a file, not a run's folder
    for name in (live, other, foreign, stale):
        (tmp_path / name).mkdir()
    (tmp_path / user_file).write_text("mine")
    week = 8 * 86400
    os.utime(tmp_path / stale, (os.path.getmtime(tmp_path) - week,) * 2)
    out = tmp_path / "out"  # there: the dead pair is leftovers (without it, the pair is a
    out.mkdir()  # run stopped between its renames, finished first: the test below)
    (out / "part-00000.json").write_text("{}\n")
    output.write_table(_Table(['{"t":1}']), "jsonl-long", str(out), _at(out), True)
    assert _hidden(tmp_path) == sorted([live, other, foreign, user_file])


def _at(out: Path) -> output.OutputPlace:
    return output.OutputPlace(str(out))


def test_the_write_error_is_the_jvm_cause_in_one_line() -> None:
    class _Java:
        def __init__(self, text: str, cause: _Java | None = None) -> None:
            self.text, self.cause = text, cause

        def getCause(self) -> _Java | None:  # noqa: N802 (the JVM's name)
            return self.cause

        def toString(self) -> str:  # noqa: N802
            return self.text

    exc = RuntimeError("An error occurred while calling o336.json.\n\tat ...")
    exc.java_exception = _Java(  # type: ignore[attr-defined]
        "org.apache.spark.SparkException: Job aborted",
        _Java("java.io.IOException: Mkdirs failed to create file:/ro/out\n\tat x"),
    )
    assert output.jvm_cause(exc) == "java.io.IOException: Mkdirs failed to create file:/ro/out"
    assert output.jvm_cause(ValueError("one\ntwo")) == "one"


# --- the command line, on a real Spark session ------------------------------------------


def _spark_args(tmp_path: Path, key: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", "-q", "-m", "unknown", "-T", "4", "--max-items", "2", "--rho", "1",
        "--threshold-delta", "0.4", "--key-file", str(key), "--counter", "tree",
        "-i", str(tmp_path / "ev.jsonl"),
        "-o", str(out), "--engine", "spark", "--master", "local[2]", *extra,
    ]  # fmt: skip


@pytest.fixture
def spark():
    """A session for the command to find (and stop after): the test's own, as the other
    Spark test modules have theirs."""
    from .conftest import require_spark

    require_spark(pandas=True)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_engine_spark_refuses_an_existing_output_before_it_reads_or_claims(
    spark, tmp_path, capsys
) -> None:
    """An output directory that exists stops the run before the ledger records its noise
    scope (the budget is not spent, a later run needs no --force); --force replaces it
    with the releases a run into a new directory writes."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-output").save(key)
    events = [{"t": 1, "items": ["a", "b"]}, {"t": 2, "items": ["a"]}, {"t": 4, "items": ["b"]}]
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000-earlier.json").write_text('{"t": 1, "item": "z", "value": 7}\n')
    assert cli.main(_spark_args(tmp_path, key, out)) == 1
    err = capsys.readouterr().err
    assert "output" in err and "exists: pass --overwrite" in err and "Traceback" not in err
    ledger = Path(f"{key}.ledger")
    assert not ledger.exists()  # nothing claimed or spent
    assert _rows(out) == ['{"t": 1, "item": "z", "value": 7}']

    assert cli.main(_spark_args(tmp_path, key, tmp_path / "fresh")) == 0
    assert ledger.exists()
    assert cli.main(_spark_args(tmp_path, key, out, "--force")) == 0
    capsys.readouterr()
    assert _rows(out) == _rows(tmp_path / "fresh") and len(_rows(out)) >= 4
    assert (out / "_SUCCESS").exists() and not (out / "part-00000-earlier.json").exists()
    assert _hidden(tmp_path) == []


def test_force_replaces_only_a_directory_of_part_files(spark, tmp_path) -> None:
    """--force never deletes a folder that holds anything but a Spark run's part files
    (the key, the ledger, the input beside them), a file, or a folder that holds one of
    the run's own files; it replaces a folder of part files."""
    key = tmp_path / "k.key"
    key.write_text("secret")
    with pytest.raises(StateError, match="holds 'k.key'.*--overwrite replaces only"):
        output.check_output(spark, str(tmp_path), True)
    with pytest.raises(StateError, match="is not a directory"):
        output.check_output(spark, str(key), True)
    parts = tmp_path / "parts"
    parts.mkdir()
    for name in ("part-00000-x.json", ".part-00000-x.json.crc", "_SUCCESS", "._SUCCESS.crc"):
        (parts / name).write_text("")
    assert output.check_output(spark, str(parts), True).local == str(parts)
    with pytest.raises(StateError, match="exists: pass --overwrite"):
        output.check_output(spark, str(parts), False)
    inp = parts / "part-00000-x.json"  # the input is a part file of the output
    # a link to a deeper folder: "lnk/.." is tmp_path as text (Hadoop), "a" once followed
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "a" / "b", target_is_directory=True)
    for given in (
        str(inp),
        f"file://{inp}",  # as a URI
        f"{tmp_path}/lnk/../parts/part-00000-x.json",  # Hadoop drops ".." from the text
        str(tmp_path / "parts" / "." / "part-00000-x.json"),
    ):
        with pytest.raises(StateError, match="one of the run's own files"):
            output.check_output(spark, str(parts), True, [("--input", given)])
    # folders named like part files, a link, a half-written job's _temporary: not a run's
    for odd in ("part-00001", "_temporary"):
        (parts / odd).mkdir()
        with pytest.raises(StateError, match=f"holds '{odd}'"):
            output.check_output(spark, str(parts), True)
        (parts / odd).rmdir()
    (parts / "part-00002-y.json").symlink_to(key)
    with pytest.raises(StateError, match="holds 'part-00002-y.json'"):
        output.check_output(spark, str(parts), True)
    (parts / "part-00002-y.json").unlink()
    assert key.read_text() == "secret" and len(list(parts.iterdir())) == 4


def test_an_output_that_cannot_be_written_is_refused_before_the_run(spark, tmp_path) -> None:
    blocker = tmp_path / "events.jsonl"
    blocker.write_text("{}\n")
    with pytest.raises(StateError, match="cannot be written"):
        output.check_output(spark, str(blocker / "sub" / "out"), False)
    with pytest.raises(StateError, match="cannot be written"):
        output.check_output(spark, "/proc/dpstream-test-out", False)
    made = tmp_path / "new" / "deeper" / "out"  # missing parents are made, the path is not
    assert output.check_output(spark, str(made), False).local == str(made)
    long = tmp_path / ("x" * 240)  # the hidden directories' names do not grow with it
    assert output.check_output(spark, str(long), False).local == str(long)
    assert made.parent.is_dir() and not made.exists() and _hidden(made.parent) == []


def test_csv_part_files_hold_each_item_as_it_is(spark, tmp_path) -> None:
    """Spark's CSV writer trims spaces and escapes quotes with a backslash unless told
    otherwise: the part files hold every item as the local engine's CSV does (RFC 4180,
    read back by Python's csv module)."""
    import csv

    items = [" a", "a ", 'a"b', 'b\\"c', " ", "a\u0000", "x,y", "l\nm", "caf\u00e9", ""]
    rows = [(1, item, 2.5) for item in items] + [(2, None, None)]
    table = spark.createDataFrame(rows, "t long, item string, value double").coalesce(1)
    out = tmp_path / "out"
    output.write_table(table, "csv", str(out), _at(out), False)
    (part,) = out.glob("part-*.csv")
    with open(part, newline="", encoding="utf-8") as f:
        got = list(csv.reader(f))
    assert got[0] == ["t", "item", "value"]
    assert [r[1] for r in got[1:]] == [*items, ""] and got[-1] == ["2", "", ""]
    # the empty-string item as Python's csv module (the local engine) writes it: an
    # empty field, not Spark's default `""` (review 114)
    local = io.StringIO()
    csv.writer(local, lineterminator="\n").writerow([1, "", 2.5])
    assert local.getvalue() in part.read_text(encoding="utf-8").splitlines(keepends=True)


def test_engine_spark_refuses_what_it_would_not_run(spark, tmp_path, capsys) -> None:
    """Options the Spark job does not run are refused before anything is recorded, not
    ignored (each changes what is published or when)."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-output").save(key)
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n')
    for extra in (["--top", "2"], ["--min-value", "3"]):
        assert cli.main(_spark_args(tmp_path, key, tmp_path / "out", *extra)) == 1
        assert f"{extra[0]}: not available with --engine spark" in capsys.readouterr().err
    assert not Path(f"{key}.ledger").exists() and not (tmp_path / "out").exists()


def test_a_failure_inside_spark_is_one_line_with_its_cause(spark, tmp_path, capsys, monkeypatch):
    """Review 103: Spark's OutOfMemoryError on a 100 MB line ended the command in a page
    of the JVM's stack. A real error raised in the JVM by a query (``raise_error``, as a
    failed task's would be) reaches the operator as one line naming its cause, with the
    advice for memory; --debug keeps the trace."""
    from dpstream import cli
    from dpstream import spark as dp_spark

    def failing_job(*_: object, **__: object) -> None:
        spark.sql("SELECT raise_error('java.lang.OutOfMemoryError: Java heap space')").collect()

    monkeypatch.setattr(dp_spark, "run_cli", failing_job)
    key = tmp_path / "k.key"
    fixed_key("spark-output").save(key)
    (tmp_path / "ev.jsonl").write_text(json.dumps({"t": 1, "items": ["a"]}) + "\n")
    capsys.readouterr()
    assert cli.main(_spark_args(tmp_path, key, tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert err.startswith("dpstream: error: Spark stopped the run: "), err
    assert "Java heap space" in err and "the JVM ran out of memory" in err
    assert err.count("\n") == 1 and "Traceback" not in err and "\tat " not in err
    with pytest.raises(Exception) as caught:
        cli.main(["--debug", *_spark_args(tmp_path, key, tmp_path / "out2")])
    assert type(caught.value.__cause__).__module__.startswith("pyspark")  # Spark's own


_KILLED_BETWEEN_RENAMES = """
import os, signal, sys
from dpstream.spark import output as o
parent, name = sys.argv[1], "out.csv"
path = os.path.join(parent, name)
new = o._hidden_name(parent, name)
os.makedirs(new)
with open(os.path.join(new, "part-00000-c000.csv"), "w") as fh:
    fh.write("t,item,value\\n2,b,9\\n")
real, calls = os.rename, []
def rename(a, b):
    real(a, b)
    calls.append(b)
    if len(calls) == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # between the two renames
o.os.rename = rename
o._put_in_place(new, path, name, o.OutputPlace(path), True)
"""


@pytest.mark.parametrize("new_written", [True, False])
def test_force_killed_between_its_renames_keeps_an_output(tmp_path, new_written) -> None:
    """Review 105: a --force run killed after it renamed the earlier output aside, before
    it renamed the new one into place, left both hidden, and the next run's tidying
    deleted both. The next run now puts the new (whole) output in place, or the earlier
    one back when the new one is missing."""
    out = tmp_path / "out.csv"
    out.mkdir()
    (out / "part-00000-c000.csv").write_text("t,item,value\n1,a,5\n")
    done = subprocess.run([sys.executable, "-c", _KILLED_BETWEEN_RENAMES, str(tmp_path)])
    assert done.returncode == -9 and not out.exists()
    hidden = sorted(p.name for p in tmp_path.iterdir())
    assert len(hidden) == 2 and hidden[1] == hidden[0] + ".old"
    if not new_written:
        shutil.rmtree(tmp_path / hidden[0])
    output._tidy(str(tmp_path), "out.csv")  # what the next run on this output does first
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    kept = (out / "part-00000-c000.csv").read_text()
    assert kept == ("t,item,value\n2,b,9\n" if new_written else "t,item,value\n1,a,5\n")


def test_events_after_until_are_said_so_and_the_stream_end_is_warned(spark, tmp_path, capsys):
    """Review 114 (low): with --until 2 over events up to step 4, the Spark summary
    called the events of steps 3 and 4 invalid, and the local engine's warning that the
    steps after --until can never be released on this stream was not given."""
    from dpstream import cli

    key = tmp_path / "k.key"
    fixed_key("spark-output-until").save(key)
    events = [{"t": t, "items": ["a"]} for t in (1, 2, 3, 4, 4)]
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    args = _spark_args(tmp_path, key, tmp_path / "out", "--until", "2", "--max-invalid", "1")
    args.remove("-q")  # the summary is an info line
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "--until 2 on Spark: the steps after 2 can never be released" in err
    assert "(3 invalid skipped) (3 of those for steps after --until or past the horizon)" in err
