"""`dpstream run/plan --user-field`: user-level runs, bad input, crash/resume, daily runs."""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

import dpstream as dps
from dpstream.cli import main
from dpstream.run.settings import scoped_stream

from .conftest import fixed_key, own_ledger

SRC = str(Path(__file__).resolve().parents[1] / "src")
T = 240
DAYS, PER_DAY = 6, 40
WORDS = [f"w{i}" for i in range(30)]
USER = ["--user-field", "user", "--max-items-per-user", "3", "--max-count-per-item", "2"]
#: The noise scope of a run with --user-field user (the field is an input setting: another
#: field bounds other contributions, so it draws other noise).
STREAM = scoped_stream({"stream": "default", "user_field": "user"})


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """A stream with heavy users (Zipf over users): many contributions are dropped."""
    base = tmp_path_factory.mktemp("users")
    key_path = base / "k.key"
    fixed_key("users").save(key_path)
    (base / "domain.txt").write_text("\n".join(WORDS) + "\n")
    rng = np.random.default_rng(23)  # simulated input data
    lines, days = [], {d: [] for d in range(1, DAYS + 1)}
    for t in range(1, T + 1):
        for _ in range(int(rng.integers(0, 4))):
            user = f"user{min(int(rng.zipf(1.6)), 50)}"
            items = rng.choice(WORDS, size=int(rng.integers(1, 3)), replace=False).tolist()
            line = json.dumps({"t": t, "user": user, "items": items}) + "\n"
            lines.append(line)
            days[(t - 1) // PER_DAY + 1].append(line)
    (base / "ev.jsonl").write_text("".join(lines))
    for d, day in days.items():
        (base / f"day{d}.jsonl").write_text("".join(day))
    return base, key_path


def _steps(path):
    by_t: dict[int, list] = {}
    for line in Path(path).read_text().splitlines():
        ev = json.loads(line)
        by_t.setdefault(ev["t"], []).append((ev["user"], ev["items"]))
    return by_t


def test_a_user_level_run_equals_the_library_and_states_its_unit(stream, tmp_path):
    base, key_path = stream
    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "run",
                "-q",
                "-T",
                str(T),
                "--domain",
                str(base / "domain.txt"),
                *USER,
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--key-file",
                str(key_path),
                "-i",
                str(base / "ev.jsonl"),
                "-o",
                str(out),
                "--no-round",
                "--no-clamp",
                "--counter",
                "tree",
            ]
        )
        == 0
    )
    mech = dps.KnownDomainHistogram(
        WORDS,
        T,
        key=dps.NoiseKey.load(key_path),
        epsilon=1,
        delta=1e-6,
        max_items_per_user=3,
        max_count_per_item=2,
        counter="tree",
        stream=STREAM,
        noise_version=2,
    )  # what run draws for a new stream
    assert STREAM != "default"
    by_t = _steps(base / "ev.jsonl")
    lines = out.read_text().splitlines()
    assert len(lines) == T
    for t, line in enumerate(lines, 1):
        rel = mech.step_batch(by_t.get(t, []))
        assert json.loads(line)["released"] == dict(
            zip(rel.items, rel.values.tolist(), strict=True)
        )
    # the heavy users were bounded: the true final counts are far below the raw ones
    raw = sum(len(items) for evs in by_t.values() for _, items in evs)
    assert int(mech.counts.sum()) < raw / 2
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert meta["unit"] == meta["privacy"]["unit"] == "user"
    assert meta["max_items_per_user"] == 3 and meta["max_count_per_item"] == 2


def test_event_and_user_level_releases_differ(stream, tmp_path):
    """Not a silent event-level run: the same input per event releases other counts."""
    base, key_path = stream
    common = [
        "run",
        "-q",
        "-T",
        str(T),
        "--domain",
        str(base / "domain.txt"),
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--key-file",
        str(key_path),
        "-i",
        str(base / "ev.jsonl"),
        "--counter",
        "tree",
    ]
    assert (
        main([*common, *USER, "-o", str(tmp_path / "u.jsonl"), *own_ledger(tmp_path / "u.jsonl")])
        == 0
    )
    assert (
        main(
            [
                *common,
                "--max-items",
                "3",
                "-o",
                str(tmp_path / "e.jsonl"),
                *own_ledger(tmp_path / "e.jsonl"),
            ]
        )
        == 0
    )
    assert (tmp_path / "u.jsonl").read_bytes() != (tmp_path / "e.jsonl").read_bytes()


def test_plan_states_the_user_unit(capsys):
    assert (
        main(
            [
                "plan",
                "-T",
                "100",
                "--domain-size",
                "10",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--user-field",
                "user",
                "--max-items-per-user",
                "4",
                "--max-count-per-item",
                "2",
                "--json",
            ]
        )
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    assert info["unit"] == info["privacy"]["unit"] == "user"
    # tau grows with sqrt(L0) Linf against the event level with Delta0 = 1
    assert (
        main(
            [
                "plan",
                "-T",
                "100",
                "--domain-size",
                "10",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--max-items",
                "1",
                "--json",
            ]
        )
        == 0
    )
    event = json.loads(capsys.readouterr().out)
    assert event["unit"] == "event"
    assert info["tau"] == pytest.approx(event["tau"] * 2 * 2, rel=1e-9)
    assert (
        main(
            [
                "plan",
                "-T",
                "100",
                "--domain-size",
                "10",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--user-field",
                "user",
                "--max-items-per-user",
                "4",
                "--max-count-per-item",
                "2",
            ]
        )
        == 0
    )
    assert "per user" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--max-items-per-user", "3", "--max-count-per-item", "2"], "need --user-field"),
        (["--user-field", "user", "--max-items-per-user", "3"], "--max-count-per-item"),
        (["--user-field", "user"], "needs --max-items-per-user"),
        (
            [
                "--user-field",
                "user",
                "--max-items-per-user",
                "3",
                "--max-count-per-item",
                "2",
                "-m",
                "meta",
                "--oneshot",
                "gaussian",
            ],
            "does not apply to --mechanism meta",
        ),
    ],
)
def test_user_options_go_together(stream, tmp_path, capsys, argv, message):
    base, key_path = stream
    out = tmp_path / "o.jsonl"
    code = main(
        [
            "run",
            "-q",
            "-T",
            str(T),
            "--domain",
            str(base / "domain.txt"),
            "--rho",
            "1",
            "--key-file",
            str(key_path),
            "-i",
            str(base / "ev.jsonl"),
            "-o",
            str(out),
            *argv,
        ]
    )
    assert code == 2  # a usage error
    assert message in capsys.readouterr().err
    assert not out.exists() or out.read_bytes() == b""


BAD = [
    '{"t": 1, "items": ["w1"]}',  # no user
    '{"t": 1, "user": 7, "items": ["w1"]}',  # not a string
    '{"t": 2, "user": "", "items": ["w1"]}',  # empty
    '{"t": 2, "user": ["a"], "items": ["w2"]}',  # a list
    '{"t": 2, "user": null, "items": ["w2"]}',
]


def test_bad_user_ids_are_invalid_records(stream, tmp_path, capsys):
    base, key_path = stream
    src = tmp_path / "bad.jsonl"
    good = ['{"t": 1, "user": "a", "items": ["w1"]}', '{"t": 2, "user": "b", "items": ["w2"]}']
    src.write_text("\n".join(good[:1] + BAD + good[1:]) + "\n")
    run = [
        "run",
        "-T",
        "3",
        "--domain",
        str(base / "domain.txt"),
        *USER,
        "--rho",
        "1",
        "--key-file",
        str(key_path),
        "--no-round",
    ]
    common = [*run, "-i", str(src), "--log-format", "json"]
    out = tmp_path / "skip.jsonl"
    assert main([*common, "-o", str(out), *own_ledger(out), "--max-invalid", "1"]) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert summary["skipped"] == len(BAD)
    assert summary["skipped_by_reason"] == {"user id": len(BAD)}
    # skipping them is exactly the run without them
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(good) + "\n")
    ref = tmp_path / "ref.jsonl"
    assert main([*run, "-i", str(clean), "-o", str(ref), *own_ledger(ref), "-q"]) == 0
    assert out.read_bytes() == ref.read_bytes()
    # --on-invalid error: a clear message naming the field, no content quoted
    assert (
        main(
            [
                *common,
                "-o",
                str(tmp_path / "err.jsonl"),
                *own_ledger(tmp_path / "err.jsonl"),
                "--on-invalid",
                "error",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "input line 2" in err and "user id" in err and "--user-field" in err
    # with --implicit-time a plain array is an event, but it has no user id
    from dpstream.io import read_jsonl

    (rec,) = read_jsonl(['["w1", "w2"]'], implicit=True, user_field="user")
    assert rec.items is None and "user id" in rec.error


def test_csv_user_column(stream, tmp_path, capsys):
    base, key_path = stream
    src = tmp_path / "ev.csv"
    with open(src, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t", "event", "user", "item"])
        w.writerows(
            [
                [1, "e1", "a", "w1"],
                [1, "e1", "a", "w2"],
                [1, "e2", "b", "w1"],
                [2, "e3", "a", "w3"],
                [2, "e3", "c", "w4"],  # user c's own event e3 (not a's)
                [2, "e4", "", "w5"],  # empty user
                [3, "e5", "a", "w4"],
                [3, "e5", "a", "w5"],
                [3, "e6", "a", "w1"],
            ]
        )
    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "run",
                "-T",
                "3",
                "--domain",
                str(base / "domain.txt"),
                *USER,
                "--rho",
                "1",
                "--key-file",
                str(key_path),
                "-i",
                str(src),
                "--time-column",
                "t",
                "--no-round",
                "--no-clamp",
                "-o",
                str(out),
                "--log-format",
                "json",
                "--counter",
                "tree",
                "--max-invalid",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert summary["skipped_by_reason"] == {"user id": 1}  # the row with no user id
    stream_name = scoped_stream(
        {
            "stream": "default",
            "user_field": "user",
            "input": str(src),
            "time_column": "t",
            "item_column": "item",
            "event_column": "event",
        }
    )
    mech = dps.KnownDomainHistogram(
        WORDS,
        3,
        key=dps.NoiseKey.load(key_path),
        rho=1,
        max_items_per_user=3,
        max_count_per_item=2,
        counter="tree",
        stream=stream_name,
        noise_version=2,
    )
    steps = [
        [("a", ["w1", "w2"]), ("b", ["w1"])],
        [("a", ["w3"]), ("c", ["w4"])],
        [("a", ["w4", "w5"]), ("a", ["w1"])],
    ]
    for line, events in zip(out.read_text().splitlines(), steps, strict=True):
        rel = mech.step_batch(events)
        assert json.loads(line)["released"] == dict(
            zip(rel.items, rel.values.tolist(), strict=True)
        )
    assert mech.counts[WORDS.index("w4")] == 1  # c's; a's w4 is a's 4th item
    assert mech.counts[WORDS.index("w5")] == 0  # a's 5th item: past --max-items-per-user 3


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if out.read_bytes().count(b"\n") >= lines:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


@pytest.mark.parametrize("mech", ["known", "unknown"])
def test_kill_and_resume_with_user_bounds_is_byte_identical(stream, tmp_path, mech):
    base, key_path = stream
    extra = (
        ["--domain", str(base / "domain.txt")] if mech == "known" else ["--threshold-delta", "1e-4"]
    )
    args = [
        "run",
        "--quiet",
        "-m",
        mech,
        "-T",
        str(T),
        *extra,
        *USER,
        "--rho",
        "2",
        "--key-file",
        str(key_path),
        "-i",
        str(base / "ev.jsonl"),
        "--counter",
        "tree",
    ]
    if mech == "unknown":
        args.remove("--counter")
        args.remove("tree")
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-o", str(ref), *own_ledger(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [*args, "-o", str(out), *own_ledger(out), "--state", str(state), "--no-fsync"]
    assert _kill_after(_spawn(cmd), out, T // 3), "the run ended before it was killed"
    with closing(sqlite3.connect(state)) as db:
        assert db.execute("SELECT MAX(t) FROM steps").fetchone()[0] < T
    proc = _spawn(cmd)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert out.read_bytes() == ref.read_bytes()


def test_resume_refuses_an_input_whose_user_ids_changed(stream, tmp_path, capsys):
    """The step digests cover the user ids: another user for a written event is refused."""
    base, key_path = stream
    lines = (base / "ev.jsonl").read_text().splitlines()
    src = tmp_path / "ev.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    cmd = [
        "run",
        "-q",
        "-T",
        str(T),
        "--domain",
        str(base / "domain.txt"),
        *USER,
        "--rho",
        "1",
        "--key-file",
        str(key_path),
        "-i",
        str(src),
        "-o",
        str(out),
        "--state",
        str(state),
        "--no-fsync",
    ]
    assert _kill_after(_spawn(cmd), out, T // 2), "the run ended before it was killed"
    first = json.loads(lines[0])
    first["user"] = "somebody-else"  # same items, same step: only the user differs
    src.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    before = out.read_bytes()
    assert main(cmd) == 1
    assert "input changed" in capsys.readouterr().err
    assert out.read_bytes() == before


@pytest.mark.parametrize("mech", ["known", "unknown", "top-k"])
def test_daily_runs_carry_the_bounds_over_days(stream, tmp_path, mech):
    """Fed a day at a time (each run brings that day only), the releases equal one run:
    a heavy user's budget spent on day 1 stays spent on day 6 (the bounder is in the
    snapshot)."""
    base, key_path = stream
    extra = {
        "known": ["--domain", str(base / "domain.txt"), "--counter", "tree"],
        "unknown": ["--threshold-delta", "1e-4", "--remember"],
        "top-k": [
            "--domain",
            str(base / "domain.txt"),
            "--k",
            "3",
            "--switches",
            "4",
            "--counter",
            "blt",
            "--eta",
            "0",
        ],
    }[mech]
    # budgets at which items get shown (top-k waits until a count clears its noise)
    budget = {"unknown": ["--tau", "0.2"], "top-k": ["--rho", "200"]}.get(mech, ["--rho", "2"])
    args = [
        "run",
        "-q",
        "-m",
        mech,
        "-T",
        str(T),
        *extra,
        *USER,
        *budget,
        "--key-file",
        str(key_path),
        "--no-fsync",
    ]
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "ev.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    assert json.loads(ref.read_text().splitlines()[-1])["released"]  # not vacuous
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    for d in range(1, DAYS + 1):
        until = [] if d == DAYS else ["--until", str(d * PER_DAY)]
        assert (
            main(
                [
                    *args,
                    "-i",
                    str(base / f"day{d}.jsonl"),
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
    assert out.read_bytes() == ref.read_bytes()
    # and the bounds did bind across days: without carrying the bounder over, day 6 alone
    # would keep more of the heavy users' events than the whole-stream run does
    by_t = _steps(base / "ev.jsonl")
    heavy = [u for evs in by_t.values() for u, _ in evs]
    assert heavy.count("user1") > 3 * 2  # user1 is over its bounds in the whole stream


def test_a_user_field_that_is_the_time_item_or_event_column_is_refused(stream, tmp_path, capsys):
    """Review 89: --user-field naming the CSV input's event column (or JSON Lines' time
    field) was taken: every event its own "user", so one person counted three times
    under a per-user bound of one, with the metadata saying unit: user. Parquet already
    refused it; CSV and JSON Lines refuse it now, before anything is written."""
    base, key_path = stream
    csv = tmp_path / "in.csv"
    csv.write_text("t,event,item,user\n1,e1,w1,alice\n1,e2,w1,alice\n2,e3,w1,alice\n")
    stamped = tmp_path / "in.jsonl"
    stamped.write_text('{"ts": "2026-03-01T01:00Z", "items": ["w1"], "u": "alice"}\n')
    clock = ["--time-field", "ts", "--step", "1d", "--start", "2026-03-01T00:00Z"]
    cases = [
        (csv, ["--time-column", "t", "--user-field", "event"], 1, "is also the CSV input's"),
        (csv, ["--time-column", "t", "--user-field", "item"], 1, "is also the CSV input's"),
        (csv, ["--time-column", "t", "--user-field", "t"], 2, "is also --time-column"),
        (stamped, [*clock, "--user-field", "ts"], 2, "is also --time-field"),
    ]
    bounds = ["--max-items-per-user", "1", "--max-count-per-item", "1"]
    for src, argv, code, message in cases:
        out = tmp_path / "o.jsonl"
        argv = ["-i", str(src), "-o", str(out), *argv, *bounds, "--key-file", str(key_path)]
        common = ["run", "-q", "-T", str(T), "--domain", str(base / "domain.txt"), "--rho", "1"]
        assert main([*common, *argv]) == code, argv
        assert message in capsys.readouterr().err, argv
        assert not out.exists()
    # the CSV file with a user column of its own runs
    argv = ["--time-column", "t", "--user-field", "user", *bounds, "--key-file", str(key_path)]
    out = tmp_path / "ok.jsonl"
    assert main([*common, "-i", str(csv), "-o", str(out), *argv]) == 0
