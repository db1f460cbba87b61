"""Operating a run: log lines and progress without a terminal, JSON logs, full disks."""

from __future__ import annotations

import json
import sqlite3

import pytest

from dpstream.cli import main
from dpstream.errors import StateError
from dpstream.state import Checkpoint, canonical_json

from .conftest import fixed_key

UNK = ["run", "-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta", "1e-3"]


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "k.key"
    fixed_key("ops").save(path)
    return str(path)


def _events(tmp_path, n=200):
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"t": t, "items": ["a", "b"]}) + "\n"
                           for t in range(1, n + 1)))
    return str(src)


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, key_path, capsys):
    src = _events(tmp_path)
    assert main([*UNK, "-T", "200", "--key-file", key_path, "-i", src, "-o",
                 str(tmp_path / "o.jsonl"), "--progress-every", "1e-9"]) == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("dpstream: step ")]
    assert len(progress) >= 100  # one per step at this interval
    assert "step 200 of 200 (100%), 200 events" in progress[-1] and "left" in progress[-1]
    assert any(line.startswith("dpstream: 200 steps (t = 1..200") for line in err)


def test_quiet_prints_nothing_and_json_logs_are_one_object_per_line(tmp_path, key_path,
                                                                    capsys):
    src = _events(tmp_path, 20)
    assert main([*UNK, "-T", "20", "--key-file", key_path, "-i", src, "-o",
                 str(tmp_path / "q.jsonl"), "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*UNK, "-T", "20", "--key-file", key_path, "-i", src, "-o",
                 str(tmp_path / "j.jsonl"), "--log-format", "json", "--progress-every",
                 "1e-9"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert {x["logger"] for x in lines} == {"dpstream.run"}
    progress = [x for x in lines if "eta_s" in x]
    assert progress and progress[-1]["step"] == 20 and progress[-1]["events"] == 20
    summary = lines[-1]
    assert summary["steps"] == 20 and summary["events"] == 20 and summary["skipped"] == 0
    assert summary["privacy"]["unit"] == "event" and summary["level"] == "info"


def test_a_full_disk_under_the_output_is_a_plain_error(tmp_path, key_path, capsys):
    src = _events(tmp_path, 5)
    rc = main([*UNK, "-T", "5", "--key-file", key_path, "-i", src, "-o", "/dev/full",
               "--force"])
    err = capsys.readouterr().err
    assert rc == 1 and "is full" in err and "step 1" in err and err.count("\n") == 1


def test_a_full_disk_or_a_read_only_state_is_a_plain_error(tmp_path):
    ident = dict(params=canonical_json({}), key_fingerprint="f" * 16, input="/i", output="/o")
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**ident)
        pages = ck._db.execute("PRAGMA page_count").fetchone()[0]
        ck._db.execute(f"PRAGMA max_page_count={pages}")  # the file may not grow: full
        with pytest.raises(StateError, match="is full: nothing of the step"):
            for t in range(1, 10_000):
                ck.commit(t, begin=t, end=t + 1, release_mac="r" * 64, input_mac="i" * 64)
        ck._db.execute("PRAGMA query_only=1")  # what a read-only file does to writes
        with pytest.raises(StateError, match="read-only"):
            ck.finish({})
    with pytest.raises(sqlite3.Error):  # the checks did not hide other errors
        sqlite3.connect(":memory:").execute("SELECT * FROM nothing")
