"""The SQLite store of a run's checkpoint: the run, its steps, batches and snapshot.

Layer 6 of dpstream (the edges; stdlib ``sqlite3`` only). :mod:`dpstream.state` says
what a state file holds, in which order it is written (write-ahead) and what it
means between any two statements (the kill points).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import secrets
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _crashpoints as crashpoints
from ..errors import StateError
from .digests import canonical_json, check_private_file

__all__ = [
    "SCHEMA_VERSION",
    "Checkpoint",
    "RunRecord",
    "StepRecord",
    "recorded_params",
    "side_files",
]

SCHEMA_VERSION = 3  # 3: step input digests over the raw bytes read

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    params TEXT NOT NULL,
    key_fingerprint TEXT NOT NULL,
    input TEXT NOT NULL,
    output TEXT NOT NULL,
    created TEXT NOT NULL,
    finished TEXT,
    summary TEXT,
    run_id TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS steps (
    t INTEGER PRIMARY KEY,
    begin_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    release_mac TEXT NOT NULL,
    input_mac TEXT NOT NULL,
    input_line INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    t INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS replaced (
    run_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS batches (
    n INTEGER PRIMARY KEY,
    input TEXT NOT NULL,
    input_mac TEXT,
    first_t INTEGER NOT NULL,
    until INTEGER
);
"""


#: What SQLite appends to a database's path to name the files it writes beside it (the
#: write-ahead log, its shared-memory index, the rollback journal) and deletes again.
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")


def side_files(path: str) -> list[str]:
    """The files SQLite may write, and delete, beside the state at ``path``: each side
    suffix after the path as given and after the path with its links followed (SQLite
    names them after the file a link points to). A run's other files must be none of
    them (:func:`dpstream.run.output.check_paths`), as none may be the state."""
    found: dict[str, str] = {}  # one name per file: the name as given first
    for base in (path, os.path.realpath(path)):
        for suffix in SIDE_SUFFIXES:
            found.setdefault(str(Path(f"{base}{suffix}").resolve()), f"{base}{suffix}")
    return list(found.values())


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint says about its run.

    ``last_t`` is the last step on record (committed before its release was
    written, so its bytes may be missing or partial in the output);
    ``last_begin``/``last_end`` are where its release starts and ends.
    """

    params: str
    key_fingerprint: str
    input: str
    output: str
    finished: str | None
    last_t: int
    last_begin: int
    last_end: int
    steps: int
    summary: dict[str, Any] | None = None


@dataclass(frozen=True)
class StepRecord:
    """One step on record: where its release lies in the output, and its digests."""

    begin: int
    end: int
    release_mac: str
    input_mac: str
    input_line: int = 0


def recorded_params(path: str, *, allow_readable: bool = False) -> dict[str, Any] | None:
    """The parameters of the run on record in state file ``path``.

    ``None`` when there is no such file, no run on record, or no step released
    yet (such a run is replaced by the next one). The file is opened as a
    :class:`Checkpoint` and closed again, so it raises what opening it raises.
    """
    if not os.path.exists(path):
        return None
    with Checkpoint(path, fsync=False, allow_readable=allow_readable) as ckpt:
        record = ckpt.load()
    if record is None or record.steps == 0:
        return None
    try:
        params = json.loads(record.params)
    except (ValueError, RecursionError):  # (review 103: nested too deeply, edited)
        return None
    return params if isinstance(params, dict) else None


#: What a recorded parameter is, in the words of the command's options, where its name
#: is not the option's (the others are ``--name-with-dashes``).
_PARAM_WORDS = {
    "tau": "the noise scale (the budget: --epsilon/--delta, --rho or --tau)",
    "domain_sha256": "--domain (its items)",
    "unbounded": "--horizon (given or not)",
    "truncation": "the truncation rule (of the dpstream that began the stream)",
    "blt": "the BLT counter (--counter, --blt-buffers)",
    "input_format": "the input's format (--input-format)",
    "output_format": "the output's format (--output-format; a suffix in capitals, such as "
    "out.CSV, named JSON Lines before dpstream 0.3: give --output-format jsonl to go on)",
    "step_seconds": "--step",
    "step_months": "--step",
    "lateness_seconds": "--lateness",
    "time_zone": "the time zone of --start",
    "stream_scope": "how --start, --step or --lateness are written (their text is part of "
    "the noise scope: write them as the stream's first run did)",
}


#: a batch (run of the stream) still open that released no step
_UNRELEASED = "until IS NULL AND first_t > (SELECT COALESCE(MAX(t), 0) FROM steps)"


def param_words(name: str) -> str:
    """A recorded parameter's name as the command's options spell it."""
    return _PARAM_WORDS.get(name, "--" + name.replace("_", "-"))


class Checkpoint:
    """An open state file. Use :meth:`load`, then :meth:`start` or :meth:`verify`.

    Args:
        path: the SQLite file (created with mode 0600 if missing; an existing
            file that group or others can read is refused with
            :class:`PermissionError`, unless ``allow_readable``).
        fsync: ``synchronous=FULL`` (durable against power loss) when true,
            ``NORMAL`` (durable against a killed process) when false.
    """

    def __init__(self, path: str, *, fsync: bool = True, allow_readable: bool = False) -> None:
        self.path = path
        if os.path.exists(path) and not os.path.isfile(path):  # (links followed)
            raise StateError(
                f"state file {path!r} is not a regular file (a directory, a device or a "
                "pipe): give --state a file"
            )
        if not allow_readable:
            check_private_file(path, "state file", flag="--allow-readable-state")
        old_umask = os.umask(0o077)  # the database and its -wal/-shm files: owner only
        try:
            if os.path.islink(path) and not os.path.exists(path):
                raise StateError(
                    f"state file {path!r} is a symbolic link to {os.readlink(path)!r}, which "
                    "does not exist: give the path of the state itself, or create the file "
                    "it points to"
                )
            if not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self._db = sqlite3.connect(path, isolation_level=None, timeout=0.0)
            crashpoints.watch(self._db)  # test-only; inert unless DPSTREAM_TEST_KILL_AT
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._refuse_another_database()  # before it is changed in any way
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":  # e.g. a file system without shared memory
                self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise StateError(
                    f"state file {path!r} is in use by another run: let it finish "
                    "(an overlapping job), then run this command again"
                ) from None
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise StateError(
                    f"state file {path!r} is read-only: dpstream must write to "
                    "it to record each step"
                ) from None
            raise StateError(f"cannot use state file {path!r}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state file {path!r} is not a dpstream state ({exc})") from None
        finally:
            os.umask(old_umask)

    def _refuse_another_database(self) -> None:
        """Refuse a SQLite database with tables that is not a dpstream state (an
        application's, given to --state by mistake) before its journal mode or tables
        are touched: a new (empty) database, or one with dpstream's ``run`` table (of
        any schema version: :meth:`load` reads which), is a state."""
        tables = {
            name
            for (name,) in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            ).fetchall()
        }
        made = self._db.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('view', 'trigger') "
            "OR (type = 'table' AND sql LIKE 'CREATE VIRTUAL%')"
        ).fetchone()
        if made is not None:  # (review 103: a view of an endless query in place of the
            self._db.close()  # steps table hung the run, past Ctrl-C)
            raise StateError(
                f"state file {self.path!r} holds a {made[0]} {made[1]!r}, which dpstream "
                "never makes (edited?): refusing to use it"
            )
        if not tables:
            return
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(run)").fetchall()}
        if "schema_version" not in columns:
            self._db.close()
            raise StateError(
                f"state file {self.path!r} is a SQLite database of something else (no "
                "dpstream run in it); it was left as it was: give --state a new file, or "
                "the state of this stream"
            )

    # -- reading ---------------------------------------------------------------
    def load(self) -> RunRecord | None:
        """The recorded run, or ``None`` for a new state file."""
        try:
            row = self._db.execute(
                "SELECT schema_version, params, key_fingerprint, input, output, finished, "
                "summary FROM run WHERE id = 1"
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state file {self.path!r} is not a dpstream state ({exc})") from None
        if row is None:
            return None
        if row[0] != SCHEMA_VERSION:
            raise StateError(
                f"state file {self.path!r} was written by another version of dpstream "
                f"(schema {row[0]}; this one reads {SCHEMA_VERSION}): finish that run with "
                "the version that started it"
            )
        count, last_t = self._db.execute(
            "SELECT COUNT(*), COALESCE(MAX(t), 0) FROM steps"
        ).fetchone()
        last = self.step(last_t) if last_t else None
        try:
            summary = json.loads(row[6]) if row[6] else None
        except (ValueError, RecursionError):  # (review 103: nested too deeply, edited)
            summary = None
        return RunRecord(
            params=row[1],
            key_fingerprint=row[2],
            input=row[3],
            output=row[4],
            finished=row[5],
            last_t=int(last_t),
            last_begin=last.begin if last else 0,
            last_end=last.end if last else 0,
            steps=int(count),
            summary=summary if isinstance(summary, dict) else None,
        )

    def step(self, t: int) -> StepRecord | None:
        """Step t as recorded, or ``None``."""
        row = self._db.execute(
            "SELECT begin_offset, end_offset, release_mac, input_mac, input_line FROM steps "
            "WHERE t = ?",
            (t,),
        ).fetchone()
        if row is None:
            return None
        with self._values("steps"):
            return StepRecord(int(row[0]), int(row[1]), row[2], row[3], int(row[4]))

    def snapshot(self) -> tuple[int, bytes] | None:
        """``(t, data)`` of the mechanism saved after step t, or None."""
        row = self._db.execute("SELECT t, data FROM snapshot WHERE id = 1").fetchone()
        if row is None:
            return None
        with self._values("snapshot"):
            if not isinstance(row[1], bytes):  # (bytes(n) of a number n allocates n bytes)
                raise TypeError(f"its data is {type(row[1]).__name__}, not bytes")
            return int(row[0]), bytes(row[1])

    @contextlib.contextmanager
    def _values(self, table: str) -> Iterator[None]:
        """Values read from ``table`` that are not of the kinds dpstream writes (a state
        edited by hand: text where a number goes): one StateError naming the file."""
        try:
            yield
        except (ValueError, TypeError) as exc:
            raise StateError(
                f"state file {self.path!r} holds a value in its {table} that dpstream "
                f"never writes ({exc}): edited or damaged? refusing to go on"
            ) from None

    def run_id(self) -> str:
        """A random identifier of the recorded run (bound into its snapshots)."""
        row = self._db.execute("SELECT run_id FROM run WHERE id = 1").fetchone()
        return "" if row is None else str(row[0])

    def replaced_runs(self) -> list[str]:
        """The run ids of the runs this state recorded and replaced before any of them had
        a step on record (:meth:`start` with ``replace``): each may have recorded its
        scope and first step in the release ledger before a kill, so a later run of the
        state may share them (two kills at the first step in a row left the second's run
        id in the state and the first's in the ledger, and the stream was refused)."""
        with self._values("replaced"):
            return [str(r[0]) for r in self._db.execute("SELECT run_id FROM replaced")]

    def batches(self) -> list[tuple[int, str, str | None, int, int | None]]:
        """``(n, input, input_mac, first_t, until)`` of every run of the stream, in order
        (``until`` is None for a run that has not finished its steps)."""
        with self._values("batches"):
            return [
                (int(r[0]), r[1], r[2], int(r[3]), None if r[4] is None else int(r[4]))
                for r in self._db.execute(
                    "SELECT n, input, input_mac, first_t, until FROM batches ORDER BY n"
                )
            ]

    def verify(
        self,
        record: RunRecord,
        *,
        params: str,
        key_fingerprint: str,
        input: str | None,
        output: str,
    ) -> None:
        """Refuse (:class:`StateError`) to resume a run with another key or parameters."""
        if record.key_fingerprint != key_fingerprint:
            raise StateError(
                f"state file {self.path!r} belongs to a run with key fingerprint "
                f"{record.key_fingerprint}, not {key_fingerprint}: refusing to resume "
                "with another key"
            )
        if record.params != params:
            old, new = json.loads(record.params), json.loads(params)
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            if len(diff) > 1 and "stream_scope" in diff:  # the text of another option
                diff.remove("stream_scope")  # that differs, named by that option
            words = list(dict.fromkeys(param_words(k) for k in diff))  # each option once
            if "--horizon" in words:  # --horizon itself, whether given or not
                words = [w for w in words if w != "--horizon (given or not)"]
            calibrated = old.get("epsilon") is not None or old.get("rho") is not None
            if diff == ["tau"] and calibrated and None not in (old.get("tau"), new.get("tau")):
                # review 96: the same budget options, another noise scale: this dpstream
                # calibrates them otherwise than the one that began the stream
                raise StateError(
                    f"state file {self.path!r} belongs to a run whose noise scale was "
                    f"{old['tau']!r}; this dpstream calibrates the same budget options to "
                    f"{new['tau']!r} (a version that changed the calibration began the "
                    "stream): refusing to resume with other noise; go on with the "
                    "version that began it"
                )
            raise StateError(
                f"state file {self.path!r} belongs to a run with other parameters "
                f"(differs in: {', '.join(words)}): refusing to "
                "resume; a stream's parameters are fixed at its first run"
            )
        if input is not None and record.input != input:
            raise StateError(
                f"state file {self.path!r} belongs to a run reading {record.input!r}, not "
                f"{input!r}: it stopped before its end, so run its command again with "
                "that input first (the same bytes finish it); to finish it from a "
                "corrected file instead, add --replace-unfinished. A new state or --force "
                "would release its steps again from other data"
            )
        if record.output != output:
            raise StateError(
                f"state file {self.path!r} belongs to a run writing {record.output!r}, "
                f"not {output!r}"
            )

    # -- writing ---------------------------------------------------------------
    def start(
        self, *, params: str, key_fingerprint: str, input: str, output: str, replace: bool = False
    ) -> None:
        """Record a new run (one transaction).

        Args:
            replace: replace a recorded run that has no step on record (it
                wrote nothing: a step is recorded before its release is
                written). A run with a step on record is never replaced
                (:class:`StateError`). Its run id is kept (:meth:`replaced_runs`).
        """
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self._transaction():
            if replace:
                committed = self._db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
                if committed:
                    raise StateError(
                        f"state file {self.path!r} records {committed} released "
                        "steps: its run cannot be replaced"
                    )
                old = self.run_id()
                if old:  # the ledger may hold its first step
                    self._db.execute("INSERT OR IGNORE INTO replaced VALUES (?)", (old,))
                self._db.execute("DELETE FROM run")
                self._db.execute("DELETE FROM batches WHERE until IS NULL")  # it wrote nothing
            self._db.execute(
                "INSERT INTO run (id, schema_version, params, key_fingerprint, input, output, "
                "created, run_id) VALUES (1, ?, ?, ?, ?, ?, ?, ?)",
                (
                    SCHEMA_VERSION,
                    params,
                    key_fingerprint,
                    input,
                    output,
                    now,
                    secrets.token_hex(16),
                ),
            )

    def commit(
        self, t: int, *, begin: int, end: int, release_mac: str, input_mac: str, input_line: int = 0
    ) -> None:
        """Record step t (one transaction, durable when this returns).

        Call it *before* writing the step's release to the output (see the
        module docstring: write-ahead). ``input_line`` is the last input line
        read when the step closed (a following run closes steps on the clock:
        a record of the step after that line came too late, on resume too).
        """
        with self._transaction():
            self._db.execute(
                "INSERT INTO steps (t, begin_offset, end_offset, release_mac, input_mac, "
                "input_line) VALUES (?, ?, ?, ?, ?, ?)",
                (t, begin, end, release_mac, input_mac, input_line),
            )

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Mark the run finished: running it again releases nothing."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self._transaction():
            self._db.execute(
                "UPDATE run SET finished = ?, summary = ? WHERE id = 1",
                (now, canonical_json(dict(summary))),
            )

    def last_step(self) -> int:
        """The last step on record (0 for none)."""
        return int(self._db.execute("SELECT COALESCE(MAX(t), 0) FROM steps").fetchone()[0])

    def drop_batch(self, n: int) -> None:
        """Forget run ``n`` of the stream if it released no step (a run that stopped on an
        error before its first release leaves the state as it found it)."""
        with self._transaction():
            self._db.execute(f"DELETE FROM batches WHERE n = ? AND {_UNRELEASED}", (n,))

    def begin_batch(self, *, input: str, input_mac: str | None, first_t: int) -> int:
        """Record that a run of the stream starts at step ``first_t`` with this input.

        A run that stopped before releasing any step (its batch open, no step of it on
        record) is forgotten in the same transaction: this one takes its place. It is
        forgotten here, not when the new run starts, so that a run refused before its
        first release (by the release ledger, say) leaves the state as it found it."""
        with self._transaction():
            self._db.execute(f"DELETE FROM batches WHERE {_UNRELEASED}")
            cur = self._db.execute(
                "INSERT INTO batches (input, input_mac, first_t) VALUES (?, ?, ?)",
                (input, input_mac, first_t),
            )
            if cur.lastrowid is None:  # pragma: no cover - an INSERT always sets it
                raise RuntimeError("the state database gave no id for the new batch")
            return int(cur.lastrowid)

    def end_batch(
        self,
        n: int | None,
        until: int,
        snapshot: bytes | None,
        *,
        summary: Mapping[str, Any] | None = None,
        finished: bool = False,
        input: Any = None,
    ) -> None:
        """Record that run ``n`` of the stream released every step up to ``until``: its
        summary, the end of its batch, the mechanism's state after it and, with
        ``finished``, the end of the stream, in one transaction (all or none: see
        "Kill points" in the module docstring). ``input`` (its ``input`` and
        ``input_mac``): the input that replaced the batch's own (``--replace-unfinished``
        after the batch released steps), recorded as the batch's."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self._transaction():
            if summary is not None:
                self._db.execute(
                    "UPDATE run SET summary = ? WHERE id = 1", (canonical_json(dict(summary)),)
                )
            if finished:
                self._db.execute("UPDATE run SET finished = ? WHERE id = 1", (now,))
            if n is not None:
                self._db.execute("UPDATE batches SET until = ? WHERE n = ?", (until, n))
            if n is not None and input is not None:
                self._db.execute(
                    "UPDATE batches SET input = ?, input_mac = ? WHERE n = ?",
                    (input.input, input.input_mac, n),
                )
            if snapshot is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO snapshot (id, t, data) VALUES (1, ?, ?)",
                    (until, snapshot),
                )

    def set_summary(self, summary: Mapping[str, Any]) -> None:
        """Record the summary of a run that stopped at a public end step (``--until``)."""
        with self._transaction():
            self._db.execute(
                "UPDATE run SET summary = ? WHERE id = 1", (canonical_json(dict(summary)),)
            )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db, self.path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (or ROLLBACK), with a full disk or a read-only file
    reported as what it is."""

    def __init__(self, db: sqlite3.Connection, path: str) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _plain_error(exc, self._path) from None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.OperationalError as commit_exc:
                exc = commit_exc
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.OperationalError):
            raise _plain_error(exc, self._path) from None
        if isinstance(exc, sqlite3.Error):  # a constraint or trigger (review 99: edited)
            raise StateError(
                f"state file {self._path!r} refused a write ({exc}): is it dpstream's, as "
                "it wrote it (edited by hand?)"
            ) from None
        if exc_type is None:  # the COMMIT failed with another error
            raise exc  # type: ignore[misc]


def _plain_error(exc: sqlite3.OperationalError, path: str) -> Exception:
    """A full disk or a read-only state file, in the user's words."""
    text = str(exc).lower()
    if "full" in text:
        return StateError(
            f"the disk holding the state file {path!r} is full: nothing of the "
            "step in progress was written; free some space and run the same "
            "command again to resume"
        )
    if "readonly" in text or "read-only" in text:
        return StateError(
            f"state file {path!r} is read-only: dpstream must write to it to "
            "record each step (check its permissions and its directory's)"
        )
    return StateError(f"state file {path!r}: {exc}")
