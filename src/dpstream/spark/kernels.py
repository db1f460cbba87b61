"""What runs inside a Spark executor: keyed tree noise over a batch of items.

Pure NumPy/pandas/Arrow (no PySpark import), so the arithmetic can be read and
tested on its own. Each function takes the batches of one partition, as
``DataFrame.mapInPandas`` (pandas frames) or ``mapInArrow`` (Arrow record
batches: ``release_run_arrow``) hands them over, and yields the released rows
(``release_run_arrow`` reads the whole partition first: it needs all rows of an
item together).

Bit-identity with the local engine is by construction, not by re-derivation:
every batch builds the local engine's own :class:`~dpstream.noise.NoiseSource`
and :class:`~dpstream.mechanisms.tree_noise.TreeNoise` (or, for a BLT counter,
:class:`~dpstream.mechanisms.blt_noise.BLTNoise`) for the mechanism's noise
purpose and advances it to the release step. Both perform the same
floating-point operations in the same order whether they reach t one step at a
time or in one jump, so a batch of items on an executor gets exactly the noise
the local mechanism adds to the same items, and the released value is the same
int64 + float64 addition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..factorization import BLTStrategy
from ..mechanisms.blt_noise import BLTNoise, join_purpose
from ..mechanisms.columns import check_count_range
from ..mechanisms.counters import tree_base
from ..mechanisms.tree_noise import TreeNoise
from ..noise import NoiseKey, NoiseSource, PreparedItems
from ..oneshot.common import GUMBEL_DRAW
from ..tree import cells_at, digits, num_levels

__all__ = [
    "STATE_FLAG",
    "STATE_IDS",
    "ReleaseSpec",
    "TopKSpec",
    "advance_to",
    "release_run_arrow",
    "release_step_batch",
    "release_stream_batch",
    "state_noise_cols",
    "topk_counter_batch",
    "topk_query_batch",
    "topk_select_batch",
]

#: Mechanism names a spec may carry.
KNOWN = "KnownBase"
UNKNOWN = "UnkBase"


@dataclass(frozen=True)
class ReleaseSpec:
    """The parameters an executor needs, fixed on the driver (no secret inside).

    Built from the local mechanism class (see ``dpstream.spark.releases``), so
    the noise scale, base and threshold are the local engine's own numbers.

    Attributes:
        mechanism: ``"KnownBase"`` or ``"UnkBase"``.
        horizon: T.
        base: the tree base r (``None`` with a BLT counter).
        cell_std: the standard deviation of each keyed draw: a tree cell's
            sqrt(L_r) tau, or a BLT counter's sigma.
        purpose: the noise purpose of the stream's counters.
        threshold: UnkBase's m_delta (the paper's single threshold, the largest
            m_t); ``None`` for KnownBase.
        thresholds: UnkBase's per-step thresholds m_t by |I_t| (index = the
            digit sum of t; index 0 unused): an item is released at t iff its
            noisy count is above ``threshold_at(t)``, the local engine's
            ``UnknownDomainHistogram.threshold_at(t)``.
        remember: UnkBase only: an item released once stays released.
        strategy: the BLT counter's factorization (``None``: the tree).
        step_thresholds: UnkBase with a BLT counter: m_t by step t, for the steps
            this spec releases (the BLT's m_t depends on t itself, not on a digit
            sum; the local engine's ``threshold_at(t)``, computed on the driver).
    """

    mechanism: str
    horizon: int
    base: int | None
    cell_std: float
    purpose: str
    threshold: float | None = None
    remember: bool = False
    strategy: BLTStrategy | None = None  # the BLT counter's factorization, if any
    thresholds: tuple[float, ...] = ()
    step_thresholds: dict[int, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.mechanism not in (KNOWN, UNKNOWN):
            raise ValueError(f"mechanism must be {KNOWN!r} or {UNKNOWN!r}, got {self.mechanism!r}")
        if (self.mechanism == UNKNOWN) != (self.threshold is not None):
            raise ValueError("threshold is set for the unknown-domain histogram and only for it")
        if (self.mechanism == UNKNOWN) != bool(self.thresholds):
            raise ValueError("thresholds are set for the unknown-domain histogram and only for it")

    def threshold_at(self, t: int) -> float:
        """UnkBase's m_t: the threshold of step t."""
        if self.strategy is not None:
            try:
                return self.step_thresholds[t]
            except KeyError:
                raise ValueError(f"this spec has no threshold for step {t}") from None
        return self.thresholds[sum(digits(t, tree_base(self.base)))]

    @property
    def joins(self) -> bool:
        """UnkBase with a BLT counter: an item's noise starts at the step it first has a
        count (its state there drawn from its exact law, ``BLTNoise.join_items``)."""
        return self.mechanism == UNKNOWN and self.strategy is not None

    def joining_noise(self, source: NoiseSource, t: int) -> BLTNoise:
        """An empty BLT noise at step t that items join (``joins``), as UnkBase's."""
        if self.strategy is None:
            raise ValueError("only a BLT counter has items that join")
        join_source = NoiseSource(source.key, join_purpose(source.purpose))
        noise = BLTNoise(source, self.strategy, self.cell_std, join_source=join_source)
        if t:
            noise.advance(t)
        return noise

    def join(self, noise: BLTNoise, items: Sequence[object]) -> None:
        """Items first seen at ``noise.t`` join it (UnkBase's ``_commit``)."""
        source, join_source = noise.source, noise.join_source
        if join_source is None:  # pragma: no cover - made by joining_noise
            raise ValueError("this BLT noise has no join source")
        ids = source.item_ids(list(items))
        noise.join_items(source.prepare_ids(ids), join_source.prepare_ids(ids))

    @property
    def levels(self) -> int:
        """The float noise state per item: L_r per-level sums (tree), or the k
        buffers and the running sum of a BLT counter (k + 1)."""
        if self.strategy is not None:
            return self.strategy.buffers + 1
        return num_levels(self.horizon, tree_base(self.base))

    def tree_noise(self, source: NoiseSource, items: Sequence[object]) -> TreeNoise | BLTNoise:
        """A fresh counter noise at t = 0 holding ``items`` (prepared under ``source``)."""
        return self.restore(source, source.prepare(items), 0, None)

    def restore(
        self, source: NoiseSource, prepared: PreparedItems, t: int, state: np.ndarray | None
    ) -> TreeNoise | BLTNoise:
        """The counter noise of ``prepared`` at t from its state (``noise_state``);
        ``state=None`` at t = 0 is the fresh counter."""
        if state is None:
            noise: TreeNoise | BLTNoise
            if self.strategy is not None:
                noise = BLTNoise(source, self.strategy, self.cell_std)
            else:
                # every level kept: its level sums are the state exported each step
                noise = TreeNoise(
                    source,
                    self.horizon,
                    tree_base(self.base),
                    self.cell_std,
                    kept_levels=self.levels,
                )
            noise.add_items(prepared)
            return noise
        if self.strategy is not None:
            k = self.strategy.buffers
            return BLTNoise.restore(
                source, self.strategy, self.cell_std, prepared, t, state[:k], state[k]
            )
        return TreeNoise.restore(
            source,
            self.horizon,
            tree_base(self.base),
            self.cell_std,
            prepared,
            t,
            state,
            kept_levels=self.levels,
        )


def noise_state(noise: TreeNoise | BLTNoise) -> np.ndarray:
    """An item-column state of shape (levels, items): the tree's per-level sums, or
    the BLT's buffers with the running sum as the last row."""
    if isinstance(noise, BLTNoise):
        buffers, total = noise.state()
        return np.vstack([buffers, total[None, :]])
    return noise.level_sums()


def _items_list(column: pd.Series) -> list[object]:
    """Items as Python values (str, int, bytes), refusing nulls."""
    if column.isna().any():
        raise ValueError("the item column holds a null item")
    return column.tolist()


def _counts_array(column: pd.Series) -> np.ndarray:
    if column.isna().any():
        raise ValueError("the count column holds a null count")
    counts = column.to_numpy()
    if counts.dtype.kind not in "iu":
        raise TypeError(f"counts must be integers, got dtype {counts.dtype}")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        raise ValueError("counts must be >= 0")
    return check_count_range("counts", counts)  # <= 2^53, as the local mechanisms take


def release_step_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: ReleaseSpec,
    key_bytes: bytes,
    t: int,
    item_col: str,
    count_col: str,
    shown_col: str | None = None,
) -> Iterator[pd.DataFrame]:
    """The noisy counts at step t of the (item, prefix count) rows of one partition.

    Yields every row with columns item, count, ``released`` (bool) and
    ``value`` (float64, the noisy count). KnownBase releases every row. UnkBase
    releases a row when its item has appeared (count > 0) and its noisy count
    is above the threshold, or, with ``remember``, when ``shown_col`` says the
    item was released at an earlier step; ``released`` is then the flag to
    carry to the next step.
    """
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), spec.purpose)
    for pdf in batches:
        if len(pdf) == 0:
            continue
        items = _items_list(pdf[item_col])
        counts = _counts_array(pdf[count_col])
        noise = spec.tree_noise(source, items)
        noise.advance(t)
        values = counts + noise.noise()
        if spec.mechanism == UNKNOWN:
            released = (counts > 0) & (values > spec.threshold_at(t))
            if spec.remember and shown_col is not None:
                released |= pdf[shown_col].fillna(False).to_numpy(dtype=bool)
        else:
            released = np.ones(len(pdf), dtype=bool)
        yield pd.DataFrame(
            {
                item_col: pdf[item_col].reset_index(drop=True),
                count_col: counts,
                "released": released,
                "value": values,
            }
        )


#: Streaming state columns: the item's prepared id (two 64-bit words, stored as
#: signed int64 with the same bits) and, during a step, whether the row has state.
STATE_IDS = ("dp_id0", "dp_id1")
STATE_FLAG = "dp_has_state"


def state_noise_cols(levels: int) -> list[str]:
    """The names of the per-level noise sum columns, level 1 (leaves) first."""
    return [f"dp_noise{lv}" for lv in range(1, levels + 1)]


def release_stream_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: ReleaseSpec,
    key_bytes: bytes,
    t: int,
    prev_t: int,
    item_col: str,
    count_col: str,
    shown_col: str | None = None,
    with_state: bool = True,
) -> Iterator[pd.DataFrame]:
    """One streaming step: noisy counts at t, continuing each item's tree noise from prev_t.

    Input rows: item, prefix count at t, optionally ``shown_col`` (UnkBase with
    ``remember``) and, with ``with_state``, the item's state at ``prev_t``:
    ``STATE_FLAG`` (bool: the state columns are valid), ``STATE_IDS`` and
    ``state_noise_cols(L)`` (``noise_state`` at prev_t: the tree's level sums
    or the BLT's buffers and sum). A row with state is rebuilt with
    ``ReleaseSpec.restore`` and advanced to t
    (``advance_to``: one incremental step after prev_t = t - 1), without
    preparing its id again; a row without state (a new item, or a snapshot
    without the state columns) is prepared and jumped to t from
    scratch. Both paths give the local engine's noise bit for bit.

    Output: item, count, ``released``, ``value`` (as ``release_step_batch``),
    then the state at t: ``STATE_IDS`` and the noise sum columns.
    """
    if not 0 <= prev_t < t:
        raise ValueError(f"prev_t must be in [0, t), got prev_t={prev_t}, t={t}")
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), spec.purpose)
    levels = spec.levels
    noise_cols = state_noise_cols(levels)
    for pdf in batches:
        n = len(pdf)
        if n == 0:
            continue
        if pdf[item_col].isna().any():
            raise ValueError("the item column holds a null item")
        counts = _counts_array(pdf[count_col])
        if with_state and prev_t > 0:
            old = pdf[STATE_FLAG].fillna(False).to_numpy(dtype=bool)
        else:
            old = np.zeros(n, dtype=bool)
        words = np.empty((n, 2), dtype="<u8")
        sums = np.empty((levels, n))
        noise = np.empty(n)
        rows = np.flatnonzero(old)
        if len(rows):
            ids = np.column_stack([pdf[c].to_numpy(dtype=np.int64)[rows] for c in STATE_IDS])
            level_sums = np.stack([pdf[c].to_numpy(dtype=np.float64)[rows] for c in noise_cols])
            tn = spec.restore(source, PreparedItems(ids.view("<u8")), prev_t, level_sums)
            advance_to(tn, t)
            words[rows] = tn.prepared.words
            sums[:, rows] = noise_state(tn)
            noise[rows] = tn.noise()
        rows = np.flatnonzero(~old)
        if len(rows) and spec.joins:  # UnkBase's new items (count > 0) join at t
            if with_state is False and prev_t > 0:
                raise ValueError(
                    "a BLT unknown-domain step needs the noise state of the last step "
                    "(an item's noise depends on the step it joined)"
                )
            tn = spec.joining_noise(source, t)
            spec.join(tn, pdf[item_col].iloc[rows].tolist())
            words[rows] = tn.prepared.words
            sums[:, rows] = noise_state(tn)
            noise[rows] = tn.noise()
        elif len(rows):
            tn = spec.tree_noise(source, pdf[item_col].iloc[rows].tolist())
            tn.advance(t)
            words[rows] = tn.prepared.words
            sums[:, rows] = noise_state(tn)
            noise[rows] = tn.noise()
        values = counts + noise
        if spec.mechanism == UNKNOWN:
            released = (counts > 0) & (values > spec.threshold_at(t))
            if spec.remember and shown_col is not None:
                released |= pdf[shown_col].fillna(False).to_numpy(dtype=bool)
        else:
            released = np.ones(n, dtype=bool)
        signed = words.view(np.int64)
        out = {
            item_col: pdf[item_col].reset_index(drop=True),
            count_col: counts,
            "released": released,
            "value": values,
            STATE_IDS[0]: signed[:, 0],
            STATE_IDS[1]: signed[:, 1],
        }
        for row, name in enumerate(noise_cols):
            out[name] = sums[row]
        yield pd.DataFrame(out)


def advance_to(noise: TreeNoise | BLTNoise, t: int) -> None:
    """Advance ``noise`` to step t by the cheaper of the two bit-identical paths.

    A jump draws every cell of I_t(r) (up to (r - 1) L_r keyed draws); stepping
    through the steps in between draws about r/(r-1) cells per step. Both give
    the same values bit for bit (``TreeNoise``'s design), so this only picks
    the faster one: step through a gap shorter than |I_t(r)|. A BLT counter
    always runs every step (its jump is the steps).
    """
    if isinstance(noise, BLTNoise):
        noise.advance(t)
        return
    gap = t - noise.t
    if 1 < gap < len(cells_at(t, noise.base)):
        for s in range(noise.t + 1, t + 1):
            noise.advance(s)
    else:
        noise.advance(t)


def release_run_arrow(
    batches: Iterator[Any],
    *,
    spec: ReleaseSpec,
    key_bytes: bytes,
    steps: Sequence[int],
    item_col: str,
    t_col: str = "t",
    n_col: str = "n",
    closed: bool = False,
    chunk_rows: int = 1 << 16,
    grouped: bool = False,
) -> Iterator[Any]:
    """Release every step in ``steps`` for all the items of one partition, in one pass,
    from the Arrow record batches ``DataFrame.mapInArrow`` hands over.

    The partition holds flat rows (item, t, n): an increment of n to the item's
    count at step t >= 1, or, with ``closed`` (KnownBase), a domain row t = 0
    (n ignored); with ``grouped``, rows (item, ts, ns) whose list entries are such
    rows (:data:`dpstream.spark.read_counts.GROUPED_SCHEMA`). Every row of an item
    must be in this partition (the caller repartitions by item), so the whole
    partition is read first. Each item is
    hashed and encrypted once, and its noise advances through the steps
    incrementally (``advance_to``), as the local engine's own ``TreeNoise`` or
    ``BLTNoise``.

    Output: record batches of about ``chunk_rows`` rows (several steps' rows in
    one) with columns ``t``, item, ``value``, step by step; KnownBase releases
    every item at every step, UnkBase the items whose noisy count is above the
    threshold (or, with ``remember``, was above it at an earlier release step).
    The items stay an Arrow array, dictionary-encoded once in order of first
    appearance; a step's released items are taken from it by index (no pandas:
    the earlier pandas kernel's conversions and one small frame per step and
    partition were about half of the releases' Python time in a 2 x 10^6-event
    run).

    Raises:
        ValueError: a null item; with ``closed``, an item that has increments but
            no domain row ("InvalidEventError: N item(s) not in the domain").
    """
    import pyarrow as pa

    held = [batch for batch in batches if batch.num_rows]
    if not held:
        return
    table = pa.Table.from_batches(held)
    column = table.column(item_col).combine_chunks()
    if column.null_count:
        raise ValueError("the item column holds a null item")
    enc = column.dictionary_encode()
    dictionary = enc.dictionary
    codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    if grouped:  # (item, ts, ns) rows: each list entry is a row (item, t, n)
        import pyarrow.compute as pc

        lists = table.column("ts").combine_chunks()
        codes = codes[np.asarray(pc.list_parent_indices(lists).to_numpy(), dtype=np.int64)]
        at = np.asarray(lists.flatten().to_numpy(), dtype=np.int64)
        adds = np.asarray(table.column("ns").combine_chunks().flatten().to_numpy(), np.int64)
    else:
        at = np.asarray(table.column(t_col).to_numpy(), dtype=np.int64)
        adds = np.asarray(table.column(n_col).to_numpy(), dtype=np.int64)
    items = dictionary.to_pylist()
    released = _released_steps(spec, key_bytes, items, codes, at, adds, steps, closed)
    every = np.arange(len(dictionary), dtype=np.int64)
    ts: list[np.ndarray] = []
    idxs: list[np.ndarray] = []
    values: list[np.ndarray] = []
    rows = 0

    def batch() -> Any:
        taken = dictionary.take(pa.array(np.concatenate(idxs)))
        columns = [pa.array(np.concatenate(ts)), taken, pa.array(np.concatenate(values))]
        return pa.RecordBatch.from_arrays(columns, names=["t", item_col, "value"])

    for t, idx, vals in released:
        if not len(vals):
            continue
        ts.append(np.full(len(vals), t, dtype=np.int64))
        idxs.append(every if idx is None else idx)
        values.append(vals)
        rows += len(vals)
        if rows >= chunk_rows:
            yield batch()
            ts, idxs, values, rows = [], [], [], 0
    if rows:
        yield batch()


def _released_steps(
    spec: ReleaseSpec,
    key_bytes: bytes,
    item_values: list,
    codes: np.ndarray,
    ts: np.ndarray,
    amounts: np.ndarray,
    steps: Sequence[int],
    closed: bool,
) -> Iterator[tuple[int, np.ndarray | None, np.ndarray]]:
    """The releases of one partition, step by step: (t, the codes of the items released
    at t, or None for every item in code order, their values). ``item_values[c]`` is
    the item of code c; row i of the partition adds ``amounts[i]`` to item
    ``codes[i]`` at step ``ts[i]`` (>= 1), or with ``closed`` puts it in the domain
    (``ts[i] == 0``)."""
    steps_arr = np.asarray(sorted(steps), dtype=np.int64)
    n_items = len(item_values)
    if closed:
        in_domain = np.zeros(n_items, dtype=bool)
        in_domain[codes[ts == 0]] = True
        if not in_domain.all():  # (no item named: the message goes to the executors' logs)
            raise ValueError(
                f"InvalidEventError: {int((~in_domain).sum())} item(s) not in the domain"
            )
    inc = ts > 0
    row = np.searchsorted(steps_arr, ts[inc], side="left")  # first release step >= t
    owner = codes[inc]
    amount = amounts[inc]
    inside = row < len(steps_arr)
    order = np.argsort(row[inside], kind="stable")
    row, owner, amount = row[inside][order], owner[inside][order], amount[inside][order]
    bounds = np.searchsorted(row, np.arange(len(steps_arr) + 1), side="left")

    source = NoiseSource(NoiseKey.from_bytes(key_bytes), spec.purpose)
    if spec.joins:
        yield from _joined_run(spec, source, item_values, steps_arr, owner, amount, bounds)
        return
    noise = spec.tree_noise(source, item_values)
    counts = np.zeros(n_items, dtype=np.int64)
    shown = np.zeros(n_items, dtype=bool)
    for i, t in enumerate(steps_arr.tolist()):
        lo, hi = bounds[i], bounds[i + 1]
        np.add.at(counts, owner[lo:hi], amount[lo:hi])
        advance_to(noise, t)
        values = counts + noise.noise()
        if spec.mechanism == UNKNOWN:
            keep = (counts > 0) & (values > spec.threshold_at(t))
            if spec.remember:
                shown |= keep
                keep = shown.copy()
            idx = np.flatnonzero(keep)
            yield t, idx, values[idx]
        else:
            yield t, None, values


def _joined_run(
    spec: ReleaseSpec,
    source: NoiseSource,
    item_values: list,
    steps: np.ndarray,
    owner: np.ndarray,
    amount: np.ndarray,
    bounds: np.ndarray,
) -> Iterator[tuple[int, np.ndarray | None, np.ndarray]]:
    """:func:`_released_steps` for UnkBase with a BLT counter: an item joins the
    noise at the first release step at which it has a count (its increments are
    sorted by release step, ``bounds`` delimiting each step's), as in the local
    engine's ``UnknownDomainHistogram.release`` at exactly those steps: the steps
    run for the items already in, then the new ones join (their state at t - 1
    drawn from its law, then step t). Noise column j holds item ``order[j]``."""
    n_items = len(item_values)
    counts = np.zeros(n_items, dtype=np.int64)
    joined = np.zeros(n_items, dtype=bool)
    order = np.empty(n_items, dtype=np.int64)
    shown = np.zeros(n_items, dtype=bool)
    n = 0
    noise = spec.joining_noise(source, 0)
    for i, t in enumerate(steps.tolist()):
        lo, hi = bounds[i], bounds[i + 1]
        np.add.at(counts, owner[lo:hi], amount[lo:hi])
        noise.advance(t)
        fresh = np.unique(owner[lo:hi][amount[lo:hi] > 0])
        fresh = fresh[~joined[fresh]]
        if fresh.size:
            spec.join(noise, [item_values[j] for j in fresh.tolist()])
            joined[fresh] = True
            order[n : n + fresh.size] = fresh
            n += fresh.size
        cols = order[:n]
        values = counts[cols] + noise.noise()
        keep = values > spec.threshold_at(t)
        if spec.remember:
            shown[:n] |= keep
            keep = shown[:n].copy()
        yield t, cols[keep], values[keep]


# ------------------------------------------------------------------ SparseGumb parts


@dataclass(frozen=True)
class TopKSpec:
    """What an executor needs for SparseGumb's item noise (no secret inside).

    Built from the local :class:`~dpstream.mechanisms.topk.ContinualTopK`, so the
    scope, the scales and the tree are the local engine's own.

    Attributes:
        noise_scope: ``ContinualTopK.noise_scope`` (fingerprints T, r, tau, k, s, eta).
        horizon, base: T and the counters' tree base r (``None`` with BLT counters).
        counter_std: the std of the counters' keyed draws: sqrt(L_r) tau_2 for a tree
            cell, ``ContinualTopK.counter_std`` for a BLT counter.
        select_scale: the selection's Gumbel scale, tau_2 / 2.
        query_scale: the sparse-vector query's Laplace scale, 4 tau_1.
    """

    noise_scope: str
    horizon: int
    base: int | None
    counter_std: float
    select_scale: float
    query_scale: float
    strategy: BLTStrategy | None = None  # the BLT counters' factorization, if any


def topk_counter_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: TopKSpec,
    key_bytes: bytes,
    t: int,
    item_col: str,
    count_col: str,
    gen_col: str,
) -> Iterator[pd.DataFrame]:
    """Released counts at t of selected items: h_t^u + the tree noise of u's counter.

    Each row is a selected item, its prefix count and the selection number n at
    which it entered the selection (its counter's generation). The counter of
    generation n is a ``TreeNoise`` under purpose ``f"{noise_scope}/counter-{n}"``
    (``ContinualTopK._select``), jumped to t: bit-identical to the local
    counters that advanced step by step. Output: item, gen, ``value``.
    """
    key = NoiseKey.from_bytes(key_bytes)
    for pdf in batches:
        if len(pdf) == 0:
            continue
        items = _items_list(pdf[item_col])
        counts = _counts_array(pdf[count_col])
        gens = pdf[gen_col].to_numpy(dtype=np.int64)
        values = np.empty(len(pdf))
        for n in np.unique(gens).tolist():
            rows = np.flatnonzero(gens == n)
            source = NoiseSource(key, f"{spec.noise_scope}/counter-{n}")
            noise: TreeNoise | BLTNoise
            if spec.strategy is not None:
                noise = BLTNoise(source, spec.strategy, spec.counter_std)
            else:
                noise = TreeNoise(source, spec.horizon, tree_base(spec.base), spec.counter_std)
            noise.add_items(source.prepare([items[i] for i in rows]))
            noise.advance(t)
            values[rows] = counts[rows] + noise.noise()
        yield pd.DataFrame(
            {item_col: pdf[item_col].reset_index(drop=True), gen_col: gens, "value": values}
        )


def topk_query_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: TopKSpec,
    key_bytes: bytes,
    t: int,
    epoch: int,
    threshold: float,
    item_col: str,
    count_col: str,
) -> Iterator[pd.DataFrame]:
    """The sparse-vector query of step t over non-selected items: any h_t^u + Lap > m_t?

    The Laplace(4 tau_1) of item u is u's value at (0, t, draw=epoch) under
    purpose ``f"{noise_scope}/svt"``, as in ``ContinualTopK._release``. Yields
    one row per batch: ``above`` (bool) and ``top`` (the batch's largest noisy
    query, for diagnostics on the driver; private).
    """
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), f"{spec.noise_scope}/svt")
    for pdf in batches:
        if len(pdf) == 0:
            continue
        counts = _counts_array(pdf[count_col])
        prepared = source.prepare(_items_list(pdf[item_col]))
        query = counts + source.laplace(prepared, 0, t, epoch, scale=spec.query_scale)
        yield pd.DataFrame(
            {"above": [bool((query > threshold).any())], "top": [float(query.max())]}
        )


def topk_select_batch(
    batches: Iterator[pd.DataFrame],
    *,
    spec: TopKSpec,
    key_bytes: bytes,
    n: int,
    k: int,
    item_col: str,
    count_col: str,
) -> Iterator[pd.DataFrame]:
    """Selection number n, per batch: the batch's k best scores h_t^u + Gumbel(tau_2 / 2).

    The Gumbel of item u is its value at (0, 0, GUMBEL_DRAW) under purpose
    ``f"{noise_scope}/select-{n}"`` (``gumbel_select_kernel``). The k largest
    scores of the whole domain are among the union of every batch's k largest,
    so the driver merges at most k rows per batch. Output: item, ``score``.
    """
    source = NoiseSource(NoiseKey.from_bytes(key_bytes), f"{spec.noise_scope}/select-{n}")
    for pdf in batches:
        if len(pdf) == 0:
            continue
        counts = _counts_array(pdf[count_col])
        prepared = source.prepare(_items_list(pdf[item_col]))
        scores = counts + source.gumbel(prepared, 0, 0, GUMBEL_DRAW, scale=spec.select_scale)
        idx = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        yield pd.DataFrame(
            {item_col: pdf[item_col].iloc[idx].reset_index(drop=True), "score": scores[idx]}
        )
