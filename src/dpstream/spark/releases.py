"""KnownBase and UnkBase releases from Spark DataFrames of counts.

The practical mechanisms need only the prefix histogram h_t, t and the key
(the aggregate mode, docs/architecture.md), so on Spark a release is one ``mapInPandas``
over the (item, count) rows: every executor adds the keyed tree noise of its
own items (``dpstream.spark.kernels``), and no item is ever collected to the
driver. The releases are bit-identical to the local engine's
``release(t, counts)`` for the same key, stream and parameters.

The key reaches the executors as a Spark broadcast of its 32 secret bytes
(see docs/spark.md for what that implies and how to protect it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..factorization import BLTStrategy
from ..mechanisms.base import check_domain, check_max_items, check_next_step
from ..mechanisms.columns import MAX_COUNT
from ..mechanisms.counters import blt_purpose
from ..mechanisms.known import (
    KnownDomainHistogram,
    combine_fingerprints,
    domain_tag,
    item_fingerprint,
    tree_purpose,
)
from ..mechanisms.params import HistogramParams, UnknownParams
from ..noise import DEFAULT_NOISE_VERSION, NoiseKey, canonical_item
from .kernels import (
    KNOWN,
    STATE_FLAG,
    STATE_IDS,
    UNKNOWN,
    ReleaseSpec,
    release_run_arrow,
    release_step_batch,
    release_stream_batch,
    state_noise_cols,
)
from .paths import literal_col

try:  # PySpark is the optional extra ``dpstream[spark]``
    from pyspark.sql import Column, DataFrame, Row, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["SparkKnownBase", "SparkUnknownBase", "update_counts", "increments"]

_ITEM_TYPES = (T.StringType, T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BinaryType)


def _check_item_type(dtype: T.DataType, what: str) -> None:
    if not isinstance(dtype, _ITEM_TYPES):
        raise TypeError(
            f"{what} must be string, integer or binary (dpstream items are str, int or bytes), "
            f"got {dtype.simpleString()}"
        )


def _check_same_item_kind(domain_type: T.DataType, event_type: T.DataType) -> None:
    """Refuse a domain and events whose items are of different kinds (str, int, bytes).

    A union would coerce one to the other, and ``"5"`` would meet ``5``: they
    are different items in dpstream.
    """

    def kind(dtype: T.DataType) -> str:
        if isinstance(dtype, T.StringType):
            return "string"
        if isinstance(dtype, T.BinaryType):
            return "binary"
        return "integer"

    if kind(domain_type) != kind(event_type):
        raise TypeError(
            f"the domain holds {kind(domain_type)} items but the events hold "
            f"{kind(event_type)} items"
        )


def _column_type(df: DataFrame, name: str) -> T.DataType:
    try:
        return df.schema[name].dataType
    except (KeyError, LookupError):
        raise ValueError(f"the DataFrame has no column {name!r} (columns: {df.columns})") from None


def _first_row(df: DataFrame) -> Row:
    """The first row of ``df``, which the caller knows has one (a global aggregate, say)."""
    row = df.first()
    if row is None:
        raise RuntimeError("Spark gave no row where one is always expected")
    return row


def _fail(message: Column) -> Column:
    """A column that fails the Spark job with ``message`` when evaluated."""
    return F.raise_error(F.concat(F.lit("dpstream: "), message))


def _key_handle(spark: SparkSession, key: NoiseKey) -> Callable[[], bytes]:
    """Ship the key's bytes to the executors once, as a broadcast variable.

    Returns a function, run on the executor, that gives the bytes back. Under
    Spark Connect (no SparkContext) the bytes travel inside the task closure
    instead; both carry the secret, see docs/spark.md.
    """
    try:
        broadcast = spark.sparkContext.broadcast(key.to_bytes())
    except Exception:  # Spark Connect has no SparkContext
        secret = key.to_bytes()
        return lambda: secret
    return lambda: broadcast.value


def _checked_items(events: DataFrame, items_col: str, max_items: int | None) -> Column:
    """An event's distinct items; more than ``max_items`` (if given) or a null item fails."""
    items_type = _column_type(events, items_col)
    if not isinstance(items_type, T.ArrayType):
        raise TypeError(f"{items_col!r} must be an array of items, got {items_type.simpleString()}")
    _check_item_type(items_type.elementType, f"the elements of {items_col!r}")
    distinct = F.array_distinct(literal_col(items_col))
    checked = F.when(
        F.exists(distinct, lambda x: x.isNull()),
        _fail(F.lit("InvalidEventError: an event holds a null item")),
    )
    if max_items is not None:
        checked = checked.when(
            F.size(distinct) > max_items,
            _fail(
                F.concat(
                    F.lit("InvalidEventError: an event has "),
                    F.size(distinct).cast("string"),
                    F.lit(f" distinct items, more than max_items={max_items}"),
                )
            ),
        )
    return checked.otherwise(distinct)


def increments(
    events: DataFrame,
    *,
    max_items: int,
    items_col: str = "items",
    item_col: str = "item",
    group_cols: Sequence[str] = (),
) -> DataFrame:
    """Per-item count increments of a DataFrame of events (one row per event).

    An event is the set of its items (duplicates in one event count once), as
    in the local engine. An event with more than ``max_items`` distinct items,
    or with a null item, fails the job: the privacy guarantee assumes the l0
    bound Delta0. Returns columns ``group_cols...``, ``item_col``, ``n``.
    """
    max_items = check_max_items(max_items)
    checked = _checked_items(events, items_col, max_items)
    groups = [F.col(c) for c in group_cols]
    exploded = events.select(*groups, F.explode(checked).alias(item_col))
    return exploded.groupBy(*group_cols, item_col).agg(F.count(F.lit(1)).alias("n"))


def update_counts(
    previous: DataFrame | None,
    events: DataFrame,
    *,
    max_items: int,
    items_col: str = "items",
    item_col: str = "item",
    count_col: str = "count",
    closed: bool = False,
    carry: Sequence[str] = (),
) -> DataFrame:
    """The prefix counts after one more step: ``previous`` plus the step's events.

    Args:
        previous: (item, count) prefix counts up to the last step, one row per
            item, or ``None`` at the first step.
        events: the events of the step, one row per event, items in ``items_col``.
        max_items: Delta0; a larger event fails the job.
        closed: the domain is known and ``previous`` lists all of it (with
            zero counts): an item outside it fails the job (KnownBase).
        carry: more columns of ``previous`` to keep beside the new count
            (null for an item that first appears in ``events``), in the same
            join: e.g. the streaming runner's released flags and noise state.

    Counts only grow, so a release from the result never sees a decrease.
    """
    inc = increments(events, max_items=max_items, items_col=items_col, item_col=item_col)
    if previous is None:
        if closed:
            raise ValueError("closed=True needs the previous counts (the domain with zeros)")
        return inc.select(item_col, F.col("n").alias(count_col))
    prev = previous.select(item_col, F.col(count_col).cast("long").alias("_prev"), *carry)
    joined = prev.join(inc, on=item_col, how="full")
    new = F.coalesce(F.col("_prev"), F.lit(0)) + F.coalesce(F.col("n"), F.lit(0))
    if closed:
        new = F.when(
            F.col("_prev").isNull(),
            # (no item in the message: it goes to the executors' logs and the Spark UI)
            _fail(F.lit("InvalidEventError: an item is not in the domain (or is null)")),
        ).otherwise(new)
    return joined.select(item_col, new.cast("long").alias(count_col), *carry)


class _SparkRelease:
    """Shared by the Spark KnownBase and UnkBase: parameters, key and the two release paths."""

    spec: ReleaseSpec
    mechanism: Any

    def __init__(self, spark: SparkSession, key: NoiseKey, item_col: str, count_col: str) -> None:
        if not isinstance(key, NoiseKey):
            raise TypeError(f"key must be a dpstream.NoiseKey, got {type(key).__name__}")
        self.spark = spark
        self.item_col = item_col
        self.count_col = count_col
        self._key_bytes = _key_handle(spark, key)
        self.key_fingerprint = key.fingerprint()
        self.t = 0

    # -- facts, from the local mechanism -------------------------------------
    @property
    def privacy(self):
        """The guarantee, exactly as the local mechanism states it."""
        return self.mechanism.privacy

    @property
    def tau(self) -> float:
        return self.mechanism.tau

    @property
    def base(self) -> int | None:
        return self.mechanism.base

    @property
    def counter(self) -> str:
        return str(self.mechanism.counter)

    @property
    def levels(self) -> int:
        return self.mechanism.levels

    @property
    def horizon(self) -> int:
        return self.mechanism.horizon

    @property
    def max_items(self) -> int | None:
        return self.mechanism.max_items

    @property
    def user_bounds(self) -> Any:
        """The per-user bounds (:class:`~dpstream.bounding.UserBounds`), or None per event."""
        return self.mechanism.user_bounds

    def _users(self, user_col: str | None, order_col: str | None) -> tuple | None:
        """(bounds, user column, order column) at user level, else None; checked."""
        if self.user_bounds is None:
            if user_col is not None:
                raise ValueError(
                    "user_col applies to user-level privacy: build the mechanism "
                    "with max_items_per_user= and max_count_per_item="
                )
            return None
        if user_col is None or order_col is None:
            raise ValueError(
                "a user-level run needs user_col (each event's user id) and "
                "order_col (its arrival order, e.g. the input line)"
            )
        return self.user_bounds, user_col, order_col

    def _spec_for(self, steps: Sequence[int]) -> ReleaseSpec:
        """The executors' spec for releases at ``steps``."""
        return self.spec

    # -- one step ----------------------------------------------------------------
    def _prepare_counts(self, counts: DataFrame, assume_unique: bool) -> DataFrame:
        item_col, count_col = self.item_col, self.count_col
        _check_item_type(_column_type(counts, item_col), f"column {item_col!r}")
        ctype = _column_type(counts, count_col)
        if not isinstance(ctype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
            raise TypeError(f"column {count_col!r} must hold integers, got {ctype.simpleString()}")
        counts = counts.select(item_col, F.col(count_col).cast("long").alias(count_col))
        if not assume_unique:
            # Two rows of one item would get the same noise, and the difference
            # of their releases would be the difference of their true counts.
            counts = counts.groupBy(item_col).agg(F.sum(count_col).cast("long").alias(count_col))
        return counts

    def _full_frame(self, t: int, counts: DataFrame, shown_col: str | None = None) -> DataFrame:
        """Step t for unique (item, count[, shown]) rows: (t, item, count, released, value).

        No ordering check: the callers check (or, replaying a streaming step,
        recompute the very same release).
        """
        item_col, count_col = self.item_col, self.count_col
        schema = T.StructType(
            [
                T.StructField(item_col, counts.schema[item_col].dataType, False),
                T.StructField(count_col, T.LongType(), False),
                T.StructField("released", T.BooleanType(), False),
                T.StructField("value", T.DoubleType(), False),
            ]
        )
        spec, key_bytes = self.spec, self._key_bytes

        def run(batches):
            return release_step_batch(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                t=t,
                item_col=item_col,
                count_col=count_col,
                shown_col=shown_col,
            )

        cols = [item_col, count_col] + ([shown_col] if shown_col else [])
        out = counts.select(*cols).mapInPandas(run, schema)
        return out.select(
            F.lit(t).cast("long").alias("t"), item_col, count_col, "released", "value"
        )

    def _stream_frame(
        self,
        t: int,
        prev_t: int,
        rows: DataFrame,
        *,
        shown_col: str | None = None,
        with_state: bool = True,
    ) -> DataFrame:
        """Streaming step t from unique rows carrying each item's noise state at prev_t.

        ``rows``: item, count (h_t), [``shown_col``,] and with ``with_state`` the
        columns ``STATE_FLAG``, ``STATE_IDS`` and ``state_noise_cols(L)``
        (``kernels.release_stream_batch``). Returns item, count, released, value
        and the state at t: the next step's snapshot. No ordering check (the
        streaming runner releases steps in order, on its public clock).
        """
        item_col, count_col = self.item_col, self.count_col
        noise_cols = state_noise_cols(self.spec.levels)
        schema = T.StructType(
            [
                T.StructField(item_col, rows.schema[item_col].dataType, False),
                T.StructField(count_col, T.LongType(), False),
                T.StructField("released", T.BooleanType(), False),
                T.StructField("value", T.DoubleType(), False),
            ]
            + [T.StructField(c, T.LongType(), False) for c in STATE_IDS]
            + [T.StructField(c, T.DoubleType(), False) for c in noise_cols]
        )
        spec, key_bytes = self._spec_for([t]), self._key_bytes

        def run(batches):
            return release_stream_batch(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                t=t,
                prev_t=prev_t,
                item_col=item_col,
                count_col=count_col,
                shown_col=shown_col,
                with_state=with_state,
            )

        cols = [item_col, count_col] + ([shown_col] if shown_col else [])
        if with_state:
            cols += [STATE_FLAG, *STATE_IDS, *noise_cols]
        return rows.select(*cols).mapInPandas(run, schema)

    @staticmethod
    def _released(full: DataFrame, item_col: str) -> DataFrame:
        return full.where(F.col("released")).select("t", item_col, "value")

    def _next_step(self, t: int) -> None:
        check_next_step(t, self.t, self.horizon)
        self.t = int(t)

    def _claim_steps(self, steps: Sequence[int]) -> list[int]:
        """Check a set of release steps (all after the last released one) and claim them."""
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence | range):
            raise TypeError("steps must be a sequence of ints")
        ordered = sorted(set(steps))
        if not ordered:
            raise ValueError("steps must name at least one time step")
        last = self.t
        for s in ordered:
            check_next_step(s, last, self.horizon)
            last = s
        self.t = last
        return [int(s) for s in ordered]

    # -- many steps in one job --------------------------------------------------
    def _run_flat(
        self, flat: DataFrame, steps: list[int], *, closed: bool, grouped: bool = False
    ) -> DataFrame:
        """All releases at the claimed ``steps`` from flat (item, t, n) rows, or with
        ``grouped`` (item, ts, ns) rows (an item's steps and counts as lists), in one job.

        The rows are hash-partitioned by item, so each item's rows meet in one
        partition; one ``mapInArrow`` pass per partition then hashes each item
        once and advances its tree noise through the steps incrementally
        (``kernels.release_run_arrow``). No list column, no join, no pandas.
        """
        item_col = self.item_col
        schema = T.StructType(
            [
                T.StructField("t", T.LongType(), False),
                T.StructField(item_col, flat.schema[item_col].dataType, False),
                T.StructField("value", T.DoubleType(), False),
            ]
        )
        spec, key_bytes = self._spec_for(steps), self._key_bytes

        def run(batches):
            return release_run_arrow(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                steps=steps,
                item_col=item_col,
                closed=closed,
                grouped=grouped,
            )

        if not grouped:  # (the kernel leaves out a grouped row's steps past the last)
            flat = flat.where(F.col("t") <= steps[-1])
        return flat.repartition(item_col).mapInArrow(run, schema)

    def close(self) -> None:
        """Forget the broadcast key on the executors (DataFrames built before stop working)."""
        holder = getattr(self._key_bytes, "__closure__", None) or ()
        for cell in holder:
            value = cell.cell_contents
            if hasattr(value, "destroy"):
                value.destroy()


def spark_domain_tag(domain: DataFrame, item_col: str = "item") -> str:
    """:func:`dpstream.mechanisms.known.domain_tag` of a domain DataFrame, by one Spark job.

    Each partition adds its items' fingerprints; the driver adds the partial
    sums (the tag is order-independent, so the partitioning does not matter).
    """
    _check_item_type(_column_type(domain, item_col), "the domain's item column")

    def partial(batches):
        import pandas as pd

        for pdf in batches:
            values = pdf[item_col].tolist()
            total = sum(item_fingerprint(canonical_item(v)) for v in values) % (1 << 128)
            yield pd.DataFrame({"sum": [str(total)], "n": [len(values)]})

    rows = domain.select(item_col).distinct().mapInPandas(partial, "sum string, n long").collect()
    return combine_fingerprints(sum(int(r["sum"]) for r in rows), sum(int(r["n"]) for r in rows))


class SparkKnownBase(_SparkRelease):
    """KnownBase (Algorithm 2, ``algo:KnownBase``) on Spark, from aggregated counts.

    The same mechanism as :class:`dpstream.KnownDomainHistogram` (and built from
    it, so tau, the base and the guarantee are the local engine's): the noisy
    count of item u at t is h_t^u plus the keyed noise of the cells I_t(r),
    N(0, L_r tau^2) per cell. Privacy (KnownBase lemma, Sec. 3): Delta0/(2 tau^2)-
    zCDP when every event holds at most ``max_items`` = Delta0 items; ``.privacy``
    states it.

    User-level privacy (``max_items_per_user=``, ``max_count_per_item=``, as
    locally): :meth:`run` then takes each event's user id and arrival order and
    keeps every user within the bounds (first come, first kept, by window
    functions: :mod:`dpstream.spark.bounding`), whatever the partitioning, with
    the local engine's result; ``.privacy`` is the local per-user guarantee.

    Args:
        spark: the SparkSession.
        horizon, max_items, key, counter, base, rho | epsilon, delta | tau, stream,
            max_items_per_user, max_count_per_item, noise_version:
            as for :class:`dpstream.KnownDomainHistogram` (a BLT counter runs every
            step of an item's noise on its executor, as locally).
        domain: the domain, as a DataFrame with the item column (its
            fingerprint is computed by a Spark job) or a sequence of items. It
            is part of the noise purpose, as on the local engine (another
            domain filters other items, so it must draw other noise); releases
            must then be over this domain.
        item_col, count_col: the column names of the counts DataFrames.

    Example:
        >>> m = SparkKnownBase(spark, 1000, max_items=3, key=key, rho=0.5,
        ...                    domain=domain_df)  # doctest: +SKIP
        >>> m.release(1, counts_df, domain=domain_df).write.parquet("out/t=1")  # doctest: +SKIP
    """

    def __init__(
        self,
        spark: SparkSession,
        horizon: int | None,
        *,
        max_items: int | None = None,
        key: NoiseKey,
        counter: str | BLTStrategy | None = None,
        base: int | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        stream: str = "default",
        domain: DataFrame | Sequence[Any],
        item_col: str = "item",
        count_col: str = "count",
        max_items_per_user: int | None = None,
        max_count_per_item: int | None = None,
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        #: the settings, one frozen value (:meth:`from_params` takes one)
        self.params = HistogramParams(
            horizon=horizon,
            max_items=max_items,
            counter=counter,
            base=base,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            stream=stream,
            max_items_per_user=max_items_per_user,
            max_count_per_item=max_count_per_item,
            noise_version=noise_version,
        )
        # The local class fixes every parameter; its one-item domain is a placeholder,
        # and the noise purpose is the local one for the real domain's fingerprint.
        self.mechanism = KnownDomainHistogram.from_params(
            ["dpstream.spark:parameters"], self.params, key=key
        )
        m = self.mechanism
        users = None if m.user_bounds is None else m.user_bounds.tag()
        if isinstance(domain, DataFrame):
            self.domain_tag = spark_domain_tag(domain, item_col)
        else:
            self.domain_tag = domain_tag(check_domain(domain, key)[0])
        if m.strategy is None:
            cell_std = float(np.sqrt(m.levels) * m.tau)
            m.tree_purpose = tree_purpose(
                m.stream,
                horizon=m.horizon,
                base=m.base,
                cell_std=cell_std,
                max_items=m.max_items,
                domain=self.domain_tag,
                users=users,
                noise_version=m.noise_version,
            )
            m.noise_purpose = m.tree_purpose
        else:  # a BLT counter: its draws' sigma, and the purpose for the real domain
            cell_std = float(m.sigma)
            m.noise_purpose = blt_purpose(
                m.stream,
                strategy=m.strategy,
                sigma=m.sigma,
                max_items=m.max_items,
                domain=self.domain_tag,
                users=users,
                noise_version=m.noise_version,
            )
        self.spec = ReleaseSpec(
            mechanism=KNOWN,
            horizon=m.horizon,
            base=m.base,
            cell_std=cell_std,
            purpose=m.noise_purpose,
            strategy=m.strategy,
        )
        super().__init__(spark, key, item_col, count_col)

    @classmethod
    def from_params(
        cls,
        spark: SparkSession,
        params: HistogramParams,
        *,
        key: NoiseKey,
        domain: DataFrame | Sequence[Any],
        item_col: str = "item",
        count_col: str = "count",
    ) -> SparkKnownBase:
        """The Spark twin of ``KnownDomainHistogram.from_params(domain, params, key=key)``."""
        return cls(
            spark,
            params.horizon,
            key=key,
            domain=domain,
            item_col=item_col,
            count_col=count_col,
            **params.kwargs(),
        )

    def counts_with_domain(self, counts: DataFrame, domain: DataFrame) -> DataFrame:
        """(item, count) over the whole domain: missing items count 0; an item outside fails."""
        item_col, count_col = self.item_col, self.count_col
        dom = domain.select(item_col).distinct().withColumn("_in", F.lit(True))
        given = counts.withColumn("_given", F.lit(True))
        joined = dom.join(given, on=item_col, how="full")
        # (no item in the messages: they go to the executors' logs and the Spark UI)
        count = (
            F.when(
                F.col("_in").isNull(),
                _fail(F.lit("InvalidEventError: an item is not in the domain (or is null)")),
            )
            .when(
                F.col("_given").isNotNull() & F.col(count_col).isNull(),
                _fail(F.lit("TypeError: counts must be integers, got a null count")),
            )
            .otherwise(F.coalesce(F.col(count_col), F.lit(0)))
        )
        return joined.select(item_col, count.cast("long").alias(count_col))

    def release(
        self,
        t: int,
        counts: DataFrame,
        *,
        domain: DataFrame | None = None,
        assume_unique: bool = False,
    ) -> DataFrame:
        """The release at step t from the prefix counts h_t, as a DataFrame (t, item, value).

        Args:
            t: the step; steps must increase (each is released once).
            counts: (item, count) rows: the counts over steps 1..t.
            domain: a DataFrame with the item column listing the domain. Items
                without a count row count 0; an item outside the domain fails
                the job. Without it, ``counts`` must list the whole domain.
            assume_unique: skip summing rows of the same item (a shuffle). Only
                for counts that are unique by construction (``update_counts``):
                duplicate rows would get the same noise.

        The result is lazy; the noise is computed in the executors when it is
        written or collected, and is the same every time it is computed.
        """
        self._next_step(t)
        counts = self._prepare_counts(counts, assume_unique and domain is None)
        if domain is not None:
            _check_item_type(_column_type(domain, self.item_col), "the domain's item column")
            counts = self.counts_with_domain(counts, domain)
        return self._released(self._full_frame(int(t), counts), self.item_col)

    def run(
        self,
        events: DataFrame,
        domain: DataFrame,
        *,
        steps: Sequence[int],
        t_col: str = "t",
        items_col: str = "items",
        user_col: str | None = None,
        order_col: str | None = None,
    ) -> DataFrame:
        """Every release at ``steps`` from a DataFrame of timed events, in one Spark job.

        ``events`` has one row per event: its time step (``t_col``) and its items
        (``items_col``); at user level also its user id (``user_col``) and its
        arrival order within its step (``order_col``, e.g. its input line: the
        bounds keep each user's first contributions in that order). Releases
        (t, item, value) for every domain item at every step in ``steps``, as
        the local engine would releasing at exactly those steps. Events after
        the last step are ignored (and take no part in the bounds).
        """
        _check_item_type(_column_type(domain, self.item_col), "the domain's item column")
        inc = self._timed_increments(
            events, t_col, items_col, user_col, order_col, last=max(steps) if steps else None
        )
        return self.run_counts(inc, domain, steps=steps)

    def run_counts(
        self, counts: DataFrame, domain: DataFrame, *, steps: Sequence[int]
    ) -> DataFrame:
        """:meth:`run` from the events' counts already made: rows (t, item, n), n of
        the events at step t (1..horizon) that hold the item, the rows of one (t, item)
        added (e.g. partial counts of several tasks), a row with a null n left out."""
        item_type = _column_type(domain, self.item_col)
        _check_item_type(item_type, "the domain's item column")
        inc = _checked_counts(counts, self.horizon, self.item_col)
        _check_same_item_kind(item_type, inc.schema[self.item_col].dataType)
        steps = self._claim_steps(steps)
        dom = domain.select(
            F.col(self.item_col), F.lit(0).cast("long").alias("t"), F.lit(0).cast("long").alias("n")
        )
        flat = dom.unionByName(
            inc.select(
                self.item_col,
                F.col("t").cast("long").alias("t"),
                F.col("n").cast("long").alias("n"),
            )
        )
        return self._run_flat(flat, steps, closed=True)

    def run_grouped_counts(
        self, grouped: DataFrame, domain: DataFrame, *, steps: Sequence[int]
    ) -> DataFrame:
        """:meth:`run_counts` from the counting tasks' rows
        (:data:`dpstream.spark.read_counts.GROUPED_SCHEMA`: an item, its steps in
        1..horizon and their counts, each >= 1; the rows of one item added), which the
        command's own workers made: not checked again."""
        item_type = _column_type(domain, self.item_col)
        _check_item_type(item_type, "the domain's item column")
        _check_same_item_kind(item_type, grouped.schema["item"].dataType)
        steps = self._claim_steps(steps)
        zero = F.array(F.lit(0).cast("long"))
        dom = domain.select(F.col(self.item_col), zero.alias("ts"), zero.alias("ns"))
        rows = grouped.select(F.col("item").alias(self.item_col), "ts", "ns")
        return self._run_flat(dom.unionByName(rows), steps, closed=True, grouped=True)

    def _timed_increments(
        self,
        events: DataFrame,
        t_col: str,
        items_col: str,
        user_col: str | None = None,
        order_col: str | None = None,
        last: int | None = None,
    ) -> DataFrame:
        return _timed_increments(
            events,
            self.horizon,
            self.max_items,
            t_col,
            items_col,
            self.item_col,
            users=self._users(user_col, order_col),
            last=last,
        )

    def __repr__(self) -> str:
        return (
            f"SparkKnownBase(T={self.horizon}, counter={self.counter}, r={self.base}, "
            f"max_items={self.max_items}, "
            f"tau={self.tau:.4g}, t={self.t})"
        )


def _checked_step(t: Column, horizon: int) -> Column:
    """An event's step ``t``; a null one, one < 1 or one past ``horizon`` fails the job."""
    return (
        F.when(
            t.isNull() | (t < 1),
            _fail(F.lit("ValueError: an event has a time step that is null or < 1")),
        )
        .when(
            t > horizon,
            _fail(
                F.concat(
                    F.lit("HorizonExceededError: an event at time step "),
                    t.cast("string"),
                    F.lit(f" is past the horizon T={horizon}"),
                )
            ),
        )
        .otherwise(t)
    )


def _checked_counts(counts: DataFrame, horizon: int, item_col: str) -> DataFrame:
    """(item, t, n) rows of counts (t, item, n): a row with a null n is left out (and
    never checked, wherever Spark evaluates the filter), the step of any other row
    checked as an event's (:func:`_checked_step`) and a negative n fails the job."""
    for name in ("t", "n"):
        ctype = _column_type(counts, name)
        if not isinstance(ctype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
            raise TypeError(f"column {name!r} must hold integers, got {ctype.simpleString()}")
    _check_item_type(_column_type(counts, item_col), f"column {item_col!r}")
    n, t = F.col("n"), F.col("t")
    checked_n = (
        F.when(n < 0, _fail(F.lit("ValueError: a count is < 0")))
        .when(n > MAX_COUNT, _fail(F.lit("ValueError: a count is above 2^53")))
        .otherwise(n)
    )
    checked_t = F.when(n.isNull(), t).otherwise(_checked_step(t, horizon))
    return counts.where(n.isNotNull()).select(
        item_col, checked_t.cast("long").alias("t"), checked_n.cast("long").alias("n")
    )


def _timed_increments(
    events: DataFrame,
    horizon: int,
    max_items: int | None,
    t_col: str,
    items_col: str,
    item_col: str,
    *,
    users: tuple | None = None,
    last: int | None = None,
) -> DataFrame:
    """(t, item, n) increments of timed events; at user level (``users`` = (bounds,
    user column, order column)) of the contributions kept within the bounds, among
    the events up to step ``last``."""
    ttype = _column_type(events, t_col)
    if not isinstance(ttype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
        raise TypeError(
            f"column {t_col!r} must hold integer time steps, got {ttype.simpleString()}"
        )
    checked_t = _checked_step(literal_col(t_col), horizon)
    if users is None:
        timed = events.select(checked_t.cast("long").alias("t"), literal_col(items_col))
        return increments(
            timed,
            max_items=check_max_items(max_items),
            items_col=items_col,
            item_col=item_col,
            group_cols=["t"],
        )
    from .bounding import bound_user_contributions

    bounds, user_col, order_col = users
    _column_type(events, user_col)
    _column_type(events, order_col)
    timed = events.select(
        checked_t.cast("long").alias("t"),
        _checked_items(events, items_col, max_items).alias(items_col),
        literal_col(user_col),
        literal_col(order_col),
    )
    if last is not None:  # later events are not released: they spend no user's budget
        timed = timed.where(F.col("t") <= last)
    kept = bound_user_contributions(
        timed,
        bounds,
        user_col=user_col,
        order_col=order_col,
        t_col="t",
        items_col=items_col,
        item_col=item_col,
    )
    return kept.groupBy("t", item_col).agg(F.count(F.lit(1)).alias("n"))


class SparkUnknownBase(_SparkRelease):
    """UnkBase (``algo:UnkBase``) on Spark, from aggregated counts.

    The same mechanism as :class:`dpstream.mechanisms.unknown.UnknownDomainHistogram`
    (built from it: tau, the threshold m_delta, the delta split and the
    guarantee are the local engine's). Every item that has appeared (count > 0)
    gets KnownBase's keyed tree noise, and is released iff its noisy count is
    above the step's threshold m_t (``.threshold_at(t)``), or, with
    ``remember``, once it has been.
    Privacy (theorem after ``lem:badOutcomes``): (eps(Delta0/(2 tau^2), delta'),
    Delta0 delta + delta')-DP; ``.privacy`` states it.

    Counters as locally (``counter=None``: the local default, the BLT counter
    for T >= 2 and for ``horizon=None``; ``"tree"``; ``"blt"``; a strategy):
    releases equal those of ``UnknownDomainHistogram`` with the same arguments
    bit for bit. With a BLT counter an item's noise starts at the first
    release step at which it has a count: its state there is drawn from its
    exact law under the local join purpose, keyed by (item, step), as the
    local :meth:`~dpstream.mechanisms.blt_noise.BLTNoise.join_items` does (the
    privacy argument is in :class:`~dpstream.UnknownDomainHistogram`). So
    :meth:`run` equals the local engine releasing at exactly ``steps``, and a
    streaming release the local engine releasing every step. A one-step
    :meth:`release` from prefix counts alone cannot know when each item
    joined, so it runs with the tree counter only.

    Args:
        spark: the SparkSession.
        horizon, max_items, key, counter, base, remember, rho | epsilon, delta | tau,
            threshold_delta, stream, max_items_per_user, max_count_per_item,
            noise_version: as for ``UnknownDomainHistogram`` (``horizon=None``: no
            planned end; user level: see :class:`SparkKnownBase`).
        item_col, count_col: the column names of the counts DataFrames.
    """

    def __init__(
        self,
        spark: SparkSession,
        horizon: int | None,
        *,
        max_items: int | None = None,
        key: NoiseKey,
        base: int | None = None,
        remember: bool = False,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        threshold_delta: float | None = None,
        stream: str = "default",
        item_col: str = "item",
        count_col: str = "count",
        max_items_per_user: int | None = None,
        max_count_per_item: int | None = None,
        noise_version: int = DEFAULT_NOISE_VERSION,
        counter: str | BLTStrategy | None = None,
    ) -> None:
        from ..mechanisms.unknown import UnknownDomainHistogram

        #: the settings, one frozen value (:meth:`from_params` takes one)
        self.params = UnknownParams(
            horizon=horizon,
            max_items=max_items,
            counter=counter,
            base=base,
            remember=remember,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            threshold_delta=threshold_delta,
            stream=stream,
            max_items_per_user=max_items_per_user,
            max_count_per_item=max_count_per_item,
            noise_version=noise_version,
        )
        self.mechanism = UnknownDomainHistogram.from_params(self.params, key=key)
        m = self.mechanism
        if m.strategy is None:
            # m_t by |I_t| = 1 .. (r - 1) L_r (index 0 unused), the local engine's numbers
            thresholds = (float(m.threshold),) + tuple(
                m.threshold_for_cells(c) for c in range(1, (m.base - 1) * m.levels + 1)
            )
            cell_std = float(np.sqrt(m.levels) * m.tau)
        else:  # a BLT: m_t by step, for the steps asked (_spec_for)
            thresholds, cell_std = (float(m.threshold),), float(m.sigma)
        self.spec = ReleaseSpec(
            mechanism=UNKNOWN,
            horizon=m.horizon,
            base=m.base,
            cell_std=cell_std,
            purpose=m.noise_purpose,
            threshold=float(m.threshold),
            remember=m.remember,
            strategy=m.strategy,
            thresholds=thresholds,
        )
        super().__init__(spark, key, item_col, count_col)

    @classmethod
    def from_params(
        cls,
        spark: SparkSession,
        params: UnknownParams,
        *,
        key: NoiseKey,
        item_col: str = "item",
        count_col: str = "count",
    ) -> SparkUnknownBase:
        """The Spark twin of ``UnknownDomainHistogram.from_params(params, key=key)``."""
        return cls(
            spark,
            params.horizon,
            key=key,
            item_col=item_col,
            count_col=count_col,
            **params.kwargs(),
        )

    def _spec_for(self, steps: Sequence[int]) -> ReleaseSpec:
        """The spec, with a BLT's m_t for ``steps`` (the local ``threshold_at``)."""
        if self.spec.strategy is None:
            return self.spec
        m = self.mechanism
        return dataclasses.replace(
            self.spec, step_thresholds={int(t): float(m.threshold_at(int(t))) for t in steps}
        )

    @property
    def threshold(self) -> float:
        """m_delta, the paper's single threshold (the largest m_t)."""
        return self.mechanism.threshold

    def threshold_at(self, t: int) -> float:
        """m_t: an item is released at t iff its noisy count is above it."""
        return self.mechanism.threshold_at(t)

    @property
    def remember(self) -> bool:
        return self.mechanism.remember

    def release(
        self,
        t: int,
        counts: DataFrame,
        *,
        shown_col: str | None = None,
        assume_unique: bool = False,
    ) -> DataFrame:
        """The release at step t from the prefix counts h_t: (t, item, value) of shown items.

        Args:
            t: the step; steps must increase (each is released once).
            counts: (item, count) rows, the counts over steps 1..t of every item
                seen so far (items with count 0 have not appeared and are skipped).
            shown_col: with ``remember``, a boolean column of ``counts`` saying
                the item was released at an earlier step (the ``released``
                column of the previous :meth:`release_full`). Required then.
            assume_unique: skip summing rows of the same item (see
                :meth:`SparkKnownBase.release`).
        """
        return self._released(
            self.release_full(t, counts, shown_col=shown_col, assume_unique=assume_unique),
            self.item_col,
        )

    def release_full(
        self,
        t: int,
        counts: DataFrame,
        *,
        shown_col: str | None = None,
        assume_unique: bool = False,
    ) -> DataFrame:
        """Step t for every row: (t, item, count, released, value), the state of the next step.

        ``value`` is the noisy count of every item, released or not: keep this
        frame private (it is state, like the true counts); publish
        ``where(released)`` only.
        """
        if self.remember and shown_col is None:
            raise ValueError(
                "remember=True needs shown_col, the released flags of the last "
                "step (the 'released' column of release_full)"
            )
        if shown_col is not None and not self.remember:
            raise ValueError("shown_col is only for remember=True")
        if self.spec.joins:
            raise ValueError(
                "a one-step release from prefix counts runs the tree counter only "
                "(counter='tree'): with the BLT counter an item's noise depends on "
                "the step at which it first had a count, which the counts do not "
                "say; use run() or dpstream.spark.start_stream"
            )
        check_next_step(t, self.t, self.horizon)
        if shown_col is not None:
            stype = _column_type(counts, shown_col)
            if not isinstance(stype, T.BooleanType):
                raise TypeError(f"column {shown_col!r} must be boolean, got {stype.simpleString()}")
            flags = counts.select(self.item_col, F.col(shown_col).alias("_shown"))
            prepared = self._prepare_counts(counts, assume_unique)
            if not assume_unique:
                flags = flags.groupBy(self.item_col).agg(F.max("_shown").alias("_shown"))
            prepared = prepared.join(flags, on=self.item_col, how="left")
            shown = "_shown"
        else:
            prepared = self._prepare_counts(counts, assume_unique)
            shown = None
        self._next_step(t)
        return self._full_frame(int(t), prepared, shown)

    def run(
        self,
        events: DataFrame,
        *,
        steps: Sequence[int],
        t_col: str = "t",
        items_col: str = "items",
        user_col: str | None = None,
        order_col: str | None = None,
    ) -> DataFrame:
        """Every release at ``steps`` from a DataFrame of timed events, in one Spark job.

        As the local engine releasing at exactly those steps: (t, item, value)
        of the items shown at each step. Events after the last step are ignored.
        User level: ``user_col`` and ``order_col`` as for :meth:`SparkKnownBase.run`.
        """
        inc = _timed_increments(
            events,
            self.horizon,
            self.max_items,
            t_col,
            items_col,
            self.item_col,
            users=self._users(user_col, order_col),
            last=max(steps) if steps else None,
        )
        return self.run_counts(inc, steps=steps)

    def run_counts(self, counts: DataFrame, *, steps: Sequence[int]) -> DataFrame:
        """:meth:`run` from the events' counts already made: rows (t, item, n) as for
        :meth:`SparkKnownBase.run_counts`."""
        inc = _checked_counts(counts, self.horizon, self.item_col)
        steps = self._claim_steps(steps)
        return self._run_flat(inc, steps, closed=False)

    def run_grouped_counts(self, grouped: DataFrame, *, steps: Sequence[int]) -> DataFrame:
        """:meth:`run_counts` from the counting tasks' rows, as
        :meth:`SparkKnownBase.run_grouped_counts`."""
        steps = self._claim_steps(steps)
        rows = grouped.select(F.col("item").alias(self.item_col), "ts", "ns")
        return self._run_flat(rows, steps, closed=False, grouped=True)

    def __repr__(self) -> str:
        return (
            f"SparkUnknownBase(T={self.horizon}, r={self.base}, max_items={self.max_items}, "
            f"tau={self.tau:.4g}, threshold={self.threshold:.4g}, t={self.t})"
        )
