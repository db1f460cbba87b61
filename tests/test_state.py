"""The SQLite checkpoint of dpstream.state."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from dpstream.errors import StateError
from dpstream.state import Checkpoint, StateDigests, StepRecord, canonical_json

from .conftest import fixed_key

IDENT = dict(
    params=canonical_json({"b": 1, "a": [1, 2]}),
    key_fingerprint="f" * 16,
    input="/in",
    output="/out",
)


def test_new_state_then_commit_and_reload(tmp_path):
    path = str(tmp_path / "s.sqlite")
    with Checkpoint(path) as ck:
        assert ck.load() is None
        ck.start(**IDENT)
        ck.commit(1, begin=0, end=10, release_mac="r1", input_mac="i1")
        ck.commit(2, begin=10, end=25, release_mac="r2", input_mac="i2")
    with Checkpoint(path) as ck:
        rec = ck.load()
        assert (rec.last_t, rec.last_begin, rec.last_end, rec.steps) == (2, 10, 25, 2)
        assert rec.finished is None
        assert ck.step(1) == StepRecord(0, 10, "r1", "i1") and ck.step(3) is None
        ck.verify(rec, **IDENT)
        ck.finish({"steps": 2})
    with Checkpoint(path) as ck:
        assert ck.load().finished is not None


def test_a_step_is_committed_once(tmp_path):
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        ck.commit(1, begin=0, end=10, release_mac="r", input_mac="i")
        with pytest.raises(StateError, match="UNIQUE constraint failed: steps.t"):
            ck.commit(1, begin=0, end=20, release_mac="r", input_mac="i")
        assert ck.load().last_end == 10  # the failed transaction was rolled back


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("key_fingerprint", "0" * 16, "another key"),
        ("params", canonical_json({"b": 2, "a": [1, 2]}), "differs in: --b"),
        # recorded names are given as the command's options spell them
        ("params", canonical_json({"max_items_per_user": 2, "a": [1, 2]}), "--max-items-per-user"),
        ("params", canonical_json({"input_format": "parquet", "a": [1, 2]}), r"\(--input-format\)"),
        ("input", "/other", "reading"),
        ("output", "/other", "writing"),
    ],
)
def test_verify_refuses_other_runs(tmp_path, field, value, message):
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        rec = ck.load()
        with pytest.raises(StateError, match=message):
            ck.verify(rec, **{**IDENT, field: value})


def test_canonical_json_ignores_key_order():
    assert canonical_json({"a": 1, "b": 2}) == canonical_json({"b": 2, "a": 1})


def test_state_in_use_is_refused(tmp_path):
    path = str(tmp_path / "s.sqlite")
    with Checkpoint(path) as ck:
        ck.start(**IDENT)
        with pytest.raises(StateError, match="in use"):
            Checkpoint(path)


def test_not_a_database(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    path.chmod(0o600)
    with pytest.raises(StateError):
        Checkpoint(str(path)).load()


@pytest.mark.parametrize("schema", ["CREATE TABLE important(x)", "CREATE TABLE run(id, name)"])
def test_another_applications_database_is_refused_untouched(tmp_path, schema):
    """Review 90: --state given an application's SQLite file added dpstream's tables to
    it and switched it to WAL for good (and, with a table of its own named run, did so
    before refusing it). It is refused now before anything in it changes."""
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute(schema)
    db.commit()
    db.close()
    path.chmod(0o600)
    before = path.read_bytes()
    with pytest.raises(StateError, match="SQLite database of something else"):
        Checkpoint(str(path))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()
    # an empty database (as a new state file) and a state of dpstream's are states
    fresh = str(tmp_path / "fresh.sqlite")
    with Checkpoint(fresh) as ck:
        ck.start(**IDENT)
    with Checkpoint(fresh) as ck:
        assert ck.load() is not None


def test_a_run_is_replaced_only_while_no_step_is_committed(tmp_path):
    other = {**IDENT, "params": canonical_json({"b": 2})}
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        ck.start(**other, replace=True)  # nothing released yet: new parameters are fine
        ck.verify(ck.load(), **other)
        ck.commit(1, begin=0, end=10, release_mac="r", input_mac="i")
        with pytest.raises(StateError, match="cannot be replaced"):
            ck.start(**IDENT, replace=True)
        ck.verify(ck.load(), **other)  # unchanged


def test_finished_summary_is_read_back(tmp_path):
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        assert ck.load().summary is None
        ck.finish({"steps": 0, "input_records": 3})
        assert ck.load().summary == {"steps": 0, "input_records": 3}


# -- what the state file reveals (the end-to-end privacy review) -------------------


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_file_and_its_journal_are_owner_only(tmp_path):
    path = tmp_path / "s.sqlite"
    old = os.umask(0o022)  # a typical umask: files would be 0644 without care
    try:
        with Checkpoint(str(path)) as ck:
            ck.start(**IDENT)
            ck.commit(1, begin=0, end=10, release_mac="r", input_mac="i")
            companions = [p for p in tmp_path.iterdir() if p.name.startswith("s.sqlite")]
            assert len(companions) >= 2  # the WAL journal exists while the file is open
            for p in companions:
                assert _mode(p) == 0o600, p.name
    finally:
        os.umask(old)


def test_a_readable_state_file_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    with Checkpoint(str(path)) as ck:
        ck.start(**IDENT)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        Checkpoint(str(path))
    with Checkpoint(str(path), allow_readable=True) as ck:  # the explicit override
        assert ck.load() is not None


def test_digests_are_keyed_so_an_outsider_cannot_match_guesses():
    """The attack of the review: brute-force a step's records against its stored digest.

    With an unkeyed SHA-256 the attacker recomputes the digest of every guess
    and finds the true records; with the keyed digest a guess's digest under
    any key the attacker holds differs from the stored one.
    """
    records = [b'[1, 1, ["aspirin"], null]', b'[2, 2, ["ibuprofen"], null]']
    stored = StateDigests(fixed_key("owner")).records(records)
    assert stored == StateDigests(fixed_key("owner")).records(records)  # replayable
    assert stored != StateDigests(fixed_key("attacker")).records(records)
    assert stored != StateDigests(fixed_key("owner")).records(records[:1])
    import hashlib

    assert stored != hashlib.sha256(b"".join(records)).hexdigest()


def test_a_dangling_link_as_the_state_is_refused_in_words(tmp_path):
    """A state path that is a link to nothing was refused as "File exists" (O_EXCL on
    the link); the message now says what it is, and nothing is created."""
    link = tmp_path / "st.sqlite"
    link.symlink_to(tmp_path / "missing" / "state.sqlite")
    with pytest.raises(StateError, match="symbolic link to .*which does not exist"):
        Checkpoint(str(link), fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st.sqlite"]
    assert not (tmp_path / "missing").exists()


def test_a_device_or_a_pipe_as_the_state_or_the_ledger_is_refused_by_kind(tmp_path):
    """Review 90: --state /dev/null was refused with "run `chmod 600 /dev/null`" (and,
    with --allow-readable-state, left a /dev/null-journal behind); a FIFO as --ledger
    failed with a bare "Illegal seek". Both are refused as not regular files."""
    from dpstream.errors import LedgerError
    from dpstream.ledger_file import open_ledger_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o600)
    for path in (os.devnull, str(fifo), str(tmp_path)):
        for allow in (False, True):
            with pytest.raises(StateError, match="not a regular file"):
                Checkpoint(path, allow_readable=allow)
    for path in (os.devnull, str(fifo)):
        with pytest.raises(LedgerError, match="not a regular file"):
            open_ledger_file(path, fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_snapshot_that_cannot_be_saved_stops_the_run_and_the_same_command_goes_on(
    tmp_path, monkeypatch, capsys
):
    """Review 120: a snapshot that could not be saved was logged, the run exited 0, and
    the next run was refused ("stopped before its end"), with advice that did not get
    past it. Now the run stops with an error, its batch left open as after a kill, and
    the same command, once the cause is gone, writes what an uninterrupted run writes."""
    import json

    from dpstream import snapshot
    from dpstream.cli import main

    from .conftest import own_ledger

    key = tmp_path / "k.key"
    fixed_key("snapshot-fails").save(key)

    def day(name: str, steps: tuple[int, ...]) -> str:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"t": t, "items": [f"w{t % 3}"]}) + "\n" for t in steps))
        return str(path)

    def run(name: str, data: str, until: int) -> int:
        out = tmp_path / f"{name}.jsonl"
        return main([
            "run", "--quiet", "-m", "unknown", "--max-items", "1", "--rho", "1",
            "--threshold-delta", "1e-6", "-T", "4", "--until", str(until), "--key-file",
            str(key), "-i", data, "-o", str(out), "--state", str(tmp_path / f"{name}.db"),
            "--no-fsync", *own_ledger(out),
        ])  # fmt: skip

    assert run("whole", day("all", (1, 2, 3, 4)), 4) == 0

    def fails(*args, **kwargs):
        raise TypeError("a snapshot cannot hold a thing (simulated)")

    monkeypatch.setattr(snapshot, "dump_snapshot", fails)
    capsys.readouterr()
    first = day("day1", (1, 2))
    assert run("broken", first, 2) == 1
    assert "cannot be saved for the next run" in capsys.readouterr().err
    monkeypatch.undo()
    assert run("broken", first, 2) == 0  # the same command goes on
    assert run("broken", day("day2", (3, 4)), 4) == 0
    assert (tmp_path / "broken.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
