"""Argument checks of the privacy parameters (private to :mod:`dpstream.privacy`).

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream. Every
module of the package validates rho, epsilon, delta, tau and the coefficient
``a`` the same way, with the parameter's name and the value received in the
message, so the checks live once, here. (The int checks shared by every layer
are in ``dpstream._checks``.)
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _check_real(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise ``TypeError`` if it is not a real number.

    ``bool`` (and ``numpy.bool_``) are rejected although Python treats ``True`` as
    1: a flag passed where a privacy parameter belongs is a bug, not a budget.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it is finite and > 0."""
    x = _check_real(name, value)
    if not (math.isfinite(x) and x > 0.0):
        raise ValueError(f"{name} must be positive and finite, got {name}={value!r}")
    return x


def _check_nonnegative(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it is finite and >= 0."""
    x = _check_real(name, value)
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be non-negative and finite, got {name}={value!r}")
    return x


def _check_open_unit(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in (0, 1)."""
    x = _check_real(name, value)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {name}={value!r}")
    return x


def _check_half_open_unit(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in [0, 1)."""
    x = _check_real(name, value)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {name}={value!r}")
    return x


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    return value
