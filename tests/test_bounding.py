"""User-level privacy: contribution bounding and the sensitivities calibrated from it.

The sensitivity tests enumerate every placement of one user's contributions
(all integer x >= 0 with at most Linf over the steps, for each of L0 items)
against matrices built here from their definitions (the paper's partial-sum
table, a BLT's Toeplitz strategy), never from the code under test.
"""

from __future__ import annotations

import itertools
import math
import pickle
import random

import numpy as np
import pytest

import dpstream as dps
from dpstream import privacy
from dpstream.bounding import (
    ContributionBounder,
    UserBounds,
    UserHasher,
    gaussian_coefficient,
    resolve_user_bounds,
    unit_sensitivity,
)
from dpstream.factorization import BLTStrategy, blt_for_horizon
from dpstream.snapshot import dump_snapshot, load_snapshot

from .conftest import fixed_key

# --------------------------------------------------------------------------- brute force


def partial_sum_table(horizon: int, base: int) -> np.ndarray:
    """The paper's partial-sum table as a matrix: a row per cell (i, j), i = 1..L_r,
    j = 1..floor(T / r^(i-1)), with ones on the steps (j-1) r^(i-1) + 1 .. j r^(i-1)."""
    rows = []
    width = 1
    while width <= horizon:  # levels i with r^(i-1) <= T: L_r = floor(log_r T) + 1 of them
        for j in range(1, horizon // width + 1):
            row = np.zeros(horizon)
            row[(j - 1) * width : j * width] = 1.0
            rows.append(row)
        width *= base
    return np.array(rows)


def toeplitz(column: np.ndarray) -> np.ndarray:
    n = len(column)
    return np.array([[column[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def placements(horizon: int, linf: int) -> np.ndarray:
    """Every integer x >= 0 of length T with sum(x) <= Linf (several events may share a step)."""
    out = []
    for total in range(linf + 1):
        for steps in itertools.combinations_with_replacement(range(horizon), total):
            out.append(np.bincount(np.array(steps, dtype=np.int64), minlength=horizon))
    return np.array(out, dtype=np.float64)


def brute_force_sensitivity(c: np.ndarray, l0: int, linf: int) -> float:
    """max over all placements of L0 items' contributions of the stacked ||(C x^u)_u||_2."""
    images = placements(c.shape[1], linf) @ c.T  # every C x, one per row
    norms_sq = np.einsum("ij,ij->i", images, images)
    best = 0.0
    for combo in itertools.product(range(len(norms_sq)), repeat=l0):  # L0 items jointly
        best = max(best, float(sum(norms_sq[i] for i in combo)))
    return math.sqrt(best)


def check_claim(c: np.ndarray, l0: int, linf: int, claimed: float) -> None:
    """The claimed sensitivity covers the worst placement, and is attained (not loose)."""
    brute = brute_force_sensitivity(c, l0, linf)
    assert claimed >= brute * (1 - 1e-12), (claimed, brute)
    assert claimed <= brute * (1 + 1e-9), (claimed, brute)


@pytest.mark.parametrize("horizon,base", [(5, 2), (7, 2), (8, 3), (9, 3), (6, 5), (7, 7)])
@pytest.mark.parametrize("l0,linf", [(1, 1), (1, 3), (2, 2)])
def test_tree_sensitivity_matches_brute_force(horizon, base, l0, linf):
    c = partial_sum_table(horizon, base)
    max_col = math.sqrt(max(np.sum(c * c, axis=0)))
    check_claim(c, l0, linf, unit_sensitivity(max_col, l0, linf))
    # and the closed form the mechanisms use: every step lies in one cell per level
    levels = dps.tree.num_levels(horizon, base)
    check_claim(c, l0, linf, math.sqrt(l0 * levels) * linf)


def _blts(horizon):
    yield blt_for_horizon(horizon)
    yield BLTStrategy((0.3, 0.9), (0.2, 0.05), horizon)
    yield BLTStrategy((0.5,), (0.4,), horizon)


@pytest.mark.parametrize("horizon", [4, 6, 8])
@pytest.mark.parametrize("l0,linf", [(1, 2), (2, 2), (1, 3)])
def test_blt_sensitivity_matches_brute_force(horizon, l0, linf):
    for strategy in _blts(horizon):
        c = toeplitz(strategy.strategy_column(horizon))
        check_claim(c, l0, linf, unit_sensitivity(strategy.sensitivity, l0, linf))


def test_the_brute_force_catches_wrong_formulas():
    """The check fails for formulas that are a little off (it can fail)."""
    c = partial_sum_table(8, 2)
    levels = 4
    with pytest.raises(AssertionError):  # Linf not squared in the coefficient: sqrt(Linf)
        check_claim(c, 2, 3, math.sqrt(2 * levels * 3))
    with pytest.raises(AssertionError):  # the event-level sensitivity, ignoring Linf
        check_claim(c, 2, 3, math.sqrt(2 * levels))
    with pytest.raises(AssertionError):  # a loose bound is caught too
        check_claim(c, 2, 3, math.sqrt(2 * levels) * 3 * 1.01)
    # a matrix whose longest column is not the first: assuming column 1 is wrong
    rng = np.random.default_rng(5)  # a random test matrix, mixed signs
    m = rng.normal(size=(6, 5))
    m[:, 3] *= 4.0
    first = math.sqrt(float(np.sum(m[:, 0] ** 2)))
    with pytest.raises(AssertionError):
        check_claim(m, 1, 2, unit_sensitivity(first, 1, 2))
    longest = math.sqrt(max(np.sum(m * m, axis=0)))
    check_claim(m, 1, 2, unit_sensitivity(longest, 1, 2))


# --------------------------------------------------------------------------- mechanisms


def _mechanism_mu(mech) -> float:
    """The ratio sensitivity / noise std that the mechanism's calibration assumes."""
    return math.sqrt(2.0 * mech._coef) / mech.tau


@pytest.mark.parametrize("counter", ["tree-2", "tree-3", "blt"])
def test_known_base_user_level_meets_its_target_exactly(counter):
    horizon, l0, linf, eps, delta = 7, 2, 3, 1.0, 1e-5
    kwargs = (
        {"counter": "tree", "base": int(counter[-1])}
        if counter.startswith("tree")
        else {"counter": "blt"}
    )
    mech = dps.KnownDomainHistogram(
        ["a", "b", "c"],
        horizon,
        key=fixed_key("u"),
        epsilon=eps,
        delta=delta,
        max_items_per_user=l0,
        max_count_per_item=linf,
        **kwargs,
    )
    assert mech.privacy.unit == "user"
    if mech.strategy is None:
        c = partial_sum_table(horizon, mech.base)
    else:
        c = toeplitz(mech.strategy.strategy_column(horizon))
    # every coordinate of C x carries N(0, sigma^2): the ratio of the worst placement
    mu = brute_force_sensitivity(c, l0, linf) / mech.sigma
    assert mu <= _mechanism_mu(mech) * (1 + 1e-12)
    # exact Gaussian curve at the brute-force ratio: the target, and not much less
    achieved = privacy.gaussian_delta(eps, mu)
    assert achieved <= delta
    assert achieved >= delta * (1 - 1e-6)
    assert mech.privacy.epsilon == pytest.approx(eps, rel=1e-9)


def test_user_level_coefficients():
    key = fixed_key("coef")
    for l0, linf in [(1, 1), (3, 2), (5, 4)]:
        h = dps.KnownDomainHistogram(
            ["a"], 50, key=key, rho=1.0, max_items_per_user=l0, max_count_per_item=linf
        )
        assert h._coef == gaussian_coefficient(l0, linf) == l0 * linf**2 / 2
        assert h.privacy.rho == pytest.approx(l0 * linf**2 / (2 * h.tau**2))
        m = dps.ContinualTopK(
            ["a", "b"],
            50,
            k=1,
            switches=2,
            eta=1.0,
            key=key,
            rho=1.0,
            max_items_per_user=l0,
            max_count_per_item=linf,
        )
        # (2k+1)/(2 tau^2) with a sparse-vector round (Lyu-Su-Li), times Linf^2 per user
        assert m.privacy.rho == pytest.approx(linf**2 * (2 * 1 + 1) / (2 * m.tau**2))
        assert m.privacy.unit == "user"
    event = dps.KnownDomainHistogram(["a"], 50, max_items=3, key=key, rho=1.0)
    assert event.privacy.unit == "event" and event._coef == 1.5


def test_unknown_domain_threshold_hides_an_item_one_user_pushed_to_linf():
    """P(one user's item, count Linf, shows at some t) <= T P(Linf + N(0, s^2) > m) = delta_thr."""
    from scipy.special import ndtr

    horizon, l0, linf = 200, 3, 4
    u = dps.UnknownDomainHistogram(
        horizon,
        key=fixed_key("unk"),
        rho=0.5,
        threshold_delta=1e-6,
        max_items_per_user=l0,
        max_count_per_item=linf,
        counter="tree",
    )
    scale = u.tau * u.levels * math.sqrt(u.base - 1)  # worst std of a count (|I_t| max)
    bad = horizon * float(ndtr(-(u.threshold - linf) / scale))
    assert bad <= 1e-6 and bad >= 1e-6 * (1 - 1e-6)
    # the event-level threshold (the + 1) would not hide it: a failure this test catches
    event_m = dps.mechanisms.unknown.discovery_threshold(
        tau=u.tau, horizon=horizon, base=u.base, threshold_delta=1e-6
    )
    assert horizon * float(ndtr(-(event_m - linf) / scale)) > 1.2e-6  # over its delta
    # delta paid: L0 (not Delta0) bad items of delta_thr each
    assert u.privacy.rho_delta == pytest.approx(l0 * 1e-6)
    assert u.privacy.unit == "user"
    assert u.privacy.rho == pytest.approx(l0 * linf**2 / (2 * u.tau**2))


def test_unknown_domain_user_calibration_meets_the_target():
    eps, delta = 1.0, 1e-6
    u = dps.UnknownDomainHistogram(
        300,
        key=fixed_key("unk2"),
        epsilon=eps,
        delta=delta,
        max_items_per_user=2,
        max_count_per_item=3,
    )
    split = u.privacy_split
    assert split.threshold_part == pytest.approx(2 * split.threshold_delta)
    mu = math.sqrt(2) * 3 / u.tau  # sqrt(L0) Linf / tau
    assert privacy.gaussian_delta(eps, mu) <= split.conversion_delta
    assert split.threshold_part + split.conversion_delta <= delta


def test_user_bounds_come_in_pairs_and_change_the_noise():
    key = fixed_key("pairs")
    with pytest.raises(ValueError, match="max_count_per_item"):
        dps.KnownDomainHistogram(["a"], 10, key=key, rho=1, max_items_per_user=2)
    with pytest.raises(ValueError, match="max_items_per_user"):
        resolve_user_bounds(None, 3)
    with pytest.raises(TypeError):
        dps.KnownDomainHistogram(["a"], 10, key=key, rho=1)  # event level needs max_items
    a = dps.KnownDomainHistogram(
        ["a"], 10, key=key, tau=1.0, max_items_per_user=2, max_count_per_item=1, counter="tree"
    )
    b = dps.KnownDomainHistogram(
        ["a"], 10, key=key, tau=1.0, max_items_per_user=3, max_count_per_item=1, counter="tree"
    )
    c = dps.KnownDomainHistogram(["a"], 10, max_items=2, key=key, tau=1.0, counter="tree")
    assert len({a.noise_purpose, b.noise_purpose, c.noise_purpose}) == 3
    assert a.step_batch([]).counts["a"] != c.step_batch([]).counts["a"]  # other noise
    unk = [
        dps.UnknownDomainHistogram(10, key=key, tau=1.0, threshold_delta=1e-3, **kw).noise_purpose
        for kw in (
            {"max_items": 2},
            {"max_items_per_user": 2, "max_count_per_item": 1},
            {"max_items_per_user": 2, "max_count_per_item": 2},
        )
    ]
    top = [
        dps.ContinualTopK(
            ["a", "b"], 10, k=1, switches=1, eta=1.0, key=key, tau=1.0, **kw
        ).noise_scope
        for kw in (
            {},
            {"max_items_per_user": 2, "max_count_per_item": 1},
            {"max_items_per_user": 3, "max_count_per_item": 1},
        )
    ]
    assert len(set(unk)) == 3 and len(set(top)) == 3


# --------------------------------------------------------------------------- the bounder


def reference_kept(events, l0, linf):
    """Closed-form twin of first come, first kept, for one user's events in order: the
    kept items are the first L0 distinct ones by first occurrence, each kept at its first
    Linf occurrences (an event counts an item once)."""
    occurrences = [
        (n, i, item)
        for n, items in enumerate(events)
        for i, item in enumerate(dict.fromkeys(items))
    ]
    first: dict = {}
    for n, i, item in occurrences:
        first.setdefault(item, (n, i))
    allowed = set(sorted(first, key=first.get)[:l0])
    seen: dict = {}
    out = [[] for _ in events]
    for n, _, item in occurrences:
        if item in allowed and seen.get(item, 0) < linf:
            seen[item] = seen.get(item, 0) + 1
            out[n].append(item)
    return [tuple(o) for o in out]


def test_a_heavy_user_keeps_exactly_the_first_contributions_others_untouched():
    rng = random.Random(3)  # simulated events (test data)
    items = [f"i{k}" for k in range(50)]
    heavy = [tuple(rng.sample(items, rng.randint(1, 4))) for _ in range(1000)]
    light = {f"u{n}": [tuple(rng.sample(items, rng.randint(1, 2)))] for n in range(30)}
    stream = [("heavy", e) for e in heavy] + [(u, e) for u, es in light.items() for e in es]
    rng.shuffle(stream)  # interleaved users
    heavy = [e for u, e in stream if u == "heavy"]  # the heavy user's events, in arrival order
    hasher = UserHasher(fixed_key("bounder"))
    for l0, linf in [(5, 3), (1, 1), (50, 2), (7, 1000)]:
        b = ContributionBounder(UserBounds(l0, linf))
        kept = []
        for start in range(0, len(stream), 37):  # in batches, as steps
            batch = stream[start : start + 37]
            out, pending = b.bound([(hasher(u), e) for u, e in batch])
            b.commit(pending)
            kept += list(zip([u for u, _ in batch], out, strict=True))
        mine = [k for u, k in kept if u == "heavy"]
        assert mine == reference_kept(heavy, l0, linf)
        counts = {}
        for k in mine:
            for item in k:
                counts[item] = counts.get(item, 0) + 1
        assert len(counts) == min(l0, 50) and max(counts.values()) <= linf
        for u, k in kept:
            if u != "heavy":
                assert k == reference_kept(light[u], l0, linf)[0]
        assert b.kept_of(hasher("heavy")) == counts
    # the twin is not vacuous: it differs from "keep everything"
    assert reference_kept(heavy, 5, 3) != heavy


def test_bounding_is_a_function_of_the_users_own_events():
    """Removing another user changes nothing that a user keeps."""
    rng = random.Random(11)  # simulated events
    stream = [(f"u{rng.randint(0, 5)}", (f"i{rng.randint(0, 9)}",)) for _ in range(400)]
    hasher = UserHasher(fixed_key("f"))

    def kept(events):
        b = ContributionBounder(UserBounds(3, 2))
        out, pending = b.bound([(hasher(u), e) for u, e in events])
        return [(u, k) for (u, _), k in zip(events, out, strict=True)]

    full = kept(stream)
    without = kept([e for e in stream if e[0] != "u2"])
    assert [x for x in full if x[0] != "u2"] == without


def test_a_rejected_batch_leaves_the_bounder_and_mechanism_unchanged():
    key = fixed_key("reject")
    h = dps.KnownDomainHistogram(
        ["a", "b"], 10, key=key, rho=1, max_items_per_user=1, max_count_per_item=1
    )
    h.step_batch([("u", ["a"])])
    with pytest.raises(dps.InvalidEventError):
        h.step_batch([("v", ["b"]), ("w", ["zzz"])])  # an item outside the domain
    with pytest.raises(dps.InvalidEventError):
        h.step_batch([["a", "b"]])  # not a (user, items) pair
    assert h.t == 1 and len(h._users.bounder) == 1
    rel = h.step_batch([("v", ["b"]), ("u", ["b"])])  # u is at L0 = 1: its b is dropped
    assert h.counts.tolist() == [1, 1] and rel.t == 2
    # an invalid item is reported even when its user is over the bounds
    with pytest.raises(dps.InvalidEventError):
        h.step_batch([("u", ["zzz"])])


def test_user_ids_are_kept_only_as_keyed_hashes_and_the_snapshot_holds_no_key():
    key = fixed_key("snap")
    u = dps.UnknownDomainHistogram(
        20, key=key, rho=1, threshold_delta=1e-6, max_items_per_user=2, max_count_per_item=2
    )
    u.step_batch([("alice@example.org", ["x"]), ("bob@example.org", ["y", "z"])])
    blob = dump_snapshot(u, key)
    assert b"alice@example.org" not in blob and b"bob@example.org" not in blob
    assert key.to_bytes() not in blob
    assert key.derive("user-id/v1") not in blob
    again = load_snapshot(blob, key)
    r1 = u.step_batch([("alice@example.org", ["x"]), ("carol", ["x"])])
    r2 = again.step_batch([("alice@example.org", ["x"]), ("carol", ["x"])])
    assert r1.items == r2.items and np.array_equal(r1.values, r2.values)
    # the hash is keyed: another key gives another hash, and no item id collides with it
    other = UserHasher(fixed_key("other"))
    assert UserHasher(key)("alice") != other("alice")
    src = dps.NoiseSource(key, "any")
    assert UserHasher(key)("alice") != src.item_ids(["alice"]).tobytes()
    # plain pickling keeps the key object (as NoiseKey itself does), not a derived key
    assert key.derive("user-id/v1") not in pickle.dumps(UserHasher(key))


def test_one_shot_guarantees_with_a_count_per_item_bound():
    from dpstream.oneshot import gaussian_histogram_privacy, gumbel_top_k_privacy

    g = gumbel_top_k_privacy(tau=2.0, k=3, max_count_per_item=2, unit="user")
    assert g.rho == pytest.approx(3 * 4 / 4.0) and g.unit == "user"
    s = gumbel_top_k_privacy(tau=2.0, k=3, with_counts=False, max_count_per_item=3)
    assert s.rho == pytest.approx(3 / 2 * 9 / 4.0) and s.unit == "event"
    h = gaussian_histogram_privacy(tau=2.0, max_items=5, max_count_per_item=2, unit="user")
    # a Gaussian mechanism with sensitivity sqrt(5) * 2 (each of 5 counts moved by 2)
    assert privacy.gaussian_delta(h.epsilon, math.sqrt(5) * 2 / 2.0) <= h.delta
    with pytest.raises(ValueError):
        gaussian_histogram_privacy(tau=1.0, unit="person")


@pytest.mark.parametrize(
    "make",
    [
        lambda **u: dps.KnownDomainHistogram(["a", "b"], 10, max_items=2, **u),
        lambda **u: dps.UnknownDomainHistogram(10, max_items=2, threshold_delta=1e-6, **u),
        lambda **u: dps.ContinualTopK(["a", "b"], 10, k=1, switches=2, **u),
    ],
    ids=["known", "unknown", "topk"],
)
def test_user_level_refuses_event_columns_which_hold_no_users(make):
    from dpstream.mechanisms.columns import EventColumns

    mech = make(key=fixed_key("cols"), rho=1.0, max_items_per_user=2, max_count_per_item=1)
    cols = EventColumns(["a", "b"], np.array([0, 1]), np.array([0, 2]))
    with pytest.raises(TypeError, match="not EventColumns"):
        mech.step_batch(cols)
    assert mech.t == 0  # nothing changed
    assert mech.step_batch([("alice", ["a"])]).t == 1  # pairs are taken


@pytest.mark.parametrize("kind", ["known", "unknown", "top-k", "histogram-top-k"])
def test_aggregate_counts_of_a_user_level_mechanism_must_be_said_to_be_bounded(kind):
    """Review 93: release(t, counts) of a mechanism built with user bounds released
    counts no user bound had touched ({"a": 1000} from one user) under a per-user
    guarantee. It is refused unless bounded=True says the caller bounded them."""
    from dpstream.mechanisms.histogram_topk import HistogramTopK

    key = fixed_key("aggregate-users")
    users = {"max_items_per_user": 1, "max_count_per_item": 1}
    make = {
        "known": lambda: dps.KnownDomainHistogram(["a", "b"], 10, key=key, rho=1.0, **users),
        "unknown": lambda: dps.UnknownDomainHistogram(
            10, max_items=1, key=key, rho=1.0, threshold_delta=1e-6, **users
        ),
        "top-k": lambda: dps.ContinualTopK(
            ["a", "b"], 10, k=1, key=key, rho=1.0, switches=2, **users
        ),
        "histogram-top-k": lambda: HistogramTopK(
            ["a", "b"], 10, k=1, max_items=1, key=key, rho=1.0, **users
        ),
    }[kind]
    mech = make()
    assert mech.privacy.unit == "user"
    with pytest.raises(ValueError, match="pass bounded=True"):
        mech.release(1, {"a": 1000})
    assert mech.t == 0  # refused before anything changed
    rel = mech.release(1, {"a": 1}, bounded=True)
    assert rel.t == 1
    event_level = {
        "known": lambda: dps.KnownDomainHistogram(["a", "b"], 10, key=key, rho=1.0, max_items=1),
    }
    if kind in event_level:  # an event-level mechanism needs no word
        assert event_level[kind]().release(1, {"a": 1000}).t == 1


def test_durations_are_not_items_and_a_spend_is_positive():
    """Review 93: np.timedelta64 (a NumPy integer subclass) was counted as the int it
    holds, in events and domains; a Spend of negative epsilon composed into a budget
    that passed its cap. Both are refused."""
    key = fixed_key("durations")
    h = dps.KnownDomainHistogram([5, 7], 4, key=key, rho=1.0, max_items=2)
    with pytest.raises(dps.InvalidEventError, match="a duration"):
        h.step(np.array([5, 7], dtype="timedelta64[ns]"))
    with pytest.raises(TypeError, match="a duration"):
        dps.KnownDomainHistogram(np.array([5, 7], dtype="timedelta64[ns]"), 4, key=key, rho=1.0,
                                 max_items=2)  # fmt: skip
    from dpstream.privacy.composition import Spend

    with pytest.raises(ValueError, match="not a valid privacy cost"):
        Spend(rho=1e-9, rho_delta=0.0, epsilon=-19.5, delta=1e-9, unit="event", label="x")


def test_truncation_is_refused_at_user_level_where_it_could_not_apply():
    """Review 93: on_invalid="truncate" with user bounds was accepted, then an event
    over max_items (or outside the domain) raised instead of being truncated. The
    combination is refused when the mechanism is built; at event level it truncates."""
    key = fixed_key("truncate-users")
    users = {"max_items_per_user": 2, "max_count_per_item": 1}
    with pytest.raises(ValueError, match="works at event level only"):
        dps.KnownDomainHistogram(["a", "b"], 4, key=key, rho=1.0, max_items=1,
                                 on_invalid="truncate", **users)  # fmt: skip
    with pytest.raises(ValueError, match="works at event level only"):
        dps.UnknownDomainHistogram(4, max_items=1, key=key, rho=1.0, threshold_delta=1e-6,
                                   on_invalid="truncate", **users)  # fmt: skip
    h = dps.KnownDomainHistogram(["a", "b"], 4, key=key, rho=1.0, max_items=1,
                                 on_invalid="truncate")  # fmt: skip
    h.step(["a", "b"])
    assert h.truncation.events == 1


def test_a_bytearray_user_id_is_the_user_of_its_bytes():
    """Review 93: a bytearray user id failed with "unhashable type" (the hasher took
    it); it is the user its bytes are, bounded with that user's other events."""
    key = fixed_key("bytearray-user")
    users = {"max_items_per_user": 1, "max_count_per_item": 1}
    a = dps.KnownDomainHistogram(["a", "b"], 4, key=key, rho=1.0, **users)
    b = dps.KnownDomainHistogram(["a", "b"], 4, key=key, rho=1.0, **users)
    got = a.step_batch([(bytearray(b"u1"), ["a"]), (b"u1", ["b"])])
    want = b.step_batch([(b"u1", ["a"]), (b"u1", ["b"])])
    assert a.counts.tolist() == [1, 0]  # one user: its second item is over L0 = 1
    assert np.array_equal(got.values, want.values)


def test_the_tree_refuses_a_noise_std_where_no_count_is_released():
    """Review 93: the tree counter gave noise_std_at(0) = 0 and a number past the
    horizon, where the BLT counter refuses both; both refuse now."""
    key = fixed_key("noise-std")
    for counter in ("tree", "blt"):
        h = dps.KnownDomainHistogram(["a"], 8, key=key, rho=1.0, max_items=1, counter=counter)
        assert h.noise_std_at(1) > 0 and h.noise_std_at(8) > 0
        for t in (0, 9):
            with pytest.raises(ValueError):
                h.noise_std_at(t)
