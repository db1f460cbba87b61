"""One-shot histograms over an unknown domain: UnkGauss and UnkGumb.

Layer 4 of dpstream. Both mechanisms see only the top kbar + 1 counts of a
histogram whose labels nobody listed in advance (hashtags, queries), and show an
item only when its noisy value beats a noisy, data-dependent threshold built
from the (kbar + 1)-th count. That threshold is what keeps an item that one
event brought in from being revealed, except with a small probability delta.

* :func:`unknown_domain_gaussian` is UnkGauss (``algo:UnkGauss``, Section 6 of
  the paper); guarantee :func:`unknown_domain_gaussian_privacy`
  (``thm:main_UnkGauss``).
* :func:`unknown_domain_gumbel` is UnkGumb (``algo:uGumb``, Durfee and Rogers
  2019); guarantee :func:`unknown_domain_gumbel_privacy`
  (``thm:UnkGumbelPrivacy``).

Noise addresses (the one-shot convention of dpstream): a call builds
``NoiseSource(key, purpose)``; the per-item draws are at (level 0, index 0) with
draw 0 for the Gumbel selection and draw 1 for the Gaussian counts, and the
threshold's noise is ``source.scalar(..., 0, 0, draw)`` with the same draw
numbers. So one (key, purpose) gives one realisation; MetaAlgo passes a purpose
per tree cell.

Ties among counts are broken by a fixed order of the universe (the keyed 128-bit
item identifiers), never by the data, as the sensitivity lemmas of the paper
(``lem:v_ell0``) assume when they say an item whose count did not change
cannot move up the ranking.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from .. import privacy
from .._checks import check_int
from ..noise import NoiseKey, NoiseSource
from ..special import ndtri
from .common import (
    GAUSSIAN_DRAW,
    GUMBEL_DRAW,
    OneShotRelease,
    UnknownDomainResult,
    check_tau,
    histogram_arrays,
)

__all__ = [
    "GAUSSIAN_DRAW",
    "GUMBEL_DRAW",
    "UnknownDomainResult",
    "unknown_domain_gaussian",
    "unknown_domain_gaussian_privacy",
    "unknown_domain_gumbel",
    "unknown_domain_gumbel_privacy",
]

# --------------------------------------------------------------------------- checks


def _check_delta(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {name}={value!r}")
    return float(value)


def _top(
    items: list[Hashable], counts: np.ndarray, m: int, source: NoiseSource
) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the top-m counts in rank order, and their keyed item ids.

    Rank: count descending, ties by the keyed item identifier (a fixed total
    order of the universe). Only the items that can be in the top m are hashed.
    """
    n = counts.size
    if n > m:
        cut = np.partition(counts, n - m)[n - m]  # the m-th largest count
        above = np.flatnonzero(counts > cut)
        ties = np.flatnonzero(counts == cut)
        need = m - above.size
        if ties.size > need:
            tie_ids = source.item_ids([items[i] for i in ties])
            ties = ties[np.lexsort((tie_ids[:, 1], tie_ids[:, 0]))[:need]]
        cand = np.concatenate([above, ties])
    else:
        cand = np.arange(n)
    ids = source.item_ids([items[i] for i in cand])
    order = np.lexsort((ids[:, 1], ids[:, 0], -counts[cand]))
    return cand[order], ids[order]


def _candidates(
    items: list[Hashable], counts: np.ndarray, kbar: int, source: NoiseSource
) -> tuple[np.ndarray, np.ndarray, int]:
    """The kbar candidates of an unknown-domain one-shot: the positions of the top kbar
    counts in rank order (:func:`_top`) and their keyed ids, and h_(kbar+1), the next
    count in that order (0 when there are no more items)."""
    ranked, ids = _top(items, counts, kbar + 1, source)
    h_next = int(counts[ranked[kbar]]) if ranked.size > kbar else 0
    return ranked[:kbar], ids[:kbar], h_next


def _result(
    items: list[Hashable], pos: np.ndarray, values: np.ndarray, hit: bool
) -> UnknownDomainResult:
    values = np.array(values, dtype=np.float64)
    values.flags.writeable = False
    return OneShotRelease(items=tuple(items[i] for i in pos), values=values, hit_threshold=hit)


# --------------------------------------------------------------------------- UnkGauss


def unknown_domain_gaussian(
    counts: Mapping[Hashable, int] | tuple[Sequence[Hashable], Sequence[int]],
    *,
    kbar: int,
    tau: float,
    delta: float,
    key: NoiseKey,
    purpose: str,
) -> UnknownDomainResult:
    """UnkGauss_kbar (``algo:UnkGauss``): Gaussian counts above a noisy threshold.

    Only the top kbar + 1 counts are used. With h_(1) >= ... >= h_(kbar+1) the
    sorted counts (h_(kbar+1) = 0 if there are at most kbar items), every item
    among the top kbar with a positive count gets v_u = h_u + N(0, tau^2); the
    threshold is v_bot = h_(kbar+1) + 1 + sqrt(2) tau Phi^-1(1 - delta) +
    N(0, tau^2); the items with v_u > v_bot are returned, largest first, with
    their noisy counts v_u.

    ``lem:delta_bound``: an item whose count is at most h_(kbar+1) + 1 is
    returned with probability at most delta (v_u - v_bot is Gaussian with
    variance 2 tau^2). Privacy (``thm:main_UnkGauss``): for histograms of l0
    sensitivity Delta0 and l_inf sensitivity 1, (eps(Delta0/(2 tau^2), delta'),
    Delta0 delta + delta')-DP for every delta' > 0; see
    :func:`unknown_domain_gaussian_privacy`.

    Args:
        counts: the histogram, a Mapping item -> count (ints >= 0), or a pair
            (items, counts) of parallel sequences. Items are str, int or bytes.
        kbar: the cut-off: the mechanism reads the top kbar + 1 counts.
        tau: the noise scale (standard deviation of each Gaussian).
        delta: the threshold's delta, in (0, 1).
        key: the secret key.
        purpose: separates this call's noise from every other use of the key;
            two releases must not share a purpose.

    Returns:
        An :class:`UnknownDomainResult` (``hit_threshold`` is always True).

    Example:
        >>> import dpstream as dps
        >>> from dpstream.oneshot.unknown import unknown_domain_gaussian
        >>> key = dps.NoiseKey.generate()
        >>> res = unknown_domain_gaussian({"a": 1000, "b": 3}, kbar=5, tau=1.0,
        ...                               delta=1e-6, key=key, purpose="demo")
        >>> res.items
        ('a',)
    """
    kbar = check_int("kbar", kbar, 1)
    tau = check_tau(tau)
    delta = _check_delta("delta", delta)
    items, h = histogram_arrays(counts)
    source = NoiseSource(key, purpose)
    top, top_ids, h_next = _candidates(items, h, kbar, source)
    positive = h[top] > 0
    top, top_ids = top[positive], top_ids[positive]
    v_bot = (
        h_next
        + 1
        + math.sqrt(2.0) * tau * float(-ndtri(delta))
        + source.scalar("gaussian", 0, 0, GAUSSIAN_DRAW, scale=tau)
    )
    if top.size == 0:
        return _result(items, top, np.zeros(0), True)
    v = h[top] + source.gaussian(source.prepare_ids(top_ids), 0, 0, GAUSSIAN_DRAW, scale=tau)
    keep = np.flatnonzero(v > v_bot)
    keep = keep[np.argsort(-v[keep], kind="stable")]
    return _result(items, top[keep], v[keep], True)


def unknown_domain_gaussian_privacy(
    *,
    tau: float,
    delta: float,
    max_items: int,
    delta_prime: float,
    gaussian_exact: bool = True,
) -> privacy.PrivacyGuarantee:
    """The guarantee of UnkGauss (``thm:main_UnkGauss``).

    (eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')-DP, with Delta0 =
    ``max_items``: ``rho_delta`` = Delta0 delta (bad outcomes, ``lem:gauss_del``),
    ``delta`` of the claim = Delta0 delta + delta'.

    Why the exact Gaussian curve is valid (``gaussian_exact=True``, the
    default): the proof goes through ``lem:meta`` with the mechanism
    A = post-processing of GaussMechBot (``algo:GaussMech``). For a fixed pair
    of neighbours, GaussMechBot adds N(0, tau^2) to two relabelled vectors
    v^(0), v^(1) that differ in at most Delta0 coordinates, each by at most 1
    (``lem:v_ellinfty``, ``lem:v_ell0``), so their l2 distance is at most
    sqrt(Delta0): A is a Gaussian mechanism with ratio mu = sqrt(Delta0)/tau,
    whose exact (eps, delta') curve is Balle and Wang's. The paper states the
    weaker zCDP conversion eq:epsilon; ``gaussian_exact=False`` gives the
    CKS20 conversion of Delta0/(2 tau^2)-zCDP instead (never looser than the
    paper's).

    Args:
        tau: noise scale of the call.
        delta: the threshold's delta given to the call.
        max_items: Delta0, the l0 sensitivity of the histograms.
        delta_prime: the delta' of the conversion, > 0.
        gaussian_exact: exact Gaussian curve (default) or CKS20.
    """
    tau = check_tau(tau)
    delta = _check_delta("delta", delta)
    max_items = check_int("max_items", max_items, 1)
    delta_prime = _check_delta("delta_prime", delta_prime)
    rho_delta = max_items * delta
    total = rho_delta + delta_prime
    if total >= 1.0:
        raise ValueError(
            f"max_items * delta + delta_prime must be < 1, got {max_items} * {delta!r} + "
            f"{delta_prime!r}"
        )
    return privacy.guarantee_for_tau(
        tau=tau,
        a=max_items / 2.0,
        delta=total,
        rho_delta=rho_delta,
        gaussian_exact=gaussian_exact,
        mechanism="UnkGauss",
        theorem="thm:main_UnkGauss: (eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')",
    )


# --------------------------------------------------------------------------- UnkGumb


def unknown_domain_gumbel(
    counts: Mapping[Hashable, int] | tuple[Sequence[Hashable], Sequence[int]],
    *,
    k: int,
    kbar: int,
    tau: float,
    delta: float,
    key: NoiseKey,
    purpose: str,
) -> UnknownDomainResult:
    """UnkGumb_{k,kbar} (``algo:uGumb``, Durfee and Rogers 2019): Gumbel top-k above a threshold.

    With h_(1) >= ... >= h_(kbar+1) the top kbar + 1 counts (h_(kbar+1) = 0
    when there are at most kbar items): h_bot = h_(kbar+1) + 1 + tau ln(1/delta)
    and v_bot = h_bot + Gumbel(tau/2); every item among the top kbar with
    h_u > h_(kbar+1) gets v_u = h_u + Gumbel(tau/2). Sorted by v, the items
    before v_bot are taken; if there are fewer than k of them they are returned
    with the threshold marker (``hit_threshold=True``), else the first k are
    (``hit_threshold=False``). Each returned item carries a fresh Gaussian count
    h_u + N(0, tau^2), as in the paper.

    Privacy (``thm:UnkGumbelPrivacy``): for l_inf sensitivity 1 (any l0),
    (k/tau^2 + (2/tau) sqrt(k ln(1/delta')), kbar delta + delta')-DP for every
    delta' > 0; see :func:`unknown_domain_gumbel_privacy`.

    Args:
        counts: Mapping item -> count, or a pair (items, counts).
        k: the most items returned, 1 <= k <= kbar + 1.
        kbar: the cut-off (top kbar + 1 counts are read).
        tau: the noise scale (Gumbel scale tau/2, Gaussian std tau).
        delta: the threshold's delta, in (0, 1).
        key: the secret key.
        purpose: separates this call's noise from every other use of the key.

    Returns:
        An :class:`UnknownDomainResult` in selection order.
    """
    kbar = check_int("kbar", kbar, 1)
    k = check_int("k", k, 1)
    if k > kbar + 1:
        raise ValueError(f"k must be <= kbar + 1, got k={k} and kbar={kbar}")
    tau = check_tau(tau)
    delta = _check_delta("delta", delta)
    items, h = histogram_arrays(counts)
    source = NoiseSource(key, purpose)
    top, top_ids, h_next = _candidates(items, h, kbar, source)
    eligible = h[top] > h_next
    top, top_ids = top[eligible], top_ids[eligible]
    v_bot = (
        h_next
        + 1
        + tau * math.log(1.0 / delta)
        + source.scalar("gumbel", 0, 0, GUMBEL_DRAW, scale=tau / 2.0)
    )
    if top.size == 0:
        return _result(items, top, np.zeros(0), True)
    prepared = source.prepare_ids(top_ids)
    g = h[top] + source.gumbel(prepared, 0, 0, GUMBEL_DRAW, scale=tau / 2.0)
    order = np.argsort(-g, kind="stable")
    n_above = int(np.count_nonzero(g > v_bot))
    hit = n_above < k
    sel = order[: min(n_above, k)]
    if sel.size == 0:
        return _result(items, sel, np.zeros(0), hit)
    z = source.gaussian(prepared.subset(sel), 0, 0, GAUSSIAN_DRAW, scale=tau)
    return _result(items, top[sel], h[top[sel]] + z, hit)


def unknown_domain_gumbel_privacy(
    *,
    tau: float,
    delta: float,
    k: int,
    kbar: int,
    delta_prime: float,
) -> privacy.PrivacyGuarantee:
    """The guarantee of UnkGumb (``thm:UnkGumbelPrivacy``, Durfee and Rogers 2019).

    (k/tau^2 + (2/tau) sqrt(k ln(1/delta')), kbar delta + delta')-DP: the
    epsilon is the paper's eq:epsilon conversion of rho = k/tau^2, reported as
    ``conversion="bun-steinke"`` exactly as the theorem states it (we do not
    claim a tighter conversion for a proof we do not reproduce here).
    """
    tau = check_tau(tau)
    delta = _check_delta("delta", delta)
    k = check_int("k", k, 1)
    kbar = check_int("kbar", kbar, 1)
    delta_prime = _check_delta("delta_prime", delta_prime)
    rho_delta = kbar * delta
    total = rho_delta + delta_prime
    if total >= 1.0:
        raise ValueError(
            f"kbar * delta + delta_prime must be < 1, got {kbar} * {delta!r} + {delta_prime!r}"
        )
    conv = min(delta_prime, total - rho_delta)  # never more delta' than the total leaves
    rho = k / (tau * tau)
    return privacy.PrivacyGuarantee(
        rho=rho,
        rho_delta=rho_delta,
        epsilon=privacy.epsilon_bun_steinke(rho, conv),
        delta=total,
        conversion="bun-steinke",
        mechanism="UnkGumb",
        theorem="thm:UnkGumbelPrivacy: (k/tau^2 + (2/tau) sqrt(k ln(1/delta')), "
        "kbar delta + delta')",
    )
