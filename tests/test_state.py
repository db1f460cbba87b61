"""The SQLite checkpoint of dpstream.state."""

from __future__ import annotations

import sqlite3

import pytest

from dpstream.errors import StateError
from dpstream.state import Checkpoint, canonical_json

IDENT = dict(params=canonical_json({"b": 1, "a": [1, 2]}), key_fingerprint="f" * 16,
             input="/in", output="/out")


def test_new_state_then_commit_and_reload(tmp_path):
    path = str(tmp_path / "s.sqlite")
    with Checkpoint(path) as ck:
        assert ck.load() is None
        ck.start(**IDENT)
        ck.commit(1, offset=10, release_sha256="r1", input_sha256="i1", events=2)
        ck.commit(2, offset=25, release_sha256="r2", input_sha256="i2", events=3)
    with Checkpoint(path) as ck:
        rec = ck.load()
        assert (rec.last_t, rec.last_offset, rec.steps, rec.events) == (2, 25, 2, 5)
        assert rec.finished is None
        assert ck.step(1) == (10, "r1", "i1") and ck.step(3) is None
        ck.verify(rec, **IDENT)
        ck.finish({"steps": 2})
    with Checkpoint(path) as ck:
        assert ck.load().finished is not None


def test_a_step_is_committed_once(tmp_path):
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        ck.commit(1, offset=10, release_sha256="r", input_sha256="i", events=1)
        with pytest.raises(sqlite3.IntegrityError):
            ck.commit(1, offset=20, release_sha256="r", input_sha256="i", events=1)
        assert ck.load().last_offset == 10  # the failed transaction was rolled back


@pytest.mark.parametrize("field,value,message", [
    ("key_fingerprint", "0" * 16, "another key"),
    ("params", canonical_json({"b": 2, "a": [1, 2]}), "differs in: b"),
    ("input", "/other", "reading"),
    ("output", "/other", "writing"),
])
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
    with pytest.raises(StateError):
        Checkpoint(str(path)).load()


def test_a_run_is_replaced_only_while_no_step_is_committed(tmp_path):
    other = {**IDENT, "params": canonical_json({"b": 2})}
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        ck.start(**other, replace=True)  # nothing released yet: new parameters are fine
        ck.verify(ck.load(), **other)
        ck.commit(1, offset=10, release_sha256="r", input_sha256="i", events=1)
        with pytest.raises(StateError, match="cannot be replaced"):
            ck.start(**IDENT, replace=True)
        ck.verify(ck.load(), **other)  # unchanged


def test_finished_summary_is_read_back(tmp_path):
    with Checkpoint(str(tmp_path / "s.sqlite")) as ck:
        ck.start(**IDENT)
        assert ck.load().summary is None
        ck.finish({"steps": 0, "input_records": 3})
        assert ck.load().summary == {"steps": 0, "input_records": 3}
