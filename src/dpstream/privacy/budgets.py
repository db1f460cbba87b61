"""Budgets: a mechanism's privacy argument, the noise scale it asks for, and composition.

Layer 1 of dpstream (docs/architecture.md). Every mechanism accepts ``rho=``,
or ``epsilon=`` with ``delta=``, or a raw noise scale ``tau=``:
:func:`resolve_budget` checks which form was given and returns a
:class:`Budget`, and :func:`calibrate_tau` (or :meth:`Budget.calibrate`) turns
it into the smallest noise scale that meets it. :class:`PrivacyLedger` adds up
the zCDP costs of composed mechanisms. ``calibrate_tau`` lives here rather than
in :mod:`.calibration` because it and ``Budget`` use each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dpstream.errors import BudgetExhaustedError

from ._checks import (
    _check_budget_range,
    _check_delta_range,
    _check_open_unit,
    _check_positive,
    _check_real,
    _check_str,
)
from .calibration import mu_for_gaussian, rho_for_epsilon_delta, tau_for_rho
from .conversions import _gaussian_delta, epsilon_cks
from .guarantees import DEFAULT_DELTA

BudgetKind = Literal["rho", "epsilon-delta", "tau"]


@dataclass(frozen=True)
class Budget:
    """The privacy argument of a mechanism after :func:`resolve_budget` checked it.

    Exactly one form is set: ``kind == "rho"`` (``rho``), ``"epsilon-delta"``
    (``epsilon`` and ``delta``) or ``"tau"`` (a noise scale chosen by the user);
    the other fields are ``None``.
    """

    kind: BudgetKind
    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    tau: float | None = None

    def __post_init__(self) -> None:
        expected = {
            "rho": ("rho",),
            "epsilon-delta": ("epsilon", "delta"),
            "tau": ("tau",),
        }
        if self.kind not in expected:
            raise ValueError(f"kind must be one of {tuple(expected)}, got kind={self.kind!r}")
        for name in ("rho", "epsilon", "delta", "tau"):
            value = getattr(self, name)
            if (value is not None) != (name in expected[self.kind]):
                raise ValueError(
                    f"a Budget of kind {self.kind!r} needs exactly {expected[self.kind]}, "
                    f"got {name}={value!r}"
                )

    @property
    def reporting_delta(self) -> float:
        """The delta at which to state the (epsilon, delta) claim: the user's delta,
        or :data:`DEFAULT_DELTA` for the rho and tau forms."""
        return self.delta if self.delta is not None else DEFAULT_DELTA

    def calibrate(self, a: float, *, gaussian_exact: bool = False) -> float:
        """The noise scale tau for a mechanism with coefficient ``a``.

        The user's tau for ``kind == "tau"``, else :func:`calibrate_tau`.
        """
        if self.kind == "tau":
            assert self.tau is not None
            return self.tau
        return calibrate_tau(
            a=a, rho=self.rho, epsilon=self.epsilon, delta=self.delta, gaussian_exact=gaussian_exact
        )


def resolve_budget(
    *,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    tau: float | None = None,
) -> Budget:
    """Check a mechanism's privacy keyword arguments and say which form was given.

    Every mechanism accepts ``rho=``, or ``epsilon=`` with ``delta=``, or ``tau=``
    (a raw noise scale), and exactly one of these forms.

    Args:
        rho: Target zCDP parameter, positive and finite.
        epsilon: Target epsilon, positive and finite; needs ``delta``.
        delta: Target delta, in (0, 1); needs ``epsilon``.
        tau: Noise scale, positive and finite.

    Returns:
        A :class:`Budget` with the values converted to ``float``.

    Raises:
        TypeError: A given value is not a real number (``bool`` is not one).
        ValueError: No form, more than one form, ``epsilon`` without ``delta``
            or the reverse, or a value out of range (rho, epsilon and tau also
            outside the range the calibration's float arithmetic supports:
            ``RHO_RANGE``, ``EPSILON_RANGE``, ``TAU_RANGE``, ``DELTA_MAX``); the
            message names the parameter and the value received.
    """
    given = {
        name: value
        for name, value in (("rho", rho), ("epsilon", epsilon), ("delta", delta), ("tau", tau))
        if value is not None
    }
    for name, value in given.items():
        _check_real(name, value)
    forms = [
        form
        for form, present in (
            ("rho", rho is not None),
            ("epsilon-delta", epsilon is not None or delta is not None),
            ("tau", tau is not None),
        )
        if present
    ]
    usage = "give exactly one of rho=, epsilon= with delta=, or tau="
    if not forms:
        raise ValueError(f"{usage} (got none of rho, epsilon, delta, tau)")
    if len(forms) > 1:
        got = [f"{name}={value!r}" for name, value in given.items()]
        listed = ", ".join(got[:-1]) + " and " + got[-1]
        raise ValueError(f"{usage} (got {listed})")
    kind = forms[0]
    if kind == "rho":
        return Budget(kind="rho", rho=_check_budget_range("rho", _check_positive("rho", rho)))
    if kind == "tau":
        return Budget(kind="tau", tau=_check_budget_range("tau", _check_positive("tau", tau)))
    if delta is None:
        raise ValueError(f"epsilon={epsilon!r} needs delta= as well (got delta=None)")
    if epsilon is None:
        raise ValueError(f"delta={delta!r} needs epsilon= as well (got epsilon=None)")
    return Budget(
        kind="epsilon-delta",
        epsilon=_check_budget_range("epsilon", _check_positive("epsilon", epsilon)),
        delta=_check_delta_range(_check_open_unit("delta", delta)),
    )


def calibrate_tau(
    *,
    a: float,
    rho: float | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    gaussian_exact: bool = False,
) -> float:
    """Smallest noise scale tau that meets a privacy target, by the tightest valid analysis.

    The mechanism is ``a / tau**2``-zCDP. With ``rho=`` the answer is
    :func:`tau_for_rho`. With ``epsilon=`` and ``delta=``:

    * ``gaussian_exact=True`` -- only for a mechanism that is exactly a Gaussian
      mechanism with ``mu = sqrt(2 a) / tau`` (e.g. KnownBase's partial-sum table):
      ``tau = sqrt(2 a) / mu_for_gaussian(epsilon, delta)``, rounded up.
    * otherwise the CKS20 conversion: ``tau_for_rho(rho_for_epsilon_delta(...))``.

    Args:
        a: Coefficient of the mechanism, > 0.
        rho: Target zCDP parameter; exclusive with ``epsilon``/``delta``.
        epsilon: Target epsilon, > 0; needs ``delta``.
        delta: Target delta, in (0, 1); needs ``epsilon``.
        gaussian_exact: Whether the exact Gaussian curve applies.

    Returns:
        tau > 0.

    Raises:
        TypeError: A non-numeric argument.
        ValueError: Out-of-range values, or not exactly one target given.
    """
    a = _check_positive("a", a)
    budget = resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=None)
    if budget.kind == "rho":
        assert budget.rho is not None
        return tau_for_rho(budget.rho, a)
    assert budget.epsilon is not None and budget.delta is not None
    eps, dlt = budget.epsilon, budget.delta
    if gaussian_exact:
        sens = math.sqrt(2.0 * a)
        tau = math.nextafter(sens / mu_for_gaussian(eps, dlt), math.inf)
        while _gaussian_delta(eps, sens / tau) > dlt:
            tau = math.nextafter(tau, math.inf)
        return tau
    tau = tau_for_rho(rho_for_epsilon_delta(eps, dlt, "cks2020"), a)
    while epsilon_cks(a / (tau * tau), dlt) > eps:  # pragma: no cover - belt and braces
        tau = math.nextafter(tau, math.inf)
    return tau


# --------------------------------------------------------------------------- composition


class PrivacyLedger:
    """Adds up the zCDP costs of composed mechanisms (paper, lem:zCDP_Comp).

    The total is kept as an exactly rounded sum (``math.fsum``) of the entries,
    and a spend is refused, before anything is recorded, if it would push the
    total past the budget.

    :func:`dpstream.privacy.compose` uses it for the zCDP total of a dataset's
    releases (the budget of ``dpstream budget``).

    Args:
        rho_budget: The total rho allowed, positive and finite; ``None`` records
            without a limit.

    Example:
        >>> ledger = PrivacyLedger(rho_budget=1.0)
        >>> ledger.spend(0.25, "counter")
        >>> ledger.spent, ledger.remaining
        (0.25, 0.75)
    """

    def __init__(self, rho_budget: float | None = None) -> None:
        self._budget = None if rho_budget is None else _check_positive("rho_budget", rho_budget)
        self._entries: list[tuple[str, float]] = []
        self._spent = 0.0

    @property
    def rho_budget(self) -> float | None:
        """The total rho allowed, or ``None``."""
        return self._budget

    @property
    def spent(self) -> float:
        """The rho spent so far."""
        return self._spent

    @property
    def remaining(self) -> float | None:
        """The rho still available (never negative), or ``None`` without a budget."""
        if self._budget is None:
            return None
        return max(0.0, self._budget - self._spent)

    @property
    def entries(self) -> tuple[tuple[str, float], ...]:
        """The recorded spends as ``(label, rho)`` pairs, oldest first."""
        return tuple(self._entries)

    def spend(self, rho: float, label: str) -> None:
        """Record a rho-zCDP cost under ``label``.

        Args:
            rho: The cost, positive and finite.
            label: What it pays for (shown in plans and errors).

        Raises:
            TypeError: ``rho`` not a real number or ``label`` not a str.
            ValueError: ``rho`` not positive and finite.
            BudgetExhaustedError: The new total would exceed ``rho_budget``;
                nothing is recorded then.
        """
        rho = _check_positive("rho", rho)
        _check_str("label", label)
        total = math.fsum([r for _, r in self._entries] + [rho])
        if self._budget is not None and total > self._budget:
            raise BudgetExhaustedError(
                f"spending rho={rho!r} for {label!r} would bring the total to {total!r}, "
                f"over the budget rho_budget={self._budget!r} (spent {self._spent!r})"
            )
        self._entries.append((label, rho))
        self._spent = total

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(rho_budget={self._budget!r}, spent={self._spent!r}, "
            f"entries={len(self._entries)})"
        )
