"""What every continual mechanism shares: the Release value and input checks.

Layer 5 of dpstream. Checks run before any state changes, so a rejected event
or step leaves the mechanism exactly as it was (STYLE.md: validate before
mutating).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from .. import privacy
from ..errors import HorizonExceededError, InvalidEventError
from ..noise import NoiseKey
from ..tree import optimal_base

__all__ = [
    "Release",
    "check_horizon",
    "check_base",
    "normalise_event",
    "check_stream_name",
    "check_key",
    "check_domain",
    "resolve_privacy",
]


@dataclass(frozen=True, eq=False)
class Release:
    """The private output of a mechanism at one time step.

    Attributes:
        t: the time step (1-based).
        items: the released items, in the mechanism's order.
        values: their noisy counts, aligned with ``items`` (float64).
        meta: mechanism-specific extras (e.g. the threshold, switches left).

    ``counts`` gives the same as a dict ``item -> noisy count`` (built on first
    use: for a domain of 10^6 items keep to ``items``/``values``).
    """

    t: int
    items: Sequence[Hashable]
    values: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def counts(self) -> dict[Hashable, float]:
        return dict(zip(self.items, self.values.tolist(), strict=False))

    def __len__(self) -> int:
        return len(self.values)

    def top(self, k: int) -> list[tuple[Hashable, float]]:
        """The k released items with the largest noisy counts, largest first."""
        if k <= 0 or len(self.values) == 0:
            return []
        k = min(k, len(self.values))
        idx = np.argpartition(-self.values, k - 1)[:k]
        idx = idx[np.lexsort((idx, -self.values[idx]))]
        return [(self.items[i], float(self.values[i])) for i in idx]

    def __repr__(self) -> str:
        preview = ", ".join(f"{it!r}: {v:.2f}" for it, v in self.top(3))
        more = "" if len(self) <= 3 else f", ... ({len(self)} items)"
        return f"Release(t={self.t}, counts={{{preview}{more}}})"


def check_horizon(horizon: object) -> int:
    """T must be a positive int."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)):
        raise TypeError(f"horizon must be an int, got {type(horizon).__name__}")
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return int(horizon)


def check_base(base: object, horizon: int) -> int:
    """The tree base: None -> the noise-optimal r* for T, else an int >= 2."""
    if base is None:
        return optimal_base(horizon)
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)):
        raise TypeError(f"base must be an int or None, got {type(base).__name__}")
    if base < 2:
        raise ValueError(f"base must be >= 2, got {base}")
    return int(base)


def check_max_items(max_items: object) -> int:
    """Delta0, the most items one event may hold."""
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)):
        raise TypeError(f"max_items must be an int, got {type(max_items).__name__}")
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    return int(max_items)


def check_key(key: object) -> NoiseKey:
    """The secret key must be a :class:`~dpstream.NoiseKey` (never raw bytes or a seed)."""
    if not isinstance(key, NoiseKey):
        raise TypeError(f"key must be a dpstream.NoiseKey, got {type(key).__name__}")
    return key


def check_domain(domain: object) -> tuple[list[Hashable], dict[Hashable, int]]:
    """A known domain as a list of distinct items and its item -> position index."""
    if isinstance(domain, (str, bytes)):
        raise TypeError("domain must be a collection of items, not a single string")
    if not isinstance(domain, Iterable):
        raise TypeError(f"domain must be an iterable of items, got {type(domain).__name__}")
    items = list(domain)
    if not items:
        raise ValueError("domain must hold at least one item")
    index = {item: i for i, item in enumerate(items)}
    if len(index) != len(items):
        raise ValueError("domain items must be distinct")
    return items, index


def check_stream_name(stream: object) -> str:
    """The name that separates the noise of different streams under one key."""
    if not isinstance(stream, str) or not stream or "/" in stream:
        raise ValueError(f"stream must be a non-empty string without '/', got {stream!r}")
    return stream


def check_next_step(t: int, last_t: int, horizon: int) -> None:
    """Releases go forward in time and stop at the horizon."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"t must be an int, got {type(t).__name__}")
    if t > horizon:
        raise HorizonExceededError(f"time step {t} is past the horizon T={horizon}")
    if t <= last_t:
        raise ValueError(
            f"t must be greater than the last released step {last_t}, got {t} "
            "(a step is released once: releasing it again would spend budget twice)"
        )


def normalise_event(event: object, max_items: int | None) -> tuple[Hashable, ...]:
    """An event as a tuple of distinct items (an event is a set, paper Section 2).

    Raises:
        TypeError: the event is a string/bytes (a common slip: it would be read
            as its characters) or not iterable.
        InvalidEventError: more than ``max_items`` distinct items, or an
            unhashable item.
    """
    if isinstance(event, (str, bytes, bytearray)):
        raise TypeError(
            f"an event is a collection of items, got a {type(event).__name__} {event!r}; "
            f"wrap a single item as [{event!r}]"
        )
    if not isinstance(event, Iterable):
        raise TypeError(f"an event must be an iterable of items, got {type(event).__name__}")
    try:
        items = tuple(dict.fromkeys(event))
    except TypeError as exc:
        raise InvalidEventError(f"event holds an unhashable item: {exc}") from None
    if max_items is not None and len(items) > max_items:
        raise InvalidEventError(
            f"event has {len(items)} distinct items, more than max_items={max_items}"
        )
    return items


def resolve_privacy(
    *,
    rho: float | None,
    epsilon: float | None,
    delta: float | None,
    tau: float | None,
    coefficient: float,
    gaussian_exact: bool,
    mechanism: str,
    theorem: str,
    rho_delta: float = 0.0,
) -> tuple[privacy.Budget, float, privacy.PrivacyGuarantee]:
    """Check the budget arguments, find tau, and state the guarantee at that tau.

    ``coefficient`` is a in rho = a / tau^2, the mechanism's zCDP cost.
    ``gaussian_exact`` says the mechanism is exactly a Gaussian mechanism with
    sensitivity/noise ratio sqrt(2a)/tau, so the exact Balle–Wang curve may be
    used; otherwise the zCDP conversion of Canonne, Kamath and Steinke.
    """
    budget = privacy.resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=tau)
    tau_value = budget.calibrate(coefficient, gaussian_exact=gaussian_exact)
    guarantee = privacy.guarantee_for_tau(
        tau=tau_value,
        a=coefficient,
        delta=budget.reporting_delta,
        mechanism=mechanism,
        theorem=theorem,
        gaussian_exact=gaussian_exact,
        rho_delta=rho_delta,
    )
    if (
        budget.epsilon is not None
        and guarantee.epsilon > budget.epsilon
        and _meets(budget.epsilon, budget.delta - rho_delta, tau_value, coefficient, gaussian_exact)
    ):
        # The inverse curves are solved numerically and nudged upwards, so the
        # epsilon read back can exceed the target by a rounding error although
        # the calibrated tau meets the target exactly: state the target then.
        guarantee = replace(guarantee, epsilon=float(budget.epsilon))
    return budget, tau_value, guarantee


def _meets(epsilon: float, delta: float, tau: float, a: float, gaussian_exact: bool) -> bool:
    """Whether a mechanism with rho = a / tau^2 is (epsilon, delta)-DP by the forward formula."""
    if delta <= 0:
        return False
    if gaussian_exact:
        return privacy.gaussian_delta(epsilon, math.sqrt(2 * a) / tau) <= delta
    return privacy.epsilon_cks(a / tau**2, delta) <= epsilon
