"""SparseGumb (``algo:sparseGumb``): continual top-k over a known domain, any event size.

When one event may touch any number of items, a full running histogram needs
noise that grows with the domain size d. SparseGumb releases only k items:
it selects them with the exponential mechanism (KnownGumb without counts),
tracks their running counts with tree counters (BinMech), and uses the sparse
vector technique to notice when an item outside the selection has overtaken
the k-th noisy count by eta_t; then it re-selects, at most s times.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from ..bounding import resolve_user_bounds
from ..errors import InvalidEventError
from ..factorization import BLTStrategy
from ..noise import (
    DEFAULT_NOISE_VERSION,
    NoiseKey,
    NoiseSource,
    check_noise_version,
    versioned_purpose,
)
from ..oneshot.known import gumbel_select_kernel
from ..rootfind import brentq
from ..special import log_ndtr, ndtr
from ..tree import digits, num_levels, worst_case_variance_factor
from . import narrow_counts
from .base import (
    Release,
    check_horizon,
    check_in_domain,
    check_key,
    check_next_step,
    check_stream_name,
    check_top_k,
    config_tag,
    domain_counts,
    domain_items,
    normalise_event,
    resolve_privacy,
)
from .blt_noise import BLTNoise
from .columns import (
    EventColumns,
    as_events,
    domain_positions,
    fast_events,
    lookup_all,
)
from .counters import blt_sigma, resolve_counter, tree_base, tree_levels
from .item_table import ItemTable, domain_table
from .known import domain_tag
from .params import TopKParams
from .serial import OneStream, one_at_a_time
from .tree_noise import TreeNoise
from .users import UserLevel, bound_user_events, check_bounded, commit_user_events, user_guarantee

#: The longest horizon for which eta may be a function (evaluated at every step up front).
MAX_ETA_SCHEDULE = 10**6


def _eta_tag(eta: float | str | np.ndarray) -> float | str:
    """What the noise scope records of eta: the number, "auto", or a digest of a schedule."""
    if isinstance(eta, np.ndarray):
        return "schedule:" + hashlib.sha256(eta.tobytes()).hexdigest()
    return eta


__all__ = [
    "AUTO_ETA_BETA",
    "ContinualTopK",
    "default_switches",
    "noise_eta",
    "svt_noise_tail",
    "utility_eta",
]

#: default_switches allows one re-selection each time the stream grows this many times
SWITCH_GROWTH = 8


def default_switches(horizon: int) -> int:
    """SparseGumb's s when none is given: the smallest s with 8^s >= T (0 for T = 1).

    Why: every count a switch test compares grows with t, and a leader that
    has taken over stays ahead more and more surely, so the top-k of a real
    stream changes mostly early and ever more rarely; one re-selection per
    eightfold growth of the stream (T = 379 -> 3, T = 1,000 -> 4, T = 100,000
    -> 6) follows that, while every switch more costs noise: the counters'
    scale tau_2 and the switch test's tau_1 are sqrt(s + 1) tau. Measured on
    real streams (docs/utility.md): with s = 10 the first list of the Debian
    changelog words (T = 379, monthly) waits until t ~ 255, with s = 3 until
    t ~ 155-190, and recalls 9.1-9.3/10 of the top 10 over the second half
    instead of 5.5-7.1. It depends on T alone (public).
    Integer arithmetic, no logarithm.
    """
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"horizon must be an int >= 1, got {horizon!r}")
    s, reach = 0, 1
    while reach < horizon:
        s, reach = s + 1, reach * SWITCH_GROWTH
    return s


def utility_eta(
    *,
    tau: float,
    switches: int,
    domain_size: int,
    horizon: int,
    base: int,
    beta: float,
    alpha2: float | None = None,
) -> float:
    """eta from the SparseGumb utility analysis (``eq:eta``): alpha_2 + alpha_BM + alpha_AT.

    * alpha_BM = tau L_r sqrt(2 (s+1) (r-1) ln(6T/beta))  (eq. alpha'' of ``lem:SVTutility``):
      a bound on the error of every counter at every step;
    * alpha_AT = 8 tau sqrt(s) ln(6 d T / beta)  (eq. alpha'''): the sparse-vector accuracy;
    * alpha_2: how far the counts of the non-selected items may sit above the
      selected one without a switch (Assumption ``assumpt:utility``). The paper
      only fixes it up to a constant, alpha_2 = Theta(alpha_1) with alpha_1 =
      sqrt(s) tau ln(d/beta) (``lem:expMechUtility``); the default here is
      alpha_1 with sqrt(s+1) (the selection runs with tau_2 = sqrt(s+1) tau).

    A leader change is then detected, with probability >= 1 - beta per switch,
    once the new leader is alpha_3 ahead with alpha_3 - alpha_2 >=
    2 alpha_BM + 2 alpha_AT (``eq:alphaGap``).
    """
    if not (isinstance(tau, (int, float, np.integer, np.floating)) and 0 < tau < math.inf):
        raise ValueError(f"tau must be finite and > 0, got {tau!r}")
    if not (isinstance(beta, (float, np.floating)) and 0 < beta < 1):
        raise ValueError(f"beta must be a float in (0, 1), got {beta!r}")
    for name, value, low in (("switches", switches, 0), ("domain_size", domain_size, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    s = int(switches)
    levels = num_levels(horizon, base)
    alpha_bm = tau * levels * math.sqrt(2 * (s + 1) * (base - 1) * math.log(6 * horizon / beta))
    alpha_at = 8 * tau * math.sqrt(s) * math.log(6 * domain_size * horizon / beta)
    if alpha2 is None:
        alpha2 = math.sqrt(s + 1) * tau * math.log(domain_size / beta)
    return float(alpha2 + alpha_bm + alpha_at)


#: The automatic eta keeps the chance that one item tied with the threshold
#: triggers a test at any of the T steps at AUTO_ETA_BETA (per step: AUTO_ETA_BETA / T).
AUTO_ETA_BETA = 0.05


def _laplace_pair_tail(x: float, b1: float, b2: float) -> float:
    """P(L1 + L2 > x) for independent L1 ~ Lap(b1), L2 ~ Lap(b2), b1 > b2 > 0."""
    if x < 0:
        return 1.0 - _laplace_pair_tail(-x, b1, b2)
    d = 2.0 * (b1 * b1 - b2 * b2)
    return (b1 * b1 * math.exp(-x / b1) - b2 * b2 * math.exp(-x / b2)) / d


def svt_noise_tail(x: float, *, tau_1: float, variance: float = 0.0) -> float:
    """P(D > x) for D = Lap(4 tau_1) - Lap(2 tau_1) + N(0, variance), all independent.

    D is the noise of one sparse-vector comparison of SparseGumb: an item's
    query noise Lap(4 tau_1), minus the threshold noise Lap(2 tau_1), minus the
    noise of the selected item's released count (Gaussian: variance
    |I_t| L_r tau_2^2 for a tree counter, sigma^2 ||row_t(B)||^2 for a BLT
    counter), for an item whose true count equals the selected one's.

    Closed form: the sum of the two Laplace variables has tail
    sum_b w_b exp(-x/b) for x >= 0 (w = b1^2 / (2(b1^2 - b2^2)) and
    -b2^2 / (2(b1^2 - b2^2))), and 1 - tail(-x) below 0; averaging it over the
    Gaussian G ~ N(0, s^2) uses E[exp((G - x)/b); G <= x] = exp(-x/b + s^2/(2b^2))
    Phi((x - s^2/b)/s) and its mirror, evaluated in log space.
    """
    b1, b2 = 4.0 * tau_1, 2.0 * tau_1
    if variance <= 0.0:
        return _laplace_pair_tail(x, b1, b2)
    sd = math.sqrt(variance)
    d = 2.0 * (b1 * b1 - b2 * b2)
    total = float(ndtr(-x / sd))
    for b, w in ((b1, b1 * b1 / d), (b2, -b2 * b2 / d)):
        shift = variance / (2.0 * b * b)
        below = math.exp(-x / b + shift + float(log_ndtr((x - variance / b) / sd)))
        above = math.exp(x / b + shift + float(log_ndtr(-(x + variance / b) / sd)))
        total += w * (below - above)
    return min(1.0, max(0.0, total))


def noise_eta(*, tau_1: float, variance: float = 0.0, level: float) -> float:
    """The smallest eta with P(D > eta) <= level, D as in :func:`svt_noise_tail`.

    This is SparseGumb's automatic eta_t: the (1 - level) quantile of the noise
    of one comparison (see :class:`ContinualTopK`, "Choosing eta"). It is a
    function of the noise scales only, never of the data.
    """
    if not (math.isfinite(tau_1) and tau_1 > 0):
        raise ValueError(f"tau_1 must be positive and finite, got {tau_1!r}")
    if not 0.0 < level < 0.5:
        raise ValueError(f"level must be in (0, 0.5), got {level!r}")

    def excess(x: float) -> float:
        return svt_noise_tail(x, tau_1=tau_1, variance=variance) - level

    hi = 4.0 * tau_1 + math.sqrt(max(variance, 0.0))
    while excess(hi) > 0:
        hi *= 2.0
    x = brentq(excess, 0.0, hi, xtol=1e-12 * hi, rtol=1e-14)
    step = 2.0**-52
    while excess(x) > 0:  # never below the quantile: move up by growing relative steps
        x *= 1.0 + step
        step *= 2.0
    return float(x)


class ContinualTopK(OneStream):
    """SparseGumb_{s,k} (``algo:sparseGumb``): the top-k of a running histogram, continually.

    Selection: the k items are selected with the exponential mechanism
    (KnownGumb_k without counts, Gumbel noise of scale tau_2/2 on the prefix
    counts, tau_2 = sqrt(s+1) tau). Each selected item u gets a tree counter
    (BinMech, cell noise N(0, L_r tau_2^2)) over its whole bit stream, so its
    released count at t is h_t^u + the noise of the cells I_t(r).

    Waiting for data (``wait=True``, the default; not in the paper): the paper
    selects at t = 1, when every count may still be 0, and that random list
    would be published until the first switch. Instead, the first selection
    waits for a sparse-vector round of its own (tau_1 as below): at each step
    the k-th largest count h_(k),t is compared, with query noise Lap(4 tau_1),
    to the threshold eta0 + Z0, Z0 ~ Lap(2 tau_1) drawn once; the first step it
    is above selects. Until then every release is empty with ``meta["status"]
    == "not yet"``; from then on ``"selected"``. h_(k) moves by at most 1 when
    one event changes (every count moves by at most 1, in the same direction),
    so this is an AboveThreshold run on sensitivity-1 queries, paid as one more
    sparse-vector round (see Privacy): the decision is private, and depends on
    the data only through that round. ``wait=False`` is the paper's algorithm.

    Switches: at every later release, while switches remain, a sparse-vector
    check: with i* the selected item of smallest noisy count, the threshold is
    m_t = hhat_t^{i*} + eta_t + Z, Z ~ Lap(2 tau_1) drawn once per switch
    epoch; if some non-selected u has h_t^u + Lap(4 tau_1) > m_t, the top-k is
    re-selected from h_t (fresh Gumbel noise), one switch is spent and Z is
    redrawn. The release at t is the (possibly new) selection with its counts.

    Choosing eta (``eta="auto"``, the default): eta_t is the (1 - beta/T)
    quantile, beta = :data:`AUTO_ETA_BETA` = 0.05 by default, of the noise D of one
    comparison between an outside item u and the threshold when their true
    counts are equal, D = Lap(4 tau_1) - Lap(2 tau_1) - N(0, V_t) (query
    noise, threshold noise, noise of the selected item's count, whose
    variance V_t is the active counter's at t, :meth:`counter_variance_at`:
    |I_t| L_r tau_2^2 for the tree, sigma^2 ||row_t(B)||^2 for BLT; exact
    tail in :func:`svt_noise_tail`). So an item tied with the k-th selected
    count sets off a switch at a given step with probability beta/T, at most
    beta over the whole run, and an item that leads by eta_t + x does so with
    probability above 1/2 as soon as x > 0. That is a few standard deviations
    of D (about 6 for T = 1,000: the tails are Laplace), where the paper's
    worst-case utility bound eq:eta (:func:`utility_eta`) adds union bounds
    over all d items and all T steps for three error terms and, on real
    streams, exceeds every count. eta_t depends on t only through V_t and
    on nothing in the data. The waiting round uses eta0, the same quantile
    without the counter term (it compares a count with 0, not with another
    noisy count): on a stream whose counts are all 0 the first selection is
    made with probability at most beta. A number (or a callable t -> eta_t)
    replaces both.

    Privacy: for any eta_t >= 0 (and eta0) fixed from public values,
    (2k + 1) / (2 tau^2)-zCDP, and k / tau^2 when
    no sparse-vector round runs (``switches=0, wait=False``). eta only shifts
    the public part of each sparse-vector query (below): the paper's theorem
    holds "for any {eta_t} with eta_t >= 0", and the automatic eta (any beta,
    start_beta) is a function of tau_1, the counter's variance, T and beta,
    never of the data, so its value changes utility only. The paper's
    SparseGumb theorem (after ``algo:sparseGumb``) states (2k + 4) / (2 tau^2);
    the accounting, term by term, with R sparse-vector rounds (R = s + 1 with
    ``wait``: the waiting round and the s switch rounds; R = s without, the
    paper's tau_1 = sqrt(s) tau) and S = s + 1 selections:

    1. S selections, KnownGumb_k(.; tau_2) without counts, k/(2 tau_2^2) each
       (k peels of a bounded-range exponential mechanism): k/(2 tau^2) in all.
    2. At most S k counters (BinMech at tau_2), 1/(2 tau_2^2) each: k/(2 tau^2).
    3. R sparse-vector rounds at tau_1 = sqrt(R) tau: each is (1/tau_1)-DP,
       hence 1/(2 tau_1^2)-zCDP (pure eps-DP is eps^2/2-zCDP, Bun and Steinke
       2016, Prop. 1.4): 1/(2 tau^2) in all, and nothing when R = 0 (then
       tau_1 is unused and no sparse-vector noise is ever drawn: only what
       runs is paid for).

    Composition (zCDP adds, adaptively) gives (k + 1/2) / tau^2. Why each
    round is (1/tau_1)-DP, where the paper charges 2/tau_1: a round is one run
    of Algorithm 1 of Lyu, Su and Li (2017, "Understanding the sparse vector
    technique") with cutoff c = 1 (it stops at its first "above"), threshold
    noise Lap(Delta/eps1) = Lap(2 tau_1) and query noise Lap(2 c Delta/eps2)
    = Lap(4 tau_1) with Delta = 1, eps1 = eps2 = 1/(2 tau_1): their theorem
    makes it (eps1 + eps2) = (1/tau_1)-DP for queries of sensitivity Delta
    chosen adaptively, with thresholds chosen adaptively. It applies to
    SparseGumb's restarted, adaptive use because:

    * the queries have sensitivity 1: in a switch round the query on item u
      at step t is h_t^u - (hhat_t^{i*} + eta_t) compared with the noisy 0
      threshold; h_t^u moves by at most 1 between neighbouring streams (one
      event replaced by an empty one), and hhat_t^{i*} + eta_t is a function
      of earlier outputs (see below) and public values, the same for both
      streams. In the waiting round the query is h_(k),t - eta0, and the k-th
      largest count also moves by at most 1 when every count does.
    * the order of composition is Selection 0, Counters 0, Round 1, Selection
      1, Counters 1, ...: the counters of generation n run over the whole
      stream (all T outputs) and are released in full before round n + 1,
      whose thresholds use only counters of generations <= n; round n + 1
      itself uses only those outputs, its own earlier "below" answers and its
      own fresh noise (threshold noise Lap(2 tau_1) drawn once per round,
      query noise Lap(4 tau_1) fresh for every (item, step, round)). So each
      round is one instance of Algorithm 1 given the earlier outputs, and
      the instances compose. This order of composition assumes the stream is
      fixed in advance (the paper's model, and a stream of real events): a
      stream chosen adaptively after seeing releases would need a concurrent-
      composition argument instead.
    * several queries per step: they are asked in a fixed (domain) order and
      the round stops at the first "above"; the release only says at which
      step that happened (a function of Algorithm 1's output), never which
      item.

    The calibration uses rho = a / tau^2 with a = k + 1/2 (a = k with no
    round). The mechanism is not a Gaussian mechanism, so (epsilon, delta)
    comes from the general zCDP conversion. tests/test_topk_privacy.py checks
    a round's privacy loss by exact numerical integration.

    Why an item that stays selected across a re-selection keeps its counter:
    a counter is one run of BinMech over the item's whole bit stream
    sigma^u_{1:T}, and BinMech's guarantee covers the release of *all* of its T
    outputs. Releasing the same run at more steps is post-processing of that
    one run: no new noise and no new privacy cost. The count of counters the
    proof pays for, (s+1) k, only goes down. An item that is newly selected
    (including one dropped earlier and selected again) gets a fresh counter,
    exactly as the algorithm's "set hhat^i = BinMech(sigma^i; tau_2)".

    Noise addressing (key, purpose, item, (level, index), draw), so a restart replays it.
    ``noise_scope`` is ``f"{stream}/topk@{tag}"`` where the tag fingerprints T, r,
    tau, k, s and eta (:func:`~dpstream.mechanisms.base.config_tag`), so runs
    with other settings under the same key and stream draw independent noise:

    * selection number n (0 for the first, n = 1..s for the re-selections):
      purpose ``f"{noise_scope}/select-{n}"``, Gumbel at (0, 0, draw=0), the
      one-shot convention of ``dpstream.oneshot``;
    * counter of an item newly selected at selection n: purpose
      ``f"{noise_scope}/counter-{n}"``, tree cells (level >= 1, j, draw=0);
    * sparse vector, purpose ``f"{noise_scope}/svt"``: the threshold noise of epoch
      n (after n switches) is the scalar Laplace at (0, n, 0); the query noise
      of item u at step t in epoch n is u's Laplace at (0, t, draw=n). Each step
      is checked once, so no (t, n) address is used twice. The waiting round
      uses the scalar addresses (1, 0, 0) (its threshold noise) and (1, t, 1)
      (its query noise at step t), distinct from those.

    Counters (``counter=``): the tree (BinMech with tau_2) or a BLT counter
    (:class:`~dpstream.BLTCounter`'s noise with sigma = tau_2 max_j ||C e_j||,
    purpose ``f"{noise_scope}/counter-{n}"``, draws at (0, step, 0)). Both are
    1/(2 tau_2^2)-zCDP per counter, so the theorem's accounting is unchanged;
    the BLT's count error has a 2.6x-3.1x smaller std. A BLT counter of an
    item selected at t replays steps 1..t (t keyed draws per new item).

    User-level privacy (``max_items_per_user=`` L0, ``max_count_per_item=``
    Linf): events are ``(user, items)`` pairs, each user kept within the bounds
    over the whole stream (first come, first kept). The mechanism is scale
    equivariant: with counts h, noise scale tau and eta_t it releases exactly
    Linf times what it releases with h / Linf, tau / Linf and eta_t / Linf
    (every noise is a scale family; selections and comparisons do not change
    under scaling). Removing one user changes every scaled count by at most 1
    at every step, in one direction, which is all the selection and
    sparse-vector parts of the theorem use, and changes each scaled counter's
    cell table by at most the event-level sensitivity (the worst placement of
    the user's Linf contributions is at one step, lemma in
    :mod:`dpstream.bounding`). So the guarantee above holds per user with tau / Linf:
    Linf^2 (2k + 1) / (2 tau^2)-zCDP, Linf^2 k / tau^2 with no sparse-vector round
    (``.privacy.unit == "user"``). L0 does
    not enter: the analysis never uses how many counts one unit changes.

    Modes: ``step`` / ``step_batch`` take events (each a set of domain items, any
    size); ``release(t, counts)`` takes the prefix histogram at t (aggregate
    mode, the paper's practical setting) and gives the same releases bit for bit.
    Aggregate mode may skip steps; the sparse-vector check then runs only at
    the released steps (fewer queries, same guarantee).

    Args:
        domain: the items, distinct (str, int or bytes).
        horizon: T.
        k: how many items to release, 1 <= k <= d.
        switches: s >= 0, the most re-selections.
        eta: ``"auto"`` (the default, see "Choosing eta"), or eta_t >= 0 as a
            number or a callable t -> eta_t (e.g. the paper's :func:`utility_eta`).
        beta, start_beta: with ``eta="auto"``, the chance that an item tied with
            the list's smallest count sets off a switch test at some step
            (``beta``), and that a stream whose counts are all 0 starts a list
            (``start_beta``, the waiting round's eta0; default: ``beta``); both
            0.05 by default. Larger values lower eta_t and eta0 (the list comes
            and changes sooner) at the price of more switches spent on noise;
            docs/utility.md measures them. They are public and never depend on
            the data, so the guarantee is the same for every value (see Privacy).
        wait: make the first selection only once the k-th largest count clears
            the noise (see "Waiting for data"); ``False`` selects at the first
            release, as the paper does.
        counter: ``"tree"``, ``"blt"``, a :class:`~dpstream.factorization.BLTStrategy`
            or ``None`` (the tree if ``base`` is given, else the counter with the
            smaller worst-case variance for T: BLT for T >= 2).
        base: the tree base r of the counters; ``None`` picks r*.
        key: the secret key.
        rho | epsilon, delta | tau: the budget, exactly one form.
        stream: separates this stream's noise from other streams under the key.
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).
        max_items_per_user, max_count_per_item: L0 and Linf, for user-level
            privacy (both or neither).

    Example:
        >>> import dpstream as dps
        >>> m = dps.ContinualTopK(["a", "b", "c"], 100, k=1, switches=2,
        ...                       key=dps.NoiseKey.generate(), rho=1.0)
        >>> rel = m.step_batch([["a", "b"]] * 1000)  # before: empty, status "not yet"
        >>> len(rel.counts), rel.meta["status"], rel.meta["switches_left"]
        (1, 'selected', 2)
    """

    mechanism_name = "SparseGumb"
    accepts_columns = True  # step_batch takes EventColumns
    unbounded = False  # needs --horizon (ContinualMechanism)
    theorem = (
        "SparseGumb (algo:sparseGumb) with the sparse vector per Lyu-Su-Li 2017 "
        "Alg. 1: (2k+1)/(2 tau^2)-zCDP; k/tau^2 with no sparse-vector round"
    )
    theorem_user = (
        "SparseGumb per user (scaling by Linf, dpstream.bounding lemma): "
        "Linf^2 (2k+1)/(2 tau^2)-zCDP"
    )

    def __init__(
        self,
        domain: Iterable[Hashable],
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
        max_items_per_user: int | None = None,
        max_count_per_item: int | None = None,
        noise_version: int = DEFAULT_NOISE_VERSION,
        beta: float = AUTO_ETA_BETA,
        start_beta: float | None = None,
    ) -> None:
        self.noise_version = check_noise_version(noise_version)
        self.horizon = check_horizon(horizon)
        self.counter, self.base, self.strategy = resolve_counter(counter, base, self.horizon)
        self.user_bounds = resolve_user_bounds(max_items_per_user, max_count_per_item)
        self.stream = check_stream_name(stream)
        check_key(key)
        items = domain_items(domain, key)
        # the domain, numbered in its order: a compact table of str items (or a list
        # and a dict for other types), which finds a step's positions all at once
        self._index = domain_table(items)
        d = len(items)
        self.k = check_top_k(k, d)
        if isinstance(switches, bool) or not isinstance(switches, (int, np.integer)):
            raise TypeError(f"switches must be an int, got {type(switches).__name__}")
        if switches < 0:
            raise ValueError(f"switches must be >= 0, got {switches}")
        self.switches = int(switches)
        if not isinstance(wait, bool):
            raise TypeError(f"wait must be a bool, got {wait!r}")
        self.wait = wait
        self._eta: float | npt.NDArray[np.float64] | str  # a schedule: eta_t for t = 1..T
        if isinstance(eta, str):
            if eta != "auto":
                raise ValueError(f"eta must be 'auto', a number >= 0 or a callable, got {eta!r}")
            self._eta = eta
        elif callable(eta):
            # a schedule is evaluated (and checked) at every step now: the noise scope
            # fingerprints its values, and nothing is left to fail in the middle of a run
            if self.horizon > MAX_ETA_SCHEDULE:
                raise TypeError(
                    f"eta as a function needs horizon <= {MAX_ETA_SCHEDULE:,} "
                    "(it is evaluated at every step up front); give a number or "
                    "'auto'"
                )
            self._eta = np.array(
                [self._check_eta(eta(t), f"eta({t})") for t in range(1, self.horizon + 1)],
                dtype=np.float64,
            )
        else:
            self._eta = self._check_eta(eta, "eta")
        self.beta, self.start_beta = self._check_betas(beta, start_beta)
        self.key = key
        self.levels = None if self.strategy else num_levels(self.horizon, tree_base(self.base))
        # rho = (k + 1/2) / tau^2, or k / tau^2 when no sparse-vector round runs
        self._coef = self.k + (0.5 if self.switches + int(self.wait) else 0.0)
        if self.user_bounds is not None:  # per user: the theorem at tau / Linf
            self._coef *= self.user_bounds.max_count_per_item**2
        self.budget, self.tau, self.privacy = resolve_privacy(
            rho=rho,
            epsilon=epsilon,
            delta=delta,
            tau=tau,
            coefficient=self._coef,
            gaussian_exact=False,
            mechanism=self.mechanism_name,
            theorem=self.theorem,
        )
        self.privacy = user_guarantee(self.privacy, self.user_bounds, self.theorem_user)
        self._users = None if self.user_bounds is None else UserLevel(self.user_bounds, key)
        #: sparse-vector rounds: the waiting round (if any) and one per switch
        self.rounds = self.switches + int(self.wait)
        self.tau_1 = math.sqrt(self.rounds) * self.tau
        self.tau_2 = math.sqrt(self.switches + 1) * self.tau
        # the std of a counter's tree cell, or of a BLT counter's draws
        self.counter_std = (
            blt_sigma(self.tau_2, self.strategy)
            if self.strategy
            else math.sqrt(tree_levels(self.levels)) * self.tau_2
        )
        self.noise_scope = self.scope_for(domain_tag(items))
        # keyed item identifiers do not depend on the purpose: hash the domain once
        self._svt = NoiseSource(key, f"{self.noise_scope}/svt")
        ids = self._svt.item_ids(items)
        self._svt_prepared = self._svt.prepare_ids(ids) if self.switches else None
        # one array of 16 bytes an item: with switches, the prepared ids of the sparse
        # vector, from which a selection recovers the identifiers (by decryption);
        # without, the identifiers themselves
        self._ids: np.ndarray | None = None if self.switches else ids
        del ids
        self._eta_cache: dict[float, float] = {}  # counter variance -> eta
        if self.wait:  # the waiting round's threshold noise, drawn once
            self._threshold_noise_start = self._svt.scalar("laplace", 1, 0, 0, scale=2 * self.tau_1)
        # int32 while every count fits (4 bytes per item less), int64 from then on
        self._counts = np.zeros(d, dtype=np.int32)
        self._max_count = 0
        self.t = 0
        self.switches_left = self.switches
        self._selections = 0  # selections made so far (n of the next one)
        self._selected: np.ndarray | None = None  # domain positions, selection order
        self._threshold_noise = 0.0
        # counters: generation n -> (TreeNoise | BLTNoise, domain positions in insertion order)
        self._gens: dict[int, tuple[TreeNoise | BLTNoise, list[int]]] = {}
        self._where: dict[int, tuple[int, int]] = {}  # position -> (generation, column)

    # -- checks ------------------------------------------------------------------

    @classmethod
    def from_params(
        cls, domain: Iterable[Hashable], params: TopKParams, *, key: NoiseKey
    ) -> ContinualTopK:
        """Top-k of ``params`` (the value :class:`dpstream.spark.SparkContinualTopK` is
        built from too) over ``domain``."""
        return cls(domain, params.horizon, key=key, **params.kwargs())

    def _check_betas(self, beta: object, start_beta: object) -> tuple[float, float]:
        """beta and start_beta: floats with 0 < beta / T < 1/2, only with ``eta="auto"``."""
        start_beta = beta if start_beta is None else start_beta
        out = []
        for name, value in (("beta", beta), ("start_beta", start_beta)):
            if isinstance(value, bool) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                raise TypeError(f"{name} must be a real number, got {value!r}")
            value = float(value)
            if not (0.0 < value < 1.0 and value / self.horizon < 0.5):
                raise ValueError(f"{name} must be in (0, 1) (and below T/2), got {value!r}")
            out.append(value)
        if not isinstance(self._eta, str) and out != [AUTO_ETA_BETA, AUTO_ETA_BETA]:
            raise ValueError("beta and start_beta size eta='auto' only: a given eta replaces them")
        return out[0], out[1]

    def scope_for(self, domain: str) -> str:
        """The noise scope of these settings over the domain whose :func:`domain_tag`
        is ``domain``: every purpose carries the noise-shaping settings (see
        ``base.config_tag``), and the domain, which decides which items count (and,
        per user, which of a user's contributions are kept first): another domain
        draws other noise. (The Spark twin fixes its domain at its first release.)"""
        blt = {"counter": self.strategy.fingerprint()} if self.strategy else {}
        if self.user_bounds is not None:
            blt["users"] = self.user_bounds.tag()
        return versioned_purpose(
            f"{self.stream}/topk@"
            + config_tag(
                horizon=self.horizon,
                base=self.base,
                tau=self.tau,
                k=self.k,
                switches=self.switches,
                eta=self._eta_scope_tag(),
                wait=self.wait,
                domain=domain,
                **blt,
            ),
            self.noise_version,
        )

    def _eta_scope_tag(self) -> float | str:
        """The noise scope's record of eta: eta alone for the default levels (the record of
        every stream that keeps them, so its releases replay), with the levels when they
        differ (other thresholds, other noise)."""
        tag = _eta_tag(self._eta)
        if (self.beta, self.start_beta) != (AUTO_ETA_BETA, AUTO_ETA_BETA):
            tag = f"{tag}:beta={self.beta.hex()}:start_beta={self.start_beta.hex()}"
        return tag

    @staticmethod
    def _check_eta(value: object, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:  # an int past the float range
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        return value

    def eta_at(self, t: int) -> float:
        """eta_t of the switch test at t, checked (finite, >= 0); see "Choosing eta"."""
        if isinstance(self._eta, str):  # "auto"
            if self.rounds == 0:
                return 0.0
            variance = self.counter_variance_at(t)
            eta = self._eta_cache.get(variance)
            if eta is None:
                eta = noise_eta(tau_1=self.tau_1, variance=variance, level=self.beta / self.horizon)
                self._eta_cache[variance] = eta
            return eta
        if isinstance(self._eta, np.ndarray):
            return float(self._eta[t - 1])
        return float(self._eta)

    def start_eta_at(self, t: int) -> float:
        """eta0 of the waiting round at t (``"auto"``: the quantile without a counter)."""
        if isinstance(self._eta, str):  # "auto"
            if self.rounds == 0:
                return 0.0
            eta = self._eta_cache.get(-1.0)  # (key -1: no counter term)
            if eta is None:
                eta = noise_eta(tau_1=self.tau_1, level=self.start_beta / self.horizon)
                self._eta_cache[-1.0] = eta
            return eta
        return self.eta_at(t)

    def counter_variance_at(self, t: int) -> float:
        """The variance of a selected item's released count at t (data-independent).

        The tree: |I_t(r)| cells of variance L_r tau_2^2; BLT: sigma^2 ||row_t(B)||^2
        (a counter started at a later selection replays steps 1..t, so its
        count at t has the same variance).
        """
        if self.strategy is not None:
            return self.counter_std * self.counter_std * self.strategy.variance_factor(t)
        return sum(digits(t, tree_base(self.base))) * self.counter_std * self.counter_std

    @property
    def noise_std_worst(self) -> float:
        """The largest standard deviation of a released count over t <= T."""
        if self.strategy is not None:
            return self.counter_std * math.sqrt(self.strategy.max_variance_factor)
        return self.tau_2 * math.sqrt(
            worst_case_variance_factor(self.horizon, tree_base(self.base))
        )

    # -- facts ---------------------------------------------------------------------
    @property
    def counts(self) -> np.ndarray:
        """The true running counts (aligned with ``domain``). Not private."""
        return self._counts.astype(np.int64)

    @property
    def domain(self) -> list[Hashable]:
        """The domain's items, in order (a new list)."""
        return self._index.to_list()

    @property
    def domain_index(self) -> ItemTable:
        """The domain's item table (see ``KnownDomainHistogram.domain_index``). Shared,
        not copied: never add to it."""
        return self._index

    @property
    def selected(self) -> list[Hashable]:
        """The items currently released (empty before the first release)."""
        if self._selected is None:
            return []
        return self._index.take(self._selected)

    @property
    def switches_used(self) -> int:
        return self.switches - self.switches_left

    # -- event mode ------------------------------------------------------------------
    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event (any number of domain items) as the next step and release."""
        return self.step_batch([event])

    @one_at_a_time
    def step_batch(self, events: Iterable[Iterable[Hashable]] | EventColumns) -> Release:
        """Take all events of the next time step (possibly none) and release the top-k.

        ``events``: a list of events, or the step as
        :class:`~dpstream.mechanisms.columns.EventColumns` (the same release).

        Every event is checked before anything changes.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        batch, pending = bound_user_events(
            self._users, events, None, partial(check_in_domain, index=self._index)
        )
        batch = as_events(batch)
        fast = domain_positions(batch, self._index, None)
        top = None
        if fast is not None:
            new_counts = self._counts + np.bincount(fast, minlength=len(self._index))
            # the largest count: the last step's, or that of an item this step counted
            top = max(self._max_count, int(new_counts[fast].max(initial=0)))
        else:
            parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
            # event by event: the per-event path raises the first bad event's precise error
            for event in fast_events(batch):
                items = list(normalise_event(event, None))
                pos = lookup_all(items, self._index)
                if pos.size and pos.min() < 0:
                    raise InvalidEventError(
                        f"item {items[int(np.argmax(pos < 0))]!r} is not in the domain"
                    )
                parts.append(pos)
            new_counts = self._counts + np.bincount(
                np.concatenate(parts), minlength=len(self._index)
            )
        rel = self._release(t, new_counts, top)
        commit_user_events(self._users, pending)
        return rel

    # -- aggregate mode ----------------------------------------------------------------
    @one_at_a_time
    def release(
        self,
        t: int,
        counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray | Any,
        values: Sequence[int] | np.ndarray | None = None,
        *,
        bounded: bool = False,
    ) -> Release:
        """Release at t from the true prefix histogram h_t (Mapping or array aligned with domain;
        or ``release(t, items, counts)`` from two arrays, or a pandas/polars/Arrow frame
        with columns ``item`` and ``count``).

        Same releases as event mode for the same stream and key. Steps must
        increase; a skipped step gets no sparse-vector check. With user bounds,
        ``bounded=True`` says the counts are of contributions already bounded per user
        (first come, first kept): they carry no user ids to bound here.
        """
        check_bounded(self._users, bounded)  # user level: counts bounded beforehand
        check_next_step(t, self.t, self.horizon)
        return self._release(int(t), domain_counts(counts, self._index, self._counts, values))

    # -- the algorithm ------------------------------------------------------------------
    def _counter_noise(self, positions: np.ndarray) -> np.ndarray:
        out = np.empty(len(positions))
        noise = {n: tn.noise() for n, (tn, _) in self._gens.items()}
        for i, pos in enumerate(positions.tolist()):
            n, col = self._where[pos]
            out[i] = noise[n][col]
        return out

    def _item_ids(self, which: slice | np.ndarray) -> np.ndarray:
        """The keyed identifiers of the domain items ``which`` (a slice or positions)."""
        if self._ids is not None:
            return self._ids[which]
        assert self._svt_prepared is not None
        return self._svt.item_ids_of(self._svt_prepared.subset(which))

    def _select(self, t: int, counts: np.ndarray) -> None:
        """Selection number n = self._selections at step t: KnownGumb_k(h_t; tau_2), no counts."""
        n = self._selections
        source = NoiseSource(self.key, f"{self.noise_scope}/select-{n}")
        # the ids a chunk at a time: a large domain's are never all decrypted at once
        sel = gumbel_select_kernel(
            source,
            lambda lo, hi: source.prepare_ids(self._item_ids(slice(lo, hi))),
            counts,
            self.k,
            self.tau_2,
        )
        keep = set(sel.tolist())
        # drop the counters of items leaving the selection
        for pos in list(self._where):
            if pos not in keep:
                del self._where[pos]
        live = {g for g, _ in self._where.values()}
        for g in list(self._gens):
            if g not in live:
                del self._gens[g]
        # fresh counters (generation n) for newly selected items
        new = [pos for pos in sel.tolist() if pos not in self._where]
        if new:
            csrc = NoiseSource(self.key, f"{self.noise_scope}/counter-{n}")
            tn = (
                BLTNoise(csrc, self.strategy, self.counter_std)
                if self.strategy
                else TreeNoise(csrc, self.horizon, tree_base(self.base), self.counter_std)
            )
            tn.add_items(csrc.prepare_ids(self._item_ids(np.asarray(new, dtype=np.int64))))
            tn.advance(t)
            self._gens[n] = (tn, new)
            for col, pos in enumerate(new):
                self._where[pos] = (n, col)
        self._selected = sel
        self._selections = n + 1
        if self.switches_left > 0:
            # threshold noise of the epoch that starts now (n switches spent)
            self._threshold_noise = self._svt.scalar("laplace", 0, n, 0, scale=2 * self.tau_1)

    def _ready(self, t: int, counts: np.ndarray) -> bool:
        """The waiting round at t: is the k-th largest count above eta0 + Z0 (noisy)?"""
        d = counts.shape[0]
        kth = int(np.partition(counts, d - self.k)[d - self.k])
        query = kth + self._svt.scalar("laplace", 1, t, 1, scale=4 * self.tau_1)
        return bool(query > self.start_eta_at(t) + self._threshold_noise_start)

    def _release(self, t: int, counts: np.ndarray, top: int | None = None) -> Release:
        """Step to t with the int64 prefix counts ``counts``, whose largest is ``top``
        (None: taken from them)."""
        # everything that can fail on user input happens before any state changes
        if top is None:
            top = int(counts.max(initial=0))
        if self._selected is None:
            eta_t = self.start_eta_at(t) if self.wait else 0.0
        else:
            eta_t = self.eta_at(t) if self.switches_left else 0.0
        for tn, _ in self._gens.values():
            tn.advance(t)
        switched = False
        if self._selected is None:
            if not self.wait or self._ready(t, counts):
                self._select(t, counts)
        elif self.switches_left > 0:
            noisy_sel = counts[self._selected] + self._counter_noise(self._selected)
            threshold = float(noisy_sel.min()) + eta_t + self._threshold_noise
            epoch = self.switches - self.switches_left
            assert self._svt_prepared is not None
            query = counts + self._svt.laplace(
                self._svt_prepared, 0, t, epoch, scale=4 * self.tau_1
            )
            query[self._selected] = -np.inf
            if bool((query > threshold).any()):
                self.switches_left -= 1
                switched = True
                self._select(t, counts)
        # into the mechanism's own array (never the caller's): int32 while it holds top
        self._counts = narrow_counts.store(self._counts, counts, top)
        self._max_count = top
        self.t = t
        meta = {
            "status": "not yet" if self._selected is None else "selected",
            "switches_left": self.switches_left,
            "switched": switched,
            "selection": self._selections - 1,
        }
        if self._selected is None:
            return Release(t=t, items=[], values=np.zeros(0), meta=meta)
        sel = self._selected
        values = counts[sel] + self._counter_noise(sel)
        return Release(t=t, items=self._index.take(sel), values=values, meta=meta)

    def __repr__(self) -> str:
        return (
            f"ContinualTopK(d={len(self._index)}, T={self.horizon}, k={self.k}, "
            f"s={self.switches}, counter={self.counter}, r={self.base}, tau={self.tau:.4g}, "
            f"t={self.t}, "
            f"switches_left={self.switches_left})"
        )
