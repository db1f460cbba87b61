"""The public release clock: time steps of a fixed width from a public start.

Layer 6 of dpstream (an edge; pure functions of its settings and of time).
Step t covers the half-open window [start + (t-1) step, start + t step). A
timestamped event belongs to the step whose window holds its timestamp; step
t is *due* once its window has ended and ``lateness`` more has passed. None
of this reads the data: which steps exist and when they close are public.

Timestamps are ISO-8601 (``2026-03-01T12:30:00Z``, ``2026-03-01 12:30+01:00``;
without a zone they are read as UTC) or seconds since the Unix epoch (a JSON
number, or digits in CSV). Durations are written like ``1h``, ``15m``,
``1d``, ``2h30m``, ``90s`` or ``1w``.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass

__all__ = ["StepClock", "parse_duration", "parse_timestamp"]

_UTC = _dt.timezone.utc
_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")


def parse_duration(text: str) -> _dt.timedelta:
    """``"1h"``, ``"15m"``, ``"2h30m"``, ``"1d"``, ``"90s"``, ``"1w"`` as a timedelta (> 0)."""
    s = str(text).strip().lower().replace(" ", "")
    parts = _DURATION.findall(s)
    if not s or "".join(a + b for a, b in parts) != s:
        raise ValueError(f"a duration is written like 1h, 15m, 2h30m, 1d or 90s, got {text!r}")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return _dt.timedelta(seconds=seconds)


def parse_timestamp(value: object) -> _dt.datetime:
    """An ISO-8601 string or epoch seconds (int, float or digits) as an aware UTC datetime.

    Raises ``ValueError`` (or ``TypeError`` for another type) with the reason.
    """
    if isinstance(value, bool):
        raise TypeError("a timestamp is an ISO-8601 string or a number of seconds, got a bool")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("a timestamp must be finite")
        try:
            return _dt.datetime.fromtimestamp(value, _UTC)
        except (OverflowError, OSError, ValueError):
            raise ValueError("the epoch timestamp is out of range") from None
    if not isinstance(value, str):
        raise TypeError(f"a timestamp is an ISO-8601 string or a number of seconds, got "
                        f"{type(value).__name__}")
    text = value.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return parse_timestamp(float(text))
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("not an ISO-8601 timestamp or epoch seconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_UTC)
    return when.astimezone(_UTC)


@dataclass(frozen=True)
class StepClock:
    """A public clock of steps: step t covers [start + (t-1) step, start + t step).

    Attributes:
        start: when step 1 begins (timezone-aware).
        step: the width of a step (> 0).
        lateness: how long after a step's window ends it is still open for
            late events (``due``).
    """

    start: _dt.datetime
    step: _dt.timedelta
    lateness: _dt.timedelta = _dt.timedelta(0)

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError("StepClock.start must be timezone-aware (e.g. UTC)")
        if self.step <= _dt.timedelta(0) or self.lateness < _dt.timedelta(0):
            raise ValueError("StepClock.step must be > 0 and lateness >= 0")

    @classmethod
    def parse(cls, start: str, step: str, lateness: str | None = None) -> StepClock:
        """A clock from command-line text: ``--start``, ``--step`` and ``--lateness``."""
        return cls(parse_timestamp(start), parse_duration(step),
                   parse_duration(lateness) if lateness else _dt.timedelta(0))

    def step_of(self, when: _dt.datetime) -> int:
        """The step an event at ``when`` belongs to (0: before the start)."""
        if when < self.start:
            return 0
        return (when - self.start) // self.step + 1

    def due(self, now: _dt.datetime) -> int:
        """The last step whose window (plus the lateness) has ended at ``now`` (0 if none)."""
        return max(0, (now - self.lateness - self.start) // self.step)

    def end_of(self, t: int) -> _dt.datetime:
        """When step t's window ends."""
        return self.start + t * self.step
