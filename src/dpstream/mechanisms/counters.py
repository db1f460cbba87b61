"""Which continual counter a mechanism runs: the r-ary tree or a BLT factorization.

Both are Gaussian mechanisms on a linear image of each item's bit stream,
calibrated to the same tau: with one event changing an item's count by at
most 1 at one step, each counter is 1/(2 tau^2)-zCDP per item.

* ``"tree"`` (the paper's BinMech): every cell carries N(0, L_r tau^2), the
  count at t sums |I_t(r)| cells.
* ``"blt"``: the factorization A = B C of :mod:`dpstream.factorization`; the
  keyed draws z have sigma = tau max_j ||C e_j||, so rho = max_j ||C e_j||^2 /
  (2 sigma^2) = 1/(2 tau^2), and the count at t has variance
  sigma^2 ||row_t(B)||^2. sigma is rounded up by 2^-40 relative, which covers
  the floating-point error of the sensitivity and keeps rho at or below the
  stated value.

The default is the counter with the smaller worst-case variance for the
horizon (V = max_t Var / tau^2): BLT for every T >= 2 (a 2.6x to 3.1x smaller
standard deviation at T = 10^3 .. 10^6), the tree for T = 1 (a tie) and past
:data:`~dpstream.factorization.MAX_BLT_HORIZON`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from .._checks import check_int
from ..factorization import (
    MAX_BLT_HORIZON,
    MAX_BUFFERS,
    BLTStrategy,
    blt_for_horizon,
    blt_unbounded,
)
from ..noise import DEFAULT_NOISE_VERSION, versioned_purpose
from ..tree import digits, optimal_base, worst_case_variance_factor
from .base import check_base, check_horizon, config_tag

__all__ = [
    "COUNTERS",
    "CounterStd",
    "default_counter",
    "resolve_counter",
    "blt_sigma",
    "blt_purpose",
    "counter_with_buffers",
    "stream_horizon",
    "for_all_t",
    "UNBOUNDED_THEOREM",
    "tree_base",
    "tree_levels",
]

#: What a mechanism with no planned end adds to its theorem.
UNBOUNDED_THEOREM = (
    "; no planned end: sigma from sup_T max_j ||C e_j||^2 = sum_(n >= 0) "
    "c_n^2, so the bound holds at every t"
)

COUNTERS = ("tree", "blt")
_SIGMA_ROUND_UP = 1.0 + 2.0**-40


@functools.lru_cache(maxsize=64)
def default_counter(horizon: int) -> str:
    """The counter with the smaller worst-case variance for horizon T (ties: the tree)."""
    if horizon > MAX_BLT_HORIZON:
        return "tree"
    tree_v = worst_case_variance_factor(horizon, optimal_base(horizon))
    # (a tie, as at T = 1 where both are 1, up to rounding, goes to the tree)
    blt_v = blt_for_horizon(horizon).worst_case_variance
    return "blt" if blt_v < tree_v * (1 - 1e-9) else "tree"


def stream_horizon(horizon: object) -> tuple[int, bool]:
    """(T, unbounded) of a mechanism's ``horizon`` argument: ``None`` is a stream with no
    planned end, run to at most :data:`~dpstream.factorization.MAX_BLT_HORIZON` steps
    (2^40) with :func:`~dpstream.factorization.blt_unbounded`; an int is T itself."""
    if horizon is None:
        return MAX_BLT_HORIZON, True
    return check_horizon(horizon), False


def for_all_t(guarantee: Any, unbounded: bool) -> Any:
    """A mechanism's :class:`~dpstream.privacy.PrivacyGuarantee`, marked as holding for
    every t when the stream has no planned end (``unbounded``)."""
    if not unbounded:
        return guarantee
    return dataclasses.replace(
        guarantee, for_all_t=True, theorem=guarantee.theorem + UNBOUNDED_THEOREM
    )


def resolve_counter(
    counter: object, base: object, horizon: int, *, unbounded: bool = False
) -> tuple[str, int | None, BLTStrategy | None]:
    """Check ``counter`` / ``base`` and return (counter name, tree base, BLT strategy).

    ``counter`` is ``"tree"``, ``"blt"``, a :class:`~dpstream.factorization.BLTStrategy`
    (stated anew for this horizon: its numbers are recomputed for T), or ``None``:
    the tree when a ``base`` is given, else :func:`default_counter`.
    ``unbounded`` (a stream with no planned end, ``horizon=None``): ``None`` or
    ``"blt"`` is :func:`~dpstream.factorization.blt_unbounded`, a strategy must be an
    unbounded one, and the tree (whose noise is sized for T) is refused.
    """
    if unbounded:
        if counter == "tree" or base is not None:
            raise ValueError(
                "a stream with no planned end (no horizon) needs the BLT counter: "
                "the tree's noise is sized for T (give a horizon, or drop "
                "counter='tree' / base)"
            )
        if isinstance(counter, BLTStrategy) and not counter.unbounded:
            raise ValueError(
                "a stream with no planned end needs a BLT whose sensitivity "
                "holds for every t (blt_unbounded()), not one stated for a "
                "horizon"
            )
        if counter not in (None, "blt") and not isinstance(counter, BLTStrategy):
            raise ValueError(f"counter must be 'tree', 'blt' or a BLTStrategy, got {counter!r}")
        strategy = counter if isinstance(counter, BLTStrategy) else blt_unbounded()
        return (
            "blt",
            None,
            strategy.at_horizon(horizon) if strategy.horizon != horizon else strategy,
        )
    if counter is None:
        counter = "tree" if base is not None else default_counter(horizon)
    if isinstance(counter, BLTStrategy):
        strategy = counter if counter.horizon == horizon else counter.at_horizon(horizon)
        counter = "blt"
    elif counter == "blt":
        if horizon > MAX_BLT_HORIZON:
            raise ValueError(f"counter='blt' supports horizons up to 2**40, got {horizon}")
        strategy = blt_for_horizon(horizon)
    elif counter == "tree":
        return "tree", check_base(base, horizon), None
    else:
        raise ValueError(f"counter must be 'tree', 'blt' or a BLTStrategy, got {counter!r}")
    if base is not None:
        raise ValueError(
            f"base applies to counter='tree' only, got base={base!r} with counter='blt'"
        )
    return "blt", None, strategy


def tree_base(base: int | None) -> int:
    """The tree base r of a mechanism that counts with the tree (:func:`resolve_counter`
    gives ``None`` for a BLT counter, which has no base)."""
    if base is None:
        raise ValueError("a BLT counter has no tree base")
    return base


def tree_levels(levels: int | None) -> int:
    """L_r, the levels of the tree of a mechanism that counts with the tree (``None``
    for a BLT counter, which has no levels)."""
    if levels is None:
        raise ValueError("a BLT counter has no tree levels")
    return levels


class CounterStd:
    """``noise_std_worst`` and ``noise_std_at`` of a histogram whose every count is one
    counter at noise scale ``tau``: the tree (``base``, ``levels``; ``strategy`` None)
    or a BLT (``strategy``, its draws' std ``sigma``), over ``horizon`` steps."""

    strategy: BLTStrategy | None
    sigma: float
    tau: float
    horizon: int
    base: int | None
    levels: int | None

    @property
    def noise_std_worst(self) -> float:
        """The largest standard deviation of a released count over t <= T."""
        if self.strategy is not None:
            return self.sigma * math.sqrt(self.strategy.max_variance_factor)
        return float(
            np.sqrt(worst_case_variance_factor(self.horizon, tree_base(self.base))) * self.tau
        )

    def noise_std_at(self, t: int) -> float:
        """The standard deviation of a count released at t: tau sqrt(|I_t| L_r) for the
        tree, sigma ||row_t(B)|| for BLT (the same for an item first counted at any step)."""
        if self.strategy is not None:
            return self.sigma * math.sqrt(self.strategy.variance_factor(t))
        if t < 1 or (self.horizon is not None and t > self.horizon):  # (as the BLT refuses)
            raise ValueError(f"t must be in 1..{self.horizon}, got {t}")
        cells = sum(digits(t, tree_base(self.base)))
        return float(np.sqrt(cells * tree_levels(self.levels)) * self.tau)


def counter_with_buffers(
    counter: str | None, base: int | None, buffers: int | None, horizon: int
) -> str | BLTStrategy | None:
    """The ``counter=`` value for a BLT with ``buffers`` buffers per item (the command
    line's ``--blt-buffers``), or ``counter`` itself when ``buffers`` is None.

    Fewer buffers keep fewer floats per item (k + 1 for k buffers) for a little
    more noise; the fit is :func:`~dpstream.factorization.blt_for_horizon`'s for
    (T, k), shipped for k = 1..4. Refused with the tree (``counter="tree"`` or a
    ``base``), which has no buffers.
    """
    if buffers is None:
        return counter
    if counter not in (None, "blt") or base is not None:
        raise ValueError(
            f"--blt-buffers applies to the BLT counter only, not with counter={counter!r} or --base"
        )
    buffers = check_int("--blt-buffers", buffers, 1)
    if buffers > MAX_BUFFERS:
        raise ValueError(f"--blt-buffers must be 1 to {MAX_BUFFERS}, got {buffers}")
    if horizon > MAX_BLT_HORIZON:
        raise ValueError(f"counter='blt' supports horizons up to 2**40, got {horizon}")
    return blt_for_horizon(horizon, buffers)


def blt_sigma(tau: float, strategy: BLTStrategy) -> float:
    """The std of each keyed draw of a BLT counter at noise scale tau (rounded up)."""
    return float(tau) * strategy.sensitivity * _SIGMA_ROUND_UP


def blt_purpose(
    stream: str,
    *,
    strategy: BLTStrategy,
    sigma: float,
    max_items: int | None,
    domain: str,
    users: str | None = None,
    noise_version: int = DEFAULT_NOISE_VERSION,
) -> str:
    """The noise purpose of the BLT counters of stream ``stream`` with these settings.

    It fingerprints T, sigma and the BLT parameters exactly, Delta0 and the
    domain and the user bounds (as :func:`~dpstream.mechanisms.known.tree_purpose`
    does), so other settings draw independent noise (see
    :func:`~dpstream.mechanisms.base.config_tag`).
    """
    extra = {} if users is None else {"users": users}
    tag = config_tag(
        horizon=strategy.horizon,
        sigma=sigma,
        strategy=strategy.fingerprint(),
        max_items=max_items,
        domain=domain,
        **extra,
    )
    return versioned_purpose(f"{stream}/blt@{tag}", noise_version)
