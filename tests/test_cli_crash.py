"""Crash safety of `dpstream run --state`: kill -9 at a random step, resume, compare bytes."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main

from .conftest import fixed_key, own_ledger

SRC = str(Path(__file__).resolve().parents[1] / "src")
T = 400
D = 150


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    key_path = base / "k.key"
    fixed_key("crash").save(key_path)
    other = base / "other.key"
    fixed_key("crash-other").save(other)
    domain = [f"item{i:03d}" for i in range(D)]
    (base / "domain.txt").write_text("\n".join(domain) + "\n")
    rng = np.random.default_rng(7)  # simulated input data
    with open(base / "ev.jsonl", "w") as fh:
        for t in range(1, T + 1):
            for _ in range(int(rng.integers(0, 4))):
                items = rng.choice(domain, size=int(rng.integers(1, 4)), replace=False)
                fh.write(json.dumps({"t": t, "items": items.tolist()}) + "\n")
    args = [
        "run",
        "--quiet",
        "-T",
        str(T),
        "--domain",
        str(base / "domain.txt"),
        "--max-items",
        "3",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--round",
        "--counter",
        "tree",
    ]
    ref = base / "ref.jsonl"
    assert (
        main([*args, "--key-file", str(key_path), "-i", str(base / "ev.jsonl"), "-o", str(ref)])
        == 0
    )
    return base, args, key_path, other, ref


def _spawn(args, stdin=None):
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen(
        [sys.executable, "-m", "dpstream", *args],
        env=env,
        stdin=stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _kill_after(proc, out: Path, lines: int, timeout: float = 60.0) -> bool:
    """SIGKILL ``proc`` once ``out`` holds at least ``lines`` lines; False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with open(out, "rb") as fh:
                if fh.read().count(b"\n") >= lines:
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


@pytest.mark.parametrize(
    "seed,use_stdin,fsync", [(1, False, True), (2, False, False), (3, True, False)]
)
def test_kill_at_random_step_then_resume_gives_identical_output(
    setup, tmp_path, seed, use_stdin, fsync
):
    base, args, key_path, _, ref = setup
    kill_at = random.Random(seed).randrange(1, T // 2)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    src = "-" if use_stdin else str(base / "ev.jsonl")
    cmd = [
        *args,
        "--key-file",
        str(key_path),
        "-i",
        src,
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
        "--fsync" if fsync else "--no-fsync",
    ]  # --no-fsync is still safe against kill -9
    with open(base / "ev.jsonl", "rb") as feed:
        proc = _spawn(cmd, stdin=feed if use_stdin else None)
        killed = _kill_after(proc, out, kill_at)
    assert killed, f"the run finished before step {kill_at}: nothing was interrupted"
    with closing(sqlite3.connect(state)) as db:
        committed = db.execute("SELECT COUNT(*), MAX(t) FROM steps").fetchone()
    assert committed[0] == committed[1] and committed[1] < T  # killed before the end
    with open(base / "ev.jsonl", "rb") as feed:
        proc = _spawn(cmd, stdin=feed if use_stdin else None)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    data = out.read_bytes()
    assert data == ref.read_bytes(), f"killed after >= {kill_at} lines"
    ts = [json.loads(line)["t"] for line in data.splitlines()]
    assert ts == list(range(1, T + 1))  # every step once, in order
    with closing(sqlite3.connect(state)) as db:
        assert db.execute("SELECT COUNT(*), MAX(t) FROM steps").fetchone() == (T, T)
        assert db.execute("SELECT finished FROM run").fetchone()[0] is not None


def test_resume_refuses_another_key_and_finished_run_is_a_no_op(setup, tmp_path, capsys):
    base, args, key_path, other, ref = setup
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        *args,
        "-i",
        str(base / "ev.jsonl"),
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
    ]
    proc = _spawn([*cmd, "--key-file", str(key_path)])
    assert _kill_after(proc, out, 20)
    before = out.read_bytes()
    assert main([*cmd, "--key-file", str(other)]) == 1
    err = capsys.readouterr().err
    assert "another key" in err and err.count("\n") == 1
    assert (
        main([*cmd[:-2], "--state", str(state), "--key-file", str(key_path), "--stream", "other"])
        == 1
    )
    assert "other parameters" in capsys.readouterr().err
    assert out.read_bytes() == before  # refused before touching the output
    assert main([*cmd, "--key-file", str(key_path)]) == 0
    assert out.read_bytes() == ref.read_bytes()
    finished = out.read_bytes()
    cmd_loud = [a for a in cmd if a != "--quiet"]
    assert main([*cmd_loud, "--key-file", str(key_path)]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert out.read_bytes() == finished


def test_resume_detects_a_changed_input(setup, tmp_path, capsys):
    base, args, key_path, _, _ = setup
    lines = (base / "ev.jsonl").read_text().splitlines()
    src = tmp_path / "ev.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        *args,
        "--key-file",
        str(key_path),
        "-i",
        str(src),
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
    ]
    proc = _spawn(cmd)
    assert _kill_after(proc, out, 50)
    first = json.loads(lines[0])
    first["items"] = first["items"][:1] if len(first["items"]) > 1 else ["item000"]
    src.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert main(cmd) == 1
    assert "the input changed: step 1" in capsys.readouterr().err


def test_kill_then_resume_with_counter_blt(setup, tmp_path, capsys):
    """The same crash test for the BLT counter (its noise runs through k buffers per
    item, replayed from the key on resume): byte-identical output; a resume with the
    tree counter is refused."""
    base, args, key_path, _, _ = setup
    blt_args = [*args[:-2], "--counter", "blt"]
    ref = tmp_path / "ref.jsonl"
    assert (
        main(
            [
                *blt_args,
                "--key-file",
                str(key_path),
                "-i",
                str(base / "ev.jsonl"),
                "-o",
                str(ref),
                *own_ledger(ref),
            ]
        )
        == 0
    )
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        *blt_args,
        "--key-file",
        str(key_path),
        "-i",
        str(base / "ev.jsonl"),
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
        "--no-fsync",
    ]
    kill_at = random.Random(4).randrange(1, T // 2)
    proc = _spawn(cmd)
    assert _kill_after(proc, out, kill_at)
    with closing(sqlite3.connect(state)) as db:
        assert db.execute("SELECT MAX(t) FROM steps").fetchone()[0] < T
    tree_cmd = [*args, *cmd[len(blt_args) :]]
    assert main(tree_cmd) == 1  # the other counter would release other noise
    assert "other parameters" in capsys.readouterr().err
    proc = _spawn(cmd)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert out.read_bytes() == ref.read_bytes()
    assert out.read_bytes() != (base / "ref.jsonl").read_bytes()  # not the tree's releases


def test_a_step_written_before_a_crash_is_never_released_again_from_changed_input(
    setup, tmp_path, capsys
):
    """Review finding 3: killed after step t was written but before it was committed, a
    resume after late events of step t were added printed step t twice, and with keyed
    noise the two releases differed by exactly the change in true counts. Now a step is
    on record (with a keyed digest of its input) before its first byte is written."""
    base, args, key_path, _, ref = setup
    lines = (base / "ev.jsonl").read_text().splitlines()
    src = tmp_path / "ev.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        *args,
        "--key-file",
        str(key_path),
        "-i",
        str(src),
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
        "--no-fsync",
    ]
    proc = _spawn(cmd)
    assert _kill_after(proc, out, random.Random(5).randrange(20, T // 2))
    with closing(sqlite3.connect(state)) as db:
        last = db.execute("SELECT MAX(t) FROM steps").fetchone()[0]
    written = out.read_bytes()
    assert written.count(b"\n") in (last - 1, last)  # the last step on record: maybe unwritten
    # late events of step `last`: inserted after its last event (time order is kept)
    cut = max(i for i, line in enumerate(lines) if json.loads(line)["t"] <= last) + 1
    late = json.dumps({"t": last, "items": ["item001", "item002"]})
    src.write_text("\n".join([*lines[:cut], late, *lines[cut:]]) + "\n")
    assert main(cmd) == 1
    err = capsys.readouterr().err
    # refused by the state's digest of step `last`, or, when the kill fell between the
    # release ledger's line for step last + 1 and the state's commit of it, by the ledger
    # first (the inserted line moves step last + 1's records, which its digest binds)
    assert (
        f"the input changed: step {last}" in err
        or f"step {last + 1} was released (after the state was saved) from other input" in err
    ), err
    assert out.read_bytes() == written  # nothing printed twice, nothing truncated
    src.write_text("\n".join(lines) + "\n")  # the input as it was: the run completes
    assert main(cmd) == 0
    assert out.read_bytes() == ref.read_bytes()


def test_monotone_counts_resume_from_the_published_releases(setup, tmp_path):
    """--monotone depends on earlier published values: a killed run, resumed, replays them
    and writes exactly what an uninterrupted --monotone run writes (and that differs from
    the default output, so the option did something)."""
    base, args, key_path, _, ref = setup
    full = tmp_path / "full.jsonl"
    cmd = [*args, "--monotone", "--key-file", str(key_path), "-i", str(base / "ev.jsonl")]
    assert main([*cmd, "-o", str(full), *own_ledger(full)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    proc = _spawn([*cmd, "-o", str(out), *own_ledger(out), "--state", str(state), "--no-fsync"])
    assert _kill_after(proc, out, 60)
    proc = _spawn([*cmd, "-o", str(out), *own_ledger(out), "--state", str(state), "--no-fsync"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert out.read_bytes() == full.read_bytes() != ref.read_bytes()
    last: dict[str, int] = {}
    for line in full.read_text().splitlines():
        for item, v in json.loads(line)["released"].items():
            assert v >= last.get(item, 0)
            last[item] = v
