"""The records ``--follow`` holds for steps that are not due yet, within ``--memory``.

Layer 6 of dpstream (used by :mod:`dpstream.run.follow`); stdlib only.

A followed input's record waits for its step to fall due (its step comes from its
own timestamp on the public clock). Every record of a step that is open, or dated
ahead of the clock, was kept as an object in memory, without a limit: a million
lines dated a century ahead, appended by anyone who can write to the log, took the
follower from 62 MB to 625 MB (review 115). :class:`PendingRecords` holds them in
memory up to ``--memory`` (an estimate of their size), and past it moves them all to
a private temporary SQLite database (``sqlite3.connect("")``: a file SQLite removes
from the disk when it opens it, so no kill leaves the input's bytes behind), from
which a step's records come back, in input order, when it falls due. Which records a
step holds, and so every release, is the same either way.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..io.records import RawEvent

__all__ = ["PendingRecords"]

#: bytes a held record takes beyond its raw line and items (the object, its tuple,
#: the lists and dict that hold it), an estimate on the high side
_OVERHEAD = 400
_PER_ITEM = 60


def _size(rec: RawEvent) -> int:
    items = rec.items or ()
    return (
        _OVERHEAD
        + 2 * len(rec.raw or b"")
        + sum(_PER_ITEM + len(i) for i in items)
        + len(rec.user or "")
    )


class PendingRecords:
    """Valid records by step, for the steps not yet released (see the module)."""

    def __init__(self, budget: int) -> None:
        self._budget = max(0, int(budget))
        self._mem: dict[int, list[RawEvent]] = {}
        self._held = 0  # estimated bytes of the records in memory
        self._db: sqlite3.Connection | None = None
        self.spilled = 0  # records moved to the database so far (for the tests)

    def add(self, rec: RawEvent) -> None:
        """Hold ``rec`` (a valid record with its step) until its step is taken."""
        assert rec.t is not None
        self._mem.setdefault(rec.t, []).append(rec)
        self._held += _size(rec)
        if self._held > self._budget:
            self._spill()

    def pop(self, t: int) -> list[RawEvent]:
        """The records held for step ``t``, in input order, no longer held."""
        recs = self._mem.pop(t, [])
        self._held -= sum(map(_size, recs))
        if self._db is None:
            return recs
        rows = self._db.execute(
            "SELECT line, items, user, raw FROM pending WHERE t = ? ORDER BY line", (t,)
        ).fetchall()
        if not rows:
            return recs
        self._db.execute("DELETE FROM pending WHERE t = ?", (t,))
        stored = [
            RawEvent(line=line, t=t, items=tuple(json.loads(items)), user=user, raw=raw)
            for line, items, user, raw in rows
        ]
        # records held in memory were read after those moved to the database
        return sorted([*stored, *recs], key=lambda r: r.line)

    def _spill(self) -> None:
        """Move every record held in memory to the database."""
        if self._db is None:
            self._db = sqlite3.connect("", isolation_level=None)  # private, unlinked
            self._db.execute("PRAGMA journal_mode = OFF")
            self._db.execute("PRAGMA cache_size = -8192")  # 8 MB of pages at most
            self._db.execute(
                "CREATE TABLE pending (t INTEGER, line INTEGER, items TEXT, user TEXT, raw BLOB)"
            )
            self._db.execute("CREATE INDEX by_step ON pending (t, line)")
        rows = [
            (t, r.line, json.dumps(list(r.items or ())), r.user, r.raw)
            for t, recs in self._mem.items()
            for r in recs
        ]
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO pending VALUES (?, ?, ?, ?, ?)", rows)
        self._db.execute("COMMIT")
        self.spilled += len(rows)
        self._mem.clear()
        self._held = 0

    def close(self) -> None:
        """Drop what is held (the database's file goes with its connection)."""
        self._mem.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> PendingRecords:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
