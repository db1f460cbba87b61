"""Top-k as post-processing of a histogram, and the choice between it and SparseGumb.

Layer 5 of dpstream. When every event holds at most Delta0 items, KnownBase
(``algo:KnownBase``) releases a noisy count of every domain item at every
step, and UnkBase (``algo:UnkBase``) one of every item whose noisy count
clears its threshold; the k largest of those noisy counts are a top-k list at
no further privacy cost (post-processing). SparseGumb (``algo:sparseGumb``)
pays for k counters, s + 1 selections and the sparse vector, whatever the
event size. So for a bounded event size the three are alternatives for one
task, and :func:`choose_top_k` picks the one an item needs the smallest count
(or lead) to be listed by, computed from public parameters only.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import compiled
from .._checks import series_items
from ..noise import NoiseKey
from ..special import ndtri
from ..words import plain_mechanism
from .base import Release, check_in_domain, check_top_k, domain_items, take_items
from .columns import EventColumns, aggregate_raw, is_frame
from .item_table import ItemTable, domain_table
from .known import KnownDomainHistogram
from .serial import OneStream, one_at_a_time
from .topk import AUTO_ETA_BETA, ContinualTopK, default_switches, noise_eta
from .unknown import step_delta_divisor
from .users import UserEventColumns, refuse_unordered, split_user_event

if TYPE_CHECKING:
    from ..bounding import UserBounds

__all__ = ["HistogramTopK", "TopKChoice", "UnknownTopK", "choose_top_k", "top_k_errors"]


def _top_release(rel: Release, values: np.ndarray, idx: np.ndarray | None) -> Release:
    """A top-k list at step ``rel.t``: the items of ``rel`` at ``idx`` (largest first)
    with their ``values``, or (``idx`` None) the empty list of status "not yet"."""
    if idx is None:
        return Release(t=rel.t, items=[], values=np.zeros(0), meta={"status": "not yet"})
    return Release(
        t=rel.t, items=take_items(rel.items, idx), values=values[idx], meta={"status": "selected"}
    )


class HistogramTopK(OneStream):
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

    No planned end (``horizon=None``: KnownBase with the BLT fitted for every
    t): z_t = Phi^-1(1 - beta/(d t (t + 1))) at step t, so that the union
    bound over all t >= 1 is still beta (sum_t 1/(t (t + 1)) = 1).

    Privacy: exactly KnownBase's (the KnownBase lemma: Delta0/(2 tau^2)-zCDP,
    exact Gaussian curve for (epsilon, delta); for every t with no planned
    end); selecting, ordering and waiting are post-processing of its output.

    Args:
        domain, horizon, max_items, key: as for ``KnownDomainHistogram``
            (``horizon=None``: no planned end).
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
    # ContinualMechanism: step_batch hands its events to KnownBase, which takes
    # EventColumns (and a user level's columns) as they are.
    accepts_columns = True
    unbounded = False  # (set per instance; the default for states saved before)

    def __init__(
        self,
        domain: Iterable[Hashable],
        horizon: int | None,
        *,
        k: int,
        max_items: int,
        key: NoiseKey,
        **histogram: Any,
    ) -> None:
        self.histogram = KnownDomainHistogram(
            domain, horizon, max_items=max_items, key=key, **histogram
        )
        d = len(self.histogram.domain_index)
        self.k = check_top_k(k, d)
        h = self.histogram
        self.horizon, self.base, self.levels = h.horizon, h.base, h.levels
        self.counter, self.strategy, self.sigma = h.counter, h.strategy, h.sigma
        self.max_items, self.tau, self.budget = h.max_items, h.tau, h.budget
        self.privacy, self.theorem = h.privacy, h.theorem
        self.unbounded = bool(h.unbounded)
        self._d = d
        self.start_z = float(-ndtri(AUTO_ETA_BETA / (d * self.horizon)))
        self.started = False

    @property
    def t(self) -> int:
        return self.histogram.t

    @property
    def noise_version(self) -> int:
        """KnownBase's noise version (the one that draws this list's noise)."""
        return self.histogram.noise_version

    @property
    def user_bounds(self) -> UserBounds | None:
        """KnownBase's per-user bounds (user-level privacy), else None."""
        return self.histogram.user_bounds

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
        """z sigma_t: the largest noisy count must exceed it before the first list
        (z_t with no planned end, see the class doc)."""
        if self.unbounded:
            z = float(-ndtri(AUTO_ETA_BETA / (self._d * step_delta_divisor(t, t, True))))
            return z * self.noise_std_at(t)
        return self.start_z * self.noise_std_at(t)

    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release the top-k."""
        return self._top(self.histogram.step(event))

    @one_at_a_time
    def step_batch(self, events: Iterable[Iterable[Hashable]] | EventColumns) -> Release:
        """Take all the events of the next time step and release the top-k."""
        return self._top(self.histogram.step_batch(events))

    @one_at_a_time
    def release(
        self,
        t: int,
        counts: Mapping[Hashable, int] | Sequence[int] | np.ndarray,
        *,
        bounded: bool = False,
    ) -> Release:
        """Aggregate mode, as ``KnownDomainHistogram.release``."""
        return self._top(self.histogram.release(t, counts, bounded=bounded))

    def _top(self, rel: Release) -> Release:
        values = rel.values
        idx = compiled.top_k(values, self.k)
        if not self.started and values[idx[0]] > self.start_threshold_at(rel.t):
            self.started = True
        return _top_release(rel, values, idx if self.started else None)

    def __repr__(self) -> str:
        return (
            f"HistogramTopK(k={self.k}, d={len(self.histogram.domain_index)}, "
            f"T={self.horizon}, max_items={self.max_items}, tau={self.tau:.4g}, t={self.t})"
        )


class UnknownTopK(OneStream):
    """The top-k of UnkBase's noisy histogram at every step (post-processing).

    Runs :class:`~dpstream.UnknownDomainHistogram` over the events (every
    event must hold at most ``max_items`` = Delta0 items, all in ``domain``:
    an item outside it is refused, as by every top-k) and releases, at each
    step, the k items with the largest noisy counts among those UnkBase shows
    (their noisy count cleared the step's threshold m_t), largest first. Fewer
    than k items are released while fewer clear the threshold; none
    (``meta["status"] == "not yet"``) while none does. The threshold plays
    the role of KnownBase top-k's start test: an item that one event brought
    in is shown at some step with probability at most ``threshold_delta``
    (``lem:badOutcomes``), whatever the size of the domain, and only the
    items that appeared get noise (memory grows with them, not with d).

    Privacy: exactly UnkBase's (the UnkBase theorem: (eps(Delta0/(2 tau^2),
    delta'), Delta0 delta + delta'); for every t with no planned end); keeping
    the k largest of its release and checking the domain (a public list) are
    post-processing.

    Args:
        domain: the known items (public).
        horizon, max_items, key: as for ``UnknownDomainHistogram`` (``horizon=None``:
            no planned end).
        k: how many items to release, 1 <= k <= d.
        **histogram: every other keyword of ``UnknownDomainHistogram``.
    """

    mechanism_name = "UnkBase top-k"
    # ContinualMechanism: lists of events (counter, strategy and user_bounds are
    # UnkBase's, copied in __init__).
    accepts_columns = False
    unbounded = False  # (set per instance)

    def __init__(
        self,
        domain: Iterable[Hashable],
        horizon: int | None,
        *,
        k: int,
        max_items: int,
        key: NoiseKey,
        **histogram: Any,
    ) -> None:
        from .unknown import UnknownDomainHistogram

        self._index = domain_table(domain_items(domain, key))
        d = len(self._index)
        self.k = check_top_k(k, d)
        self.histogram = UnknownDomainHistogram(horizon, max_items=max_items, key=key, **histogram)
        h = self.histogram
        self.horizon, self.base, self.levels = h.horizon, h.base, h.levels
        self.max_items, self.tau, self.budget = h.max_items, h.tau, h.budget
        self.privacy, self.theorem = h.privacy, h.theorem
        self.threshold, self.threshold_delta = h.threshold, h.threshold_delta
        self.unbounded = bool(h.unbounded)
        for attr in ("counter", "strategy", "noise_version", "user_bounds"):
            if hasattr(h, attr):
                setattr(self, attr, getattr(h, attr))

    @property
    def t(self) -> int:
        return self.histogram.t

    @property
    def domain(self) -> list[Hashable]:
        """The domain's items, in order (a new list)."""
        return self._index.to_list()

    @property
    def domain_index(self) -> ItemTable:
        """The domain's item table. Shared, not copied: never add to it."""
        return self._index

    @property
    def noise_std_worst(self) -> float:
        return self.histogram.noise_std_worst

    def noise_std_at(self, t: int) -> float:
        return self.histogram.noise_std_at(t)

    def threshold_worst(self) -> float:
        """The largest step threshold m_t over t <= T (a count shown half the time there)."""
        from .unknown import threshold_profile

        return threshold_profile(self.histogram)["threshold_worst"]

    def threshold_at(self, t: int) -> float:
        """UnkBase's m_t: an item is listed at t only once its noisy count passes it."""
        return self.histogram.threshold_at(t)

    def _check(self, events: Iterable[Any]) -> Any:
        if isinstance(events, UserEventColumns):
            cols = events.events
            used = [cols.items[i] for i in np.unique(cols.codes).tolist()]
            if all(item in self._index for item in used):
                return events
            events = events.pairs()  # the loop below raises the first event's error
        checked = []
        users = self.histogram.user_bounds is not None
        if users:  # (review 123: the order of a user's items, before they are made tuples)
            refuse_unordered(events)
        for event in events:  # each event's items read once: a generator is checked, then
            # counted from the tuple (review 112: it was counted empty, once exhausted)
            items: Any = split_user_event(event)[1] if users else event
            if not isinstance(items, (str, bytes)):
                items = tuple(items)
            check_in_domain([items] if isinstance(items, (str, bytes)) else items, self._index)
            checked.append((event[0], items) if users else items)
        return checked

    @one_at_a_time
    def step(self, event: Iterable[Hashable]) -> Release:
        """Take one event as the next time step and release the top-k."""
        return self.step_batch([event])

    def step_batch(self, events: Iterable[Iterable[Hashable]]) -> Release:
        """Take all the events of the next time step and release the top-k."""
        return self._top(self.histogram.step_batch(self._check(events)))

    def release(
        self,
        t: int,
        counts: Mapping[Hashable, int] | Any,
        values: Sequence[int] | np.ndarray | None = None,
        *,
        bounded: bool = False,
    ) -> Release:
        """Aggregate mode, as ``UnknownDomainHistogram.release``: a Mapping item -> count,
        a pandas Series indexed by item, the items and their counts as two arrays, or a
        frame with columns ``item`` and ``count``; every item must be in the domain."""
        if values is not None or is_frame(counts):
            items, vals = aggregate_raw(counts, values)  # the items, not a frame's columns
            check_in_domain(list(items), self._index)  # (review 112)
            return self._top(self.histogram.release(t, items, vals, bounded=bounded))
        as_mapping = series_items(counts)
        check_in_domain(as_mapping, self._index)  # type: ignore[arg-type]
        return self._top(self.histogram.release(t, as_mapping, bounded=bounded))

    def _top(self, rel: Release) -> Release:
        values = np.asarray(rel.values, dtype=np.float64)
        n = values.shape[0]
        return _top_release(rel, values, compiled.top_k(values, min(self.k, n)) if n else None)

    def __repr__(self) -> str:
        return (
            f"UnknownTopK(k={self.k}, d={len(self._index)}, T={self.horizon}, "
            f"max_items={self.max_items}, tau={self.tau:.4g}, t={self.t})"
        )


@dataclass(frozen=True)
class TopKChoice:
    """The outcome of :func:`choose_top_k`.

    Attributes:
        mechanism: the chosen mechanism (built, ready to run).
        name: ``"KnownBase top-k"``, ``"UnkBase top-k"`` or ``"SparseGumb"``.
        errors: candidate name -> the count (or lead) an item needs to be
            listed half the time at the worst step (the number compared; see
            :func:`top_k_errors`).
        noise_std: candidate name -> noise std of a released count at the
            worst step.
        switches: SparseGumb's s (given, or :func:`~dpstream.mechanisms.topk.
            default_switches`).
        reason: the comparison in words.
    """

    mechanism: Any
    name: str
    errors: dict[str, float]
    noise_std: dict[str, float]
    switches: int
    reason: str


def top_k_errors(candidates: Mapping[str, Any]) -> dict[str, float]:
    """For each built candidate, the count an item needs to be listed half the time at
    the worst step t <= T: a function of public parameters only, never of the data.

    * KnownBase top-k: the list starts once the largest noisy count clears
      z sigma_t (``HistogramTopK.start_threshold_at``), z = Phi^-1(1 - beta/(d T));
      the error is z max_t sigma_t (a count of that size is above it half the
      time at the worst step).
    * UnkBase top-k: an item is shown once its noisy count clears m_t; the
      error is max_t m_t (``UnknownTopK.threshold_worst``).
    * SparseGumb: an item outside the list must lead the list's smallest
      noisy count by eta_t to set off a re-selection (half the time when it
      leads by exactly eta_t; and the first list waits for the k-th count to
      clear eta0 <= eta_t); the error is max_t eta_t, i.e. with the automatic
      eta the quantile at the worst counter variance (``noise_eta``), with a
      given eta its largest value.

    Once a list is out, KnownBase's and UnkBase's follow the noisy counts at
    every step (an item that leads is listed half the time or more), so these
    numbers are the price of a list's first showing and, for SparseGumb, of
    every change of its list.

    With no planned end (``unbounded`` candidates, the histograms' top-k only)
    there is no worst step: both numbers are taken at step
    :data:`UNBOUNDED_REFERENCE_STEP` (10^6, where UnkBase's delta split is
    tuned too).
    """
    out: dict[str, float] = {}
    for name, mech in candidates.items():
        ref = UNBOUNDED_REFERENCE_STEP if getattr(mech, "unbounded", False) else None
        if isinstance(mech, HistogramTopK):
            out[name] = (
                mech.start_z * mech.noise_std_worst if ref is None else mech.start_threshold_at(ref)
            )
        elif isinstance(mech, UnknownTopK):
            out[name] = mech.threshold_worst() if ref is None else mech.threshold_at(ref)
        else:
            out[name] = _sparse_eta_worst(mech)
    return out


#: The step at which :func:`top_k_errors` compares the histograms' top-k of a stream
#: with no planned end.
UNBOUNDED_REFERENCE_STEP = 1_000_000


def _sparse_eta_worst(mech: ContinualTopK) -> float:
    eta = mech._eta
    if isinstance(eta, str):  # "auto": the quantile grows with the counter variance
        if mech.rounds == 0:
            return 0.0
        worst = mech.noise_std_worst**2
        level = mech.beta / mech.horizon
        return max(
            noise_eta(tau_1=mech.tau_1, variance=worst, level=level),
            mech.start_eta_at(1) if mech.wait else 0.0,
        )
    if isinstance(eta, np.ndarray):
        return float(eta.max())
    return float(eta)


#: Preference on equal errors: the histograms' lists follow every step for free.
_ORDER = ("KnownBase top-k", "UnkBase top-k", "SparseGumb")


#: Why :func:`choose_top_k` takes a budget and not ``tau``: one tau is a different
#: privacy level for each candidate (SparseGumb's selections, KnownBase's Delta0/(2
#: tau^2) and UnkBase's threshold spend it differently), so comparing their errors at
#: one tau would compare a weaker guarantee's error with a stronger one's.
TAU_CHOICE_REFUSAL = (
    "tau (--tau) fixes the noise, not the privacy: top-k with --max-items chooses "
    "between top-k with switches and the known- and unknown-domain histograms' top-k, "
    "and at one tau each has its own guarantee, so their errors are not comparable. "
    "Give the budget instead (rho= or epsilon=/delta=; --rho, or --epsilon and "
    "--delta), or leave out --max-items to run top-k with switches at that tau"
)


def choose_top_k(
    domain: Iterable[Hashable],
    horizon: int | None,
    *,
    k: int,
    max_items: int,
    key: NoiseKey,
    switches: int | None = None,
    **kwargs: Any,
) -> TopKChoice:
    """Build SparseGumb, KnownBase's top-k and UnkBase's top-k for the same budget; keep
    the one whose items need the smallest count to be listed (:func:`top_k_errors`).

    All three are built with the same budget keywords and compared on public
    parameters only (never the data). UnkBase's top-k is left out when it
    cannot be built from the keywords (with ``rho=`` or ``tau=`` it needs
    ``threshold_delta=``; a keyword it does not take, e.g. a counter it does
    not have). The histograms' lists need every event to hold at most
    ``max_items`` items (more are refused, or truncated with ``on_invalid``);
    their undercount of truncated events is not part of the comparison (it
    depends on the data).

    No planned end (``horizon=None``): only the histograms' top-k, on the BLT
    fitted for every t (:func:`_choose_unbounded`); SparseGumb needs T.

    Args:
        domain, horizon, k, key: as for the mechanisms.
        max_items: Delta0 for KnownBase and UnkBase.
        switches: SparseGumb's s; None: :func:`~dpstream.mechanisms.topk.default_switches`.
        **kwargs: the budget and other keywords; ``eta`` and ``wait`` go to
            SparseGumb alone, ``threshold_delta`` to UnkBase alone. ``tau`` is
            refused (:data:`TAU_CHOICE_REFUSAL`): the candidates are compared at one
            privacy budget, which one tau is not.
    """
    if kwargs.get("tau") is not None:
        raise ValueError(TAU_CHOICE_REFUSAL)
    domain = list(domain)
    sparse_only, unknown_only = {"eta", "wait"}, {"threshold_delta"}
    if horizon is None:
        return _choose_unbounded(
            domain, k=k, max_items=max_items, key=key, switches=switches, **kwargs
        )
    if switches is None:
        switches = default_switches(horizon)
    shared = {n: v for n, v in kwargs.items() if n not in sparse_only | unknown_only}
    candidates: dict[str, Any] = {
        "SparseGumb": ContinualTopK(
            domain,
            horizon,
            k=k,
            switches=switches,
            key=key,
            **{n: v for n, v in kwargs.items() if n not in unknown_only},
        ),
        "KnownBase top-k": HistogramTopK(
            domain, horizon, k=k, max_items=max_items, key=key, **shared
        ),
    }
    unknown = _unknown_candidate(
        domain,
        horizon,
        k=k,
        max_items=max_items,
        key=key,
        **shared,
        **{n: v for n, v in kwargs.items() if n in unknown_only},
    )
    if unknown is not None:
        candidates["UnkBase top-k"] = unknown
    errors = top_k_errors(candidates)
    stds = {n: float(m.noise_std_worst) for n, m in candidates.items()}
    name = min(errors, key=lambda n: (errors[n], _ORDER.index(n)))
    others = ", ".join(
        f"{plain_mechanism(n)} {errors[n]:.4g}" for n in _ORDER if n in errors and n != name
    )
    reason = (
        f"{plain_mechanism(name)}: an item needs a count (or, for top-k with switches, a "
        "lead over the list) of "
        f"about {errors[name]:.4g} to be listed half the time at the worst step, against "
        f"{others} (computed from the budget, --horizon, --k, --max-items, the domain size "
        f"and s = {switches} switches; never from the data). Noise std of a released count "
        f"at the worst step: {stds[name]:.4g}. The histograms' lists are the k "
        f"largest counts of a histogram of every item (at most {max_items} per event), "
        "re-read at every step for free; top-k with switches pays for "
        f"{switches + 1} selections of {k} items and the sparse vector, whatever the event "
        "size, and changes its list only when an item leads by eta."
    )
    return TopKChoice(
        mechanism=candidates[name],
        name=name,
        errors=errors,
        noise_std=stds,
        switches=int(switches),
        reason=reason,
    )


def _choose_unbounded(
    domain: list[Hashable],
    *,
    k: int,
    max_items: int,
    key: NoiseKey,
    switches: int | None,
    **kwargs: Any,
) -> TopKChoice:
    """:func:`choose_top_k` for a stream with no planned end: KnownBase's or UnkBase's
    top-k on the BLT fitted for every t. SparseGumb spreads its switches and the
    quantiles of its gap over T, so it is no candidate; its own settings are refused."""
    sparse = sorted(n for n in ("eta", "wait") if kwargs.get(n) not in (None, "auto"))
    if switches is not None or sparse:
        given = ["switches"] * (switches is not None) + sparse
        raise ValueError(
            f"{', '.join('--' + n for n in given)}: a setting of top-k with switches, "
            "which needs --horizon; without --horizon the top-k is read off the "
            "known- or unknown-domain histogram, which has no switches"
        )
    kwargs = {n: v for n, v in kwargs.items() if n not in ("eta", "wait")}
    shared = {n: v for n, v in kwargs.items() if n != "threshold_delta"}
    candidates: dict[str, Any] = {
        "KnownBase top-k": HistogramTopK(domain, None, k=k, max_items=max_items, key=key, **shared)
    }
    unknown = _unknown_candidate(domain, None, k=k, max_items=max_items, key=key, **kwargs)
    if unknown is not None:
        candidates["UnkBase top-k"] = unknown
    errors = top_k_errors(candidates)
    at = UNBOUNDED_REFERENCE_STEP
    stds = {n: float(m.noise_std_worst) for n, m in candidates.items()}  # at 2^40
    name = min(errors, key=lambda n: (errors[n], _ORDER.index(n)))
    others = ", ".join(
        f"{plain_mechanism(n)} {errors[n]:.4g}" for n in _ORDER if n in errors and n != name
    )
    reason = (
        f"{plain_mechanism(name)}: with no --horizon (a stream with no planned end) the "
        "top-k is read off a histogram whose noise holds for every t; an item needs a "
        f"count of about {errors[name]:.4g} to be listed half the time at step {at:,}"
        + (f", against {others}" if others else "")
        + " (computed from the budget, --k, --max-items and the domain size; never from "
        f"the data). Noise std of a released count at step {at:,}: "
        f"{candidates[name].noise_std_at(at):.4g}. "
        "Top-k with switches needs --horizon (its switches are spread over T)."
    )
    return TopKChoice(
        mechanism=candidates[name],
        name=name,
        errors=errors,
        noise_std=stds,
        switches=0,
        reason=reason,
    )


def _unknown_candidate(domain: list[Hashable], horizon: int | None, **kwargs: Any) -> Any:
    """UnknownTopK from ``kwargs``, or None when UnkBase cannot run with them."""
    from .unknown import UnknownDomainHistogram

    params = inspect.signature(UnknownDomainHistogram).parameters
    if "counter" not in params and kwargs.get("counter") == "tree":
        kwargs = {n: v for n, v in kwargs.items() if n != "counter"}  # its only counter
    if any(n not in params for n in kwargs if n not in ("k", "max_items", "key")):
        return None
    if kwargs.get("epsilon") is None and kwargs.get("threshold_delta") is None:
        return None  # rho= or tau= alone: UnkBase needs the delta of its threshold
    return UnknownTopK(domain, horizon, **kwargs)
