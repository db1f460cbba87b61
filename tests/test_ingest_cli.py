"""The columnar input path through the command line.

* line endings, a byte-order mark and gzip do not change a release (the same
  events read the same way);
* a resumed run's input digest is over the raw bytes of each step's lines: an
  edit that keeps every parsed record (spacing inside a line) is refused too,
  and a state written by the previous digest definition (schema 2) is refused
  with a message that says what to do.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from contextlib import closing

import pytest

from dpstream.cli import main

from .conftest import fixed_key, own_ledger

T = 30


@pytest.fixture
def setup(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("ingest-cli").save(key)
    lines = [
        json.dumps({"t": 1 + i // 7, "items": [f"x{i % 5}", f"y{i % 3}"]}) for i in range(T * 7)
    ]
    args = [
        "run",
        "--quiet",
        "-m",
        "unknown",
        "-T",
        str(T),
        "--max-items",
        "2",
        "--rho",
        "1",
        "--threshold-delta",
        "1e-6",
        "--no-round",
        "--key-file",
        str(key),
    ]
    return tmp_path, lines, args


def _run(args, src, out, *extra) -> int:
    return main([*args, "-i", str(src), "-o", str(out), *own_ledger(out), *extra])


def test_line_endings_bom_and_gzip_give_the_same_release(setup):
    base, lines, args = setup
    plain = base / "plain.jsonl"
    plain.write_text("\n".join(lines) + "\n")
    assert _run(args, plain, base / "ref.jsonl") == 0
    ref = (base / "ref.jsonl").read_bytes()
    variants = {
        "crlf.jsonl": ("\r\n".join(lines) + "\r\n").encode(),
        "bom.jsonl": b"\xef\xbb\xbf" + ("\n".join(lines)).encode(),  # and no final newline
        "blank.jsonl": ("\n\n".join(lines) + "\n").encode(),
    }
    for name, data in variants.items():
        (base / name).write_bytes(data)
        assert _run(args, base / name, base / f"o-{name}") == 0, name
        assert (base / f"o-{name}").read_bytes() == ref, name
    with gzip.open(base / "ev.jsonl.gz", "wb") as fh:
        fh.write(("\n".join(lines) + "\n").encode())
    assert _run(args, base / "ev.jsonl.gz", base / "o-gz.jsonl") == 0
    assert (base / "o-gz.jsonl").read_bytes() == ref


def test_resume_refuses_a_written_step_whose_bytes_changed(setup, capsys):
    base, lines, args = setup
    src, out, state = base / "ev.jsonl", base / "out.jsonl", base / "s.sqlite"
    src.write_text("\n".join(lines) + "\n")
    assert _run(args, src, out, "--state", str(state), "--until", "10") == 0
    # the same events, written without spaces: every parsed record is the same
    src.write_text("\n".join([lines[0].replace(" ", ""), *lines[1:]]) + "\n")
    with closing(sqlite3.connect(state)) as db:  # make the run resume at step 1
        db.execute("DELETE FROM snapshot")
        db.execute("DELETE FROM batches")
        db.commit()
    assert _run(args, src, out, "--state", str(state)) == 1
    assert "the input changed: step 1" in capsys.readouterr().err


def test_a_state_of_the_previous_digest_is_refused_clearly(setup, capsys):
    base, lines, args = setup
    src, out, state = base / "ev.jsonl", base / "out.jsonl", base / "s.sqlite"
    src.write_text("\n".join(lines) + "\n")
    assert _run(args, src, out, "--state", str(state), "--until", "5") == 0
    with closing(sqlite3.connect(state)) as db:
        db.execute("UPDATE run SET schema_version = 2")
        db.commit()
    assert _run(args, src, out, "--state", str(state)) == 1
    err = capsys.readouterr().err
    assert "another version of dpstream" in err and "schema 2" in err
