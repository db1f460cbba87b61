"""Incremental runs: a stream fed one day at a time equals one run over all the days.

Each invocation brings the next day's events and releases the steps up to a
public end step (``--until``); the state keeps a snapshot of the mechanism, so
a later invocation never re-reads earlier days, and a crash inside one day
resumes from that day's start.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main

from .conftest import UNKNOWN_CLI, fixed_key, own_ledger

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
    # BLT (the default): items joining on later days draw their noise state there
    "unknown": [*UNKNOWN_CLI, "--remember"],
    "unknown-tree": [
        "-m",
        "unknown",
        "--max-items",
        "2",
        "--rho",
        "1",
        "--threshold-delta",
        "1e-3",
        "--remember",
        "--counter",
        "tree",
    ],
    "known": ["-m", "known", "--max-items", "2", "--rho", "1"],
    # --monotone: the running maxima of the published counts go on from the snapshot too
    # (without them the next day would restart the maxima and publish lower counts)
    "known-monotone": ["-m", "known", "--max-items", "2", "--rho", "1", "--monotone"],
}


def _args(base, key_path, mech):
    extra = ["--domain", str(base / "domain.txt")] if mech.startswith("known") else []
    return [
        "run",
        "-q",
        "-T",
        str(T),
        *MECHS[mech],
        *extra,
        "--key-file",
        str(key_path),
        "--no-fsync",
    ]


@pytest.mark.parametrize("mech", sorted(MECHS))
def test_thirty_daily_runs_equal_one_run_and_a_day_fed_twice_is_refused(
    stream, tmp_path, mech, capsys
):
    base, key_path = stream
    args = _args(base, key_path, mech)
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    for d in range(1, DAYS + 1):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        assert (
            main(
                [
                    *args,
                    "-i",
                    str(base / f"day{d:02d}.jsonl"),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    "--state",
                    str(state),
                    *until,
                ]
            )
            == 0
        ), d
        if d == 5:  # the same day again, with a later end step: refused, nothing written
            before = out.read_bytes()
            assert (
                main(
                    [
                        *args,
                        "-i",
                        str(base / "day05.jsonl"),
                        "-o",
                        str(out),
                        *own_ledger(out),
                        "--state",
                        str(state),
                        "--until",
                        "48",
                    ]
                )
                == 1
            )
            assert "already fed" in capsys.readouterr().err
            assert out.read_bytes() == before
    assert out.read_bytes() == ref.read_bytes()


def test_a_stream_begun_with_the_tree_default_goes_on_with_the_tree(stream, tmp_path, capsys):
    """Before BLT became UnkBase's default, a state recorded no counter and the tree's
    base (exactly what ``--base r*`` records): the next days, run without --base, go on
    with the tree (the bytes of one tree run), never switching to BLT; asking for
    --counter blt on that state is refused."""
    from dpstream.state import recorded_params
    from dpstream.tree import optimal_base

    base, key_path = stream
    args = _args(base, key_path, "unknown")
    ref = tmp_path / "ref.jsonl"
    assert (
        main(
            [
                *args,
                "--counter",
                "tree",
                "-i",
                str(base / "all.jsonl"),
                "-o",
                str(ref),
                *own_ledger(ref),
            ]
        )
        == 0
    )
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"

    def day(d, *extra):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        return main(
            [
                *args,
                *extra,
                "-i",
                str(base / f"day{d:02d}.jsonl"),
                "-o",
                str(out),
                "--state",
                str(state),
                *until,
            ]
        )

    assert day(1, "--base", str(optimal_base(T))) == 0
    params = recorded_params(str(state))
    assert params["counter"] is None and "blt" not in params and params["base"] > 1
    capsys.readouterr()
    assert day(2, "--counter", "blt") == 1
    assert "other parameters" in capsys.readouterr().err
    for d in range(2, DAYS + 1):
        assert day(d) == 0, d
    assert out.read_bytes() == ref.read_bytes()
    blt = tmp_path / "blt.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(blt), *own_ledger(blt)]) == 0
    assert blt.read_bytes() != ref.read_bytes()  # a new stream takes the BLT


def test_a_crash_inside_day_17_resumes_from_that_day_only(stream, tmp_path):
    """kill -9 in the middle of day 17 (fed on stdin, a line at a time: a batch is
    released once its input ends, so nothing of day 17 is out yet), then the same day
    again: it replays day 17's steps only, from the snapshot after day 16."""
    base, key_path = stream
    args = _args(base, key_path, "unknown")
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"

    def day_cmd(d, src=None):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        return [
            *args,
            "-i",
            src or str(base / f"day{d:02d}.jsonl"),
            "-o",
            str(out),
            *own_ledger(out),
            "--state",
            str(state),
            *until,
        ]

    for d in range(1, 17):
        assert main(day_cmd(d)) == 0
    done = 16 * STEPS_PER_DAY
    written = out.read_bytes()
    lines = (base / "day17.jsonl").read_text().splitlines(keepends=True)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpstream", *day_cmd(17, "-")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    half = random.Random(17).randrange(1, len(lines) - 1)
    for line in lines[:half]:
        proc.stdin.write(line.encode())
        proc.stdin.flush()
    time.sleep(0.5)  # the run has started and read what it was given
    assert proc.poll() is None  # still waiting for the rest of its input
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert out.read_bytes() == written  # no step of day 17 went out before its input ended
    loud = [a for a in day_cmd(17, "-") if a != "-q"]
    resumed = subprocess.run(
        [sys.executable, "-m", "dpstream", *loud, "--log-format", "json"],
        env=env,
        input="".join(lines),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stderr.strip().splitlines()[-1])
    assert summary["last_t"] == done + STEPS_PER_DAY
    assert summary["steps"] == STEPS_PER_DAY  # day 17's steps only: days 1-16 not re-read
    for d in range(18, DAYS + 1):
        assert main(day_cmd(d)) == 0
    assert out.read_bytes() == ref.read_bytes()


def _two_days(tmp_path, key_path, name, stream="default"):
    out, state = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.sqlite"
    cmd = [
        "run",
        "-q",
        "-m",
        "unknown",
        "-T",
        "12",
        "--max-items",
        "2",
        "--rho",
        "4",
        "--threshold-delta",
        "0.2",
        "--key-file",
        str(key_path),
        "-o",
        str(out),
        *own_ledger(out),
        "--state",
        str(state),
        "--stream",
        stream,
    ]
    return out, state, cmd


def _three_days(tmp_path, label: str, steps: list[tuple[int, int]]):
    """A key (``label``'s) and three days' files: day i holds an event of one item at its
    first step and one of two items at its second."""
    key_path = tmp_path / "k.key"
    fixed_key(label).save(key_path)
    days = [tmp_path / f"d{i}.jsonl" for i in (1, 2, 3)]
    for day, (a, b) in zip(days, steps, strict=True):
        day.write_text(f'{{"t": {a}, "items": ["a"]}}\n{{"t": {b}, "items": ["b", "a"]}}\n')
    return key_path, days


def test_a_run_killed_before_its_first_step_goes_on_after_the_last_one(tmp_path):
    """Review finding G: killed after it was recorded but before its first step, a run
    left an open record; the next run then wrote over the last released step."""
    import sqlite3
    from contextlib import closing

    key_path = tmp_path / "k.key"
    fixed_key("daily-g").save(key_path)
    day1, day2 = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    day1.write_text('{"t": 1, "items": ["a"]}\n{"t": 3, "items": ["a", "b"]}\n')
    day2.write_text('{"t": 5, "items": ["a"]}\n{"t": 8, "items": ["b"]}\n')
    (tmp_path / "all.jsonl").write_text(day1.read_text() + day2.read_text())
    out, state, cmd = _two_days(tmp_path, key_path, "g")
    assert main([*cmd, "-i", str(day1), "--until", "4"]) == 0
    with closing(sqlite3.connect(state)) as db, db:  # as a run killed right after its start
        db.execute("INSERT INTO batches (input, input_mac, first_t) VALUES ('x', 'm', 5)")
    # (another input than the killed run's: refused unless its events are given up)
    assert main([*cmd, "-i", str(day2), "--until", "8", "--replace-unfinished"]) == 0
    ref, _, ref_cmd = _two_days(tmp_path, key_path, "ref")
    assert (
        main(
            [
                *ref_cmd[:-4],
                "-i",
                str(tmp_path / "all.jsonl"),
                "--until",
                "8",
                "--state",
                str(tmp_path / "ref.sqlite"),
            ]
        )
        == 0
    )
    assert [json.loads(x)["t"] for x in out.read_text().splitlines()] == list(range(1, 9))
    assert out.read_bytes() == ref.read_bytes()


def test_a_day_killed_while_reading_is_not_lost_to_the_next_day(tmp_path, monkeypatch, capsys):
    """Review 87: a batch killed while it read its input (before its first release) was
    forgotten by the next batch, which released the killed day's steps without its
    events; they could never count after (late). Now the next day is refused, naming
    the killed day's input; that input again goes on, and the two days then give the
    bytes of one run over both. An error (not a kill) while reading leaves no mark."""
    import dpstream.run.command as command

    key_path, days = _three_days(tmp_path, "daily-killed", [(1, 3), (5, 7), (9, 11)])
    out, _, cmd = _two_days(tmp_path, key_path, "k")
    assert main([*cmd, "-i", str(days[0]), "--until", "4"]) == 0
    released = out.read_bytes()
    # an error while reading (not a kill) leaves the state as it found it: no mark
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n" * 5)
    assert main([*cmd, "-i", str(bad), "--until", "8", "--max-invalid", "0"]) != 0

    real = command._read_input

    def killed(*args, **kwargs):  # as kill -9 while reading: nothing runs after it
        raise KeyboardInterrupt

    today = tmp_path / "today.jsonl"  # a daily file written over in place
    today.write_bytes(days[1].read_bytes())
    monkeypatch.setattr(command, "_read_input", killed)
    main([*cmd, "-i", str(today), "--until", "8"])
    monkeypatch.setattr(command, "_read_input", real)
    capsys.readouterr()
    assert main([*cmd, "-i", str(days[2]), "--until", "12"]) != 0
    err = capsys.readouterr().err
    assert str(today) in err and "--replace-unfinished" in err
    # review 88: the same name over other bytes (the next day's) is another input
    today.write_bytes(days[2].read_bytes())
    assert main([*cmd, "-i", str(today), "--until", "12"]) != 0
    assert out.read_bytes() == released  # nothing released
    today.write_bytes(days[1].read_bytes())
    assert main([*cmd, "-i", str(today), "--until", "8"]) == 0
    assert main([*cmd, "-i", str(days[2]), "--until", "12"]) == 0
    whole = tmp_path / "all.jsonl"
    whole.write_text("".join(d.read_text() for d in days))
    ref, _, ref_cmd = _two_days(tmp_path, key_path, "ref")
    assert main([*ref_cmd, "-i", str(whole), "--until", "12"]) == 0
    assert out.read_bytes() == ref.read_bytes()


def test_a_finished_stream_refuses_an_input_it_never_read(tmp_path, capsys):
    """Review 87: a finished stream given a next day's file exited 0 and counted
    nothing, silently under -q (only an input with more records than the last run read
    was refused). The same command again still has nothing to do."""
    key_path = tmp_path / "k.key"
    fixed_key("daily-finished").save(key_path)
    day1, day2, later = (tmp_path / f"{n}.jsonl" for n in ("d1", "d2", "later"))
    day1.write_text('{"t": 1, "items": ["a"]}\n')
    day2.write_text('{"t": 6, "items": ["a"]}\n')
    later.write_text('{"t": 12, "items": ["b"]}\n')
    out, _, cmd = _two_days(tmp_path, key_path, "f")
    assert main([*cmd, "-i", str(day1), "--until", "4"]) == 0
    assert main([*cmd, "-i", str(day2)]) == 0  # to the horizon: finished
    released = out.read_bytes()
    capsys.readouterr()
    assert main([*cmd, "-i", str(later)]) != 0
    assert "finished" in capsys.readouterr().err
    assert main([*cmd, "-i", str(day2)]) == 0 and main([*cmd, "-i", str(day1)]) == 0
    assert out.read_bytes() == released


def test_a_stream_resumed_by_a_dpstream_that_words_its_scope_otherwise_counts_once(
    tmp_path, monkeypatch, capsys
):
    """A newer dpstream may word a new stream's noise scope otherwise (review 86 put the
    domain into top-k's): a stream resumed from its snapshot draws under the scope it
    recorded, and the ledger must know it by that one. It took the freshly built one,
    so the upgrade's first batch counted the stream's budget a second time (2 releases,
    rho 2, for one stream of rho 1)."""
    from dpstream.mechanisms.topk import ContinualTopK

    key_path = tmp_path / "k.key"
    fixed_key("daily-scope").save(key_path)
    (tmp_path / "dom.txt").write_text("a\nb\nc\n")
    day1, day2 = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    day1.write_text('{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["b", "a"]}\n')
    day2.write_text('{"t": 4, "items": ["c"]}\n{"t": 6, "items": ["a"]}\n')
    out, ledger = tmp_path / "out.jsonl", tmp_path / "L.ledger"
    cmd = ["run", "-q", "-m", "top-k", "--domain", str(tmp_path / "dom.txt"), "--k", "1",
           "--switches", "2", "--rho", "1", "-T", "6", "--key-file", str(key_path),
           "-o", str(out), "--state", str(tmp_path / "s.sqlite"), "--ledger", str(ledger),
           "--dataset", "ds"]  # fmt: skip
    new_scope = ContinualTopK.scope_for
    # day 1 under an older wording of the scope (what the dpstream before review 86 drew)
    monkeypatch.setattr(ContinualTopK, "scope_for", lambda self, d: new_scope(self, "old"))
    assert main([*cmd, "-i", str(day1), "--until", "3"]) == 0
    monkeypatch.setattr(ContinualTopK, "scope_for", new_scope)
    assert main([*cmd, "-i", str(day2)]) == 0
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key_path), "--ledger", str(ledger)]) == 0
    assert "over 1 release(s)" in capsys.readouterr().out


def test_a_snapshot_copied_from_another_stream_is_refused(tmp_path, capsys):
    """Review finding E: the snapshot's authentication bound neither the stream nor the
    step, so one stream's snapshot pasted into another's state was loaded."""
    import sqlite3
    from contextlib import closing

    key_path = tmp_path / "k.key"
    fixed_key("daily-e").save(key_path)
    day = tmp_path / "d1.jsonl"
    day.write_text('{"t": 1, "items": ["a"]}\n')
    later = tmp_path / "d2.jsonl"
    later.write_text('{"t": 5, "items": ["b"]}\n')
    _, state_a, cmd_a = _two_days(tmp_path, key_path, "a", stream="a")
    _, state_b, cmd_b = _two_days(tmp_path, key_path, "b", stream="b")
    assert main([*cmd_a, "-i", str(day), "--until", "4"]) == 0
    assert main([*cmd_b, "-i", str(day), "--until", "4"]) == 0
    with closing(sqlite3.connect(state_a)) as a:
        blob = a.execute("SELECT data FROM snapshot").fetchone()[0]
    with closing(sqlite3.connect(state_b)) as b, b:
        b.execute("UPDATE snapshot SET data = ?", (blob,))
    capsys.readouterr()
    assert main([*cmd_b, "-i", str(later), "--until", "8"]) == 1
    assert "not written for this run" in capsys.readouterr().err


def test_the_state_does_not_tell_which_steps_were_empty(tmp_path):
    """Review finding D: equal digests of empty steps and plain per-step input lines gave
    the per-step event counts without the key."""
    import sqlite3
    from contextlib import closing

    key_path = tmp_path / "k.key"
    fixed_key("daily-d").save(key_path)
    day = tmp_path / "d1.jsonl"
    day.write_text('{"t": 2, "items": ["a"]}\n{"t": 2, "items": ["b"]}\n')
    _, state, cmd = _two_days(tmp_path, key_path, "d")
    assert main([*cmd, "-i", str(day), "--until", "6"]) == 0
    with closing(sqlite3.connect(state)) as db:
        rows = db.execute("SELECT input_mac, input_line FROM steps ORDER BY t").fetchall()
    macs = [m for m, _ in rows]
    assert len(set(macs)) == len(macs) == 6  # five empty steps, five different digests
    assert {line for _, line in rows} == {0}  # positions kept only when following (masked)


def test_a_day_refused_for_an_invalid_record_goes_on_from_the_corrected_file(tmp_path, capsys):
    """Review 87, then review 109: a later batch stopped by --on-invalid error after
    releasing some steps could not be finished (its file erred again, and the corrected
    file was "another input"; --replace-unfinished was the way out). A batch run reads
    its input before its first release, so it now refuses the bad record before anything
    is written (as the Spark engine does): the state, the output and the ledger are as
    they were, and the corrected file goes on at once, with no flag. The output is the
    bytes of the run that had the corrected file from the start."""
    key = tmp_path / "k.key"
    fixed_key("daily-corrected").save(key)
    day1 = tmp_path / "day1.jsonl"
    day1.write_text('{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["b"]}\n')
    good = ['{"t": 3, "items": ["a"]}', '{"t": 4, "items": ["a", "b"]}']
    good += ['{"t": 5, "items": ["b"]}', '{"t": 6, "items": ["a"]}']
    bad = [*good[:2], '{"t": 5, "items": 7.5}', good[3]]
    fixed, broken = (tmp_path / f"{n}.jsonl" for n in ("fixed", "broken"))
    fixed.write_text("\n".join(good) + "\n")
    broken.write_text("\n".join(bad) + "\n")

    want, _, cmd = _two_days(tmp_path, key, "want")
    assert main([*cmd, "--on-invalid", "error", "-i", str(day1), "--until", "2"]) == 0
    assert main([*cmd, "--on-invalid", "error", "-i", str(fixed), "--until", "6"]) == 0

    out, state, cmd = _two_days(tmp_path, key, "got")
    cmd += ["--on-invalid", "error"]
    assert main([*cmd, "-i", str(day1), "--until", "2"]) == 0

    def held() -> tuple[bytes, bytes, list[str]]:
        with contextlib.closing(sqlite3.connect(state)) as db:
            return out.read_bytes(), Path(f"{out}.ledger").read_bytes(), list(db.iterdump())

    before = held()
    capsys.readouterr()
    assert main([*cmd, "-i", str(broken), "--until", "6"]) == 1
    assert "input line 3" in capsys.readouterr().err
    assert held() == before  # nothing written: no step, no batch begun
    assert main([*cmd, "-i", str(fixed), "--until", "6"]) == 0
    assert out.read_bytes() == want.read_bytes()
    assert main([*cmd, "-i", str(fixed), "--until", "8"]) == 1  # fed to the stream already
    assert "already fed" in capsys.readouterr().err


def test_a_batch_behind_the_ledger_cannot_end_below_its_steps(tmp_path, capsys):
    """Review 96: a batch killed after the ledger recorded its last step but before the
    state did (or a state and output restored from a backup) could be run again with a
    smaller --until: it ended below the ledger's steps, which it never wrote, and the
    stream was stuck for good (each next batch met step 8 on record from "other input").
    Such an --until is refused, naming the step; the batch's own --until goes on, and
    the stream then equals, byte for byte, one that was never restored."""
    key, days = _three_days(tmp_path, "daily-behind", [(1, 4), (5, 8), (9, 12)])
    want, _, ref = _two_days(tmp_path, key, "want")
    for day, until in zip(days, ("4", "8", "12"), strict=True):
        assert main([*ref, "-i", str(day), "--until", until]) == 0

    out, state, cmd = _two_days(tmp_path, key, "got")  # (a ledger of its own: own_ledger)
    assert main([*cmd, "-i", str(days[0]), "--until", "4"]) == 0
    backup = {p: p.read_bytes() for p in (out, state)}
    assert main([*cmd, "-i", str(days[1]), "--until", "8"]) == 0
    for p, data in backup.items():  # the state and output restored; the ledger is not
        p.write_bytes(data)
    capsys.readouterr()
    assert main([*cmd, "-i", str(days[1]), "--until", "7"]) == 1
    err = capsys.readouterr().err
    assert "--until 7 is before step 8, which the release ledger" in err, err
    assert main([*cmd, "-i", str(days[1]), "--until", "8"]) == 0
    assert main([*cmd, "-i", str(days[2]), "--until", "12"]) == 0
    assert out.read_bytes() == want.read_bytes()
    assert [json.loads(x)["t"] for x in out.read_text().splitlines()] == list(range(1, 13))


def _open_spill_files() -> int:
    """How many of this process's open files are a run's (unlinked) temporary counts."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += "dpstream-spill-" in os.readlink(f"/proc/self/fd/{fd}")
    return found


def test_a_state_restored_two_batches_behind_goes_on_batch_by_batch(tmp_path, capsys):
    """Review 109: a state and output restored from a backup two batches behind the ledger
    could never go on: day 3 again with its own --until was refused as below the
    ledger's last step, and with the ledger's last step as refused as other input (its
    steps came from two files). Each batch replayed in order, with its own input and
    --until, now gives the releases on record, byte for byte; one that ends inside its
    input is still refused (review 96), before anything is written."""
    key, days = _three_days(tmp_path, "daily-behind-2", [(1, 3), (5, 7), (9, 11)])
    want, _, ref = _two_days(tmp_path, key, "want")
    for day, until in zip(days, ("4", "8", "12"), strict=True):
        assert main([*ref, "-i", str(day), "--until", until]) == 0

    out, state, cmd = _two_days(tmp_path, key, "got")
    assert main([*cmd, "-i", str(days[0]), "--until", "4"]) == 0
    backup = {p: p.read_bytes() for p in (out, state)}
    assert main([*cmd, "-i", str(days[1]), "--until", "8"]) == 0
    assert main([*cmd, "-i", str(days[2]), "--until", "12"]) == 0
    for p, data in backup.items():  # the state and output of day 1; the ledger kept
        p.write_bytes(data)
    capsys.readouterr()
    before = out.read_bytes()
    opened = _open_spill_files()
    assert main([*cmd, "-i", str(days[1]), "--until", "6"]) == 1  # inside its input
    assert "this input holds records past it" in capsys.readouterr().err
    assert _open_spill_files() == opened  # its counts' temporary file closed with it
    assert out.read_bytes() == before
    assert main([*cmd, "-i", str(days[1]), "--until", "8"]) == 0
    assert main([*cmd, "-i", str(days[2]), "--until", "12"]) == 0
    assert out.read_bytes() == want.read_bytes()


def test_a_stream_begun_under_another_calibration_is_named_as_such(tmp_path, capsys):
    """Review 96: a state whose noise scale differs from this dpstream's calibration of
    the same budget options (a version that calibrated otherwise began the stream) was
    refused as "differs in: the noise scale (the budget: --epsilon/--delta ...)", which
    blames options the operator never changed. It says what happened now."""
    import sqlite3
    from contextlib import closing

    key = tmp_path / "k.key"
    fixed_key("daily-calibration").save(key)
    day1, day2 = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    day1.write_text('{"t": 1, "items": ["a"]}\n')
    day2.write_text('{"t": 3, "items": ["a"]}\n')
    out, state, cmd = _two_days(tmp_path, key, "cal")
    assert main([*cmd, "-i", str(day1), "--until", "2"]) == 0
    with closing(sqlite3.connect(state)) as db, db:  # as an older dpstream recorded it
        (params,) = db.execute("SELECT params FROM run").fetchone()
        old = json.loads(params)
        old["tau"] = math.nextafter(old["tau"], math.inf)
        db.execute("UPDATE run SET params = ?", (json.dumps(old, sort_keys=True),))
    capsys.readouterr()
    assert main([*cmd, "-i", str(day2), "--until", "4"]) == 1
    err = capsys.readouterr().err
    assert "this dpstream calibrates the same budget options to" in err, err
    assert "go on with the version that began it" in err


@pytest.mark.parametrize(
    "edit",
    [
        "DELETE FROM steps WHERE t = 4",  # the snapshot's step
        "DELETE FROM steps WHERE t = 3",  # a gap, with the ledger's steps 3 and 4 cut
        "UPDATE run SET params = '[1]'",
        "UPDATE run SET params = '{x'",
        "UPDATE run SET params = '" + "[" * 100_000 + "'",  # review 103: RecursionError
        "CREATE TRIGGER tr BEFORE INSERT ON steps BEGIN SELECT RAISE(ABORT, 'x'); END",
        # review 103: a view (of an endless query, in place of the steps table) hung the
        # run past Ctrl-C; dpstream makes no view, trigger or virtual table
        "CREATE VIEW v AS WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) "
        "SELECT n FROM c",
        "UPDATE steps SET end_offset = 'zz' WHERE t = 4",
        "UPDATE snapshot SET t = 'x'",
        "UPDATE snapshot SET data = 'hello'",
    ],
)
def test_a_state_edited_by_hand_is_refused_in_one_line(tmp_path, capsys, edit):
    """Review 99: rows edited by hand (no key needed) stopped the next batch with a
    Python traceback (an assertion, an AttributeError, sqlite3's IntegrityError) or a
    bare "invalid literal for int()". Each is one line naming the state; nothing is
    released."""
    import sqlite3
    from contextlib import closing

    key, days = _three_days(tmp_path, "daily-edited", [(1, 4), (5, 8), (9, 12)])
    out, state, cmd = _two_days(tmp_path, key, "e")
    assert main([*cmd, "-i", str(days[0]), "--until", "4"]) == 0
    released = out.read_bytes()
    with closing(sqlite3.connect(state)) as db, db:
        db.execute(edit)
    if "t = 3" in edit:  # (the state's steps are then caught up into the ledger)
        ledger = Path(f"{out}.ledger")
        lines = ledger.read_bytes().splitlines(keepends=True)
        ledger.write_bytes(b"".join(x for x in lines if x.split(b" ")[2:3] not in ([b"3"], [b"4"])))
    capsys.readouterr()
    assert main([*cmd, "-i", str(days[1]), "--until", "8"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpstream: error:"), err
    assert "edited" in err and str(state.name) in err, err
    assert out.read_bytes() == released


@pytest.mark.parametrize("held", ["ledger", "registry"])
def test_a_batch_killed_while_it_waits_for_a_lock_leaves_its_mark(tmp_path, held, monkeypatch):
    """Review 110: a later batch SIGKILLed while it waited for the release ledger's lock (a
    backup holding it) or the key registry's left no mark that it began, so the next
    day's command went on and the killed day's events were lost for good. The batch is
    now marked before it waits: the next day is refused, naming the killed day's input,
    and the days run in order give the bytes of the run never killed."""
    import fcntl

    key = tmp_path / "k.key"
    fixed_key("daily-lock").save(key)
    registry = tmp_path / "registry"
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", str(registry))
    days = []
    for d in range(3):
        path = tmp_path / f"day{d + 1}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"t": 4 * d + 1 + j % 4, "items": [f"i{j % 3}"]}) + "\n"
                for j in range(8)
            )  # fmt: skip
        )
        days.append(path)
    base = ["run", "-q", "-m", "unknown", "-T", "12", "--max-items", "1", "--rho", "4",
            "--threshold-delta", "0.2", "--key-file", str(key)]  # fmt: skip

    def day(n, out, state):
        return [*base, "-o", str(out), "--state", str(state), "-i", str(days[n]),
                "--until", str(4 * n + 4)]  # fmt: skip

    ref = tmp_path / "ref"
    ref.mkdir()
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", "off")
    for n in range(3):
        assert main([*day(n, ref / "o.jsonl", ref / "s.sqlite"), "--ledger", str(ref / "L")]) == 0
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", str(registry))
    out, state = tmp_path / "o.jsonl", tmp_path / "s.sqlite"
    assert main(day(0, out, state)) == 0
    lock_path = (
        f"{key}.ledger"
        if held == "ledger"
        else str(next(p for p in registry.iterdir() if p.name.endswith(".lock")))
    )
    with open(lock_path, "rb+") as held_fh:
        fcntl.flock(held_fh, fcntl.LOCK_EX)  # as a backup, or `flock FILE cmd`, holds it
        argv = [sys.executable, "-m", "dpstream", *day(1, out, state)]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        guard = threading.Timer(120, proc.kill)  # a run that never says it waits: ended
        guard.start()
        said = proc.stderr.readline().decode()  # it says it waits (after half a second)
        guard.cancel()
        assert "waiting for" in said and "locked by another process" in said, said
        proc.kill()  # SIGKILL while it waits
        proc.wait()
    assert main(day(2, out, state)) == 1  # day 3 first: refused, day 2's input named
    assert main(day(1, out, state)) == 0
    assert main(day(2, out, state)) == 0
    assert out.read_bytes() == (ref / "o.jsonl").read_bytes()
