"""The crash-safe checkpoint of ``dpstream run --state FILE.sqlite``.

Layer 6 of dpstream (the edges); stdlib ``sqlite3`` only. The keyed digests are
:mod:`.digests`, the SQLite store of the run and its steps :mod:`.checkpoint`.

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
* ``steps``: per time step t, where its release starts and ends in the output
  file, a keyed digest of the release's bytes and a keyed digest of the
  step's input records.

Write-ahead: a step is committed *before* its release is written
----------------------------------------------------------------
A step's row is committed (one transaction) before the first byte of its
release reaches the output. So every byte ever written belongs to a committed
step whose input digest is on record, and a resumed run that replays that
step refuses an input that changed: a step is never released twice from
different data (which, with the same keyed noise, would publish the exact
difference of the true counts). On resume the output is truncated to the end
of the step before the last one on record, after checking the bytes of that
step and that whatever follows is a prefix of the last step's release; the
last step is then written again, byte for byte the same.

Kill points: what the state means between any two statements
-------------------------------------------------------------
A run of a stream (a batch, ``--until``) goes through four states; a kill
leaves one of them, and the same command again finishes it:

1. *Nothing on record* (killed before ``begin_batch`` commits; the metadata
   sidecar is replaced atomically, with the same bytes): the run starts anew.
2. *Batch open, none of its steps on record*: it wrote nothing, so the next
   run drops the open batch and starts anew, with any input. A first batch's
   run is then replaced by a new one (a new run id); the state keeps the ids
   it replaced (its ``replaced`` table), since the release ledger may hold
   their scope and first step, recorded before the kill, and a run of the
   state may share them.
3. *Batch open, its steps first..k on record* (k <= ``--until``; step k's
   release maybe missing, partial or whole): the batch is finished only with
   the same input (its digest is on record), replayed from the snapshot
   before ``first`` with every step's digests checked, step k rewritten byte
   for byte. Every step written, the end record not yet committed, is this
   state too: the batch is not over until its end record commits.
4. *Batch ended*: its summary, its last step, the snapshot after it (or, at
   the horizon, the run's end) committed in one transaction
   (:meth:`Checkpoint.end_batch`), so no state lies between "every step
   written" and "ready for the next batch". The same command again has nothing
   to do; a later ``--until`` goes on from the snapshot.

No state draws new noise for a released step or releases one from other
data: a released step is only ever rewritten from a replay of its own input.
``tests/test_kill_points.py`` kills a batch before each of its statements and
at each of its writes (:mod:`dpstream._crashpoints`).

What the file reveals
---------------------
The state is as sensitive as the input and is treated so: it is created with
mode 0600, a group- or world-readable state file is refused, and every digest
is an HMAC-SHA256 under a subkey of the noise key (:class:`StateDigests`), so
a reader without the key cannot test guesses of the input against it (an
unkeyed digest of a step's records can be matched by brute force over a small
domain). No per-step event count is stored.

The database uses WAL journaling with ``synchronous=FULL`` (or ``NORMAL``
with ``fsync=False``: still safe against a killed process, not against a
power loss) and an exclusive lock, so two runs cannot share one state file.
"""

from __future__ import annotations

from .checkpoint import (
    SCHEMA_VERSION,
    Checkpoint,
    RunRecord,
    StepRecord,
    recorded_params,
    side_files,
)
from .digests import StateDigests, canonical_json, check_private_file, sha256_hex

__all__ = [
    "Checkpoint",
    "RunRecord",
    "StepRecord",
    "StateDigests",
    "canonical_json",
    "sha256_hex",
    "check_private_file",
    "recorded_params",
    "side_files",
    "SCHEMA_VERSION",
]
