"""The sink stage of a run: each step's release into the release ledger, the state and the
output, in that order (write-ahead), and the end of the batch.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). A step is appended to the
release ledger (:mod:`dpstream.ledger`) and recorded in the state
(:mod:`dpstream.state`), with keyed digests of its input and its release, *before* a
byte of it is written; a resumed run replays the steps on record and checks that it
recomputes the same bytes from the same input before it writes again. The order of
these commits and writes is what ``tests/test_kill_points.py`` kills at, one statement
and one write at a time.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from .._crashpoints import write as crash_write
from ..errors import DPStreamError, StateError
from .record import snapshot_context

if TYPE_CHECKING:
    from ..ledger import ReleaseLedger
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from ..state import Checkpoint, StateDigests
    from .config import RunConfig
    from .output import Resume

__all__ = ["BatchStart", "Sink"]

_log = logging.getLogger("dpstream.run")


@dataclass(frozen=True)
class BatchStart:
    """This run's batch, to be recorded in the state once the ledger has checked what it
    must: its input, the input's keyed digest and its first step."""

    input: str
    input_mac: str | None
    first_t: int


class Sink:
    """Where a run's releases go: the output ``out`` at byte ``offset``, with the state
    ``ckpt`` and the release ``ledger`` (either may be None)."""

    def __init__(
        self,
        out: IO[bytes],
        cfg: RunConfig,
        *,
        ckpt: Checkpoint | None,
        ledger: ReleaseLedger | None,
        digests: StateDigests,
        resume: Resume | None,
        offset: int,
        batch: int | None = None,
        batch_start: BatchStart | None = None,
        replaced: BatchStart | None = None,
    ) -> None:
        self.out = out
        self.cfg = cfg
        self.ckpt = ckpt
        self.ledger = ledger
        self.digests = digests
        self.resume = resume
        self.resume_t = resume.last_t if resume is not None else 0
        self.offset = offset
        self.batch = batch
        self.batch_start = batch_start
        self.replaced = replaced  # the input that replaced the open batch's own
        self.fsync = bool(ckpt is not None and cfg.fsync and cfg.output != "-")

    def write_header(self, header: bytes) -> None:
        """A new output's header (the first bytes of a run that starts the stream)."""
        if header:
            crash_write(self.out, header)
            self.offset += len(header)

    def begin_batch(self) -> None:
        """Record this run's batch in the state (when it has one to record)."""
        if self.ckpt is not None and self.batch_start is not None:
            b = self.batch_start
            self.batch = self.ckpt.begin_batch(
                input=b.input, input_mac=b.input_mac, first_t=b.first_t
            )

    def write(self, t: int, step: Any, line: bytes, *, last_line: int) -> None:
        """Step ``t`` (its input ``step``, its release's bytes ``line``): checked against
        the record when it is on record already, else appended to the ledger and
        committed to the state; then written, unless it was written whole before.
        ``last_line``: the input line the step closed at (``--follow``)."""
        ckpt = self.ckpt
        input_mac = (
            self.digests.step_input(t, step.lines, step.lengths, step.raw_pieces())
            if ckpt is not None
            else None
        )
        release_mac = self.digests.release(line) if ckpt is not None else None
        if t <= self.resume_t:
            if not self._replay(t, step, line, input_mac, release_mac):
                return
        else:
            self._commit(t, line, input_mac, release_mac, last_line)
        self._write(t, line)

    def _replay(
        self, t: int, step: Any, line: bytes, input_mac: str | None, release_mac: str | None
    ) -> bool:
        """Check a step on record; True when its release is to be written again (the
        last step on record, maybe partly written)."""
        cfg, ckpt = self.cfg, self.ckpt
        assert ckpt is not None  # a run with steps on record has a state
        stored = ckpt.step(t)
        if stored is None:
            raise StateError(f"state file {cfg.state!r} has no step {t}")
        if stored.input_mac != input_mac:
            first = step.first_line or "?"
            if cfg.follow and cfg.input == "-":  # (review 107: a new pipe after a kill)
                fix = (
                    "; a stream read from stdin resumes only when its whole history is "
                    "fed again, byte for byte, before what is new: follow a file for a "
                    "stream that must survive a kill"
                )
            elif cfg.replace_unfinished:  # review 96: a line removed before a released
                fix = (  # step moves its records
                    "; a corrected file must keep the line numbers of the released "
                    "steps' records (fix or blank a bad line in place: do not remove or "
                    "add a line before them)"
                )
            else:
                fix = ""
            raise StateError(
                f"the input changed: step {t} (input line {first}) differs from the step "
                f"recorded in {cfg.state}, which was already written (its events and "
                f"their line numbers); refusing to release it again from other data{fix}"
            )
        if stored.release_mac != release_mac:
            raise StateError(
                f"replaying step {t} gave a different release than the one recorded: "
                "give the --top and --min-value of the run that wrote it (a batch is "
                "finished with its own post-processing; the next may change them), or "
                "is this another dpstream or numeric library version? refusing to resume"
            )
        if self.ledger is not None:  # on record there too (adopted from the state if not)
            assert input_mac is not None and release_mac is not None
            self.ledger.record(t, input_mac, release_mac)
        if t < self.resume_t:
            return False
        assert self.resume is not None  # t <= resume_t > 0: this run resumes one
        if not line.startswith(self.resume.written):  # the last step, maybe partly written
            raise StateError(
                f"output file {cfg.output!r} does not hold the release "
                f"of step {t} that {cfg.state!r} records as written: "
                "refusing to resume"
            )
        if cfg.output != "-":
            self.out.truncate(self.offset)  # the output is at `offset`, where t begins
        return True

    def _commit(
        self,
        t: int,
        line: bytes,
        input_mac: str | None,
        release_mac: str | None,
        last_line: int,
    ) -> None:
        """Write-ahead: a new step into the ledger, then the state, before its bytes."""
        ledger, ckpt = self.ledger, self.ckpt
        if ledger is not None and ckpt is None:  # no state: its scope, once
            ledger.claim_scope()
        elif ledger is not None:  # in the ledger before the state has it
            # (beside a state, so both digests were made)
            assert input_mac is not None and release_mac is not None
            ledger.record(t, input_mac, release_mac)
        if ckpt is not None:  # on record before a byte of it is written
            assert input_mac is not None and release_mac is not None
            ckpt.commit(
                t,
                begin=self.offset,
                end=self.offset + len(line),
                release_mac=release_mac,
                input_mac=input_mac,
                input_line=(last_line ^ self.digests.mask(t)) if self.cfg.follow else 0,
            )

    def _write(self, t: int, line: bytes) -> None:
        """The release's bytes, flushed (and fsynced with a state); a full disk is said
        in plain words."""
        cfg = self.cfg
        try:
            crash_write(self.out, line)
            self.out.flush()
            if self.fsync:
                os.fsync(self.out.fileno())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            where = "stdout" if cfg.output == "-" else repr(cfg.output)
            again = (
                "run the same command again: it resumes at this step"
                if self.ckpt is not None
                else "run again with --force (or use --state to be able to resume)"
            )
            raise DPStreamError(
                f"the disk holding the output {where} is full: the run "
                f"stopped at step {t}; free some space and {again}"
            ) from None
        self.offset += len(line)

    def end_batch(
        self,
        *,
        until: int,
        horizon: int,
        mech: ContinualMechanism,
        publish: Any,
        key: NoiseKey,
        summary: dict,
    ) -> None:
        """The end of this run's batch: its summary, its end step and the snapshot for the
        next run, in one transaction (every step written and "ready for the next batch"
        are one state: :mod:`dpstream.state`, "Kill points"); the end of the stream when
        ``until`` is the horizon."""
        self.out.flush()
        if self.ckpt is None:
            return
        finished = until == horizon
        snapshot = None
        if not (finished or self.batch is None):
            snapshot = _snapshot(self.ckpt, mech, publish, key)
        self.ckpt.end_batch(
            self.batch, until, snapshot, summary=summary, finished=finished, input=self.replaced
        )


def _snapshot(ckpt: Checkpoint, mech: ContinualMechanism, publish: Any, key: NoiseKey) -> bytes:
    """The snapshot for the next run (the mechanism and its readable-counts
    post-processing). One that cannot be saved stops the run with an error, before the
    batch is closed, as a kill there would (review 120: it was logged, the run exited 0
    and the next one was refused, with advice that did not get past the refusal): the
    same command goes on from the steps written once the cause is mended."""
    from ..errors import DPStreamError
    from ..snapshot import dump_snapshot

    record = ckpt.load()
    assert record is not None  # the run is on record before its batch ends
    try:
        return dump_snapshot((mech, publish), key, snapshot_context(ckpt, record.params, mech.t))
    except (TypeError, ValueError) as exc:
        raise DPStreamError(
            f"the stream's state cannot be saved for the next run ({exc}): its steps up to "
            f"{mech.t} are written, and the state's batch is left open, as after a kill; "
            "this is a fault of dpstream's: report it. Once mended, the same command with "
            "the same input goes on from the steps written"
        ) from exc
