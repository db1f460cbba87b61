"""A Spark Structured Streaming job: one micro-batch is one time step.

``start_stream`` runs a ``foreachBatch`` query over a streaming DataFrame of
events. Micro-batch ``batch_id`` is time step t = batch_id + 1: its events are
added to the prefix counts of step t - 1, and the release of step t is written
to ``output_path/t=<t>/``.

State. The prefix counts live in per-step snapshots under ``state_path``
(default ``<checkpoint>/dpstream-state``): ``t=<t>/`` holds, for every item
seen (or every domain item), its count, its released flag, its noisy value
and its tree-noise state at t: its prepared id (two 64-bit words) and its L
per-level noise sums (``TreeNoise.level_sums``, float64, stored exactly). The
next micro-batch rebuilds each item's ``TreeNoise`` from that state
(``TreeNoise.restore``) and takes one incremental step, preparing ids only
for new items, instead of hashing every item again and jumping its noise
from scratch. Both paths give the local engine's noise bit for bit.
Spark's checkpoint decides which batch runs next and with which input; a
batch that is replayed after a failure has the same batch_id and the same
input (Spark's guarantee for replayable sources), reads the same snapshot of
step t - 1 and therefore writes the same snapshot and the same release: the
noise is a function of the key and the address, never of the run. Snapshots
older than t - 1 are deleted once step t is written.

A small metadata file (``dpstream.json``: the key's fingerprint and the
mechanism's parameters) is written on the first start; a restart with another
key or other parameters is refused (:class:`~dpstream.StateError`), because it
would release the same steps again with different noise.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import HorizonExceededError, StateError
from .kernels import STATE_FLAG, STATE_IDS, state_noise_cols
from .releases import SparkKnownBase, SparkUnknownBase, update_counts

try:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql.streaming import StreamingQuery
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["start_stream", "stream_parameters"]

_META = "dpstream.json"


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
                self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(line)
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

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
    if isinstance(mechanism, SparkUnknownBase):
        params["threshold"] = float(mechanism.threshold).hex()
        params["threshold_rule"] = "per-step m_t"  # a checkpoint of m_delta runs must not resume
        params["remember"] = mechanism.remember
    return params


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def start_stream(
    mechanism: SparkKnownBase | SparkUnknownBase,
    events: DataFrame,
    *,
    output_path: str,
    checkpoint_location: str,
    domain: DataFrame | None = None,
    state_path: str | None = None,
    items_col: str = "items",
    output_format: str = "parquet",
    trigger: dict[str, Any] | None = None,
    query_name: str | None = None,
) -> StreamingQuery:
    """Start the streaming release: one micro-batch per time step.

    Args:
        mechanism: a :class:`SparkKnownBase` or :class:`SparkUnknownBase` (its
            parameters and key; its step counter is not used: Spark's batch id
            is the clock).
        events: a streaming DataFrame, one row per event, items in ``items_col``.
        output_path: step t's release (item, value) goes to ``output_path/t=<t>/``,
            so ``spark.read.parquet(output_path)`` reads every step with a ``t``
            column.
        checkpoint_location: Spark's checkpoint directory (restart from it).
        domain: KnownBase only: a DataFrame whose item column lists the domain.
        state_path: where the prefix-count snapshots live (default
            ``<checkpoint_location>/dpstream-state``). Holds true counts: as
            private as the input.
        output_format: any Spark batch format (parquet, json, csv, ...).
        trigger: keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "1 minute"}`` or ``{"availableNow": True}``.

    Returns:
        The running :class:`~pyspark.sql.streaming.StreamingQuery`.

    Raises:
        StateError: the state was written with another key or other parameters.
    """
    known = isinstance(mechanism, SparkKnownBase)
    if not known and not isinstance(mechanism, SparkUnknownBase):
        raise TypeError("mechanism must be a SparkKnownBase or SparkUnknownBase, got "
                        f"{type(mechanism).__name__}")
    if known and domain is None:
        raise ValueError("KnownBase needs domain=, a DataFrame listing the domain's items")
    if not known and domain is not None:
        raise ValueError("domain= is for KnownBase only (UnkBase discovers its items)")
    if not events.isStreaming:
        raise ValueError("events must be a streaming DataFrame (spark.readStream...)")
    spark = events.sparkSession
    fs = _FileSystem(spark)
    state = state_path or _join(checkpoint_location, "dpstream-state")
    params = stream_parameters(mechanism)
    meta = _join(state, _META)
    if fs.exists(meta):
        stored = json.loads(fs.read_text(meta))
        if stored != params:
            diff = sorted(k for k in set(stored) | set(params) if stored.get(k) != params.get(k))
            raise StateError(f"the state at {state!r} was written with other {', '.join(diff)}; "
                             "resuming would release its steps again with other noise")
    else:
        fs.write_text(meta, json.dumps(params, sort_keys=True))

    item_col, count_col = mechanism.item_col, mechanism.count_col
    noise_cols = state_noise_cols(mechanism.spec.levels)
    state_cols = [*STATE_IDS, *noise_cols]
    reserved = {"released", "value", "_shown", STATE_FLAG, *state_cols}
    for name in (item_col, count_col):
        if name in reserved:
            raise ValueError(f"column name {name!r} is used by the streaming state; "
                             "choose another item_col / count_col")
    horizon = mechanism.horizon
    remember = (not known) and mechanism.remember
    initial = None
    if known:
        initial = (domain.select(item_col).distinct()
                   .select(item_col, F.lit(0).cast("long").alias(count_col),
                           F.lit(False).alias("released")))

    def snapshot(t: int) -> str:
        return _join(state, f"t={t}")

    def process(batch: DataFrame, batch_id: int) -> None:
        t = int(batch_id) + 1
        if t > horizon:
            raise HorizonExceededError(f"micro-batch {batch_id} is time step {t}, past the "
                                       f"horizon T={horizon}")
        if t == 1:
            previous, prev_t = initial, 0
        else:
            if not fs.exists(_join(snapshot(t - 1), "_SUCCESS")):
                raise StateError(f"the state of step {t - 1} is missing at {snapshot(t - 1)!r}")
            previous, prev_t = spark.read.parquet(snapshot(t - 1)), t - 1
        # A snapshot written before the state columns existed: prepare every id again.
        with_state = previous is not None and set(state_cols) <= set(previous.columns)
        carry = (["released"] if remember and previous is not None else []) + (
            state_cols if with_state else [])
        counts = update_counts(previous, batch, max_items=mechanism.max_items,
                               items_col=items_col, item_col=item_col, count_col=count_col,
                               closed=known, carry=carry)
        cols = [F.col(item_col), F.col(count_col)]
        shown = None
        if remember and previous is not None:
            cols.append(F.coalesce(F.col("released"), F.lit(False)).alias("_shown"))
            shown = "_shown"
        if with_state:  # a new item has no state: a flag, and non-null fillers for Arrow
            cols.append(F.col(STATE_IDS[0]).isNotNull().alias(STATE_FLAG))
            cols += [F.coalesce(F.col(c), F.lit(0).cast("long")).alias(c) for c in STATE_IDS]
            cols += [F.coalesce(F.col(c), F.lit(0.0)).alias(c) for c in noise_cols]
        full = mechanism._stream_frame(t, prev_t, counts.select(*cols), shown_col=shown,
                                       with_state=with_state)
        full.write.mode("overwrite").parquet(snapshot(t))
        written = spark.read.parquet(snapshot(t))
        (written.where(F.col("released")).select(item_col, "value")
         .write.mode("overwrite").format(output_format).save(_join(output_path, f"t={t}")))
        if t >= 3:
            fs.delete(snapshot(t - 2))
        mechanism.t = max(mechanism.t, t)

    writer = events.writeStream.foreachBatch(process).option(
        "checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
