"""The release ledger: a state and an output restored from a backup cannot re-release a step.

Issue #27, defect 3: day 2 was published; the state and the output were then
restored to copies taken after day 1 and day 2 was fed again with 50 lines
removed. The run released day 2 again, and the difference of the two day-2
releases was exactly the true counts of the removed events (the same keyed
noise on other data). The ledger kept beside the key remembers every step
each run released, with a keyed digest of its input, so the rolled-back state
cannot release those steps again from other input.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpstream.cli import main

from .conftest import day_event_lines, fixed_key

STEPS_PER_DAY = 8
T = 3 * STEPS_PER_DAY
WORDS = [f"w{i}" for i in range(12)]


def _day_lines(day: int, seed: int = 5) -> list[str]:
    return day_event_lines(
        day, steps_per_day=STEPS_PER_DAY, words=WORDS, events_per_step=(20, 40), seed=seed
    )


@pytest.fixture
def stream(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("ledger").save(key_path)
    (tmp_path / "domain.txt").write_text("\n".join(WORDS) + "\n")
    days = {d: _day_lines(d) for d in (1, 2, 3)}
    for d, lines in days.items():
        (tmp_path / f"day{d}.jsonl").write_text("".join(lines))
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        "run",
        "-q",
        "-m",
        "known",
        "--max-items",
        "2",
        "--rho",
        "1",
        "-T",
        str(T),
        "--domain",
        str(tmp_path / "domain.txt"),
        "--no-round",
        "--no-fsync",
        "--key-file",
        str(key_path),
        "-o",
        str(out),
        "--state",
        str(state),
    ]
    return tmp_path, key_path, days, out, state, cmd


def _day(cmd, path, day):
    return [*cmd, "-i", str(path), "--until", str(day * STEPS_PER_DAY)]


def _backup(paths, where: Path) -> None:
    where.mkdir()
    for p in paths:
        shutil.copy2(p, where / p.name)


def _restore(paths, where: Path) -> None:
    for p in paths:
        shutil.copy2(where / p.name, p)


def _tables(state: Path) -> list[str]:
    with closing(sqlite3.connect(state)) as db:
        return list(db.iterdump())


def _releases(data: bytes) -> dict[int, dict[str, float]]:
    return {r["t"]: r["released"] for r in map(json.loads, data.decode().splitlines())}


def _removed_counts(day2: list[str], kept: list[str]) -> dict[int, dict[str, int]]:
    """Per step t of day 2, the true count of each item among the removed events of
    steps 9..t (the running counts a release at t holds)."""
    removed = list(day2)
    for line in kept:
        removed.remove(line)
    per_step: dict[int, dict[str, int]] = {}
    running = dict.fromkeys(WORDS, 0)
    for t in range(STEPS_PER_DAY + 1, 2 * STEPS_PER_DAY + 1):
        for line in removed:
            rec = json.loads(line)
            if rec["t"] == t:
                for item in rec["items"]:
                    running[item] += 1
        per_step[t] = dict(running)
    return per_step


def test_a_state_and_output_restored_from_a_backup_cannot_release_a_day_again(stream, capsys):
    tmp_path, key_path, days, out, state, cmd = stream
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    files = [out, state, out.with_name(out.name + ".meta.json")]
    assert files[2].exists()
    _backup(files, tmp_path / "after-day1")
    assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 0
    published = out.read_bytes()  # day 2 is out

    kept = list(days[2])
    rng = random.Random(27)
    for _ in range(50):
        kept.pop(rng.randrange(len(kept)))
    (tmp_path / "day2-cut.jsonl").write_text("".join(kept))
    _restore(files, tmp_path / "after-day1")
    before, tables = out.read_bytes(), _tables(state)
    meta = files[2].read_bytes()

    # the attack, where nothing outside the state remembers day 2 (here: another ledger,
    # as if the ledger had been rolled back with the state): the releases differ by
    # exactly the true counts of the removed events
    other = tmp_path / "elsewhere.ledger"
    assert main([*_day(cmd, tmp_path / "day2-cut.jsonl", 2), "--ledger", str(other)]) == 0
    first, second = _releases(published), _releases(out.read_bytes())
    truth = _removed_counts(days[2], kept)
    for t in range(STEPS_PER_DAY + 1, 2 * STEPS_PER_DAY + 1):
        for item in WORDS:
            assert first[t][item] - second[t][item] == pytest.approx(truth[t][item], abs=1e-6)
    assert sum(truth[2 * STEPS_PER_DAY].values()) > 0

    # with the ledger beside the key (the default): refused, nothing written
    _restore(files, tmp_path / "after-day1")
    capsys.readouterr()
    assert main(_day(cmd, tmp_path / "day2-cut.jsonl", 2)) == 1
    err = capsys.readouterr().err
    assert "ledger" in err and "behind" in err and f"step {STEPS_PER_DAY + 1}" in err
    assert out.read_bytes() == before
    assert _tables(state) == tables
    assert files[2].read_bytes() == meta

    # the same day 2 again (a legit re-run after a restore): the same bytes, and it goes on
    assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 0
    assert out.read_bytes() == published
    assert main(_day(cmd, tmp_path / "day3.jsonl", 3)) == 0
    ref = tmp_path / "ref.jsonl"
    (tmp_path / "all.jsonl").write_text("".join(days[1] + days[2] + days[3]))
    ref_cmd = [a for a in cmd if a not in (str(out), str(state))]
    ref_cmd = [a for a in ref_cmd if a not in ("-o", "--state")]
    assert (
        main(
            [
                *ref_cmd,
                "-i",
                str(tmp_path / "all.jsonl"),
                "-o",
                str(ref),
                "--ledger",
                str(tmp_path / "ref.ledger"),
            ]
        )
        == 0
    )
    assert out.read_bytes() == ref.read_bytes()


def _ledger_lines(key_path: Path) -> list[str]:
    """The step lines of the ledger beside the key (not the runs' scope lines)."""
    return [
        line
        for line in Path(f"{key_path}.ledger").read_text().splitlines()
        if line.startswith("L1 ")
    ]


def test_a_run_killed_between_the_ledger_and_the_state_resumes(stream, monkeypatch):
    """Write-ahead: a step is in the ledger before the state records it. A kill between
    the two leaves the state one step behind the ledger; the same command resumes, to
    the bytes of an uninterrupted run (and a changed input for that step is refused)."""
    from dpstream.state import Checkpoint

    tmp_path, key_path, days, out, state, cmd = stream
    ref = tmp_path / "ref.jsonl"
    ref_cmd = [a for a in cmd if a not in (str(out), str(state), "-o", "--state")]
    assert (
        main(
            [
                *ref_cmd,
                "-i",
                str(tmp_path / "day1.jsonl"),
                "-o",
                str(ref),
                "--until",
                str(STEPS_PER_DAY),
                "--ledger",
                str(tmp_path / "ref.ledger"),
            ]
        )
        == 0
    )
    commit = Checkpoint.commit

    def killed_at_5(self, t, **kw):
        if t == 5:
            raise KeyboardInterrupt  # as a kill right after the ledger's append
        return commit(self, t, **kw)

    monkeypatch.setattr(Checkpoint, "commit", killed_at_5)
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 130
    monkeypatch.setattr(Checkpoint, "commit", commit)
    with closing(sqlite3.connect(state)) as db:
        assert db.execute("SELECT MAX(t) FROM steps").fetchone()[0] == 4
    assert len(_ledger_lines(key_path)) == 5
    assert out.read_bytes().count(b"\n") == 4
    changed = tmp_path / "changed.jsonl"  # step 5 with one event less: refused
    lines = list(days[1])
    lines.remove(next(x for x in lines if json.loads(x)["t"] == 5))
    changed.write_text("".join(lines))
    before = out.read_bytes()
    assert main(_day(cmd, changed, 1)) == 1
    assert out.read_bytes() == before
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    assert out.read_bytes() == ref.read_bytes()
    assert len(_ledger_lines(key_path)) == STEPS_PER_DAY


def test_a_torn_ledger_line_after_a_kill_is_ignored_and_the_run_resumes(stream, monkeypatch):
    """A kill in the middle of an append leaves a last line without its line feed (its
    step was not in the state yet, so nothing of it was written): it is ignored, cut off
    when the resumed run appends, and the run resumes to the uninterrupted bytes."""
    import dpstream.ledger

    tmp_path, key_path, days, out, state, cmd = stream
    ref = tmp_path / "ref.jsonl"
    ref_cmd = [a for a in cmd if a not in (str(out), str(state), "-o", "--state")]
    assert (
        main(
            [
                *ref_cmd,
                "-i",
                str(tmp_path / "day1.jsonl"),
                "-o",
                str(ref),
                "--until",
                str(STEPS_PER_DAY),
                "--ledger",
                str(tmp_path / "ref.ledger"),
            ]
        )
        == 0
    )
    append, calls = dpstream.ledger._append, []

    def killed_in_the_6th_append(fd, data):
        calls.append(data)
        if len(calls) == 6:
            append(fd, data[: len(data) // 2])
            raise KeyboardInterrupt  # as a kill in the middle of the write
        append(fd, data)

    monkeypatch.setattr(dpstream.ledger, "_append", killed_in_the_6th_append)
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 130
    monkeypatch.setattr(dpstream.ledger, "_append", append)
    ledger = Path(f"{key_path}.ledger")
    text = ledger.read_text()
    # the run's scope and budget lines and 5 steps (the first append holds all three), a
    # torn sixth step
    assert text.count("\n") == 7 and not text.endswith("\n")
    assert out.read_bytes().count(b"\n") == 5
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    assert out.read_bytes() == ref.read_bytes()
    text = ledger.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == STEPS_PER_DAY + 2
    assert [x[:3] for x in text.splitlines()[:3]] == ["S1 ", "B1 ", "L1 "]
    assert [int(line.split(" ")[2]) for line in text.splitlines()[2:]] == list(
        range(1, STEPS_PER_DAY + 1)
    )


def _flip(field: str) -> str:
    return ("0" if field[0] != "0" else "1") + field[1:]


@pytest.mark.parametrize("edit", ["digest", "tag", "removed", "ahead"])
def test_an_edited_ledger_is_refused(stream, capsys, edit):
    """A line changed without the key (a digest, its tag) or removed from the middle is
    refused, and nothing is written: the line of the state's last step (checked when
    the run opens), a line removed anywhere (the run's steps must be 1..L), and, with a
    state restored from a backup, a line of a step the state forgot (checked before it
    is released again, even from the same input)."""
    tmp_path, key_path, days, out, state, cmd = stream
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    ledger = Path(f"{key_path}.ledger")
    if edit == "ahead":
        _backup([out, state], tmp_path / "after-day1")
        assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 0
        _restore([out, state], tmp_path / "after-day1")
    lines = ledger.read_text().splitlines(keepends=True)
    # the line of a step (lines 1-2 are the run's scope and budget lines): the state's
    # last step, step 4 and a step the restored state forgot
    at = 1 + {"digest": STEPS_PER_DAY, "tag": STEPS_PER_DAY, "removed": 4}.get(
        edit, STEPS_PER_DAY + 4
    )
    fields = lines[at].split(" ")
    if edit == "removed":
        del lines[at]
    else:
        fields[3 if edit in ("digest", "ahead") else 5] = _flip(
            fields[3 if edit in ("digest", "ahead") else 5]
        )
        lines[at] = " ".join(fields)
    ledger.write_text("".join(lines))
    before, tables = out.read_bytes(), _tables(state)
    capsys.readouterr()
    assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 1
    err = capsys.readouterr().err
    assert ("lacks step 4" if edit == "removed" else f"line {at + 1} ") in err, err
    assert edit == "removed" or "edited or forged" in err
    assert out.read_bytes() == before and _tables(state) == tables


def test_streams_sharing_a_key_share_its_ledger(stream):
    """Two streams under one key (two states, two outputs, other stream names): each
    has its own lines in the one ledger, and both go on."""
    tmp_path, key_path, days, out, state, cmd = stream
    other_cmd = [
        a.replace(str(out), str(tmp_path / "b.jsonl")).replace(
            str(state), str(tmp_path / "b.sqlite")
        )
        for a in cmd
    ]
    other_cmd += ["--stream", "b"]
    for d in (1, 2):
        assert main(_day(cmd, tmp_path / f"day{d}.jsonl", d)) == 0
        assert main(_day(other_cmd, tmp_path / f"day{d}.jsonl", d)) == 0
    runs = {line.split(" ")[1] for line in _ledger_lines(key_path)}
    assert len(runs) == 2 and len(_ledger_lines(key_path)) == 4 * STEPS_PER_DAY


def test_a_state_older_than_its_ledger_is_adopted(stream, capsys):
    """A state whose steps the ledger lacks (written before the ledger existed, or kept
    with another --ledger): its steps are added to the ledger, which then guards them."""
    tmp_path, key_path, days, out, state, cmd = stream
    old = tmp_path / "old.ledger"
    assert main([*_day(cmd, tmp_path / "day1.jsonl", 1), "--ledger", str(old)]) == 0
    files = [out, state]
    _backup(files, tmp_path / "after-day1")
    assert not Path(f"{key_path}.ledger").exists()
    capsys.readouterr()
    assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 0  # adopts day 1's steps
    # ... and says so (review 87: another, empty ledger took the stream silently)
    assert f"held none of the {STEPS_PER_DAY} steps" in capsys.readouterr().err
    assert len(_ledger_lines(key_path)) == 2 * STEPS_PER_DAY
    _restore(files, tmp_path / "after-day1")
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(days[2][1:]))
    capsys.readouterr()
    assert main(_day(cmd, cut, 2)) == 1
    assert "behind the release ledger" in capsys.readouterr().err


def test_the_ledger_cannot_be_another_file_and_must_be_writable(stream, capsys):
    tmp_path, key_path, days, out, state, cmd = stream
    day1 = _day(cmd, tmp_path / "day1.jsonl", 1)
    assert main([*day1, "--ledger", str(out)]) == 1
    assert "--ledger" in capsys.readouterr().err
    assert main([*day1, "--ledger", str(key_path)]) == 1
    assert "same file as --key-file" in capsys.readouterr().err
    assert main([*day1, "--ledger", str(tmp_path / "day1.jsonl" / "x.ledger")]) == 1
    assert "cannot open the release ledger" in capsys.readouterr().err
    assert not out.exists()  # refused before the output was opened
    ledger = Path(f"{key_path}.ledger")
    ledger.touch(mode=0o600)
    ledger.chmod(0o620)
    assert main(day1) == 1
    assert "written by other users" in capsys.readouterr().err
    ledger.chmod(0o600)
    assert main(day1) == 0
    assert oct(ledger.stat().st_mode & 0o777) == "0o600"


def test_two_copies_of_one_run_cannot_record_a_step_twice(tmp_path):
    """Two processes with one run id (a state copied and run twice at once) read each
    other's appends under the lock: the second cannot record step 1 from other input."""
    from dpstream.ledger import LedgerError, ReleaseLedger

    path, run = str(tmp_path / "k.ledger"), "ab" * 16
    a = ReleaseLedger(path, fixed_key("u"), run, fsync=False)
    b = ReleaseLedger(path, fixed_key("u"), run, fsync=False)
    a.record(1, "1" * 64, "2" * 64)
    with pytest.raises(LedgerError, match="other input"):
        b.record(1, "3" * 64, "2" * 64)
    b.record(1, "1" * 64, "2" * 64)  # the same step: nothing appended
    with pytest.raises(LedgerError, match="does not follow"):
        b.record(3, "1" * 64, "2" * 64)
    assert Path(path).read_text().count("\n") == 1
    a.close()
    b.close()
    with pytest.raises(LedgerError, match="not written with this key"):  # its last line
        ReleaseLedger(path, fixed_key("another"), run, fsync=False)
    ReleaseLedger(path, fixed_key("another"), "cd" * 16, fsync=False).close()  # other runs


def test_a_follower_restored_from_a_backup_cannot_release_a_step_again(tmp_path, capsys):
    """The same with --follow (steps on a public clock long past, so every step is due
    at once): a follower's state and output restored to after its first four steps
    cannot release step 5 again from input with one event less."""
    import datetime as dt

    key_path = tmp_path / "k.key"
    fixed_key("ledger-follow").save(key_path)
    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)

    def events(first, last, drop=False):
        rows = [
            {
                "ts": (start + dt.timedelta(hours=h - 1, minutes=m)).isoformat(),
                "items": [WORDS[(h + m) % len(WORDS)]],
            }
            for h in range(first, last + 1)
            for m in range(0, 60, 7)
        ]
        return "".join(json.dumps(r) + "\n" for r in rows[1 if drop else 0 :])

    (tmp_path / "a.jsonl").write_text(events(1, 4))
    (tmp_path / "b.jsonl").write_text(events(5, 8))
    (tmp_path / "b-cut.jsonl").write_text(events(5, 8, drop=True))
    out, state = tmp_path / "o.jsonl", tmp_path / "s.sqlite"
    cmd = [
        "run",
        "-q",
        "-m",
        "unknown",
        "--max-items",
        "1",
        "--rho",
        "1",
        "--threshold-delta",
        "0.1",
        "-T",
        "24",
        "--key-file",
        str(key_path),
        "-o",
        str(out),
        "--state",
        str(state),
        "--time-field",
        "ts",
        "--step",
        "1h",
        "--start",
        start.isoformat(),
        "--follow",
        "--no-fsync",
    ]
    assert main([*cmd, "-i", str(tmp_path / "a.jsonl"), "--until", "4"]) == 0
    _backup([out, state], tmp_path / "after-a")
    assert main([*cmd, "-i", str(tmp_path / "b.jsonl"), "--until", "8"]) == 0
    published = out.read_bytes()
    _restore([out, state], tmp_path / "after-a")
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*cmd, "-i", str(tmp_path / "b-cut.jsonl"), "--until", "8"]) == 1
    assert "step 5 of this run as released from other input" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main([*cmd, "-i", str(tmp_path / "b.jsonl"), "--until", "8"]) == 0
    assert out.read_bytes() == published


def _step_line(key_path: Path, at: int, step: str) -> str:
    """The ledger's line ``at`` (0-based) with its step replaced by ``step`` (the digests
    and the tag kept: a line of the right shape, not written with the key)."""
    fields = Path(f"{key_path}.ledger").read_text().splitlines()[at].split(" ")
    fields[2] = step
    return " ".join(fields) + "\n"


@pytest.mark.parametrize("step", ["0", "-3", "+9", "09", str(10**6)])
def test_a_ledger_line_of_an_impossible_step_is_refused_naming_it(stream, capsys, step):
    """A run's line whose step is not one the ledger writes (below 1, not in decimal
    digits) or lies far past the run's lines is refused, naming the line, before
    anything is written; no set sized by that step is built (10**6 allocated tens of
    MB: a step of 3e9 took 15 GB) and a step below 1 is no crash."""
    import tracemalloc

    tmp_path, key_path, days, out, state, cmd = stream
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    ledger = Path(f"{key_path}.ledger")
    with ledger.open("a") as f:  # lines 1-2: the run's scope and budget lines
        f.write(_step_line(key_path, 1 + STEPS_PER_DAY, step))
    number = STEPS_PER_DAY + 3
    before, tables = out.read_bytes(), _tables(state)
    capsys.readouterr()
    tracemalloc.start()
    try:
        assert main(_day(cmd, tmp_path / "day2.jsonl", 2)) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert f"line {number} of the release ledger" in err, err
    assert ("edited or forged" if step == str(10**6) else "not a ledger entry") in err, err
    assert "behind the release ledger" not in err
    assert peak < 16 * 2**20, peak  # the run's own reading and setup, no set of 10**6
    assert out.read_bytes() == before and _tables(state) == tables


def test_a_forged_line_of_a_step_far_past_the_run_is_refused_without_allocating(tmp_path):
    """A forged line of step 10**9 is refused naming it, with a few MB allocated at most.
    Opened in a child process with 1 GB of address space: a dpstream that sized a set
    by the step fails there with MemoryError instead of taking the machine's memory."""
    import os
    import subprocess
    import sys

    import dpstream
    from dpstream.ledger import ReleaseLedger

    path, run = tmp_path / "k.ledger", "ab" * 16
    with ReleaseLedger(str(path), fixed_key("u"), run, fsync=False) as ledger:
        for t in (1, 2, 3):
            ledger.record(t, f"{t}" * 64, "2" * 64)
    with path.open("a") as f:
        f.write(f"L1 {run} {10**9} {'1' * 32} {'2' * 32} {'0' * 32}\n")
    child = f"""
import hashlib, tracemalloc
from dpstream.ledger import LedgerError, ReleaseLedger
from dpstream.noise import NoiseKey
key = NoiseKey.from_bytes(hashlib.sha256(b"dpstream-test:u").digest())
tracemalloc.start()
try:
    ReleaseLedger({str(path)!r}, key, {run!r}, fsync=False)
except LedgerError as exc:
    print(tracemalloc.get_traced_memory()[1], exc)
"""

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    src = os.path.dirname(os.path.dirname(dpstream.__file__))
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": src, "OPENBLAS_NUM_THREADS": "1"},
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout, done.stderr[-2000:]
    peak, message = done.stdout.split(" ", 1)
    assert "line 4 of the release ledger" in message and "edited or forged" in message
    assert int(peak) < 4 * 2**20, peak


def test_a_forged_line_of_the_next_step_is_refused_before_the_state_is_called_behind(
    stream, capsys
):
    """A forged line of the step after the state's last is refused as forged when the
    run opens, not first announced as a step released after the state was saved."""
    tmp_path, key_path, days, out, state, cmd = stream
    assert main(_day(cmd, tmp_path / "day1.jsonl", 1)) == 0
    with Path(f"{key_path}.ledger").open("a") as f:
        f.write(_step_line(key_path, 1 + STEPS_PER_DAY, str(STEPS_PER_DAY + 1)))
    before = out.read_bytes()
    capsys.readouterr()
    assert main([a for a in _day(cmd, tmp_path / "day2.jsonl", 2) if a != "-q"]) == 1
    err = capsys.readouterr().err
    assert f"line {STEPS_PER_DAY + 3} of the release ledger" in err, err
    assert "edited or forged" in err and "behind the release ledger" not in err, err
    assert out.read_bytes() == before
