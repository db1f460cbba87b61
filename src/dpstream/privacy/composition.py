"""Composition: the total cost of several releases of one dataset, and a cap on it.

Layer 1 of dpstream (docs/architecture.md): pure values and functions.

Every release of a dataset spends privacy on the same people, whatever stream
or mechanism it uses, so the costs add up. Two analyses bound the total, and
both are valid, so the smaller epsilon at a given delta is reported:

* zCDP composition (paper, lem:zCDP_Comp): delta-approximate rho-zCDP
  guarantees compose by adding ``rho`` and adding ``rho_delta``; the total is
  then converted to (epsilon, delta) by CKS20 at ``delta - sum(rho_delta)``.
* Basic composition of the claims themselves: (epsilon_i, delta_i)-DP
  releases together are (sum epsilon_i, sum delta_i)-DP. For one release this
  is its own claim, which may be tighter than the zCDP conversion (a claim
  from the exact Gaussian curve, say).

Units: the total of releases at both units is an event-level total; it is a
user-level total only when every release is user-level and one field names the
users of all (a per-account and a per-device release bound no one notion of
person together; each is also an event-level guarantee, below). A user-level release
counts in an event-level total at what it costs two inputs that differ in one
event (:func:`in_events`). Those are not neighbours in users: first come,
first kept bounding keeps, in the input without the event, a later
contribution of the same user that the cap left out of the other, so the
user's kept contributions change in both directions. The two inputs are two
user-level neighbour steps apart (through the input without that user), and
group privacy for two gives 4 rho (Bun & Steinke 2016, Proposition 27). The
delta paid outside zCDP, an unknown domain's threshold (the chance that an item
only one input holds passes it, summed over such items), covers twice the items
and doubles. The user-level numbers themselves would understate it: over a
tree of 4 steps with one item per user, the counts of two such inputs differ
by sqrt(2) times the user-level sensitivity (rho doubles; 4 rho bounds every
mechanism, the top-k selections included).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ._checks import _check_open_unit, _check_positive
from .budgets import PrivacyLedger
from .conversions import epsilon_cks
from .guarantees import UNITS, PrivacyGuarantee

__all__ = ["BudgetCap", "Composed", "Spend", "compose", "costlier", "in_events"]


@dataclass(frozen=True)
class Spend:
    """One release's cost on a dataset (from its :class:`PrivacyGuarantee`).

    Attributes:
        rho, rho_delta: its zCDP cost (``rho_delta``: the delta paid outside zCDP).
        epsilon, delta: its (epsilon, delta)-DP claim.
        unit: ``"event"`` or ``"user"``.
        label: what it was (shown in reports), e.g. the stream and the mechanism.
        user_field: for a user-level cost, what names the user (``--user-field``;
            ``""``: not recorded). Costs per user add up per user only when one field
            names the users of all of them: a per-account and a per-device release
            bound no one notion of person together, so their total is per event.
    """

    rho: float
    rho_delta: float
    epsilon: float
    delta: float
    unit: str
    label: str
    user_field: str = ""

    def __post_init__(self) -> None:
        _check_positive("rho", self.rho)
        if not 0.0 <= self.rho_delta < self.delta < 1.0 or not 0.0 <= self.epsilon < math.inf:
            raise ValueError(f"not a valid privacy cost: {self!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {tuple(UNITS)}, got {self.unit!r}")

    @classmethod
    def of(cls, guarantee: PrivacyGuarantee, label: str, user_field: str = "") -> Spend:
        """The cost of a release whose mechanism reports ``guarantee`` (``user_field``:
        what names its users, kept for a user-level guarantee only)."""
        return cls(
            rho=guarantee.rho,
            rho_delta=guarantee.rho_delta,
            epsilon=guarantee.epsilon,
            delta=guarantee.delta,
            unit=guarantee.unit,
            label=label,
            user_field=user_field if guarantee.unit == "user" else "",
        )

    @property
    def protects(self) -> tuple[str, str]:
        """Whom the cost is per: (unit, the field naming the users)."""
        return self.unit, self.user_field


@dataclass(frozen=True)
class BudgetCap:
    """The most a dataset may spend: (epsilon, delta)-DP in all."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        _check_positive("epsilon", self.epsilon)
        _check_open_unit("delta", self.delta)


@dataclass(frozen=True)
class Composed:
    """The total of several releases of one dataset (see the module docstring).

    Attributes:
        releases: how many releases it adds up.
        rho, rho_delta: the zCDP total.
        epsilon_sum, delta_sum: the basic-composition total of the claims.
        unit: ``"user"`` when every release is user-level, else ``"event"``.
    """

    releases: int
    rho: float
    rho_delta: float
    epsilon_sum: float
    delta_sum: float
    unit: str

    def epsilon_at(self, delta: float) -> float:
        """The smallest epsilon either analysis proves at ``delta`` (``inf``: none does)."""
        if self.releases == 0:
            return 0.0
        best = math.inf
        if self.rho_delta < delta < 1.0:
            best = epsilon_cks(self.rho, delta - self.rho_delta)
        if self.delta_sum <= delta:
            best = min(best, self.epsilon_sum)
        return best

    def within(self, cap: BudgetCap) -> bool:
        """Whether the total is (cap.epsilon, cap.delta)-DP by either analysis."""
        return self.epsilon_at(cap.delta) <= cap.epsilon

    def plain(self, delta: float) -> str:
        """The total in plain words at ``delta``."""
        if self.releases == 0:
            return "nothing spent yet"
        eps = self.epsilon_at(delta)
        eps_text = f"{eps:.6g}" if math.isfinite(eps) else "unbounded"
        return (
            f"epsilon = {eps_text}, delta = {delta:.3g} per {self.unit} over "
            f"{self.releases} release(s) (rho-zCDP with rho = {self.rho:.6g}"
            + (f", plus {self.rho_delta:.3g} of delta" if self.rho_delta else "")
            + ")"
        )


def in_events(spend: Spend) -> Spend:
    """``spend`` stated per event: an event-level one as it is, a user-level one at
    group privacy for two (see the module docstring): 4 rho, twice ``rho_delta``,
    and the claim at twice its delta that this zCDP cost gives (CKS20).

    Raises ValueError when twice the delta is not below 1 (no such claim).
    """
    if spend.unit == "event":
        return spend
    rho, rho_delta, delta = 4.0 * spend.rho, 2.0 * spend.rho_delta, 2.0 * spend.delta
    if not delta < 1.0:
        raise ValueError(f"a user-level delta of {spend.delta!r} has no event-level claim")
    return Spend(
        rho=rho,
        rho_delta=rho_delta,
        epsilon=epsilon_cks(rho, delta - rho_delta),
        delta=delta,
        unit="event",
        label=spend.label,
    )


def costlier(a: Spend, b: Spend) -> Spend:
    """A cost that bounds both ``a`` and ``b``: each number the larger of the two
    (at one unit: per event when they differ, or name users by different fields). The
    ledger counts the runs of one noise scope on a dataset once (``--force`` says only
    one was published), at this."""
    if a.protects != b.protects:
        a, b = in_events(a), in_events(b)
    return Spend(
        rho=max(a.rho, b.rho),
        rho_delta=max(a.rho_delta, b.rho_delta),
        epsilon=max(a.epsilon, b.epsilon),
        delta=max(a.delta, b.delta),
        unit=a.unit,
        label=a.label,
        user_field=a.user_field,
    )


def compose(spends: Iterable[Spend]) -> Composed:
    """The total of ``spends`` (order does not matter; sums are exactly rounded). With
    both units among them, or user-level ones whose users different fields name, every
    cost counts per event (:func:`in_events`)."""
    items = list(spends)
    if len({s.protects for s in items}) > 1:
        items = [in_events(s) for s in items]
    zcdp = PrivacyLedger()
    for s in items:
        zcdp.spend(s.rho, s.label)
    return Composed(
        releases=len(items),
        rho=zcdp.spent,
        rho_delta=math.fsum(s.rho_delta for s in items),
        epsilon_sum=math.fsum(s.epsilon for s in items),
        delta_sum=math.fsum(s.delta for s in items),
        unit="user" if items and all(s.unit == "user" for s in items) else "event",
    )
