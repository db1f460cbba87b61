"""Incremental runs: a stream fed one day at a time equals one run over all the days.

Each invocation brings the next day's events and releases the steps up to a
public end step (``--until``); the state keeps a snapshot of the mechanism, so
a later invocation never re-reads earlier days, and a crash inside one day
resumes from that day's start.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main

from .conftest import fixed_key

SRC = str(Path(__file__).resolve().parents[1] / "src")
DAYS, STEPS_PER_DAY = 30, 8
T = DAYS * STEPS_PER_DAY


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    base = tmp_path_factory.mktemp("daily")
    key_path = base / "k.key"
    fixed_key("daily").save(key_path)
    rng = np.random.default_rng(17)  # simulated events (test data, not a release)
    words = [f"w{i}" for i in range(40)]
    (base / "domain.txt").write_text("\n".join(words) + "\n")
    everything = []
    for d in range(1, DAYS + 1):
        lines = []
        for t in range((d - 1) * STEPS_PER_DAY + 1, d * STEPS_PER_DAY + 1):
            for _ in range(int(rng.integers(0, 5))):
                items = rng.choice(words, size=int(rng.integers(1, 3)), replace=False)
                lines.append(json.dumps({"t": t, "items": items.tolist()}) + "\n")
        (base / f"day{d:02d}.jsonl").write_text("".join(lines))
        everything += lines
    (base / "all.jsonl").write_text("".join(everything))
    return base, key_path


MECHS = {
    "unknown": ["-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta", "1e-3",
                "--remember"],
    "known": ["-m", "known", "--max-items", "2", "--rho", "1"],
}


def _args(base, key_path, mech):
    extra = ["--domain", str(base / "domain.txt")] if mech == "known" else []
    return ["run", "-q", "-T", str(T), *MECHS[mech], *extra, "--key-file", str(key_path),
            "--no-fsync"]


@pytest.mark.parametrize("mech", sorted(MECHS))
def test_thirty_daily_runs_equal_one_run_and_a_day_fed_twice_is_refused(stream, tmp_path,
                                                                         mech, capsys):
    base, key_path = stream
    args = _args(base, key_path, mech)
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    for d in range(1, DAYS + 1):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        assert main([*args, "-i", str(base / f"day{d:02d}.jsonl"), "-o", str(out), "--state",
                     str(state), *until]) == 0, d
        if d == 5:  # the same day again, with a later end step: refused, nothing written
            before = out.read_bytes()
            assert main([*args, "-i", str(base / "day05.jsonl"), "-o", str(out), "--state",
                         str(state), "--until", "48"]) == 1
            assert "already fed" in capsys.readouterr().err
            assert out.read_bytes() == before
    assert out.read_bytes() == ref.read_bytes()


def test_a_crash_inside_day_17_resumes_from_that_day_only(stream, tmp_path):
    """kill -9 in the middle of day 17 (fed on stdin, a line at a time), then the same
    day again: it replays day 17's steps only, from the snapshot after day 16."""
    base, key_path = stream
    args = _args(base, key_path, "unknown")
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"

    def day_cmd(d, src=None):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        return [*args, "-i", src or str(base / f"day{d:02d}.jsonl"), "-o", str(out),
                "--state", str(state), *until]

    for d in range(1, 17):
        assert main(day_cmd(d)) == 0
    done = 16 * STEPS_PER_DAY
    kill_at = done + random.Random(17).randrange(1, STEPS_PER_DAY - 1)
    lines = (base / "day17.jsonl").read_text().splitlines(keepends=True)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "dpstream", *day_cmd(17, "-")], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    for line in lines:  # step t is released once an event of a later step arrives
        proc.stdin.write(line.encode())
        proc.stdin.flush()
        if json.loads(line)["t"] > kill_at:
            break
    deadline = time.monotonic() + 60
    while out.read_bytes().count(b"\n") < kill_at:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    loud = [a for a in day_cmd(17, "-") if a != "-q"]
    resumed = subprocess.run([sys.executable, "-m", "dpstream", *loud, "--log-format", "json"],
                             env=env, input="".join(lines), capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stderr.strip().splitlines()[-1])
    assert summary["resumed_at"] >= kill_at
    assert summary["steps"] == STEPS_PER_DAY  # day 17's steps only: days 1-16 not re-read
    for d in range(18, DAYS + 1):
        assert main(day_cmd(d)) == 0
    assert out.read_bytes() == ref.read_bytes()
