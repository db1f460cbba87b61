"""Operating a run: log lines and progress without a terminal, JSON logs, full disks."""

from __future__ import annotations

import json
import sqlite3

import pytest

from dpstream.cli import main
from dpstream.errors import StateError
from dpstream.state import Checkpoint, canonical_json

from .conftest import fixed_key, own_ledger

UNK = ["run", "-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta", "1e-3"]


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "k.key"
    fixed_key("ops").save(path)
    return str(path)


def _events(tmp_path, n=200):
    src = tmp_path / "ev.jsonl"
    src.write_text(
        "".join(json.dumps({"t": t, "items": ["a", "b"]}) + "\n" for t in range(1, n + 1))
    )
    return str(src)


def _count_taken(monkeypatch: pytest.MonkeyPatch, noted: list[int]) -> None:
    """Count in ``noted[0]`` the records a ``--follow`` run's loop takes in (a test drives
    the follower's clock by them, never by the machine's pace)."""
    import dpstream.run.follow as run_follow
    import dpstream.run.pipeline as run_pipeline

    real_follow = run_follow.follow

    def counting_follow(infile, cfg, count, **kw):
        take = count.take

        def counted(rec):
            noted[0] += 1
            return take(rec)

        count.take = counted
        return real_follow(infile, cfg, count, **kw)

    monkeypatch.setattr(run_pipeline, "follow", counting_follow)


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, key_path, capsys):
    src = _events(tmp_path)
    assert (
        main(
            [
                *UNK,
                "-T",
                "200",
                "--key-file",
                key_path,
                "-i",
                src,
                "-o",
                str(tmp_path / "o.jsonl"),
                "--progress-every",
                "1e-9",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if line.startswith("dpstream: step ")]
    assert len(progress) >= 100  # one per step at this interval
    assert "step 200 of 200 (100%), 200 events" in progress[-1] and "left" in progress[-1]
    assert any(line.startswith("dpstream: 200 steps (t = 1..200") for line in err)


def test_quiet_prints_nothing_and_json_logs_are_one_object_per_line(tmp_path, key_path, capsys):
    src = _events(tmp_path, 20)
    assert (
        main(
            [
                *UNK,
                "-T",
                "20",
                "--key-file",
                key_path,
                "-i",
                src,
                "-o",
                str(tmp_path / "q.jsonl"),
                *own_ledger(tmp_path / "q.jsonl"),
                "-q",
            ]
        )
        == 0
    )
    assert capsys.readouterr().err == ""
    assert (
        main(
            [
                *UNK,
                "-T",
                "20",
                "--key-file",
                key_path,
                "-i",
                src,
                "-o",
                str(tmp_path / "j.jsonl"),
                *own_ledger(tmp_path / "j.jsonl"),
                "--log-format",
                "json",
                "--progress-every",
                "1e-9",
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert {x["logger"] for x in lines} == {"dpstream.run"}
    progress = [x for x in lines if "eta_s" in x]
    assert progress and progress[-1]["step"] == 20 and progress[-1]["events"] == 20
    summary = lines[-1]
    assert summary["steps"] == 20 and summary["events"] == 20 and summary["skipped"] == 0
    assert summary["privacy"]["unit"] == "event" and summary["level"] == "info"


def test_a_full_disk_under_the_output_is_a_plain_error(tmp_path, key_path, capsys):
    src = _events(tmp_path, 5)
    rc = main([*UNK, "-T", "5", "--key-file", key_path, "-i", src, "-o", "/dev/full", "--force"])
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


# -- time-based steps ------------------------------------------------------------------

TIMED = [
    ("2026-03-01T00:10:00Z", ["a"]),
    ("2026-03-01T00:40:00+00:00", ["a", "b"]),
    (1772326800 + 2 * 3600 + 300, ["b"]),  # epoch seconds: 03:05 UTC, step 4
    ("2026-03-01 05:59:59", ["c"]),
]  # no zone: UTC, step 6


def _timed_input(tmp_path):
    src = tmp_path / "timed.jsonl"
    src.write_text("".join(json.dumps({"ts": ts, "items": items}) + "\n" for ts, items in TIMED))
    (tmp_path / "dom.txt").write_text("a\nb\nc\n")
    return str(src)


def test_timestamps_map_to_hourly_steps_and_quiet_hours_are_released(tmp_path, key_path):
    from dpstream.clock import parse_timestamp
    from dpstream.mechanisms.known import KnownDomainHistogram

    assert parse_timestamp(1772326800).isoformat() == "2026-03-01T01:00:00+00:00"
    src = _timed_input(tmp_path)
    out = tmp_path / "o.jsonl"
    assert (
        main(
            [
                "run",
                "-q",
                "-T",
                "8",
                "--domain",
                str(tmp_path / "dom.txt"),
                "--max-items",
                "2",
                "--rho",
                "1",
                "--key-file",
                key_path,
                "-i",
                src,
                "-o",
                str(out),
                "--time-field",
                "ts",
                "--step",
                "1h",
                "--start",
                "2026-03-01T00:00:00Z",
                "--no-round",
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["t"] for x in lines] == list(range(1, 9))  # hours 2, 3, 5, 7, 8 are quiet
    from dpstream.run.settings import scoped_stream

    stream = scoped_stream(
        {
            "stream": "default",
            "input": src,
            "time_field": "ts",
            "step": "1h",
            "start": "2026-03-01T00:00:00Z",
        }
    )
    mech = KnownDomainHistogram(
        ["a", "b", "c"],
        8,
        max_items=2,
        key=fixed_key("ops"),
        rho=1.0,
        stream=stream,
        noise_version=2,
    )  # run's, for a new stream
    steps = {1: [["a"], ["a", "b"]], 4: [["b"]], 6: [["c"]]}
    for t, line in enumerate(lines, 1):
        want = mech.step_batch(steps.get(t, [])).counts
        assert line["released"] == {k: max(v, 0.0) for k, v in want.items()}  # --clamp


def test_timestamp_problems_are_invalid_records(tmp_path, key_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        '{"ts": "2026-02-28T23:59:00Z", "items": ["a"]}\n'  # before --start
        '{"items": ["a"]}\n'  # no timestamp
        '{"ts": "yesterday", "items": ["a"]}\n'
        '["a"]\n'
    )
    base = [
        *UNK,
        "-T",
        "4",
        "--key-file",
        key_path,
        "-i",
        str(src),
        "--time-field",
        "ts",
        "--step",
        "1h",
        "--start",
        "2026-03-01T00:00:00Z",
    ]
    assert main([*base, "-o", str(tmp_path / "o.jsonl"), "--max-invalid", "1"]) == 0
    err = capsys.readouterr().err
    assert "4 skipped" in err
    assert main([*base, "-o", str(tmp_path / "o2.jsonl"), "--on-invalid", "error"]) == 1
    assert "input line 1: its timestamp is before --start" in capsys.readouterr().err
    assert (
        main(
            [
                *UNK,
                "-T",
                "4",
                "--key-file",
                key_path,
                "-i",
                str(src),
                "--time-field",
                "ts",
                "-o",
                str(tmp_path / "o3.jsonl"),
            ]
        )
        == 1
    )
    assert "go together" in capsys.readouterr().err
    assert main([*base[:-2], "--start", "noon", "-o", str(tmp_path / "o4.jsonl")]) == 1
    assert "--start" in capsys.readouterr().err


def test_follow_releases_steps_on_the_clock_and_late_events_stay_late(
    tmp_path, key_path, monkeypatch, capsys
):
    """--follow: steps close on the clock (quiet ones too); an event for a released
    step is late; a later run with the state replays the steps where they closed.

    The follower's wall clock is driven by the test, in step with what the follower
    has read, so the outcome never depends on how fast this machine runs: the clock
    stands at 2.5 s (steps 1 and 2 due) until the follower has taken in the two
    events appended after step 2 was released, then jumps past the horizon."""
    import datetime as dt
    import threading
    import time

    import dpstream.run.follow as run_follow

    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    at = lambda s: (start + dt.timedelta(seconds=s)).isoformat()  # noqa: E731
    src = tmp_path / "live.jsonl"
    src.write_text(
        json.dumps({"ts": at(0.2), "items": ["a"]})
        + "\n"
        + json.dumps({"ts": at(1.5), "items": ["b"]})
        + "\n"
    )
    out, state = tmp_path / "o.jsonl", tmp_path / "s.sqlite"
    cmd = [
        *UNK,
        "-T",
        "10",
        "--key-file",
        key_path,
        "-i",
        str(src),
        "-o",
        str(out),
        "--state",
        str(state),
        "--time-field",
        "ts",
        "--step",
        "1s",
        "--start",
        start.isoformat(),
        "--follow",
        "--no-round",
        "--progress-every",
        "1000",
    ]

    noted = [0]  # records the run loop has taken in
    give_up = time.monotonic() + 60  # a broken follower fails the asserts, never hangs

    def fake_now() -> dt.datetime:
        if noted[0] >= 4 or time.monotonic() > give_up:
            return start + dt.timedelta(seconds=20)
        return start + dt.timedelta(seconds=2.5)

    monkeypatch.setattr(run_follow, "_utcnow", fake_now)
    _count_taken(monkeypatch, noted)

    def append_when_two_steps_are_out() -> None:
        while time.monotonic() < give_up:
            if out.exists() and out.read_text().count("\n") >= 2:
                break
            time.sleep(0.02)
        with open(src, "a") as fh:  # a late event (step 1) and one for step 5, not yet due
            fh.write(
                json.dumps({"ts": at(0.5), "items": ["a"]})
                + "\n"
                + json.dumps({"ts": at(4.5), "items": ["c"]})
                + "\n"
            )

    appender = threading.Thread(target=append_when_two_steps_are_out, daemon=True)
    appender.start()
    assert main([*cmd, "--until", "6"]) == 0
    appender.join(timeout=5)
    err = capsys.readouterr().err
    assert "1 skipped" in err and "late" in err, err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["t"] for x in lines] == [1, 2, 3, 4, 5, 6]  # 3, 4 and 6 are quiet
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    mech = UnknownDomainHistogram(
        10, max_items=2, key=fixed_key("ops"), rho=1.0, threshold_delta=1e-3, noise_version=2
    )
    steps = {1: [["a"]], 2: [["b"]], 5: [["c"]]}
    for t, line in enumerate(lines, 1):
        want = mech.step_batch(steps.get(t, [])).counts
        assert line["released"] == {k: max(v, 0.0) for k, v in want.items()}  # --clamp
    # a later run replays steps 1..6 where they closed (the late event stays late), then
    # releases 7 and 8, due on the clock
    assert main([*cmd, "--until", "8"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["t"] for x in lines] == list(range(1, 9))


def test_a_key_file_others_can_read_is_refused_unless_allowed(tmp_path, key_path, capsys):
    import os

    src = _events(tmp_path, 3)
    os.chmod(key_path, 0o640)
    args = [*UNK, "-T", "3", "--key-file", key_path, "-i", src]
    assert main([*args, "-o", str(tmp_path / "a.jsonl")]) == 1
    assert "chmod 600" in capsys.readouterr().err
    assert not (tmp_path / "a.jsonl").exists()  # refused before anything was written
    with pytest.warns(UserWarning, match="chmod 600"):
        assert main([*args, "-o", str(tmp_path / "b.jsonl"), "--allow-readable-key"]) == 0


def test_follow_reads_a_backlog_to_its_end_before_it_releases(tmp_path, key_path):
    """A due step used to close as soon as an event of a later step was read, so one
    event put first in a backlog made the events after it late: its presence changed
    other events' counts. The backlog is now read to its end: the same events in time
    order and with a step-3 event first give the same bytes, and none is late."""
    import datetime as dt
    import os
    import subprocess
    import sys
    from pathlib import Path

    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)  # long past: every step is due
    at = lambda s: (start + dt.timedelta(seconds=s)).isoformat()  # noqa: E731
    ordered = [json.dumps({"ts": at(0.1 + k / 50), "items": ["a"]}) for k in range(40)]
    ordered += [
        json.dumps({"ts": at(1.5), "items": ["b"]}),
        json.dumps({"ts": at(2.5), "items": ["c"]}),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    outs = []
    for name, lines in (("ordered", ordered), ("early", [ordered[-1], *ordered[:-1]])):
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        src.write_text("".join(line + "\n" for line in lines))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dpstream",
                *UNK,
                "-T",
                "10",
                "--key-file",
                key_path,
                "-i",
                str(src),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(tmp_path / f"{name}.sqlite"),
                "--time-field",
                "ts",
                "--step",
                "1s",
                "--start",
                start.isoformat(),
                "--follow",
                "--no-round",
                "--until",
                "3",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "late" not in done.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert [json.loads(x)["t"] for x in outs[0].splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("rotate", ["copytruncate", "move"])
def test_follow_stops_when_its_input_is_rotated(tmp_path, key_path, monkeypatch, capsys, rotate):
    """A followed file truncated (copytruncate) or moved and made again (logrotate's
    default) stops the run with one line: it used to go on and release every later step
    without the events written after the rotation."""
    import datetime as dt
    import os
    import threading
    import time

    import dpstream.run.follow as run_follow

    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    at = lambda s: (start + dt.timedelta(seconds=s)).isoformat()  # noqa: E731
    src = tmp_path / "live.jsonl"
    src.write_text("".join(json.dumps({"ts": at(s), "items": ["a"]}) + "\n" for s in (0.2, 1.5)))
    out = tmp_path / "o.jsonl"
    cmd = [*UNK, "-T", "10", "--key-file", key_path, "-i", str(src), "-o", str(out),
           "--state", str(tmp_path / "s.sqlite"), "--time-field", "ts", "--step", "1s",
           "--start", start.isoformat(), "--follow", "--progress-every", "1000"]  # fmt: skip
    give_up = time.monotonic() + 60  # a follower that misses the rotation ends, never hangs
    # the clock stands at 2.5 s (steps 1 and 2 due) until the test gives up
    monkeypatch.setattr(
        run_follow,
        "_utcnow",
        lambda: start + dt.timedelta(seconds=20 if time.monotonic() > give_up else 2.5),
    )

    def rotate_when_two_steps_are_out() -> None:
        while time.monotonic() < give_up:
            if out.exists() and out.read_text().count("\n") >= 2:
                break
            time.sleep(0.02)
        if rotate == "move":
            os.replace(src, tmp_path / "live.jsonl.1")
        with open(src, "w") as fh:  # truncated, or a new file, with one later event
            fh.write(json.dumps({"ts": at(3.5), "items": ["b"]}) + "\n")

    rotator = threading.Thread(target=rotate_when_two_steps_are_out, daemon=True)
    rotator.start()
    assert main(cmd) == 1
    rotator.join(timeout=5)
    err = capsys.readouterr().err
    how = "truncated" if rotate == "copytruncate" else "moved or replaced"
    assert f"was {how} while it was followed" in err, err
    assert [json.loads(x)["t"] for x in out.read_text().splitlines()] == [1, 2]


def test_follow_on_stdin_counts_a_last_line_without_its_newline(tmp_path, key_path, monkeypatch):
    """Review 78: `--follow -i -` dropped a last line with no newline at the end of its
    input (a batch run counts it): it is a record too.

    Steps already due when a run starts count nothing from a pipe (a pipe cannot tell
    when its bytes came), so the follower's clock is driven by the test: no step is due
    until the follower has taken both records, then both are."""
    import datetime as dt
    import io
    import os
    import time

    import dpstream.run.follow as run_follow

    (tmp_path / "dom.txt").write_text("a\nb\n")
    events = b'{"ts":"2026-03-01T00:10Z","items":["a"]}\n{"ts":"2026-03-01T00:20Z","items":["b"]}'
    out = tmp_path / "out.jsonl"
    argv = [
        "run", "-m", "known", "--domain",
        str(tmp_path / "dom.txt"), "--max-items", "1", "--rho", "1e6", "--key-file",
        str(key_path), "--time-field", "ts", "--start", "2026-03-01T00:00Z", "--step", "1h",
        "--horizon", "2", "--follow", "-i", "-", "-o", str(out), "--progress-every", "1000",
        "--state", str(tmp_path / "s.sqlite"), *own_ledger(out),
    ]  # fmt: skip
    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    noted = [0]  # records the run loop has taken in
    give_up = time.monotonic() + 60  # a broken follower fails the assert, never hangs
    monkeypatch.setattr(
        run_follow,
        "_utcnow",
        lambda: (
            start + dt.timedelta(hours=3 if noted[0] >= 2 or time.monotonic() > give_up else 0.5)
        ),
    )
    _count_taken(monkeypatch, noted)
    rfd, wfd = os.pipe()
    os.write(wfd, events)
    os.close(wfd)  # stdin ends after a last line without its newline
    with open(rfd, "rb") as stdin_bytes:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stdin_bytes))
        assert main(argv) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert {k: round(v) for k, v in first["released"].items()} == {"a": 1, "b": 1}


def test_records_after_until_are_reported_as_not_kept(tmp_path, key_path, capsys):
    """Review 78: a daily run read records of steps after its --until and dropped them,
    while the docs said they were left for a later run (nothing keeps them). The run
    now warns, with --quiet too, that it neither counted nor kept them."""
    (tmp_path / "dom.txt").write_text("a\nh\n")
    day = tmp_path / "day1.jsonl"
    day.write_text('{"t": 1, "items": ["a"]}\n{"t": 3, "items": ["h"]}\n')
    out = tmp_path / "out.jsonl"
    argv = [
        "run", "--quiet", "-m", "known", "--domain", str(tmp_path / "dom.txt"),
        "--max-items", "1", "--rho", "1", "--key-file", str(key_path), "-i", str(day),
        "-o", str(out), "--state", str(tmp_path / "s.sqlite"), "-T", "4", "--until", "2",
        *own_ledger(out),
    ]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 records are for steps after --until 2" in err and "keeps none of them" in err


def test_until_without_a_state_warns_that_the_stream_cannot_go_on(tmp_path, key_path, capsys):
    """Review 83: `--until` below the horizon without `--state` ran silently, and the
    next day's run was refused with nothing to go on from."""
    src = _events(tmp_path, 5)
    out = tmp_path / "o.jsonl"
    assert main([*UNK, "-T", "5", "--key-file", key_path, "-i", src, "-o", str(out),
                 "--until", "3"]) == 0  # fmt: skip
    assert "--until 3 without --state" in capsys.readouterr().err
    assert main([*UNK, "-T", "5", "--key-file", key_path, "-i", src, "-o",
                 str(tmp_path / "p.jsonl"), "--stream", "whole"]) == 0  # fmt: skip
    assert "without --state" not in capsys.readouterr().err


def test_a_later_batchs_summary_names_its_own_steps(tmp_path, key_path, capsys):
    """Review 83: a later batch's summary read "3 steps (t = 1..5 ...)"."""
    day1, day2 = tmp_path / "day1.jsonl", tmp_path / "day2.jsonl"
    day1.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2)))
    day2.write_text("".join(json.dumps({"t": t, "items": ["b"]}) + "\n" for t in (3, 4, 5)))
    argv = [*UNK, "-T", "5", "--key-file", key_path, "-o", str(tmp_path / "o.jsonl"),
            "--state", str(tmp_path / "s.sqlite")]  # fmt: skip
    assert main([*argv, "-i", str(day1), "--until", "2"]) == 0
    assert "2 steps (t = 1..2 of T = 5)" in capsys.readouterr().err
    assert main([*argv, "-i", str(day2), "--until", "5"]) == 0
    assert "3 steps (t = 3..5 of T = 5)" in capsys.readouterr().err
