"""The crash-safe checkpoint of ``dpstream run --state FILE.sqlite``.

Layer 6 of dpstream (the edges); stdlib ``sqlite3`` only.

Why a replay log and not a pickled mechanism
--------------------------------------------
Every mechanism is a deterministic function of the key and the stream: all its
noise is keyed (``dpstream.noise``), so feeding the same events again rebuilds
exactly the same state and the same releases. The checkpoint therefore stores
no mechanism internals (which would tie the file to one version's classes);
it stores what is needed to *prove* that a resumed run continues the same run:

* ``run``: the run's parameters as canonical JSON (mechanism, horizon, budget,
  options, a digest of the domain, formats), the key's public fingerprint
  (:meth:`dpstream.NoiseKey.fingerprint`), the input's and output's paths, and
  whether the run finished (with a summary, including how many input records
  it read, so that a finished run can tell when its input has grown);
* ``steps``: per committed time step t, the output file's byte offset just
  after the step's release was written (and flushed and fsynced), the SHA-256
  of that release's bytes, the SHA-256 of the step's input records, and the
  number of events.

Each step is committed in its own transaction, after its release reached the
output file. Resuming (see ``dpstream.cli``) refuses a different key or
parameters, checks that the output file still holds the last committed
step's release, truncates it to the last committed offset (so a
release written but not committed is written once, not twice), replays the
committed steps with output suppressed while checking that each recomputed
release and each step's input have the stored digests (a changed input is an
error), and continues after the last committed step. A finished run is never
released again. A run with no committed step released nothing, so it may be
replaced by a run with other parameters (``start(replace=True)``).

The database uses WAL journaling with ``synchronous=FULL`` (or ``NORMAL``
with ``fsync=False``: still safe against a killed process, not against a
power loss) and an exclusive lock, so two runs cannot share one state file.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import StateError

__all__ = ["Checkpoint", "RunRecord", "canonical_json", "sha256_hex"]

SCHEMA_VERSION = 1

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
    summary TEXT
);
CREATE TABLE IF NOT EXISTS steps (
    t INTEGER PRIMARY KEY,
    output_offset INTEGER NOT NULL,
    release_sha256 TEXT NOT NULL,
    input_sha256 TEXT NOT NULL,
    events INTEGER NOT NULL
);
"""


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces: equal parameters give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint says about its run."""

    params: str
    key_fingerprint: str
    input: str
    output: str
    finished: str | None
    last_t: int
    last_offset: int
    steps: int
    events: int
    summary: dict[str, Any] | None = None


class Checkpoint:
    """An open state file. Use :meth:`load`, then :meth:`start` or :meth:`verify`.

    Args:
        path: the SQLite file (created if missing).
        fsync: ``synchronous=FULL`` (durable against power loss) when true,
            ``NORMAL`` (durable against a killed process) when false.
    """

    def __init__(self, path: str, *, fsync: bool = True) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None, timeout=0.0)
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":  # e.g. a file system without shared memory
                self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise StateError(f"state file {path!r} is in use by another run") from None
            raise StateError(f"cannot use state file {path!r}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state file {path!r} is not a dpstream state ({exc})") from None

    # -- reading ---------------------------------------------------------------
    def load(self) -> RunRecord | None:
        """The recorded run, or ``None`` for a new state file."""
        row = self._db.execute(
            "SELECT schema_version, params, key_fingerprint, input, output, finished, summary "
            "FROM run WHERE id = 1"
        ).fetchone()
        if row is None:
            return None
        if row[0] != SCHEMA_VERSION:
            raise StateError(
                f"state file {self.path!r} has schema version {row[0]}, "
                f"this dpstream reads {SCHEMA_VERSION}"
            )
        agg = self._db.execute(
            "SELECT COUNT(*), COALESCE(MAX(t), 0), COALESCE(SUM(events), 0) FROM steps"
        ).fetchone()
        last_offset = 0
        if agg[1]:
            last_offset = self._db.execute(
                "SELECT output_offset FROM steps WHERE t = ?", (agg[1],)
            ).fetchone()[0]
        try:
            summary = json.loads(row[6]) if row[6] else None
        except ValueError:
            summary = None
        return RunRecord(params=row[1], key_fingerprint=row[2], input=row[3], output=row[4],
                         finished=row[5], last_t=int(agg[1]), last_offset=int(last_offset),
                         steps=int(agg[0]), events=int(agg[2]),
                         summary=summary if isinstance(summary, dict) else None)

    def step(self, t: int) -> tuple[int, str, str] | None:
        """``(output_offset, release_sha256, input_sha256)`` of committed step t, or None."""
        row = self._db.execute(
            "SELECT output_offset, release_sha256, input_sha256 FROM steps WHERE t = ?", (t,)
        ).fetchone()
        return None if row is None else (int(row[0]), row[1], row[2])

    def verify(self, record: RunRecord, *, params: str, key_fingerprint: str, input: str,
               output: str) -> None:
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
            raise StateError(
                f"state file {self.path!r} belongs to a run with other parameters "
                f"(differs in: {', '.join(diff)}): refusing to resume"
            )
        if record.input != input:
            raise StateError(
                f"state file {self.path!r} belongs to a run reading {record.input!r}, "
                f"not {input!r}"
            )
        if record.output != output:
            raise StateError(
                f"state file {self.path!r} belongs to a run writing {record.output!r}, "
                f"not {output!r}"
            )

    # -- writing ---------------------------------------------------------------
    def start(self, *, params: str, key_fingerprint: str, input: str, output: str,
              replace: bool = False) -> None:
        """Record a new run (one transaction).

        Args:
            replace: replace a recorded run that has no committed step (it
                released nothing). A run with a committed step is never
                replaced (:class:`StateError`).
        """
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self._transaction():
            if replace:
                committed = self._db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
                if committed:
                    raise StateError(f"state file {self.path!r} records {committed} released "
                                     "steps: its run cannot be replaced")
                self._db.execute("DELETE FROM run")
            self._db.execute(
                "INSERT INTO run (id, schema_version, params, key_fingerprint, input, output, "
                "created) VALUES (1, ?, ?, ?, ?, ?, ?)",
                (SCHEMA_VERSION, params, key_fingerprint, input, output, now),
            )

    def commit(self, t: int, *, offset: int, release_sha256: str, input_sha256: str,
               events: int) -> None:
        """Record step t as released (one transaction, durable when this returns)."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO steps (t, output_offset, release_sha256, input_sha256, events) "
                "VALUES (?, ?, ?, ?, ?)",
                (t, offset, release_sha256, input_sha256, events),
            )

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Mark the run finished: running it again releases nothing."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self._transaction():
            self._db.execute("UPDATE run SET finished = ?, summary = ? WHERE id = 1",
                             (now, canonical_json(dict(summary))))

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
