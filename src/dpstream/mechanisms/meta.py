"""MetaAlgo (``algo:MetaAlgo``): a one-shot mechanism on every cell of the partial-histogram table.

The r-ary tree of Section 3 with histograms in its cells: cell (l, j) holds the
histogram of the events at steps (j-1) r^(l-1) + 1 .. j r^(l-1) (its *block*
histogram). MetaAlgo privatises each cell once with a one-shot mechanism of
Table 1 run at noise scale sqrt(L_r) tau, and releases at t the sum of the
noisy cells I_t(r). It needs the events (block histograms), not prefix counts:
event mode only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from .. import privacy
from .._checks import check_int
from ..errors import InvalidEventError
from ..noise import (
    DEFAULT_NOISE_VERSION,
    NoiseKey,
    NoiseSource,
    check_noise_version,
    encode_item,
    versioned_purpose,
)
from ..oneshot.known import gaussian_kernel, gumbel_select_kernel
from ..special import ndtri
from ..tree import cells_closing_at, digits, num_levels, worst_case_variance_factor
from .base import (
    EventLimit,
    Release,
    TruncationStats,
    check_base,
    check_horizon,
    check_key,
    check_max_items,
    check_next_step,
    check_stream_name,
    config_tag,
    domain_items,
    resolve_privacy,
    take_items,
)
from .item_table import ItemTable, domain_table, release_items
from .known import domain_tag
from .serial import OneStream, one_at_a_time

if TYPE_CHECKING:
    from ..bounding import UserBounds
    from ..factorization import BLTStrategy

__all__ = ["ONESHOTS", "MetaHistogram"]

#: The one-shot subroutines MetaHistogram accepts.
ONESHOTS = ("gaussian", "gumbel", "unknown-gaussian", "unknown-gumbel")

_THEOREMS = {
    "gaussian": "MetaAlgo theorem (Sec. 4), known domain, l0 sensitivity Delta0: "
    "Delta0/(2 tau^2)-zCDP",
    "gumbel": "MetaAlgo theorem (Sec. 4), known domain, unrestricted l0: k/tau^2-zCDP",
    "unknown-gaussian": "MetaAlgo theorem (Sec. 4), unknown domain, l0 sensitivity Delta0: "
    "(eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')-DP",
    "unknown-gumbel": "MetaAlgo theorem (Sec. 4), unknown domain, unrestricted l0: "
    "(eps(k/tau^2, delta'), 2k delta + delta')-DP "
    "[eps by the CKS20 conversion; delta charged as max(2k, kbar) delta, "
    "see docstring]",
}


class MetaHistogram(OneStream):
    """MetaAlgo (``algo:MetaAlgo``): continual release from one-shot mechanisms on tree cells.

    At every step t the block histograms of the cells closing at t
    (``tree.cells_closing_at``) are complete; each is privatised once, by the
    chosen one-shot mechanism at noise scale sqrt(L_r) tau (and, for the
    unknown-domain ones, threshold delta delta/L_r), under the noise purpose
    ``f"{stream}/meta-{oneshot}/cell-{level}-{index}"``, so every cell's noise
    is independent and a rerun replays it. The release at t is the sum over
    the cells I_t(r) of the noisy cell histograms:

    * ``"gaussian"`` (KnownGauss, ``algo:kGauss``): every domain item, as
      KnownBase but with the noise drawn per cell histogram; the count at t is
      unbiased with variance |I_t| L_r tau^2.
    * ``"gumbel"`` (KnownGumb_k, ``algo:kGumb``): each cell releases k items
      with Gaussian counts. An item not selected in a cell contributes 0 from
      that cell; the release at t is the top-k of the summed values among the
      items selected in at least one cell of I_t.
    * ``"unknown-gaussian"`` (UnkGauss_kbar): the items each cell shows above
      its threshold, summed as above (not selected -> 0), all of them released.
    * ``"unknown-gumbel"`` (UnkGumb_{k,kbar}): as ``"gumbel"``, top-k of the sum.

    Not yet (``"gumbel"``): each cell selects k items even when its block
    histogram is all 0, so the first releases of a stream that starts empty
    would be a random list. The list is therefore released only from the
    first step at which its largest value exceeds z sigma_t (while every
    value is within the noise, nothing is shown; the list is recomputed at
    every step, so once one count stands out the rest follow), sigma_t = sqrt(|I_t|)
    sqrt(L_r) tau (the largest standard deviation of a summed value: the
    Gaussian counts of at most |I_t| cells) and z = Phi^-1(1 - beta / (k (r-1)
    L_r T)), beta = 0.05: with every count 0 each of the at most k (r-1) L_r
    candidates exceeds it with probability at most beta / (k (r-1) L_r T), so a
    list is started on pure noise with probability at most beta (union bound
    over candidates and steps). Until then the release is empty with
    ``meta["status"] == "not yet"``, then ``"selected"``. This is
    post-processing of the released values and public parameters: no privacy
    cost. (The unknown-domain variants release only items that appeared.)

    Privacy (the MetaAlgo theorem after ``algo:MetaAlgo``; an event changes at
    most L_r cells, zCDP composes over them):

    * ``"gaussian"``: Delta0/(2 tau^2)-zCDP (Delta0 = ``max_items``); it is a
      Gaussian mechanism with sensitivity sqrt(Delta0 L_r) and noise
      sqrt(L_r) tau, so (epsilon, delta) uses the exact Gaussian curve.
    * ``"gumbel"``: k/tau^2-zCDP (any event size).
    * ``"unknown-gaussian"``: (eps(Delta0/(2 tau^2), delta'), Delta0 delta + delta')-DP,
      with delta = ``threshold_delta``. On the good outcomes the mechanism is
      the Gaussian mechanism above, so epsilon uses the exact Gaussian curve,
      as ``unknown_domain_gaussian_privacy`` argues for one cell.
    * ``"unknown-gumbel"``: (eps(k/tau^2, delta'), c delta + delta')-DP with
      eps the CKS20 conversion of rho = k/tau^2 (Canonne, Kamath and Steinke
      2020, Cor. 13), where the theorem writes the paper's eq:epsilon. Why
      that is valid: in the proof, eq:epsilon enters only as a bound P(S) <=
      e^eps Q(S) + delta' between two distributions with D_alpha(P || Q) <=
      alpha rho for every alpha > 1 -- the outputs, on the good outcomes, of
      the k/tau^2-zCDP composition of the cells' exponential and Gaussian
      mechanisms (``lem:meta``; the bad outcomes are paid by c delta). CKS20's
      Corollary 13 is such a bound for any pair of distributions with that
      Renyi profile, and :func:`~dpstream.privacy.epsilon_cks` never exceeds
      eq:epsilon (it takes the smaller of the two). The calibration solves it
      for tau, so for the same (epsilon, delta) the noise is smaller than with
      eq:epsilon (15% smaller tau at epsilon = 1, delta = 1e-6, k = 10).
      The MetaAlgo theorem says c = 2k, while UnkGumb's own
      theorem (``thm:UnkGumbelPrivacy``) charges kbar delta per call, i.e.
      kbar delta over the L_r cells at delta/L_r each; we charge
      c = max(2k, kbar), valid under either statement (equal to the theorem's
      2k when kbar <= 2k).

    Budget for the unknown-domain variants: with ``epsilon=, delta=`` the total
    delta is split, ``threshold_delta`` = delta / (2 c) by default (c = Delta0
    or max(2k, kbar)) and delta' = delta - c threshold_delta; with ``rho=`` or
    ``tau=``, ``threshold_delta`` defaults to DEFAULT_DELTA / c and the claim is
    stated at delta = c threshold_delta + DEFAULT_DELTA.

    Work and memory: each cell is privatised exactly once, when it closes; a
    closing cell (l, j) with j a multiple of r is never part of any I_t (its
    parent closes at the same step and replaces it), so it is dropped without
    running the one-shot mechanism -- the same releases as computing and
    discarding it, since every cell has its own noise. Memory holds the block
    histograms of the open cells (one per level) and the noisy cells still in
    I_t (at most r - 1 per level, summed per level); a level's noisy cells are
    freed when its digit rolls over. Nothing grows with T for the known-domain
    variants (O(L_r d)); for the unknown-domain ones an open cell's histogram
    holds every distinct item seen in its span, so memory is O(distinct items).

    Args:
        horizon: T.
        oneshot: one of ``"gaussian"``, ``"gumbel"``, ``"unknown-gaussian"``,
            ``"unknown-gumbel"``.
        key: the secret key.
        base: r; ``None`` picks r*.
        domain: the known domain (known-domain variants only).
        k: items per release (``"gumbel"``, ``"unknown-gumbel"``).
        kbar: the unknown-domain cut-off (top kbar + 1 counts per cell).
        max_items: Delta0 (required by the Gaussian variants; for the Gumbel
            variants an optional cap on event size that does not change the
            guarantee).
        rho | epsilon, delta | tau: the budget, exactly one form.
        threshold_delta: the unknown-domain delta (per cell: threshold_delta / L_r).
        stream: separates this stream's noise from other streams under the key.
        noise_version: how Gaussians are drawn from the key: 2 (the default: the
            ziggurat) or 1 (the inverse CDF), only to go on with a stream that
            drew version 1 (dpstream 0.1, or 0.2 without ``noise_version``). A
            stream must keep its version: the two draw independent noise (see
            ``dpstream.noise``).
        on_invalid: ``"error"`` (default) or ``"truncate"``: keep ``max_items``
            of an event's items chosen by a keyed PRF and drop items outside a
            known domain (:class:`~dpstream.mechanisms.base.EventLimit`;
            ``.truncation`` counts what was dropped, not private).

    Example:
        >>> import dpstream as dps
        >>> m = dps.MetaHistogram(100, oneshot="gumbel", domain=["a", "b", "c"], k=1,
        ...                       key=dps.NoiseKey.generate(), rho=1.0)
        >>> m.step([]).meta["status"]  # nothing yet: no list drawn from noise alone
        'not yet'
        >>> rel = m.step_batch([["a", "b"]] * 100)  # 100 events stand out from the noise
        >>> rel.meta["status"], len(rel.counts)
        ('selected', 1)
    """

    mechanism_name = "MetaAlgo"
    # ContinualMechanism: lists of events, a tree (no choice of counter), event level.
    accepts_columns = False
    counter: str | None = None
    strategy: BLTStrategy | None = None
    unbounded = False
    user_bounds: UserBounds | None = None

    def __init__(
        self,
        horizon: int,
        *,
        oneshot: str,
        key: NoiseKey,
        base: int | None = None,
        domain: Iterable[Hashable] | None = None,
        k: int | None = None,
        kbar: int | None = None,
        max_items: int | None = None,
        rho: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        tau: float | None = None,
        threshold_delta: float | None = None,
        stream: str = "default",
        on_invalid: str = "error",
        noise_version: int = DEFAULT_NOISE_VERSION,
    ) -> None:
        self.noise_version = check_noise_version(noise_version)
        if oneshot not in ONESHOTS:
            raise ValueError(f"oneshot must be one of {ONESHOTS}, got {oneshot!r}")
        self.oneshot = oneshot
        self.horizon = check_horizon(horizon)
        self.base = check_base(base, self.horizon)
        self.stream = check_stream_name(stream)
        check_key(key)
        self.key = key
        self.levels = num_levels(self.horizon, self.base)
        known = not oneshot.startswith("unknown")
        gumbel = oneshot.endswith("gumbel")
        self._known, self._gumbel = known, gumbel

        # -- parameters each variant takes --------------------------------------
        if known:
            if domain is None:
                raise ValueError(f"oneshot={oneshot!r} needs domain= (the known domain)")
            items = domain_items(domain, key)
            # the domain in a compact table, and every release's items one read-only
            # sequence (see release_items)
            self._index = domain_table(items)
            self._domain_list = release_items(self._index, items)
            if kbar is not None:
                raise ValueError(f"kbar is for the unknown-domain variants, not {oneshot!r}")
            if threshold_delta is not None:
                raise ValueError(
                    f"threshold_delta is for the unknown-domain variants, not {oneshot!r}"
                )
        else:
            if domain is not None:
                raise ValueError(f"oneshot={oneshot!r} is for an unknown domain: give no domain=")
            self.kbar = check_int("kbar", kbar, 1)
        if gumbel:
            self.k = check_int("k", k, 1)
            if known and self.k > len(self._index):
                raise ValueError(
                    f"k must be at most the domain size ({len(self._index)}), got {self.k}"
                )
            if not known and self.k > self.kbar + 1:
                raise ValueError(f"k must be <= kbar + 1, got k={self.k} and kbar={self.kbar}")
            self.max_items = None if max_items is None else check_max_items(max_items)
        else:
            if k is not None:
                raise ValueError(f"k is for the Gumbel (top-k) variants, not {oneshot!r}")
            if max_items is None:
                raise ValueError(f"oneshot={oneshot!r} needs max_items= (Delta0)")
            self.max_items = check_max_items(max_items)

        self._limit = EventLimit(on_invalid, key=key, stream=self.stream, max_items=self.max_items)

        # -- budget ------------------------------------------------------------------
        self.theorem = _THEOREMS[oneshot]
        self._coef = self.k if gumbel else self._gaussian_max_items() / 2.0
        self.threshold_delta: float | None = None
        if known:
            self.budget, self.tau, self.privacy = resolve_privacy(
                rho=rho,
                epsilon=epsilon,
                delta=delta,
                tau=tau,
                coefficient=self._coef,
                gaussian_exact=not gumbel,
                mechanism=f"{self.mechanism_name}[{oneshot}]",
                theorem=self.theorem,
            )
        else:
            self._resolve_unknown_budget(rho, epsilon, delta, tau, threshold_delta)
        self.cell_tau = math.sqrt(self.levels) * self.tau
        self.cell_delta: float | None = (
            None if self.threshold_delta is None else self.threshold_delta / self.levels
        )
        # every cell purpose carries the noise-shaping settings (see base.config_tag)
        self.noise_scope = versioned_purpose(
            f"{self.stream}/meta-{oneshot}@"
            + config_tag(
                horizon=self.horizon,
                base=self.base,
                cell_tau=self.cell_tau,
                cell_delta=self.cell_delta,
                k=getattr(self, "k", None),
                kbar=getattr(self, "kbar", None),
                max_items=self.max_items,
                # a known domain decides which items count (and which events an
                # event limit truncates): another domain draws other noise
                **({"domain": domain_tag(items)} if known else {}),
            ),
            self.noise_version,
        )

        # -- state -----------------------------------------------------------------------
        self.t = 0
        self.started = oneshot != "gumbel"  # see "Not yet"
        self.start_z = float(
            -ndtri(0.05 / (getattr(self, "k", 1) * (self.base - 1) * self.levels * self.horizon))
        )
        if known:
            d = len(self._index)
            # keyed item ids do not depend on the purpose: hash the domain once
            self._ids = NoiseSource(key, self.noise_scope).item_ids(items)
            del items
            self._open = np.zeros((self.levels, d), dtype=np.int64)  # open block histograms
        else:
            self._open_maps: list[Counter[Hashable]] = [Counter() for _ in range(self.levels)]
        if oneshot == "gaussian":
            self._level_sum = np.zeros((self.levels, len(self._index)))
        else:
            self._level_maps: list[dict[Hashable, float]] = [{} for _ in range(self.levels)]

    def _gaussian_max_items(self) -> int:
        """Delta0 of a Gaussian variant, which needs it (``__init__`` checks it is given)."""
        if self.max_items is None:
            raise ValueError(f"oneshot={self.oneshot!r} needs max_items= (Delta0)")
        return self.max_items

    def _resolve_unknown_budget(
        self,
        rho: float | None,
        epsilon: float | None,
        delta: float | None,
        tau: float | None,
        threshold_delta: float | None,
    ) -> None:
        budget = privacy.resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=tau)
        self.budget = budget
        gauss = self.oneshot == "unknown-gaussian"
        c = self._gaussian_max_items() if gauss else max(2 * self.k, self.kbar)  # delta multiplier
        if threshold_delta is not None:
            if isinstance(threshold_delta, bool) or not isinstance(
                threshold_delta, (int, float, np.integer, np.floating)
            ):
                raise TypeError(
                    f"threshold_delta must be a real number, got {type(threshold_delta).__name__}"
                )
            if not 0.0 < threshold_delta < 1.0:
                raise ValueError(f"threshold_delta must be in (0, 1), got {threshold_delta!r}")
        a = self._coef
        if budget.kind == "epsilon-delta":
            assert budget.epsilon is not None and budget.delta is not None
            total = budget.delta
            thr = float(threshold_delta) if threshold_delta is not None else total / (2 * c)
            rho_delta = c * thr
            if rho_delta >= total:
                raise ValueError(
                    f"the threshold part of delta, {c} * threshold_delta = {rho_delta!r}, "
                    f"must be less than delta={total!r}"
                )
            conv = total - rho_delta
            if gauss:
                tau_value = privacy.calibrate_tau(
                    a=a, epsilon=budget.epsilon, delta=conv, gaussian_exact=True
                )
            else:
                tau_value = privacy.tau_for_rho(
                    privacy.rho_for_epsilon_delta(budget.epsilon, conv, "cks2020"), a
                )
        else:
            tau_value = budget.calibrate(a)
            thr = (
                float(threshold_delta) if threshold_delta is not None else privacy.DEFAULT_DELTA / c
            )
            rho_delta = c * thr
            total = rho_delta + privacy.DEFAULT_DELTA
            if total >= 1.0:
                raise ValueError(f"threshold_delta={threshold_delta!r} is too large")
        self.tau = float(tau_value)
        self.threshold_delta = thr
        name = f"{self.mechanism_name}[{self.oneshot}]"
        # (epsilon, delta): the exact Gaussian curve for UnkGauss, the CKS bound otherwise
        self.privacy = privacy.guarantee_for_tau(
            tau=self.tau,
            a=a,
            delta=total,
            rho_delta=rho_delta,
            gaussian_exact=gauss,
            mechanism=name,
            theorem=self.theorem,
            target_epsilon=budget.epsilon,
        )

    @property
    def domain(self) -> list[Hashable] | None:
        """The known domain's items, in release order (a new list), or None for the
        unknown-domain variants."""
        return list(self._domain_list) if self._known else None

    @property
    def domain_index(self) -> ItemTable | None:
        """The known domain's item table (see ``KnownDomainHistogram.domain_index``), or
        None for the unknown-domain variants. Shared, not copied: never add to it."""
        return self._index if self._known else None

    @property
    def noise_std_worst(self) -> float:
        """tau sqrt(worst-case variance factor of the tree): the worst-step std
        ``plan`` and the run's sidecar state for MetaAlgo."""
        return float(self.tau) * math.sqrt(worst_case_variance_factor(self.horizon, self.base))

    @property
    def truncation(self) -> TruncationStats:
        """What ``on_invalid="truncate"`` dropped so far. Not private."""
        return self._limit.stats

    # -- event mode ------------------------------------------------------------------
    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release."""
        return self.step_batch([event])

    @one_at_a_time
    def step_batch(self, events: Iterable[Iterable[Hashable]]) -> Release:
        """Take all events of the next time step (possibly none) and release.

        Every event is checked before anything changes.
        """
        t = self.t + 1
        check_next_step(t, self.t, self.horizon)
        checked, delta = self._limit.events(events, self._index if self._known else None, t=t)
        if self._known:
            idx: list[int] = []
            for items in checked:
                for item in items:
                    pos = self._index.get(item)
                    if pos is None:
                        raise InvalidEventError(f"item {item!r} is not in the domain")
                    idx.append(pos)
            inc = np.bincount(np.asarray(idx, dtype=np.int64), minlength=len(self._index))
            nz = np.flatnonzero(inc)
            self._open[:, nz] += inc[nz]
        else:
            batch: Counter[Hashable] = Counter()
            for items in checked:
                batch.update(items)
            for item in batch:
                encode_item(item)  # str, int or bytes: refuse others before any change
            for acc in self._open_maps:
                acc.update(batch)
        self._limit.commit(delta)
        self.t = t
        for level, j in cells_closing_at(t, self.horizon, self.base):
            row = level - 1
            if j % self.base == 0:
                # never in any I_t: its parent closes now and the level's digit rolls over
                if self.oneshot == "gaussian":
                    self._level_sum[row] = 0.0
                else:
                    self._level_maps[row] = {}
            else:
                self._store(row, self._noisy_cell(level, j))
            if self._known:
                self._open[row] = 0
            else:
                self._open_maps[row] = Counter()
        return self._release(t)

    @one_at_a_time
    def release(self, t: int, counts: object) -> Release:
        """Not available: MetaAlgo needs the block histograms of the cells, i.e. the events."""
        raise NotImplementedError(
            "MetaHistogram works in event mode only (step / step_batch): it needs the "
            "histogram of every tree cell, which a prefix histogram does not give"
        )

    # -- cells ---------------------------------------------------------------------------
    def cell_purpose(self, level: int, index: int) -> str:
        """The noise purpose of cell (level, index)."""
        return f"{self.noise_scope}/cell-{level}-{index}"

    def _noisy_cell(self, level: int, j: int) -> tuple[list[Hashable] | None, np.ndarray]:
        """Run the one-shot mechanism on the block histogram of the closed cell (level, j).

        Returns (items, values): items None means values are aligned with the domain.
        """
        purpose = self.cell_purpose(level, j)
        row = level - 1
        if self._known:
            hist = self._open[row]
            source = NoiseSource(self.key, purpose)
            prepared = source.prepare_ids(self._ids)
            if self.oneshot == "gaussian":
                return None, gaussian_kernel(source, prepared, hist, self.cell_tau)
            sel = gumbel_select_kernel(source, prepared, hist, self.k, self.cell_tau)
            values = gaussian_kernel(source, prepared.subset(sel), hist[sel], self.cell_tau)
            return take_items(self._domain_list, sel), values
        from ..oneshot import unknown  # lazy: the unknown-domain one-shots

        counts = dict(self._open_maps[row])
        # (the unknown-domain variants always have a threshold_delta, so a cell_delta)
        assert self.cell_delta is not None
        if self.oneshot == "unknown-gaussian":
            res = unknown.unknown_domain_gaussian(
                counts,
                kbar=self.kbar,
                tau=self.cell_tau,
                delta=self.cell_delta,
                key=self.key,
                purpose=purpose,
            )
        else:
            res = unknown.unknown_domain_gumbel(
                counts,
                k=self.k,
                kbar=self.kbar,
                tau=self.cell_tau,
                delta=self.cell_delta,
                key=self.key,
                purpose=purpose,
            )
        return list(res.items), np.asarray(res.values, dtype=np.float64)

    def _store(self, row: int, cell: tuple[list[Hashable] | None, np.ndarray]) -> None:
        items, values = cell
        if items is None:
            self._level_sum[row] += values
            return
        acc = self._level_maps[row]
        for item, v in zip(items, values.tolist(), strict=True):
            acc[item] = acc.get(item, 0.0) + v

    # -- release ---------------------------------------------------------------------------
    def _release(self, t: int) -> Release:
        if self.oneshot == "gaussian":
            total = np.zeros(len(self._index))
            for row in range(self.levels - 1, -1, -1):
                total += self._level_sum[row]
            return Release(t=t, items=self._domain_list, values=total)
        combined: dict[Hashable, float] = {}
        for row in range(self.levels - 1, -1, -1):
            for item, v in self._level_maps[row].items():
                combined[item] = combined.get(item, 0.0) + v
        items = list(combined)
        values = np.fromiter(combined.values(), dtype=np.float64, count=len(items))
        order = np.lexsort((np.arange(len(items)), -values))  # value desc, ties by first seen
        if self._gumbel:
            order = order[: self.k]
        if self.oneshot == "gumbel":
            if not self.started and len(order):
                sigma = math.sqrt(sum(digits(t, self.base))) * self.cell_tau
                self.started = bool(values[order[0]] > self.start_z * sigma)
            if not self.started:
                return Release(t=t, items=[], values=np.zeros(0), meta={"status": "not yet"})
            return Release(
                t=t,
                items=[items[i] for i in order],
                values=values[order],
                meta={"status": "selected"},
            )
        return Release(t=t, items=[items[i] for i in order], values=values[order])

    def __repr__(self) -> str:
        return (
            f"MetaHistogram(oneshot={self.oneshot!r}, T={self.horizon}, r={self.base}, "
            f"tau={self.tau:.4g}, t={self.t})"
        )
