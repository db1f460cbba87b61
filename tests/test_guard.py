"""A typo must not spend the budget silently (issue #27, defect 6).

The operator's guard (``--max-invalid``): a batch run whose input is mostly invalid
writes nothing (no release, no sidecar, the state as it was) and says why, per cause.
The clock: ``M`` is refused, calendar months (``mo``) and weeks (``w``) map events to
the steps a brute-force walk over ``datetime`` gives, ``--end`` gives T, the sidecar
records the clock and the long outputs carry each step's start.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import random
import sqlite3
from contextlib import closing

import pytest

from dpstream.cli import main
from dpstream.clock import StepClock, parse_duration, parse_step

from .conftest import fixed_key, own_ledger

UTC = dt.timezone.utc
WORDS = ["a", "b", "c"]


@pytest.fixture
def setup(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("guard").save(key)
    domain = tmp_path / "domain.txt"
    domain.write_text("\n".join(WORDS) + "\n")
    return tmp_path, str(key), str(domain)


def _known(key, domain, *extra):
    # --tau tiny: the rounded releases are the exact running counts (a brute-force check)
    return [
        "run",
        "-m",
        "known",
        "--domain",
        domain,
        "--max-items",
        "3",
        "--tau",
        "1e-9",
        "--key-file",
        key,
        *extra,
    ]


def _write(path, events):
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


def _timed(n=3806, field="ts", seed=1):
    rng = random.Random(seed)
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return [
        {
            field: (start + dt.timedelta(seconds=rng.randrange(0, 35 * 86400))).isoformat(),
            "items": [rng.choice(WORDS)],
        }
        for _ in range(n)
    ]


def _nothing_written(tmp_path, out, state=None):
    assert not out.exists()
    assert not (tmp_path / (out.name + ".meta.json")).exists()
    if state is not None:  # not even an empty state file, or its journal
        assert not list(tmp_path.glob(state.name + "*"))


# --------------------------------------------------------------------------- the typos


def test_a_time_field_no_event_has_writes_nothing(setup, capsys):
    tmp_path, key, domain = setup
    src = _write(tmp_path / "ev.jsonl", _timed())
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    rc = main(
        _known(
            key,
            domain,
            "-i",
            src,
            "-o",
            str(out),
            "--state",
            str(state),
            "--time-field",
            "timestamp",
            "--start",
            "2026-01-01T00:00Z",
            "--step",
            "1h",
            "-T",
            "836",
        )
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "3,806 of 3,806 records (100%) lack the time field 'timestamp'" in err
    assert "Nothing was written" in err
    _nothing_written(tmp_path, out, state)


def test_step_capital_m_is_refused_and_writes_nothing(setup, capsys):
    tmp_path, key, domain = setup
    src = _write(tmp_path / "ev.jsonl", _timed())
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    rc = main(
        _known(
            key,
            domain,
            "-i",
            src,
            "-o",
            str(out),
            "--state",
            str(state),
            "--time-field",
            "ts",
            "--start",
            "2026-01-01T00:00Z",
            "--step",
            "1M",
            "-T",
            "12",
        )
    )
    err = capsys.readouterr().err
    assert rc == 1 and "ambiguous" in err and "1mo" in err and "1min" in err
    _nothing_written(tmp_path, out, state)


def test_steps_past_the_horizon_are_refused_naming_the_clock(setup, capsys):
    """``--step 1m`` meant as a month (minutes): every event is past the horizon."""
    tmp_path, key, domain = setup
    src = _write(tmp_path / "ev.jsonl", _timed(200))
    out = tmp_path / "out.csv"
    rc = main(
        _known(
            key,
            domain,
            "-i",
            src,
            "-o",
            str(out),
            "--time-field",
            "ts",
            "--start",
            "2026-01-01T00:00Z",
            "--step",
            "1m",
            "-T",
            "12",
        )
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert (
        "records (100%) are for steps past the horizon --horizon 12 (the clock ends at "
        "2026-01-01T00:12:00+00:00)" in err
    )
    _nothing_written(tmp_path, out)


def test_a_refused_day_leaves_the_state_and_outputs_as_they_were(setup, capsys):
    """A stream that goes on: day 2's input lost its time field upstream. The run is
    refused and the state, the output and the sidecar keep their bytes."""
    tmp_path, key, domain = setup
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    clock = ["--time-field", "ts", "--start", "2026-01-01T00:00Z", "--step", "1d", "-T", "4"]
    day1 = _write(
        tmp_path / "d1.jsonl",
        [{"ts": "2026-01-01T05:00Z", "items": ["a"]}, {"ts": "2026-01-02T05:00Z", "items": ["b"]}],
    )
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-i",
                day1,
                "-o",
                str(out),
                "--state",
                str(state),
                "--until",
                "2",
                *clock,
            )
        )
        == 0
    )
    # the state compared by its rows: a refused batch may have written and removed its
    # mark (it began), which leaves the rows, not every byte of the file, as they were
    files = (out, tmp_path / "out.jsonl.meta.json")
    before = {**{p: p.read_bytes() for p in files}, "state": _state_rows(state)}
    day2 = _write(
        tmp_path / "d2.jsonl",
        [{"time": "2026-01-03T05:00Z", "items": ["c"]}] * 30
        + [{"ts": "2026-01-03T06:00Z", "items": ["a"]}],
    )
    rc = main(
        _known(
            key,
            domain,
            "-q",
            "-i",
            day2,
            "-o",
            str(out),
            "--state",
            str(state),
            "--until",
            "4",
            *clock,
        )
    )
    assert rc == 1
    assert "30 of 31 records (96.8%) lack the time field 'ts'" in capsys.readouterr().err
    assert {**{p: p.read_bytes() for p in files}, "state": _state_rows(state)} == before


def test_a_clock_spelt_otherwise_by_a_later_day_is_refused(setup, capsys):
    """Review 87: ``--step 24h`` for ``1d`` (or another spelling of ``--start``) passed
    the state's check, which records the clock normalised, but the noise scope is built
    from the options' text: the later days drew their truncation under another key and
    the ledger counted the stream twice against its budget. The text is recorded now,
    and another spelling is refused, named; the same spelling goes on."""
    tmp_path, key, domain = setup
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    clock = ["--time-field", "ts", "--start", "2026-01-01T00:00Z", "--step", "1d", "-T", "4"]
    day1 = _write(tmp_path / "d1.jsonl", [{"ts": "2026-01-01T05:00Z", "items": ["a"]}])
    day2 = _write(tmp_path / "d2.jsonl", [{"ts": "2026-01-03T05:00Z", "items": ["b"]}])
    base = ["-q", "-o", str(out), "--state", str(state), "--on-invalid", "truncate"]
    assert main(_known(key, domain, *base, "-i", day1, "--until", "2", *clock)) == 0
    for old, new in (("1d", "24h"), ("2026-01-01T00:00Z", "2026-01-01T00:00:00+00:00")):
        respelt = [new if x == old else x for x in clock]
        capsys.readouterr()
        assert main(_known(key, domain, *base, "-i", day2, "--until", "4", *respelt)) == 1
        assert "how --start, --step or --lateness are written" in capsys.readouterr().err
    assert main(_known(key, domain, *base, "-i", day2, "--until", "4", *clock)) == 0


def test_a_batch_releasing_steps_whose_windows_are_open_warns(setup, capsys):
    """Review 87: a batch with a clock released steps whose windows had not ended, with
    no word; events that came for them later were late for the next batch. It now
    warns, naming the last step that has ended. (Steps half a day or more from their
    ends: the outcome does not hang on the wall clock's pace.)"""
    tmp_path, key, domain = setup
    start = (dt.datetime.now(UTC) - dt.timedelta(days=10, hours=12)).strftime("%Y-%m-%dT%H:00Z")
    day = _write(tmp_path / "d.jsonl", [{"ts": start, "items": ["a"]}])
    clock = ["--time-field", "ts", "--start", start, "--step", "1d", "-T", "40"]
    for until, warned in ((5, False), (11, True)):  # step 11: begun ~12 h ago, ends in ~12 h
        out = tmp_path / f"out{until}.jsonl"
        capsys.readouterr()
        state = ["--state", str(tmp_path / f"s{until}.sqlite"), *own_ledger(out)]
        assert main(_known(key, domain, "-i", day, "-o", str(out), *state, "--until",
                           str(until), *clock)) == 0  # fmt: skip
        err = capsys.readouterr().err
        assert ("windows of the last ones have not ended" in err) is warned, err
        if warned:
            assert "the last step that has ended is 10" in err
    # review 102: a step whose window has not begun (day 20, 9 days ahead; --until
    # 20260302, a date for a step number, began releasing 20 million empty hourly steps)
    out = tmp_path / "out20.jsonl"
    state = ["--state", str(tmp_path / "s20.sqlite"), *own_ledger(out)]
    assert main(_known(key, domain, "-i", day, "-o", str(out), *state, "--until", "20",
                       *clock)) == 1  # fmt: skip
    assert "--until 20 names a step whose window has not begun yet" in capsys.readouterr().err
    assert not out.exists()
    # review 104: on the Spark engine too (refused before a session starts)
    spark = ["--engine", "spark", "--master", "local[1]", "--until", "20", *clock]
    assert main(_known(key, domain, "-i", day, "-o", str(out), *spark, *own_ledger(out))) == 1
    assert "--until 20 names a step whose window has not begun yet" in capsys.readouterr().err
    assert not out.exists()


def _state_rows(path):
    """Every row of a state database, as SQL (its contents, not its pages)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path)) as db:
        return list(db.iterdump())


# --------------------------------------------------------------------------- --max-invalid


def _share_input(tmp_path, bad):
    """100 records, ``bad`` of them without a time step."""
    events = [{"t": 1 + i % 5, "items": ["a"]} for i in range(100 - bad)]
    events += [{"items": ["b"]}] * bad
    return _write(tmp_path / f"ev{bad}.jsonl", events)


@pytest.mark.parametrize("share", ["0.05", "5%", "1/20"])
def test_max_invalid_just_under_passes_just_over_refuses(setup, capsys, share):
    tmp_path, key, domain = setup
    ok = tmp_path / "ok.jsonl"
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-T",
                "5",
                "-i",
                _share_input(tmp_path, 5),
                "-o",
                str(ok),
                *own_ledger(ok),
                "--max-invalid",
                share,
            )
        )
        == 0
    )
    assert len(ok.read_text().splitlines()) == 5
    over = tmp_path / "over.jsonl"
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-T",
                "5",
                "-i",
                _share_input(tmp_path, 6),
                "-o",
                str(over),
                *own_ledger(over),
                "--max-invalid",
                share,
            )
        )
        == 1
    )
    assert "6 of 100 input records (6.0%) are invalid" in capsys.readouterr().err
    _nothing_written(tmp_path, over)


def test_the_default_is_five_percent_and_zero_refuses_any(setup, capsys):
    tmp_path, key, domain = setup
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-T",
                "5",
                "-i",
                _share_input(tmp_path, 5),
                "-o",
                str(tmp_path / "a.jsonl"),
            )
        )
        == 0
    )
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-T",
                "5",
                "-i",
                _share_input(tmp_path, 6),
                "-o",
                str(tmp_path / "b.jsonl"),
            )
        )
        == 1
    )
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-T",
                "5",
                "-i",
                _share_input(tmp_path, 1),
                "-o",
                str(tmp_path / "c.jsonl"),
                "--max-invalid",
                "0",
            )
        )
        == 1
    )
    capsys.readouterr()
    for bad in ("20", "-0.1", "1.5", "x"):  # a share, never a count
        with pytest.raises(SystemExit):
            main(_known(key, domain, "-T", "5", "--max-invalid", bad))
        assert "share" in capsys.readouterr().err


def _bad_mix(path):
    """Every kind of invalid record, and some good ones."""
    path.write_text(
        '{"t": 1, "items": ["a"]}\n'
        '{"t": 1, "items": ["a", "b", "c", "a"]}\n'
        '{"t": 2, "items": ["a", "zzz"]}\n'  # outside the domain
        '{"t": 2, "items": ["zzz", "a", "b", "c"]}\n'  # outside the domain and too big
        "not json\n"
        '{"t": 3, "items": ["b"]}\n'
        '{"t": 9, "items": ["b"]}\n'  # past the horizon
        '{"items": ["c"]}\n'  # no step
        '{"t": 2, "items": "a"}\n'  # malformed
        '{"t": 4, "items": ["c"]}\n'
    )
    return str(path)


@pytest.mark.parametrize("policy", ["skip", "truncate"])
@pytest.mark.parametrize("until", [None, "3"])
def test_the_guard_counts_what_the_run_skips(setup, capsys, policy, until):
    """The guard's count (before the first release) equals the summary's skipped count
    (after the last), for every kind of invalid record."""
    tmp_path, key, domain = setup
    src = _bad_mix(tmp_path / "bad.jsonl")
    base = [
        "run",
        "-m",
        "known",
        "--domain",
        domain,
        "--max-items",
        "2",
        "--rho",
        "1",
        "--key-file",
        key,
        "-T",
        "5",
        "-i",
        src,
        "--on-invalid",
        policy,
        "--log-format",
        "json",
        *(["--until", until] if until else []),
    ]
    assert main([*base, "-o", str(tmp_path / "a.jsonl"), "--max-invalid", "0"]) == 1
    refused = capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "b.jsonl"), "--max-invalid", "1"]) == 0
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    # step 4's event is for a later run (--until 3): skipped by this one, not invalid
    later = 1 if until else 0
    invalid, counted = summary["skipped"] - later, 10 - later
    pct = f"{100 * invalid / counted:.1f}%"
    assert f"{invalid} of {counted} input records ({pct}) are invalid" in refused
    assert invalid == {"skip": 7, "truncate": 4}[policy]
    if until:
        assert "1 more are for steps after --until 3" in refused


def test_implicit_time_lines_past_the_horizon_are_counted(setup, capsys):
    tmp_path, key, domain = setup
    src = tmp_path / "ev.jsonl"
    src.write_text('["a"]\n' * 10)
    out = tmp_path / "o.jsonl"
    assert (
        main(
            _known(key, domain, "-q", "-T", "4", "-i", str(src), "-o", str(out), "--implicit-time")
        )
        == 1
    )
    assert (
        "6 of 10 records (60.0%) are for steps past the horizon --horizon 4"
        in capsys.readouterr().err
    )
    _nothing_written(tmp_path, out)
    assert (
        main(
            _known(key, domain, "-q", "-T", "10", "-i", str(src), "-o", str(out), "--implicit-time")
        )
        == 0
    )


# --------------------------------------------------------------------------- the clock


def _brute_month_step(when, start, months):
    """The step of ``when``: walk the month boundaries one by one with datetime."""
    local = start
    t = 0
    while True:
        k = local.year * 12 + local.month - 1 + months
        nxt = local.replace(year=k // 12, month=k % 12 + 1)
        if when < nxt:
            return t + 1
        local, t = nxt, t + 1


def test_month_steps_match_a_brute_force_walk():
    rng = random.Random(7)
    for zone_h, day, months in ((0, 1, 1), (2, 15, 1), (-5, 28, 3), (5.5, 1, 12)):
        zone = dt.timezone(dt.timedelta(hours=zone_h))
        start = dt.datetime(2023, 11, day, 6, 30, tzinfo=zone)
        clock = StepClock.parse(start.isoformat(), f"{months}mo")
        assert clock.zone_text() == start.isoformat()[-6:]
        for _ in range(2000):
            when = start + dt.timedelta(seconds=rng.randrange(0, 6 * 366 * 86400))
            t = _brute_month_step(when, start, months)
            assert clock.step_of(when) == t
            assert clock.start_of(t) <= when < clock.end_of(t)
        # the boundaries themselves, and a second before them
        for t in range(1, 30):
            edge = clock.end_of(t)
            assert clock.step_of(edge) == t + 1
            assert clock.step_of(edge - dt.timedelta(seconds=1)) == t
            assert clock.due(edge) == t and clock.due(edge - dt.timedelta(seconds=1)) == t - 1
        assert clock.step_of(start - dt.timedelta(seconds=1)) == 0


def test_units_are_unambiguous():
    assert parse_duration("15min") == parse_duration("15m") == dt.timedelta(minutes=15)
    assert parse_duration("2h30min") == dt.timedelta(hours=2, minutes=30)
    assert parse_step("1w") == (dt.timedelta(weeks=1), 0)
    assert parse_step("3mo") == (dt.timedelta(0), 3)
    for bad in ("1M", "15M", "1h30M"):
        with pytest.raises(ValueError, match="1mo"):
            parse_step(bad)
    for bad in ("1mo2d", "1.5mo", "0mo"):
        with pytest.raises(ValueError, match="month"):
            parse_step(bad)
    with pytest.raises(ValueError, match="not a fixed duration"):
        parse_duration("1mo")  # a --lateness of months
    with pytest.raises(ValueError, match="day 1 to 28"):
        StepClock.parse("2026-01-31T00:00Z", "1mo")
    # the day is that of --start's own offset: midnight of the 1st in +01:00 is the 31st
    # in UTC, and is accepted
    clock = StepClock.parse("2026-01-01T00:00+01:00", "1mo")
    assert clock.end_of(1).isoformat() == "2026-01-31T23:00:00+00:00"


def _steps_of_output(path, n_steps):
    """The per-step counts of a known-domain run's releases (exact: --tau 1e-9)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["t"] for x in lines] == list(range(1, n_steps + 1))
    running = [[x["released"].get(w, 0) for w in WORDS] for x in lines]
    return [
        [c - p for c, p in zip(cur, prev, strict=True)]
        for cur, prev in zip(running, [[0, 0, 0], *running[:-1]], strict=True)
    ]


@pytest.mark.parametrize("step,months,weeks", [("1mo", 1, 0), ("1w", 0, 1)])
def test_month_and_week_steps_count_each_event_in_its_calendar_step(
    setup, capsys, step, months, weeks
):
    tmp_path, key, domain = setup
    zone = dt.timezone(dt.timedelta(hours=2))
    start = dt.datetime(2026, 1, 15, 6, 0, tzinfo=zone)
    rng = random.Random(3)
    events, true = [], [[0, 0, 0] for _ in range(12)]
    for _ in range(400):
        when = start + dt.timedelta(
            seconds=rng.randrange(0, 330 * 86400 if months else 12 * 7 * 86400)
        )
        if months:
            t = _brute_month_step(when, start, 1)
        else:
            t = (when - start) // dt.timedelta(weeks=1) + 1
        word = rng.randrange(3)
        true[t - 1][word] += 1
        events.append({"ts": when.astimezone(UTC).isoformat(), "items": [WORDS[word]]})
    src = _write(tmp_path / "ev.jsonl", events)
    out = tmp_path / "out.jsonl"
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-i",
                src,
                "-o",
                str(out),
                "--time-field",
                "ts",
                "--start",
                start.isoformat(),
                "--step",
                step,
                "-T",
                "12",
            )
        )
        == 0
    )
    assert _steps_of_output(out, 12) == true
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert meta["clock"] == {
        "start": "2026-01-15T06:00:00+02:00",
        "step": step,
        "time_zone": "+02:00",
        "end": ("2027-01-15T06:00:00+02:00" if months else "2026-04-09T06:00:00+02:00"),
        "lateness_seconds": 0.0,
    }


def test_end_gives_the_horizon(setup, capsys):
    tmp_path, key, domain = setup
    src = _write(tmp_path / "ev.jsonl", [{"ts": "2026-01-01T03:00Z", "items": ["a"]}])
    clock = ["--time-field", "ts", "--start", "2026-01-01T00:00Z"]
    for step, end, horizon in (
        ("1mo", "2027-01-01T00:00Z", 12),
        ("1d", "2026-04-01", 90),
        ("1w", "2026-01-29T00:00:00+00:00", 4),
        ("6h", "2026-01-02T07:00+01:00", 5),
    ):
        out = tmp_path / f"o{horizon}.jsonl"
        assert (
            main(
                _known(
                    key,
                    domain,
                    "-q",
                    "-i",
                    src,
                    "-o",
                    str(out),
                    *clock,
                    "--step",
                    step,
                    "--end",
                    end,
                )
            )
            == 0
        )
        assert len(out.read_text().splitlines()) == horizon
        assert json.loads((tmp_path / f"{out.name}.meta.json").read_text())["horizon"] == horizon
        # the same T given both ways is accepted; another is refused
        assert (
            main(
                _known(
                    key,
                    domain,
                    "-q",
                    "-i",
                    src,
                    "-o",
                    str(out),
                    *clock,
                    "--step",
                    step,
                    "--end",
                    end,
                    "-T",
                    str(horizon),
                    "--force",
                )
            )
            == 0
        )
        assert (
            main(
                _known(
                    key,
                    domain,
                    "-q",
                    "-i",
                    src,
                    "-o",
                    str(out),
                    *clock,
                    "--step",
                    step,
                    "--end",
                    end,
                    "-T",
                    str(horizon + 1),
                    "--force",
                )
            )
            == 1
        )
        assert f"--end gives T = {horizon}" in capsys.readouterr().err
    # an end between two step ends is refused, naming them
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-i",
                src,
                "-o",
                str(tmp_path / "x.jsonl"),
                *clock,
                "--step",
                "1mo",
                "--end",
                "2026-03-10",
            )
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "2026-03-01T00:00:00+00:00 (--horizon 2)" in err
    assert "2026-04-01T00:00:00+00:00 (--horizon 3)" in err
    # plan reads --end too
    assert (
        main(
            [
                "plan",
                "--json",
                "-m",
                "known",
                "--domain-size",
                "10",
                "--max-items",
                "1",
                "--rho",
                "1",
                "--start",
                "2026-01-01",
                "--step",
                "1mo",
                "--end",
                "2028-01-01",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["horizon"] == 24


# --------------------------------------------------------------------------- step_start


@pytest.mark.parametrize("fmt", ["csv", "jsonl-long", "parquet"])
def test_long_outputs_carry_each_steps_start_and_end(setup, fmt):
    tmp_path, key, domain = setup
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    events = [
        {"ts": "2026-01-10T00:00Z", "items": ["a", "b"]},
        {"ts": "2026-03-02T00:00Z", "items": ["c"]},
    ]
    src = _write(tmp_path / "ev.jsonl", events)
    out = tmp_path / f"out.{ {'csv': 'csv', 'jsonl-long': 'jsonl', 'parquet': 'parquet'}[fmt] }"
    assert (
        main(
            _known(
                key,
                domain,
                "-q",
                "-i",
                src,
                "-o",
                str(out),
                "--output-format",
                fmt,
                "--time-field",
                "ts",
                "--start",
                "2026-01-01T00:00-05:00",
                "--step",
                "1mo",
                "-T",
                "4",
            )
        )
        == 0
    )
    if fmt == "csv":
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
    elif fmt == "jsonl-long":
        rows = [json.loads(x) for x in out.read_text().splitlines()]
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
    assert list(rows[0]) == ["t", "item", "value", "noise_std", "step_start", "step_end"]
    zone = dt.timezone(dt.timedelta(hours=-5))
    for row in rows:
        t = int(row["t"])
        assert row["step_start"] == dt.datetime(2026, t, 1, tzinfo=zone).isoformat()
        assert row["step_end"] == dt.datetime(2026, t + 1, 1, tzinfo=zone).isoformat()
    assert {int(r["t"]) for r in rows} == {1, 2, 3, 4}


def test_long_outputs_without_a_clock_have_no_step_start(setup):
    tmp_path, key, domain = setup
    src = _write(tmp_path / "ev.jsonl", [{"t": 1, "items": ["a"]}])
    out = tmp_path / "out.csv"
    assert main(_known(key, domain, "-q", "-i", src, "-o", str(out), "-T", "2")) == 0
    assert out.read_text().splitlines()[0] == "t,item,value,noise_std"
    assert "clock" not in json.loads((tmp_path / "out.csv.meta.json").read_text())


def test_a_wrong_domain_with_truncate_is_said_even_with_quiet(setup, caplog):
    """Review 102: --on-invalid truncate with the wrong --domain cut every event to
    nothing and released empty steps, exit 0 and (with -q) not a word. Truncation is
    not refused (a known domain may leave out most items on purpose), but a run that
    dropped more than 90% of the item occurrences says so as a warning."""
    tmp_path, key, _ = setup
    other = tmp_path / "other.txt"
    other.write_text("x\ny\n")
    src = tmp_path / "ev.jsonl"
    lines = [json.dumps({"t": t, "items": [WORDS[t % 3]]}) + "\n" for t in range(1, 5)]
    src.write_text("".join(lines))
    argv = _known(key, str(other), "-q", "-T", "4", "-i", str(src), "--on-invalid", "truncate")
    with caplog.at_level(logging.WARNING, logger="dpstream"):
        assert main([*argv, "-o", str(tmp_path / "o.jsonl")]) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("truncation dropped 4 of 4 item occurrences (100.0%)" in m for m in warned)
    caplog.clear()
    half = [json.dumps({"t": t, "items": ["x", WORDS[t % 3]]}) + "\n" for t in range(1, 5)]
    src.write_text("".join(half))  # half dropped (not over 90%: truncation's use), no warning
    with caplog.at_level(logging.WARNING, logger="dpstream"):
        assert main([*argv, "-o", str(tmp_path / "p.jsonl"), "--stream", "half"]) == 0
    assert not any("truncation dropped" in r.getMessage() for r in caplog.records)


def test_a_raised_max_invalid_still_says_what_was_skipped_with_quiet(setup, caplog):
    """Review 102: --max-invalid 1 (meant as 1%: it means no limit) with a mistyped
    --time-field skipped every record, exit 0, and -q hid the count. More than 5% of
    the records skipped (the default limit) is now a warning."""
    tmp_path, key, domain = setup
    src = tmp_path / "ts.jsonl"
    src.write_text("".join(json.dumps({"ts": 3600 * t, "items": ["a"]}) + "\n" for t in range(20)))
    argv = _known(key, domain, "-q", "-T", "24", "-i", str(src), "-o", str(tmp_path / "o.jsonl"))
    argv += ["--time-field", "timestamp", "--step", "1h", "--start", "1970-01-01T00:00Z"]
    with caplog.at_level(logging.WARNING, logger="dpstream"):
        assert main([*argv, "--max-invalid", "1"]) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("20 of 20 records (100.0%) were skipped as invalid" in m for m in warned), warned


def test_max_invalid_with_follow_is_refused_and_the_progress_counts_skips(setup, capsys, caplog):
    """Review 102: --follow has no --max-invalid guard (a followed step is released as its
    events come), yet --max-invalid 0 was taken without a word, and the progress lines
    said only "0 events" while every record was skipped."""
    from dpstream.run.report import Progress

    tmp_path, key, domain = setup
    src = tmp_path / "live.jsonl"
    src.write_text("")
    argv = _known(key, domain, "-T", "4", "-i", str(src), "-o", str(tmp_path / "o.jsonl"))
    argv += ["--time-field", "ts", "--step", "1h", "--start", "2026-01-01T00:00Z", "--follow"]
    assert main([*argv, "--max-invalid", "0"]) == 2
    assert "--max-invalid does not apply to --follow" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
    progress = Progress(10, enabled=True, every=0.0)
    progress.bar_mode, progress.log_mode = False, True
    with caplog.at_level(logging.INFO, logger="dpstream"):
        progress.update(3, 0, 200)
    assert any("0 events (200 invalid records skipped)" in r.getMessage() for r in caplog.records)


def test_a_batch_with_nothing_for_its_steps_is_refused(setup, capsys):
    """Review 120: an empty input (a failed export), or another day's file (every record
    after --until), released the day's steps with no events and exited 0; the day's own
    events were then late for every later run, and the other day's file was refused as
    fed already. Both are refused before anything is written, the state as it was;
    --allow-empty releases the steps of a window that truly had no events."""
    tmp_path, key, domain = setup
    days = {  # three days of two steps (brute force: --tau tiny counts exactly)
        d: _write(tmp_path / f"day{d}.jsonl", [{"t": 2 * d - 1, "items": ["a"]}] * d)
        for d in (1, 2, 3)
    }
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out, state = tmp_path / "o.jsonl", tmp_path / "s.sqlite"

    def day(path: str, until: int, *extra: str) -> int:
        argv = _known(key, domain, "-T", "6", "-i", path, "-o", str(out), "--until", str(until))
        return main([*argv, "--state", str(state), *own_ledger(out), *extra])

    def contents() -> tuple[bytes, list[str]]:
        with closing(sqlite3.connect(state)) as db:
            return out.read_bytes(), list(db.iterdump())

    assert day(days[1], 2) == 0
    before = contents()
    for wrong, words in ((str(empty), "holds no record"), (days[3], "after --until 4")):
        assert day(wrong, 4) == 1
        err = capsys.readouterr().err
        assert words in err and "Nothing was written" in err and "--allow-empty" in err
        assert contents() == before
    assert day(days[2], 4) == 0 and day(days[3], 6) == 0  # each day's own file, as planned
    counts = [json.loads(line)["released"]["a"] for line in out.read_text().splitlines()]
    assert counts == [1, 1, 3, 3, 6, 6]
    # a window that had no events: released so when the run says so
    out2, state2 = tmp_path / "o2.jsonl", tmp_path / "s2.sqlite"
    argv = _known(key, domain, "-T", "6", "-i", str(empty), "-o", str(out2), "--until", "2")
    argv += ["--state", str(state2), *own_ledger(out2)]
    assert main(argv) == 1 and not out2.exists()
    assert main([*argv, "--allow-empty"]) == 0
    assert [json.loads(x)["released"]["a"] for x in out2.read_text().splitlines()] == [0, 0]


@pytest.mark.parametrize("text", ["1h1h", "1m1min", "30s2h30s", "1w1w"])
def test_a_duration_names_each_unit_once(text):
    """Review 122: ``--step 1h1h`` was read as 2h (a doubled paste, most likely); a
    duration names each unit once, as 2h30m does."""
    with pytest.raises(ValueError, match="names each unit once"):
        parse_step(text)
    with pytest.raises(ValueError, match="names each unit once"):
        parse_duration(text)
    assert parse_duration("2h30m") == dt.timedelta(hours=2, minutes=30)
