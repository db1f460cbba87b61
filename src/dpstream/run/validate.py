"""The validate-and-bound stage of a run: ``--on-invalid`` applied to each step's records.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). A step's records
(columns of :class:`dpstream.io.chunks.StepInput`) come in; its valid events come out as
:class:`~dpstream.mechanisms.columns.EventColumns` (with ``--user-field``, with their
users as :class:`~dpstream.mechanisms.users.UserEventColumns`, bounded per user by the
mechanism). An invalid record (an item outside ``--domain``, more than ``--max-items``
items, a malformed line, a step past the end) is dropped and counted (``skip``), cut
to ``--max-items`` items by the keyed rule of :mod:`dpstream.mechanisms.truncation`
(``truncate``), or stops the run (``error``).
Messages never quote a record's content unless ``--verbose-errors`` is given. The
operator's guard against a mostly invalid input is :mod:`dpstream.run.guard`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidEventError
from .report import RunStats
from .settings import message_words, reason_key

__all__ = ["RunStats", "Validator", "invalid_message"]

#: What an invalid record's message says when it may quote the record (without
#: --verbose-errors): the reason, never the content.
_REDACTED = {
    "not in the domain": "an item is not in the --domain",
    "not valid JSON": "not valid JSON",
    "time order": "its time step is not after a step already complete (events must be in "
    "time order)",
    "not valid UTF-8": "not valid UTF-8",
    "user id": "its user id (--user-field) is missing, empty or not a string",
    "timestamp": "its timestamp is missing, not ISO-8601 or epoch seconds, or out of range",
    "line too long": "the line is too long to read",
    "malformed": "not a valid event",
}


def invalid_message(line: int, problem: str, verbose: bool) -> str:
    """What ``--on-invalid error`` says of the invalid record at input line ``line``: its
    problem, or without ``--verbose-errors`` only the reason when the problem may quote
    the record's content (both engines word it so): shown whole only when it quotes
    nothing and its reason's words are numbers and options alone (a late event, a step
    past --until or the horizon, before --start, more than --max-items)."""
    reason = reason_key(problem)
    if not verbose and (reason in _REDACTED or message_words(problem) != problem):
        words = _REDACTED.get(reason, _REDACTED["malformed"])
        problem = f"{words} (--verbose-errors shows the record's content)"
    return f"input line {line}: {problem} (see --on-invalid)"


@dataclass
class _Cut:
    """What the checks decided for one step: events dropped, events cut, occurrences kept."""

    drop: np.ndarray
    changed: np.ndarray
    keep: np.ndarray
    invalid: list[tuple[int, str]]


class Validator:
    """Applies --on-invalid to each record of a step, counting what it dropped or cut."""

    def __init__(
        self,
        *,
        policy: str,
        domain: Sequence[str] | None,
        max_items: int | None,
        truncator: Any,
        stats: RunStats,
        verbose: bool = False,
        users: bool = False,
        domain_index: Any = None,
    ) -> None:
        self.users = users  # events carry user ids (--user-field)
        self.policy = policy
        from ..mechanisms.item_table import domain_table

        # membership looked up for a step's items at once, in a compact table: the
        # mechanism's own table of the same --domain when it has one (``domain_index``),
        # else one built here
        if domain is None:
            self.domain = None
        elif domain_index is not None:
            if len(domain_index) != len(domain):
                raise ValueError("the mechanism's domain table does not match --domain")
            self.domain = domain_index
        else:
            self.domain = domain_table(domain)
        self.max_items = max_items
        self.truncator = truncator
        self.stats = stats
        self.verbose = verbose

    def _invalid(self, line: int, problem: str) -> None:
        reason = reason_key(problem)
        if self.policy == "error":
            raise InvalidEventError(invalid_message(line, problem, self.verbose))
        self.stats.skipped += 1
        self.stats.reasons[reason] += 1

    def events(self, step: Any, *, past: str | None = None) -> Any:
        """The valid events of a step (:class:`dpstream.io.chunks.StepInput`, or a list of
        records), as :class:`~dpstream.mechanisms.columns.EventColumns`; ``past`` marks
        them all as after the end step. Invalid records are reported in input order."""
        from ..mechanisms.columns import EventColumns, distinct_in_events

        step = _as_step(step)
        codes, offsets = step.codes, step.offsets
        n_ev = offsets.size - 1
        cut = _Cut(
            drop=np.zeros(0, dtype=bool),
            changed=np.zeros(0, dtype=bool),
            keep=np.ones(codes.size, dtype=bool),
            invalid=list(step.errors),
        )
        if past is not None:
            cut.invalid.extend((int(line), past) for line in step.event_lines.tolist())
            n_ev = 0
        cut.drop = np.zeros(max(n_ev, 0), dtype=bool)
        cut.changed = np.zeros(max(n_ev, 0), dtype=bool)
        if n_ev:
            event_of = np.repeat(np.arange(n_ev), np.diff(offsets))
            dkeep, distinct = distinct_in_events(codes, offsets)
            before = distinct  # distinct items per event, before any cut
            if dkeep is not None:
                cut.keep &= dkeep
            if self.domain is not None and step.items:
                distinct = self._check_domain(step, cut, event_of, distinct)
            if self.max_items is not None:
                self._check_size(step, cut, distinct)
        cut.invalid.sort(key=lambda pair: pair[0])
        for line, problem in cut.invalid:
            self._invalid(line, problem)
        self.stats.truncated += int(np.count_nonzero(cut.changed & ~cut.drop))
        if n_ev <= 0:
            cols = EventColumns(step.items, np.zeros(0, np.int64), np.zeros(1, np.int64))
            return [] if self.users else cols
        return self._kept(step, cut, event_of, before)

    def _check_domain(
        self, step: Any, cut: _Cut, event_of: np.ndarray, distinct: np.ndarray
    ) -> np.ndarray:
        """Events with an item outside --domain: dropped (reported), or cut to the domain
        (``truncate``). Returns the distinct items per event after the cut."""
        items, codes = step.items, step.codes
        n_ev = cut.drop.size
        assert self.domain is not None
        outside = self.domain.lookup(items) < 0
        out_occ = outside[codes] & cut.keep
        if not out_occ.any():
            return distinct
        bad = np.flatnonzero(np.bincount(event_of[out_occ], minlength=n_ev))
        if self.policy != "truncate":
            first = np.flatnonzero(out_occ)
            first_of = dict(zip(event_of[first][::-1].tolist(), first[::-1].tolist(), strict=True))
            for e in bad.tolist():
                item = items[int(codes[first_of[e]])]
                cut.invalid.append(
                    (int(step.event_lines[e]), f"item {item!r} is not in the domain")
                )
            cut.drop[bad] = True
        else:
            cut.keep &= ~out_occ
            cut.changed[bad] = True
        return np.bincount(event_of[cut.keep], minlength=n_ev)

    def _check_size(self, step: Any, cut: _Cut, distinct: np.ndarray) -> None:
        """Events of more than --max-items distinct items: dropped (reported), or cut by
        the keyed truncation rule (``truncate``), every event's cut at once."""
        from ..io.chunks import concat_ranges as _ranges

        max_items = self.max_items
        assert max_items is not None
        over = np.flatnonzero((distinct > max_items) & ~cut.drop)
        if self.policy != "truncate":
            for e in over.tolist():
                cut.invalid.append(
                    (
                        int(step.event_lines[e]),
                        f"event has {int(distinct[e])} distinct "
                        f"items, more than --max-items {max_items}",
                    )
                )
                cut.drop[e] = True
        elif over.size:  # every event's cut at once, keyed on (step, its items)
            if step.t is None:
                raise ValueError("events to truncate need their time step")
            offsets, keep = step.offsets, cut.keep
            occ = _ranges(offsets[over], offsets[over + 1])
            occ = occ[keep[occ]]
            sub = np.zeros(over.size + 1, dtype=np.int64)
            np.cumsum(distinct[over], out=sub[1:])
            assert int(sub[-1]) == occ.size
            keep[occ] = self.truncator.keep(int(step.t), step.items, step.codes[occ], sub)
            cut.changed[over] = True

    def _kept(self, step: Any, cut: _Cut, event_of: np.ndarray, before: np.ndarray) -> Any:
        """The events the checks kept, as columns (with ``--user-field``, with their users:
        :class:`~dpstream.mechanisms.users.UserEventColumns`)."""
        from ..mechanisms.columns import EventColumns

        drop, keep = cut.drop, cut.keep
        n_ev = drop.size
        if drop.any():
            keep &= ~drop[event_of]
        final = np.bincount(event_of[keep], minlength=n_ev)
        self.stats.occurrences += int(before[~drop].sum())
        self.stats.dropped += int((before - final)[~drop].sum())
        sizes = final[~drop] if drop.any() else final
        new_offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=new_offsets[1:])
        codes = step.codes
        cols = EventColumns(step.items, codes if keep.all() else codes[keep], new_offsets)
        if self.users:  # the events with their users, bounded per user by the mechanism
            from ..mechanisms.users import UserEventColumns

            user_of = step.user_codes[~drop] if drop.any() else step.user_codes
            return UserEventColumns(step.user_ids, user_of, cols)
        return cols


def _as_step(step: Any) -> Any:
    """A step's records as columns: a list of records (``--follow``, or invalid records)
    becomes the :class:`~dpstream.io.chunks.StepInput` of their one step."""
    from ..io.chunks import records_step

    if hasattr(step, "codes"):
        return step
    recs = list(step)
    steps = {r.t for r in recs if r.error is None}
    return records_step(steps.pop() if len(steps) == 1 else None, recs)
