"""Dates on the view's time axis: the run's public clock, read back from its sidecar.

Layer 6 of dpstream (an edge). A run with ``--time-field``, ``--start`` and
``--step`` records its clock in the metadata file (``"clock"``, see
:mod:`dpstream.run.meta`); the view rebuilds the :class:`~dpstream.clock.StepClock`
from it and draws dates instead of step numbers. The release of step t counts the
events up to the end of its window, so it is drawn where that window ends: a date
``d`` sits at the (fractional) step position ``u`` with ``end_of(u) = d``, linear
inside each step (a calendar month is as wide as its step, whatever its days).

Ticks fall on round dates of the clock's time zone (the UTC offset of
``--start``, or its named zone): the first of a year, of a month, a day, a round hour or minute,
whichever gives a handful over the steps drawn.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from typing import Any

from ..clock import StepClock

__all__ = ["clock_of", "position", "date_ticks", "window_text", "end_text"]

_MONTH_NAMES = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()

#: Tick spacings, smallest first: (unit, how many, about how many seconds).
_SPACINGS: tuple[tuple[str, int, float], ...] = (
    *(("minute", n, 60.0 * n) for n in (1, 5, 15, 30)),
    *(("hour", n, 3600.0 * n) for n in (1, 3, 6, 12)),
    *(("day", n, 86400.0 * n) for n in (1, 2, 7, 14)),
    *(("month", n, 2629746.0 * n) for n in (1, 3, 6)),
    *(("year", n, 31556952.0 * n) for n in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)),
)


def clock_of(meta: dict[str, Any] | None) -> StepClock | None:
    """The run's clock from its sidecar (``meta["clock"]``), or None: a run without a
    clock, or a clock this dpstream cannot read (the view then shows steps)."""
    info = (meta or {}).get("clock")
    if not isinstance(info, dict):
        return None
    start, step = info.get("start"), info.get("step")
    if not isinstance(start, str) or not isinstance(step, str):
        return None
    zone = info.get("time_zone")
    if isinstance(zone, str) and zone[:1] not in "+-":  # a named zone, not an offset
        start = f"{start}[{zone}]"
    try:
        return StepClock.parse(start, step)
    except (ValueError, TypeError, OverflowError):
        return None


def position(clock: StepClock, when: _dt.datetime) -> float:
    """The step position of ``when``: ``u`` with ``clock.end_of(u) == when`` (the release of
    step t is drawn at ``u = t``), linear inside a step."""
    k = clock.step_of(when) - 1  # step k ends at or before `when`, step k + 1 after it
    if k < 0:  # before the start: the width of the first step
        k = 0
    lo, hi = clock.end_of(k), clock.end_of(k + 1)
    return k + (when - lo) / (hi - lo)


def _aligned(unit: str, n: int, first: _dt.datetime) -> Iterator[_dt.datetime]:
    """Round dates of ``unit`` every ``n`` from the last one at or before ``first`` on
    (in ``first``'s zone)."""
    zone = first.tzinfo
    if unit == "year":
        year = first.year - first.year % n
        while True:
            if year >= 1:
                yield _dt.datetime(year, 1, 1, tzinfo=zone)
            year += n
    elif unit == "month":
        k = (first.year * 12 + first.month - 1) // n * n
        while True:
            yield _dt.datetime(k // 12, k % 12 + 1, 1, tzinfo=zone)
            k += n
    elif unit == "day":
        # whole days; 7 and 14 from a Monday (ordinal 1, 0001-01-01, is a Monday)
        day = (first.toordinal() - 1) // n * n + 1
        while True:
            yield _dt.datetime.fromordinal(day).replace(tzinfo=zone)
            day += n
    else:
        size = _dt.timedelta(hours=n) if unit == "hour" else _dt.timedelta(minutes=n)
        when = first.replace(minute=0 if unit == "hour" else first.minute, second=0, microsecond=0)
        when = when.replace(
            hour=when.hour - when.hour % n if unit == "hour" else when.hour,
            minute=when.minute - when.minute % n if unit == "minute" else 0,
        )
        while True:
            yield when
            when += size


def _label(unit: str, when: _dt.datetime) -> str:
    if unit == "year":
        return f"{when.year}"
    if unit == "month":
        return f"{_MONTH_NAMES[when.month - 1]} {when.year}"
    if unit == "day":
        return when.strftime("%Y-%m-%d")
    return f"{_MONTH_NAMES[when.month - 1]} {when.day} {when:%H:%M}"


#: What date arithmetic raises past the calendar's ends (years 1 to 9999).
_OUT_OF_RANGE = (OverflowError, ValueError, OSError)


def date_ticks(
    clock: StepClock, t_lo: int, t_hi: int, count: int = 8
) -> list[tuple[float, str, str]]:
    """Ticks of round dates from the end of step ``t_lo`` to the end of step ``t_hi``:
    ``(step position, label, ISO-8601 date)``, at most ``count``; empty when no round
    date falls there (steps of seconds, say) or the steps end past the calendar (a
    sidecar or a release line may hold anything: the axis then shows steps)."""
    try:
        return _date_ticks(clock, t_lo, t_hi, count)
    except _OUT_OF_RANGE:
        return []


def _date_ticks(clock: StepClock, t_lo: int, t_hi: int, count: int) -> list[tuple[float, str, str]]:
    first = clock.end_of(t_lo).astimezone(clock.zone)
    last = clock.end_of(t_hi).astimezone(clock.zone)
    span = (last - first).total_seconds()
    unit, n = next(((u, k) for u, k, size in _SPACINGS if span / size <= count), _SPACINGS[-1][:2])
    ticks: list[tuple[float, str, str]] = []
    for when in _aligned(unit, n, first):
        if when > last or len(ticks) > count:
            break
        if when >= first:
            ticks.append((position(clock, when), _label(unit, when), when.isoformat()))
    return ticks


def _when(when: _dt.datetime, *, date: bool = True) -> str:
    clock_time = when.strftime("%H:%M" + (":%S" if when.second else ""))
    return f"{when:%Y-%m-%d} {clock_time}" if date else clock_time


def window_text(clock: StepClock, t: int) -> str | None:
    """Step t's window in words, at the step's precision: ``2002-12-01 – 2003-01-01``,
    ``2026-03-01 06:00 – 07:00``; None past the calendar's ends."""
    try:
        start = clock.start_of(t).astimezone(clock.zone)
        end = clock.end_of(t).astimezone(clock.zone)
    except _OUT_OF_RANGE:
        return None
    if all(w.time() == _dt.time(0) for w in (start, end)):
        return f"{start:%Y-%m-%d} – {end:%Y-%m-%d}"
    return f"{_when(start)} – {_when(end, date=end.date() != start.date())}"


def end_text(clock: StepClock, t: int) -> str | None:
    """When step t ends (what its release counts up to): ``2003-01-01``, or with the time
    of day for steps that do not end at midnight; None past the calendar's ends."""
    try:
        end = clock.end_of(t).astimezone(clock.zone)
        begin = clock.start.astimezone(clock.zone)
    except _OUT_OF_RANGE:
        return None
    whole_days = begin.time() == _dt.time(0) and (
        clock.months or clock.step.total_seconds() % 86400 == 0
    )
    return f"{end:%Y-%m-%d}" if whole_days else _when(end)
