"""KnownGauss (algo:kGauss) and KnownGumb (algo:kGumb), the known-domain one-shot mechanisms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpstream.oneshot.known import (
    gaussian_histogram,
    gaussian_histogram_privacy,
    gumbel_top_k,
    gumbel_top_k_privacy,
)

from .conftest import Z_TOL, fixed_key

#: Significance level of the chi-square tests: the two-sided normal tail at Z_TOL = 5
#: (5.7e-7), so an honest sampler fails about once in two million runs.
CHI2_ALPHA = 2 * stats.norm.sf(Z_TOL)

COUNTS = {"a": 0, "b": 1, "c": 2, "d": 3}
TAU = 2.0  # exp(2 h / tau) = exp(h): the weights are e^0, e^1, e^2, e^3
N_KEYS = 20_000


def em_probabilities(h, tau):
    """Exponential mechanism with weights exp(2 h / tau), written out independently."""
    w = np.exp(2 * np.asarray(h, dtype=float) / tau)
    return w / w.sum()


def chi2_pvalue(observed, probs):
    observed = np.asarray(observed, dtype=float)
    return stats.chisquare(observed, observed.sum() * np.asarray(probs)).pvalue


@pytest.fixture(scope="module")
def top1_and_top2_samples():
    """One k=1 and one k=2 selection per key over N_KEYS fixed keys."""
    items = list(COUNTS)
    first = np.zeros(len(items), dtype=np.int64)
    pairs = {}
    for i in range(N_KEYS):
        key = fixed_key(f"gumbel-chi2-{i}")
        out1 = gumbel_top_k(COUNTS, k=1, tau=TAU, key=key, purpose="test/k1", with_counts=False)
        first[items.index(out1.items[0])] += 1
        out2 = gumbel_top_k(COUNTS, k=2, tau=TAU, key=key, purpose="test/k2", with_counts=False)
        pairs[out2.items] = pairs.get(out2.items, 0) + 1
    return first, pairs


@pytest.mark.statistical
def test_top1_is_the_exponential_mechanism(top1_and_top2_samples):
    """k=1 selects u with probability exp(2 h_u / tau) / sum: chi-square over 20,000 keys.

    df = 3; we reject at CHI2_ALPHA = 5.7e-7. Power check on the same data: a
    Gumbel scale 30% too large (weights exp(2 h / (1.3 tau))) or the EM with
    the usual exp(eps h / 2) mis-scaling (weights exp(h / tau)) must be rejected.
    """
    first, _ = top1_and_top2_samples
    h = list(COUNTS.values())
    p = chi2_pvalue(first, em_probabilities(h, TAU))
    print(f"k=1 chi-square p-value {p:.3g}; observed {first.tolist()}")
    assert p > CHI2_ALPHA
    assert chi2_pvalue(first, em_probabilities(h, 1.3 * TAU)) < CHI2_ALPHA
    assert chi2_pvalue(first, em_probabilities(h, 2 * TAU)) < CHI2_ALPHA


@pytest.mark.statistical
def test_top2_is_peeling_exponential_mechanism(top1_and_top2_samples):
    """k=2 gives the ordered pair (u, v) with probability p_u p_v / (1 - p_u) (peeling EM).

    12 ordered pairs, df = 11, same significance level as above.
    """
    _, pairs = top1_and_top2_samples
    items = list(COUNTS)
    p = em_probabilities(list(COUNTS.values()), TAU)
    cells = list(itertools.permutations(range(len(items)), 2))
    expected = [p[u] * p[v] / (1 - p[u]) for u, v in cells]
    assert math.isclose(sum(expected), 1.0)
    observed = [pairs.get((items[u], items[v]), 0) for u, v in cells]
    assert sum(observed) == N_KEYS
    pv = chi2_pvalue(observed, expected)
    print(f"k=2 chi-square p-value {pv:.3g}")
    assert pv > CHI2_ALPHA
    # power: an unordered selection (pair order uniform) must be rejected
    wrong = [(p[u] * p[v] / (1 - p[u]) + p[v] * p[u] / (1 - p[v])) / 2 for u, v in cells]
    assert chi2_pvalue(observed, wrong) < CHI2_ALPHA


@pytest.mark.statistical
def test_gaussian_histogram_noise_is_n0_tau2():
    """noisy - true over 100 keys x 2000 items is N(0, tau^2).

    n = 200,000 independent draws: the mean is allowed Z_TOL tau/sqrt(n) and the
    variance ratio Z_TOL sqrt(2/n) = 1.6% (normal data), as in test_known.py.
    """
    tau, n_items = 1.7, 2000
    domain = [f"x{i}" for i in range(n_items)]
    true = np.arange(n_items) % 7
    diffs = []
    for i in range(100):
        out = gaussian_histogram(
            true, items=domain, tau=tau, key=fixed_key(f"kg{i}"), purpose="test/kgauss"
        )
        assert out.items == tuple(domain)
        diffs.append(out.values - true)
    x = np.concatenate(diffs)
    n = x.size
    assert abs(x.mean()) < Z_TOL * tau / math.sqrt(n)
    assert abs(x.var() / tau**2 - 1) < Z_TOL * math.sqrt(2 / n)


@pytest.mark.statistical
def test_gumbel_counts_are_true_counts_plus_fresh_gaussian():
    """The released counts of the selected items are h_u + N(0, tau^2), fresh noise.

    50 items with equal counts (so the selection is uniform), k = 10, 5000 keys:
    n = 50,000 draws, tolerances as above. The Gaussian noise must not be
    correlated with the Gumbel noise that won the selection: a count that
    reused the Gumbel draw would be biased upwards by about tau (E max Gumbel).
    """
    tau, n_items, k = 3.0, 50, 10
    hist = dict.fromkeys(range(n_items), 5)
    diffs = []
    for i in range(5000):
        out = gumbel_top_k(hist, k=k, tau=tau, key=fixed_key(f"kgc{i}"), purpose="test/kgumb")
        assert len(set(out.items)) == k
        diffs.append(out.values - 5)
    x = np.concatenate(diffs)
    n = x.size
    assert abs(x.mean()) < Z_TOL * tau / math.sqrt(n)
    assert abs(x.var() / tau**2 - 1) < Z_TOL * math.sqrt(2 / n)


def test_selection_follows_clear_counts_and_order():
    hist = {f"i{u}": 1000 * u for u in range(20)}
    out = gumbel_top_k(hist, k=3, tau=1.0, key=fixed_key("clear"), purpose="test/clear")
    assert out.items == ("i19", "i18", "i17")
    assert np.all(np.abs(out.values - np.array([19000, 18000, 17000])) < 10)  # 10 sigma


def test_deterministic_and_purposes_independent():
    hist = {u: u % 5 for u in range(100)}
    key = fixed_key("det")
    a = gumbel_top_k(hist, k=5, tau=1.0, key=key, purpose="p1")
    b = gumbel_top_k(hist, k=5, tau=1.0, key=key, purpose="p1")
    c = gumbel_top_k(hist, k=5, tau=1.0, key=key, purpose="p2")
    assert a.items == b.items and np.array_equal(a.values, b.values)
    assert not np.array_equal(a.values, c.values)
    # the array form with items= gives the same release as the Mapping form
    arr = gumbel_top_k(
        np.array(list(hist.values())), items=list(hist), k=5, tau=1.0, key=key, purpose="p1"
    )
    assert arr.items == a.items and np.array_equal(arr.values, a.values)
    # selection-only gives the same selection
    sel = gumbel_top_k(hist, k=5, tau=1.0, key=key, purpose="p1", with_counts=False)
    assert sel.items == a.items and sel.values is None
    with pytest.raises(ValueError, match="selection only"):
        _ = sel.counts
    g1 = gaussian_histogram(hist, tau=1.0, key=key, purpose="p1")
    g2 = gaussian_histogram(hist, tau=1.0, key=key, purpose="p1")
    assert np.array_equal(g1.values, g2.values)
    # the counts of gumbel_top_k and gaussian_histogram share the (purpose, draw) address
    pos = [list(hist).index(u) for u in a.items]
    assert np.array_equal(g1.values[pos], a.values)


def test_input_errors():
    key = fixed_key("err")
    with pytest.raises(ValueError, match="k must be at most"):
        gumbel_top_k({"a": 1}, k=2, tau=1.0, key=key, purpose="e")
    with pytest.raises(ValueError, match="k must be >= 1"):
        gumbel_top_k({"a": 1}, k=0, tau=1.0, key=key, purpose="e")
    with pytest.raises(ValueError, match="tau"):
        gaussian_histogram({"a": 1}, tau=0.0, key=key, purpose="e")
    with pytest.raises(ValueError, match="distinct"):
        gaussian_histogram([1, 2], items=["a", "a"], tau=1.0, key=key, purpose="e")
    with pytest.raises(TypeError, match="items="):  # a bare list is not a histogram
        gaussian_histogram([1, 2], tau=1.0, key=key, purpose="e")
    with pytest.raises(TypeError, match="bool"):  # True would be the item 1
        gaussian_histogram({True: 1}, tau=1.0, key=key, purpose="e")
    # NumPy integer labels come back as Python ints (a label never shows its origin)
    sel = gumbel_top_k({np.int64(3): 5, 4: 1}, k=1, tau=0.01, key=key, purpose="e")
    assert sel.items == (3,) and type(sel.items[0]) is int
    assert (
        gaussian_histogram({"a": 2}, tau=1.0, key=key, purpose="e").rounded().values.dtype
        == np.int64
    )
    with pytest.raises(ValueError, match=">= 0"):
        gaussian_histogram({"a": -1}, tau=1.0, key=key, purpose="e")
    with pytest.raises(TypeError, match="integers"):
        gaussian_histogram({"a": 0.5}, tau=1.0, key=key, purpose="e")
    with pytest.raises(TypeError):
        gaussian_histogram({"a": 1}, tau=1.0, key=key)  # purpose is required
    assert len(gaussian_histogram({}, tau=1.0, key=key, purpose="e")) == 0


def test_privacy_matches_the_theorems():
    g = gaussian_histogram_privacy(tau=2.0, max_items=3)
    assert g.rho == pytest.approx(3 / (2 * 4.0), rel=1e-12)
    assert g.conversion == "gaussian-exact"
    g = gumbel_top_k_privacy(tau=2.0, k=5)
    assert g.rho == pytest.approx(5 / 4.0, rel=1e-12)  # k / tau^2
    assert g.conversion != "gaussian-exact"
    g = gumbel_top_k_privacy(tau=2.0, k=5, with_counts=False)
    assert g.rho == pytest.approx(5 / 8.0, rel=1e-12)  # k / (2 tau^2)
    # the paper's conversion is an upper bound on the reported epsilon
    bs = 5 / 4.0 + 2 / 2.0 * math.sqrt(5 * math.log(1 / 1e-6))
    assert gumbel_top_k_privacy(tau=2.0, k=5, delta=1e-6).epsilon <= bs
