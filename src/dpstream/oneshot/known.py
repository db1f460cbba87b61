"""One-shot mechanisms over a known domain: KnownGauss and KnownGumb (paper, appendix).

Layer 4 of dpstream. Each function releases one noisy histogram (or top-k list)
of one histogram; the continual mechanisms apply them to tree cells
(``MetaHistogram``) or to prefix histograms (``ContinualTopK``).

Noise addressing: the one-shot convention of :mod:`dpstream.oneshot.common`
(Gumbel selection at draw 0, Gaussian counts at draw 1; ``purpose`` has no
default, because two calls with one key and purpose share their noise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from .. import privacy
from .._checks import check_int
from ..noise import NoiseKey, NoiseSource, PreparedItems
from .common import (
    GAUSSIAN_DRAW,
    GUMBEL_DRAW,
    OneShotRelease,
    check_tau,
    histogram_arrays,
)

__all__ = [
    "GAUSSIAN_DRAW",
    "GUMBEL_DRAW",
    "OneShotRelease",
    "gaussian_histogram",
    "gaussian_histogram_privacy",
    "gumbel_top_k",
    "gumbel_top_k_privacy",
]

KNOWN_GAUSS_THEOREM = "lem:kGaussPriv (Bun and Steinke 2016): Delta0/(2 tau^2)-zCDP"
KNOWN_GUMB_THEOREM = "KnownGumb theorem after algo:kGumb (Cesar and Rogers 2021): k/tau^2-zCDP"
KNOWN_GUMB_SELECT_THEOREM = "KnownGumb selection only, as in the SparseGumb proof: k/(2 tau^2)-zCDP"


# --------------------------------------------------------------------------- input


def _check_k(k: object, n: int) -> int:
    k = check_int("k", k, 1)
    if k > n:
        raise ValueError(f"k must be at most the number of items ({n}), got {k}")
    return int(k)


# --------------------------------------------------------------------------- kernels
# The kernels take a NoiseSource and prepared items, so that a continual mechanism
# that calls them many times hashes its domain once. The public functions below are
# thin wrappers; both give bit-identical results for the same (key, purpose, items).


def gaussian_kernel(
    source: NoiseSource, prepared: PreparedItems, counts: np.ndarray, tau: float
) -> np.ndarray:
    """KnownGauss on prepared items: counts + N(0, tau^2) at (0, 0, GAUSSIAN_DRAW)."""
    if len(prepared) == 0:
        return np.zeros(0)
    return counts + source.gaussian(prepared, 0, 0, GAUSSIAN_DRAW, scale=tau)


#: Items whose Gumbel scores are drawn at once by :func:`gumbel_select_kernel`; a larger
#: domain is scored a chunk at a time, keeping the k best of each.
SELECT_CHUNK = 1 << 16


def gumbel_select_kernel(
    source: NoiseSource,
    prepared: PreparedItems | Callable[[int, int], PreparedItems],
    counts: np.ndarray,
    k: int,
    tau: float,
) -> np.ndarray:
    """The selection of KnownGumb: positions of the k largest counts + Gumbel(tau/2).

    Returns the positions in selection order (largest noisy count first).
    Adding Gumbel(b) noise and keeping the k largest is the exponential
    mechanism with weights exp(h_u / b) applied k times without replacement
    (peeling); with b = tau/2 that is exp(2 h_u / tau).

    ``prepared``: the items' prepared ids, or a function ``(lo, hi) ->`` those of
    items lo..hi-1. Over more than :data:`SELECT_CHUNK` items the scores are
    drawn a chunk at a time and only each chunk's k best are kept (the k largest
    of the domain are among them, as the Spark engine merges its batches), so
    the memory a selection needs does not grow with the domain beyond the
    counts; each item's score is the same value either way.
    """
    part = prepared if callable(prepared) else (lambda lo, hi: prepared.subset(slice(lo, hi)))
    n = counts.shape[0]
    if n <= SELECT_CHUNK:
        scores = counts + source.gumbel(part(0, n), 0, 0, GUMBEL_DRAW, scale=tau / 2.0)
        idx = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        # descending score; ties (probability ~0) broken by position, for determinism
        return idx[np.lexsort((idx, -scores[idx]))]
    best = np.zeros(0, dtype=np.int64)
    best_scores = np.zeros(0)
    for lo in range(0, n, SELECT_CHUNK):
        hi = min(n, lo + SELECT_CHUNK)
        scores = counts[lo:hi] + source.gumbel(part(lo, hi), 0, 0, GUMBEL_DRAW, scale=tau / 2.0)
        top = np.argpartition(-scores, k - 1)[:k] if k < hi - lo else np.arange(hi - lo)
        best = np.concatenate([best, top + lo])
        best_scores = np.concatenate([best_scores, scores[top]])
        if best.size > k:
            keep = np.lexsort((best, -best_scores))[:k]
            best, best_scores = best[keep], best_scores[keep]
    return best[np.lexsort((best, -best_scores))]


# --------------------------------------------------------------------------- public


def gaussian_histogram(
    counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    *,
    tau: float,
    key: NoiseKey,
    purpose: str,
    items: Sequence[Hashable] | None = None,
) -> OneShotRelease:
    """KnownGauss (``algo:kGauss``): every count of a known domain plus N(0, tau^2).

    Privacy (``lem:kGaussPriv``, Bun and Steinke 2016): if neighbouring
    histograms differ by at most 1 in at most Delta0 counts, this is the
    Gaussian mechanism with l2 sensitivity sqrt(Delta0), hence
    Delta0 / (2 tau^2)-zCDP; see :func:`gaussian_histogram_privacy`.

    Args:
        counts: the histogram over the whole domain: a Mapping ``item -> count``
            (items with count 0 included: the domain is its keys), or an array
            of counts aligned with ``items``.
        tau: the noise standard deviation.
        key: the secret key.
        purpose: names this use of the key (required: reusing a key and purpose
            on another histogram reuses the noise).
        items: the domain, when ``counts`` is an array.

    Returns:
        A :class:`OneShotRelease` with every item, in input order.

    Example:
        >>> import dpstream as dps
        >>> from dpstream.oneshot.known import gaussian_histogram
        >>> out = gaussian_histogram({"a": 3, "b": 0}, tau=1.0, key=dps.NoiseKey.generate(),
        ...                          purpose="doc/example")
        >>> sorted(out.counts)
        ['a', 'b']
    """
    tau = check_tau(tau)
    item_list, arr = histogram_arrays(counts, items)
    source = NoiseSource(key, purpose)
    values = gaussian_kernel(source, source.prepare(item_list), arr, tau)
    return OneShotRelease(items=tuple(item_list), values=values)


def gumbel_top_k(
    counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
    *,
    k: int,
    tau: float,
    key: NoiseKey,
    purpose: str,
    items: Sequence[Hashable] | None = None,
    with_counts: bool = True,
) -> OneShotRelease:
    """KnownGumb_k (``algo:kGumb``): top-k by Gumbel noise, then fresh Gaussian counts.

    Adds Gumbel noise of scale tau/2 to every count, keeps the k items with the
    largest noisy counts (in that order) and, if ``with_counts``, releases
    their *true* counts plus fresh N(0, tau^2) noise. With k = 1 the selected
    item is u with probability proportional to exp(2 h_u / tau): the
    exponential mechanism.

    Privacy (KnownGumb theorem, Cesar and Rogers 2021): with unrestricted l0
    sensitivity (one event may touch every count, each by at most 1, all in
    the same direction), each of the k peeling steps is (2/tau)-bounded-range,
    hence 1/(2 tau^2)-zCDP, and each Gaussian count is 1/(2 tau^2)-zCDP: in
    total k / tau^2-zCDP, or k / (2 tau^2)-zCDP for the selection alone
    (``with_counts=False``, as SparseGumb uses it). See
    :func:`gumbel_top_k_privacy`.

    Args:
        counts: the histogram over the whole domain (Mapping, or array with ``items``).
        k: how many items to select, 1 <= k <= number of items.
        tau: the noise scale.
        key: the secret key.
        purpose: names this use of the key (required, see the module docstring).
        items: the domain, when ``counts`` is an array.
        with_counts: release noisy counts of the selected items (else ``values`` is None).

    Returns:
        A :class:`OneShotRelease` with the k selected items, largest noisy count first.
    """
    tau = check_tau(tau)
    if not isinstance(with_counts, bool):
        raise TypeError(f"with_counts must be a bool, got {with_counts!r}")
    item_list, arr = histogram_arrays(counts, items)
    k = _check_k(k, len(item_list))
    source = NoiseSource(key, purpose)
    prepared = source.prepare(item_list)
    sel = gumbel_select_kernel(source, prepared, arr, k, tau)
    values = None
    if with_counts:
        values = gaussian_kernel(source, prepared.subset(sel), arr[sel], tau)
    return OneShotRelease(items=tuple(item_list[i] for i in sel), values=values)


def gaussian_histogram_privacy(
    *,
    tau: float,
    max_items: int = 1,
    delta: float = privacy.DEFAULT_DELTA,
    max_count_per_item: int = 1,
    unit: str = "event",
) -> privacy.PrivacyGuarantee:
    """The guarantee of :func:`gaussian_histogram` (``lem:kGaussPriv``).

    Delta0 / (2 tau^2)-zCDP with Delta0 = ``max_items``; it is exactly a
    Gaussian mechanism with sensitivity/noise ratio sqrt(Delta0)/tau, so the
    (epsilon, delta) claim uses the exact Gaussian curve. When one privacy
    unit (``unit="user"``, say) changes each of at most ``max_items`` counts
    by up to ``max_count_per_item`` = Linf, the sensitivity is sqrt(Delta0)
    Linf: Delta0 Linf^2 / (2 tau^2)-zCDP.
    """
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)):
        raise TypeError(f"max_items must be an int, got {type(max_items).__name__}")
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    linf = check_int("max_count_per_item", max_count_per_item, 1)
    return dataclasses.replace(
        privacy.guarantee_for_tau(
            tau=check_tau(tau),
            a=max_items * linf * linf / 2.0,
            delta=delta,
            mechanism="KnownGauss",
            theorem=KNOWN_GAUSS_THEOREM,
            gaussian_exact=True,
        ),
        unit=unit,
    )


def gumbel_top_k_privacy(
    *,
    tau: float,
    k: int,
    with_counts: bool = True,
    delta: float = privacy.DEFAULT_DELTA,
    max_count_per_item: int = 1,
    unit: str = "event",
) -> privacy.PrivacyGuarantee:
    """The guarantee of :func:`gumbel_top_k`: k/tau^2-zCDP, or k/(2 tau^2) for the selection.

    When one privacy unit changes every count by up to ``max_count_per_item``
    = Linf (all in the same direction) the l_inf sensitivity is Linf: each
    peeling step is (2 Linf / tau)-bounded-range and each count's Gaussian
    has ratio Linf / tau, so both costs grow by Linf^2.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    linf = check_int("max_count_per_item", max_count_per_item, 1)
    a = (float(k) if with_counts else k / 2.0) * linf * linf
    return dataclasses.replace(
        privacy.guarantee_for_tau(
            tau=check_tau(tau),
            a=a,
            delta=delta,
            mechanism="KnownGumb",
            theorem=KNOWN_GUMB_THEOREM if with_counts else KNOWN_GUMB_SELECT_THEOREM,
        ),
        unit=unit,
    )
