"""SparseGumb (``algo:sparseGumb``) on Spark: the item noise in the executors.

The local :class:`~dpstream.mechanisms.topk.ContinualTopK` needs, at each
release, three things that touch every item of the domain or every selected
item. Here each is one Spark job over a DataFrame of prefix counts, computed
in the executors with the local engine's keyed noise:

* the released counts of the k selected items: h_t^u + the tree noise of u's
  counter (purpose ``f"{noise_scope}/counter-{n}"``, n the selection at which
  u entered, cell std sqrt(L_r) tau_2);
* the sparse-vector query over the non-selected items: is any
  h_t^u + Lap(4 tau_1) above the threshold m_t? (a distributed ``any``);
* a (re-)selection: the k largest h_t^u + Gumbel(tau_2 / 2) (each partition
  keeps its own k best, the driver merges them).

What stays on the driver is O(k): the selection (items and generations), the
switch count, and the threshold m_t = min of the selected noisy counts + eta_t
+ the epoch's threshold noise (a scalar draw). The releases are those of
``ContinualTopK.release(t, counts)`` for the same key, stream and parameters,
bit for bit, except that two items with *exactly* equal selection scores
(probability about 0) are ordered by item here and by domain position there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..factorization import BLTStrategy
from ..mechanisms.base import Release, check_next_step
from ..mechanisms.params import TopKParams
from ..mechanisms.topk import ContinualTopK
from ..noise import DEFAULT_NOISE_VERSION, NoiseKey, NoiseSource
from .kernels import TopKSpec, topk_counter_batch, topk_query_batch, topk_select_batch
from .releases import _check_item_type, _column_type, _first_row, _key_handle, spark_domain_tag

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)
    from pyspark.sql import types as T  # noqa: N812
except ImportError as exc:  # pragma: no cover
    raise ImportError("dpstream.spark needs PySpark: pip install 'dpstream[spark]'") from exc

__all__ = ["SparkContinualTopK"]

_GEN = "_generation"


class SparkContinualTopK:
    """SparseGumb_{s,k} (``algo:sparseGumb``) on Spark, from prefix counts over the domain.

    The same mechanism as :class:`dpstream.mechanisms.topk.ContinualTopK`, built
    from it (with a placeholder domain of k items: tau, tau_1, tau_2, the base
    and the noise scope do not depend on the domain), so ``.privacy`` is the
    local one: (2k + 1) / (2 tau^2)-zCDP (the sparse vector per Lyu, Su and Li,
    see ContinualTopK; the paper charges (2k + 4) / (2 tau^2), after
    ``algo:sparseGumb``).

    Args:
        spark: the SparkSession.
        horizon, k, switches, eta, key, wait, counter, base, rho | epsilon, delta | tau,
            stream, noise_version: as for ``ContinualTopK`` (the waiting round reads
            the k-th largest count of the frame: k rows to the driver).
        item_col, count_col: the column names of the counts DataFrames.

    ``release(t, counts)`` takes (item, count) rows listing **the whole domain**
    (items with count 0 included): the selection and the sparse vector range
    over every domain item, and an item missing from the frame would never be
    selected. The first frame's items fix the noise scope, as the domain fixes the
    local ContinualTopK's (another domain draws other noise; one Spark job hashes
    them at the first release); later frames must list the same domain. It
    returns a :class:`~dpstream.mechanisms.base.Release` (k items: small, on the
    driver).
    """

    def __init__(
        self,
        spark: SparkSession,
        horizon: int,
        *,
        k: int,
        switches: int,
        eta: float | Callable[[int], float] | str = "auto",
        key: NoiseKey,
        wait: bool = True,
        counter: str | BLTStrategy | None = None,
        base: int | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        stream: str = "default",
        item_col: str = "item",
        count_col: str = "count",
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        placeholder = (
            [f"dpstream.spark:parameters-{i}" for i in range(k)]
            if (isinstance(k, int) and not isinstance(k, bool) and k >= 1)
            else ["x"]
        )
        #: the settings, one frozen value (:meth:`from_params` takes one)
        self.params = TopKParams(
            horizon=horizon,
            k=k,
            switches=switches,
            eta=eta,
            wait=wait,
            counter=counter,
            base=base,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            stream=stream,
            noise_version=noise_version,
        )
        self.mechanism = ContinualTopK.from_params(placeholder, self.params, key=key)
        m = self.mechanism
        self.spec = TopKSpec(
            noise_scope=m.noise_scope,
            horizon=m.horizon,
            base=m.base,
            counter_std=m.counter_std,
            select_scale=m.tau_2 / 2.0,
            query_scale=4 * m.tau_1,
            strategy=m.strategy,
        )
        self.spark = spark
        self.item_col = item_col
        self.count_col = count_col
        self._key_bytes = _key_handle(spark, key)
        # the noise scope fingerprints the domain, which is the first counts frame's
        # items: fixed at the first release (:meth:`_fix_domain`), as the local
        # ContinualTopK over that domain fixes it when it is built
        self._svt: NoiseSource | None = None
        self.domain_tag: str | None = None
        self.t = 0
        self.switches_left = m.switches
        self._selections = 0
        self._selected: list[object] = []  # selection order
        self._generation: dict[object, int] = {}  # item -> selection number it entered at
        self._threshold_noise = 0.0

    # -- facts --------------------------------------------------------------------

    @classmethod
    def from_params(
        cls,
        spark: SparkSession,
        params: TopKParams,
        *,
        key: NoiseKey,
        item_col: str = "item",
        count_col: str = "count",
    ) -> SparkContinualTopK:
        """The Spark twin of ``ContinualTopK.from_params(domain, params, key=key)`` (its
        domain: the items of the counts it is given)."""
        return cls(
            spark,
            params.horizon,
            key=key,
            item_col=item_col,
            count_col=count_col,
            **params.kwargs(),
        )

    @property
    def privacy(self):
        return self.mechanism.privacy

    @property
    def k(self) -> int:
        return self.mechanism.k

    @property
    def selected(self) -> list[object]:
        return list(self._selected)

    @property
    def generations(self) -> dict[object, int]:
        """Selected item -> the selection number n whose counter it carries."""
        return dict(self._generation)

    # -- the three distributed parts -----------------------------------------------
    def _counts(self, counts: DataFrame) -> DataFrame:
        _check_item_type(_column_type(counts, self.item_col), f"column {self.item_col!r}")
        ctype = _column_type(counts, self.count_col)
        if not isinstance(ctype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
            raise TypeError(
                f"column {self.count_col!r} must hold integers, got {ctype.simpleString()}"
            )
        return counts.groupBy(self.item_col).agg(
            F.sum(self.count_col).cast("long").alias(self.count_col)
        )

    def _selection_frame(self) -> DataFrame:
        item_type = self._item_type
        rows = [(item, self._generation[item]) for item in self._selected]
        return self.spark.createDataFrame(
            rows,
            T.StructType(
                [
                    T.StructField(self.item_col, item_type, False),
                    T.StructField(_GEN, T.LongType(), False),
                ]
            ),
        )

    def counter_values(self, t: int, counts: DataFrame) -> dict[object, float]:
        """The noisy counts at t of the current selection (executors; k rows back)."""
        item_col, count_col, spec, key_bytes = (
            self.item_col,
            self.count_col,
            self.spec,
            self._key_bytes,
        )
        sel = (
            self._selection_frame()
            .join(counts, on=item_col, how="left")
            .select(
                item_col, F.coalesce(F.col(count_col), F.lit(0)).cast("long").alias(count_col), _GEN
            )
        )
        schema = T.StructType(
            [
                T.StructField(item_col, sel.schema[item_col].dataType, False),
                T.StructField(_GEN, T.LongType(), False),
                T.StructField("value", T.DoubleType(), False),
            ]
        )

        def run(batches):
            return topk_counter_batch(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                t=t,
                item_col=item_col,
                count_col=count_col,
                gen_col=_GEN,
            )

        return {r[item_col]: r["value"] for r in sel.mapInPandas(run, schema).collect()}

    def query_above(self, t: int, counts: DataFrame, threshold: float, epoch: int) -> bool:
        """Sparse vector at t: does some non-selected item have h_t^u + Lap > threshold?"""
        item_col, count_col, spec, key_bytes = (
            self.item_col,
            self.count_col,
            self.spec,
            self._key_bytes,
        )
        others = counts.join(self._selection_frame().select(item_col), on=item_col, how="left_anti")

        def run(batches):
            return topk_query_batch(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                t=t,
                epoch=epoch,
                threshold=threshold,
                item_col=item_col,
                count_col=count_col,
            )

        out = _first_row(
            others.mapInPandas(run, "above boolean, top double").agg(
                F.max(F.col("above").cast("int")).alias("any")
            )
        )
        return bool(out["any"] or 0)

    def kth_count(self, counts: DataFrame) -> int:
        """The k-th largest count of the frame (the waiting round's query; k rows back)."""
        rows = counts.select(self.count_col).orderBy(F.desc(self.count_col)).limit(self.k)
        values = [int(r[0]) for r in rows.collect()]
        if len(values) < self.k:
            raise ValueError(
                f"the counts list {len(values)} items, fewer than k={self.k}: they "
                "must list the whole domain"
            )
        return values[-1]

    def select(self, n: int, counts: DataFrame) -> list[object]:
        """Selection number n: the k largest h_t^u + Gumbel(tau_2 / 2), largest first."""
        item_col, count_col, spec, key_bytes, k = (
            self.item_col,
            self.count_col,
            self.spec,
            self._key_bytes,
            self.k,
        )
        schema = T.StructType(
            [
                T.StructField(item_col, counts.schema[item_col].dataType, False),
                T.StructField("score", T.DoubleType(), False),
            ]
        )

        def run(batches):
            return topk_select_batch(
                batches,
                spec=spec,
                key_bytes=key_bytes(),
                n=n,
                k=k,
                item_col=item_col,
                count_col=count_col,
            )

        rows = counts.mapInPandas(run, schema).collect()
        if len(rows) < k:
            raise ValueError(
                f"the counts list {len(rows)} items, fewer than k={k}: they must "
                "list the whole domain"
            )
        rows.sort(key=lambda r: (-r["score"], r[item_col]))
        return [r[item_col] for r in rows[:k]]

    # -- the algorithm (driver: O(k) state) ----------------------------------------
    def _fix_domain(self, counts: DataFrame) -> NoiseSource:
        """The sparse vector's noise source, the noise scope fixed (at the first release)
        by the domain the counts list: the local ContinualTopK's scope over it."""
        if self._svt is None:
            self.domain_tag = spark_domain_tag(counts, self.item_col)
            scope = self.mechanism.scope_for(self.domain_tag)
            self.spec = dataclasses.replace(self.spec, noise_scope=scope)
            self._svt = NoiseSource(self.mechanism.key, f"{scope}/svt")
        return self._svt

    def _do_select(self, t: int, counts: DataFrame) -> None:
        n = self._selections
        sel = self.select(n, counts)
        self._generation = {u: self._generation.get(u, n) for u in sel}
        self._selected = sel
        self._selections = n + 1
        if self.switches_left > 0:
            self._threshold_noise = self._fix_domain(counts).scalar(
                "laplace", 0, n, 0, scale=2 * self.mechanism.tau_1
            )

    def release(self, t: int, counts: DataFrame) -> Release:
        """The release at t from the prefix counts over the whole domain (item, count).

        As ``ContinualTopK.release(t, counts)``: the first selection waits for
        the waiting round (``wait``) or is made at the first call; later calls
        run the sparse-vector check while switches remain and re-select when it
        fires. Steps must increase.
        """
        check_next_step(t, self.t, self.mechanism.horizon)
        t = int(t)
        m = self.mechanism
        if not self._selected:
            eta_t = m.start_eta_at(t) if m.wait else 0.0
        else:
            eta_t = m.eta_at(t) if self.switches_left else 0.0
        self._item_type = _column_type(counts, self.item_col)
        counts = self._counts(counts).cache()
        try:
            svt = self._fix_domain(counts)
            switched = False
            if not self._selected:
                if not m.wait or (
                    self.kth_count(counts) + svt.scalar("laplace", 1, t, 1, scale=4 * m.tau_1)
                    > eta_t + svt.scalar("laplace", 1, 0, 0, scale=2 * m.tau_1)
                ):
                    self._do_select(t, counts)
            elif self.switches_left > 0:
                noisy = self.counter_values(t, counts)
                threshold = (
                    float(np.min([noisy[u] for u in self._selected]))
                    + eta_t
                    + self._threshold_noise
                )
                epoch = m.switches - self.switches_left
                if self.query_above(t, counts, threshold, epoch):
                    self.switches_left -= 1
                    switched = True
                    self._do_select(t, counts)
            values = self.counter_values(t, counts) if self._selected else {}
        finally:
            counts.unpersist()
        self.t = t
        sel = self._selected
        meta = {
            "status": "selected" if sel else "not yet",
            "switches_left": self.switches_left,
            "switched": switched,
            "selection": self._selections - 1,
        }
        return Release(t=t, items=list(sel), values=np.array([values[u] for u in sel]), meta=meta)

    def close(self) -> None:
        """Forget the broadcast key on the executors."""
        for cell in getattr(self._key_bytes, "__closure__", None) or ():
            if hasattr(cell.cell_contents, "destroy"):
                cell.cell_contents.destroy()

    def __repr__(self) -> str:
        m = self.mechanism
        return (
            f"SparkContinualTopK(T={m.horizon}, k={m.k}, s={m.switches}, r={m.base}, "
            f"tau={m.tau:.4g}, t={self.t}, switches_left={self.switches_left})"
        )
