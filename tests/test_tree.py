"""Tree arithmetic against brute force (exact integers)."""

from __future__ import annotations

import pytest

from dpstream import tree


def brute_levels(horizon: int, base: int) -> int:
    # smallest k with base**k > horizon, by repeated multiplication
    k, power = 0, 1
    while power <= horizon:
        power *= base
        k += 1
    return k


@pytest.mark.parametrize("base", range(2, 13))
def test_cells_at_tile_one_to_t_exactly(base):
    for t in range(1, 2001):
        covered = []
        for level, j in tree.cells_at(t, base):
            first, last = tree.cell_span(level, j, base)
            covered.extend(range(first, last + 1))
            # the cell exists in the table of any horizon >= t
            assert j <= t // base ** (level - 1)
        assert sorted(covered) == list(range(1, t + 1)), (t, base)  # exact and disjoint
        assert len(tree.cells_at(t, base)) == sum(tree.digits(t, base))


@pytest.mark.parametrize("base", range(2, 13))
def test_num_levels_exact_at_powers(base):
    for k in range(0, 40):
        p = base**k
        assert tree.num_levels(p, base) == k + 1
        assert tree.num_levels(p, base) == brute_levels(p, base)
        if p > 1:
            assert tree.num_levels(p - 1, base) == k
    # the classic float trap: log_10(1000) = 2.9999999999999996 in floating point
    assert tree.num_levels(1000, 10) == 4
    assert tree.num_levels(10**15, 10) == 16


def test_optimal_base_matches_brute_force():
    assert tree.optimal_base(1000) == 4
    for horizon in list(range(1, 400)) + [1000, 2047, 4096, 10**4, 12345]:
        costs = {r: (r - 1) * brute_levels(horizon, r) ** 2 for r in range(2, max(horizon, 2) + 1)}
        best = min(costs.values())
        expected = min(r for r, c in costs.items() if c == best)
        assert tree.optimal_base(horizon) == expected, horizon


@pytest.mark.parametrize("base", [2, 3, 4, 7, 10])
@pytest.mark.parametrize("horizon", [1, 9, 100, 343, 1000])
def test_event_lands_in_at_most_levels_cells_and_is_counted_once(base, horizon):
    levels = tree.num_levels(horizon, base)
    for t in range(1, horizon + 1):
        cells = tree.cells_of_event(t, horizon, base)
        assert len(cells) <= levels
        assert len(set(cells)) == len(cells)
        for level, j in cells:
            first, last = tree.cell_span(level, j, base)
            assert first <= t <= last and last <= horizon
    # brute force: the event at t is counted exactly once in the count at every s >= t
    if horizon <= 343:
        for t in range(1, horizon + 1):
            mine = set(tree.cells_of_event(t, horizon, base))
            for s in range(t, horizon + 1):
                assert len(mine & set(tree.cells_at(s, base))) == 1


@pytest.mark.parametrize("base", range(2, 11))
def test_max_cells_and_worst_case_variance(base):
    for horizon in range(1, 700):
        brute = max(sum(tree.digits(t, base)) for t in range(1, horizon + 1))
        assert tree.max_cells(horizon, base) == brute
        levels = tree.num_levels(horizon, base)
        assert tree.worst_case_variance_factor(horizon, base) == brute * levels
        assert tree.worst_case_variance_factor(horizon, base) <= tree.paper_variance_factor(
            horizon, base
        )


@pytest.mark.parametrize("base", [2, 3, 5, 10])
def test_level_changes_rebuild_cells(base):
    sets: dict[int, set[int]] = {}
    for t in range(1, 1500):
        for level, j in tree.iter_level_changes(t, base):
            if j == 0:
                sets.pop(level, None)
            else:
                sets.setdefault(level, set()).add(j)
        rebuilt = sorted((lv, j) for lv, js in sets.items() for j in js)
        assert rebuilt == sorted(tree.cells_at(t, base)), t


def test_cells_closing_at_close_exactly_when_their_last_step_is_t():
    horizon, base = 500, 3
    every_cell = {
        (lv, j)
        for lv in range(1, tree.num_levels(horizon, base) + 1)
        for j in range(1, horizon // base ** (lv - 1) + 1)
    }
    seen = set()
    for t in range(1, horizon + 1):
        for cell in tree.cells_closing_at(t, horizon, base):
            assert tree.cell_span(*cell, base)[1] == t
            assert cell not in seen
            seen.add(cell)
    assert seen == every_cell


def test_bad_arguments():
    with pytest.raises(ValueError, match="base"):
        tree.num_levels(10, 1)
    with pytest.raises(ValueError, match="horizon"):
        tree.num_levels(0, 2)
    with pytest.raises(TypeError, match="horizon"):
        tree.num_levels(10.0, 2)
    with pytest.raises(ValueError, match="t must be <= horizon"):
        tree.cells_of_event(11, 10, 2)
