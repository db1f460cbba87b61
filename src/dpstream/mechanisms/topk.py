"""SparseGumb (``algo:sparseGumb``): continual top-k over a known domain, any event size.

When one event may touch any number of items, a full running histogram needs
noise that grows with the domain size d. SparseGumb releases only k items:
it selects them with the exponential mechanism (KnownGumb without counts),
tracks their running counts with tree counters (BinMech), and uses the sparse
vector technique to notice when an item outside the selection has overtaken
the k-th noisy count by eta_t; then it re-selects, at most s times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from ..bounding import resolve_user_bounds
from ..errors import InvalidEventError
from ..factorization import BLTStrategy
from ..noise import NoiseKey, NoiseSource
from ..oneshot.known import gumbel_select_kernel
from ..tree import num_levels
from .base import (
    Release,
    check_domain,
    check_horizon,
    check_key,
    check_next_step,
    check_stream_name,
    config_tag,
    domain_counts,
    normalise_event,
    resolve_privacy,
)
from .blt_noise import BLTNoise
from .counters import blt_sigma, resolve_counter
from .tree_noise import TreeNoise
from .users import UserLevel, bound_user_events, user_guarantee

__all__ = ["ContinualTopK", "utility_eta"]


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


class ContinualTopK:
    """SparseGumb_{s,k} (``algo:sparseGumb``): the top-k of a running histogram, continually.

    At the first release the k items are selected with the exponential
    mechanism (KnownGumb_k without counts, Gumbel noise of scale tau_2/2 on the
    prefix counts, tau_2 = sqrt(s+1) tau). Each selected item u gets a tree
    counter (BinMech, cell noise N(0, L_r tau_2^2)) over its whole bit stream,
    so its released count at t is h_t^u + the noise of the cells I_t(r).

    At every later release, while switches remain, a sparse-vector check (tau_1 =
    sqrt(s) tau): with i* the selected item of smallest noisy count, the
    threshold is m_t = hhat_t^{i*} + eta_t + Z, Z ~ Lap(2 tau_1) drawn once per
    switch epoch; if some non-selected u has h_t^u + Lap(4 tau_1) > m_t, the top-k
    is re-selected from h_t (fresh Gumbel noise), one switch is spent and Z is
    redrawn. The release at t is the (possibly new) selection with its counts.

    Privacy (SparseGumb theorem, after ``algo:sparseGumb``): for any eta_t >= 0,
    (2k + 4) / (2 tau^2)-zCDP: s+1 selections of k/(2(s+1) tau^2) each, at most
    (s+1) k counters of 1/(2(s+1) tau^2) each, and s sparse-vector rounds of
    2/(s tau^2) each. The calibration uses rho = a / tau^2 with a = k + 2. The
    mechanism is not a Gaussian mechanism, so (epsilon, delta) comes from the
    general zCDP conversion.

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
      is checked once, so no (t, n) address is used twice.

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
    :mod:`dpstream.bounding`). So the theorem holds per user with tau / Linf:
    Linf^2 (2k + 4) / (2 tau^2)-zCDP (``.privacy.unit == "user"``). L0 does
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
        eta: eta_t >= 0, a number or a callable t -> eta_t (see :func:`utility_eta`).
        counter: ``"tree"``, ``"blt"``, a :class:`~dpstream.factorization.BLTStrategy`
            or ``None`` (the tree if ``base`` is given, else the counter with the
            smaller worst-case variance for T: BLT for T >= 2).
        base: the tree base r of the counters; ``None`` picks r*.
        key: the secret key.
        rho | epsilon, delta | tau: the budget, exactly one form.
        stream: separates this stream's noise from other streams under the key.
        max_items_per_user, max_count_per_item: L0 and Linf, for user-level
            privacy (both or neither).

    Example:
        >>> import dpstream as dps
        >>> m = dps.ContinualTopK(["a", "b", "c"], 100, k=1, switches=2, eta=5.0,
        ...                       key=dps.NoiseKey.generate(), rho=1.0)
        >>> rel = m.step(["a", "b"])
        >>> len(rel.counts), rel.meta["switches_left"]
        (1, 2)
    """

    mechanism_name = "SparseGumb"
    theorem = "SparseGumb theorem (after algo:sparseGumb): (2k+4)/(2 tau^2)-zCDP"
    theorem_user = ("SparseGumb per user (scaling by Linf, dpstream.bounding lemma): "
                    "Linf^2 (2k+4)/(2 tau^2)-zCDP")

    def __init__(
        self,
        domain: Iterable[Hashable],
        horizon: int,
        *,
        k: int,
        switches: int,
        eta: float | Callable[[int], float],
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
    ) -> None:
        self.horizon = check_horizon(horizon)
        self.counter, self.base, self.strategy = resolve_counter(counter, base, self.horizon)
        self.user_bounds = resolve_user_bounds(max_items_per_user, max_count_per_item)
        self.stream = check_stream_name(stream)
        check_key(key)
        self.domain, self._index = check_domain(domain)
        d = len(self.domain)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if not 1 <= k <= d:
            raise ValueError(f"k must be in 1..{d} (the domain size), got {k}")
        self.k = int(k)
        if isinstance(switches, bool) or not isinstance(switches, (int, np.integer)):
            raise TypeError(f"switches must be an int, got {type(switches).__name__}")
        if switches < 0:
            raise ValueError(f"switches must be >= 0, got {switches}")
        self.switches = int(switches)
        if callable(eta):
            self._eta: float | Callable[[int], float] = eta
        else:
            self._eta = self._check_eta(eta, "eta")
        self.key = key
        self.levels = None if self.strategy else num_levels(self.horizon, self.base)
        self._coef = self.k + 2.0  # rho = (2k + 4) / (2 tau^2) = (k + 2) / tau^2
        if self.user_bounds is not None:  # per user: the theorem at tau / Linf
            self._coef *= self.user_bounds.max_count_per_item ** 2
        self.budget, self.tau, self.privacy = resolve_privacy(
            rho=rho, epsilon=epsilon, delta=delta, tau=tau, coefficient=self._coef,
            gaussian_exact=False, mechanism=self.mechanism_name, theorem=self.theorem,
        )
        self.privacy = user_guarantee(self.privacy, self.user_bounds, self.theorem_user)
        self._users = None if self.user_bounds is None else UserLevel(self.user_bounds, key)
        self.tau_1 = math.sqrt(self.switches) * self.tau
        self.tau_2 = math.sqrt(self.switches + 1) * self.tau
        # the std of a counter's tree cell, or of a BLT counter's draws
        self.counter_std = (blt_sigma(self.tau_2, self.strategy) if self.strategy
                            else math.sqrt(self.levels) * self.tau_2)
        # every purpose carries the noise-shaping settings (see base.config_tag)
        blt = {"counter": self.strategy.fingerprint()} if self.strategy else {}
        if self.user_bounds is not None:
            blt["users"] = self.user_bounds.tag()
        self.noise_scope = f"{self.stream}/topk@" + config_tag(
            horizon=self.horizon, base=self.base, tau=self.tau, k=self.k,
            switches=self.switches, eta=eta, **blt,
        )
        # keyed item identifiers do not depend on the purpose: hash the domain once
        self._svt = NoiseSource(key, f"{self.noise_scope}/svt")
        self._ids = self._svt.item_ids(self.domain)
        self._svt_prepared = self._svt.prepare_ids(self._ids) if self.switches else None
        self._counts = np.zeros(d, dtype=np.int64)
        self.t = 0
        self.switches_left = self.switches
        self._selections = 0  # selections made so far (n of the next one)
        self._selected: np.ndarray | None = None  # domain positions, selection order
        self._threshold_noise = 0.0
        # counters: generation n -> (TreeNoise | BLTNoise, domain positions in insertion order)
        self._gens: dict[int, tuple[TreeNoise | BLTNoise, list[int]]] = {}
        self._where: dict[int, tuple[int, int]] = {}  # position -> (generation, column)

    # -- checks ------------------------------------------------------------------
    @staticmethod
    def _check_eta(value: object, name: str) -> float:
        if isinstance(value, bool) or not isinstance(
            value, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:  # an int past the float range
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        return value

    def eta_at(self, t: int) -> float:
        """eta_t, checked (finite, >= 0)."""
        if callable(self._eta):
            return self._check_eta(self._eta(t), f"eta({t})")
        return self._eta

    # -- facts ---------------------------------------------------------------------
    @property
    def counts(self) -> np.ndarray:
        """The true running counts (aligned with ``domain``). Not private."""
        return self._counts.copy()

    @property
    def selected(self) -> list[Hashable]:
        """The items currently released (empty before the first release)."""
        if self._selected is None:
            return []
        return [self.domain[i] for i in self._selected]

    @property
    def switches_used(self) -> int:
        return self.switches - self.switches_left

    # -- event mode ------------------------------------------------------------------
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event (any number of domain items) as the next step and release."""
        return self.step_batch([event])

    def step_batch(self, events: Iterable[Iterable[Hashable]]) -> Release:
        """Take all events of the next time step (possibly none) and release the top-k.

        Every event is checked before anything changes.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        events, pending = bound_user_events(self._users, events, None, self._check_in_domain)
        idx: list[int] = []
        for event in events:
            for item in normalise_event(event, None):
                pos = self._index.get(item)
                if pos is None:
                    raise InvalidEventError(f"item {item!r} is not in the domain")
                idx.append(pos)
        new_counts = self._counts + np.bincount(
            np.asarray(idx, dtype=np.int64), minlength=len(self.domain)
        )
        rel = self._release(t, new_counts)
        if pending is not None:
            self._users.commit(pending)
        return rel

    def _check_in_domain(self, items: tuple[Hashable, ...]) -> None:
        for item in items:
            if item not in self._index:
                raise InvalidEventError(f"item {item!r} is not in the domain")

    # -- aggregate mode ----------------------------------------------------------------
    def release(self, t: int, counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray
                ) -> Release:
        """Release at t from the true prefix histogram h_t (Mapping or array aligned with domain).

        Same releases as event mode for the same stream and key. Steps must
        increase; a skipped step gets no sparse-vector check.
        """
        check_next_step(t, self.t, self.horizon)
        return self._release(int(t), self._counts_array(counts))

    def _counts_array(self, counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray
                      ) -> np.ndarray:
        return domain_counts(counts, self._index, self._counts)

    # -- the algorithm ------------------------------------------------------------------
    def _counter_noise(self, positions: np.ndarray) -> np.ndarray:
        out = np.empty(len(positions))
        noise = {n: tn.noise() for n, (tn, _) in self._gens.items()}
        for i, pos in enumerate(positions.tolist()):
            n, col = self._where[pos]
            out[i] = noise[n][col]
        return out

    def _select(self, t: int, counts: np.ndarray) -> None:
        """Selection number n = self._selections at step t: KnownGumb_k(h_t; tau_2), no counts."""
        n = self._selections
        source = NoiseSource(self.key, f"{self.noise_scope}/select-{n}")
        sel = gumbel_select_kernel(source, source.prepare_ids(self._ids), counts, self.k,
                                   self.tau_2)
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
            tn = (BLTNoise(csrc, self.strategy, self.counter_std) if self.strategy
                  else TreeNoise(csrc, self.horizon, self.base, self.counter_std))
            tn.add_items(csrc.prepare_ids(self._ids[new]))
            tn.advance(t)
            self._gens[n] = (tn, new)
            for col, pos in enumerate(new):
                self._where[pos] = (n, col)
        self._selected = sel
        self._selections = n + 1
        if self.switches_left > 0:
            # threshold noise of the epoch that starts now (n switches spent)
            self._threshold_noise = self._svt.scalar("laplace", 0, n, 0, scale=2 * self.tau_1)

    def _release(self, t: int, counts: np.ndarray) -> Release:
        # everything that can fail on user input happens before any state changes
        eta_t = self.eta_at(t) if (self._selected is not None and self.switches_left) else 0.0
        for tn, _ in self._gens.values():
            tn.advance(t)
        switched = False
        if self._selected is None:
            self._select(t, counts)
        elif self.switches_left > 0:
            noisy_sel = counts[self._selected] + self._counter_noise(self._selected)
            threshold = float(noisy_sel.min()) + eta_t + self._threshold_noise
            epoch = self.switches - self.switches_left
            assert self._svt_prepared is not None
            query = counts + self._svt.laplace(self._svt_prepared, 0, t, epoch,
                                               scale=4 * self.tau_1)
            query[self._selected] = -np.inf
            if bool((query > threshold).any()):
                self.switches_left -= 1
                switched = True
                self._select(t, counts)
        self._counts = counts
        self.t = t
        sel = self._selected
        values = counts[sel] + self._counter_noise(sel)
        return Release(
            t=t,
            items=[self.domain[i] for i in sel],
            values=values,
            meta={"switches_left": self.switches_left, "switched": switched,
                  "selection": self._selections - 1},
        )

    def __repr__(self) -> str:
        return (
            f"ContinualTopK(d={len(self.domain)}, T={self.horizon}, k={self.k}, "
            f"s={self.switches}, counter={self.counter}, r={self.base}, tau={self.tau:.4g}, "
            f"t={self.t}, "
            f"switches_left={self.switches_left})"
        )
