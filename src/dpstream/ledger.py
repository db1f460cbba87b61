"""The release ledger: an append-only record, kept apart from the state, of every step released.

Layer 6 of dpstream (the edges); stdlib only.

Why a ledger beside the state
-----------------------------
The state file (:mod:`dpstream.state`) refuses to release a step twice from
other input, but only the steps it remembers. Restored from a backup together
with the output, a state forgets the steps released after the backup was
taken; feeding those steps again with other events then releases them again
under the same keyed noise, and the difference of the two releases is the
exact difference of the true counts. The ledger is the anchor outside the
state: every step a run (a state's random run id) releases is appended to it
*before* the state records the step and before a byte of the release is
written, with the state's keyed digests of the step's input and release. A
run whose state is behind the ledger may release the steps the ledger holds
only from the same input (a re-run after a restore, or the one step a kill
left between the ledger and the state), which gives the same bytes; any
other input is refused before anything is written.

Format
------
A text file, one line per step of a run, and one line per run naming its
noise scope::

    L1 <run id> <t> <input digest> <release digest> <tag>
    S1 <scope digest> <run id> <tag>
    B1 <scope digest> <run id> <key id> <budget payload> <tag>

A ``B1`` line follows a run's ``S1`` line in the same append: the run's
dataset and its cost (:mod:`dpstream.budget`, one budget per dataset), sealed
under the key. The key id (a keyed digest of a constant) tells this key's
budget lines from another key's in a shared ledger; another key's lines are
another budget, and are not read.

The digests are the state's (:class:`dpstream.state.StateDigests`: keyed,
bound to t) cut to 128 bits; the tag is an HMAC-SHA256 (cut to 128 bits) of
the rest of the line under a subkey of the noise key, so a line cannot be
written or edited without the key. A line's tag is checked when the run
first relies on it (the run's last step on record whenever its lines are
read, the state's last step when the run opens, and every step it releases
again), so opening a long ledger costs a split per line.
Lines are not chained: several streams may share one key and one ledger and
append at the same time (each append is one ``write`` under an exclusive
``flock``, after reading what others appended); instead a run's lines must
hold its steps 1..L, each once, so a line removed from the middle is seen.
A last line without its line feed (a kill or a power loss in the middle of
an append) is ignored and cut off at the next append: its step was not
recorded in the state yet, so nothing of it was written. A ledger that cannot
be cut (an append-only file, ``chattr +a``, as docs/operations.md suggests)
gets the torn line closed instead, with a tag under the key after a NUL byte
(:data:`_TORN`): a line read past, which no one without the key can write.

The noise scope
---------------
A state and an output deleted (or restored from a backup taken before the
first run) start a new run, with a new run id, under the *same* noise (the
same key and settings): its steps would be released again from other data.
So every run that releases a step also records, once, the keyed digest of
its noise scope (the purpose the mechanism draws its noise under: the stream
name and every setting that shapes the noise; never the name or the settings
themselves), in the same append as its first step (a run without ``--state``,
which cannot resume, appends that line alone before its first release; a run
on record whose scope line is missing, begun by a dpstream whose ledger kept no
scopes, adds its line when it goes on). A
new run whose scope another run already holds is refused before anything is
written (:meth:`ReleaseLedger.others`, checked again under the lock when the
line is appended); a resumed run (the same run id) is not. ``--force`` is the
operator's statement that the earlier release was never published. A state
whose recorded run released no step yet may carry a run id the ledger holds
with its first step (a kill between the ledger and the state): that run is
let through (:attr:`ReleaseLedger.allow`), not one with later steps (a state
restored from a backup). So are the runs the state recorded and replaced
before it, none with a step on record (two kills in a row at the first step;
:meth:`dpstream.state.Checkpoint.replaced_runs`).

What it cannot see
------------------
Its own loss: the ledger's last lines removed (a ledger restored from a
backup, deleted, or another ``--ledger`` path) together with the state and
the output look like a run that never went further, or a stream that never
ran. Nor can it tell a state restored to just before its run's first step
was recorded from a kill between the ledger and the state at step 1, nor
see releases made through the library (``dpstream`` in Python, ``dpstream
demo``), which keep no ledger. Keep the ledger on storage that is never
rolled back (see docs/operations.md).
"""

from __future__ import annotations

import errno
import hmac
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _crashpoints as crashpoints
from .budget import BUDGET_KEY_LABEL, BUDGET_LINE, DatasetSpend
from .errors import BudgetCapError, LedgerError
from .ledger_budget import BudgetLines
from .ledger_file import check_ledger_file, locked, open_ledger_file, read_range
from .ledger_registry import check_ledger, note_size
from .privacy import BudgetCap
from .run.lock import refuse_foreign_link, same_file

if TYPE_CHECKING:
    from .noise import NoiseKey

__all__ = [
    "BudgetCapError",
    "LedgerEntry",
    "LedgerError",
    "ReleaseLedger",
    "check_ledger_file",
    "default_ledger_path",
    "ledger_path",
    "scope_refusal",
]

_VERSION = "L1"
_SCOPE = b"S1 "  # the line naming a run's noise scope
_STEP_LINE = f"{_VERSION} ".encode("ascii")  # a step of a run
_CUT = 32  # hex characters kept of each digest and of the tag (128 bits)
_TORN = b"torn line\0"  # what a torn line's closing tag is over (before the line)
_LINE_MAX = 1 << 20  # no line the ledger writes is near this long (a budget line: ~1 KB)


class LedgerEntry(NamedTuple):
    """One step of a run on record: the digests of its input and of its release."""

    input_mac: str
    release_mac: str


def default_ledger_path(key_file: str) -> str:
    """Where the ledger of a key lives without ``--ledger``: beside the file the key's
    path resolves to (``os.path.realpath``: links followed), so every name of the key
    file (``./k.key``, a symbolic link to it) finds one ledger; a ledger per name would
    let a run under another name replay noise and spend a budget the first ledger caps.

    The path is returned as given when it already names that file. A ledger beside the
    name as given that is another file (kept there by a dpstream that did not follow
    links) is refused with :class:`LedgerError`, not silently left behind: it may
    hold the releases that the resolved one lacks.
    """
    given = f"{key_file}.ledger"
    resolved = f"{os.path.realpath(key_file)}.ledger"
    if os.path.realpath(given) == os.path.realpath(resolved):
        return given
    if os.path.exists(given) and not same_file(given, resolved):
        if os.path.exists(resolved):
            found = f"both {given!r} and {resolved!r} exist"
            fix = f"append the lines of {given!r} to {resolved!r} and remove {given!r}"
        else:
            found = f"{given!r} exists"
            fix = f"move {given!r} to {resolved!r}"
        raise LedgerError(
            f"--key-file {key_file!r} resolves to {os.path.realpath(key_file)!r}, whose "
            f"release ledger is {resolved!r}, but {found} (a ledger beside the name as "
            f"given): {fix}, or pass --ledger PATH to name the one ledger of this key"
        )
    return resolved


def ledger_path(opts: Mapping[str, Any], *, record: bool = False, wait: bool = True) -> str:
    """The ledger of a run's options: ``--ledger``, else beside the file ``--key-file``
    resolves to (:func:`default_ledger_path`), refused when the key's releases are
    recorded in another ledger (a copy of the key: :mod:`dpstream.ledger_registry`).
    Every command finds a key's ledger here; ``record``: a run's own, which records
    (and creates) the ledger when its key has none on record; ``wait`` False: the
    registry is not waited for (a run's first look, before its state is open: the run
    checks it again, waiting, once its batch is marked as begun)."""
    key_file = opts.get("key_file")
    given = opts.get("ledger")
    path = str(given) if given else default_ledger_path(str(key_file))
    refuse_foreign_link(path, "the release ledger")  # (review 103: one another user made
    key = _key_or_none(str(key_file)) if key_file else None  # chose where it was made)
    if key is not None:
        check_ledger(key, path, str(key_file), default=not given, record=record, wait=wait)
    return path


def _key_or_none(key_file: str) -> NoiseKey | None:
    """The key in ``key_file``, or None when it cannot be read (the command says why
    where it loads the key; its permission warning is given there too)."""
    from .noise import NoiseKey

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return NoiseKey.load(key_file)
        except (OSError, ValueError):
            return None


def _append(fd: int, data: bytes) -> None:
    """The one write of an append (a line, or the lines adopted from a state at once);
    a crash point of the kill harness (:mod:`dpstream._crashpoints`)."""
    crashpoints.write_fd(fd, data)


class ReleaseLedger(BudgetLines):
    """The ledger at ``path``, open for the run ``run_id`` of a state.

    Reads the run's lines when opened (their tags are checked when relied on);
    :meth:`record` checks a step against them and appends the steps not yet on
    record.

    Args:
        path: the ledger file (created with mode 0600 if missing; one that
            group or others may write is refused: whoever can write it can
            roll it back).
        key: the noise key (the lines' tags use a subkey of it).
        run_id: the state's random run id (:meth:`dpstream.state.Checkpoint.run_id`).
        fsync: fsync each append (and the directory when the file is created),
            as the state does with ``--fsync``; without it an append survives a
            killed process, not a power loss.
        scope: the run's noise scope (the mechanism's noise purpose); its keyed
            digest is appended once, with the run's first append. ``None``: none.
        check_scope: refuse (under the lock, when the scope line is appended) a
            scope that another run already holds (:meth:`others`): a new run.
            False for a resumed run, and with ``--force``.
        allow: run ids whose scope lines this run may share (the run a kill left
            in the state before it recorded its first step).
        same_first: release step 1 only from the input a run of ``allow`` recorded
            its step 1 from, if one did (review 101: after a kill between the ledger
            and the state at step 1, the next day's command began the stream again
            from its own input, and the first day's events could never count).
            False with ``--force`` or ``--replace-unfinished`` (that step 1 was never
            written: the operator gives its events up).
        budget: the run's dataset and cost, appended as a budget line with its
            scope line (``None``: no budget line).
        cap: the most its dataset may spend in all; checked when the scope line
            is appended (and by :meth:`budget_problem` before the run starts).
    """

    def __init__(
        self,
        path: str,
        key: NoiseKey,
        run_id: str,
        *,
        fsync: bool = True,
        scope: str | None = None,
        check_scope: bool = False,
        allow: Iterable[str] = (),
        budget: DatasetSpend | None = None,
        cap: BudgetCap | None = None,
        same_first: bool = False,
    ) -> None:
        if not run_id:
            raise LedgerError("the state has no run id: it cannot be kept in the release ledger")
        self.path = path
        self.run_id = run_id
        self._key = key.derive("release-ledger/v1")
        self._budget_key = key.derive(BUDGET_KEY_LABEL)
        self._key_id = self._tag(b"budget key id")
        self._fsync = fsync
        self._scope = None if scope is None else self._tag(b"scope\0" + scope.encode("utf-8"))
        self.check_scope = check_scope
        self.allow = frozenset(allow)
        self.same_first = same_first
        self.budget = budget
        self.cap = cap
        self._budget_lines: list[tuple[bytes, int]] = []  # every budget line, and its number
        self._budget_read: tuple[list[Any], int] = ([], 0)  # (see budget_entries)
        self._scoped: dict[str, tuple[bytes, int]] = {}  # run id -> its scope line, number
        self._other_last: dict[str, int] = {}  # another run's id -> its last step on record
        self._other_first: dict[str, tuple[bytes, int]] = {}  # another run's step 1 line
        self._entries: dict[int, LedgerEntry] = {}  # the lines whose tags were checked
        self._raw: dict[int, tuple[bytes, int]] = {}  # every line of the run, and its number
        self._prefix = f"{_VERSION} {run_id} ".encode("ascii")
        self._size = 0  # the bytes read so far (complete lines)
        self._lines = 0  # the lines read so far
        self._max = 0  # the largest step of the run on record
        self._noise_key = key  # (for the key registry's high-water mark, at close)
        self._appended = False  # whether this run appended a line
        self._fd = open_ledger_file(path, fsync=fsync)
        try:
            self._load()
        except BaseException:
            os.close(self._fd)
            raise

    # -- reading ---------------------------------------------------------------
    def _tag(self, body: bytes) -> bytes:
        return hmac.digest(self._key, body, "sha256").hex()[:_CUT].encode("ascii")

    def _load(self) -> None:
        with locked(self._fd, exclusive=False, path=self.path):
            self._catch_up()

    def _catch_up(self) -> int:
        """Read the lines appended since the last read (by this run or another one sharing
        the ledger); the caller holds the lock. Returns the file's size."""
        size = os.fstat(self._fd).st_size
        if size < self._size:
            raise LedgerError(
                f"the release ledger {self.path!r} was cut short while this run "
                "was using it: refusing to go on"
            )
        if size == self._size:
            return size
        data = read_range(self._fd, self._size, size)
        complete = data[: data.rfind(b"\n") + 1]  # what follows: a torn append, ignored
        self._size += len(complete)
        prefix = self._prefix
        at = len(prefix)
        scope = self._scope
        steps = 0  # the run's lines read now
        closed = b"\0" in complete  # a torn line closed on an append-only ledger
        for raw in complete.split(b"\n")[:-1]:
            self._lines += 1
            if closed and b"\0" in raw:
                self._check_closed(raw)
                continue
            if not raw.startswith(prefix):
                self._other_line(raw, scope)
                continue
            t = _step(raw, at)
            if t is None:
                raise LedgerError(
                    f"line {self._lines} of the release ledger {self.path!r} is "
                    "not a ledger entry (its step is not a whole number from 1 on: "
                    "edited?): refusing to trust the ledger"
                )
            steps += 1
            self._max = max(self._max, t)
            if self._raw.setdefault(t, (raw, self._lines))[0] != raw:
                raise LedgerError(
                    f"the release ledger {self.path!r} holds step {t} of run "
                    f"{self.run_id} twice, with different digests (line "
                    f"{self._lines}): refusing to trust the ledger"
                )
        if steps:
            self._check_steps()
        return size

    def _check_closed(self, raw: bytes) -> None:
        """A line with a NUL byte must be a torn line closed by :meth:`_close_torn` (its
        tag under the key after the last NUL); it is then read past: its step was never
        recorded. Any other is refused (a line hidden by an edit)."""
        body, _, tag = raw.rpartition(b"\0")
        if not hmac.compare_digest(self._tag(_TORN + body), tag):
            raise LedgerError(
                f"line {self._lines} of the release ledger {self.path!r} is no ledger line "
                "(edited?): refusing to trust the ledger"
            )

    def _close_torn(self, size: int) -> bytes:
        """Cut off the torn last line (bytes ``self._size..size``; the caller holds the
        lock); on a file that cannot be cut (append-only: ``chattr +a``), the bytes that
        close it instead, to be written before the next lines: a NUL and its tag. A kill
        in that write leaves a longer torn line, closed whole the next time."""
        try:
            os.ftruncate(self._fd, self._size)
            return b""
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EACCES):
                raise
        torn = read_range(self._fd, self._size, size)
        return b"\0" + self._tag(_TORN + torn) + b"\n"

    def _other_line(self, raw: bytes, scope: bytes | None) -> None:
        """Take in a line that is not one of this run's steps (the caller has counted it).

        A budget line (kept for :meth:`budget_entries`) and a scope line each name
        their run's scope (review 99: with the scope line deleted, a second stream of
        the scope went through). Another run's step line has its form checked and its
        step kept (review 100: a line renamed to a step line hid a cost, and another
        run of the scope's steps must not be released again by this one); that run
        checks its tag. An empty line hides nothing; a line of any other kind is
        refused (review 99: a renamed budget line hid a cost)."""
        if not raw:
            return
        if len(raw) > _LINE_MAX:  # (review 103: split, a 50 MB line took 580 MB)
            raise LedgerError(
                f"line {self._lines} of the release ledger {self.path!r} is no ledger line "
                f"({len(raw):,} bytes; edited?): refusing to trust the ledger"
            )
        fields = raw.split(b" ")
        if raw.startswith(BUDGET_LINE) or raw.startswith(_SCOPE):
            budget = raw.startswith(BUDGET_LINE)
            if budget:
                self._budget_lines.append((raw, self._lines))
            if scope is not None and len(fields) == (6 if budget else 4) and fields[1] == scope:
                self._scoped.setdefault(fields[2].decode("ascii", "replace"), (raw, self._lines))
            return
        t = None
        if raw.startswith(_STEP_LINE) and len(fields) == 6:
            t = _step(raw, len(_STEP_LINE) + len(fields[1]) + 1)
        if t is None:
            raise LedgerError(
                f"line {self._lines} of the release ledger {self.path!r} is no ledger line "
                "(edited?): refusing to trust the ledger"
            )
        run = fields[1].decode("ascii", "replace")
        self._other_last[run] = max(t, self._other_last.get(run, 0))
        if t == 1:
            self._other_first.setdefault(run, (raw, self._lines))

    def _check_steps(self) -> None:
        """The run's lines must hold its steps 1..L, each once, the last one written with
        the key. The last line's tag is checked first: every message about the run's
        steps (how far the ledger is ahead of the state, a step missing) relies on it,
        and a forged line of a step far past the run's (any number can be written) is
        refused naming its line. A missing step is then found by walking the sorted
        steps (never a set sized by a number read from the file)."""
        self.entry(self._max)
        if len(self._raw) != self._max:  # steps are distinct and >= 1: one is missing
            missing = next(want for want, t in enumerate(sorted(self._raw), start=1) if t != want)
            raise LedgerError(
                f"the release ledger {self.path!r} lacks step {missing} of run "
                f"{self.run_id}, though it holds later steps: a line was "
                "removed; refusing to trust the ledger"
            )

    @property
    def last_t(self) -> int:
        """The last step of the run on record (0: none)."""
        return len(self._raw)

    def entry(self, t: int) -> LedgerEntry | None:
        """Step t of the run as recorded (its tag checked), or ``None``.

        A line's tag is checked when the line is first relied on (here), not when
        the ledger is read: opening a ledger with a long history costs a split
        per line, and a changed line is refused whenever it would matter.
        """
        entry = self._entries.get(t)
        if entry is not None or t not in self._raw:
            return entry
        entry = self._entries[t] = self._step_entry(*self._raw[t])
        return entry

    def _step_entry(self, raw: bytes, number: int) -> LedgerEntry:
        """The digests of step line ``raw`` (line ``number``), its tag checked."""
        body, _, tag = raw.rpartition(b" ")
        fields = body.split(b" ")
        if len(fields) != 5 or not hmac.compare_digest(self._tag(body), tag):
            raise LedgerError(
                f"line {number} of the release ledger {self.path!r} was not written with "
                "this key (edited or forged): refusing to trust the ledger"
            )
        return LedgerEntry(
            fields[3].decode("ascii", "replace"), fields[4].decode("ascii", "replace")
        )

    def others_ahead(self, last: int) -> list[str]:
        """:meth:`others` that recorded a step after ``last``: their steps this run would
        release again under the same noise."""
        return [run for run in self.others() if self._other_last.get(run, 0) > last]

    def last_of(self, run_id: str) -> int:
        """The last step run ``run_id`` (this one or another) has on record (0: none)."""
        return self.last_t if run_id == self.run_id else self._other_last.get(run_id, 0)

    def others(self) -> list[str]:
        """The other runs that released under this run's noise scope (their lines'
        tags checked), but the ones in :attr:`allow`."""
        found = []
        for run, (raw, number) in self._scoped.items():
            if run == self.run_id or run in self.allow:
                continue
            body, _, tag = raw.rpartition(b" ")
            if not hmac.compare_digest(self._tag(body), tag):
                raise LedgerError(
                    f"line {number} of the release ledger {self.path!r} was not written with "
                    "this key (edited or forged): refusing to trust the ledger"
                )
            found.append(run)
        return found

    def in_scope(self, run_id: str) -> bool:
        """Whether run ``run_id`` has this run's noise scope on record."""
        return run_id in self._scoped

    def claim_scope(self) -> None:
        """Append the run's scope line if it is not on record yet (a run without a state,
        right before its first release: its one line)."""
        if self._scope is not None and (
            self.run_id not in self._scoped or self.needs_budget_line()
        ):
            self._write([])

    def same(self, t: int, input_mac: str) -> bool | None:
        """Whether step t is on record with this input digest (``None``: not on record)."""
        entry = self.entry(t)
        return None if entry is None else hmac.compare_digest(entry.input_mac, input_mac[:_CUT])

    # -- writing ---------------------------------------------------------------
    def record(self, t: int, input_mac: str, release_mac: str) -> None:
        """Check step t against the ledger, and append it if it is not on record yet.

        Call it before the state records the step (write-ahead). A step on
        record with other digests raises :class:`LedgerError`: it was released
        from other input (or gave other bytes) and must not be released again.
        """
        entry = LedgerEntry(input_mac[:_CUT], release_mac[:_CUT])
        if not self._on_record(t, entry):
            self._write([(t, entry)])

    def _on_record(self, t: int, entry: LedgerEntry) -> bool:
        """Whether step t is on record; if it is, refuse it unless it is ``entry``."""
        old = self.entry(t)
        if old is None:
            if t == 1 and self.same_first:
                self._check_replaced_first(entry)
            return False
        if old.input_mac != entry.input_mac:
            raise LedgerError(
                f"the release ledger {self.path!r} records step {t} of this run as released "
                "from other input: the state is behind the ledger (restored from a backup?); "
                "refusing to release it again from other data"
            )
        if old.release_mac != entry.release_mac:
            raise LedgerError(
                f"step {t} gives another release than the one the release ledger "
                f"{self.path!r} records (another dpstream or numeric library version?); "
                "refusing to release it again"
            )
        return True

    def _check_replaced_first(self, entry: LedgerEntry) -> None:
        """Refuse step 1 from other input than a run of :attr:`allow` (one the state
        replaced) recorded its step 1 from (see ``same_first``)."""
        for run in sorted(self.allow):
            line = self._other_first.get(run)
            if line is not None and self._step_entry(*line).input_mac != entry.input_mac:
                raise LedgerError(
                    f"the release ledger {self.path!r} records step 1 of this stream's first "
                    "run, killed before its state recorded it, as released from other input "
                    "than this run's: run the stream's first batch again with the input it "
                    "read, so that its events count; to give them up (that step was never "
                    "written), add --replace-unfinished"
                )

    def adopt(self, steps: Iterable[tuple[int, str, str]]) -> int:
        """Append ``(t, input_mac, release_mac)`` of steps a state holds and the ledger
        lacks (a state older than the ledger, or a ledger restored from a backup), in one
        write; returns how many were appended."""
        new = [(t, LedgerEntry(i[:_CUT], r[:_CUT])) for t, i, r in steps]
        if new:
            self._write(new)
        return len(new)

    def _write(self, entries: list[tuple[int, LedgerEntry]]) -> None:
        """Append steps (under the lock, after reading what other runs appended), each
        the next one of the run; a step already on record by then is compared instead."""
        try:
            with locked(self._fd, exclusive=True, path=self.path):
                size = self._catch_up()
                entries = [(t, e) for t, e in entries if not self._on_record(t, e)]
                for n, (t, _) in enumerate(entries):
                    if t != self.last_t + 1 + n:
                        raise LedgerError(
                            f"step {t} of run {self.run_id} does not follow "
                            f"step {self.last_t + n}, the last one in the "
                            f"release ledger {self.path!r}"
                        )
                lines = []
                new_scope = self._scope is not None and self.run_id not in self._scoped
                if new_scope:
                    if self.check_scope and self.others():  # a run that began meanwhile
                        raise LedgerError(scope_refusal(self.path, len(self.others())))
                    body = b"%s%s %s" % (_SCOPE, self._scope, self.run_id.encode("ascii"))
                    lines.append(b"%s %s" % (body, self._tag(body)))
                budget = self._budget_line()  # with the scope line, or the first since
                lines += budget
                if not entries and not lines:
                    return
                scoped = len(lines)
                for t, e in entries:
                    body = b"%s%d %s %s" % (
                        self._prefix,
                        t,
                        e.input_mac.encode("ascii"),
                        e.release_mac.encode("ascii"),
                    )
                    lines.append(b"%s %s" % (body, self._tag(body)))
                data = b"\n".join(lines) + b"\n"
                closing = b""
                if size > self._size:  # a torn append (a kill in the middle of its write)
                    closing = self._close_torn(size)
                _append(self._fd, closing + data)
                self._appended = True
                if self._fsync:
                    os.fsync(self._fd)
                if closing:  # the torn line, closed: one line more, read past
                    self._size = size + len(closing)
                    self._lines += 1
                self._size += len(data)
                if new_scope:
                    self._lines += 1
                    self._scoped[self.run_id] = (lines[0], self._lines)
                for raw in budget:
                    self._lines += 1
                    self._budget_lines.append((raw, self._lines))
                for (t, e), raw in zip(entries, lines[scoped:], strict=True):
                    self._lines += 1
                    self._raw[t] = (raw, self._lines)
                    self._entries[t] = e
                self._max = len(self._raw)
        except OSError as exc:
            raise LedgerError(
                f"cannot append to the release ledger {self.path!r}: "
                f"{exc.strerror}; nothing of the step was written"
            ) from None

    def close(self) -> None:
        os.close(self._fd)
        if self._appended:  # the ledger only grows: a shorter one later was rolled back
            self._appended = False
            note_size(self._noise_key, self.path, self._size)

    def reopen(self) -> None:
        """Open the ledger again after :meth:`close`; what was read stays read (the next
        read or append catches up with what others appended meanwhile)."""
        self._fd = open_ledger_file(self.path, fsync=self._fsync)

    def __enter__(self) -> ReleaseLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _step(raw: bytes, at: int) -> int | None:
    """The step of a run's line (its field from ``at`` to the next space), or ``None``
    when it is not one a ledger writes: decimal digits without a leading zero (so at
    least 1; ``int`` alone would take ``0``, ``-5``, ``+5``, ``0_5``)."""
    end = raw.find(b" ", at)
    field = raw[at:end] if end >= 0 else b""
    if not field.isdigit() or field.startswith(b"0"):  # bytes.isdigit: ASCII digits only
        return None
    try:
        return int(field)
    except ValueError:  # more digits than int() converts
        return None


def scope_refusal(path: str, runs: int, *, spark: bool = False) -> str:
    """Why a new run is refused when ``runs`` other runs released under its noise scope;
    ``spark``: the run is on Spark, which keeps no state and so cannot resume one."""
    go_on = (
        ". A Spark run releases steps 1 .. --until in one go and keeps no state, so it "
        "cannot go on with a stream an earlier run released (its earlier steps would be "
        "released again from this input): a stream that goes on runs on the local engine "
        "with a --state from its first run, or as a Spark stream "
        "(dpstream.spark.start_stream)"
        if spark
        else ", or resume the existing one with the --state its first run kept"
    )
    return (
        f"the release ledger {path!r} records {runs} earlier run(s) that released steps "
        "with the same key and settings (the same --stream name and every setting that "
        "shapes the noise): this run would draw the same noise, and releasing those "
        "steps again from other data publishes the exact difference of the true counts. "
        "Use another --stream name for a new stream (a new key starts a fresh budget: "
        f"--budget-cap counts one key's runs){go_on}; if the earlier "
        "release was never published, --force says so and goes on"
    )
