"""Regression tests for input validation found in review: every bad input is refused.

Each case once produced a silently wrong release (a float count truncated, a
bool counted as the item 1, ...) or left a mechanism in a broken state.
"""

from __future__ import annotations

import numpy as np
import pytest

import dpstream as dps
from dpstream import tree

from .conftest import fixed_key

KEY = fixed_key("validation")


@pytest.mark.parametrize("bad", [2.7, 2.0, True, "7", None])
def test_aggregate_counts_must_be_ints(bad):
    h = dps.KnownDomainHistogram(["a", "b"], 10, max_items=1, key=KEY, rho=1.0)
    with pytest.raises(TypeError, match="integers"):
        h.release(1, {"a": bad})
    u = dps.UnknownDomainHistogram(10, max_items=1, key=KEY, rho=1.0, threshold_delta=1e-3)
    with pytest.raises(TypeError, match="integers"):
        u.release(1, {"a": 3, "b": bad})
    c = dps.TreeCounter(10, key=KEY, rho=1.0)
    if not isinstance(bad, bool):
        with pytest.raises(TypeError):
            c.release(1, bad)
    # nothing was released: step 1 is still available
    assert h.t == 0 and u.t == 0 and c.t == 0
    assert h.release(1, {"a": 2}).t == 1


def test_a_pandas_series_of_counts_is_read_by_its_index():
    """A Series from value_counts() (sorted by count) gives the release of the same counts
    as a dict, for every aggregate mode, never its values by position (review 72: the
    domain's three items were released as each other's counts); an item that labels
    two counts is refused, and nothing is released then."""
    pd = pytest.importorskip("pandas")
    domain = ["aspirin", "ibuprofen", "paracetamol"]
    events = pd.Series(["paracetamol"] * 50 + ["ibuprofen"] * 30 + ["aspirin"] * 2)
    series = events.value_counts()
    assert series.index.tolist() == ["paracetamol", "ibuprofen", "aspirin"]
    as_dict = {"aspirin": 2, "ibuprofen": 30, "paracetamol": 50}

    def makers():
        yield lambda: dps.KnownDomainHistogram(domain, 10, max_items=1, key=KEY, rho=1.0)
        yield lambda: dps.ContinualTopK(domain, 10, k=2, switches=2, key=KEY, rho=1.0)
        yield lambda: dps.UnknownDomainHistogram(
            10, max_items=1, key=KEY, rho=1.0, threshold_delta=1e-3
        )

    for make in makers():
        want, got = make().release(1, as_dict), make().release(1, series)
        assert got.items == want.items
        assert np.array_equal(got.values, want.values)
        twice = pd.Series([2, 3], index=["aspirin", "aspirin"])
        m = make()
        with pytest.raises(ValueError, match="names an item twice"):
            m.release(1, twice)
        assert m.t == 0


def test_one_shot_and_unknown_top_k_read_a_series_by_its_index():
    """The one-shot Gaussian histogram and UnknownTopK's aggregate mode read a pandas
    Series of counts by its index too (review 75): the one-shot released each item with
    another's count, UnknownTopK checked the counts, not the items, against its domain
    (an item outside it passed when a count was an item of an integer domain)."""
    pd = pytest.importorskip("pandas")
    from dpstream.mechanisms.histogram_topk import UnknownTopK

    series = pd.Series({"c": 5, "a": 1, "b": 0})
    kw = dict(tau=1e-9, key=KEY, purpose="series")
    from dpstream.oneshot.known import gaussian_histogram

    got = gaussian_histogram(series, items=None, **kw)
    want = gaussian_histogram({"c": 5, "a": 1, "b": 0}, **kw)
    assert got.items == want.items and np.array_equal(got.values, want.values)
    assert dict(zip(got.items, np.round(got.values).tolist(), strict=True))["c"] == 5
    with pytest.raises(ValueError, match="items= only with an array"):  # never by position
        gaussian_histogram(series, items=["a", "b", "c"], **kw)

    def top(domain):
        return UnknownTopK(domain, 10, k=1, max_items=2, key=KEY, epsilon=50.0, delta=0.1)

    counts = {"a": 3, "b": 1}
    want_top = top(["a", "b", "c"]).release(1, counts)
    got_top = top(["a", "b", "c"]).release(1, pd.Series(counts))
    assert got_top.items == want_top.items and np.array_equal(got_top.values, want_top.values)
    with pytest.raises(dps.InvalidEventError, match="not in the domain"):
        top([1, 2, 3]).release(1, pd.Series({99: 3}))


def test_a_frame_of_two_count_columns_is_refused_in_words():
    pd = pytest.importorskip("pandas")
    h = dps.UnknownDomainHistogram(10, max_items=1, key=KEY, rho=1.0, threshold_delta=1e-3)
    with pytest.raises(ValueError, match="one of them 'count'"):
        h.release(1, pd.DataFrame([[1, 2]], columns=["count", "count"]))


def test_a_frame_of_counts_names_its_count_column():
    """Two columns are read as items and counts only when one is named ``count``
    (``value_counts().reset_index()``), never by position: with integer items a
    (count, item) frame was read with the counts as items (review 72)."""
    pd = pytest.importorskip("pandas")

    def make():
        return dps.KnownDomainHistogram([1, 2, 3], 10, max_items=1, key=KEY, rho=1.0)

    want = make().release(1, {1: 5, 2: 0, 3: 2})
    named = pd.Series([1] * 5 + [3] * 2, name="id").value_counts().reset_index()
    assert list(named.columns) == ["id", "count"]
    assert np.array_equal(make().release(1, named).values, want.values)
    swapped = pd.DataFrame({"n": [5, 2], "id": [1, 3]})
    m = make()
    with pytest.raises(ValueError, match="one of them 'count'"):
        m.release(1, swapped)
    assert m.t == 0


def test_a_count_past_int64_is_refused_in_words():
    for make in (
        lambda: dps.KnownDomainHistogram(["a"], 10, max_items=1, key=KEY, rho=1.0),
        lambda: dps.UnknownDomainHistogram(10, max_items=1, key=KEY, rho=1.0, threshold_delta=1e-3),
    ):
        with pytest.raises(ValueError, match="fit in int64"):
            make().release(1, {"a": 2**63})


def test_float_array_counts_refused():
    h = dps.KnownDomainHistogram(["a", "b"], 10, max_items=1, key=KEY, rho=1.0)
    with pytest.raises(TypeError, match="integers"):
        h.release(1, np.array([1.0, 2.0]))


@pytest.mark.parametrize("bad_item", [True, 2.0, 1.5, None, ("a",)])
def test_event_items_must_be_str_int_or_bytes(bad_item):
    # True == 1 and 2.0 == 2 in Python: without the type rule they would count for 1 and 2
    h = dps.KnownDomainHistogram([1, 2], 10, max_items=2, key=KEY, rho=1.0)
    with pytest.raises(dps.InvalidEventError, match="str, int or bytes"):
        h.step([bad_item])
    with pytest.raises(TypeError):
        h.step([1, bad_item])
    assert h.t == 0 and h.counts.tolist() == [0, 0]
    u = dps.UnknownDomainHistogram(10, max_items=2, key=KEY, rho=1.0, threshold_delta=1e-3)
    u.step([1])
    with pytest.raises(dps.InvalidEventError):
        u.step([bad_item])
    assert u.t == 1


def test_numpy_items_are_released_as_python_ints():
    h = dps.KnownDomainHistogram(np.arange(3), 10, max_items=1, key=KEY, tau=1.0)
    rel = h.step([np.int64(1)])
    assert all(type(item) is int for item in rel.items)
    assert h.counts.tolist() == [0, 1, 0]
    ref = dps.KnownDomainHistogram([0, 1, 2], 10, max_items=1, key=KEY, tau=1.0)
    assert np.array_equal(rel.values, ref.step([1]).values)


def test_horizon_and_base_bounds():
    with pytest.raises(ValueError, match="horizon"):
        dps.KnownDomainHistogram(["a"], 2**63 + 1, max_items=1, key=KEY, rho=1.0)
    with pytest.raises(ValueError, match="base"):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=KEY, rho=1.0, base=11)
    assert dps.KnownDomainHistogram(["a"], 10, max_items=1, key=KEY, rho=1.0, base=10).levels == 2
    assert dps.KnownDomainHistogram(["a"], 1, max_items=1, key=KEY, rho=1.0, base=2).levels == 1


def test_optimal_base_is_fast_for_huge_horizons(monkeypatch):
    # O(log T) candidates: a horizon of 2^63 once hung. Counted in evaluations of the
    # cost, not in seconds (the machine's pace is not what is tested): at most one per
    # number of levels, 2 .. bit_length + 1, and one for base 2.
    calls = []
    real = tree.paper_variance_factor
    monkeypatch.setattr(tree, "paper_variance_factor", lambda T, r: calls.append(r) or real(T, r))
    r = tree.optimal_base(2**63)
    assert len(calls) <= (2**63).bit_length() + 1
    monkeypatch.undo()
    levels = tree.num_levels(2**63, r)
    # no other base has a smaller cost: check every base that gives L levels or fewer
    for other_levels in range(2, 65):
        cand = tree.integer_root(2**63, other_levels) + 1
        assert (r - 1) * levels**2 <= tree.paper_variance_factor(2**63, max(cand, 2))


@pytest.mark.parametrize(
    "n,k",
    [
        (0, 3),
        (1, 5),
        (26, 3),
        (27, 3),
        (28, 3),
        (2**64 - 1, 2),
        (10**30, 7),
        (3**40, 40),
        (3**40 - 1, 40),
    ],
)
def test_integer_root_exact(n, k):
    x = tree.integer_root(n, k)
    assert x**k <= n < (x + 1) ** k


@pytest.mark.parametrize("epsilon,delta", [(0.01, 1e-6), (0.01, 1e-15), (1.0, 1e-6), (3.0, 1e-5)])
def test_reported_epsilon_never_exceeds_the_calibration_target(epsilon, delta):
    # the inverse curves are solved numerically; a review saw 0.010000000000002 for 0.01
    mechanisms = [
        dps.KnownDomainHistogram(["a"], 1000, max_items=2, key=KEY, epsilon=epsilon, delta=delta),
        dps.UnknownDomainHistogram(1000, max_items=2, key=KEY, epsilon=epsilon, delta=delta),
        dps.TreeCounter(1000, key=KEY, epsilon=epsilon, delta=delta),
        dps.MetaHistogram(
            1000,
            oneshot="unknown-gaussian",
            max_items=2,
            kbar=5,
            key=KEY,
            epsilon=epsilon,
            delta=delta,
        ),
        dps.ContinualTopK(
            ["a", "b"], 1000, k=1, switches=2, eta=1.0, key=KEY, epsilon=epsilon, delta=delta
        ),
    ]
    for m in mechanisms:
        assert m.privacy.epsilon <= epsilon and m.privacy.delta <= delta, type(m).__name__
