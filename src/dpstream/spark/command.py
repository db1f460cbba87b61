"""``dpstream run --engine spark``: the local run's command line, executed on Spark.

The command-line module calls :func:`run_cli` with the same merged options it
uses for the local engine. The whole input is read, checked and released in
one Spark job per stage; nothing proportional to the stream or the domain is
collected to the driver except the domain file, which the driver reads as the
local engine does.

The release clock is public, as on the local engine: every step 1..``--until``
(default: the horizon; required with no ``--horizon``, a stream with no planned
end) is released, whether or not an event happened in it. ``-m unknown`` runs the
local engine's counter (the BLT by default) with its releases.

Differences from the local engine (all refused with a clear error, or listed
here): the input is a JSON Lines file or directory (not stdin, not CSV); every
event has a ``t`` or none does (then each event is its own step, in file
order); events need not be in time order; ``--on-invalid`` is ``skip`` (drop
and count an invalid event) or ``error`` (stop before anything is written);
``--state`` does not apply (re-running gives the same releases: the noise is a
function of the key); the output is a directory of part files in the local
engine's long format, one row ``t, item, value, noise_std`` per released item
per step and a row with no item for a step that released nothing (JSON Lines
rows, CSV with a header, or Parquet), because one step of a large domain does
not fit a line.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import DPStreamError, InvalidEventError
from ..factorization import MAX_BLT_HORIZON
from ..io import read_domain
from ..io.domain import domain_list
from ..mechanisms.counters import counter_with_buffers
from ..mechanisms.params import HistogramParams, UnknownParams
from ..noise import DEFAULT_NOISE_VERSION, NoiseKey
from ..run.config import RunConfig
from ..run.guard import CAUSE_WORDS, InvalidTally, check_invalid_share, check_not_empty
from ..run.lock import local_path, lock_path, output_lock
from ..run.output import run_files
from ..run.settings import parse_share
from ..run.source import past_message
from ..run.validate import invalid_message
from .events import read_events_jsonl, read_events_parquet
from .frames import local_frame
from .order import split_shifts, with_pos
from .output import check_output, write_table
from .paths import input_files
from .read_counts import TOTALS, counted_lines
from .read_jsonl import ZONE_RULES_MISMATCH, parsed_lines
from .releases import SparkKnownBase, SparkUnknownBase, _first_row
from .session import start_session

try:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["run_cli", "read_events_jsonl"]

_BUDGET = ("rho", "epsilon", "delta", "tau")


def _long_format(
    spark: SparkSession, released: DataFrame, mech: Any, steps: list[int], clock: Any = None
) -> tuple[DataFrame, int]:
    """The local engine's long table: (t, item, value, noise_std), a row with a null item
    and value for a step that released nothing, so every step of the clock is there; with
    a clock (``--time-field``), each step's window ``step_start``, ``step_end`` as the
    local engine writes them (ISO-8601 in the clock's zone); and its number of rows.

    ``released`` must be cached by the caller: one job counts its rows per step (a row
    per step to the driver: what the output shows anyway), which finds the empty steps,
    and the write then reads the cache (the releases are computed once)."""
    from ..run.meta import noise_std_at

    per_step: list[tuple[Any, ...]] = [(t, float(noise_std_at(mech.mechanism, t))) for t in steps]
    schema = "t long, noise_std double"
    dated: tuple[str, ...] = ("noise_std",)
    if clock is not None:
        per_step = [
            (*row, clock.iso(clock.start_of(t)), clock.iso(clock.end_of(t)))
            for row, t in zip(per_step, steps, strict=True)
        ]
        schema += ", step_start string, step_end string"
        dated = ("noise_std", "step_start", "step_end")
    counted = released.groupBy("t").agg(F.count(F.lit(1)).alias("n")).collect()
    on_clock = set(steps)
    shown = {int(r["t"]): int(r["n"]) for r in counted if int(r["t"]) in on_clock}
    stds = local_frame(spark, per_step, schema)
    rows = released.join(F.broadcast(stds), "t")
    missing = [row for row in per_step if row[0] not in shown]
    empty = local_frame(spark, missing, schema, sliced=True).select(
        "t",
        F.lit(None).cast(released.schema["item"].dataType).alias("item"),
        F.lit(None).cast(released.schema["value"].dataType).alias("value"),
        *dated,
    )
    table = rows.select("t", "item", "value", *dated).unionByName(empty)
    return table, sum(shown.values()) + len(steps) - len(shown)


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
        zero = F.lit(0) if isinstance(released.schema["value"].dataType, T.LongType) else F.lit(0.0)
        released = released.withColumn("value", F.greatest(F.col("value"), zero))
    if monotone:
        window = (
            Window.partitionBy("item")
            .orderBy("t")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        released = released.withColumn("value", F.max("value").over(window))
    return released


@dataclass(frozen=True)
class _Job:
    """A Spark run's settings, checked: what the job reads, releases and writes."""

    name: str
    policy: str
    inp: str
    out: str
    fmt: str
    key: NoiseKey
    horizon: int | None  # None: no planned end (-m known and -m unknown)
    until: int
    verbose: bool
    user_field: str | None
    common: dict[str, Any]
    parquet: bool = False  # the input is Parquet (a file or a directory)
    force: bool = False  # --overwrite or --force: an existing output is replaced

    @property
    def limit(self) -> int:
        """T, or the step limit 2^40 of a stream with no planned end."""
        return MAX_BLT_HORIZON if self.horizon is None else self.horizon


def run_cli(
    opts: RunConfig | Mapping[str, Any],
    *,
    master: str = "local[*]",
    spark: SparkSession | None = None,
    key: NoiseKey | None = None,
    before_release: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run ``dpstream run`` on Spark; returns a summary for the command to print.

    Args:
        opts: the run's config (:class:`dpstream.run.config.RunConfig`, as ``dpstream
            run`` builds it), or its options by their ``dest`` names: mechanism
            ("known" or "unknown"), horizon, max_items, domain (a path or a list),
            counter, base, remember, threshold_delta, stream, rho / epsilon / delta /
            tau, key_file, input, input_format, output, output_format, round, clamp,
            monotone, on_invalid, state, force (replace an existing output).
        master: the Spark master when no session is running (``--master``).
        spark: a session to use instead of building one.
        key: the key, when the caller already loaded ``key_file``.
        before_release: called with the (local) mechanism whose noise the job draws,
            once the input is checked and before anything is written (``dpstream run``
            checks and records its noise scope in the release ledger there).

    Returns:
        ``{"steps", "last_t", "events", "rows", "elapsed_s", "privacy",
        "output", "mechanism"}``.

    Raises:
        ValueError: an option the Spark engine does not support, or a bad one.
        InvalidEventError: a malformed line, an oversized event, an item outside
            the domain or a step past the horizon (the job stops).
        StateError: another run (Spark or local) is writing the same local output.
    """
    with contextlib.ExitStack() as held:
        return _run_cli(opts, master, spark, key, before_release, held)


def _lock(held: contextlib.ExitStack, path: str, locked: list[str]) -> None:
    """Take the output lock of the local output ``path`` (:mod:`dpstream.run.lock`, the
    local engine's) for the rest of the run, unless ``locked`` holds its lock file."""
    if lock_path(path) not in locked:
        held.enter_context(output_lock(path, directory=True))
        locked.append(lock_path(path))


def _run_cli(
    opts: RunConfig | Mapping[str, Any],
    master: str,
    spark: SparkSession | None,
    key: NoiseKey | None,
    before_release: Callable[[Any], None] | None,
    held: contextlib.ExitStack,
) -> dict[str, Any]:
    """:func:`run_cli`, holding the output's lock in ``held`` (a local output's): taken
    before the session starts when the path's folder is there (a refused run starts no
    JVM), else once :func:`check_output` has found the output local (and made its
    folder); in both cases before the input is read or the ledger records anything."""
    started = time.monotonic()
    # the options by name as given (a mapping's missing options are None, as before);
    # the config for the invalid-records guard
    cfg = opts if isinstance(opts, RunConfig) else _config(opts)
    opts = opts.options() if isinstance(opts, RunConfig) else opts
    job = _job(opts, key)
    locked: list[str] = []
    early = local_path(job.out)
    if early is not None and os.path.isdir(os.path.dirname(os.path.abspath(early))):
        with contextlib.suppress(OSError):  # a folder it may not write: check_output says
            _lock(held, early, locked)
    if not job.parquet:  # a JSON Lines folder's copies, twins and backups: refused
        input_files(job.inp)  # before a JVM starts (review 108: 17 s in), as its links
    if spark is None:
        spark = start_session(master)
    reads, records = run_files(cfg)  # before anything is read or claimed
    place = check_output(spark, job.out, job.force, [*reads, *records])
    if place.local is not None:  # the path Spark writes (links, `..`, a folder made now)
        _lock(held, place.local, locked)
    mech, domain_df, domain = _mechanism(spark, opts, job)
    counted = _counted(spark, opts, job, domain, cfg)
    source = None if counted is not None else _parsed(spark, opts, job, cfg)
    checked = released = None
    try:
        after_until = 0
        if counted is not None:
            events, n_events, skipped = _valid_counts(counted)
            after_until = int(counted.facts["late"])
        else:
            assert source is not None
            events, checked, n_events, skipped, after_until = _valid_events(
                source, job, domain_df, mech, cfg
            )
        steps = list(range(1, job.until + 1))
        if before_release is not None:
            before_release(mech.mechanism)
        with _cached_plans_coalesced(spark):
            released = _released(
                events, job, mech, domain_df, steps, opts, counted=counted is not None
            ).persist()
        table, rows = _long_format(spark, released, mech, steps, _clock(opts))
        write_table(table, job.fmt, job.out, place, job.force)
    finally:
        caches = [checked, released]
        caches += [source.cache if source else None, counted.cache if counted else None]
        for cached in caches:
            if cached is not None:
                cached.unpersist()
        if counted is not None and counted.shared is not None:
            counted.shared.destroy()
        mech.close()
    return {
        "mechanism": job.name,
        "steps": len(steps),
        "last_t": job.until,
        "events": n_events,
        "skipped": skipped,
        "after_until": after_until,
        "rows": rows,
        "elapsed_s": time.monotonic() - started,
        "privacy": mech.privacy,
        "output": job.out,
    }


#: Whether a cached plan may have its shuffles' partitions coalesced (adaptive execution).
_COALESCE_CACHED = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"


@contextmanager
def _cached_plans_coalesced(spark: SparkSession) -> Iterator[None]:
    """Plans cached in this block coalesce their small shuffle partitions, as uncached
    ones do: the cached releases' shuffle by item is not 200 tasks (one Python stream
    each) on a small input. The session's setting is restored after."""
    old = spark.conf.get(_COALESCE_CACHED, None)
    spark.conf.set(_COALESCE_CACHED, "true")
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(_COALESCE_CACHED)
        else:
            spark.conf.set(_COALESCE_CACHED, old)


def _config(opts: Mapping[str, Any]) -> RunConfig:
    """A run's config from its options by name (the API's form of :func:`run_cli`;
    names that are not settings are left out, as the job reads none of them)."""
    names = set(RunConfig().field_names())
    given = {k: v for k, v in opts.items() if k in names and v is not None}
    given["item_column_given"] = opts.get("item_column") is not None
    return RunConfig(**{**given, "clock": _clock(opts)})


def _clock(opts: Mapping[str, Any]) -> Any:
    """The run's public clock (``--time-field``, ``--start``, ``--step``), or None."""
    if opts.get("time_field") is None:
        return None
    from ..clock import StepClock

    return StepClock.parse(opts["start"], opts["step"])


@dataclass(frozen=True)
class _Input:
    """The input's records (pos, t, items, error, user), read from ``cache`` (which the
    caller unpersists); ``facts``: the counts :func:`_facts` gives, when the read's own
    pass found them (else None)."""

    records: DataFrame
    cache: DataFrame
    facts: dict[str, Any] | None = None
    #: the records with a null ``pos``, when numbering them is a join of its own: for
    #: the events of a run that reads no line number (no user-level bounding)
    unnumbered: DataFrame | None = None


def _parsed(spark: SparkSession, opts: Mapping[str, Any], job: _Job, cfg: RunConfig) -> _Input:
    """The input's lines parsed as the local engine parses them.

    JSON Lines with steps in the lines (or timestamps): one job parses and caches the
    lines with their splits, and finds both the line numbers and the checks' counts
    (:func:`_facts`, per split, summed here); the records are numbered as they are
    read from that cache. Else (Parquet, ``--implicit-time``, whose steps are the
    line numbers) the reader's numbered, cached frame, and the counts come later.
    """
    clock = _clock(opts)
    implicit = bool(opts.get("implicit_time"))
    if implicit and clock is not None:
        raise ValueError("--implicit-time and --time-field are two ways to give steps: use one")
    if job.parquet:
        if clock is not None:
            raise ValueError(
                "--engine spark reads Parquet with integer steps (a time column); "
                "timestamps (--time-field) in Parquet run on the local engine"
            )
        parquet = read_events_parquet(
            spark,
            job.inp,
            time_column=opts.get("time_column"),
            item_column=cfg.named_item_column,  # None: items, else item
            event_column=opts.get("event_column") or "event",
            user_field=job.user_field,
        ).cache()
        return _Input(parquet, parquet)
    if implicit:
        read = read_events_jsonl(  # cached by the reader
            spark, job.inp, implicit=True, user_field=job.user_field
        )
        return _Input(read, read)
    rows = parsed_lines(
        spark,
        job.inp,
        time_field=opts.get("time_field"),
        clock=clock,
        user_field=job.user_field,
        through=job.until,
    ).persist()
    try:
        table, splits = split_shifts(rows, job.inp, **_fact_columns(job, "_row"))
    except BaseException as exc:
        rows.unpersist()
        _refuse_plainly(exc, job.inp)
        raise
    shift = {(f, b): d for f, b, d in table}
    firsts = [
        int(s["first_bad"]) + shift[(s["_file"], int(s["_block"]))]
        for s in splits
        if s["first_bad"] is not None
    ]
    facts: dict[str, Any] = {
        name: sum(int(s[name]) for s in splits)
        for name in _fact_columns(job, "_row")
        if name != "first_bad"
    }
    facts["first_bad"] = min(firsts) if firsts else None
    records = with_pos(spark, rows, table).select("pos", "t", "items", "error", "user")
    unnumbered = rows.select(F.lit(None).cast("long").alias("pos"), "t", "items", "error", "user")
    return _Input(records, rows, facts, unnumbered)


def _refuse_plainly(exc: BaseException, inp: str) -> None:
    """Say, as one line and not as Spark's stack of traces, why the read failed when it
    is the input's or a worker's doing: a worker's zone database refusal
    (:func:`dpstream.spark.read_jsonl.zone_rules`), or a file Spark could not read
    (a truncated or corrupt ``.gz``, which the local engine refuses too, or one padded
    with zero bytes, which Hadoop's gzip reader refuses and Python's reads)."""
    text = str(exc)
    at = text.find(ZONE_RULES_MISMATCH)
    if at >= 0:
        raise DPStreamError(text[at:].splitlines()[0].strip()) from None
    if "FAILED_READ_FILE" in text:
        cause = re.search(r"Caused by: ([^\n]+)", text)
        where = re.search(r"while reading file (\S+?)\.?\s", text)
        raise DPStreamError(
            f"input {inp!r}: Spark could not read "
            f"{where.group(1) if where else 'a file of it'}, truncated or corrupt "
            f"({cause.group(1).strip() if cause else 'no cause given'}); the local "
            "engine refuses a truncated or corrupt file too, but reads a .gz padded "
            "with zero bytes after its data: decompress such a file, or run it on the "
            "local engine"
        ) from None


#: The largest known domain the counting workers check events against (each holds it).
_DOMAIN_IN_WORKERS = 1 << 21


@dataclass(frozen=True)
class _Counted:
    """The input's valid events counted per (step, item) (``counts``: t, item, n, partial
    counts to be added, read from ``cache``, which the caller unpersists) and the
    totals of :mod:`dpstream.spark.read_counts` (events, bad, late, oversized,
    outside, unstepped)."""

    counts: DataFrame
    cache: DataFrame
    facts: dict[str, int]
    #: the broadcast domain the workers read (destroyed by the caller), or None
    shared: Any = None


def _counted(
    spark: SparkSession,
    opts: Mapping[str, Any],
    job: _Job,
    domain: list[str] | None,
    cfg: RunConfig,
) -> _Counted | None:
    """The input counted as it is parsed (:mod:`dpstream.spark.read_counts`: only partial
    counts cross from the Python workers to the JVM), when the run needs nothing of an
    event but its step and items: an event-level run over JSON Lines whose steps are in
    the lines (with KnownBase and ``--on-invalid skip`` the workers check each event's
    items against the domain, a broadcast variable of up to ``_DOMAIN_IN_WORKERS``
    items), unless the input has an event without a step (``"t": null``: its step is
    that of the record before it) or an input that may pass ``--max-invalid``
    (:func:`_surely_within_share`), and not with ``--on-invalid error`` (whose message
    names the record's line). None: the run reads the events (:func:`_parsed`), whose
    checks are exact."""
    if (
        job.parquet
        or job.user_field is not None
        or opts.get("implicit_time")
        or job.policy == "error"  # its message names the record's line, in the local words
    ):
        return None
    known: Any = None
    if job.name == "known" and job.policy == "skip":
        if domain is None or len(domain) > _DOMAIN_IN_WORKERS:
            return None
        try:
            known = spark.sparkContext.broadcast(frozenset(domain))
        except Exception:  # Spark Connect has no SparkContext
            return None
    counted = counted_lines(
        spark,
        job.inp,
        until=job.until,
        max_items=int(job.common["max_items"]),
        domain=None if known is None else lambda: known.value,
        time_field=opts.get("time_field"),
        clock=_clock(opts),
    ).cache()
    row = None
    try:
        try:
            # each task's totals row (item null): its totals in the order of TOTALS
            total = [F.sum(F.col("ns").getItem(k)) for k in range(len(TOTALS))]
            row = _first_row(counted.where(F.col("item").isNull()).agg(*total))
        except Exception as exc:
            _refuse_plainly(exc, job.inp)
            raise
        facts = {n: int(row[k] or 0) for k, n in enumerate(TOTALS)}
        if facts["unstepped"] or not _surely_within_share(facts, cfg, job):
            row = None
    finally:
        if row is None:
            counted.unpersist()
            if known is not None:
                known.destroy()
    if row is None:
        return None
    # the rows of totals have no item
    return _Counted(counted.where(F.col("item").isNotNull()), counted, facts, known)


def _surely_within_share(facts: Mapping[str, int], cfg: RunConfig, job: _Job) -> bool:
    """Whether the counted input is within ``--max-invalid`` (the local guard,
    :func:`_check_invalid_share`) however its events past ``--until`` divide: the
    counting workers count them as one (``late``), where the guard counts those past
    the horizon as invalid and those up to it (a later run's) as not read. When unsure
    the run reads the records, whose exact tally the guard checks and words."""
    share = parse_share(cfg.max_invalid or "0.05")
    late = facts["late"]
    invalid = facts["bad"] + facts["oversized"] + facts["outside"] + late
    records = facts["events"] + facts["bad"]
    if job.until < job.limit:  # some late events may be a later run's: not read
        records -= late
    if records <= 0:  # maybe nothing for the run's steps: the exact tally says (and
        return False  # refuses it without --allow-empty, as the local engine does)
    return invalid <= share * records


def _valid_counts(counted: _Counted) -> tuple[DataFrame, int, int]:
    """The valid events' counts, and the numbers of events and of invalid records
    skipped (as :func:`_valid_events` finds them; those of steps after ``--until`` or
    past the horizon among them are ``facts["late"]``)."""
    facts = counted.facts
    invalid = facts["late"] + facts["oversized"] + facts["outside"]
    return counted.counts, facts["events"] - invalid, facts["bad"] + invalid


#: Options of ``dpstream run`` the Spark job does not run (flag, dest): refused, not
#: ignored, since each changes what is published or when.
_LOCAL_ONLY = (
    ("--follow", "follow"),
    ("--lateness", "lateness"),
    ("--top", "top"),
    ("--min-value", "min_value"),
)


def _job(opts: Mapping[str, Any], key: NoiseKey | None) -> _Job:
    """The Spark run's settings, each refused when the Spark engine does not run it."""
    name = opts.get("mechanism", "known")
    if name not in ("known", "unknown"):
        raise DPStreamError(
            f"--mechanism {name} is not available with --engine spark (known and unknown are)"
        )
    unread = [
        flag
        for flag, dest in _LOCAL_ONLY
        if opts.get(dest) is not None and opts.get(dest) is not False
    ]
    if unread:
        raise ValueError(
            f"{', '.join(unread)}: not available with --engine spark (the local engine "
            "runs them: drop --engine spark)"
        )
    policy = _option(opts, "on_invalid", "skip")
    if policy not in ("skip", "error"):
        raise ValueError("--engine spark supports --on-invalid skip or error (not truncate)")
    if opts.get("state"):
        raise ValueError(
            "--state does not apply to --engine spark: a Spark run releases steps "
            "1 .. --until in one go and keeps no state (for a stream that goes on, use "
            "the local engine with --state, or dpstream.spark.start_stream)"
        )
    from ..run.settings import input_format

    in_fmt = input_format(str(opts.get("input") or "-"), _option(opts, "input_format", "auto"))
    if in_fmt not in ("jsonl", "parquet"):
        raise ValueError(
            "--engine spark reads JSON Lines or Parquet input (CSV input runs on the "
            "local engine: drop --engine spark)"
        )
    inp, out = opts.get("input"), opts.get("output")
    if not inp or inp == "-":
        raise ValueError("--engine spark needs --input PATH (a file or directory, not stdin)")
    if not out or out == "-":
        raise ValueError("--engine spark needs --output PATH (a directory it creates)")
    fmt = _output_format(_option(opts, "output_format", "auto"), str(out))
    if key is None:
        if not opts.get("key_file"):
            raise ValueError("no key: pass --key-file PATH")
        key = NoiseKey.load(opts["key_file"])
    horizon = opts.get("horizon")  # None: no planned end (-m unknown and -m known)
    if horizon is None and opts.get("until") is None:
        raise ValueError(
            "without --horizon (a stream with no planned end) a run needs --until N, "
            "the last step to release"
        )
    until = int(_option(opts, "until", horizon))
    if not 1 <= until <= (MAX_BLT_HORIZON if horizon is None else horizon):
        raise ValueError(f"--until must be in 1..--horizon {horizon}, got {until}")
    return _Job(
        name=name,
        policy=policy,
        inp=str(inp),
        out=str(out),
        fmt=fmt,
        key=key,
        horizon=None if horizon is None else int(horizon),
        until=until,
        verbose=bool(opts.get("verbose_errors")),
        user_field=opts.get("user_field"),
        common=_common(opts, name, key, str(inp)),
        parquet=in_fmt == "parquet",
        force=bool(opts.get("force") or opts.get("overwrite")),
    )


def _output_format(fmt: str, out: str) -> str:
    """``--output-format`` on Spark: a long table (jsonl-long, csv or parquet)."""
    if fmt == "auto":
        fmt = (
            "csv"
            if out.endswith(".csv")
            else "parquet"
            if out.endswith(".parquet")
            else "jsonl-long"
        )
    if fmt == "jsonl":  # one step of a large domain does not fit a line: rows instead
        fmt = "jsonl-long"
    if fmt not in ("jsonl-long", "csv", "parquet"):
        raise ValueError(f"--output-format must be jsonl-long, csv or parquet, got {fmt!r}")
    return fmt


def _common(opts: Mapping[str, Any], name: str, key: NoiseKey, inp: str) -> dict[str, Any]:
    """The constructor arguments both Spark mechanisms take: the budget, the bounds, the
    key, and the stream name scoped by the input settings (as the local engine's)."""
    from ..run.settings import scoped_stream

    budget = {b: opts.get(b) for b in _BUDGET if opts.get(b) is not None}
    user_field = opts.get("user_field")
    users = {
        k: opts.get(k)
        for k in ("max_items_per_user", "max_count_per_item")
        if opts.get(k) is not None
    }
    if (user_field is None) != (not users):
        raise ValueError("--user-field, --max-items-per-user and --max-count-per-item go together")
    common: dict[str, Any] = dict(
        max_items=opts.get("max_items"),
        key=key,
        base=opts.get("base"),
        stream=scoped_stream(
            {"stream": "default", "input": inp, **{k: v for k, v in opts.items() if v is not None}}
        ),
        **budget,
        **users,
        noise_version=int(opts.get("noise_version") or DEFAULT_NOISE_VERSION),
    )
    if opts.get("blt_buffers") is not None and opts.get("horizon") is None:
        raise ValueError("--blt-buffers needs --horizon (T, the number of time steps)")
    if common["max_items"] is None and user_field is None:
        raise ValueError(f"--mechanism {name} needs --max-items")
    return common


def _mechanism(
    spark: SparkSession, opts: Mapping[str, Any], job: _Job
) -> tuple[SparkKnownBase | SparkUnknownBase, DataFrame | None, list[str] | None]:
    """The Spark mechanism of the run, and the known domain as a frame and as a list
    (or None)."""
    horizon = job.horizon
    counter = (
        opts.get("counter")
        if horizon is None
        else counter_with_buffers(
            opts.get("counter"), opts.get("base"), opts.get("blt_buffers"), horizon
        )
    )
    settings = {k: v for k, v in job.common.items() if k != "key"}
    if job.name == "known":
        domain = opts.get("domain")
        if domain is None:
            raise ValueError("--mechanism known needs --domain FILE (the known items)")
        items = (  # a list (a config file's): read as the local engine reads it
            domain_list(domain, "--domain (a list)")
            if isinstance(domain, list)
            else read_domain(domain)
        )
        params = HistogramParams(horizon=horizon, counter=counter, **settings)
        mech: SparkKnownBase | SparkUnknownBase = SparkKnownBase.from_params(
            spark, params, key=job.key, domain=items
        )
        return mech, local_frame(spark, [(it,) for it in items], "item string"), items
    if opts.get("domain") is not None:
        raise ValueError("--domain does not apply to --mechanism unknown")
    unknown = UnknownParams(
        horizon=horizon,
        remember=bool(opts.get("remember")),
        threshold_delta=opts.get("threshold_delta"),
        counter=counter,
        **settings,
    )
    return SparkUnknownBase.from_params(spark, unknown, key=job.key), None, None


def _plain_invalid(job: _Job) -> Column:
    """The local engine's checks of an event that need no domain, as a column: its step
    past ``--until``, too many items or a null item."""
    return (F.col("t") > job.until) | _over(job) | F.exists("items", lambda x: x.isNull())


def _fact_columns(job: _Job, order: str) -> dict[str, Column]:
    """The counts the checks need, as aggregates over parsed records: ``events`` (no
    parse error), ``bad`` (a parse error), ``first_bad`` (the least ``order`` of one)
    and ``invalid`` (events :func:`_plain_invalid` flags); and for the guard
    (:func:`_check_invalid_share`), as the local engine tallies them, each record
    once: ``cause ...`` (the parse errors of each cause), ``past`` (events past the
    horizon), ``later`` (events of steps after ``--until``, a later run's), ``null
    item`` (events of the run with a null item) and ``over`` (the others with more
    than ``--max-items`` items)."""
    event = F.col("error").isNull()
    bad = F.col("error") != ""
    limit = job.limit
    in_run = event & (F.col("t") <= job.until)
    null_item = F.exists("items", lambda x: x.isNull())  # a reader's error, locally
    cause = _cause_column()
    return {
        "events": F.count(F.when(event, 1)),
        "bad": F.count(F.when(bad, 1)),
        "first_bad": F.min(F.when(bad, F.col(order))),
        "invalid": F.count(F.when(event & _plain_invalid(job), 1)),
        **{
            f"cause {name}": F.count(F.when(bad & (cause == name), 1))
            for name in (*dict(CAUSE_WORDS).values(), "malformed")
        },
        "null item": F.count(F.when(in_run & null_item, 1)),
        "past": F.count(F.when(event & (F.col("t") > limit), 1)),
        "later": F.count(F.when(event & (F.col("t") > job.until) & (F.col("t") <= limit), 1)),
        "over": F.count(F.when(in_run & ~null_item & _over(job), 1)),
        "unstepped": F.count(F.when(event & F.col("t").isNull(), 1)),
    }


def _over(job: _Job) -> Column:
    """An event with more than ``--max-items`` distinct items (never, without a bound)."""
    max_items = job.common["max_items"]
    if max_items is None:
        return F.lit(False)
    return F.size(F.array_distinct("items")) > max_items


def _cause_column() -> Column:
    """A parse error's cause, as the local guard names it from the same message
    (:data:`dpstream.run.guard.CAUSE_WORDS`: the first words found decide)."""
    cause = F.lit("malformed")
    for words, name in reversed(CAUSE_WORDS):
        cause = F.when(F.col("error").contains(words), F.lit(name)).otherwise(cause)
    return cause


def _check_invalid_share(
    facts: Mapping[str, Any],
    cfg: RunConfig,
    job: _Job,
    outside: int | None = None,
    over: int | None = None,
) -> None:
    """The local engine's guard (:func:`dpstream.run.guard.check_invalid_share`) over
    the Spark run's counts: more than ``--max-invalid`` of the records invalid, and
    nothing is written. With a domain check, ``outside`` counts the events of the run
    with an item outside the domain and ``over`` the others with too many items (the
    local engine counts the domain first); else ``facts["over"]``."""
    tally = InvalidTally()
    tally.records = int(facts["events"]) + int(facts["bad"]) - int(facts["later"])
    tally.later = int(facts["later"])
    for name in (*dict(CAUSE_WORDS).values(), "malformed"):
        tally.add(name, "", int(facts[f"cause {name}"]))
    tally.add("malformed", "", int(facts["null item"]))
    tally.add("past", "", int(facts["past"]))
    if outside is not None:
        tally.add("not in the domain", "", outside)
    tally.add("more than --max-items", "", int(facts["over"] if over is None else over))
    check_invalid_share(tally, cfg.with_options(until=job.until))


def _facts(parsed: DataFrame, job: _Job) -> dict[str, Any]:
    """:func:`_fact_columns` over numbered records, in one job."""
    row = _first_row(parsed.agg(*(c.alias(n) for n, c in _fact_columns(job, "pos").items())))
    return row.asDict()


def _valid_events(
    source: _Input, job: _Job, domain_df: DataFrame | None, mech: Any, cfg: RunConfig
) -> tuple[DataFrame, DataFrame | None, int, int, int]:
    """The valid events (t, items, pos, user; ``pos`` null when nothing reads it), the
    cached frame they come from (None: the input's), and the counts of events, of
    invalid records skipped and, among them, of events of steps after ``--until`` or
    past the horizon; with ``--on-invalid error``, the first invalid record
    stops the job before anything is written, and with ``--on-invalid skip`` more than
    ``--max-invalid`` of the records invalid does (:func:`_check_invalid_share`)."""
    parsed = source.records
    facts = source.facts if source.facts is not None else _facts(parsed, job)
    unstepped = bool(facts["unstepped"])
    if unstepped:  # their steps come from the records before them
        parsed = _stepped(parsed, job.until)
        facts = _facts(parsed, job)
    later = int(facts["later"])
    check_not_empty(
        int(facts["events"]) + int(facts["bad"]) - later, later, cfg.with_options(until=job.until)
    )
    if job.policy == "error" and (facts["bad"] or facts["invalid"] or domain_df is not None):
        _stop_at_first_invalid(parsed, job, domain_df)
    skipped = 0
    if facts["first_bad"] is not None:
        skipped += int(facts["bad"])
    if not unstepped and job.user_field is None and source.unnumbered is not None:
        parsed = source.unnumbered  # only user-level bounding reads the line numbers
    n_events = int(facts["events"])
    events = parsed.where(F.col("error").isNull()).select("t", "items", "pos", "user")
    checked = None
    if domain_df is None or job.policy != "skip":
        if job.policy == "skip":
            _check_invalid_share(facts, cfg, job)
        n_invalid = int(facts["invalid"])
        valid = events.where(~_plain_invalid(job))
    else:
        events, invalid = _invalid_rule(events, job, domain_df)
        checked = events.withColumn("_invalid", invalid).cache()
        in_run = (F.col("t") <= job.until) & ~F.exists("items", lambda x: x.isNull())
        counts = _first_row(
            checked.agg(
                F.count(F.when(F.col("_invalid"), 1)).alias("invalid"),
                F.count(F.when(in_run & F.col("_outside"), 1)).alias("outside"),
                F.count(F.when(in_run & ~F.col("_outside") & _over(job), 1)).alias("over"),
            )
        )
        n_invalid = int(counts["invalid"])
        if job.policy == "skip":
            try:
                _check_invalid_share(facts, cfg, job, int(counts["outside"]), int(counts["over"]))
            except BaseException:
                checked.unpersist()
                raise
        valid = checked.where(~F.col("_invalid")).select("t", "items", "pos", "user")
    skipped += n_invalid
    n_events -= n_invalid
    return valid, checked, n_events, skipped, int(facts["later"]) + int(facts["past"])


def _stepped(parsed: DataFrame, until: int) -> DataFrame:
    """The numbered records, an event without a step (``"t": null``) in the step of the
    last record before it with one in 1..``until`` (else the first step), as the local
    engine groups them (:mod:`dpstream.io.grouping`). One sorted pass, run only when
    the input has such an event."""
    return parsed.withColumn("t", F.coalesce(F.col("t"), _carried_step(until)))


def _carried_step(until: int) -> Column:
    """The step of the last record at or before this one (by ``pos``) with a step in
    1..``until``, else the first step: where the local engine counts a record without
    a step of its own (:class:`dpstream.io.grouping.ChunkGrouper`). A window over the
    whole input in order: one sorted pass."""
    from pyspark.sql import Window

    in_range = F.col("t").between(1, until)
    before = Window.orderBy("pos").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return F.coalesce(F.last(F.when(in_range, F.col("t")), True).over(before), F.lit(1))


def _stop_at_first_invalid(parsed: DataFrame, job: _Job, domain_df: DataFrame | None) -> None:
    """With ``--on-invalid error``: raise :class:`InvalidEventError` for the record the
    local engine stops at, in its words (:func:`dpstream.run.validate.invalid_message`),
    if any record is invalid: a parse error, a step past ``--until``, a null item, an
    item outside the domain (checked before the size, as locally) or too many items."""
    records = parsed.where(F.col("error").isNull() | (F.col("error") != ""))
    bad = F.col("error").isNotNull() | (F.col("error").isNull() & _plain_invalid(job))
    if domain_df is not None:
        events = records.where(F.col("error").isNull()).select("t", "items", "pos", "user")
        flagged, _ = _invalid_rule(events, job, domain_df)
        outside = flagged.where(F.col("_outside")).select("pos", F.lit(True).alias("_out"))
        records = records.join(outside, "pos", "left")
        bad = bad | F.col("_out").isNotNull()
    first = _first_bad(records, bad, job.until)
    if first is None:
        return
    line = int(first["pos"]) + 1
    problem = first["error"] or _event_problem(first, job, domain_df)
    raise InvalidEventError(invalid_message(line, problem, job.verbose))


def _event_problem(row: Any, job: _Job, domain_df: DataFrame | None) -> str:
    """Why the local engine refuses a parsed event (``row``: its ``t`` and ``items``), in
    its words: the first of its checks that fails. The domain is looked up for the
    event's items only (the mechanism's own table is a placeholder on Spark)."""
    t, items = int(row["t"]), list(row["items"])
    if t > job.until:
        return past_message(t, job.until, job.limit)
    if any(x is None for x in items):
        return "an item is null"
    if domain_df is not None:
        found = domain_df.where(F.col("item").isin(list(set(items)))).select("item").collect()
        known = {r["item"] for r in found}
        outside = [x for x in items if x not in known]
        if outside:
            return f"item {outside[0]!r} is not in the domain"
    distinct = len(set(items))
    return f"event has {distinct} distinct items, more than --max-items {job.common['max_items']}"


def _first_bad(records: DataFrame, bad: Column, until: int) -> Any:
    """The record (a row: pos, t, items, error) the local engine stops at with
    ``--on-invalid error`` among ``records`` where ``bad`` holds, or None: it raises
    where it releases the record's step, so the first invalid record of the earliest
    step; a record without a step counts in the step of the last record before it with
    one in 1..``until`` (else the first step), one past ``until`` after every step
    (:class:`dpstream.io.grouping.ChunkGrouper`). One sorted pass, run only when some
    record may be invalid."""
    step = (
        F.when(F.col("t") > until, F.lit(until + 1))
        .when(F.col("t").between(1, until), F.col("t"))
        .otherwise(_carried_step(until))
    )
    flagged = records.select("pos", "t", "items", "error", step.alias("_step"), bad.alias("_bad"))
    rows = flagged.where(F.col("_bad")).orderBy("_step", "pos").limit(1).collect()
    return rows[0] if rows else None


def _invalid_rule(events: DataFrame, job: _Job, domain_df: DataFrame | None) -> tuple[Any, Any]:
    """The events (flagged ``_outside`` when an item is outside the known domain) and the
    column that marks an invalid one: the local engine's checks, as a filter."""
    invalid = _plain_invalid(job)
    if domain_df is not None:
        in_domain = F.broadcast(
            domain_df.select(F.col("item").alias("_item"), F.lit(True).alias("_known"))
        )
        exploded = events.withColumn("_id", F.monotonically_increasing_id()).withColumn(
            "_item", F.explode_outer("items")
        )
        flagged = (
            exploded.join(in_domain, "_item", "left")
            .groupBy("_id", "t")
            .agg(
                F.first("items").alias("items"),
                F.first("pos").alias("pos"),
                F.first("user").alias("user"),
                F.max(
                    F.when(F.col("_item").isNotNull() & F.col("_known").isNull(), 1).otherwise(0)
                ).alias("_outside"),
            )
        )
        events = flagged.select(
            "t", "items", "pos", "user", (F.col("_outside") == 1).alias("_outside")
        )
        invalid = invalid | F.col("_outside")
    return events, invalid


def _released(
    events: DataFrame,
    job: _Job,
    mech: SparkKnownBase | SparkUnknownBase,
    domain_df: DataFrame | None,
    steps: list[int],
    opts: Mapping[str, Any],
    *,
    counted: bool = False,
) -> DataFrame:
    """Every step's release, (t, item, value) post-processed (rounded, clamped, monotone),
    from the valid events (one row each), or with ``counted`` from their counts."""
    # user level: each user's first contributions in input order (the local engine's)
    per_user = {"user_col": "user", "order_col": "pos"} if job.user_field is not None else {}
    if isinstance(mech, SparkKnownBase):
        if domain_df is None:  # pragma: no cover - made with the known mechanism above
            raise RuntimeError("the known mechanism has no domain frame")
        if counted:
            released = mech.run_grouped_counts(events, domain_df, steps=steps)
        else:
            released = mech.run(events, domain_df, steps=steps, **per_user)
    elif counted:
        released = mech.run_grouped_counts(events, steps=steps)
    else:
        released = mech.run(events, steps=steps, **per_user)
    if opts.get("round"):
        released = released.withColumn("value", F.bround("value", 0).cast("long"))
    return readable_counts(
        released, clamp=bool(opts.get("clamp")), monotone=bool(opts.get("monotone"))
    )
