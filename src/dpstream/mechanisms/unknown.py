"""UnkBase (Algorithm ``algo:UnkBase``): a running histogram over an unknown domain.

Layer 5 of dpstream. KnownBase's counter noise (the r-ary tree, or a BLT
factorization), added only to the items that have appeared so far, and an item
is shown only while its noisy count clears a threshold, so that an item one
event brought in is almost never revealed (``lem:badOutcomes``). The threshold
is sized from the exact noise variance of each step, m_t
(:func:`step_threshold`, or the BLT's own variance), never above the paper's
single m_delta (``eq:threshold``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import privacy
from ..bounding import resolve_user_bounds
from ..factorization import BLTStrategy
from ..minimize import bounded_minimum
from ..noise import DEFAULT_NOISE_VERSION, NoiseKey, NoiseSource, check_noise_version
from ..special import ndtr, ndtri
from ..tree import digits, max_cells, num_levels, optimal_base
from . import narrow_counts
from .base import (
    EventLimit,
    Release,
    TruncationStats,
    check_key,
    check_max_items,
    check_next_step,
    check_stream_name,
    mapping_counts,
)
from .blt_noise import BLTNoise, join_purpose
from .columns import (
    EventColumns,
    aggregate_items,
    aggregate_raw,
    as_events,
    check_grows,
    distinct_in_events,
    event_positions,
    fast_events,
    is_frame,
)
from .counters import (
    CounterStd,
    blt_purpose,
    blt_sigma,
    for_all_t,
    resolve_counter,
    stream_horizon,
    tree_base,
    tree_levels,
)
from .item_table import ItemTable
from .known import tree_purpose
from .params import UnknownParams
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
    "PrivacySplit",
    "step_delta_divisor",
    "UnknownDomainHistogram",
    "calibrate_unknown_domain",
    "discovery_threshold",
    "step_threshold",
]

_THEOREM = (
    "UnkBase theorem (after lem:badOutcomes): "
    "(eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')"
)
_THEOREM_UNBOUNDED = (
    "UnkBase with BLT counters and no planned end (theorem after lem:badOutcomes with the "
    "threshold's delta/(t(t+1)) at step t, summing to at most delta over all t): "
    "(eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')"
)
_THEOREM_BLT = (
    "UnkBase with BLT counters (theorem after lem:badOutcomes, Gaussian mechanism on C x; "
    "late items' states drawn exactly): (eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')"
)


def discovery_threshold(
    *, tau: float, horizon: int, base: int, threshold_delta: float, alone: int = 1
) -> float:
    """m_delta = tau L_r sqrt(r - 1) Phi^-1(1 - delta/T) + 1 (``eq:threshold``).

    ``alone``: the largest count one privacy unit alone can give an item, the
    ``1`` above (one event); Linf = ``max_count_per_item`` for a user, whose
    item nobody else has has a count of at most Linf at every t, so the same
    bound holds with m - Linf in place of m - 1.

    The noise of an item's count at any t is N(0, |I_t| L_r tau^2) with
    |I_t| <= (r - 1) L_r, so an item whose true count is 1 is above m_delta at
    a given t with probability at most delta/T, and at some t <= T with
    probability at most delta (union bound, ``lem:badOutcomes``). It is the
    largest of the per-step thresholds :func:`step_threshold` (taken at
    |I_t| = (r - 1) L_r); UnkBase uses those.

    Phi^-1(1 - x) is computed as -Phi^-1(x) (accurate for tiny x), and the
    result is moved up until the forward bound T (1 - Phi((m - 1) / s)) <= delta
    holds in floating point, so the threshold is never too low.
    """
    levels = num_levels(horizon, base)
    return _threshold(tau * levels * math.sqrt(base - 1), tau, horizon, threshold_delta, alone)


def step_threshold(
    cells: int, *, tau: float, horizon: int, base: int, threshold_delta: float, alone: int = 1
) -> float:
    """m_t = 1 + sqrt(|I_t| L_r) tau Phi^-1(1 - delta/T), for |I_t| = ``cells``.

    The threshold of a step whose count sums ``cells`` tree cells (``cells =
    |I_t(r)|``, the base-r digit sum of t). Why it is as private as m_delta:
    the noise of a count at t is exactly N(0, |I_t| L_r tau^2) (|I_t| cells of
    N(0, L_r tau^2) each), so an item whose true count is 1 is above m_t at t
    with probability exactly 1 - Phi(Phi^-1(1 - delta/T)) = delta/T, the same
    per-step bound ``lem:badOutcomes`` uses for m_delta; the union bound over
    the T steps and the at most Delta0 items one event brings in gives the
    same Delta0 delta. m_t <= m_delta because |I_t| <= (r - 1) L_r, and m_t is
    a function of t and the public parameters only.

    Floating point: as :func:`discovery_threshold`, the result is moved up
    until T (1 - Phi((m - 1) / s_t)) <= delta holds, s_t = sqrt(|I_t| L_r) tau.
    ``alone``: as for :func:`discovery_threshold` (Linf at user level).
    """
    if isinstance(cells, bool) or not isinstance(cells, (int, np.integer)) or cells < 1:
        raise ValueError(f"cells must be an int >= 1 (|I_t|), got {cells!r}")
    levels = num_levels(horizon, base)
    return _threshold(tau * math.sqrt(int(cells) * levels), tau, horizon, threshold_delta, alone)


def step_delta_divisor(t: int, horizon: int, unbounded: bool) -> int:
    """N_t, the threshold's per-step share of delta being delta / N_t.

    T at every step for a stream of horizon T (the union bound over T steps);
    t (t + 1) for a stream with no planned end, so that the shares sum to
    delta sum_(t >= 1) 1/(t (t + 1)) = delta (1 - 1/(n + 1)) < delta over any number
    n of steps (telescoping: 1/(t (t + 1)) = 1/t - 1/(t + 1)). In floating point
    each step's bound holds to a relative 2^-52 (N_t rounded to a float past
    2^53, the product of the check), and the slack delta/(n + 1) >= delta 2^-40 of
    the sum (n <= 2^40 steps) covers that many times over.
    """
    return t * (t + 1) if unbounded else horizon


def _threshold(
    scale: float, tau: float, horizon: int, threshold_delta: float, alone: float = 1.0
) -> float:
    """alone + scale Phi^-1(1 - delta/T), nudged up until
    T (1 - Phi((m - alone)/scale)) <= delta."""
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be positive and finite, got tau={tau!r}")
    if not 0.0 < threshold_delta < 1.0:
        raise ValueError(f"threshold_delta must be in (0, 1), got {threshold_delta!r}")
    alone = float(alone)
    m = scale * float(-ndtri(threshold_delta / horizon)) + alone
    for _ in range(200):
        if horizon * float(ndtr(-(m - alone) / scale)) <= threshold_delta:
            return m
        m = math.nextafter(m, math.inf) if m != 0 else 5e-324
    raise ArithmeticError("threshold: could not make m conservative")  # pragma: no cover


@dataclass(frozen=True)
class PrivacySplit:
    """How UnkBase's total delta is split (reported as ``UnknownDomainHistogram.privacy_split``).

    Attributes:
        threshold_delta: delta of the threshold m_delta (``eq:threshold``).
        threshold_part: Delta0 * threshold_delta, the probability of a bad
            outcome (``lem:badOutcomes``); equals ``privacy.rho_delta``.
        conversion_delta: delta' of the Gaussian part's (epsilon, delta') claim.
        chosen_by: ``"min-threshold"`` (split searched to minimise m_delta for
            the target (epsilon, delta)), ``"user"`` (threshold_delta given
            with epsilon/delta) or ``"reporting"`` (rho= or tau=: the noise is
            fixed and delta' is :data:`dpstream.privacy.DEFAULT_DELTA`, only to
            state an (epsilon, delta) claim).
    """

    threshold_delta: float
    threshold_part: float
    conversion_delta: float
    chosen_by: str


def _split(delta: float, max_items: int, threshold_delta: float) -> tuple[float, float]:
    """(Delta0 * threshold_delta, delta') with their sum <= delta in floating point.

    delta' is computed exactly as ``privacy.guarantee_for_tau`` computes the
    conversion's delta, so the epsilon it reports is the one calibrated here.
    """
    part = max_items * threshold_delta
    rest = delta - part
    if rest + part > delta:
        rest = math.nextafter(rest, 0.0)
    return part, rest


def calibrate_unknown_domain(
    *,
    epsilon: float,
    delta: float,
    max_items: int,
    horizon: int,
    base: int,
    max_count: int = 1,
) -> tuple[float, float]:
    """The (tau, threshold_delta) meeting (epsilon, delta) with the smallest threshold m_delta.

    The guarantee (theorem after ``lem:badOutcomes``, with the exact Gaussian
    curve, see :class:`UnknownDomainHistogram`) is (eps_G(sqrt(Delta0)/tau,
    delta'), Delta0 delta_thr + delta'). tau depends on delta' only, and falls
    as delta' grows, so "smallest tau" alone would push delta_thr to 0 and
    m_delta to infinity: no item would ever be shown. What the split trades is
    discovery against accuracy, and the number that measures discovery is
    m_delta itself: an item whose count is m_delta is shown with probability
    1/2, one with count m_delta + c tau with probability >= Phi(c/(sqrt(r-1)
    L_r)). So we choose the split that minimises m_delta = tau(delta') L_r
    sqrt(r - 1) Phi^-1(1 - delta_thr/T) + 1, a 1-D search over the fraction
    f = Delta0 delta_thr / delta (coarse grid in logit(f), then bounded Brent).

    User level: ``max_items`` is L0 (the items one user may bring in, each a
    bad outcome of probability delta_thr) and ``max_count`` Linf, so the
    Gaussian part has ratio sqrt(L0) Linf / tau (m_delta's offset Linf does
    not move the minimiser).

    The counter's worst-step std (here the tree's, L_r sqrt(r - 1) tau) only
    multiplies m_delta - 1 by a constant, so the split that minimises it is
    the same for every counter: UnkBase with a BLT counter uses this one, for
    the tree of the optimal base.

    Returns:
        (tau, threshold_delta).
    """
    a = max_items * max_count * max_count / 2.0
    levels = num_levels(horizon, base)
    scale = levels * math.sqrt(base - 1)

    def tau_for(thr: float) -> float:
        _, rest = _split(delta, max_items, thr)
        return privacy.calibrate_tau(a=a, epsilon=epsilon, delta=rest, gaussian_exact=True)

    def thr_for(x: float) -> float:
        f = 1.0 / (1.0 + math.exp(-x))
        return f * delta / max_items

    def objective(x: float) -> float:
        thr = thr_for(x)
        return tau_for(thr) * scale * float(-ndtri(thr / horizon))

    grid = np.linspace(-18.0, 18.0, 37)
    values = [objective(float(x)) for x in grid]
    i = int(np.argmin(values))
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, grid.size - 1)])
    best_x, best_v = float(grid[i]), values[i]
    if hi > lo:
        res = bounded_minimum(objective, lo, hi, xatol=1e-4)
        if res.fun < best_v:
            best_x = res.x
    thr = thr_for(best_x)
    return tau_for(thr), thr


class UnknownDomainHistogram(CounterStd, OneStream):
    """UnkBase (``algo:UnkBase``): a running histogram when nobody can list the items.

    Every item that has appeared gets KnownBase's tree noise: each cell of the
    r-ary tree over 1..T carries N(0, L_r tau^2) per item, and the noisy count
    of u at t is h_t^u plus the noise of the cells I_t(r). An item is released
    at t only if that noisy count exceeds the threshold of step t

        m_t = 1 + sqrt(|I_t| L_r) tau Phi^-1(1 - delta/T)     (``.threshold_at(t)``)

    (delta is ``threshold_delta``), where the paper uses one threshold for all
    steps, m_delta = 1 + tau L_r sqrt(r - 1) Phi^-1(1 - delta/T)
    (``eq:threshold``, ``.threshold``). m_t uses the exact noise variance of a
    count at t, |I_t| L_r tau^2, where m_delta uses its largest value (r - 1)
    L_r^2 tau^2, so m_t <= m_delta at every t, and an item is shown earlier:
    at T = 1,000 and r = 4, m_t - 1 is on average 0.69 of m_delta - 1, and
    0.26 of it at the steps whose count sums one cell.

    Why m_t is as private as m_delta (``lem:badOutcomes`` with m_t): a bad
    outcome shows an item a whose count is 1 in one neighbouring stream and 0
    in the other. At step t its noisy count is 1 + Z_t, Z_t ~ N(0, |I_t| L_r
    tau^2) exactly (a sum of |I_t| independent cells of variance L_r tau^2),
    so P(1 + Z_t > m_t) = 1 - Phi(Phi^-1(1 - delta/T)) = delta/T, the per-step
    bound the lemma proves for m_delta (there: at most delta/T). The union
    bound over t <= T and over the at most Delta0 such items of one event is
    unchanged: bad outcomes have probability at most Delta0 delta. Which
    threshold applies at t depends on t only, never on the data, so the
    good-outcome part of the proof (``lem:equalAMechanism``) is untouched.
    (:func:`step_threshold` rounds m_t up so the bound holds in floating
    point.)

    An item's noise is
    addressed by (item, cell) under the stream's tree purpose
    (:func:`~dpstream.mechanisms.known.tree_purpose`), so an item that reappears
    gets the same realisations (the paper's "add the same realization"), with
    no table of drawn values: a discovered item's count is exactly KnownBase's
    over the whole (unknown) domain with that realisation. The purpose names
    the open domain, so it is never the noise of a
    :class:`~dpstream.KnownDomainHistogram` run under the same key and stream
    (one with another domain filters other items). With ``remember=True`` an
    item, once shown, is shown at every later step with its current noisy
    count (the variant the paper says has the same privacy: which items were
    ever shown is a function of the earlier releases, so remembering is
    post-processing, and the bad event of ``lem:badOutcomes`` is unchanged).

    Privacy (theorem after ``lem:badOutcomes``): if every event holds at most
    Delta0 = ``max_items`` items, UnkBase is (eps(Delta0/(2 tau^2), delta'),
    Delta0 delta + delta')-DP for every delta' > 0. ``.privacy.rho_delta`` is
    the Delta0 * threshold_delta part, ``.privacy_split`` the whole split.

    Why the exact Gaussian curve for eps (rather than the paper's eq:epsilon):
    the proof applies ``lem:meta`` to the mechanism A of ``lem:equalAMechanism``,
    which releases the padded, relabelled partial-sum table of a fixed pair of
    neighbouring streams plus post-processing. In each of the at most L_r cells
    that differ, GaussMech_dbar (``algo:GaussMechBase``) adds N(0, L_r tau^2) to
    two vectors that differ in at most Delta0 coordinates by at most 1
    (``lem:GaussMechBase``); all other cells are equal. So A is one Gaussian
    mechanism whose l2 sensitivity is sqrt(Delta0 L_r) and noise std sqrt(L_r)
    tau: the ratio is mu = sqrt(Delta0)/tau, and its exact (eps, delta')
    profile is Balle and Wang's, at least as tight as the zCDP conversion.
    Bad outcomes add Delta0 delta (``lem:badOutcomes``).

    User-level privacy (``max_items_per_user=`` L0, ``max_count_per_item=``
    Linf): events are ``(user, items)`` pairs, each user kept within the bounds
    over the whole stream (first come, first kept). The proof above goes
    through with the user as the unit: the good outcomes are one Gaussian
    mechanism whose sensitivity is sqrt(L0) Linf sqrt(L_r) (the worst placement
    of a user's contributions puts all Linf at one step, lemma in
    :mod:`dpstream.bounding`), ratio mu = sqrt(L0) Linf / tau; a bad outcome
    shows an item only the removed user has, whose true count is at most Linf
    at every t, so the threshold is m_delta with Linf in place of the + 1, and
    there are at most L0 such items: (eps_G(sqrt(L0) Linf / tau, delta'),
    L0 delta + delta')-DP per user (``.privacy.unit == "user"``).

    Calibration: ``epsilon=, delta=`` splits delta into Delta0 threshold_delta
    + delta' so that m_delta is smallest (see :func:`calibrate_unknown_domain`
    for why m_delta and not tau is the quantity to minimise; every m_t - 1 is
    m_delta - 1 times the same factor sqrt(|I_t| / ((r - 1) L_r)), so the split
    that minimises m_delta minimises every m_t), unless
    ``threshold_delta=`` is also given. With ``rho=`` or ``tau=`` the noise is
    set by the Gaussian part alone and ``threshold_delta=`` is required.

    Utility (Sec. 7, Utility Analysis, with m_t): an item with h_t^u = m_t + c
    tau is shown at t with probability Phi(c / sqrt(|I_t| L_r)); the paper's
    bound Phi(c / (sqrt(r-1) L_r)) for h_t^u = m_delta + c tau still holds (it
    only gets better). A shown item's count has the tree noise of KnownBase,
    variance |I_t(r)| L_r tau^2.

    With a BLT counter (``counter="blt"``, the default for T >= 2; see
    :mod:`~dpstream.mechanisms.counters`) each item's noise is KnownBase's BLT
    noise y_t = (B z)_t, keyed draws z ~ N(0, sigma^2), sigma = tau max_j
    ||C e_j||, and the threshold of step t is m_t = 1 + sigma ||row_t(B)||
    Phi^-1(1 - delta/T) (the std of a count at t, which grows with t; m_delta
    is m_T). An item first seen at step s does not replay steps 1..s-1: its
    noise state at s - 1 (k buffers and the running sum) is drawn from its
    exact Gaussian law (:meth:`~dpstream.mechanisms.blt_noise.BLTNoise.join_items`,
    keyed under the purpose ``noise_purpose + "/join"``), then it steps on
    like every item, so a step costs O(k^2) per new item at any t.

    Why this is as private as the tree version (the argument, for the BLT):

    1. Reference mechanism R: UnkBase with every item of the universe holding
       BLT noise from step 1 (the paper's padded ``algo:UnkBaseTop``, whose
       dummy slots hold noise from the start and hand it to new items). Its
       proof goes through with the partial-sum table replaced by the strategy
       vectors C x^u + z^u of all items (``lem:equalAMechanism``): one event
       changes x^u by 1 at one step for at most Delta0 items, so on good
       outcomes R is the Gaussian mechanism on C x with l2 sensitivity
       sqrt(Delta0) max_j ||C e_j|| and noise sigma, ratio sqrt(Delta0)/tau,
       followed by post-processing (B, the thresholds, dropping items that
       have not appeared, ``lem:dummy2``). A bad outcome shows an item whose
       count is 1 in one stream and 0 in the other; its noisy count at t is
       1 + y_t, y_t ~ N(0, sigma^2 ||row_t(B)||^2) exactly, above m_t with
       probability exactly delta/T; the union bound over t and the Delta0
       items gives Delta0 delta (``lem:badOutcomes``). So R is
       (eps_G(sqrt(Delta0)/tau, delta'), Delta0 delta + delta')-DP.
    2. This mechanism has R's output distribution on every stream. What it
       publishes at t is a function of the true counts and of the noise
       values y_t^u of the items seen by t, and only at steps t >= s_u (an
       item that has not appeared is never shown, in R either). Items' noises
       are independent (distinct PRF inputs). For one item, the state at
       s - 1 is all a step carries over (each step adds an independent fresh
       z_t), so (y_s, y_(s+1), ...) is a fixed function of that state and of
       z_s, z_(s+1), ...; in R the state is N(0, sigma^2 Sigma_(s-1))
       (:func:`~dpstream.factorization.state_factor`) and independent of the
       later z; here it is drawn from that same law, independently of them.
       So every item's released noise sequence has R's joint law, for each s,
       and s is a function of the stream alone: the two mechanisms' outputs
       are equal in distribution stream by stream, and the guarantee of R is
       this mechanism's. (The paper's closing step, "whether this noise was
       drawn earlier for that cell or at the time that it is actually used,
       both give the same distribution", with the state as the noise drawn
       when used.)

    A joined item's noise depends on its join step: event mode and aggregate
    mode agree bit for bit when both first see it at the same step (the
    command line releases every step), but an aggregate release that skips the
    steps where an item first appeared joins it later, with other, equally
    distributed, noise. User level: as above with sqrt(L0) Linf and Linf in
    place of sqrt(Delta0) and 1 (the sensitivity lemma holds for any BLT).

    A :class:`~dpstream.Release` lists the shown items largest noisy count
    first (``meta["threshold"]`` is m_t). The mechanism's ``items_seen``,
    ``counts`` and ``len()`` are the true, non-private state.

    Cost: a step costs O(items seen so far) vectorised (the incremental tree
    sums of :class:`~dpstream.mechanisms.tree_noise.TreeNoise`) plus a Python
    loop over the step's events; an item that has not appeared costs nothing.

    No planned end (``horizon=None``): the BLT of
    :func:`~dpstream.factorization.blt_unbounded` (sigma from its sensitivity
    over every horizon), and the threshold of step t spends delta/(t (t + 1))
    instead of delta/T, m_t = alone + sigma ||row_t(B)|| Phi^-1(1 - delta/(t (t +
    1))): the bad outcomes of all steps t >= 1 together have probability at most
    Delta0 delta sum_t 1/(t (t + 1)) <= Delta0 delta, whatever the stream's length
    (:func:`step_delta_divisor`). The split of delta is the one that minimises
    the threshold near t = 10^6 (as for T = 2^40). ``.threshold`` is m_t at t =
    2^40, the step limit.

    Args:
        horizon: T; ``None``: a stream with no planned end (above; at most 2^40
            steps; ``.privacy.for_all_t``).
        max_items: Delta0, the most distinct items one event may hold.
        key: the secret key.
        counter: ``"tree"``, ``"blt"``, a :class:`~dpstream.factorization.BLTStrategy`,
            or ``None``: the tree if ``base`` is given, else the counter with the
            smaller worst-case variance for T (BLT for every T >= 2), as for
            :class:`~dpstream.KnownDomainHistogram`.
        base: the tree base r; ``None`` picks r* = argmin (r-1) L_r^2.
        remember: keep showing an item once it has cleared the threshold.
        rho: Gaussian part's zCDP target (needs ``threshold_delta``), or
        epsilon, delta: the total (epsilon, delta) target, or
        tau: the noise scale itself (needs ``threshold_delta``).
        threshold_delta: delta of the threshold (the paper's delta in
            ``eq:threshold``); optional with epsilon/delta.
        stream: separates this stream's noise from other streams under the key
            (an unknown domain's noise purpose is its own: it never shares noise
            with KnownBase on the same stream).
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).
        max_items_per_user, max_count_per_item: L0 and Linf, for user-level
            privacy (both or neither; ``max_items`` is then optional).
        on_invalid: ``"error"`` (default): an event over ``max_items`` items
            raises; ``"truncate"``: keep ``max_items`` of its items chosen by a
            keyed PRF (:class:`~dpstream.mechanisms.base.EventLimit`;
            ``.truncation`` counts what was dropped, not private).

    Example:
        >>> import dpstream as dps
        >>> key = dps.NoiseKey.generate()
        >>> u = dps.UnknownDomainHistogram(100, max_items=2, key=key, epsilon=1.0, delta=1e-6)
        >>> rel = u.step(["#dp", "#stats"])
        >>> len(rel)  # one event is (almost surely) below the threshold
        0
    """

    mechanism_name = "UnkBase"
    accepts_columns = True  # step_batch takes EventColumns
    theorem = _THEOREM
    theorem_user = (
        "UnkBase per user (theorem after lem:badOutcomes, dpstream.bounding lemma): "
        "(eps_G(sqrt(L0) Linf/tau, delta'), L0 delta + delta'), threshold + Linf"
    )

    def __init__(
        self,
        horizon: int | None,
        *,
        max_items: int | None = None,
        key: NoiseKey,
        counter: str | BLTStrategy | None = None,
        base: int | None = None,
        remember: bool = False,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        threshold_delta: float | None = None,
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
        if self.strategy is not None:
            self.theorem = _THEOREM_BLT
        if self.unbounded:
            self.theorem = _THEOREM_UNBOUNDED
        self.user_bounds = resolve_user_bounds(max_items_per_user, max_count_per_item)
        self.max_items = (
            None if max_items is None and self.user_bounds else check_max_items(max_items)
        )
        # one unit: Delta0 items, 1 each (an event), or L0 items, Linf each (a user)
        self._unit = unit_bound(self.max_items, self.user_bounds)
        self.stream = check_stream_name(stream)
        check_key(key)
        self._limit = EventLimit(
            on_invalid,
            key=key,
            stream=self.stream,
            max_items=self.max_items,
            user_level=self.user_bounds is not None,
        )
        if not isinstance(remember, bool):
            raise TypeError(f"remember must be a bool, got {remember!r}")
        self.remember = remember
        self.levels: int | None = (
            None if self.strategy is not None else num_levels(self.horizon, tree_base(self.base))
        )
        self._coef = self._unit.coefficient
        self.budget = privacy.resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=tau)
        if threshold_delta is not None:
            if isinstance(threshold_delta, bool) or not isinstance(
                threshold_delta, (int, float, np.integer, np.floating)
            ):
                raise TypeError(f"threshold_delta must be a real number, got {threshold_delta!r}")
            if not 0.0 < threshold_delta < 1.0:
                raise ValueError(f"threshold_delta must be in (0, 1), got {threshold_delta!r}")
            threshold_delta = float(threshold_delta)
        self.tau, self.threshold_delta, self.privacy_split, total = self._calibrate(threshold_delta)
        self.privacy = privacy.guarantee_for_tau(
            tau=self.tau,
            a=self._coef,
            delta=total,
            rho_delta=self.privacy_split.threshold_part,
            gaussian_exact=True,
            mechanism=self.mechanism_name,
            theorem=self.theorem,
            target_epsilon=self.budget.epsilon,
        )
        self.privacy = user_guarantee(self.privacy, self.user_bounds, self.theorem_user)
        self.privacy = for_all_t(self.privacy, self.unbounded)
        self._thresholds: dict[int, float] = {}  # |I_t| -> m_t (tree)
        self.key = key
        self._users = None if self.user_bounds is None else UserLevel(self.user_bounds, key)
        users = None if self.user_bounds is None else self.user_bounds.tag()
        self._noise: TreeNoise | BLTNoise
        if self.strategy is None:
            base, levels = tree_base(self.base), tree_levels(self.levels)
            self.threshold = discovery_threshold(
                tau=self.tau,
                horizon=self.horizon,
                base=base,
                threshold_delta=self.threshold_delta,
                alone=self._unit.per_item,
            )
            cell_std = math.sqrt(levels) * self.tau
            self.sigma = cell_std
            self.tree_purpose: str | None = tree_purpose(
                self.stream,
                horizon=self.horizon,
                base=base,
                cell_std=cell_std,
                max_items=self.max_items,
                domain="open",
                users=users,
                noise_version=self.noise_version,
            )
            self.noise_purpose = self.tree_purpose
            self._source = NoiseSource(key, self.noise_purpose)
            self._noise = TreeNoise(self._source, self.horizon, base, cell_std)
        else:
            self.sigma = blt_sigma(self.tau, self.strategy)
            self.threshold = _threshold(
                self.noise_std_worst,
                self.tau,
                step_delta_divisor(self.horizon, self.horizon, self.unbounded),
                self.threshold_delta,
                self._unit.per_item,
            )
            self.tree_purpose = None
            self.noise_purpose = blt_purpose(
                self.stream,
                strategy=self.strategy,
                sigma=self.sigma,
                max_items=self.max_items,
                domain="open",
                users=users,
                noise_version=self.noise_version,
            )
            self._source = NoiseSource(key, self.noise_purpose)
            self._join_source = NoiseSource(key, join_purpose(self.noise_purpose))
            self._noise = BLTNoise(
                self._source, self.strategy, self.sigma, join_source=self._join_source
            )
        self._last_threshold = (0, 0.0)  # (t, m_t) of the last BLT step asked for
        cap = 16
        self._table = ItemTable()  # the items seen, numbered in order of addition
        # int32 while every count fits (4 bytes per item less), int64 from then on
        self._counts = np.zeros(cap, dtype=np.int32)
        self._max_count = 0
        self._shown = np.zeros(cap, dtype=bool)
        self._n = 0
        self.t = 0

    @classmethod
    def from_params(
        cls, params: UnknownParams, *, key: NoiseKey, on_invalid: str = "error"
    ) -> UnknownDomainHistogram:
        """The histogram of ``params`` (the value :class:`dpstream.spark.SparkUnknownBase`
        is built from too)."""
        return cls(params.horizon, key=key, on_invalid=on_invalid, **params.kwargs())

    def _calibrate(self, threshold_delta: float | None) -> tuple[float, float, PrivacySplit, float]:
        """(tau, threshold_delta, split, total delta of the claim)."""
        b = self.budget
        d0 = self._unit.items  # Delta0, or L0 per user: the items one unit may bring in
        if b.kind in ("rho", "tau"):
            if threshold_delta is None:
                raise ValueError(
                    f"threshold_delta= is required with {b.kind}= (the delta of the threshold "
                    "m_delta; UnkBase pays max_items * threshold_delta in delta)"
                )
            part = d0 * threshold_delta
            if part + privacy.DEFAULT_DELTA >= 1.0:
                raise ValueError(
                    f"max_items * threshold_delta must be < 1 - {privacy.DEFAULT_DELTA}, got "
                    f"{d0} * {threshold_delta!r}"
                )
            tau = b.calibrate(self._coef, gaussian_exact=True)
            total = part + privacy.DEFAULT_DELTA
            _, rest = _split(total, d0, threshold_delta)
            split = PrivacySplit(threshold_delta, part, rest, "reporting")
            return tau, threshold_delta, split, total
        assert b.epsilon is not None and b.delta is not None
        if threshold_delta is not None:
            part, rest = _split(b.delta, d0, threshold_delta)
            if not rest > 0.0:
                raise ValueError(
                    f"max_items * threshold_delta must be < delta, got {d0} * "
                    f"{threshold_delta!r} >= {b.delta!r}"
                )
            tau = privacy.calibrate_tau(
                a=self._coef, epsilon=b.epsilon, delta=rest, gaussian_exact=True
            )
            return tau, threshold_delta, PrivacySplit(threshold_delta, part, rest, "user"), b.delta
        # the split is the same for every counter (see calibrate_unknown_domain): a BLT
        # takes the default tree's, so both counters get the same tau at one budget
        base = self.base if self.base is not None else optimal_base(self.horizon)
        tau, thr = calibrate_unknown_domain(
            epsilon=b.epsilon,
            delta=b.delta,
            max_items=d0,
            horizon=self.horizon,
            base=base,
            max_count=self._unit.per_item,
        )
        part, rest = _split(b.delta, d0, thr)
        return tau, thr, PrivacySplit(thr, part, rest, "min-threshold"), b.delta

    # -- facts ---------------------------------------------------------------
    def threshold_at(self, t: int) -> float:
        """m_t, the threshold of step t: :func:`step_threshold` with |I_t| = digit sum
        of t (tree); with a BLT, alone + sigma ||row_t(B)|| Phi^-1(1 - delta/N_t), N_t
        = T (or t (t + 1) with no planned end, :func:`step_delta_divisor`), rounded
        up as :func:`step_threshold` does (an item whose count is ``alone`` is above it
        with probability at most delta/N_t: its noise at t is exactly N(0, sigma^2
        ||row_t(B)||^2))."""
        if self.strategy is None:
            return self.threshold_for_cells(sum(digits(t, tree_base(self.base))))
        last_t, m = self._last_threshold
        if last_t != t:
            m = _threshold(
                self.noise_std_at(t),
                self.tau,
                step_delta_divisor(t, self.horizon, self.unbounded),
                self.threshold_delta,
                self._unit.per_item,
            )
            self._last_threshold = (t, m)
        return m

    def threshold_for_cells(self, cells: int) -> float:
        """m_t for a step whose count sums ``cells`` = |I_t| tree cells (tree counter)."""
        if self.strategy is not None:
            raise ValueError("a BLT counter has no tree cells: use threshold_at(t)")
        m = self._thresholds.get(cells)
        if m is None:
            m = step_threshold(
                cells,
                tau=self.tau,
                horizon=self.horizon,
                base=tree_base(self.base),
                threshold_delta=self.threshold_delta,
                alone=self._unit.per_item,
            )
            self._thresholds[cells] = m
        return m

    @property
    def truncation(self) -> TruncationStats:
        """What ``on_invalid="truncate"`` dropped so far (event mode). Not private."""
        return self._limit.stats

    @property
    def items_seen(self) -> list[Hashable]:
        """The items that have appeared, in the order they were added. Not private."""
        return self._table.to_list()

    @property
    def counts(self) -> np.ndarray:
        """True running counts aligned with ``items_seen``. Not private."""
        return self._counts[: self._n].astype(np.int64)

    def __len__(self) -> int:
        """The number of items seen so far. Not private."""
        return self._n

    # -- event mode ----------------------------------------------------------
    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release."""
        return self.step_batch([event])

    @one_at_a_time
    def step_batch(self, events: Iterable[Iterable[Hashable]] | EventColumns) -> Release:
        """Take all the events of the next time step (possibly none) and release.

        ``events``: a list of events, or the step as
        :class:`~dpstream.mechanisms.columns.EventColumns` (the same release).
        Every event is checked (at most ``max_items`` distinct items, items of
        type str, int or bytes) before anything changes. With user bounds each
        event is a ``(user, items)`` pair, bounded per user first.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        batch, pending = bound_user_events(self._users, events, self.max_items)
        batch = as_events(batch)
        fast = None if self._limit.truncating else event_positions(batch, self._table, self._n)
        if fast is not None:  # (truncation: the per-event path below)
            cols, offsets, new_items = fast
            keep, distinct = distinct_in_events(cols, offsets)
            if not (
                self.max_items is not None and distinct.size and distinct.max() > self.max_items
            ):
                if keep is not None:
                    cols = cols[keep]
                n = self._n
                total = np.bincount(cols, minlength=n + len(new_items))
                new_counts = total[n:]
                if new_counts.size and not new_counts.all():  # listed, but in no event
                    seen = np.flatnonzero(new_counts)
                    new_items, new_counts = [new_items[i] for i in seen], new_counts[seen]
                counts = np.add(self._counts[:n], total[:n], out=total[:n])  # int64
                # the largest count: the last step's, or that of an item this step counted
                top = max(
                    self._max_count,
                    int(new_counts.max(initial=0)),
                    int(counts[cols[cols < n]].max(initial=0)),
                )
                rel = self._commit(t, counts, new_items, new_counts, top)
                self._limit.commit(TruncationStats(events=len(offsets) - 1))
                commit_user_events(self._users, pending)
                return rel
        batch = fast_events(batch)  # the per-event path raises the precise error
        checked, delta = self._limit.events(batch, t=t)
        flat = [item for items in checked for item in items]
        cols = self._table.lookup(flat)
        new: dict[Hashable, int] = {}
        for i in np.flatnonzero(cols < 0).tolist():
            new[flat[i]] = new.get(flat[i], 0) + 1
        counts = self._counts[: self._n] + np.bincount(cols[cols >= 0], minlength=self._n)
        rel = self._commit(t, counts, list(new), np.fromiter(new.values(), np.int64, len(new)))
        self._limit.commit(delta)
        commit_user_events(self._users, pending)
        return rel

    # -- aggregate mode --------------------------------------------------------
    @one_at_a_time
    def release(
        self,
        t: int,
        counts: Mapping[Hashable, int] | Any,
        values: Sequence[int] | np.ndarray | None = None,
        *,
        bounded: bool = False,
    ) -> Release:
        """Release at step t from the true prefix histogram h_t (the practical setting).
        With user bounds, ``bounded=True`` says the counts are of contributions already
        bounded per user (first come, first kept): they carry no user ids to bound here.

        ``counts`` is a Mapping item -> count; or give the items and their counts
        as two arrays, ``release(t, items, counts)``, or a pandas/polars/Arrow
        frame with columns ``item`` and ``count`` (no Python loop over items).
        Fastest: items as a list that starts with :attr:`items_seen`, in its
        order (then those need no lookup), new items after them.

        ``counts`` maps every item seen in steps 1..t to its count (an item
        seen before and missing here counts 0, which is an error since counts
        only grow; an item with count 0 has not appeared and is ignored).
        Gives the same releases as event mode for the same key, bit for bit;
        steps may be skipped (the noise of a jump is computed from scratch and
        equals the incremental one; with a BLT counter an item first seen at a
        skipped step joins at ``t``, with other, equally distributed, noise than
        event mode gives it: release a stream on one schedule only). With
        ``remember=True`` an item stays shown
        once it has cleared the threshold at a *released* step, so skipping
        steps can change which items are shown later (still private: it is a
        function of the releases made).
        """
        check_bounded(self._users, bounded)  # user level: counts bounded beforehand
        check_next_step(t, self.t, self.horizon)
        table = self._table
        n = self._n
        if values is not None or is_frame(counts):
            items, vals = aggregate_raw(counts, values)
            head = self._aligned(items)  # items_seen first, in order: no lookup for them
            keys, _ = aggregate_items(items[head:] if head else items, vals[head:])
            tail = table.lookup(keys)
            new_at = np.flatnonzero(tail < 0)
            if (
                tail[tail >= 0].size
                and (head or np.count_nonzero(np.bincount(tail[tail >= 0], minlength=n) > 1))
            ) or len(set(keys[i] for i in new_at.tolist())) != new_at.size:
                raise ValueError("items must be distinct (one count per item)")
        else:
            keys, vals = mapping_counts(counts)
            head = 0
            tail = table.lookup(keys)
        # head: the items seen, in order (position i is item i); tail: looked up
        tail_vals = vals[head:]
        if head == n:
            arr = vals[:n]
        else:
            seen = tail >= 0
            arr = np.zeros(n, dtype=np.int64)
            arr[tail[seen]] = tail_vals[seen]
        check_grows(arr, self._counts[:n])
        fresh = np.flatnonzero((tail < 0) & (tail_vals > 0))
        new_items = [keys[i] for i in fresh.tolist()]
        return self._commit(int(t), arr, new_items, tail_vals[fresh])

    def _aligned(self, items: Any) -> int:
        """``len(items_seen)`` if ``items`` starts with the items seen, in their order
        (then they need no lookup), else 0 (see :meth:`ItemTable.starts`)."""
        n = self._n
        if not n or len(items) < n:
            return 0
        if isinstance(items, np.ndarray) and items.dtype != object and items.dtype.kind != "U":
            return 0
        return n if self._table.starts(items) else 0

    # -- shared ------------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        cap = self._counts.size
        if n <= cap:
            return
        cap = max(n, cap + cap // 4)  # a quarter more: at most 25% idle (2 bytes an item)
        counts = np.zeros(cap, dtype=self._counts.dtype)
        counts[: self._n] = self._counts[: self._n]
        shown = np.zeros(cap, dtype=bool)
        shown[: self._n] = self._shown[: self._n]
        self._counts, self._shown = counts, shown

    def _commit(
        self,
        t: int,
        counts: np.ndarray,
        new_items: list[Hashable],
        new_counts: np.ndarray,
        top: int | None = None,
    ) -> Release:
        """Step to t with the int64 counts of the items seen and those of the new
        items; ``top`` is the largest of all (None: taken from them)."""
        # Everything that can fail runs before the first mutation.
        if top is None:
            top = max(self._max_count, int(counts.max(initial=0)), int(new_counts.max(initial=0)))
        blt = self.strategy is not None
        if new_items:
            ids = self._source.item_ids(new_items)  # TypeError for a bad item type
            order = np.lexsort((ids[:, 1], ids[:, 0]))
            prepared = self._source.prepare_ids(ids[order])
            if blt:
                joined = self._join_source.prepare_ids(ids[order])
        n_old = self._n
        n = n_old + len(new_items)
        # counts + noise, added while each chunk's noise is in cache: the items seen
        # as the tree steps, the new ones once their noise is computed from scratch
        values = np.empty(n)
        noise = self._noise
        if isinstance(noise, BLTNoise):
            values[:n_old] = noise.advance(t, counts)
        else:
            noise.advance(t, counts, out=values[:n_old])
        # int32 while the largest count fits; widened before a value that needs it
        self._counts = narrow_counts.widened(self._counts, top)
        self._max_count = top
        self._counts[:n_old] = counts
        if new_items:
            self._reserve(n)
            ordered = [new_items[i] for i in order.tolist()]
            self._table.extend(ordered)
            self._counts[n_old:n] = new_counts[order]
            self._shown[n_old:n] = False
            if isinstance(noise, BLTNoise):  # state at t - 1 drawn from its law, then step t
                noise.join_items(prepared, joined)
                np.add(self._counts[n_old:n], noise.noise()[n_old:], out=values[n_old:])
            else:
                noise.add_items(prepared)
                noise.plus_noise(self._counts[n_old:n], start=n_old, out=values[n_old:])
            self._n = n
        self.t = t
        threshold = self.threshold_at(t)
        above = values > threshold
        if self.remember:
            self._shown[:n] |= above
            above = self._shown[:n]
        idx = np.flatnonzero(above)
        # Largest noisy count first (post-processing of the paper's set output);
        # exact ties by the keyed item id. Never in order of first appearance,
        # which is a function of the data that one event can change.
        vals = values[idx]
        if np.unique(vals).size == vals.size:
            idx = idx[np.argsort(-vals, kind="stable")]
        else:  # ties: the keyed ids (hashed here, rarely, rather than kept per item)
            ids = self._source.item_ids(self._table.take(idx))
            idx = idx[np.lexsort((ids[:, 1], ids[:, 0], -vals))]
        return Release(
            t=t,
            items=self._table.take(idx),
            values=values[idx],
            # Only data-independent facts: the number of items seen is NOT private
            # (one event can add max_items of them), so it is never part of a release.
            meta={"threshold": threshold, "remember": self.remember},
        )

    def __repr__(self) -> str:
        shape = f"r={self.base}" if self.strategy is None else f"blt={self.strategy.buffers}"
        return (
            f"UnknownDomainHistogram(T={self.horizon}, {shape}, max_items={self.max_items}, "
            f"tau={self.tau:.4g}, threshold={self.threshold:.4g}, t={self.t})"
        )


def threshold_profile(mech: Any) -> dict[str, float]:
    """UnkBase's per-step threshold m_t: at the worst step and at the median step t <= T,
    with the noise std of a count at those steps (public parameters only: what ``plan``
    prints and what top-k compares)."""
    horizon = int(mech.horizon)
    if mech.strategy is not None:  # BLT: m_t grows with t
        typical = (horizon - 1) // 2 + 1
        return {
            "threshold_worst": float(mech.threshold_at(horizon)),
            "threshold_typical": float(mech.threshold_at(typical)),
            "std_worst": float(mech.noise_std_at(horizon)),
            "std_typical": float(mech.noise_std_at(typical)),
        }
    base = int(mech.base)
    ts: Sequence[int]
    if horizon <= 200_001:
        ts = range(1, horizon + 1)
    else:
        ts = sorted({1 + (horizon - 1) * i // 200_000 for i in range(200_001)})
    cells = sorted(sum(digits(t, base)) for t in ts)
    typical = cells[(len(cells) - 1) // 2]
    worst = max_cells(horizon, base)
    levels = num_levels(horizon, base)
    return {
        "threshold_worst": float(mech.threshold_for_cells(worst)),
        "threshold_typical": float(mech.threshold_for_cells(typical)),
        "std_worst": float(mech.tau) * math.sqrt(worst * levels),
        "std_typical": float(mech.tau) * math.sqrt(typical * levels),
    }
