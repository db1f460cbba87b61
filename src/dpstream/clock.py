"""The public release clock: time steps of a fixed width, or of calendar months, from a
public start.

Layer 6 of dpstream (an edge; pure functions of its settings and of time).
Step t covers the half-open window [start + (t-1) step, start + t step). A
timestamped event belongs to the step whose window holds its timestamp; step
t is *due* once its window has ended and ``lateness`` more has passed. None
of this reads the data: which steps exist and when they close are public.

Timestamps are ISO-8601 (``2026-03-01T12:30:00Z``, ``2026-03-01 12:30+01:00``;
without a zone they are read as UTC) or seconds since the Unix epoch (a JSON
number, or digits in CSV). Durations are written like ``1h``, ``15m`` (or
``15min``), ``1d``, ``2h30m``, ``90s`` or ``1w``. A step may also be calendar
months, ``1mo`` or ``3mo``: step t then begins on the day of the month and at the
time of ``--start``, t - 1 months later, in the UTC offset written in
``--start`` (a fixed offset: no daylight-saving rules). A month step needs a
start on day 1 to 28 (every month has those days), so that every step begins
on the same day of its month. ``M`` is refused: it reads as minutes in some
tools and as months in others (write ``1min`` or ``1mo``).

Named time zones: ``--start 2026-03-01T00:00[Europe/Paris]`` (the IANA name in
brackets, as RFC 9557 writes it; an offset before it must be the zone's at that
time) makes the clock follow the zone's daylight-saving rules. Steps of whole
days or weeks (``1d``, ``7d``, ``1w``) and calendar months then begin at the
wall-clock time of ``--start`` on their day in that zone, so a day step is 23
or 25 hours long on the days the clocks change; steps of hours, minutes or
seconds stay fixed durations. Where the wall-clock time of ``--start`` does not
exist on a day (the clocks jump over it), the step begins later by the length of
the jump (an hour in most zones); where it happens twice, at the first of the two.
Steps are compared with events as instants (UTC), never as wall times. Event timestamps
without an offset are still read as UTC.

One rule dates every timestamp: an instant is floored to the microsecond (toward
the past, never rounded: ISO-8601 digits past the sixth are dropped, epoch
seconds are floored exactly by :func:`epoch_instant`). Every step boundary is a
whole microsecond, so flooring never moves an event across one: an event lands
in the step that holds it, at whatever precision its time was given.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import hashlib
import re
import zoneinfo
from dataclasses import dataclass

__all__ = [
    "StepClock",
    "epoch_instant",
    "parse_duration",
    "parse_step",
    "parse_timestamp",
    "steps_until",
]

_UTC = _dt.timezone.utc
_UNITS = {"w": 604800, "d": 86400, "h": 3600, "min": 60, "m": 60, "s": 1}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(min|mo|[wdhms])")
_MONTHS = re.compile(r"([0-9]+)mo")


def _ambiguous(text: str) -> None:
    """Refuse ``M`` (minutes or months?) with the two ways to say each."""
    if re.search(r"\dM(?![oOiI])", str(text).replace(" ", "")):
        raise ValueError(
            f"{text!r}: 'M' is ambiguous (minutes or months?): write 1min (or "
            "1m) for minutes, 1mo for calendar months"
        )


def parse_duration(text: str) -> _dt.timedelta:
    """``"1h"``, ``"15m"``/``"15min"``, ``"2h30m"``, ``"1d"``, ``"90s"``, ``"1w"`` as a
    timedelta (> 0). ``M`` (ambiguous) and months (not a fixed duration) are refused."""
    _ambiguous(text)
    s = str(text).strip().lower().replace(" ", "")
    parts = _DURATION.findall(s)
    if not s or "".join(a + b for a, b in parts) != s:
        raise ValueError(f"a duration is written like 1h, 15m, 2h30m, 1d, 1w or 90s, got {text!r}")
    if any(u == "mo" for _, u in parts):
        raise ValueError(f"a month is not a fixed duration: {text!r} is only allowed as a --step")
    units = [_UNITS[u] for _, u in parts]
    if len(set(units)) != len(units):  # review 122: 1h1h was 2h, a doubled paste most likely
        raise ValueError(f"a duration names each unit once (like 2h30m), got {text!r}")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    try:
        return _dt.timedelta(seconds=seconds)
    except OverflowError:  # past timedelta's 999,999,999 days
        raise ValueError(f"a duration of at most 999999999 days, got {text!r}") from None


def parse_step(text: str) -> tuple[_dt.timedelta, int]:
    """A step: ``(duration, 0)`` for a fixed width (:func:`parse_duration`), or
    ``(timedelta(0), n)`` for ``"Nmo"``, n calendar months (a whole number > 0, alone)."""
    _ambiguous(text)
    s = str(text).strip().lower().replace(" ", "")
    if "mo" in s:
        m = _MONTHS.fullmatch(s)
        if m is None or int(m.group(1)) < 1:
            raise ValueError(
                f"a month step is a whole number of months alone, like 1mo or 3mo, got {text!r}"
            )
        return _dt.timedelta(0), int(m.group(1))
    return parse_duration(text), 0


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)
#: Epoch seconds beyond this are past the years 1 to 9999 (checked before any arithmetic,
#: so that a long run of digits is not turned into a huge integer).
_EPOCH_LIMIT = 10**12
_MICROSECOND = _decimal.Decimal("0.000001")
#: Enough digits for any seconds below ``_EPOCH_LIMIT`` at microseconds: no rounding but
#: the floor that quantizing to the microsecond asks for.
_FLOOR = _decimal.Context(prec=40, rounding=_decimal.ROUND_FLOOR)


def epoch_instant(seconds: int | float | _decimal.Decimal) -> _dt.datetime:
    """Seconds since the Unix epoch as an aware UTC datetime, floored to the microsecond.

    Flooring (toward minus infinity, never rounding) keeps an instant in the step that
    holds it: every step boundary is a whole microsecond (a ``datetime``), so the floor
    of an instant is before a boundary exactly when the instant is. The value is taken
    exactly: a ``Decimal`` (a number's text) as written, an ``int`` as is, and a
    ``float`` as its shortest decimal text (``repr``: what ``json.dumps`` writes, so
    ``1772323200.1`` is that decimal instant, not the binary double just below it).
    (``datetime.fromtimestamp`` rounds half-even to the microsecond: it would put
    ``1772409599.9999995`` in the step after the one that holds it.)
    """
    if isinstance(seconds, bool):
        raise TypeError("a timestamp is an ISO-8601 string or a number of seconds, got a bool")
    exact = _decimal.Decimal(repr(seconds)) if isinstance(seconds, float) else seconds
    if isinstance(exact, _decimal.Decimal) and not exact.is_finite():
        raise ValueError("a timestamp must be finite")
    if not -_EPOCH_LIMIT < exact < _EPOCH_LIMIT:
        raise ValueError("the epoch timestamp is out of range")
    try:
        if isinstance(exact, int):
            return _EPOCH + _dt.timedelta(seconds=exact)
        # floored to 6 places, then scaled exactly: whole microseconds
        micros = exact.quantize(_MICROSECOND, context=_FLOOR).scaleb(6, context=_FLOOR)
        return _EPOCH + _dt.timedelta(microseconds=int(micros))
    except OverflowError:
        raise ValueError("the epoch timestamp is out of range") from None


def _aware(value: object) -> _dt.datetime:
    """An ISO-8601 string or epoch seconds as an aware datetime in its own offset (UTC for
    epoch seconds and for text without a zone)."""
    if isinstance(value, bool):
        raise TypeError("a timestamp is an ISO-8601 string or a number of seconds, got a bool")
    if isinstance(value, (int, float, _decimal.Decimal)):
        return epoch_instant(value)
    if not isinstance(value, str):
        raise TypeError(
            f"a timestamp is an ISO-8601 string or a number of seconds, got {type(value).__name__}"
        )
    text = value.strip()
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):
        return epoch_instant(_decimal.Decimal(text))
    if _SECONDS_OFFSET.search(text):
        # Python reads a fraction of a second in an offset, but drops an offset of a
        # fraction only (the event would land in another step)
        raise ValueError(
            "a timestamp's UTC offset is hours and minutes (like +05:30), or whole seconds"
        )
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("not an ISO-8601 timestamp or epoch seconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_UTC)
    return when


_ZONE_SUFFIX = re.compile(r"^(.*?)\[([^\[\]]+)\]$")
#: A UTC offset with a fraction of a second (whole seconds are a zone's local mean
#: time of old, like Paris's +00:09:21 before 1911).
_SECONDS_OFFSET = re.compile(r"T.*[+-][0-9]{2}:?[0-9]{2}:?[0-9]{2}\.[0-9]+$")


def named_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Paris``), or ValueError saying why not.

    ``localtime`` and ``posixrules`` are refused: they name whatever zone a machine is
    set to, so two runs (or a Spark driver and its workers) could read them as two
    clocks; so are the ``right/`` zones, whose transitions ``zoneinfo`` reads off by
    the leap seconds."""
    if name in ("localtime", "posixrules") or name.startswith("right/"):
        raise ValueError(
            f"{name!r} is not a fixed time zone (it is a machine's setting, or a clock "
            "with leap seconds): give an IANA name like Europe/Paris"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except zoneinfo.ZoneInfoNotFoundError:
        raise ValueError(
            f"unknown time zone {name!r}: give an IANA name like Europe/Paris or "
            "America/New_York (the system's zone database, or `pip install tzdata`)"
        ) from None
    except (ValueError, OSError):  # a bad key, a folder (``Europe``), a file not TZif
        raise ValueError(f"{name!r} is not a time zone name (like Europe/Paris)") from None


def _start_in_zone(text: str) -> tuple[_dt.datetime, _dt.tzinfo]:
    """``--start`` text as (an aware datetime, the clock's zone): a named zone from a
    ``[Area/City]`` suffix (the wall time read in that zone), else the text's offset."""
    m = _ZONE_SUFFIX.match(text.strip())
    if m is None:
        begin = _aware(text)
        return begin, begin.tzinfo or _UTC
    wall = m.group(1).strip()
    if "[" in wall or "=" in m.group(2):
        raise ValueError(
            f"{text!r}: one time zone in brackets at the end, like "
            "2026-03-01T00:00[Europe/Paris] (no other RFC 9557 tags)"
        )
    zone = named_zone(m.group(2).strip().removeprefix("!"))  # "!": RFC 9557's critical flag
    if re.fullmatch(r"-?\d+(\.\d+)?", wall):
        raise ValueError("a named time zone goes after an ISO-8601 time, not epoch seconds")
    try:
        given = _dt.datetime.fromisoformat(
            wall[:-1] + "+00:00" if wall.endswith(("Z", "z")) else wall
        )
    except ValueError:
        raise ValueError(f"{wall!r} is not an ISO-8601 time") from None
    if given.tzinfo is None:  # a wall-clock time in the zone
        local = given.replace(tzinfo=zone)
        if local.astimezone(_UTC).astimezone(zone).replace(tzinfo=None) != given:
            raise ValueError(
                f"{wall} does not exist in {zone.key} (the clocks jump over it): "
                "give a --start that does"
            )
        return local, zone
    if given.utcoffset() != given.astimezone(zone).utcoffset():
        raise ValueError(
            f"{wall}'s UTC offset is not {zone.key}'s at that time "
            f"({_offset_text(given.astimezone(zone))})"
        )
    return given, zone


def _offset_text(when: _dt.datetime) -> str:
    """The UTC offset at the end of ``when``'s ISO-8601 text: ``+01:00``, ``+00:09:21``."""
    iso = when.isoformat()
    return iso[max(iso.rfind("+"), iso.rfind("-")) :]


def parse_timestamp(value: object) -> _dt.datetime:
    """An ISO-8601 string or epoch seconds (int, float, ``Decimal`` or digits) as an aware
    UTC datetime, floored to the microsecond (:func:`epoch_instant`).

    Raises ``ValueError`` (or ``TypeError`` for another type) with the reason.
    """
    when = _aware(value)
    try:
        return when.astimezone(_UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00: before year 1 in UTC (or after 9999)
        raise ValueError("the timestamp is out of range (years 1 to 9999 in UTC)") from None


def _add_months(when: _dt.datetime, months: int) -> _dt.datetime:
    """``when`` moved by whole months (its day must be at most 28)."""
    k = when.year * 12 + when.month - 1 + months
    return when.replace(year=k // 12, month=k % 12 + 1)


@dataclass(frozen=True)
class StepClock:
    """A public clock of steps: step t covers [start + (t-1) step, start + t step).

    Attributes:
        start: when step 1 begins (timezone-aware).
        step: the width of a step (> 0), or ``timedelta(0)`` with ``months``.
        lateness: how long after a step's window ends it is still open for
            late events (``due``).
        months: calendar months per step (0: the steps are ``step`` wide).
        zone: the UTC offset of ``--start``, or a named zone (a
            ``zoneinfo.ZoneInfo``): month steps, and with a named zone steps of
            whole days, begin on their day at the wall-clock time of the start there.
    """

    start: _dt.datetime
    step: _dt.timedelta
    lateness: _dt.timedelta = _dt.timedelta(0)
    months: int = 0
    zone: _dt.tzinfo = _UTC

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError("StepClock.start must be timezone-aware (e.g. UTC)")
        if self.lateness < _dt.timedelta(0) or self.months < 0:
            raise ValueError("StepClock.step must be > 0 and lateness >= 0")
        if self.months:
            if self.step != _dt.timedelta(0):
                raise ValueError("StepClock: give step or months, not both")
            local = self.start.astimezone(self.zone)
            if local.day > 28:
                raise ValueError(
                    f"a month step needs --start on day 1 to 28 of its month, so that every "
                    f"step begins on the same day (not every month has a day {local.day}); "
                    "start on the 1st of the next month for steps of whole calendar months"
                )
        elif self.step <= _dt.timedelta(0):
            raise ValueError("StepClock.step must be > 0 and lateness >= 0")

    @classmethod
    def parse(cls, start: str, step: str, lateness: str | None = None) -> StepClock:
        """A clock from command-line text: ``--start`` (``[Area/City]`` at its end for a
        named time zone), ``--step`` and ``--lateness``."""
        begin, zone = _start_in_zone(str(start))
        width, months = parse_step(step)
        return cls(
            begin.astimezone(_UTC),
            width,
            parse_duration(lateness) if lateness else _dt.timedelta(0),
            months=months,
            zone=zone,
        )

    @property
    def named_zone(self) -> str | None:
        """The IANA name of the clock's zone (None: a fixed UTC offset)."""
        return self.zone.key if isinstance(self.zone, zoneinfo.ZoneInfo) else None

    @property
    def calendar_days(self) -> int:
        """Days per step when steps follow a named zone's calendar (whole days or
        weeks with a named zone), else 0 (fixed-width steps, or months)."""
        if self.months or self.named_zone is None:
            return 0
        seconds = self.step.total_seconds()
        return int(seconds // 86400) if seconds % 86400 == 0 else 0

    def _day_boundary(self, k: int) -> _dt.datetime:
        """Where step k + 1 begins with calendar days: the start's wall-clock time,
        k steps of days later, in the zone (first of two, or the hour after a gap). Step 1
        begins at the start itself, which may be the second of two (its offset says so)."""
        if k == 0:
            return self.start
        wall = self.start.astimezone(self.zone).replace(tzinfo=None)
        local = (wall + _dt.timedelta(days=k * self.calendar_days)).replace(tzinfo=self.zone)
        return local.astimezone(_UTC)

    def step_of(self, when: _dt.datetime) -> int:
        """The step an event at ``when`` belongs to (0: before the start). ValueError for
        an instant whose step would end past the calendar (year 9999)."""
        if when < self.start:
            return 0
        try:
            return self._step_of(when)
        except OverflowError:
            raise ValueError("the timestamp is past the last step this clock can date") from None

    def _step_of(self, when: _dt.datetime) -> int:
        days = self.calendar_days
        if days:
            k = (when - self.start) // _dt.timedelta(days=days)  # within one step
            while self._day_boundary(k) > when:
                k -= 1
            while self._day_boundary(k + 1) <= when:
                k += 1
            return k + 1
        if not self.months:
            return (when - self.start) // self.step + 1
        # compared as instants (end_of), not as wall times: in a named zone a wall time
        # may happen twice, and two datetimes of one zone compare by their wall times
        local, first = when.astimezone(self.zone), self.start.astimezone(self.zone)
        k = ((local.year - first.year) * 12 + local.month - first.month) // self.months
        while self.end_of(k) > when:
            k -= 1
        while self.end_of(k + 1) <= when:
            k += 1
        return k + 1

    def due(self, now: _dt.datetime) -> int:
        """The last step whose window (plus the lateness) has ended at ``now`` (0 if none)."""
        if not self.months and not self.calendar_days:
            return max(0, (now - self.lateness - self.start) // self.step)
        return max(0, self.step_of(now - self.lateness) - 1)

    def end_of(self, t: int) -> _dt.datetime:
        """When step t's window ends."""
        if self.calendar_days:
            return self._day_boundary(t)
        if not self.months:
            return self.start + t * self.step
        if t == 0:  # the start itself (perhaps the second of a repeated time)
            return self.start
        # fold 0 on the later steps: the first of a repeated time, after a gap its length on
        local = _add_months(self.start.astimezone(self.zone), t * self.months).replace(fold=0)
        return local.astimezone(_UTC)

    def zone_rules_digest(self, through: int) -> str | None:
        """A digest of where steps 1..``through`` begin and end (their UTC instants), for
        a clock whose steps follow a named zone's rules (days, weeks or months there);
        None for any other clock (its steps are fixed durations from ``--start``).

        The zone's rules come from the machine's time zone database. A run records this
        digest, and a later run of the stream must find the same one: if the database
        changed the rules of a time already released (or a run goes on on a machine
        with another database), released steps would move, and an event near a
        boundary would be counted twice or dropped as late.
        """
        if self.named_zone is None or not (self.months or self.calendar_days):
            return None
        h = hashlib.sha256(f"{self.named_zone} {through}".encode())
        for t in range(through + 1):
            h.update(self.end_of(t).astimezone(_UTC).isoformat().encode() + b",")
        return h.hexdigest()[:32]

    def start_of(self, t: int) -> _dt.datetime:
        """When step t's window begins."""
        return self.end_of(t - 1)

    def step_text(self) -> str:
        """The step as ``--step`` would give it (``1mo``, ``1h``, ``90s``...)."""
        if self.months:
            return f"{self.months}mo"
        seconds = self.step.total_seconds()
        for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
            if seconds % size == 0:
                return f"{int(seconds // size)}{unit}"
        return f"{seconds:g}s"

    def zone_text(self) -> str:
        """The zone's name (``Europe/Paris``), or the UTC offset of ``--start``, like
        ``+01:00`` (``+00:00`` for UTC)."""
        if self.named_zone is not None:
            return self.named_zone
        return _offset_text(self.start.astimezone(self.zone))

    def iso(self, when: _dt.datetime) -> str:
        """``when`` as ISO-8601 in the clock's zone (the offset of ``--start``, or the
        named zone's offset at that time)."""
        return when.astimezone(self.zone).isoformat()

    def describe(self, horizon: int | None) -> dict[str, object]:
        """The clock for the run's sidecar: public settings only (``end`` is None for a
        stream with no planned end, ``horizon`` None)."""
        end = None if horizon is None else self.iso(self.end_of(horizon))
        return {
            "start": self.iso(self.start),
            "step": self.step_text(),
            "time_zone": self.zone_text(),
            "end": end,
            "lateness_seconds": self.lateness.total_seconds(),
        }


def steps_until(clock: StepClock, end: object) -> int:
    """The number of steps from the clock's start to ``end`` (``--end``: when the last
    step ends). ``end`` must fall on a step boundary after the start (ValueError names
    the two nearest). ``end`` may name the clock's zone as ``--start`` does
    (``2027-01-01T00:00[Europe/Paris]``: a wall time there), not another one."""
    if isinstance(end, str) and end.strip().endswith("]"):
        given, zone = _start_in_zone(end)
        if getattr(zone, "key", None) != clock.named_zone:
            raise ValueError(
                f"--end {end} is not in the time zone of --start ({clock.zone_text()})"
            )
        when = given.astimezone(_UTC)
    else:
        when = parse_timestamp(end)
    if when <= clock.start:
        raise ValueError(f"--end {end} is not after --start {clock.iso(clock.start)}")
    t = clock.step_of(when) - 1  # the steps that end at or before `end`
    if clock.end_of(t) != when:
        try:
            after = f"{clock.iso(clock.end_of(t + 1))} (--horizon {t + 1})"
        except (OverflowError, ValueError):
            after = f"step {t + 1}'s, past the year 9999"
        raise ValueError(
            f"--end {end} is not where a step ends (--step {clock.step_text()} from --start "
            f"{clock.iso(clock.start)}): the nearest ends are {clock.iso(clock.end_of(t))} "
            f"(--horizon {t}) and {after}"
        )
    return t
