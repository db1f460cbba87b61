"""Named time zones on the public clock, at their edges: repeated and skipped hours under
month steps, a ``--start`` at the second of a repeated time, timestamps past the
calendar, and zone names that are not fixed zones.

The expected boundaries are built here with ``zoneinfo`` wall-clock arithmetic (the
start's wall time moved by whole months or days, fold 0, in the zone), never by the
clock code under test; the step of an instant is the number of boundaries at or
before it (a bisection over that list).
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import zoneinfo

import pytest

from dpstream.clock import StepClock, parse_timestamp, steps_until

from .conftest import fixed_key, run_on_clock

UTC = dt.timezone.utc
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def _months_later(wall: dt.datetime, months: int) -> dt.datetime:
    k = wall.year * 12 + wall.month - 1 + months
    return wall.replace(year=k // 12, month=k % 12 + 1)


def _month_bounds(
    start: dt.datetime, zone: zoneinfo.ZoneInfo, n: int, months: int = 1
) -> list[dt.datetime]:
    """Where steps 1..n of a clock of ``months`` months begin: the start itself, then
    its wall time k * months later in ``zone`` (fold 0: the first of a repeated time)."""
    wall = start.astimezone(zone).replace(tzinfo=None, fold=0)
    later = [
        _months_later(wall, k * months).replace(tzinfo=zone).astimezone(UTC) for k in range(1, n)
    ]
    return [start.astimezone(UTC), *later]


def _instants(bounds: list[dt.datetime]) -> list[dt.datetime]:
    """Each boundary, a second before it, and every 5 minutes of the 3 hours around it."""
    out = []
    for b in bounds[1:-1]:
        out += [b, b - dt.timedelta(seconds=1)]
        out += [b + dt.timedelta(minutes=m) for m in range(-90, 91, 5)]
    return [w for w in out if bounds[0] <= w < bounds[-1]]


@pytest.mark.parametrize(
    ("start", "months"),
    [
        # Oct 26, 2025: 02:00-03:00 happens twice in Paris; the boundary is the first 02:30
        ("2025-09-26T02:30[Europe/Paris]", 1),
        # Oct 25, 2026: Troll goes from +02 back to +00, 01:00-03:00 twice
        ("2026-09-25T02:15[Antarctica/Troll]", 1),
        # Santiago moves its clocks at midnight: 00:15 is skipped or repeated some months
        ("2011-04-02T00:15[America/Santiago]", 1),
        ("1970-06-15T00:30[America/Santiago]", 1),
        ("2026-01-04T02:00[Australia/Lord_Howe]", 3),  # half-hour daylight saving
    ],
)
def test_month_steps_split_time_at_instants_across_repeated_and_skipped_hours(start, months):
    clock = StepClock.parse(start, f"{months}mo")
    wall, name = start[:-1].split("[")
    zone = zoneinfo.ZoneInfo(name)
    first = dt.datetime.fromisoformat(wall).replace(tzinfo=zone)
    bounds = _month_bounds(first, zone, 40, months)
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
    for t in range(1, len(bounds)):
        assert (clock.start_of(t), clock.end_of(t)) == (bounds[t - 1], bounds[t])
    for when in _instants(bounds):
        assert clock.step_of(when) == bisect.bisect_right(bounds, when), when
        assert clock.due(when) == bisect.bisect_right(bounds, when) - 1, when


def test_an_event_in_the_repeated_hour_after_the_start_is_in_step_one():
    # 02:30 first (00:30Z) is the start; 02:15 second (01:15Z) is 45 minutes after it
    clock = StepClock.parse("2025-10-26T02:30[Europe/Paris]", "1mo")
    assert clock.step_of(parse_timestamp("2025-10-26T02:15+01:00")) == 1


@pytest.mark.parametrize("step", ["1d", "1w", "1mo"])
def test_a_start_at_the_second_of_a_repeated_time_begins_step_one(step):
    # 02:30+01:00 is the second 02:30 of Oct 26, 2025 in Paris (01:30Z)
    clock = StepClock.parse("2025-10-26T02:30+01:00[Europe/Paris]", step)
    start = dt.datetime(2025, 10, 26, 1, 30, tzinfo=UTC)
    assert clock.start == start
    assert clock.start_of(1) == start  # what step_start says step 1 counts from
    assert clock.step_of(start) == 1
    assert clock.step_of(start - dt.timedelta(seconds=1)) == 0


def test_later_month_steps_take_the_first_of_a_repeated_time_and_move_past_a_gap():
    # the start is the second 02:30 of Oct 26, 2025; on Mar 26, 2028 Paris skips
    # 02:00-03:00, and step 30 begins on that day: at 03:30+02:00 (01:30Z), as on days
    clock = StepClock.parse("2025-10-26T02:30+01:00[Europe/Paris]", "1mo")
    bounds = _month_bounds(clock.start, PARIS, 40)
    assert bounds[29] == dt.datetime(2028, 3, 26, 1, 30, tzinfo=UTC)
    for t in range(1, len(bounds)):
        assert clock.end_of(t - 1) == bounds[t - 1]
    for when in _instants(bounds):
        assert clock.step_of(when) == bisect.bisect_right(bounds, when), when


def _run(tmp_path, src, out, start, step, *more):
    key = tmp_path / "k.key"
    if not key.exists():  # (one key for the runs of one stream)
        fixed_key("zones-attack").save(key)
    return run_on_clock(key, src, out, start, step, *more)


def test_a_month_run_counts_each_event_in_the_window_written_for_its_step(tmp_path):
    import csv

    # 01:10Z on Oct 25, 2026 is Troll's second 01:10 (+00), after step 2 began at the
    # first 02:15 (+02, 00:15Z): the event belongs to step 2, whose window holds it
    ts = "2026-10-25T01:10:00Z"
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"ts": ts, "items": ["x"]}) + "\n" for _ in range(60)))
    out = tmp_path / "out.csv"
    assert _run(tmp_path, src, out, "2026-09-25T02:15[Antarctica/Troll]", "1mo", "-T", "3") == 0
    with open(out, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["item"] == "x"]
    first = min(rows, key=lambda r: int(r["t"]))
    when = parse_timestamp(ts)
    assert first["t"] == "2"
    assert parse_timestamp(first["step_start"]) <= when < parse_timestamp(first["step_end"])


def test_timestamps_past_the_calendar_are_invalid_records_not_a_crash(tmp_path):
    clock = StepClock.parse("2026-03-01T00:00[Europe/Paris]", "1d")
    with pytest.raises(ValueError, match="past the last step"):
        clock.step_of(parse_timestamp("9999-12-31T23:30:00Z"))  # Jan 1, 10000 in Paris
    with pytest.raises(ValueError, match="out of range"):
        parse_timestamp("0001-01-01T00:00:00+01:00")  # Dec 31 of year 0 in UTC
    events = [
        {"ts": "2026-03-02T10:00:00Z", "items": ["a"]},
        {"ts": "9999-12-31T23:30:00Z", "items": ["a"]},
        {"ts": "0001-01-01T00:00:00+01:00", "items": ["a"]},
    ]
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out.csv"
    start = "2026-03-01T00:00[Europe/Paris]"
    more = ("-T", "3", "--on-invalid", "skip", "--max-invalid", "0.7")
    assert _run(tmp_path, src, out, start, "1d", *more) == 0


@pytest.mark.parametrize(
    ("zone", "why"),
    [
        ("Europe", "not a time zone name"),  # a folder of the zone database
        ("localtime", "not a fixed time zone"),  # whatever the machine is set to
        ("posixrules", "not a fixed time zone"),
        ("right/Europe/Paris", "not a fixed time zone"),  # leap seconds: 27 s off
        ("Europe/Paris][u-ca=iso8601", "one time zone in brackets"),
        ("u-ca=iso8601", "one time zone in brackets"),
    ],
)
def test_zone_names_that_are_not_fixed_zones_are_refused(zone, why):
    with pytest.raises(ValueError, match=why):
        StepClock.parse(f"2026-03-01T00:00[{zone}]", "1d")


def test_rfc_9557_critical_flag_names_the_same_zone():
    flagged = StepClock.parse("2026-03-01T00:00[!Europe/Paris]", "1d")
    assert flagged == StepClock.parse("2026-03-01T00:00[Europe/Paris]", "1d")


def test_a_fixed_offset_in_seconds_is_recorded_whole():
    # the sidecar's and the state's time_zone: "+00:09:21", not ":09:21"
    for sign in "+-":
        clock = StepClock.parse(f"1900-01-01T00:00{sign}00:09:21", "1mo")
        assert clock.zone_text() == f"{sign}00:09:21"


def test_end_may_name_the_zone_of_start():
    clock = StepClock.parse("2026-03-01T00:00[Europe/Paris]", "1mo")
    assert steps_until(clock, "2027-01-01T00:00[Europe/Paris]") == 10
    assert steps_until(clock, "2027-01-01T00:00+01:00") == 10
    with pytest.raises(ValueError, match="not in the time zone of --start"):
        steps_until(clock, "2026-12-31T18:00[America/New_York]")  # the same instant
    with pytest.raises(ValueError, match="not in the time zone of --start"):
        steps_until(StepClock.parse("2026-03-01T00:00+01:00", "1mo"), "2027-01-01T00:00[UTC]")


@pytest.mark.parametrize("start", ["9999-12-01T00:00Z", "9999-12-01T00:00[Europe/Paris]"])
@pytest.mark.parametrize("steps", [("-T", "40"), ("--until", "40")])
def test_a_last_step_past_the_calendar_is_refused_before_the_run(tmp_path, capsys, start, steps):
    # step 31 would end in the year 10000: refused before anything is written (with
    # --until, steps 1 to 30 were released, then the run failed on step 31's dates)
    src = tmp_path / "ev.jsonl"
    src.write_text(json.dumps({"ts": "9999-12-02T10:00:00Z", "items": ["a"]}) + "\n")
    out = tmp_path / "out.csv"
    assert _run(tmp_path, src, out, start, "1d", *steps) != 0
    assert "past the year 9999" in capsys.readouterr().err
    assert not out.exists()


def test_an_end_near_the_calendars_end_names_the_nearest_step():
    clock = StepClock.parse("2026-03-01T00:00Z", "1d")
    with pytest.raises(ValueError, match=r"9999-12-31T00:00:00\+00:00 \(--horizon 2912383\)"):
        steps_until(clock, "9999-12-31T12:00Z")
    assert steps_until(clock, "9999-12-31T00:00Z") == 2912383


@pytest.fixture
def paris_as_lagos(tmp_path, monkeypatch):
    """A time zone database in which Europe/Paris has Lagos's rules (+01 all year, no
    daylight saving): what a run finds on a machine whose zone data differ."""
    from importlib import resources

    data = resources.files("tzdata.zoneinfo.Africa").joinpath("Lagos").read_bytes()
    (tmp_path / "tz" / "Europe").mkdir(parents=True)
    (tmp_path / "tz" / "Europe" / "Paris").write_bytes(data)

    def use(path):
        zoneinfo.reset_tzpath(to=path)
        zoneinfo.ZoneInfo.clear_cache()

    yield lambda: use([str(tmp_path / "tz")])
    use(None)  # (the default search path again)


def test_a_resume_under_other_zone_rules_is_refused(tmp_path, capsys, paris_as_lagos):
    """Day steps in Paris, three daily runs. The second finds the same zone rules and
    goes on; the third finds a database where Paris keeps +01 past Mar 29, which moves
    the released steps 29 to 40 by an hour: refused, before anything is written."""

    def events(name, days):
        path = tmp_path / name
        path.write_text(
            "".join(json.dumps({"ts": f"{d}T12:00:00Z", "items": ["x"]}) + "\n" for d in days)
        )
        return path

    march = [f"2026-03-{d:02d}" for d in range(1, 32)]
    out = tmp_path / "out.csv"
    start = "2026-03-01T00:00[Europe/Paris]"
    common = ("-T", "60", "--state", str(tmp_path / "st.sqlite"))
    assert (
        _run(tmp_path, events("a.jsonl", march[:3]), out, start, "1d", *common, "--until", "3") == 0
    )
    assert (
        _run(tmp_path, events("b.jsonl", march[3:]), out, start, "1d", *common, "--until", "40")
        == 0
    )
    written = out.read_bytes()
    capsys.readouterr()
    paris_as_lagos()
    assert (
        _run(
            tmp_path, events("c.jsonl", ["2026-04-12"]), out, start, "1d", *common, "--until", "45"
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "Europe/Paris" in err and "1 to 40" in err and "time zone database" in err
    assert out.read_bytes() == written
