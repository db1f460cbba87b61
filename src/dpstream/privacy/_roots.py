"""Root finding made conservative (private to :mod:`dpstream.privacy`).

Layer 1 of dpstream (docs/architecture.md); imports nothing from dpstream. The
conversions and the calibration both invert a monotone curve with Brent's
method (:func:`dpstream.rootfind.brentq`, SciPy's compiled routine) and then
move the root, in growing steps, to the safe side of the forward check
(:func:`_nudge`).
"""

from __future__ import annotations

from typing import Any

# Guards for the iterative "nudge until the forward check passes" loops: each step
# multiplies the moving quantity by (1 +- 2**-52 * 2**i), so a few dozen steps cover
# any realistic rounding error; more means the forward formula is broken.
_MAX_NUDGES = 200


def _nudge(x: float, direction: int, ok: Any, what: str) -> float:
    """Move ``x`` in ``direction`` (+1 up, -1 down) in growing relative steps until
    ``ok(x)`` holds; used to make a root found by brentq conservative."""
    step = 2.0**-52
    for _ in range(_MAX_NUDGES):
        if ok(x):
            return x
        x = x * (1.0 + direction * step) if x != 0.0 else direction * 5e-324
        step = min(step * 2.0, 0.5)
    raise ArithmeticError(f"{what}: could not make the result conservative")  # pragma: no cover
