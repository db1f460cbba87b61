"""Argument checks shared by every layer (layer 1 of dpstream: imports nothing from it)."""

from __future__ import annotations

import numpy as np


def check_int(name: str, value: object, minimum: int) -> int:
    """An int parameter >= ``minimum``: a bool or a float is refused, NumPy ints are fine."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value!r}")
    return int(value)
