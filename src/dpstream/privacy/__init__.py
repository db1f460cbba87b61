"""Privacy guarantees, conversions between them, and calibration of the noise scale.

This is layer 1 of dpstream (docs/architecture.md): pure functions and immutable
values, no noise and no I/O. Every mechanism of the library states its cost here,
so that the number a mechanism reports in ``mechanism.privacy`` and the number
``dpstream plan`` prints are computed by the same code.

The analyses of the paper are in zero-concentrated DP (zCDP, Bun & Steinke 2016):
all mechanisms of dpstream are ``rho``-zCDP with ``rho(tau) = a / tau**2`` for a
mechanism-specific coefficient ``a``. zCDP composes by adding ``rho`` (paper,
lem:zCDP_Comp).

One module per concept, each importing only the ones above it in this list:

* :mod:`~dpstream.privacy.guarantees`: the values a mechanism reports
  (:class:`ZCDP`, :class:`ApproxDP`, :class:`PrivacyGuarantee`).
* :mod:`~dpstream.privacy.conversions`: rho (or the Gaussian ``mu``) to an
  (epsilon, delta) claim and back, by Bun-Steinke, CKS20 or the exact
  Gaussian curve.
* :mod:`~dpstream.privacy.calibration`: the inverse curves (smallest tau for a
  rho, largest rho or mu for an (epsilon, delta) target) and the guarantee at
  a noise scale.
* :mod:`~dpstream.privacy.budgets`: a mechanism's privacy argument
  (:func:`resolve_budget`, :class:`Budget`), the tau it asks for
  (:func:`calibrate_tau`), and composition (:class:`PrivacyLedger`).
* :mod:`~dpstream.privacy.composition`: the total of a dataset's releases
  (:func:`compose`) and a cap on it (:class:`BudgetCap`).

Two private helpers sit below them: ``_checks`` (argument checks) and
``_roots`` (the nudge of a root found by Brent's method,
:func:`dpstream.rootfind.brentq`, to the safe side). Import the public names
from ``dpstream.privacy`` itself; the modules are the layout, not the interface.

Example:
    >>> from dpstream.privacy import calibrate_tau, guarantee_for_tau
    >>> tau = calibrate_tau(a=1.5, epsilon=1.0, delta=1e-6)  # Delta0 = 3
    >>> g = guarantee_for_tau(tau=tau, a=1.5, delta=1e-6, mechanism="KnownBase",
    ...                       theorem="lem: KnownBase (Delta0/(2 tau^2)-zCDP)")
    >>> g.epsilon <= 1.0
    True
"""

from __future__ import annotations

from ._checks import (
    DELTA_MAX,
    EPSILON_RANGE,
    RHO_RANGE,
    TAU_RANGE,
    budget_range_problem,
    delta_range_problem,
)
from .budgets import Budget, PrivacyLedger, calibrate_tau, resolve_budget
from .calibration import (
    guarantee_at_delta,
    guarantee_for_tau,
    mu_for_gaussian,
    rho_for_epsilon_delta,
    tau_for_rho,
)
from .composition import BudgetCap, Composed, Spend, compose, costlier, in_events
from .conversions import (
    delta_bun_steinke,
    delta_cks,
    epsilon_bun_steinke,
    epsilon_cks,
    gaussian_delta,
    gaussian_epsilon,
)
from .guarantees import CONVERSIONS, DEFAULT_DELTA, ZCDP, ApproxDP, PrivacyGuarantee

__all__ = [
    "BudgetCap",
    "Composed",
    "Spend",
    "compose",
    "costlier",
    "in_events",
    "CONVERSIONS",
    "DEFAULT_DELTA",
    "DELTA_MAX",
    "EPSILON_RANGE",
    "RHO_RANGE",
    "TAU_RANGE",
    "ApproxDP",
    "Budget",
    "PrivacyGuarantee",
    "PrivacyLedger",
    "ZCDP",
    "budget_range_problem",
    "calibrate_tau",
    "delta_range_problem",
    "delta_bun_steinke",
    "delta_cks",
    "epsilon_bun_steinke",
    "epsilon_cks",
    "gaussian_delta",
    "gaussian_epsilon",
    "guarantee_at_delta",
    "guarantee_for_tau",
    "mu_for_gaussian",
    "resolve_budget",
    "rho_for_epsilon_delta",
    "tau_for_rho",
]
