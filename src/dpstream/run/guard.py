"""The operator's guard of ``dpstream run``: refuse an input that is mostly invalid.

Layer 6 of dpstream (part of the validate-and-bound stage of a run, called by
the source stage, :mod:`dpstream.run.source`). A typo in
the options (``--time-field`` naming a field no event has, ``--step`` read in
the wrong unit, another ``--domain``) makes nearly every record invalid; with
``--on-invalid skip`` the run would drop them all and publish empty steps, spending
the budget on nothing. A batch run reads its whole input before its first
release, so it counts the invalid records first, by cause, and when more than
``--max-invalid`` of them are invalid it writes nothing (no release, no sidecar,
the state as it was) and says why.

The counts are exactly those the run's summary reports as skipped (the same
checks, applied to each record on its own): the records the readers refused,
records of steps an earlier run released (late), of steps past ``--until`` or
the horizon, and, unless ``--on-invalid truncate`` keeps what it can of them,
events with an item outside ``--domain`` or more than ``--max-items`` items.

The decision reads the raw data, as ``--on-invalid error`` does: whether a run
wrote anything depends on its input, so it is for the operator, not something
to publish (docs/privacy.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DPStreamError
from .settings import REASON_KEYS, message_words, parse_share

if TYPE_CHECKING:
    from .config import RunConfig

_INT64_MAX = (1 << 63) - 1

__all__ = [
    "CAUSE_WORDS",
    "EmptyInputError",
    "InvalidTally",
    "TooManyInvalidError",
    "check_invalid_share",
    "check_not_empty",
]


class TooManyInvalidError(DPStreamError):
    """More than ``--max-invalid`` of a run's input records are invalid: nothing written."""


class EmptyInputError(TooManyInvalidError):
    """A batch run's input holds no record for the steps it releases (without
    ``--allow-empty``): nothing written."""


@dataclass
class InvalidTally:
    """Records read and, per cause, the invalid ones (with one message of each cause)."""

    records: int = 0
    causes: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    later: int = 0  # records of steps after --until: a later run's, not counted

    def add(self, cause: str, message: str, count: int = 1) -> None:
        if count:
            self.causes[cause] += count
            self.examples.setdefault(cause, message)

    @property
    def invalid(self) -> int:
        return sum(self.causes.values())

    def count_chunk(
        self,
        chunk: Any,
        *,
        validator: Any,
        start: int,
        late: bool,
        limit: int,
        horizon: int,
        steps: np.ndarray | None = None,
    ) -> None:
        """Count one chunk's records (:class:`dpstream.io.chunks.Chunk`) as the run will:
        ``start`` the step an earlier run released up to (its records are ``late``),
        ``limit`` the last step this run releases (``--until``: the records of steps
        after it, up to the horizon, are a later run's, counted apart in ``later``: a
        stream may be given its whole input at each batch, a later one going on),
        ``steps`` each record's step when it is not the record's own
        (``--implicit-time``: its place in the input)."""
        from ..mechanisms.columns import distinct_in_events

        n = len(chunk)
        self.records += n
        if n == 0:
            return
        t = chunk.t if steps is None else steps
        if max(limit, start, horizon) > _INT64_MAX and t.dtype != object:
            t = t.astype(object)  # compared with a step past int64
        bad = np.zeros(n, dtype=bool)
        if late:
            old = (t > 0) & (t <= start)
            bad |= old
            self.add("late event", "", int(np.count_nonzero(old)))
        for i, message in chunk.errors.items():
            if not bad[i]:
                bad[i] = True
                cause = _cause(message)
                self.add(cause, message)
        past = (t > horizon) & ~bad
        self.add("past", "", int(np.count_nonzero(past)))
        bad |= past
        later = (t > limit) & ~bad
        if later.any():
            self.later += int(np.count_nonzero(later))
            self.records -= int(np.count_nonzero(later))
            bad |= later
        if validator.policy == "truncate" or (
            validator.domain is None and validator.max_items is None
        ):
            return
        sizes = np.diff(chunk.offsets)
        event_of = np.repeat(np.arange(n), sizes)
        if validator.domain is not None and chunk.items:
            outside = validator.domain.lookup(chunk.items) < 0
            hit = np.bincount(event_of[outside[chunk.codes]], minlength=n) > 0
            hit &= ~bad
            self.add("not in the domain", "", int(np.count_nonzero(hit)))
            bad |= hit
        if validator.max_items is not None:
            _, distinct = distinct_in_events(chunk.codes, chunk.offsets)
            over = (distinct > validator.max_items) & ~bad
            self.add("more than --max-items", "", int(np.count_nonzero(over)))


#: (words in a reader's message, the cause they name), tried in this order; a message
#: with none of them is "malformed" (the Spark engine tallies its records by these too).
CAUSE_WORDS: tuple[tuple[str, str], ...] = (
    ("(--time-field)", "no time field"),
    ("needs a time step", "no t"),
    *((key, key) for key in REASON_KEYS),
)


def _cause(message: str) -> str:
    """The cause of a reader's message (a finer key than the summary's reasons), from
    its own words, never from what it quotes of the record."""
    own = message_words(message)
    for words, cause in CAUSE_WORDS:
        if words in own:
            return cause
    return "malformed"


def _phrase(cause: str, cfg: RunConfig) -> str:
    """What the records of ``cause`` have wrong, for the message."""
    from ..io.records import MAX_LINE_BYTES

    clock = cfg.clock
    if cause == "past" and cfg.horizon is None:
        return "are for steps past 2^40, the step limit of a stream with no planned end"
    horizon = int(cfg.horizon) if cfg.horizon is not None else 0
    if cause == "past":
        where = f" (the clock ends at {clock.iso(clock.end_of(horizon))})" if clock else ""
        return f"are for steps past the horizon --horizon {horizon}{where}: check " + (
            "--start, --step and --horizon (or --end)" if clock else "--horizon"
        )
    return {
        "no time field": f"lack the time field {cfg.time_field!r} (--time-field)",
        "timestamp": "have a timestamp that is not ISO-8601 or epoch seconds",
        "before --start": f"are before --start {cfg.start}",
        "no t": 'lack a time step "t" (timestamps need --time-field, --start and --step)',
        "late event": "are for steps an earlier run already released (late events)",
        "not in the domain": "hold an item outside --domain",
        "more than --max-items": f"hold more than --max-items {cfg.max_items} items",
        "user id": f"lack a user id {cfg.user_field!r} (--user-field), or hold one that is "
        "empty or not a string",
        "not valid JSON": "are not valid JSON",
        "not valid UTF-8": "are not valid UTF-8",
        "time order": "are out of time order",
        "line too long": f"are lines longer than {MAX_LINE_BYTES:,} bytes",
    }.get(cause, "are malformed")


def check_not_empty(records: int, later: int, cfg: RunConfig) -> None:
    """Raise :class:`EmptyInputError` when a batch run's input holds no record for the
    steps it releases (``records``: those counted; ``later``: those for steps after
    ``--until``), unless ``--allow-empty``. Review 120: an empty file, or another day's
    file, released the day's steps with no events and exited 0; the day's events were
    late for every later run, and the other day's file was refused as fed already."""
    if records or cfg.allow_empty:
        return
    what = (
        f"all {later:,} of its records are for steps after --until {cfg.until} (another "
        "day's input?)"
        if later
        else "it holds no record (an empty file?)"
    )
    raise EmptyInputError(
        f"the input holds nothing for the steps this run would release: {what}. Released "
        "with no events, those steps could never count their events later. Nothing was "
        f"written (no release, no metadata file{'; the state is as it was' if cfg.state else ''}"
        "): give the input of these steps, or pass --allow-empty if they truly had no events"
    )


def check_invalid_share(tally: InvalidTally, cfg: RunConfig) -> None:
    """Raise :class:`TooManyInvalidError`, with the count of each cause, when more than
    ``--max-invalid`` of the records counted are invalid (the records of steps after
    ``--until``, a later run's, are not counted)."""
    share = parse_share(cfg.max_invalid or "0.05")
    bad, total = tally.invalid, tally.records
    if total == 0 or bad <= share * total:
        return
    causes = "; ".join(
        f"{n:,} of {total:,} records ({_percent(n, total)}) {_phrase(cause, cfg)}"
        for cause, n in sorted(tally.causes.items(), key=lambda kv: -kv[1])
    )
    later = (
        f" ({tally.later:,} more are for steps after --until {cfg.until}: not counted here)"
        if tally.later
        else ""
    )
    raise TooManyInvalidError(
        f"{bad:,} of {total:,} input records ({_percent(bad, total)}) are invalid, more than "
        f"--max-invalid {cfg.max_invalid} allows{later}: {causes}. Nothing was written (no "
        f"release, no metadata file{'; the state is as it was' if cfg.state else ''}): "
        "correct the options or the input, or raise --max-invalid to release the valid "
        "events only"
    )


def _percent(part: int, whole: int) -> str:
    share = 100 * part / whole
    if part == whole:
        return "100%"
    return f"{share:.1f}%" if share >= 0.1 else f"{share:.2g}%"
