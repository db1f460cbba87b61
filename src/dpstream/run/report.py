"""What a run tells its operator: a progress bar or log lines, and the summary.

Layer 6 of dpstream (the report stage of :mod:`dpstream.run.pipeline`). Everything
here goes to stderr through the ``dpstream.run`` logger (:mod:`dpstream.logs`)
and counts raw events: as private as the input (never an item or a record).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..logs import log_fields

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism
    from .config import RunConfig

__all__ = ["Progress", "RunStats", "log_summary"]

_log = logging.getLogger("dpstream.run")


@dataclass
class RunStats:
    """What a run did, for the summary."""

    steps: int = 0
    events: int = 0
    truncated: int = 0
    skipped: int = 0
    occurrences: int = 0  # distinct items of the valid events, before truncation
    dropped: int = 0  # of those, removed by --on-invalid truncate
    reasons: Counter = field(default_factory=Counter)
    last_items: int = 0
    resumed_at: int = 0
    started: float = field(default_factory=time.monotonic)


def log_summary(stats: RunStats, mech: ContinualMechanism, cfg: RunConfig) -> None:
    """The run's summary: steps, events, what was invalid, the privacy spent."""
    elapsed = time.monotonic() - stats.started
    rate = stats.events / elapsed if elapsed > 0 else float("inf")
    resumed = f", resumed after step {stats.resumed_at}" if stats.resumed_at else ""
    first = mech.t - stats.steps + 1 if stats.steps else 1  # this run's steps (a later
    lines = [  # batch, or a resumed run, releases the steps after the last on record)
        f"{stats.steps} steps (t = {first}..{mech.t} of "
        + ("a stream with no planned end" if mech.unbounded else f"T = {mech.horizon}")
        + "), "
        f"{stats.events} events{resumed}, {elapsed:.1f} s ({rate:,.0f} events/s)",
        f"  invalid events: {stats.truncated} truncated, {stats.skipped} skipped"
        + (
            " (" + ", ".join(f"{n} {r}" for r, n in stats.reasons.most_common()) + ")"
            if stats.reasons
            else ""
        ),
        f"  items released at the last step: {stats.last_items}",
        *_bounding_summary(mech),
        *_truncation_lines(stats, cfg.on_invalid),
        f"  privacy spent: {mech.privacy.plain()}",
        f"  output: {cfg.output if cfg.output != '-' else 'stdout'}"
        + (f"; state: {cfg.state}" if cfg.state else ""),
    ]
    if cfg.on_invalid == "truncate" and stats.dropped > 0.9 * stats.occurrences:
        cut = (
            "items outside --domain and past --max-items are"
            if cfg.domain
            else ("items past --max-items are")
        )
        _log.warning(  # shown with --quiet too (review 102: a wrong --domain, silent)
            f"truncation dropped {stats.dropped:,} of {stats.occurrences:,} item "
            f"occurrences ({stats.dropped / stats.occurrences:.1%}): {cut} cut; are the "
            "options the right ones?"
        )
    later = stats.reasons.get("after --until", 0)
    invalid = stats.skipped - later
    read = stats.events + invalid
    if read and invalid > 0.05 * read:  # past the default --max-invalid: raised, or
        reasons = ", ".join(  # --follow, which has no guard (review 102: silent with -q)
            f"{n:,} {r}" for r, n in stats.reasons.most_common() if r != "after --until"
        )
        _log.warning(
            f"{invalid:,} of {read:,} records ({invalid / read:.1%}) were skipped as "
            f"invalid (by reason: {reasons}): not counted in any release"
        )
    if later:  # shown with --quiet too: events a daily run does not count or keep
        _log.warning(
            f"{later} records are for steps after --until {cfg.until}: this run did not "
            "count them and keeps none of them; the run that releases their steps counts "
            "them only if its input holds them (cut each run's input at its --until)"
        )
    _log.info(
        "\n".join(lines),
        extra=log_fields(
            steps=stats.steps,
            last_t=int(mech.t),
            horizon=int(mech.horizon),
            events=stats.events,
            resumed_at=stats.resumed_at,
            elapsed_s=round(elapsed, 3),
            truncated=stats.truncated,
            skipped=stats.skipped,
            skipped_by_reason=dict(stats.reasons),
            occurrences=stats.occurrences,
            dropped_occurrences=stats.dropped,
            items_released_last=stats.last_items,
            privacy=mech.privacy.to_dict(),
            output=cfg.output,
            state=cfg.state,
        ),
    )


def _bounding_summary(mech: ContinualMechanism) -> list[str]:
    """The user bounds' effect, for the operator (not private: it counts users)."""
    users = getattr(mech, "_users", None)
    if users is None:
        return []
    st = users.bounder.stats
    return [
        f"  user bounds ({users.bounds.describe()}): {st.kept} contributions kept, "
        f"{st.dropped} dropped ({st.dropped_new_item} past --max-items-per-user, "
        f"{st.dropped_count} past --max-count-per-item); {users.users} users"
    ]


def _truncation_lines(stats: RunStats, on_invalid: str) -> list[str]:
    """The share of item occurrences truncation dropped (for the operator, never published)."""
    if not stats.occurrences or on_invalid != "truncate":
        return []
    share = stats.dropped / stats.occurrences
    line = (
        f"  truncation dropped {stats.dropped:,} of {stats.occurrences:,} item occurrences "
        f"({share:.1%}; not part of the release)"
    )
    if share >= 0.05:
        line += (
            ": counts of items that come in large events are low by up to that share; "
            "a larger --max-items keeps more (see `dpstream plan` for its noise)"
        )
    return [line]


class Progress:
    """Progress of a run on stderr: a rich bar on a terminal, else a log line now and then.

    The log line (every ``every`` seconds, and never for a quiet run) gives the
    step, the events so far, the rate and an estimate of the time left. ``total``:
    None for a stream with no planned end and no --until (review 115: it said "step
    8985 of 1099511627776 (0%), about 339938h left", the step limit's).
    """

    def __init__(
        self, total: int | None, *, enabled: bool, every: float = 10.0, start_t: int = 0
    ) -> None:
        self.total = total
        self.bar_mode = enabled and sys.stderr.isatty()
        self.log_mode = enabled and not self.bar_mode
        self.every = every
        self._bar: Any = None
        self._start = time.monotonic()
        self._last_log = self._start
        self._start_t = start_t

    def __enter__(self) -> Progress:
        if self.bar_mode:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("steps"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("run", total=self.total, rate="")
        return self

    def update(self, t: int, events: int, skipped: int = 0) -> None:
        now = time.monotonic()
        elapsed = max(now - self._start, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, completed=t, rate=f"{events / elapsed:,.0f} events/s")
        elif self.log_mode and now - self._last_log >= self.every:
            self._last_log = now
            invalid = f" ({skipped:,} invalid records skipped)" if skipped else ""
            rate = f"{events:,} events{invalid}, {events / elapsed:,.0f} events/s"
            if self.total is None:  # no planned end: no share done, no time left
                _log.info(
                    f"step {t} (no planned end), {rate}",
                    extra=log_fields(
                        step=t,
                        events=events,
                        skipped=skipped,
                        events_per_s=round(events / elapsed, 1),
                    ),
                )
                return
            done = max(t - self._start_t, 1)
            eta = (self.total - t) * elapsed / done
            _log.info(  # (review 102: --follow has no --max-invalid: the skips are said)
                f"step {t} of {self.total} ({100 * t / self.total:.0f}%), {rate}, about "
                f"{_duration(eta)} left",
                extra=log_fields(
                    step=t,
                    total=self.total,
                    events=events,
                    skipped=skipped,
                    events_per_s=round(events / elapsed, 1),
                    eta_s=round(eta, 1),
                ),
            )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
