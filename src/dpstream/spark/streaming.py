"""A Spark Structured Streaming release on a public clock.

The clock is public: which steps are released never depends on the data.
Every event carries its time step in a column (``step_col``, e.g. computed by
the source from an event timestamp and a public step width), and the query
only *stages* the events of each micro-batch by step. Steps are released by
:meth:`StreamRelease.release_through`, called with a public end step (from a
scheduler when a step's window has closed, or by a :class:`StepClock` thread
that derives the step from the wall clock): every step up to it is released,
with events or without. A trigger window with no new data makes no
micro-batch in Spark, so a clock of "micro-batches that had data" (the batch
id) would let the removal of a window's only event remove a step and shift
every later one; here it removes nothing but the event.

Late events. A step is marked *closing* (a marker file, written before its
events are read) when its release starts; an event that arrives for a
closing or released step is dropped, counted in :attr:`StreamRelease.dropped`
and logged (a decision about that event alone). Staging and releasing hold
one lock, so a micro-batch is staged wholly before or wholly after a step
closes, and a release that crashed is recomputed after a restart from exactly
the events it read the first time: a step is never released from other data.

State. The prefix counts live in per-step snapshots under ``state_path``
(default ``<checkpoint>/dpstream-state``): ``t=<t>/`` holds, for every item
seen (or every domain item), its count, its released flag, its noisy value
and its tree-noise state at t (prepared id and per-level noise sums), so the
next step takes one incremental noise step instead of hashing every item
again. Both paths give the local engine's noise bit for bit. Staged events
wait under ``staged/batch=<id>/step=<t>/``; a micro-batch that Spark replays
after a failure has the same input (Spark's guarantee for replayable sources)
and is not staged twice. The state holds true counts and raw events: it is as
private as the input (keep its directory readable by the job only).

A small metadata file (``dpstream.json``: the key's fingerprint and the
mechanism's parameters) is written on the first start; a restart with another
key or other parameters is refused (:class:`~dpstream.StateError`), because it
would release the same steps again with different noise.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import json
import logging
import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..clock import StepClock
from ..errors import StateError
from ..mechanisms.base import check_max_items
from .kernels import STATE_FLAG, STATE_IDS, state_noise_cols
from .releases import SparkKnownBase, SparkUnknownBase, spark_domain_tag, update_counts

if TYPE_CHECKING:
    from ..privacy import BudgetCap

try:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
    from pyspark.sql.streaming import StreamingQuery
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["start_stream", "stream_parameters", "StreamRelease", "StepClock"]

_log = logging.getLogger("dpstream.spark.streaming")

_META = "dpstream.json"
#: The Spark checkpoint the state staged its micro-batches with (its query id).
_CHECKPOINT = "checkpoint.json"
#: The stream's run id in the release ledger (with ``ledger=``).
_LEDGER_RUN = "ledger-run.json"
#: The ledger digests of a step released before a stream recorded its steps.
_UNRECORDED = "unrecorded"


class _FileSystem:
    """exists / delete / read / write on any Hadoop path (local, HDFS, S3) through the JVM."""

    def __init__(self, spark: Any) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, path: str) -> Any:
        p = self._jvm.org.apache.hadoop.fs.Path(path)
        return p, p.getFileSystem(self._conf)

    def exists(self, path: str) -> bool:
        p, fs = self._path(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> None:
        p, fs = self._path(path)
        if fs.exists(p):
            fs.delete(p, True)

    def read_text(self, path: str) -> str:
        p, fs = self._path(path)
        stream = fs.open(p)
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(line)
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

    def names(self, path: str) -> list[str]:
        """The names of the entries of directory ``path`` (none if it does not exist)."""
        p, fs = self._path(path)
        if not fs.exists(p):
            return []
        return [st.getPath().getName() for st in fs.listStatus(p)]

    def write_text(self, path: str, text: str) -> None:
        p, fs = self._path(path)
        out = fs.create(p, False)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()


def stream_parameters(mechanism: SparkKnownBase | SparkUnknownBase) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed (no secret: a key fingerprint)."""
    m = mechanism.mechanism
    params: dict[str, Any] = {
        "mechanism": type(m).mechanism_name,
        "key_fingerprint": mechanism.key_fingerprint,
        "horizon": m.horizon,
        "base": m.base,
        "max_items": m.max_items,
        "tau": float(m.tau).hex(),
        "stream": m.stream,
    }
    if getattr(m, "strategy", None) is not None:  # a BLT counter: its exact parameters
        params["counter"] = m.strategy.fingerprint()
    # the noise version, when not 1 (checkpoints from before versions drew version 1):
    # a checkpoint never goes on with noise of another version
    if getattr(m, "noise_version", 1) != 1:
        params["noise_version"] = m.noise_version
    if isinstance(mechanism, SparkKnownBase):  # its items (their fingerprint)
        params["domain"] = mechanism.domain_tag
    if isinstance(mechanism, SparkUnknownBase):
        params["threshold"] = float(mechanism.threshold).hex()
        params["threshold_rule"] = "per-step m_t"  # a checkpoint of m_delta runs must not resume
        params["remember"] = mechanism.remember
    return params


def _step_column(raw: Column, kind: Any) -> Column:
    """An event's step as a long, null where it is no whole number in range (dropped and
    counted as "no step", as the local engine refuses a step that is not an integer):
    a fractional, NaN, infinite or huge step of a float column would otherwise be
    truncated, or fail the cast (ANSI mode) and stop the query at every restart."""
    if isinstance(kind, T.IntegralType):
        return raw.cast("long")
    x = raw.cast("double")  # (a decimal too: its checks in doubles)
    # (x % 1 is NaN for NaN and the infinities, and never overflows as floor's long does)
    whole = x.between(-(2**53), 2**53) & ((x % F.lit(1.0)) == F.lit(0.0))
    return F.when(whole, x.cast("long"))


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class StreamRelease:
    """A running streaming release: events are staged by step; steps are released on a clock.

    Made by :func:`start_stream`. :meth:`release_through` releases every step
    up to a public end step; a :class:`StepClock` given to :func:`start_stream`
    calls it from a background thread as steps fall due.
    """

    def __init__(
        self,
        mechanism: SparkKnownBase | SparkUnknownBase,
        events: DataFrame,
        *,
        output_path: str,
        checkpoint_location: str,
        domain: DataFrame | None,
        state_path: str | None,
        items_col: str,
        step_col: str,
        output_format: str,
        round_counts: bool = True,
        ledger: str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        budget_cap: BudgetCap | None = None,
    ) -> None:
        known = isinstance(mechanism, SparkKnownBase)
        if not known and not isinstance(mechanism, SparkUnknownBase):
            raise TypeError(
                "mechanism must be a SparkKnownBase or SparkUnknownBase, got "
                f"{type(mechanism).__name__}"
            )
        if mechanism.user_bounds is not None:
            raise ValueError(
                "user-level privacy (max_items_per_user=) is not available for "
                "streaming releases yet: use SparkKnownBase/SparkUnknownBase.run "
                "or `dpstream run --state` (whose snapshots carry the bounds)"
            )
        if known and domain is None:
            raise ValueError(
                "the known-domain histogram needs domain=, a DataFrame listing the domain's items"
            )
        if not known and domain is not None:
            raise ValueError(
                "domain= is for the known-domain histogram only (the unknown-domain "
                "histogram discovers its items)"
            )
        if not events.isStreaming:
            raise ValueError("events must be a streaming DataFrame (spark.readStream...)")
        if step_col not in events.columns:
            raise ValueError(
                f"events have no step column {step_col!r}: every event needs its "
                "time step (the public clock), e.g. from its timestamp with "
                "StepClock.step_of"
            )
        step_type = events.schema[step_col].dataType
        if not isinstance(step_type, (T.IntegralType, T.FractionalType)):
            raise ValueError(
                f"the step column {step_col!r} holds {step_type.simpleString()}, not numbers: "
                "give each event its step as an integer (e.g. from its timestamp with "
                "StepClock.step_of)"
            )
        self.mechanism, self.known = mechanism, known
        self.spark = events.sparkSession
        self.fs = _FileSystem(self.spark)
        self.output_path, self.output_format = output_path, output_format
        self.round_counts = bool(round_counts)
        self.items_col, self.step_col = items_col, step_col
        self.items_type = events.schema[items_col].dataType
        self.state = state_path or _join(checkpoint_location, "dpstream-state")
        self.staged = _join(self.state, "staged")
        self.dropped: Counter = Counter()
        self.query: StreamingQuery | None = None
        self._lock = threading.RLock()
        self._clock_stop = threading.Event()
        self._clock_thread: threading.Thread | None = None
        if ledger is None and (dataset is not None or budget_cap is not None):
            raise ValueError(
                "dataset= and budget_cap= count the stream's cost in a release ledger: "
                "give ledger= too (the key file's KEY-FILE.ledger, which `dpstream run` "
                "keeps)"
            )
        item_col, count_col = mechanism.item_col, mechanism.count_col
        self.noise_cols = state_noise_cols(mechanism.spec.levels)
        self.state_cols = [*STATE_IDS, *self.noise_cols]
        reserved = {"released", "value", "_shown", STATE_FLAG, *self.state_cols}
        for name in (item_col, count_col):
            if name in reserved:
                raise ValueError(
                    f"column name {name!r} is used by the streaming state; "
                    "choose another item_col / count_col"
                )
        if dataset is not None and not isinstance(dataset, str):
            raise TypeError(f"dataset must be a str, got {type(dataset).__name__}")
        if (
            isinstance(mechanism, SparkKnownBase)
            and domain is not None  # (checked above: KnownBase has one)
            and spark_domain_tag(domain, item_col) != mechanism.domain_tag
        ):
            # review 98: the stream's table is built from this domain, the noise and the
            # restart check from the mechanism's
            raise ValueError(
                "domain= lists other items than the domain the mechanism was built with: "
                "give start_stream the mechanism's own domain"
            )
        # every check that can refuse runs before anything is written (review 98): the
        # meta of a new state is written once the ledger has taken the stream
        fresh_meta = self._check_meta()
        #: (ledger path, run id, noise scope) each step is recorded under (None: no ledger)
        self._ledger: tuple[str, str, str] | None = None
        if ledger is not None:
            self._claim_ledger(os.fspath(ledger), dataset, budget_cap)
        else:
            _log.warning(
                "a stream without ledger=: its cost is counted in no dataset's budget, and "
                "a second stream of the same key and stream name (with another state) is "
                "not refused; pass ledger= (the key file's KEY-FILE.ledger)"
            )
        if fresh_meta is not None:
            self.fs.write_text(_join(self.state, _META), fresh_meta)
        self.initial = None
        if domain is not None:  # KnownBase's, and only KnownBase's (checked above)
            self.initial = (
                domain.select(item_col)
                .distinct()
                .select(
                    item_col, F.lit(0).cast("long").alias(count_col), F.lit(False).alias("released")
                )
            )

    # -- state on disk ---------------------------------------------------------------
    def _check_meta(self) -> str | None:
        """Refuse a state written with other parameters; the meta to write for a new
        state (None: the state has one)."""
        params = stream_parameters(self.mechanism)
        meta = _join(self.state, _META)
        fresh = not self.fs.exists(meta)
        self._check_output(fresh)  # before a fresh state's first file is written
        if not fresh:
            stored = json.loads(self.fs.read_text(meta))
            if "domain" in params and "domain" not in stored:
                # a state from before the domain was kept (review 95): not checked (as
                # before); a new state keeps it
                stored["domain"] = params["domain"]
            if stored != params:
                diff = sorted(
                    k for k in set(stored) | set(params) if stored.get(k) != params.get(k)
                )
                if diff == ["noise_version"]:  # e.g. a checkpoint of 0.2, which drew version 1
                    raise StateError(
                        f"the state at {self.state!r} drew noise version "
                        f"{stored.get('noise_version', 1)}: build the mechanism "
                        f"with noise_version={stored.get('noise_version', 1)} to "
                        "go on with it (another version would release its steps "
                        "again with independent noise)"
                    )
                raise StateError(
                    f"the state at {self.state!r} was written with other "
                    f"{', '.join(diff)}; resuming would release its steps again "
                    "with other noise"
                )
            return None
        return json.dumps(params, sort_keys=True)

    def _claim_ledger(self, path: str, dataset: str | None, cap: BudgetCap | None) -> None:
        """Record the stream's noise scope and its cost in the release ledger at ``path``
        (a local file: the key's, ``KEY-FILE.ledger``, which ``dpstream run`` keeps),
        under a run id the state keeps, and refuse the stream
        (:class:`~dpstream.errors.LedgerError`, before anything is staged or released)
        when another run or stream released under the same key and noise scope: two
        streams of one key and stream name with other outputs and states would draw the
        same noise over other events.

        The cost (the mechanism's guarantee for the whole stream) is counted on
        ``dataset`` (default: the stream's name), with the command's runs on it, and
        refused (:class:`~dpstream.errors.BudgetCapError`) past ``cap``; a restarted
        stream is counted once, on the dataset it was first counted on."""
        import secrets

        from ..budget import DatasetSpend
        from ..ledger import LedgerError, ReleaseLedger
        from ..ledger_registry import check_ledger
        from ..privacy import Spend
        from ..run.scope import dataset_slip, noise_scope
        from ..words import plain_mechanism

        local = self.mechanism.mechanism
        id_file = _join(self.state, _LEDGER_RUN)
        if self.fs.exists(id_file):
            run_id = json.loads(self.fs.read_text(id_file))["run_id"]
        else:  # kept before it is claimed: a crash in between claims it at the restart
            run_id = secrets.token_hex(16)
            self.fs.write_text(id_file, json.dumps({"run_id": run_id}))
        scope = noise_scope(local, str(local.stream))
        check_ledger(local.key, path, None, default=False, record=True)
        words = plain_mechanism(local.privacy.mechanism)
        spend = DatasetSpend(
            dataset=str(local.stream) if dataset is None else dataset,
            stream=str(local.stream),
            mechanism=words,
            spend=Spend.of(local.privacy, f"{local.stream}: {words}"),
            at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        ledger = ReleaseLedger(
            path, local.key, run_id, scope=scope, check_scope=True, budget=spend, cap=cap
        )
        try:
            on_record = ledger.dataset_name()
            if dataset is not None and on_record != dataset:
                raise LedgerError(
                    f"dataset={dataset!r}: this stream's cost is counted on dataset "
                    f"{on_record!r} (where it was first counted); give that one"
                )
            if ledger.needs_budget_line():
                slip = dataset_slip(spend.dataset, {x.dataset for _, x in ledger.spends()})
                if slip is not None:
                    raise LedgerError(slip.replace("--dataset", "dataset="))
            others = ledger.others()
            if others:
                raise LedgerError(
                    f"the release ledger {path!r} records {len(others)} other run(s) or "
                    "stream(s) that released steps with the same key and settings: this "
                    "stream would draw the same noise over other events (the difference of "
                    "two releases of a step is its exact count difference). Give a new "
                    "stream a stream name (or key) of its own, or go on with the state "
                    "and checkpoint of the stream that released them"
                )
            ledger.claim_scope()
        finally:
            ledger.close()
        self._ledger = (path, run_id, scope)

    def _step_digests(self, t: int, written: DataFrame) -> tuple[str, str]:
        """Keyed digests of step t's counts (every item's count up to t: what the release
        is computed from) and of its release (the released items and values), for the
        release ledger. Each row's SHA-256 is cut into four 60-bit numbers that are
        summed over the rows (the order Spark holds them in does not matter), then the
        sums are MACed under a subkey of the noise key: the ledger holds no count."""
        item_col, count_col = self.mechanism.item_col, self.mechanism.count_col
        counted = F.sha2(
            F.to_json(F.struct(F.col(item_col).alias("i"), F.col(count_col).alias("c"))), 256
        )
        released = F.sha2(
            F.to_json(F.struct(F.col(item_col).alias("i"), F.col("value").alias("v"))), 256
        )

        def parts(digest: Column, name: str, where: Column | None = None) -> list[Column]:
            out = []
            for j in range(4):
                part = F.conv(F.substring(digest, 1 + 15 * j, 15), 16, 10).cast("decimal(38,0)")
                out.append(
                    F.sum(part if where is None else F.when(where, part)).alias(f"{name}{j}")
                )
            return out

        row = written.agg(
            F.count(F.lit(1)).alias("n"),
            F.count(F.when(F.col("released"), 1)).alias("m"),
            *parts(counted, "c"),
            *parts(released, "r", F.col("released")),
        ).collect()[0]
        subkey = self.mechanism.mechanism.key.derive("spark-stream-step/v1")

        def mac(kind: str, names: list[str]) -> str:
            text = " ".join([kind, str(t), *(str(row[n]) for n in names)])
            return hmac.new(subkey, text.encode("ascii"), hashlib.sha256).hexdigest()

        return (
            mac("counts", ["n", "c0", "c1", "c2", "c3"]),
            mac("release", ["m", "r0", "r1", "r2", "r3"]),
        )

    def _record_step(self, t: int, written: DataFrame) -> None:
        """Check step t against the release ledger and record it, before its release is
        written (review 113: a stream's folder copied whole, or restored from a backup
        with its state and output, went on under the same run id and released a step
        again from other events, with the same noise: the difference of the two releases
        was the exact count difference). A step on record from other counts is refused
        (:class:`~dpstream.ledger.LedgerError`); one recomputed after a crash from the
        same events is the same step. Steps a stream released before its steps were
        recorded (an older dpstream) are recorded as unknown: they cannot be checked."""
        if self._ledger is None:
            return
        from ..ledger import ReleaseLedger

        path, run_id, scope = self._ledger
        counts, release = self._step_digests(t, written)
        key = self.mechanism.mechanism.key
        with ReleaseLedger(path, key, run_id, scope=scope) as ledger:
            if ledger.last_t < t - 1:
                ledger.adopt((s, _UNRECORDED, _UNRECORDED) for s in range(ledger.last_t + 1, t))
            ledger.record(t, counts, release)

    def _published(self) -> tuple[list[int], list[int]]:
        """The steps ``output_path`` holds a folder of, and those whose release is complete."""
        steps = sorted(
            int(n[2:]) for n in self.fs.names(self.output_path) if n[:2] == "t=" and n[2:].isdigit()
        )
        out = self.output_path
        done = [t for t in steps if self.fs.exists(_join(_join(out, f"t={t}"), "_SUCCESS"))]
        return steps, done

    def _check_output(self, fresh: bool) -> None:
        """Refuse a state that is not the one ``output_path``'s releases were made with: a
        new state while the output holds releases (a changed or left-out ``state_path``,
        a deleted checkpoint whose folder held the state), or a state behind the output
        (restored from an older copy). Either would release those steps again under the
        same noise from other events: the difference of two releases of a step is then
        the exact difference of its counts."""
        steps, done = self._published()
        if fresh and steps:
            raise StateError(
                f"the output {self.output_path!r} holds releases up to step {steps[-1]}, "
                f"made with another state than {self.state!r}, which is new: releasing "
                "those steps again would draw the same noise over other events. Give the "
                "state_path the stream was released with (its default is under the first "
                "checkpoint_location), or a new output_path and stream name for a new stream"
            )
        if done and done[-1] > self.closing():
            raise StateError(
                f"the output {self.output_path!r} holds the release of step {done[-1]}, but "
                f"the state at {self.state!r} released only up to step {self.closing()} "
                "(restored from an older copy?): releasing those steps again would draw the "
                "same noise over other events; go on with the state the output was "
                "released with"
            )

    def _check_checkpoint(self, checkpoint_location: str) -> bool:
        """Refuse a Spark checkpoint other than the one this state staged its micro-batches
        with (their numbers would name other input: events counted twice or lost). Returns
        whether the state has yet to record the checkpoint's query id."""
        recorded_path = _join(self.state, _CHECKPOINT)
        recorded = (
            json.loads(self.fs.read_text(recorded_path))["id"]
            if self.fs.exists(recorded_path)
            else None
        )
        current = self._checkpoint_id(checkpoint_location)
        if recorded is not None and current is None and self.fs.exists(checkpoint_location):
            raise StateError(
                f"the Spark checkpoint at {checkpoint_location!r} has no metadata file (the "
                "query id the state recorded): it cannot be told from another checkpoint, "
                "whose micro-batches would be numbered over other input; restore the file"
            )
        if recorded is not None and current != recorded:
            raise StateError(
                f"the Spark checkpoint at {checkpoint_location!r} is not the one the state at "
                f"{self.state!r} staged its events with: its micro-batches are numbered "
                "over other input, so events would be counted twice or lost. Go on with "
                "the checkpoint the state was staged with"
            )
        staged = [b for b in self.fs.names(self.staged) if b.startswith("batch=")]
        done = [
            int(b[6:])
            for b in staged
            if b[6:].isdigit() and self.fs.exists(_join(_join(self.staged, b), "_SUCCESS"))
        ]
        planned = [
            int(n) for n in self.fs.names(_join(checkpoint_location, "offsets")) if n.isdigit()
        ]
        if done and max(done) > max(planned, default=-1):
            # Spark writes a micro-batch's offsets before the batch runs: a staged batch
            # the checkpoint has no offsets for means an older or partly deleted copy
            raise StateError(
                f"the state at {self.state!r} staged micro-batch {max(done)}, but the Spark "
                f"checkpoint at {checkpoint_location!r} knows batches only up to "
                f"{max(planned, default=-1)} (restored from an older copy, or partly "
                "deleted?): its next micro-batches would be numbered over other input, "
                "so events would be counted twice or lost"
            )
        if recorded is None and current is None and staged:
            raise StateError(
                f"the state at {self.state!r} holds staged events, but the Spark "
                f"checkpoint at {checkpoint_location!r} is new: its micro-batches would be "
                "numbered over the input again, so events would be counted twice or lost"
            )
        return recorded is None

    def _checkpoint_id(self, checkpoint_location: str) -> str | None:
        """The query id a Spark checkpoint holds (its ``metadata`` file's first line, which
        Spark writes as the query starts, before any micro-batch), or None if it has none."""
        meta = _join(checkpoint_location, "metadata")
        if not self.fs.exists(meta):
            return None
        return json.loads(self.fs.read_text(meta).strip().splitlines()[0]).get("id")

    def _record_checkpoint(self, checkpoint_location: str) -> None:
        """Record the checkpoint's query id in the state."""
        query_id = self._checkpoint_id(checkpoint_location)
        if query_id is not None:
            self.fs.write_text(_join(self.state, _CHECKPOINT), json.dumps({"id": query_id}))

    def _snapshot(self, t: int) -> str:
        return _join(self.state, f"t={t}")

    def closing(self) -> int:
        """The last step whose release has started (its late events are dropped)."""
        steps = [
            int(n[len("closing-") :])
            for n in self.fs.names(_join(self.state, "clock"))
            if n.startswith("closing-") and n[len("closing-") :].isdigit()
        ]
        return max(steps, default=0)

    def released(self) -> int:
        """The last step whose release is complete."""
        t = self.closing()
        if t and not self.fs.exists(_join(_join(self.output_path, f"t={t}"), "_SUCCESS")):
            return t - 1
        return t

    # -- staging (the query's foreachBatch) ------------------------------------------
    def _stage(self, batch: DataFrame, batch_id: int) -> None:
        target = _join(self.staged, f"batch={int(batch_id)}")
        with self._lock:
            if self.fs.exists(_join(target, "_SUCCESS")):
                return  # a replayed micro-batch: the same input, staged already
            closing, horizon = self.closing(), self.mechanism.horizon
            max_items = check_max_items(self.mechanism.max_items)
            step = _step_column(F.col(self.step_col), batch.schema[self.step_col].dataType)
            rows = batch.select(step.alias("step"), F.col(self.items_col).alias("items"))
            distinct = F.array_distinct(F.col("items"))
            # an invalid event is dropped and counted, as the local engine's default
            # (--on-invalid skip) does, not left to stop the release of its step (which
            # would stop the stream there for good, and publish where the event was)
            kind = (
                F.when(F.col("step").isNull() | (F.col("step") < 1), "no step")
                .when(F.col("step") > horizon, "past the horizon")
                .when(F.col("step") <= closing, "late (its step was already released)")
                .when(F.col("items").isNull(), "no items")
                .when(F.exists(distinct, lambda x: x.isNull()), "a null item")
                .when(F.size(distinct) > max_items, "more distinct items than max_items")
            )
            rows = rows.withColumn("_drop", kind)
            numbered = None
            if self.initial is not None:  # KnownBase: an item outside the domain
                # each event's id fixed once (cached), so both sides of the join agree
                numbered = rows.withColumn("_event", F.monotonically_increasing_id()).cache()
                rows = self._outside_domain(numbered)
            rows = rows.cache()
            try:
                for row in (
                    rows.where(F.col("_drop").isNotNull()).groupBy("_drop").count().collect()
                ):
                    self.dropped[row["_drop"]] += int(row["count"])
                    _log.warning(
                        "dropped %d events of micro-batch %d: %s",
                        row["count"],
                        batch_id,
                        row["_drop"],
                    )
                (
                    rows.where(F.col("_drop").isNull())
                    .select("step", "items")
                    .write.mode("overwrite")
                    .partitionBy("step")
                    .parquet(target)
                )
            finally:
                rows.unpersist()
                if numbered is not None:
                    numbered.unpersist()

    def _outside_domain(self, rows: DataFrame) -> DataFrame:
        """``rows`` (numbered by ``_event``) with the events that hold an item outside the
        domain marked to drop."""
        assert self.initial is not None
        item_col = self.mechanism.item_col
        items = rows.where(F.col("_drop").isNull()).select(
            "_event", F.explode(F.array_distinct(F.col("items"))).alias(item_col)
        )
        domain = self.initial.select(item_col)
        outside = items.join(domain, on=item_col, how="left_anti").select("_event").distinct()
        flagged = rows.join(outside.withColumn("_outside", F.lit(True)), on="_event", how="left")
        drop = F.coalesce(
            F.col("_drop"), F.when(F.col("_outside"), F.lit("an item outside the domain"))
        )
        return flagged.select("step", "items", drop.alias("_drop"))

    # -- releasing -------------------------------------------------------------------
    def release_through(self, until: int) -> list[int]:
        """Release every step after the last released one up to ``until`` (a public step).

        Returns the steps released now. Steps with no event are released like
        any other. Raises :class:`ValueError` for ``until`` past the horizon.
        """
        horizon = self.mechanism.horizon
        if isinstance(until, bool) or not isinstance(until, int) or not 0 <= until <= horizon:
            raise ValueError(f"until must be an int in 0..{horizon} (the horizon), got {until!r}")
        done: list[int] = []
        with self._lock:
            for t in range(self.released() + 1, until + 1):
                self._release_step(t)
                done.append(t)
        return done

    def _step_events(self, t: int) -> DataFrame:
        paths = [
            _join(_join(self.staged, b), f"step={t}")
            for b in self.fs.names(self.staged)
            if b.startswith("batch=") and self.fs.exists(_join(_join(self.staged, b), "_SUCCESS"))
        ]
        paths = [p for p in paths if self.fs.exists(p)]
        schema = T.StructType([T.StructField(self.items_col, self.items_type, True)])
        if not paths:
            return self.spark.createDataFrame([], schema)
        return (
            self.spark.read.schema(T.StructType([T.StructField("items", self.items_type, True)]))
            .parquet(*paths)
            .select(F.col("items").alias(self.items_col))
        )

    def _release_step(self, t: int) -> None:
        mech, spark, fs = self.mechanism, self.spark, self.fs
        if self.closing() < t:  # write-ahead: from now on, events of step t are late
            fs.write_text(_join(_join(self.state, "clock"), f"closing-{t}"), "")
        batch = self._step_events(t)
        item_col, count_col = mech.item_col, mech.count_col
        if t == 1:
            previous, prev_t = self.initial, 0
        else:
            if not fs.exists(_join(self._snapshot(t - 1), "_SUCCESS")):
                raise StateError(
                    f"the state of step {t - 1} is missing at {self._snapshot(t - 1)!r}"
                )
            previous, prev_t = spark.read.parquet(self._snapshot(t - 1)), t - 1
        remember = isinstance(mech, SparkUnknownBase) and mech.remember
        with_state = previous is not None and set(self.state_cols) <= set(previous.columns)
        carry = (["released"] if remember and previous is not None else []) + (
            self.state_cols if with_state else []
        )
        counts = update_counts(
            previous,
            batch,
            max_items=check_max_items(mech.max_items),
            items_col=self.items_col,
            item_col=item_col,
            count_col=count_col,
            closed=self.known,
            carry=carry,
        )
        cols = [F.col(item_col), F.col(count_col)]
        shown = None
        if remember and previous is not None:
            cols.append(F.coalesce(F.col("released"), F.lit(False)).alias("_shown"))
            shown = "_shown"
        if with_state:  # a new item has no state: a flag, and non-null fillers for Arrow
            cols.append(F.col(STATE_IDS[0]).isNotNull().alias(STATE_FLAG))
            cols += [F.coalesce(F.col(c), F.lit(0).cast("long")).alias(c) for c in STATE_IDS]
            cols += [F.coalesce(F.col(c), F.lit(0.0)).alias(c) for c in self.noise_cols]
        full = mech._stream_frame(
            t, prev_t, counts.select(*cols), shown_col=shown, with_state=with_state
        )
        full.write.mode("overwrite").parquet(self._snapshot(t))
        written = spark.read.parquet(self._snapshot(t))
        self._record_step(t, written)
        value = F.col("value")
        if self.round_counts:  # the safe output: the low-order bits of a float leak
            value = F.bround(value, 0).cast("long")
        (
            written.where(F.col("released"))
            .select(item_col, value.alias("value"))
            .write.mode("overwrite")
            .format(self.output_format)
            .save(_join(self.output_path, f"t={t}"))
        )
        if t >= 3:
            fs.delete(self._snapshot(t - 2))
        for b in fs.names(self.staged):  # events of released steps are not needed again
            if t >= 2 and b.startswith("batch="):
                fs.delete(_join(_join(self.staged, b), f"step={t - 1}"))
        mech.t = max(mech.t, t)

    # -- running ---------------------------------------------------------------------
    def start(
        self,
        *,
        trigger: dict[str, Any] | None,
        query_name: str | None,
        checkpoint_location: str,
        events: DataFrame,
        clock: StepClock | None,
        poll_seconds: float,
    ) -> StreamRelease:
        writer = events.writeStream.foreachBatch(self._stage).option(
            "checkpointLocation", checkpoint_location
        )
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        unrecorded = self._check_checkpoint(checkpoint_location)
        self.query = writer.start()
        if unrecorded:
            self._record_checkpoint(checkpoint_location)
        if clock is not None:
            horizon = self.mechanism.horizon

            def tick() -> None:
                while not self._clock_stop.wait(poll_seconds):
                    due = min(clock.due(_dt.datetime.now(_dt.timezone.utc)), horizon)
                    try:
                        self.release_through(due)
                    except Exception:  # noqa: BLE001 - logged; the next tick tries again
                        _log.exception("releasing up to step %d failed", due)

            self._clock_thread = threading.Thread(target=tick, name="dpstream-clock", daemon=True)
            self._clock_thread.start()
        return self

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """Wait for the staging query (Spark's name, for a drop-in StreamingQuery)."""
        if self.query is None:
            raise RuntimeError("the stream was not started (use start_stream)")
        # PySpark annotates timeout as int but takes seconds as any positive number
        return self.query.awaitTermination(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the clock thread and the staging query."""
        self._clock_stop.set()
        if self._clock_thread is not None:
            self._clock_thread.join()
        if self.query is not None:
            self.query.stop()


def start_stream(
    mechanism: SparkKnownBase | SparkUnknownBase,
    events: DataFrame,
    *,
    output_path: str,
    checkpoint_location: str,
    domain: DataFrame | None = None,
    state_path: str | None = None,
    items_col: str = "items",
    step_col: str = "t",
    output_format: str = "parquet",
    trigger: dict[str, Any] | None = None,
    query_name: str | None = None,
    clock: StepClock | None = None,
    poll_seconds: float = 5.0,
    round_counts: bool = True,
    ledger: str | os.PathLike[str] | None = None,
    dataset: str | None = None,
    budget_cap: BudgetCap | None = None,
) -> StreamRelease:
    """Start a streaming release: stage events by their step, release steps on a public clock.

    Args:
        mechanism: a :class:`SparkKnownBase` or :class:`SparkUnknownBase` (its
            parameters and key).
        events: a streaming DataFrame, one row per event, items in ``items_col``
            and the event's time step in ``step_col`` (an int >= 1).
        output_path: step t's release (item, value) goes to ``output_path/t=<t>/``,
            so ``spark.read.parquet(output_path)`` reads every step with a ``t``
            column.
        checkpoint_location: Spark's checkpoint directory (restart from it).
        domain: KnownBase only: a DataFrame whose item column lists the domain.
        state_path: where snapshots and staged events live (default
            ``<checkpoint_location>/dpstream-state``). As private as the input.
        output_format: any Spark batch format (parquet, json, csv, ...).
        trigger: keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "1 minute"}`` or ``{"availableNow": True}``.
        clock: release steps as they fall due on this wall clock, from a
            background thread polling every ``poll_seconds``; without it, call
            :meth:`StreamRelease.release_through` yourself (e.g. from a scheduler).
        round_counts: write counts rounded to integers (the default, and the safe
            choice: the low-order bits of floating-point noise leak the true
            count); False writes the exact floats, for testing.
        ledger: a release ledger (a local file; the key file's ``KEY-FILE.ledger``,
            which ``dpstream run`` keeps, to share it with the command's runs) in which
            the stream records its noise scope: a stream whose key, stream name and
            settings another run or stream of the ledger released under is refused.
            Without it nothing outside the stream's own state sees a second stream
            of the same key and stream name. The stream's cost (its guarantee for the
            whole stream) is recorded there too, on ``dataset``, so that ``dpstream
            budget`` and the command's ``--budget-cap`` count it with the runs of
            that dataset.
        dataset: with ``ledger``, the dataset the stream's cost is counted on
            (default: the stream name, ``mechanism.stream``).
        budget_cap: with ``ledger``, a :class:`~dpstream.privacy.BudgetCap` the
            dataset's total must stay within: a stream that would pass it is refused
            (:class:`~dpstream.errors.BudgetCapError`) before anything is staged.

    Returns:
        The running :class:`StreamRelease` (its ``query`` is the staging
        :class:`~pyspark.sql.streaming.StreamingQuery`).

    Raises:
        StateError: the state was written with another key or other parameters.
    """
    release = StreamRelease(
        mechanism,
        events,
        output_path=output_path,
        checkpoint_location=checkpoint_location,
        domain=domain,
        state_path=state_path,
        items_col=items_col,
        step_col=step_col,
        output_format=output_format,
        round_counts=round_counts,
        ledger=ledger,
        dataset=dataset,
        budget_cap=budget_cap,
    )
    return release.start(
        trigger=trigger,
        query_name=query_name,
        checkpoint_location=checkpoint_location,
        events=events,
        clock=clock,
        poll_seconds=poll_seconds,
    )
