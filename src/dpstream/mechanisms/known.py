"""BinMech (Algorithm 1) and KnownBase (Algorithm 2): tree counters with Gaussian noise.

The r-ary tree counter of Section 3 of the paper, one per domain item. Noise is
keyed (``dpstream.noise``), addressed by (item, cell), so that the release at t
depends only on the prefix counts at t, t, and the key: the paper's practical
setting.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from .. import compiled, privacy
from ..bounding import resolve_user_bounds
from ..errors import InvalidEventError
from ..factorization import BLTStrategy
from ..noise import (
    DEFAULT_NOISE_VERSION,
    NoiseKey,
    NoiseSource,
    check_noise_version,
    digest_chunks,
    encode_item,
    item_chunks,
    versioned_purpose,
)
from ..tree import num_levels
from . import narrow_counts
from .base import (
    EventLimit,
    Release,
    TruncationStats,
    check_count_value,
    check_in_domain,
    check_key,
    check_max_items,
    check_next_step,
    check_stream_name,
    config_tag,
    domain_counts,
    domain_items,
    resolve_privacy,
)
from .blt_noise import BLTNoise
from .columns import (
    EventColumns,
    as_events,
    domain_positions,
    fast_events,
)
from .counters import (
    CounterStd,
    blt_purpose,
    blt_sigma,
    for_all_t,
    resolve_counter,
    stream_horizon,
    tree_base,
)
from .item_table import ItemTable, domain_table, release_items
from .params import HistogramParams
from .serial import OneStream, one_at_a_time
from .tree_noise import TreeNoise
from .users import (
    UserLevel,
    bound_user_events,
    check_bounded,
    commit_user_events,
    unit_bound,
    user_guarantee,
)

__all__ = [
    "BLTCounter",
    "KnownDomainHistogram",
    "TreeCounter",
    "tree_purpose",
    "domain_tag",
    "item_fingerprint",
    "combine_fingerprints",
]


def tree_purpose(
    stream: str,
    *,
    horizon: int,
    base: int,
    cell_std: float,
    max_items: int | None,
    domain: str,
    users: str | None = None,
    noise_version: int = DEFAULT_NOISE_VERSION,
) -> str:
    """The noise purpose of the tree cells of stream ``stream`` with these settings.

    Every setting that changes what is released is in it (see
    :func:`~dpstream.mechanisms.base.config_tag`): the tree (T, r), the cell
    noise scale, Delta0 (``max_items``: another bound truncates other events)
    and the domain (``domain_tag``: a known domain's digest, or ``"open"`` for
    the unknown-domain mechanism; another domain filters other items). Two
    runs under one key and stream name that differ in any of them draw
    independent noise; otherwise the same noise on differently processed
    data would publish the exact difference. Identical settings replay
    identically (a restart, another engine). Different streams under one key
    must use different names. ``users``: the user-level bounds
    (:meth:`~dpstream.bounding.UserBounds.tag`), None at event level (and then
    not part of the tag, so event-level purposes are unchanged).
    ``noise_version``: see :func:`dpstream.noise.versioned_purpose`.
    """
    extra = {} if users is None else {"users": users}
    tag = config_tag(
        horizon=horizon, base=base, cell_std=cell_std, max_items=max_items, domain=domain, **extra
    )
    return versioned_purpose(f"{stream}/tree@{tag}", noise_version)


#: The modulus of the domain fingerprint (a sum of 128-bit item hashes).
_DOMAIN_MOD = 1 << 128
#: What every item's fingerprint hashes before the item's canonical bytes.
_ITEM_PREFIX = b"dpstream/domain-item\0"


def item_fingerprint(item: Hashable) -> int:
    """A 128-bit hash of one domain item (its canonical bytes), for :func:`domain_tag`."""
    digest = hashlib.sha256(_ITEM_PREFIX + encode_item(item)).digest()
    return int.from_bytes(digest[:16], "big")


def combine_fingerprints(total: int, count: int) -> str:
    """The domain tag from the sum of item fingerprints (mod 2^128) and the item count."""
    return f"{count}:{total % _DOMAIN_MOD:032x}"


def _fingerprint_sum_py(items: list[Hashable]) -> int:
    """The sum of the items' :func:`item_fingerprint` (not reduced), by :mod:`hashlib`
    (the compiled loops' twin)."""
    # from a copy of a SHA-256 state that took the prefix; the 128-bit big-endian
    # halves summed as four 32-bit columns in NumPy (exact: each column sum stays
    # below 2^64 up to 2^32 items)
    prefixed = hashlib.sha256(_ITEM_PREFIX)

    def fingerprint(item: Hashable) -> bytes:
        h = prefixed.copy()
        h.update(encode_item(item))
        return h.digest()[:16]

    sums = [0, 0, 0, 0]  # most significant column first
    for part in digest_chunks(fingerprint, items):
        words = np.frombuffer(part, dtype=">u4").reshape(-1, 4).astype(np.uint64)
        sums = [
            a + int(b)
            for a, b in zip(sums, words.sum(axis=0, dtype=np.uint64).tolist(), strict=True)
        ]
    return sum(x << (32 * (3 - i)) for i, x in enumerate(sums))


def domain_tag(domain: Iterable[Hashable]) -> str:
    """A fingerprint of a known domain as a set (for :func:`tree_purpose`).

    The sum of the items' 128-bit hashes modulo 2^128, with the number of
    items: the order of the items does not change a release, so it does not
    change the tag either, and a Spark job can compute it by adding partial
    sums (``dpstream.spark``).
    """
    # in C when the compiled loops are on (the same sum), else by hashlib; a chunk
    # of items at a time
    total, count = 0, 0
    for chunk in item_chunks(domain):
        part = compiled.fingerprint_sum(chunk, _ITEM_PREFIX, encode_item)
        total += _fingerprint_sum_py(chunk) if part is None else part
        count += len(chunk)
    return combine_fingerprints(total, count)


class KnownDomainHistogram(CounterStd, OneStream):
    """KnownBase (Algorithm 2, ``algo:KnownBase``): a running histogram over a known domain.

    Each domain item u gets its own r-ary tree counter (BinMech, Algorithm 1):
    every cell of the tree over 1..T carries N(0, L_r tau^2) noise, and the
    noisy count of u at t is h_t^u plus the noise of the cells I_t(r).

    Privacy (the KnownBase lemma, after ``algo:KnownBase``): if every event holds
    at most ``max_items`` = Delta0 items, the whole partial-sum table is a
    Gaussian mechanism with l2 sensitivity sqrt(Delta0 L_r) and per-cell noise
    sqrt(L_r) tau, so the mechanism is Delta0 / (2 tau^2)-zCDP, and its exact
    (epsilon, delta) curve is that of a Gaussian mechanism with
    sensitivity/noise ratio sqrt(Delta0)/tau (Balle and Wang 2018). Privacy is
    event-level: two streams are neighbours when one is the other with one
    event removed (the paper's Section 2). ``step_batch`` may take many events
    for one time step, each still limited to Delta0 items.

    Noise is a function of (key, stream, item, cell): two different streams
    released under one key must use different ``stream`` names, and a stream
    must not be released twice with edited data under the same key and name
    (the difference of the two releases would be the difference of the data).

    Utility (``thm:BinMechUtility``): the count at t has variance
    |I_t(r)| L_r tau^2 <= (r - 1) L_r^2 tau^2.

    With ``counter="blt"`` each item's counter is instead the BLT factorization
    A = B C of :mod:`dpstream.factorization` (Dvijotham, McMahan, Pillutla,
    Steinke and Thakurta 2024): keyed draws z ~ N(0, sigma^2) per item and
    step, sigma = tau max_j ||C e_j||, and the released noise is B z. The
    mechanism is then the Gaussian mechanism on the stacked C x^u, with l2
    sensitivity sqrt(Delta0) max_j ||C e_j||: Delta0 max_j ||C e_j||^2 /
    (2 sigma^2) = Delta0 / (2 tau^2)-zCDP, the same guarantee and exact
    (epsilon, delta) curve as the tree, with the count at t of variance
    sigma^2 ||row_t(B)||^2 (a standard deviation 2.6x to 3.1x below the tree's
    for T = 10^3..10^6).
    ``h.strategy`` is the fitted :class:`~dpstream.factorization.BLTStrategy`.

    User-level privacy (``max_items_per_user=`` L0 and ``max_count_per_item=``
    Linf): each event is a ``(user, items)`` pair, every user is kept within
    the bounds over the whole stream (first come, first kept,
    :class:`~dpstream.bounding.ContributionBounder`), and the guarantee hides
    all of one user's contributions. One user changes at most L0 counters, each
    by a vector x >= 0 with at most Linf over all steps; the worst placement
    puts all Linf at one step (:mod:`dpstream.bounding`, lemma: exact for the
    tree and for any BLT), so the table is a Gaussian mechanism with
    sensitivity sqrt(L0) Linf max_j ||C e_j|| and the same noise:
    L0 Linf^2 / (2 tau^2)-zCDP, with the exact Gaussian curve at ratio
    sqrt(L0) Linf / tau (``.privacy.unit == "user"``). ``max_items`` (Delta0)
    is then optional: a per-event check only.

    Args:
        domain: the items, distinct (str, int or bytes).
        horizon: T, the number of time steps; ``None``: a stream with no planned
            end (the BLT :func:`~dpstream.factorization.blt_unbounded`, whose
            sensitivity holds for every t; at most 2^40 steps; ``.privacy``
            says ``for_all_t``).
        max_items: Delta0, the most distinct items an event may hold (required
            at event level; optional with the user bounds).
        counter: ``"tree"``, ``"blt"``, a :class:`~dpstream.factorization.BLTStrategy`,
            or ``None``: the tree if ``base`` is given, else the counter with the
            smaller worst-case variance for T (BLT for every T >= 2).
        base: the tree base r; ``None`` picks r* = argmin (r-1) L_r^2.
        key: the secret :class:`~dpstream.NoiseKey`.
        rho: target rho-zCDP, or
        epsilon, delta: target (epsilon, delta)-DP (calibrated by the exact
            Gaussian-mechanism curve, the tightest analysis here), or
        tau: the noise scale itself.
        stream: a name that separates this stream's noise from other streams
            released under the same key.
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).
        max_items_per_user, max_count_per_item: L0 and Linf, for user-level
            privacy (both or neither).
        on_invalid: ``"error"`` (default): an event over ``max_items`` items
            (or with an item outside the domain) raises; ``"truncate"``: keep
            ``max_items`` of its items chosen by a keyed PRF and drop items
            outside the domain (:class:`~dpstream.mechanisms.base.EventLimit`;
            ``.truncation`` counts what was dropped, not private).

    Example:
        >>> import dpstream as dps
        >>> key = dps.NoiseKey.generate()
        >>> h = dps.KnownDomainHistogram(["a", "b", "c"], 100, max_items=2, key=key, rho=1.0)
        >>> rel = h.step(["a", "b"])
        >>> sorted(rel.counts)
        ['a', 'b', 'c']
    """

    mechanism_name = "KnownBase"
    accepts_columns = True  # step_batch takes EventColumns
    theorem = "KnownBase lemma (Sec. 3): Delta0/(2 tau^2)-zCDP"
    theorem_blt = (
        "KnownBase with BLT counters: Gaussian mechanism on C x, "
        "Delta0 max_j||C e_j||^2/(2 sigma^2) = Delta0/(2 tau^2)-zCDP"
    )
    theorem_user = (
        "KnownBase per user (dpstream.bounding lemma): Gaussian mechanism with "
        "sensitivity sqrt(L0) Linf max_j||C e_j||, L0 Linf^2/(2 tau^2)-zCDP"
    )

    def __init__(
        self,
        domain: Iterable[Hashable],
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
        max_items_per_user: int | None = None,
        max_count_per_item: int | None = None,
        on_invalid: str = "error",
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        self.noise_version = check_noise_version(noise_version)
        self.horizon, self.unbounded = stream_horizon(horizon)
        self.counter, self.base, self.strategy = resolve_counter(
            counter, base, self.horizon, unbounded=self.unbounded
        )
        self.user_bounds = resolve_user_bounds(max_items_per_user, max_count_per_item)
        self.max_items = (
            None if max_items is None and self.user_bounds else check_max_items(max_items)
        )
        self.stream = check_stream_name(stream)
        check_key(key)
        self._limit = EventLimit(
            on_invalid,
            key=key,
            stream=self.stream,
            max_items=self.max_items,
            user_level=self.user_bounds is not None,
        )
        items = domain_items(domain, key)
        # the domain, numbered in release order: a compact table of str items (or a
        # list and a dict for other types), which finds a step's positions at once
        self._index = domain_table(items)
        self._release_items = release_items(self._index, items)
        if self.strategy is not None:
            self.theorem = self.theorem_blt
        # rho = coef / tau^2: Delta0 / 2 per event, L0 Linf^2 / 2 per user
        self._coef = unit_bound(self.max_items, self.user_bounds).coefficient
        self.budget, self.tau, self.privacy = resolve_privacy(
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            coefficient=self._coef,
            gaussian_exact=True,
            mechanism=self.mechanism_name,
            theorem=self.theorem,
        )
        if self.user_bounds is not None:
            self.privacy = user_guarantee(self.privacy, self.user_bounds, self.theorem_user)
        self.privacy = for_all_t(self.privacy, self.unbounded)
        self._users = None if self.user_bounds is None else UserLevel(self.user_bounds, key)
        users = None if self.user_bounds is None else self.user_bounds.tag()
        self.key = key
        self._noise: TreeNoise | BLTNoise
        domain = domain_tag(items)
        if self.strategy is None:
            base = tree_base(self.base)
            self.levels: int | None = num_levels(self.horizon, base)
            cell_std = math.sqrt(self.levels) * self.tau
            self.tree_purpose: str | None = tree_purpose(
                self.stream,
                horizon=self.horizon,
                base=base,
                cell_std=cell_std,
                max_items=self.max_items,
                domain=domain,
                users=users,
                noise_version=self.noise_version,
            )
            self.sigma = cell_std
            self.noise_purpose = self.tree_purpose
            source = NoiseSource(key, self.tree_purpose)
            self._noise = TreeNoise(source, self.horizon, base, cell_std)
        else:
            self.levels = self.tree_purpose = None
            self.sigma = blt_sigma(self.tau, self.strategy)
            self.noise_purpose = blt_purpose(
                self.stream,
                strategy=self.strategy,
                sigma=self.sigma,
                max_items=self.max_items,
                domain=domain,
                users=users,
                noise_version=self.noise_version,
            )
            source = NoiseSource(key, self.noise_purpose)
            self._noise = BLTNoise(source, self.strategy, self.sigma)
        self._noise.add_items(source.prepare(items))
        # int32 while every count fits (4 bytes per item less), int64 from then on
        self._counts = np.zeros(len(items), dtype=np.int32)
        self._max_count = 0
        del items
        self.t = 0

    @classmethod
    def from_params(
        cls,
        domain: Iterable[Hashable],
        params: HistogramParams,
        *,
        key: NoiseKey,
        on_invalid: str = "error",
    ) -> KnownDomainHistogram:
        """The histogram of ``params`` (the value :class:`dpstream.spark.SparkKnownBase`
        is built from too) over ``domain``."""
        return cls(domain, params.horizon, key=key, on_invalid=on_invalid, **params.kwargs())

    @property
    def domain(self) -> list[Hashable]:
        """The domain items, in release order (a new list: changing it changes nothing)."""
        return list(self._release_items)

    @property
    def domain_index(self) -> ItemTable:
        """The domain's item table (:class:`~dpstream.mechanisms.item_table.ItemTable`),
        for looking up many items' positions at once (``lookup``, ``get``, ``len``).
        Shared, not copied: read it, never add to it."""
        return self._index

    # -- facts (noise_std_worst, noise_std_at: CounterStd) ---------------------
    @property
    def counts(self) -> np.ndarray:
        """The true running counts (event mode), aligned with ``domain``. Not private."""
        return self._counts.astype(np.int64)

    @property
    def truncation(self) -> TruncationStats:
        """What ``on_invalid="truncate"`` dropped so far (event mode). Not private."""
        return self._limit.stats

    # -- event mode ----------------------------------------------------------
    def _event_indices(
        self, events: Iterable[object] | EventColumns, t: int
    ) -> tuple[np.ndarray, TruncationStats]:
        events = as_events(events)
        if not self._limit.truncating:  # (truncation: the per-event path below)
            fast = domain_positions(events, self._index, self.max_items)
            if fast is not None:
                return fast, TruncationStats(events=len(events))
        events = fast_events(events)  # the per-event path raises the precise error
        idx: list[int] = []
        index = self._index
        checked, delta = self._limit.events(events, index, t=t)
        for items in checked:
            for item in items:
                pos = index.get(item)
                if pos is None:
                    raise InvalidEventError(f"item {item!r} is not in the domain")
                idx.append(pos)
        return np.asarray(idx, dtype=np.int64), delta

    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release the noisy histogram."""
        return self.step_batch([event])

    @one_at_a_time
    def step_batch(self, events: Iterable[Iterable[Hashable]] | EventColumns) -> Release:
        """Take all the events of the next time step (possibly none) and release.

        ``events``: a list of events, or the step as
        :class:`~dpstream.mechanisms.columns.EventColumns` (the same release).
        Every event is checked (at most ``max_items`` items, all in the domain)
        before anything changes; on error the mechanism is untouched. With user
        bounds each event is a ``(user, items)`` pair, bounded per user first.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        batch, pending = bound_user_events(
            self._users, events, self.max_items, partial(check_in_domain, index=self._index)
        )
        idx, delta = self._event_indices(batch, t)
        new_counts = self._counts + np.bincount(idx, minlength=len(self._release_items))
        # the largest count: the last step's, or that of an item this step counted
        top = max(self._max_count, int(new_counts[idx].max())) if idx.size else self._max_count
        self._limit.commit(delta)
        rel = self._release(t, new_counts, top)
        commit_user_events(self._users, pending)
        return rel

    # -- aggregate mode --------------------------------------------------------
    @one_at_a_time
    def release(
        self,
        t: int,
        counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray | Any,
        values: Sequence[int] | np.ndarray | None = None,
        *,
        bounded: bool = False,
    ) -> Release:
        """Release at step t from the true prefix histogram h_t (the practical setting).

        ``counts`` maps items to their counts over steps 1..t (missing items
        count 0), or is an array aligned with ``domain``; or give the items and
        their counts as two arrays, ``release(t, items, counts)``, or a
        pandas/polars/Arrow frame with columns ``item`` and ``count``. Gives the
        same release as event mode for the same stream and key. Steps must
        increase; any step may be skipped. With user bounds, ``counts`` must be those of
        contributions already bounded per user (first come, first kept), which
        ``bounded=True`` says: the counts carry no user ids to bound here.
        """
        check_bounded(self._users, bounded)  # user level: counts bounded beforehand
        check_next_step(t, self.t, self.horizon)
        new_counts = domain_counts(counts, self._index, self._counts, values)
        return self._release(int(t), new_counts)

    def _release(self, t: int, new_counts: np.ndarray, top: int | None = None) -> Release:
        """Step to t with the int64 prefix counts ``new_counts``, whose largest is ``top``
        (None: taken from them)."""
        values = self._noise.advance(t, new_counts)  # new_counts + noise, in one pass
        if top is None:
            top = int(new_counts.max(initial=0))
        # into the mechanism's own array (never the caller's): int32 while the largest
        # count fits, which keeps every value; int64 from the first step it does not
        self._counts = narrow_counts.store(self._counts, new_counts, top)
        self._max_count = top
        self.t = t
        return Release(t=t, items=self._release_items, values=values)

    def __repr__(self) -> str:
        shape = f"r={self.base}" if self.strategy is None else f"blt={self.strategy.buffers}"
        return (
            f"KnownDomainHistogram(d={len(self._release_items)}, T={self.horizon}, {shape}, "
            f"max_items={self.max_items}, tau={self.tau:.4g}, t={self.t})"
        )


class _OneCount(OneStream):
    """What TreeCounter and BLTCounter share: one count, kept by a one-item
    KnownDomainHistogram (``self._hist``), whose guarantee is restated for a
    single counter (rho = 1/(2 tau^2), increments of at most 1 per event)."""

    mechanism_name: str
    theorem: str
    _hist: KnownDomainHistogram

    def _wrap(self) -> None:
        self.horizon = self._hist.horizon
        self.tau = self._hist.tau
        self.privacy = privacy.guarantee_for_tau(
            tau=self.tau,
            a=0.5,
            delta=self._hist.privacy.delta,
            mechanism=self.mechanism_name,
            theorem=self.theorem,
            gaussian_exact=True,
            target_epsilon=self._hist.budget.epsilon,
        )

    @property
    def t(self) -> int:
        return self._hist.t

    @property
    def count(self) -> int:
        """The true running count (not private)."""
        return int(self._hist.counts[0])

    @one_at_a_time
    def step(self, x: int = 1) -> float:
        """Add the bit (or, for counts of many events, the increment) x and release.

        Event-level privacy holds for increments that one event changes by at
        most 1 (a bit stream, as in the paper).
        """
        if isinstance(x, bool):
            x = int(x)
        x = check_count_value("x", x)
        total = check_count_value("the running count", self.count + int(x))
        rel = self._hist.release(self.t + 1, np.array([total], dtype=np.int64))
        return float(rel.values[0])

    @one_at_a_time
    def release(self, t: int, count: int) -> float:
        """Aggregate mode: the noisy count at t from the true count over 1..t."""
        count = check_count_value("count", count)
        rel = self._hist.release(t, np.array([count], dtype=np.int64))
        return float(rel.values[0])


class TreeCounter(_OneCount):
    """BinMech (Algorithm 1, ``algo:BaseMechanism``): one private running count.

    The r-ary generalisation of the binary mechanism of Chan, Shi and Song
    (2011) with Gaussian noise: every cell of the tree carries N(0, L_r tau^2)
    and the count at t sums the cells I_t(r).

    Privacy (the BinMech theorem, Sec. 3): 1/(2 tau^2)-zCDP for any base,
    exactly a Gaussian mechanism with sensitivity/noise ratio 1/tau when each
    step's increment is 0 or 1 (event-level privacy for a bit stream).
    Utility (``thm:BinMechUtility``): variance |I_t(r)| L_r tau^2 <= (r-1) L_r^2 tau^2.

    Args:
        horizon: T.
        base: r; ``None`` picks r*.
        key: the secret key.
        rho | epsilon, delta | tau: the budget, exactly one form.
        stream: separates this counter's noise from other streams under the key.
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).

    Example:
        >>> import dpstream as dps
        >>> c = dps.TreeCounter(1000, key=dps.NoiseKey.generate(), rho=0.5)
        >>> c.base
        4
        >>> y = c.step(1)
    """

    mechanism_name = "BinMech"
    theorem = "BinMech theorem (Sec. 3): 1/(2 tau^2)-zCDP"
    item = "__counter__"

    def __init__(
        self,
        horizon: int,
        *,
        key: NoiseKey,
        base: int | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        stream: str = "counter",
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        self._hist = KnownDomainHistogram(
            [self.item],
            horizon,
            max_items=1,
            key=key,
            counter="tree",
            base=base,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            stream=stream,
            noise_version=noise_version,
        )
        self._wrap()
        self.base = self._hist.base
        self.levels = self._hist.levels

    def __repr__(self) -> str:
        return f"TreeCounter(T={self.horizon}, r={self.base}, tau={self.tau:.4g}, t={self.t})"


class BLTCounter(_OneCount):
    """One private running count with a BLT factorization counter (the sibling of TreeCounter).

    The counter releases s_t + (B z)_t where A = B C is a buffered linear
    Toeplitz factorization of the prefix-sum matrix (:mod:`dpstream.factorization`;
    Dvijotham, McMahan, Pillutla, Steinke and Thakurta 2024) and z are keyed
    N(0, sigma^2) draws, one per step, sigma = tau max_j ||C e_j||.

    Privacy: the Gaussian mechanism on C x with l2 sensitivity max_j ||C e_j||
    when each step's increment changes by at most 1 (event-level privacy for a
    bit stream): max_j ||C e_j||^2 / (2 sigma^2) = 1/(2 tau^2)-zCDP, with the
    exact Gaussian (epsilon, delta) curve at ratio 1/tau, as TreeCounter.
    Utility: the count at t has variance sigma^2 ||row_t(B)||^2, at most
    V tau^2 with V = :attr:`~dpstream.factorization.BLTStrategy.worst_case_variance`.

    Args:
        horizon: T.
        key: the secret key.
        strategy: a :class:`~dpstream.factorization.BLTStrategy` (restated for T),
            or ``None`` for :func:`~dpstream.factorization.blt_for_horizon` (4 buffers).
        rho | epsilon, delta | tau: the budget, exactly one form.
        stream: separates this counter's noise from other streams under the key.
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).

    Example:
        >>> import dpstream as dps
        >>> c = dps.BLTCounter(1000, key=dps.NoiseKey.generate(), rho=0.5)
        >>> c.strategy.buffers
        4
        >>> y = c.step(1)
    """

    mechanism_name = "BLTCounter"
    theorem = (
        "Gaussian mechanism on C x (BLT factorization A = B C): "
        "max_j||C e_j||^2/(2 sigma^2) = 1/(2 tau^2)-zCDP"
    )
    item = "__counter__"

    def __init__(
        self,
        horizon: int,
        *,
        key: NoiseKey,
        strategy: BLTStrategy | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        stream: str = "counter",
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        if strategy is not None and not isinstance(strategy, BLTStrategy):
            raise TypeError(
                f"strategy must be a BLTStrategy or None, got {type(strategy).__name__}"
            )
        self._hist = KnownDomainHistogram(
            [self.item],
            horizon,
            max_items=1,
            key=key,
            counter="blt" if strategy is None else strategy,
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            stream=stream,
            noise_version=noise_version,
        )
        self._wrap()
        self.strategy: BLTStrategy = self._hist.strategy  # type: ignore[assignment]
        self.sigma = self._hist.sigma

    @property
    def noise_std_worst(self) -> float:
        """The largest standard deviation of a released count over t <= T."""
        return self._hist.noise_std_worst

    def noise_std_at(self, t: int) -> float:
        """The standard deviation of the count released at t: sigma ||row_t(B)||."""
        return self._hist.noise_std_at(t)

    def __repr__(self) -> str:
        return (
            f"BLTCounter(T={self.horizon}, buffers={self.strategy.buffers}, "
            f"tau={self.tau:.4g}, t={self.t})"
        )
