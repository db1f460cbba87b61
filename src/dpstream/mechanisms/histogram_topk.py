"""Top-k as post-processing of KnownBase, and the choice between it and SparseGumb.

Layer 5 of dpstream. When every event holds at most Delta0 items, KnownBase
(``algo:KnownBase``) releases a noisy count of every domain item at every
step; the k largest of those noisy counts are a top-k list at no further
privacy cost (post-processing). SparseGumb (``algo:sparseGumb``) pays for k
counters, s + 1 selections and the sparse vector, whatever the event size. So
for a bounded event size the two are alternatives for one task, and
:func:`choose_top_k` picks the one with the smaller expected error for the
budget, from public parameters only.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri

from ..noise import NoiseKey
from .base import Release, take_items
from .item_table import ItemTable
from .known import KnownDomainHistogram
from .topk import AUTO_ETA_BETA, ContinualTopK

__all__ = ["HistogramTopK", "TopKChoice", "choose_top_k"]


class HistogramTopK:
    """The top-k of KnownBase's noisy histogram at every step (post-processing).

    Runs :class:`~dpstream.KnownDomainHistogram` (so every event must hold at
    most ``max_items`` = Delta0 items) and releases, at each step, the k
    items with the largest noisy counts, largest first, with those counts.

    Not yet: the list is released only from the first step at which the
    largest noisy count exceeds z sigma_t, where sigma_t is the noise
    standard deviation of a count at t (tau sqrt(|I_t| L_r) for the tree,
    sigma ||row_t(B)|| for a BLT counter: ``noise_std_at``) and z = Phi^-1(1 -
    beta/(d T)), beta = 0.05: while every count is within the noise, nothing
    is shown. If every count is 0, each noisy count exceeds z sigma_t with
    probability beta/(d T), so by a union bound over the d items and T steps
    a list is started on pure noise with probability at most beta. (The list
    is recomputed at every step, so once one count stands out the others
    follow as they grow; SparseGumb, whose list stays until a switch, waits
    for its k-th count instead.) Until then the release is empty with
    ``meta["status"] == "not yet"``. The decision is a function of the
    released noisy counts only.

    Privacy: exactly KnownBase's (the KnownBase lemma: Delta0/(2 tau^2)-zCDP,
    exact Gaussian curve for (epsilon, delta)); selecting, ordering and
    waiting are post-processing of its output.

    Args:
        domain, horizon, max_items, key: as for ``KnownDomainHistogram``.
        k: how many items to release, 1 <= k <= d.
        **histogram: every other keyword of ``KnownDomainHistogram`` (base,
            budget, stream, ...).

    Example:
        >>> import dpstream as dps
        >>> m = HistogramTopK(["a", "b", "c"], 100, k=1, max_items=2,
        ...                   key=dps.NoiseKey.generate(), rho=1.0)
        >>> rel = m.step_batch([["a"]] * 100)  # 100 events: "a" stands out from the noise
        >>> rel.items, rel.meta["status"]
        (['a'], 'selected')
    """

    mechanism_name = "KnownBase top-k"

    def __init__(self, domain: Iterable[Hashable], horizon: int, *, k: int, max_items: int,
                 key: NoiseKey, **histogram: Any) -> None:
        self.histogram = KnownDomainHistogram(domain, horizon, max_items=max_items, key=key,
                                              **histogram)
        d = len(self.histogram.domain_index)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if not 1 <= k <= d:
            raise ValueError(f"k must be in 1..{d} (the domain size), got {k}")
        self.k = int(k)
        h = self.histogram
        self.horizon, self.base, self.levels = h.horizon, h.base, h.levels
        self.counter, self.strategy, self.sigma = h.counter, h.strategy, h.sigma
        self.max_items, self.tau, self.budget = h.max_items, h.tau, h.budget
        self.privacy, self.theorem = h.privacy, h.theorem
        self.start_z = float(-ndtri(AUTO_ETA_BETA / (d * self.horizon)))
        self.started = False

    @property
    def t(self) -> int:
        return self.histogram.t

    @property
    def domain(self) -> list[Hashable]:
        """The domain items, in release order (a new list: changing it changes nothing)."""
        return self.histogram.domain

    @property
    def domain_index(self) -> ItemTable:
        """The domain's item table (see ``KnownDomainHistogram.domain_index``). Shared,
        not copied: never add to it."""
        return self.histogram.domain_index

    @property
    def noise_std_worst(self) -> float:
        return self.histogram.noise_std_worst

    def noise_std_at(self, t: int) -> float:
        return self.histogram.noise_std_at(t)

    def start_threshold_at(self, t: int) -> float:
        """z sigma_t: the largest noisy count must exceed it before the first list."""
        return self.start_z * self.noise_std_at(t)

    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release the top-k."""
        return self._top(self.histogram.step(event))

    def step_batch(self, events: Iterable[Iterable[Hashable]]) -> Release:
        """Take all the events of the next time step and release the top-k."""
        return self._top(self.histogram.step_batch(events))

    def release(self, t: int, counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray
                ) -> Release:
        """Aggregate mode, as ``KnownDomainHistogram.release``."""
        return self._top(self.histogram.release(t, counts))

    def _top(self, rel: Release) -> Release:
        values = rel.values
        d = values.shape[0]
        idx = np.argpartition(-values, self.k - 1)[: self.k] if self.k < d else np.arange(d)
        idx = idx[np.lexsort((idx, -values[idx]))]
        if not self.started and values[idx[0]] > self.start_threshold_at(rel.t):
            self.started = True
        if not self.started:
            return Release(t=rel.t, items=[], values=np.zeros(0), meta={"status": "not yet"})
        return Release(t=rel.t, items=take_items(rel.items, idx), values=values[idx],
                       meta={"status": "selected"})

    def __repr__(self) -> str:
        return (f"HistogramTopK(k={self.k}, d={len(self.histogram.domain_index)}, "
                f"T={self.horizon}, max_items={self.max_items}, tau={self.tau:.4g}, t={self.t})")


@dataclass(frozen=True)
class TopKChoice:
    """The outcome of :func:`choose_top_k`.

    Attributes:
        mechanism: the chosen mechanism (built, ready to run).
        name: ``"KnownBase top-k"`` or ``"SparseGumb"``.
        errors: candidate name -> noise standard deviation of a released count
            at the worst step (the number compared).
        reason: the comparison in words.
    """

    mechanism: Any
    name: str
    errors: dict[str, float]
    reason: str


def choose_top_k(domain: Iterable[Hashable], horizon: int, *, k: int, switches: int,
                 max_items: int, key: NoiseKey, **kwargs: Any) -> TopKChoice:
    """Build SparseGumb and KnownBase's top-k for the same budget; keep the more accurate.

    Both are built with the same budget keywords; the comparison uses public
    parameters only (never the data): the standard deviation of a released
    count at the worst step with each one's counter (``noise_std_worst``: for
    the tree tau_2 sqrt(max_t |I_t| L_r) for SparseGumb's counters and tau
    sqrt(max_t |I_t| L_r) for KnownBase; for BLT counters sigma max_t
    ||row_t(B)||, sigma from tau_2 and tau respectively). The same noise also
    orders the items of KnownBase's list; SparseGumb's selections add Gumbel
    noise of scale tau_2/2 and can only change the list when an outside item
    leads by eta_t. KnownBase's list needs every event to hold at most
    ``max_items`` items (more are refused, or truncated with ``on_invalid``);
    its undercount of truncated events is not part of the comparison (it
    depends on the data).

    Args:
        domain, horizon, k, switches, key: as for both mechanisms.
        max_items: Delta0 for KnownBase.
        **kwargs: the budget and other keywords; the ones only SparseGumb takes
            (``eta``, ``wait``) go to it alone.
    """
    domain = list(domain)
    sparse_only = {"eta", "wait"}
    sparse = ContinualTopK(domain, horizon, k=k, switches=switches, key=key, **kwargs)
    hist = HistogramTopK(domain, horizon, k=k, max_items=max_items, key=key,
                         **{n: v for n, v in kwargs.items() if n not in sparse_only})
    errors = {"SparseGumb": sparse.noise_std_worst, "KnownBase top-k": hist.noise_std_worst}
    name = min(errors, key=lambda n: (errors[n], n != "KnownBase top-k"))
    other = "SparseGumb" if name == "KnownBase top-k" else "KnownBase top-k"
    ratio = errors[other] / errors[name] if errors[name] > 0 else math.inf
    reason = (
        f"{name}: its released counts have noise std {errors[name]:.4g} at the worst step, "
        f"{ratio:.3g} times smaller than {other}'s {errors[other]:.4g} for this budget "
        f"(KnownBase needs at most {max_items} items per event and pays for the whole "
        f"histogram once; SparseGumb pays for {switches + 1} selections of {k} items and "
        "the sparse vector, whatever the event size)"
    )
    chosen = hist if name == "KnownBase top-k" else sparse
    return TopKChoice(mechanism=chosen, name=name, errors=errors, reason=reason)
