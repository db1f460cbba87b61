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


def series_items(counts: object) -> object:
    """A pandas Series of counts as the ``item -> count`` Mapping its index says it is
    (``value_counts()`` gives one, sorted by count): read by position, its counts
    would land on other items, in an order that depends on the data. Anything else
    is returned as it is. Raises ValueError when an item labels two counts."""
    kind = type(counts)
    if kind.__name__ != "Series" or not kind.__module__.startswith("pandas"):
        return counts
    index = counts.index  # type: ignore[attr-defined]
    if not index.is_unique:
        raise ValueError("counts: the Series' index names an item twice")
    return dict(zip(index.tolist(), counts.tolist(), strict=True))  # type: ignore[attr-defined]
