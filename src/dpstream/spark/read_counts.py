"""JSON Lines events read by Spark straight into per-(step, item) counts.

Layer 6 of dpstream (Spark), used by :mod:`dpstream.spark.command`. An
event-level run (no ``--user-field``) releases from the counts of each step's
items and reads nothing else of an event, so the Python workers that parse the
lines (the local engine's decisions, :func:`dpstream.spark.read_jsonl.plain_event`
and :func:`dpstream.io.jsonl.parse_jsonl_line`) also apply the local engine's
per-event rules and count what is kept, instead of sending every event back to
the JVM as a row with an array to be exploded and grouped there:

* a line that is no record (blank) is passed over; a record with an error is
  counted as ``bad``;
* an event without a step (``"t": null``, which the local engine counts in the
  step of the record before it) is counted in ``unstepped`` and nothing else
  (the caller then reads the events, whose order that needs);
* any other event is counted in ``events``; its items are made distinct in
  their order (``dict.fromkeys``, as the local engine); it is ``late`` when its
  step is past ``until``, else ``oversized`` when it has more than ``max_items``
  distinct items (or a null item), else, given a known ``domain`` (KnownBase with
  ``--on-invalid skip``), ``outside`` when an item is not in it, and counts
  nothing (the caller skips these, or stops the run: :mod:`dpstream.spark.command`);
* each distinct item of any other event adds 1 to its (step, item) count.

On integer steps (no clock) a task gathers about 2 MB of lines at a time; when
the local engine's chunked reader would give every one of them to Arrow's JSON
reader and Arrow takes them all (:func:`dpstream.io.jsonl.arrow_chunk`), the
rules above are applied to the chunk's columns with NumPy (:func:`count_chunk`).
Else (a line with an escape, an item that is not a string, a long line), and on
a clock, each line is decided alone (:func:`count_lines`, whose fast path for a
plain event is faster than the chunk reader's fallback, the full parse of every
line). The tests hold both to a brute force of the rules, one parse per line.

A task counts into rows of :data:`COUNTED_SCHEMA` (one per (step, item) it saw,
and one per total, steps below 1) and sends them regrouped (:func:`group_counts`,
:data:`GROUPED_SCHEMA`): one row per item with its steps and counts as lists, up
to ``_FLUSH`` pairs at a time so memory stays bounded, and one row of its totals.
Spark adds the partial counts of an item where its releases are computed
(:func:`dpstream.spark.kernels.release_run_arrow` with ``grouped`` sums the
entries of an item and step). The line numbers are not computed: a run that needs them (user-level
bounding, or ``--on-invalid error`` with a bad line, whose message names it)
reads the events themselves (:mod:`dpstream.spark.read_jsonl`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import Any

import numpy as np

from ..io.arrow import arrow_ints
from ..io.chunks import INT64_MAX, Chunk
from ..io.jsonl import arrow_chunk, parse_jsonl_line
from ..io.lines import arrow_line_block
from .read_jsonl import _check_zone_rules, input_text, plain_event, zone_rules

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = [
    "COUNTED_SCHEMA",
    "GROUPED_SCHEMA",
    "TOTALS",
    "counted_lines",
    "count_chunk",
    "count_lines",
    "group_counts",
]

#: A row of partial counts (t >= 1, item, n) or of one of a task's totals (t = -1 - k
#: for the k-th of :data:`TOTALS`, item null, n the total), as a task counts them
#: (:func:`group_counts` then regroups them by item for the JVM).
COUNTED_SCHEMA = T.StructType(
    [
        T.StructField("t", T.LongType(), True),
        T.StructField("item", T.StringType(), True),
        T.StructField("n", T.LongType(), True),
    ]
)
#: The totals a task counts, in the order of their rows' steps -1, -2, ...
TOTALS = ("events", "bad", "late", "oversized", "outside", "unstepped")

#: What a task sends the JVM: one row per item it counted, with the steps (ascending)
#: and counts of its (step, item) pairs as two lists, and one row of its totals (item
#: null; the steps -1, -2, ... and the totals in the order of :data:`TOTALS`). The JVM
#: converts, caches and shuffles some 10^5 rows for 10^6 events, not a row per pair
#: (3.3 x 10^6 for 2 x 10^6 events of issue 31's stream).
GROUPED_SCHEMA = T.StructType(
    [
        T.StructField("item", T.StringType(), True),
        T.StructField("ts", T.ArrayType(T.LongType()), False),
        T.StructField("ns", T.ArrayType(T.LongType()), False),
    ]
)

#: Distinct (step, item) pairs a task holds before it sends them on.
_FLUSH = 1 << 20
#: Bytes of lines a task gathers before it parses them as one chunk (on integer steps).
_CHUNK_BYTES = 1 << 21


def counted_lines(
    spark: SparkSession,
    path: str,
    *,
    until: int,
    max_items: int,
    domain: Callable[[], Container[str]] | None = None,
    time_field: str | None = None,
    clock: Any = None,
) -> DataFrame:
    """The input's events counted (not cached): rows of :data:`COUNTED_SCHEMA`, partial
    counts of the valid events' items and rows of totals per task (see the module
    docstring); ``domain``, run in the workers, gives the known items (e.g. from a
    broadcast variable); ``time_field`` and ``clock`` as for
    :func:`dpstream.spark.read_jsonl.read_events_jsonl`."""
    lines = input_text(spark, path).select(F.col("value").cast("binary").alias("value"))
    rules = zone_rules(clock, until)
    counter = _arrow_counter(until, max_items, domain, time_field, clock, rules)

    def grouped(batches: Iterator[Any]) -> Iterator[Any]:
        return group_counts(counter(batches))

    return lines.mapInArrow(grouped, GROUPED_SCHEMA)


def group_counts(flat: Iterator[Any]) -> Iterator[Any]:
    """A task's batches of :data:`COUNTED_SCHEMA` as batches of :data:`GROUPED_SCHEMA`:
    the partial counts gathered (up to :data:`_FLUSH` pairs at a time, so memory stays
    bounded) into one row per item, a (step, item) counted in two chunks added into one
    entry; the totals row last."""
    import pyarrow as pa

    held: list[Any] = []
    size = 0
    for batch in flat:
        if batch.num_rows and batch.column("t")[0].as_py() < 0:  # the totals, last
            if held:
                yield _grouped_batch(pa, held)
            yield _grouped_totals(pa, batch)
            held, size = [], 0
            continue
        held.append(batch)
        size += batch.num_rows
        if size >= _FLUSH:
            yield _grouped_batch(pa, held)
            held, size = [], 0
    if held:
        yield _grouped_batch(pa, held)


def _grouped_batch(pa: Any, batches: list[Any]) -> Any:
    """Flat partial counts (t, item, n) as one row per item with its steps (ascending)
    and counts, the counts of one (step, item) added."""
    table = pa.Table.from_batches(batches)
    items = table.column("item").combine_chunks()
    enc = items.dictionary_encode()
    codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    ts = np.asarray(table.column("t").to_numpy(), dtype=np.int64)
    ns = np.asarray(table.column("n").to_numpy(), dtype=np.int64)
    order = np.lexsort((ts, codes))
    codes, ts, ns = codes[order], ts[order], ns[order]
    if len(codes):
        new = np.ones(len(codes), dtype=bool)
        new[1:] = (codes[1:] != codes[:-1]) | (ts[1:] != ts[:-1])
        starts = np.flatnonzero(new)
        codes, ts, ns = codes[starts], ts[starts], np.add.reduceat(ns, starts)
    first = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else codes
    offsets = pa.array(np.r_[first, len(codes)].astype(np.int32))
    return pa.RecordBatch.from_arrays(
        [
            enc.dictionary.take(pa.array(codes[first])).cast(pa.string()),
            pa.ListArray.from_arrays(offsets, pa.array(ts, pa.int64())),
            pa.ListArray.from_arrays(offsets, pa.array(ns, pa.int64())),
        ],
        schema=_arrow_grouped_schema(pa),
    )


def _grouped_totals(pa: Any, totals: Any) -> Any:
    """A task's totals row (:func:`_totals_batch`) in :data:`GROUPED_SCHEMA`."""
    d = totals.to_pydict()
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(1, pa.string()),
            pa.array([d["t"]], pa.list_(pa.int64())),
            pa.array([d["n"]], pa.list_(pa.int64())),
        ],
        schema=_arrow_grouped_schema(pa),
    )


def _arrow_grouped_schema(pa: Any) -> Any:
    return pa.schema(
        [
            pa.field("item", pa.string()),
            pa.field("ts", pa.list_(pa.int64()), False),
            pa.field("ns", pa.list_(pa.int64()), False),
        ]
    )


def _arrow_counter(
    until: int,
    max_items: int,
    domain: Callable[[], Container[str]] | None,
    time_field: str | None,
    clock: Any,
    rules: tuple[int, str] | None = None,
) -> Any:
    """The ``mapInArrow`` function: a task's lines counted (:func:`count_lines`); first,
    with ``rules``, the worker's zone database checked
    (:func:`dpstream.spark.read_jsonl.zone_rules`)."""

    def count(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        _check_zone_rules(clock, rules)
        if clock is None and time_field is None:
            yield from _count_chunks(pa, batches, until, max_items, domain)
            return
        counts: dict[tuple[int, str], int] = {}
        totals = [0] * len(TOTALS)
        known = None if domain is None else domain()
        for batch in batches:
            count_lines(
                batch.column("value").to_pylist(),
                counts,
                totals,
                until=until,
                max_items=max_items,
                domain=known,
                time_field=time_field,
                clock=clock,
            )
            if len(counts) >= _FLUSH:
                yield _counts_batch(pa, counts)
                counts = {}
        if counts:
            yield _counts_batch(pa, counts)
        yield _totals_batch(pa, totals)

    return count


def _count_chunks(
    pa: Any,
    batches: Iterator[Any],
    until: int,
    max_items: int,
    domain: Callable[[], Container[str]] | None,
) -> Iterator[Any]:
    """A task's lines on integer steps, about :data:`_CHUNK_BYTES` at a time, parsed as
    chunks and counted (:func:`count_chunk`); its totals last."""
    totals = [0] * len(TOTALS)
    known = None if domain is None else domain()
    held: list[Any] = []
    size = 0
    for batch in batches:
        held.append(batch.column("value"))
        size += held[-1].nbytes
        if size >= _CHUNK_BYTES:
            yield _chunk_counts(pa, held, totals, until, max_items, known)
            held, size = [], 0
    if held:
        yield _chunk_counts(pa, held, totals, until, max_items, known)
    yield _totals_batch(pa, totals)


def _chunk_counts(
    pa: Any,
    arrays: list[Any],
    totals: list[int],
    until: int,
    max_items: int,
    known: Container[str] | None,
) -> Any:
    lines = pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]
    chunk = arrow_chunk(arrow_line_block(lines))
    if chunk is None:  # a line Arrow does not take: every line decided alone, as on a clock
        counts: dict[tuple[int, str], int] = {}
        count_lines(
            lines.to_pylist(), counts, totals, until=until, max_items=max_items, domain=known
        )
        return _counts_batch(pa, counts)
    ts, items, ns = count_chunk(chunk, totals, until=until, max_items=max_items, domain=known)
    return pa.RecordBatch.from_arrays(
        [pa.array(ts, pa.int64()), items, pa.array(ns, pa.int64())], names=COUNTED_SCHEMA.names
    )


def _totals_batch(pa: Any, totals: list[int]) -> Any:
    """The rows of a task's totals (:data:`COUNTED_SCHEMA`: steps -1, -2, ... in the
    order of :data:`TOTALS`, no item)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(-1, -1 - len(totals), -1), pa.int64()),
            pa.nulls(len(totals), pa.string()),
            pa.array(totals, pa.int64()),
        ],
        names=COUNTED_SCHEMA.names,
    )


def count_chunk(
    chunk: Chunk,
    totals: list[int],
    *,
    until: int,
    max_items: int,
    domain: Container[str] | None = None,
) -> tuple[np.ndarray, Any, np.ndarray]:
    """The records of ``chunk`` (integer steps) counted by the rules of the module
    docstring, as :func:`count_lines` counts the same lines: adds to ``totals``
    ([events, bad, late, oversized, outside, unstepped]) and returns the kept events'
    counts as (steps, items as an Arrow string array, counts), one entry per distinct
    (step, item) of the chunk.

    Raises:
        ValueError: an event with a step < 1 (which the parser never gives).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(chunk)
    bad = np.zeros(n, dtype=bool)
    if chunk.errors:
        bad[np.fromiter(chunk.errors, np.int64, len(chunk.errors))] = True
    t = chunk.t
    if t.dtype == object:  # a step past int64 (never within until): as the largest
        t = np.array([min(int(x), INT64_MAX) for x in t.tolist()], dtype=np.int64)
    unstepped = ~bad & (t == 0)
    event = ~bad & ~unstepped
    if (t[event] < 1).any():
        raise ValueError("an event has a time step < 1")
    late = event & (t > until)
    # the chunk's items, each distinct value once (Arrow's rows and the one-line
    # parser's have codes of their own), and each record's distinct items
    enc = pc.dictionary_encode(pa.array(chunk.items, pa.string()))
    values = enc.dictionary
    k = len(values) + 1  # code len(values): a null item
    remap = arrow_ints(enc.indices.fill_null(len(values))) if len(enc) else np.zeros(0, np.int64)
    sizes = np.diff(chunk.offsets)
    owner = np.repeat(np.arange(n, dtype=np.int64), sizes)
    pairs = _distinct_in_records(owner * k + remap[chunk.codes], sizes)  # (record, item)
    rec, code = pairs // k, pairs % k
    distinct = np.bincount(rec, minlength=n)
    has_null = np.zeros(n, dtype=bool)
    has_null[rec[code == len(values)]] = True
    oversized = event & ~late & ((distinct > max_items) | has_null)
    outside = np.zeros(n, dtype=bool)
    if domain is not None:
        known = np.fromiter((x in domain for x in values.to_pylist()), bool, len(values))
        outside[rec[~np.append(known, True)[code]]] = True
        outside &= event & ~late & ~oversized
    kept = event & ~late & ~oversized & ~outside
    for i, flags in enumerate((event, bad, late, oversized, outside, unstepped)):
        totals[i] += int(np.count_nonzero(flags))
    take = kept[rec]
    # each (step, item) once with its events, keyed by the step's rank among the chunk's
    # steps (a step itself may be near 2^63 with a tree counter: step * k would overflow)
    steps, rank = np.unique(t[rec[take]], return_inverse=True)
    keys, counts = np.unique(rank * k + code[take], return_counts=True)
    return steps[keys // k], values.take(pa.array(keys % k)), counts


#: Up to this many items in its largest record, a chunk's (record, item) keys are made
#: distinct by comparing each with the keys before it in its record, not by a sort.
_SHIFTS = 32


def _distinct_in_records(keys: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Each of ``keys`` once, where a key is record * k + item code and the keys come in
    runs of one record each (``sizes`` long): the first of each key's occurrences, in
    input order. Records are short (``--max-items``), so a key is compared with the
    ones up to the largest record's size before it (equal keys are of one record);
    NumPy's sort over the whole chunk took 55 times as long (0.17 s against 3 ms on
    10 chunks of 2 MB of issue 31's stream). A chunk with a longer record is sorted
    (np.unique: the same keys, in ascending order; no caller depends on the order)."""
    longest = int(sizes.max()) if len(sizes) else 0
    if longest > _SHIFTS:
        return np.unique(keys)
    first = np.ones(len(keys), dtype=bool)
    for back in range(1, longest):
        first[back:] &= keys[back:] != keys[:-back]
    return keys[first]


def _counts_batch(pa: Any, counts: dict[tuple[int, str], int]) -> Any:
    """Partial counts as a record batch of :data:`COUNTED_SCHEMA`."""
    n = len(counts)
    ts, items = zip(*counts, strict=True) if n else ((), ())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ts, pa.int64()),
            pa.array(items, pa.string()),
            pa.array(list(counts.values()), pa.int64()),
        ],
        names=COUNTED_SCHEMA.names,
    )


def count_lines(
    raws: list[Any],
    counts: dict[tuple[int, str], int],
    totals: list[int],
    *,
    until: int,
    max_items: int,
    domain: Container[str] | None = None,
    time_field: str | None = None,
    clock: Any = None,
) -> None:
    """Add the lines ``raws`` (their bytes) to ``counts`` ((t, item) -> n) and to
    ``totals`` ([events, bad, late, oversized, outside, unstepped]), each line decided
    as the local engine
    decides it and each event by the rules of the module docstring.

    Raises:
        ValueError: an event with a step < 1 or without items (which the parser never
            gives).
    """
    plain = clock is None
    get = counts.get
    events = bad = late = oversized = outside = unstepped = 0
    t: int | None
    items: Any
    for raw in raws:
        got = plain_event(raw) if plain else None
        if got is not None:
            t, items = got[0], got[1]
        else:
            rec = parse_jsonl_line(
                raw.decode("utf-8", "surrogateescape"), 1, time_field=time_field, clock=clock
            )
            if rec is None:  # a blank line: no record
                continue
            if rec.error is not None:
                bad += 1
                continue
            t = rec.t if rec.t is None else min(rec.t, INT64_MAX)
            items = rec.items
        if t is None:
            unstepped += 1
            continue
        events += 1
        if t < 1 or items is None:
            raise ValueError("an event has a time step < 1 or no items")
        distinct = dict.fromkeys(items)
        if t > until:
            late += 1
            continue
        if len(distinct) > max_items or None in distinct:
            oversized += 1
            continue
        if domain is not None and not all(item in domain for item in distinct):
            outside += 1
            continue
        for item in distinct:
            key = (t, item)
            counts[key] = get(key, 0) + 1
    totals[0] += events
    totals[1] += bad
    totals[2] += late
    totals[3] += oversized
    totals[4] += outside
    totals[5] += unstepped
