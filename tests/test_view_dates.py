"""Dates in the view: a run with a clock has dates on the history's time axis (live page
and ``--export``), at the right places; a run without one keeps the step numbers.

Where a date belongs is worked out here from ``--start`` and the step (calendar
months by year and month numbers, fixed steps by division), not by the clock code:
the release of step t counts the events up to the end of step t, so the date that
ends step t sits exactly on that release's point.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from dpstream.cli import main
from dpstream.clock import StepClock
from dpstream.view.dates import clock_of, date_ticks, end_text, window_text

from .conftest import fixed_key, own_ledger

UTC = dt.timezone.utc


def _months_between(a: dt.datetime, b: dt.datetime) -> int:
    return (b.year - a.year) * 12 + b.month - a.month


@pytest.mark.parametrize(
    "start, step, steps, label",
    [
        ("1990-01-01T00:00:00+00:00", "1mo", 156, r"\d{4}"),  # 13 years: a tick every 2 years
        ("2026-01-01T00:00:00-05:00", "1mo", 14, r"[A-Z][a-z]{2} \d{4}"),
        ("2026-03-01T00:00:00-05:00", "1d", 30, r"\d{4}-\d\d-\d\d"),
        ("2026-03-01T06:00:00+01:00", "1h", 48, r"[A-Z][a-z]{2} \d+ \d\d:00"),
        ("2026-01-01T00:00:00+00:00", "1w", 300, r"\d{4}"),
    ],
)
def test_date_ticks_sit_where_their_date_ends_a_step(start, step, steps, label):
    clock = StepClock.parse(start, step)
    first = dt.datetime.fromisoformat(start)
    ticks = date_ticks(clock, 1, steps)
    assert 3 <= len(ticks) <= 9
    for u, text, iso in ticks:
        when = dt.datetime.fromisoformat(iso)
        assert re.fullmatch(label, text), text
        assert when.utcoffset() == first.utcoffset()  # in the clock's zone
        if step.endswith("mo"):
            assert when.day == 1 and when.time() == dt.time(0)  # a round date
            assert u == _months_between(first, when)
        else:
            width = {"1d": 86400, "1h": 3600, "1w": 604800}[step]
            assert u == pytest.approx((when - first).total_seconds() / width)
        assert 1 <= u <= steps
    dates = [dt.datetime.fromisoformat(iso) for _, _, iso in ticks]
    gaps = {b - a for a, b in zip(dates, dates[1:], strict=False)}
    assert len(gaps) == 1 or step.endswith("mo") or step == "1w"  # evenly spaced
    assert [u for u, _, _ in ticks] == sorted(u for u, _, _ in ticks)


def test_window_text_says_when_a_step_begins_and_ends():
    months = StepClock.parse("1990-01-01", "1mo")
    assert window_text(months, 156) == "2002-12-01 – 2003-01-01"
    hours = StepClock.parse("2026-03-01T06:00+01:00", "1h")
    assert window_text(hours, 18) == "2026-03-01 23:00 – 2026-03-02 00:00"
    assert window_text(hours, 2) == "2026-03-01 07:00 – 08:00"
    assert end_text(months, 156) == "2003-01-01"
    assert end_text(hours, 18) == "2026-03-02 00:00"
    assert end_text(StepClock.parse("2026-01-01T00:00-05:00", "1w"), 2) == "2026-01-15"
    assert end_text(StepClock.parse("2026-01-01T00:00Z", "90s"), 3) == "2026-01-01 00:04:30"
    assert clock_of({"clock": {"start": "2026-01-01", "step": "1d"}}) is not None
    for meta in (None, {}, {"clock": None}, {"clock": {"start": "x", "step": "1d"}}):
        assert clock_of(meta) is None


def _svg_points(page: str, item: str) -> list[tuple[float, float]]:
    group = re.search(rf'<g class="series" data-item="{re.escape(item)}">(.*?)</g>', page, re.S)
    assert group is not None
    line = re.search(r'<polyline class="line" points="([^"]+)"', group.group(1))
    assert line is not None
    return [tuple(map(float, p.split(","))) for p in line.group(1).split()]


@pytest.fixture
def monthly_run(tmp_path):
    """A real run: every month from 1990 to 2002, one event of "a" a week."""
    key = tmp_path / "k.key"
    fixed_key("view-dates").save(key)
    start = dt.datetime(1990, 1, 1, tzinfo=UTC)
    events = [
        {"date": (start + dt.timedelta(days=7 * i + 1)).date().isoformat(), "items": ["a"]}
        for i in range(670)
    ]
    src, out = tmp_path / "ev.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in events))
    argv = ["run", "-q", "-m", "unknown", "--max-items", "1", "--rho", "1"]
    argv += ["--threshold-delta", "1e-3", "--key-file", str(key), "-i", str(src)]
    argv += ["-o", str(out), *own_ledger(out), "--time-field", "date"]
    argv += ["--start", "1990-01-01", "--step", "1mo", "--end", "2003-01-01"]
    assert main(argv) == 0
    return tmp_path, out


def test_export_of_a_clocked_run_has_dates_on_the_axis(monthly_run):
    tmp_path, out = monthly_run
    report = tmp_path / "report.html"
    assert main(["view", str(out), "--export", str(report), "--select", "a"]) == 0
    page = report.read_text()
    ticks = re.findall(r'<text class="tick date" x="([\d.]+)"[^>]*data-date="([^"]+)"', page)
    assert [iso[:4] for _, iso in ticks] == ["1992", "1994", "1996", "1998", "2000", "2002"]
    assert "end of each step (UTC+00:00)" in page and "time step t" not in page
    assert "2002-12-01 – 2003-01-01" in page  # the window of the step shown
    assert "t = 156, as of 2003-01-01: " in page  # the legend: what the last count covers
    # the tick of 1 January of year Y sits on the release of step 12 (Y - 1990): the one
    # whose step ends then (the item is released at every step here)
    points = _svg_points(page, "a")
    assert len(points) == 156
    for x, iso in ticks:
        t = 12 * (int(iso[:4]) - 1990)
        assert float(x) == pytest.approx(points[t - 1][0], abs=0.11)


def test_a_run_without_a_clock_keeps_step_numbers(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("view-dates").save(key)
    src, out = tmp_path / "ev.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in range(1, 41)))
    argv = ["run", "-q", "-m", "unknown", "--max-items", "1", "--rho", "1", "-T", "40"]
    argv += ["--threshold-delta", "1e-3", "--key-file", str(key), "-i", str(src), "-o", str(out)]
    assert main(argv) == 0
    report = tmp_path / "report.html"
    assert main(["view", str(out), "--export", str(report)]) == 0
    page = report.read_text()
    assert "time step t" in page and 'class="tick date"' not in page
    assert 'id="dp-window"' not in page and 'class="when"' not in page


def test_dates_past_the_calendar_fall_back_to_steps(tmp_path):
    """The view reads files it did not write: a clock whose steps end after year 9999 (or
    a release far past the horizon) shows step numbers, never breaks the page."""
    from dpstream.run.meta import FORMAT, write_run_meta
    from dpstream.view.model import ViewModel
    from dpstream.view.render import render_page

    out = tmp_path / "out.jsonl"
    lines = [{"t": t, "released": {"a": t}} for t in (1, 2, 3, 10**12)]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    clock = {"start": "9999-06-01T00:00:00+00:00", "step": "1mo"}
    write_run_meta(out, {"format": FORMAT, "horizon": 10, "clock": clock})
    model = ViewModel(out)
    model.refresh()
    page = render_page(model.snapshot(["a"]), nonce=None)
    assert "time step t" in page and 'id="dp-window"' not in page
    assert date_ticks(StepClock.parse(clock["start"], "1mo"), 1, 10) == []
    assert window_text(StepClock.parse(clock["start"], "1mo"), 10**6) is None
