"""Time steps from records: which step every record of the input counts in.

Layer 6 of dpstream (an edge). :func:`group_steps` groups records read one at a
time (:class:`~dpstream.io.records.RawEvent`); :class:`ChunkGrouper` (and
:func:`step_steps`, :func:`implicit_steps`) group chunks of records
(:class:`~dpstream.io.chunks.Chunk`) into the same steps, the same records.

Time steps: an event with ``t`` belongs to step ``t``; an event without ``t``
belongs to the step of the last record before it that has one. Steps with no
event between two given steps are released too (nothing happened then, and
the histogram is still released). A batch run releases no step before the
input's end, so the grouping holds the input.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import numpy as np

from .chunks import INT64_MAX, Chunk, StepInput, StepPart, step_input
from .records import RawEvent

__all__ = ["group_steps", "ChunkGrouper", "step_steps", "implicit_steps"]


def group_steps(
    records: Iterable[RawEvent],
    horizon: int,
    *,
    start: int = 0,
    implicit: bool = False,
    limit: int | None = None,
) -> Iterator[tuple[int | None, list[RawEvent]]]:
    """Group records into time steps.

    With ``implicit``, every record (valid or not) is a step of its own, one
    at a time. Otherwise the input is read to its end first, and then
    ``(t, records)`` is yielded for t = start+1, start+2, ... up to the last
    step a record has, including empty steps in gaps: a record with a time
    belongs to that step wherever it stands in the input, valid or not (an
    invalid one is the caller's to drop); a record without a time belongs to
    the step of the last record before it that has one, or else to the first
    step, or, when no record has a time, all such records are yielded as
    ``(None, records)``. A record of a step up to ``start`` (a stream that
    goes on from an earlier run) is a malformed record in the step it stands.

    The steps wait for the end of the input because closing one when a record
    of a later step arrived let that record decide that the records after it
    were late: its presence changed other records' counts, which the privacy
    guarantee does not cover.

    A record whose time is past ``limit`` (``--until``; the horizon by
    default) is yielded at once as ``(t, records)`` with t > limit, for the
    caller to reject, consecutive ones of the same time together.
    """
    limit = horizon if limit is None else limit
    if implicit:
        current = start
        for rec in records:
            current += 1
            yield current, [rec]
        return
    steps: dict[int, list[RawEvent]] = {}
    last: int | None = None  # the step of the last record that had one
    lead: list[RawEvent] = []  # records without a step before any with one
    past: list[RawEvent] = []  # consecutive records of one time past ``limit``
    for rec in records:
        if rec.t is not None and rec.t > limit:
            if past and past[0].t != rec.t:
                yield past[0].t, past
                past = []
            past.append(rec)
            continue
        if past:
            yield past[0].t, past
            past = []
        if rec.t is not None and rec.t <= start:
            rec = RawEvent(
                rec.line,
                None,
                None,
                f"time step {rec.t} is not after step {start}, which is already "
                "complete (events must be in time order)",
                raw=rec.raw,
            )
        if rec.t is None:
            (lead if last is None else steps[last]).append(rec)
            continue
        last = rec.t
        steps.setdefault(last, []).append(rec)
    if past:
        yield past[0].t, past
    if not steps:
        if lead:
            yield None, lead
        return
    for t in range(start + 1, max(steps) + 1):
        yield t, lead + steps.pop(t, [])
        lead = []


class ChunkGrouper:
    """:func:`dpstream.io.group_steps` over chunks: the same steps, the same records.

    Every record with an in-range step counts in that step, wherever it stands
    in the input: the steps are released once the input has been read (a batch
    run's public clock is the end of its input, or ``--until``). Closing a step
    when a record of a later one arrives let that record decide that the records
    after it were late: its presence changed other records' counts.

    ``start``: the steps up to it are complete (records of them are late, with
    ``late_message``); ``late_message`` None: no such earlier run. A record with
    a step (valid or not) belongs to it; one without belongs to the step of the
    last record before it that has one, or else to the first step. Not for
    ``--implicit-time`` (a step per line). A record of a step past ``limit``
    (``--until``; the horizon by default) is yielded at once, consecutive ones
    of one step together, for the caller to reject.
    """

    def __init__(
        self,
        horizon: int,
        *,
        start: int = 0,
        late_message: str | None = None,
        limit: int | None = None,
    ) -> None:
        self.limit = horizon if limit is None else limit
        self.start = start
        self.late_message = late_message
        self.steps: dict[int, list[StepPart]] = {}  # every step's records, in input order
        self.last: int | None = None  # the step of the last record that had one
        self.lead: list[StepPart] = []  # records without a step before any with one
        self.past: list[StepPart] = []  # consecutive records of one step past the limit
        self.past_t = 0

    def feed(self, chunk: Chunk) -> Iterator[StepInput]:
        """Take a chunk; yields only the records of steps past the limit."""
        for s, part, beyond in self.parts(chunk):
            if beyond:
                if self.past and self.past_t != s:
                    yield from self._flush_past()
                self.past.append(part)
                self.past_t = s
                continue
            yield from self._flush_past()
            if s < 0:
                self.lead.append(part)
            else:
                self.steps.setdefault(s, []).append(part)

    def parts(self, chunk: Chunk) -> Iterator[tuple[int, StepPart, bool]]:
        """A chunk's runs of one step, in input order, without holding them: ``(step,
        part, beyond)``, step -1 for records without a step before any with one, and
        ``beyond`` for a run of one step past the limit (step: that step)."""
        if len(chunk) == 0:
            return
        t, step_of, beyond, late, cuts = self._cut(chunk)
        # each part's late records by bisection of their sorted places: a scan of every
        # late record per part was quadratic (review 111: 40k records, steps 1,2,1,3,...
        # with step 1 late, took 8.5 s)
        places = sorted(late)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            lo, hi = bisect.bisect_left(places, a), bisect.bisect_left(places, b)
            part = StepPart(chunk, a, b, {i: late[i] for i in places[lo:hi]})
            if beyond[a]:
                yield int(t[a]), part, True
            else:
                yield int(step_of[a]), part, False

    def _cut(
        self, chunk: Chunk
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, str], list[int]]:
        """The chunk's steps, the step each record goes to (-1: none yet), which records
        are past the limit, the late ones' messages, and where the runs of one step
        (or of one step past the limit) begin and end."""
        m = len(chunk)
        late: dict[int, str] = {}
        if max(self.limit, self.start) > INT64_MAX and chunk.t.dtype != object:
            chunk.t = chunk.t.astype(object)  # compared with a step past int64
        t = chunk.t
        valid = t > 0  # a record with a step goes to it, valid or not
        if self.late_message is not None:  # records of steps an earlier run released
            old = np.flatnonzero(valid & (t <= self.start))
            for i in old.tolist():
                late[i] = self.late_message.format(t=int(t[i]))
            valid[old] = False
        beyond = valid & (t > self.limit)  # past the limit: rejected where they stand
        valid &= ~beyond
        # the step of every record: its own, or that of the last record before it
        # that had one (-1: none yet)
        at = np.where(valid, np.arange(m), -1)
        np.maximum.accumulate(at, out=at)
        carry = -1 if self.last is None else self.last
        step_of = np.where(at >= 0, t[np.maximum(at, 0)], carry)
        if at[-1] >= 0:
            self.last = int(t[at[-1]])
        change = step_of[1:] != step_of[:-1]
        if beyond.any():  # a range of its own for each run of one step past the limit
            change |= (beyond[1:] != beyond[:-1]) | (beyond[1:] & (t[1:] != t[:-1]))
        cuts = [0, *(np.flatnonzero(change) + 1).tolist(), m]
        return t, step_of, beyond, late, cuts

    def _flush_past(self) -> Iterator[StepInput]:
        """The waiting records of one step past the limit, as that step (rejected)."""
        if self.past:
            yield step_input(self.past_t, self.past)
            self.past = []

    def finish(self) -> Iterator[StepInput]:
        """Every step from start + 1 to the last one with a record, in order (records
        without a step before any with one in the first), or, when no record had a
        step, those records as step None."""
        yield from self._flush_past()
        if not self.steps:
            if self.lead:
                yield step_input(None, self.lead)
                self.lead = []
            return
        top = max(self.steps)
        lead, self.lead = self.lead, []
        for s in range(self.start + 1, top + 1):
            yield step_input(s, lead + self.steps.pop(s, []))
            lead = []


def step_steps(
    chunks: Iterable[Chunk],
    horizon: int,
    *,
    start: int = 0,
    late_message: str | None = None,
    limit: int | None = None,
) -> Iterator[StepInput]:
    """Group chunks into steps (see :class:`ChunkGrouper`)."""
    grouper = ChunkGrouper(horizon, start=start, late_message=late_message, limit=limit)
    for chunk in chunks:
        yield from grouper.feed(chunk)
    yield from grouper.finish()


def implicit_steps(chunks: Iterable[Chunk], *, start: int = 0) -> Iterator[StepInput]:
    """``--implicit-time``: every record (valid or not) a step of its own, from start + 1
    (the steps of :func:`dpstream.io.group_steps` with ``implicit``)."""
    t = start
    for chunk in chunks:
        for i in range(len(chunk)):
            t += 1
            yield step_input(t, [StepPart(chunk, i, i + 1)])
