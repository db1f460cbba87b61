"""Named time zones on the public clock: ``--start 2026-03-06T00:00[America/New_York]``.

Steps of whole days (and months) begin at the wall-clock time of ``--start`` in the
zone, across daylight-saving changes; steps of hours stay fixed durations. The
expected boundaries are built here with ``zoneinfo`` and wall-clock ``datetime``
arithmetic (a date plus k days, at the start's time, in the zone), never by the
clock code under test, and every step an instant falls in is found by a linear
scan over those boundaries.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import zoneinfo

import pytest

from dpstream.clock import StepClock, parse_timestamp, steps_until
from dpstream.view.dates import clock_of

from .conftest import fixed_key, run_on_clock

UTC = dt.timezone.utc
NY = zoneinfo.ZoneInfo("America/New_York")
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def _wall_days(first: dt.datetime, days: int, zone: zoneinfo.ZoneInfo, k: int) -> dt.datetime:
    """Where step k + 1 begins: ``first``'s wall time, k * days later, in ``zone``
    (fold 0: the first of a repeated time; Python moves a skipped time an hour on)."""
    return (first.replace(tzinfo=None) + dt.timedelta(days=k * days)).replace(tzinfo=zone)


@pytest.mark.parametrize(
    ("start", "step", "zone", "days"),
    [
        ("2026-01-01T00:00", "1d", NY, 1),
        ("2026-01-01T06:30", "2d", PARIS, 2),
        ("2026-01-05T00:00", "1w", PARIS, 7),
        ("2026-01-01T02:30", "1d", NY, 1),  # 02:30 is skipped on 2026-03-08 in New York
        ("2026-01-01T01:30", "1d", NY, 1),  # 01:30 happens twice on 2026-11-01
    ],
)
def test_day_steps_follow_the_zones_calendar(start, step, zone, days):
    clock = StepClock.parse(f"{start}[{zone.key}]", step)
    first = dt.datetime.fromisoformat(start).replace(tzinfo=zone)
    bounds = [_wall_days(first, days, zone, k).astimezone(UTC) for k in range(400 // days)]
    assert all(b < c for b, c in zip(bounds, bounds[1:], strict=False))
    for t in range(1, len(bounds)):
        assert clock.end_of(t) == bounds[t]
        assert clock.start_of(t) == bounds[t - 1]
    rng = random.Random(11)
    span = (bounds[-1] - bounds[0]).total_seconds()
    instants = [bounds[0] + dt.timedelta(seconds=rng.uniform(0, span)) for _ in range(400)]
    instants += [b + d for b in bounds[1:-1] for d in (dt.timedelta(0), -dt.timedelta(seconds=1))]
    for when in instants:
        want = max(k for k, b in enumerate(bounds) if b <= when) + 1
        assert clock.step_of(when) == want, when


def test_the_daylight_saving_days_are_23_and_25_hours():
    clock = StepClock.parse("2026-03-06T00:00[America/New_York]", "1d")
    lengths = {
        clock.start_of(t).astimezone(NY).date().isoformat(): clock.end_of(t) - clock.start_of(t)
        for t in range(1, 300)
    }
    assert lengths["2026-03-08"] == dt.timedelta(hours=23)
    assert lengths["2026-11-01"] == dt.timedelta(hours=25)
    assert {v for k, v in lengths.items() if k not in ("2026-03-08", "2026-11-01")} == {
        dt.timedelta(days=1)
    }
    # every step begins at local midnight, in the offset of its date
    assert clock.iso(clock.start_of(3)) == "2026-03-08T00:00:00-05:00"
    assert clock.iso(clock.start_of(4)) == "2026-03-09T00:00:00-04:00"


def test_hour_steps_stay_fixed_durations_and_months_follow_the_zone():
    hours = StepClock.parse("2026-03-29T00:00[Europe/Paris]", "1h")
    assert [hours.iso(hours.end_of(t)) for t in (1, 2, 3)] == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:00 is skipped: still one hour later
        "2026-03-29T04:00:00+02:00",
    ]
    months = StepClock.parse("2026-01-15T06:00[Europe/Paris]", "1mo")
    for t in range(1, 25):
        want = dt.datetime(2026 + t // 12, t % 12 + 1, 15, 6, tzinfo=PARIS)
        assert months.end_of(t) == want
    # a month step with a fixed offset keeps that offset all year (unchanged)
    fixed = StepClock.parse("2026-01-15T06:00+01:00", "1mo")
    assert fixed.iso(fixed.end_of(5)) == "2026-06-15T06:00:00+01:00"


def test_due_and_end_on_a_named_zone():
    clock = StepClock.parse("2026-03-06T00:00[America/New_York]", "1d")
    # step 3 (March 8, 23 h) ends at 2026-03-09T04:00Z: due then, not a second before
    assert clock.due(parse_timestamp("2026-03-09T04:00:00Z")) == 3
    assert clock.due(parse_timestamp("2026-03-09T03:59:59Z")) == 2
    assert steps_until(clock, "2026-03-10T00:00-04:00") == 4
    with pytest.raises(ValueError, match="not where a step ends"):
        steps_until(clock, "2026-03-10T00:00-05:00")  # 01:00 local


@pytest.mark.parametrize(
    ("start", "why"),
    [
        ("2026-03-08T02:30[America/New_York]", "does not exist"),
        ("2026-03-08T00:00-04:00[America/New_York]", "offset is not"),
        ("2026-03-08T00:00[Mars/Olympus_Mons]", "unknown time zone"),
        ("1770000000[UTC]", "not epoch seconds"),
        ("2026-03-08T00:00[../../etc/passwd]", "time zone"),
        ("yesterday[UTC]", "ISO-8601"),
    ],
)
def test_bad_named_starts_are_refused_with_the_reason(start, why):
    with pytest.raises(ValueError, match=why):
        StepClock.parse(start, "1d")


def test_an_offset_that_matches_the_zone_is_accepted():
    a = StepClock.parse("2026-07-01T00:00+02:00[Europe/Paris]", "1d")
    b = StepClock.parse("2026-07-01T00:00[Europe/Paris]", "1d")
    assert a == b and a.zone_text() == "Europe/Paris"


def _run(tmp_path, key, src, out, start, *more):
    return run_on_clock(key, src, out, start, "1d", *more)


def test_a_run_on_a_named_zone_bins_by_local_days(tmp_path, capsys):
    key = tmp_path / "k.key"
    fixed_key("zones").save(key)
    # 2026-03-09T04:30Z is 00:30 on March 9 in New York (summer time, step 4) but
    # 23:30 on March 8 at the fixed offset -05:00 (step 3)
    events = [{"ts": "2026-03-09T04:30:00Z", "items": ["late"]}] * 50
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in events))
    out_named, out_fixed = tmp_path / "named.csv", tmp_path / "fixed.csv"
    named = "2026-03-06T00:00[America/New_York]"
    assert _run(tmp_path, str(key), src, out_named, named, "-T", "5") == 0
    assert _run(tmp_path, str(key), src, out_fixed, "2026-03-06T00:00-05:00", "-T", "5") == 0

    def first_step_with(out):
        import csv

        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
        return rows, min(int(r["t"]) for r in rows if r["item"] == "late")

    rows, t_named = first_step_with(out_named)
    _, t_fixed = first_step_with(out_fixed)
    assert (t_named, t_fixed) == (4, 3)
    for r in rows:  # each step's window in the zone's offset of its dates
        k = int(r["t"]) - 1
        first = dt.datetime(2026, 3, 6, tzinfo=NY)
        assert r["step_start"] == _wall_days(first, 1, NY, k).isoformat()
        assert r["step_end"] == _wall_days(first, 1, NY, k + 1).isoformat()
    meta = json.loads((tmp_path / "named.csv.meta.json").read_text())
    assert meta["clock"]["time_zone"] == "America/New_York"
    assert meta["clock"]["end"] == "2026-03-11T00:00:00-04:00"
    # the view rebuilds the named clock from the sidecar (not the offset of --start)
    view_clock = clock_of(meta)
    assert view_clock is not None and view_clock.named_zone == "America/New_York"
    assert view_clock.end_of(3) == StepClock.parse(named, "1d").end_of(3)


def test_a_stream_cannot_go_on_in_another_zone(tmp_path, capsys):
    key = tmp_path / "k.key"
    fixed_key("zones-resume").save(key)
    src = tmp_path / "ev.jsonl"
    src.write_text(json.dumps({"ts": "2026-03-06T10:00:00Z", "items": ["a"]}) + "\n")
    out, state = tmp_path / "out.csv", tmp_path / "s.sqlite"
    common = ("-T", "5", "--state", str(state))
    named = "2026-03-06T00:00[America/New_York]"
    assert _run(tmp_path, str(key), src, out, named, *common, "--until", "1") == 0
    before = out.read_bytes()
    capsys.readouterr()
    rc = _run(tmp_path, str(key), src, out, "2026-03-06T00:00-05:00", *common, "--until", "2")
    assert rc != 0
    assert "the time zone of --start" in capsys.readouterr().err
    assert out.read_bytes() == before
    # the same zone goes on, with the next day's events
    day2 = tmp_path / "day2.jsonl"
    day2.write_text(json.dumps({"ts": "2026-03-07T10:00:00Z", "items": ["a"]}) + "\n")
    assert _run(tmp_path, str(key), day2, out, named, *common, "--until", "2") == 0
