"""A Spark run on a local output takes the local engine's output lock.

Known gap: ``dpstream run --engine spark`` took no lock, so two Spark runs (or a Spark
run and a local run) on one ``-o`` both checked that the output was new, both
recorded their scope in the release ledger and raced to put their directories in
place. A Spark run now holds ``.NAME.lock`` beside its output directory
(:mod:`dpstream.run.lock`) from before its session starts to its last write. Another
process holds the lock here, as a run in its first moments would: no timing involved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import UNKNOWN_CLI, fixed_key
from .test_output_lock import Holder

pytest.importorskip("pyspark")


def _args(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", "-q", *UNKNOWN_CLI, "-T", "3", "--counter", "tree",
        "--key-file", str(tmp_path / "k.key"), "-i", str(tmp_path / "ev.jsonl"),
        "-o", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture
def files(tmp_path: Path) -> Path:
    fixed_key("spark-lock").save(tmp_path / "k.key")
    events = [{"t": 1, "items": ["a", "b"]}, {"t": 3, "items": ["a"]}]
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return tmp_path


def _lock_file(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def test_a_spark_run_is_refused_before_its_session_while_another_run_writes_its_output(
    files, capsys, monkeypatch
):
    """No JVM for a refused run: the lock comes before the session starts."""
    from dpstream import cli
    from dpstream.spark import command

    def no_session(master: str) -> None:
        raise AssertionError("the session started")

    monkeypatch.setattr(command, "start_session", no_session)
    spark = ["--engine", "spark", "--master", "local[1]"]
    for out in (files / "out", files / "uri"):
        given = f"file://{out}" if out.name == "uri" else str(out)
        holder = Holder(_lock_file(out))  # a local or Spark run writing it
        try:
            assert cli.main([*_args(files, out)[:-1], given, *spark]) == 1
        finally:
            holder.release()
        err = capsys.readouterr().err
        assert f"another run is writing output file {str(out)!r}" in err  # the URI's path
        assert err.count("\n") == 1
        assert not out.exists() and not Path(f"{files}/k.key.ledger").exists()


def test_a_spark_run_holds_its_output_s_lock_while_it_runs(files, capsys, monkeypatch):
    """One tiny real run: a local run on its -o is refused while it writes, and the lock
    file is gone when it ends. The output's folder is new: locked once the session has
    made it (the lock before the session needs the folder there)."""
    from .conftest import require_spark

    require_spark(pandas=True)
    from dpstream import cli
    from dpstream.spark import command

    out = files / "new" / "out"
    write = command.write_table
    local_runs = []

    def write_while_a_local_run_tries(*args: object) -> None:
        local_runs.append(cli.main([*_args(files, out), "--ledger", f"{files}/own.ledger"]))
        write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "write_table", write_while_a_local_run_tries)
    assert cli.main([*_args(files, out), "--engine", "spark", "--master", "local[1]"]) == 0
    err = capsys.readouterr().err
    assert local_runs == [1] and f"another run is writing output file {str(out)!r}" in err
    assert (out / "_SUCCESS").exists() and not _lock_file(out).exists()
    assert not Path(f"{files}/own.ledger").exists()  # the local run recorded nothing
