"""``dpstream run --engine spark``: the local run's command line, executed on Spark.

The command-line module calls :func:`run_cli` with the same merged options it
uses for the local engine. The whole input is read, checked and released in
one Spark job per stage; nothing proportional to the stream or the domain is
collected to the driver except the domain file, which the driver reads as the
local engine does.

Differences from the local engine (all refused with a clear error, or listed
here): the input is a JSON Lines file or directory (not stdin, not CSV); every
event has a ``t`` or none does (then each event is its own step, in file
order); events need not be in time order; ``--on-invalid`` must be ``error``;
``--state`` does not apply (re-running gives the same releases: the noise is a
function of the key); the output is a directory of part files with one row
``t, item, value`` per released item per step (JSON Lines rows, CSV with a
header, or Parquet), because one step of a large domain does not fit a line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..errors import DPStreamError, InvalidEventError
from ..io import read_domain, read_jsonl
from ..noise import NoiseKey
from .releases import SparkKnownBase, SparkUnknownBase

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["run_cli", "read_events_jsonl"]

_BUDGET = ("rho", "epsilon", "delta", "tau")
_EVENT_SCHEMA = T.StructType([
    T.StructField("pos", T.LongType(), False),
    T.StructField("t", T.LongType(), True),
    T.StructField("items", T.ArrayType(T.StringType(), False), True),
    T.StructField("error", T.StringType(), True),
])


def _parse_lines(batches):
    """Each text line through the local engine's own JSON Lines parser."""
    for pdf in batches:
        ts, items, errors = [], [], []
        for line in pdf["value"].tolist():
            recs = list(read_jsonl([line]))
            if not recs:  # blank line
                ts.append(None)
                items.append(None)
                errors.append("")
                continue
            rec = recs[0]
            ts.append(rec.t)
            items.append(None if rec.items is None else list(rec.items))
            errors.append(rec.error)
        yield pd.DataFrame({"pos": pdf["pos"].to_numpy(), "t": pd.array(ts, dtype="Int64"),
                            "items": items, "error": errors})


def read_events_jsonl(spark: SparkSession, path: str) -> DataFrame:
    """Parse a JSON Lines events file (``*.gz`` too) as the local engine does.

    Returns (pos, t, items, error): ``pos`` the line's place in the file,
    ``error`` the parse problem (``""`` for a blank line, null for an event).
    """
    lines = spark.read.text(path)
    indexed = lines.rdd.zipWithIndex().map(lambda row: (row[1], row[0][0]))
    df = spark.createDataFrame(indexed, "pos long, value string")
    return df.mapInPandas(_parse_lines, _EVENT_SCHEMA)


def _option(opts: Mapping[str, Any], name: str, default: Any = None) -> Any:
    value = opts.get(name, default)
    return default if value is None else value


def readable_counts(released: DataFrame, *, clamp: bool, monotone: bool) -> DataFrame:
    """``dpstream.postprocess.ReadableCounts`` on (t, item, value) rows (already rounded).

    clamp: value -> max(value, 0); monotone: value -> the largest value published for
    the item at steps <= t, i.e. max(value, the item's last published value), since
    the published values of an item never go down.
    """
    from pyspark.sql import Window

    if clamp:
        zero = F.lit(0) if isinstance(released.schema["value"].dataType, T.LongType) \
            else F.lit(0.0)
        released = released.withColumn("value", F.greatest(F.col("value"), zero))
    if monotone:
        window = Window.partitionBy("item").orderBy("t").rowsBetween(
            Window.unboundedPreceding, Window.currentRow)
        released = released.withColumn("value", F.max("value").over(window))
    return released


def run_cli(opts: Mapping[str, Any], *, master: str = "local[*]",
            spark: SparkSession | None = None, key: NoiseKey | None = None) -> dict[str, Any]:
    """Run ``dpstream run`` on Spark; returns a summary for the command to print.

    Args:
        opts: the merged run options of the command line, by their ``dest``
            names: mechanism ("known" or "unknown"), horizon, max_items,
            domain (a path or a list), base, remember, threshold_delta, stream,
            rho / epsilon / delta / tau, key_file, input, input_format, output,
            output_format, round, clamp, monotone, on_invalid, state.
        master: the Spark master when no session is running (``--master``).
        spark: a session to use instead of building one.
        key: the key, when the caller already loaded ``key_file``.

    Returns:
        ``{"steps", "last_t", "events", "rows", "elapsed_s", "privacy",
        "output", "mechanism"}``.

    Raises:
        ValueError: an option the Spark engine does not support, or a bad one.
        InvalidEventError: a malformed line, an oversized event, an item outside
            the domain or a step past the horizon (the job stops).
    """
    started = time.monotonic()
    name = opts.get("mechanism", "known")
    if name not in ("known", "unknown"):
        raise DPStreamError(f"--mechanism {name} is not available with --engine spark "
                            "(known and unknown are)")
    if _option(opts, "on_invalid", "error") != "error":
        raise ValueError("--engine spark supports --on-invalid error only")
    if opts.get("state"):
        raise ValueError("--state does not apply to --engine spark: re-running the job gives "
                         "the same releases (use dpstream.spark.start_stream for a stream)")
    if _option(opts, "input_format", "auto") not in ("auto", "jsonl"):
        raise ValueError("--engine spark reads JSON Lines input only")
    inp, out = opts.get("input"), opts.get("output")
    if not inp or inp == "-":
        raise ValueError("--engine spark needs --input PATH (a file or directory, not stdin)")
    if not out or out == "-":
        raise ValueError("--engine spark needs --output PATH (a directory it creates)")
    fmt = _option(opts, "output_format", "auto")
    if fmt == "auto":
        fmt = "csv" if str(out).endswith(".csv") else "jsonl"
    if fmt not in ("jsonl", "csv", "parquet"):
        raise ValueError(f"--output-format must be jsonl, csv or parquet, got {fmt!r}")
    if key is None:
        if not opts.get("key_file"):
            raise ValueError("no key: pass --key-file PATH")
        key = NoiseKey.load(opts["key_file"])
    horizon = opts.get("horizon")
    if horizon is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    budget = {b: opts.get(b) for b in _BUDGET if opts.get(b) is not None}
    common = dict(max_items=opts.get("max_items"), key=key, base=opts.get("base"),
                  stream=_option(opts, "stream", "default"), **budget)
    if common["max_items"] is None:
        raise ValueError(f"--mechanism {name} needs --max-items")

    if spark is None:
        spark = (SparkSession.builder.master(master).appName("dpstream run")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    domain_df = None
    if name == "known":
        domain = opts.get("domain")
        if domain is None:
            raise ValueError("--mechanism known needs --domain FILE (the known items)")
        items = [str(v) for v in domain] if isinstance(domain, list) else read_domain(domain)
        mech: SparkKnownBase | SparkUnknownBase = SparkKnownBase(spark, horizon, **common)
        domain_df = spark.createDataFrame([(it,) for it in items], "item string")
    else:
        if opts.get("domain") is not None:
            raise ValueError("--domain does not apply to --mechanism unknown")
        mech = SparkUnknownBase(spark, horizon, remember=bool(opts.get("remember")),
                                threshold_delta=opts.get("threshold_delta"), **common)

    parsed = read_events_jsonl(spark, inp).cache()
    try:
        facts = parsed.agg(
            F.count(F.when(F.col("error").isNull(), 1)).alias("events"),
            F.count(F.when(F.col("error").isNull() & F.col("t").isNotNull(), 1)).alias("timed"),
            F.max("t").alias("max_t"),
            F.min(F.when(F.col("error") != "", F.col("pos"))).alias("first_bad"),
        ).first()
        if facts["first_bad"] is not None:
            bad = parsed.where(F.col("pos") == facts["first_bad"]).first()
            raise InvalidEventError(f"input line {bad['pos'] + 1}: {bad['error']}")
        n_events, timed = int(facts["events"]), int(facts["timed"])
        if n_events == 0:
            raise ValueError(f"{inp!r} holds no event")
        events = parsed.where(F.col("error").isNull())
        if timed == n_events:
            last_t = int(facts["max_t"])
            events = events.select("t", "items")
        elif timed == 0:
            ordered = events.select("pos", "items").rdd.map(lambda r: (r[0], r[1])).sortByKey()
            events = spark.createDataFrame(
                ordered.zipWithIndex().map(lambda r: (r[1] + 1, r[0][1])),
                "t long, items array<string>")
            last_t = n_events
        else:
            raise ValueError("--engine spark needs a \"t\" on every event or on none "
                             f"({timed} of {n_events} events have one)")
        if last_t > mech.horizon:
            raise InvalidEventError(f"the input reaches time step {last_t}, past the horizon "
                                    f"T={mech.horizon}")
        steps = list(range(1, last_t + 1))
        if isinstance(mech, SparkKnownBase):
            released = mech.run(events, domain_df, steps=steps)
        else:
            released = mech.run(events, steps=steps)
        if opts.get("round"):
            released = released.withColumn("value", F.bround("value", 0).cast("long"))
        released = readable_counts(released, clamp=bool(opts.get("clamp")),
                                   monotone=bool(opts.get("monotone")))
        writer = released.write.mode("errorifexists")
        if fmt == "jsonl":
            writer.json(out)
        elif fmt == "csv":
            writer.option("header", True).csv(out)
        else:
            writer.parquet(out)
        rows = spark.read.format("json" if fmt == "jsonl" else fmt).option(
            "header", fmt == "csv").load(out).count()
    finally:
        parsed.unpersist()
        mech.close()
    return {"mechanism": name, "steps": len(steps), "last_t": last_t, "events": n_events,
            "rows": rows, "elapsed_s": time.monotonic() - started, "privacy": mech.privacy,
            "output": out}
