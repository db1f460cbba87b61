"""Exact integer arithmetic of the r-ary tree (the paper's Section 3).

Layer 3 of dpstream. The tree over time steps 1..T in base r has levels
i = 1..L_r with ``L_r = floor(log_r T) + 1`` (eq:baseL), which is the number of
base-r digits of T. Cell (i, j), for 1 <= j <= floor(T / r^(i-1)), covers the
time steps (j-1) r^(i-1) + 1 .. j r^(i-1). Writing t = sum_i s_i r^i in base r,
the count at time t is the sum of the cells I_t(r): for each digit position i,
the s_i cells at level i+1 with j in floor(t / r^(i+1)) r + 1 .. floor(t / r^i).
These cells tile 1..t exactly, and there are digitsum(t) <= (r-1) L_r of them.

Everything here is integer code: no ``math.log`` (a float log of an exact
power, such as log_10(1000), can land just below the integer and drop a level).
"""

from __future__ import annotations

from collections.abc import Iterator

from ._checks import check_int

__all__ = [
    "num_levels",
    "digits",
    "cells_at",
    "cells_by_level",
    "cells_of_event",
    "cells_closing_at",
    "cell_span",
    "optimal_base",
    "integer_root",
    "paper_variance_factor",
    "max_cells",
    "worst_case_variance_factor",
]


def num_levels(horizon: int, base: int) -> int:
    """L_r = floor(log_r T) + 1, the number of base-r digits of T (eq:baseL)."""
    horizon = check_int("horizon", horizon, 1)
    base = check_int("base", base, 2)
    levels = 0
    while horizon:
        horizon //= base
        levels += 1
    return levels


def digits(t: int, base: int) -> list[int]:
    """Base-r digits of t, least significant first (s_0, s_1, ...)."""
    t = check_int("t", t, 0)
    base = check_int("base", base, 2)
    out = []
    while t:
        t, s = divmod(t, base)
        out.append(s)
    return out


def cells_by_level(t: int, base: int) -> list[tuple[int, int, int]]:
    """I_t(r) grouped by level: ``(level, first_index, last_index)`` per non-zero digit.

    Level ``i + 1`` holds cells ``floor(t / r^(i+1)) r + 1 .. floor(t / r^i)``,
    which is empty when the digit s_i is 0 (then the level is omitted).
    """
    t = check_int("t", t, 1)
    base = check_int("base", base, 2)
    out = []
    level = 1
    power = 1  # r^(level-1)
    while power <= t:
        hi = t // power
        lo = (hi // base) * base + 1
        if hi >= lo:
            out.append((level, lo, hi))
        level += 1
        power *= base
    return out


def cells_at(t: int, base: int) -> list[tuple[int, int]]:
    """The cells I_t(r) whose sum is the count at time t, as 1-based (level, index)."""
    return [(lv, j) for lv, lo, hi in cells_by_level(t, base) for j in range(lo, hi + 1)]


def cell_span(level: int, index: int, base: int) -> tuple[int, int]:
    """The time steps (first, last) that cell (level, index) covers."""
    level = check_int("level", level, 1)
    index = check_int("index", index, 1)
    size = base ** (level - 1)
    return ((index - 1) * size + 1, index * size)


def cells_of_event(t: int, horizon: int, base: int) -> list[tuple[int, int]]:
    """The cells an event at time t falls into: one per level, at most L_r.

    At level i the event is in cell ceil(t / r^(i-1)); a cell that would run past
    the horizon does not exist in the table (j <= floor(T / r^(i-1))).
    """
    t = check_int("t", t, 1)
    horizon = check_int("horizon", horizon, 1)
    if t > horizon:
        raise ValueError(f"t must be <= horizon ({horizon}), got {t}")
    out = []
    for level in range(1, num_levels(horizon, base) + 1):
        size = base ** (level - 1)
        j = -(-t // size)
        if j <= horizon // size:
            out.append((level, j))
    return out


def cells_closing_at(t: int, horizon: int, base: int) -> list[tuple[int, int]]:
    """The cells whose last time step is t (they become complete at t).

    Cell (i, j) closes at j r^(i-1), so the cells closing at t are the levels i
    with r^(i-1) dividing t, index t / r^(i-1). Used by MetaAlgo, which applies
    the one-shot mechanism to each cell exactly once, when it closes.
    """
    t = check_int("t", t, 1)
    horizon = check_int("horizon", horizon, 1)
    levels = num_levels(horizon, base)
    out = []
    size = 1
    for level in range(1, levels + 1):
        if t % size:
            break
        out.append((level, t // size))
        size *= base
    return out


def paper_variance_factor(horizon: int, base: int) -> int:
    """(r - 1) L_r^2: the paper's bound on the count variance in units of tau^2."""
    levels = num_levels(horizon, base)
    return (base - 1) * levels * levels


def integer_root(n: int, k: int) -> int:
    """floor(n ** (1/k)) for n >= 0, k >= 1, in exact integer arithmetic."""
    n = check_int("n", n, 0)
    k = check_int("k", k, 1)
    if n < 2 or k == 1:
        return n
    x = 1 << -(-n.bit_length() // k)  # 2^ceil(bits/k) >= the root
    while True:  # Newton's iteration from above decreases monotonically to the floor root
        y = ((k - 1) * x + n // x ** (k - 1)) // k
        if y >= x:
            break
        x = y
    while x**k > n:
        x -= 1
    while (x + 1) ** k <= n:
        x += 1
    return x


def optimal_base(horizon: int) -> int:
    """r* = argmin over r in {2..T} of (r - 1) L_r^2 (eq:opt_base); ties go to the smaller r.

    For a given number of levels L the cost (r - 1) L^2 grows with r, so the only
    candidate with L levels is the smallest base with r^L > T, r_L = iroot(T, L) + 1.
    Any base r with L_r = L has r_L <= r and L_(r_L) <= L, hence a cost at least
    that of r_L: the minimum over the O(log T) candidates r_L is the minimum over
    all bases, and the smallest minimiser is among them. ``optimal_base(1) == 2``
    by convention (a one-step stream has one level).
    """
    horizon = check_int("horizon", horizon, 1)
    if horizon < 2:
        return 2
    best_base, best_cost = 2, paper_variance_factor(horizon, 2)
    for levels in range(2, horizon.bit_length() + 2):
        base = integer_root(horizon, levels) + 1
        if base < 2 or base > horizon:
            continue
        cost = paper_variance_factor(horizon, base)
        if cost < best_cost or (cost == best_cost and base < best_base):
            best_base, best_cost = base, cost
    return best_base


def max_cells(horizon: int, base: int) -> int:
    """max over t in 1..T of |I_t(r)|, the largest digit sum of a number <= T.

    A number <= T with the largest digit sum is T itself or, for some digit
    position p with a non-zero digit, T with that digit lowered by one and
    every lower digit set to r - 1.
    """
    horizon = check_int("horizon", horizon, 1)
    ds = digits(horizon, base)
    best = sum(ds)
    for p, d in enumerate(ds):
        if d:
            best = max(best, sum(ds[p + 1 :]) + d - 1 + p * (base - 1))
    return best


def worst_case_variance_factor(horizon: int, base: int) -> int:
    """Exact max over t <= T of the count variance in units of tau^2: max|I_t| L_r.

    Each cell carries N(0, L_r tau^2), so the count at t has variance
    |I_t(r)| L_r tau^2; the paper bounds it by (r - 1) L_r^2 tau^2.
    """
    return max_cells(horizon, base) * num_levels(horizon, base)


def iter_level_changes(t: int, base: int) -> Iterator[tuple[int, int]]:
    """How I_t differs from I_(t-1), level by level, for t >= 1.

    Yields ``(level, new_index)`` for every level whose cell set changed at t:
    ``new_index`` > 0 means the cell (level, new_index) joined the level's set;
    ``new_index`` == 0 means the level's set became empty (its digit rolled over
    to 0). Levels above the last yielded one are unchanged.
    """
    t = check_int("t", t, 1)
    level = 1
    size = 1
    while t % size == 0 and size <= t:
        j = t // size
        yield (level, j if j % base else 0)
        level += 1
        size *= base
