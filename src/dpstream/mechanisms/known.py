"""BinMech (Algorithm 1) and KnownBase (Algorithm 2): tree counters with Gaussian noise.

The r-ary tree counter of Section 3 of the paper, one per domain item. Noise is
keyed (``dpstream.noise``), addressed by (item, cell), so that the release at t
depends only on the prefix counts at t, t, and the key: the paper's practical
setting.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from .. import privacy
from ..errors import InvalidEventError
from ..noise import NoiseKey, NoiseSource
from ..tree import num_levels, worst_case_variance_factor
from .base import (
    EventLimit,
    Release,
    TruncationStats,
    check_base,
    check_count_value,
    check_domain,
    check_horizon,
    check_key,
    check_max_items,
    check_next_step,
    check_stream_name,
    config_tag,
    domain_counts,
    resolve_privacy,
)
from .tree_noise import TreeNoise

__all__ = ["KnownDomainHistogram", "TreeCounter", "tree_purpose"]


def tree_purpose(stream: str, *, horizon: int, base: int, cell_std: float) -> str:
    """The noise purpose of the tree cells of stream ``stream`` with these settings.

    KnownBase, UnkBase and the stand-alone TreeCounter share it when their tree
    (T, r) and cell noise scale agree: the paper's UnkBase adds to a discovered
    item "the same realization" KnownBase would. Other settings give
    independent noise (see :func:`~dpstream.mechanisms.base.config_tag`).
    Different streams under one key must use different names.
    """
    return f"{stream}/tree@{config_tag(horizon=horizon, base=base, cell_std=cell_std)}"


class KnownDomainHistogram:
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

    Args:
        domain: the items, distinct (str, int or bytes).
        horizon: T, the number of time steps.
        max_items: Delta0, the most distinct items an event may hold.
        base: the tree base r; ``None`` picks r* = argmin (r-1) L_r^2.
        key: the secret :class:`~dpstream.NoiseKey`.
        rho: target rho-zCDP, or
        epsilon, delta: target (epsilon, delta)-DP (calibrated by the exact
            Gaussian-mechanism curve, the tightest analysis here), or
        tau: the noise scale itself.
        stream: a name that separates this stream's noise from other streams
            released under the same key.
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
    theorem = "KnownBase lemma (Sec. 3): Delta0/(2 tau^2)-zCDP"

    def __init__(
        self,
        domain: Iterable[Hashable],
        horizon: int,
        *,
        max_items: int,
        key: NoiseKey,
        base: int | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        stream: str = "default",
        on_invalid: str = "error",
    ) -> None:
        self.horizon = check_horizon(horizon)
        self.base = check_base(base, self.horizon)
        self.max_items = check_max_items(max_items)
        self.stream = check_stream_name(stream)
        check_key(key)
        self._limit = EventLimit(on_invalid, key=key, stream=self.stream,
                                 max_items=self.max_items)
        self.domain, self._index = check_domain(domain)
        self.levels = num_levels(self.horizon, self.base)
        self._coef = self.max_items / 2.0  # rho = coef / tau^2
        self.budget, self.tau, self.privacy = resolve_privacy(
            rho=rho, epsilon=epsilon, delta=delta, tau=tau, coefficient=self._coef,
            gaussian_exact=True, mechanism=self.mechanism_name, theorem=self.theorem,
        )
        self.key = key
        cell_std = math.sqrt(self.levels) * self.tau
        self.tree_purpose = tree_purpose(self.stream, horizon=self.horizon, base=self.base,
                                         cell_std=cell_std)
        source = NoiseSource(key, self.tree_purpose)
        self._noise = TreeNoise(source, self.horizon, self.base, cell_std)
        self._noise.add_items(source.prepare(self.domain))
        self._counts = np.zeros(len(self.domain), dtype=np.int64)
        self.t = 0

    # -- facts ---------------------------------------------------------------
    @property
    def noise_std_worst(self) -> float:
        """The largest standard deviation of a released count over t <= T."""
        return float(np.sqrt(worst_case_variance_factor(self.horizon, self.base)) * self.tau)

    def noise_std_at(self, t: int) -> float:
        """The standard deviation of a released count at t: tau sqrt(|I_t| L_r)."""
        from ..tree import digits

        return float(np.sqrt(sum(digits(t, self.base)) * self.levels) * self.tau)

    @property
    def counts(self) -> np.ndarray:
        """The true running counts (event mode), aligned with ``domain``. Not private."""
        return self._counts.copy()

    @property
    def truncation(self) -> TruncationStats:
        """What ``on_invalid="truncate"`` dropped so far (event mode). Not private."""
        return self._limit.stats

    # -- event mode ----------------------------------------------------------
    def _event_indices(self, events: Iterable[object]) -> tuple[np.ndarray, TruncationStats]:
        idx: list[int] = []
        index = self._index
        checked, delta = self._limit.events(events, index)
        for items in checked:
            for item in items:
                pos = index.get(item)
                if pos is None:
                    raise InvalidEventError(f"item {item!r} is not in the domain")
                idx.append(pos)
        return np.asarray(idx, dtype=np.int64), delta

    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release the noisy histogram."""
        return self.step_batch([event])

    def step_batch(self, events: Iterable[Iterable[Hashable]]) -> Release:
        """Take all the events of the next time step (possibly none) and release.

        Every event is checked (at most ``max_items`` items, all in the domain)
        before anything changes; on error the mechanism is untouched.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        idx, delta = self._event_indices(events)
        new_counts = self._counts + np.bincount(idx, minlength=len(self.domain))
        self._limit.commit(delta)
        return self._release(t, new_counts)

    # -- aggregate mode --------------------------------------------------------
    def release(self, t: int, counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray
                ) -> Release:
        """Release at step t from the true prefix histogram h_t (the practical setting).

        ``counts`` maps items to their counts over steps 1..t (missing items
        count 0), or is an array aligned with ``domain``. Gives the same release
        as event mode for the same stream and key. Steps must increase; any
        step may be skipped.
        """
        check_next_step(t, self.t, self.horizon)
        new_counts = self._counts_array(counts)
        return self._release(int(t), new_counts)

    def _counts_array(self, counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray
                      ) -> np.ndarray:
        return domain_counts(counts, self._index, self._counts)

    def _release(self, t: int, new_counts: np.ndarray) -> Release:
        self._noise.advance(t)
        self._counts = new_counts
        self.t = t
        values = new_counts + self._noise.noise()
        return Release(t=t, items=self.domain, values=values)

    def __repr__(self) -> str:
        return (
            f"KnownDomainHistogram(d={len(self.domain)}, T={self.horizon}, r={self.base}, "
            f"max_items={self.max_items}, tau={self.tau:.4g}, t={self.t})"
        )


class TreeCounter:
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
    ) -> None:
        self._hist = KnownDomainHistogram(
            [self.item], horizon, max_items=1, key=key, base=base,
            rho=rho, epsilon=epsilon, delta=delta, tau=tau, stream=stream,
        )
        self.horizon = self._hist.horizon
        self.base = self._hist.base
        self.levels = self._hist.levels
        self.tau = self._hist.tau
        self.privacy = privacy.guarantee_for_tau(
            tau=self.tau, a=0.5,
            delta=self._hist.privacy.delta,
            mechanism=self.mechanism_name, theorem=self.theorem, gaussian_exact=True,
            target_epsilon=self._hist.budget.epsilon,
        )

    @property
    def t(self) -> int:
        return self._hist.t

    @property
    def count(self) -> int:
        """The true running count (not private)."""
        return int(self._hist.counts[0])

    def step(self, x: int = 1) -> float:
        """Add the bit (or, for counts of many events, the increment) x and release.

        Event-level privacy holds for increments that one event changes by at
        most 1 (a bit stream, as in the paper).
        """
        if isinstance(x, bool):
            x = int(x)
        x = check_count_value("x", x)
        rel = self._hist.release(self.t + 1, np.array([self.count + int(x)], dtype=np.int64))
        return float(rel.values[0])

    def release(self, t: int, count: int) -> float:
        """Aggregate mode: the noisy count at t from the true count over 1..t."""
        count = check_count_value("count", count)
        rel = self._hist.release(t, np.array([count], dtype=np.int64))
        return float(rel.values[0])

    def __repr__(self) -> str:
        return f"TreeCounter(T={self.horizon}, r={self.base}, tau={self.tau:.4g}, t={self.t})"
