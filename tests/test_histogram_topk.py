"""HistogramTopK (top-k of KnownBase, post-processing) and choose_top_k."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtri

import dpstream as dps
from dpstream import tree
from dpstream.mechanisms.histogram_topk import HistogramTopK, choose_top_k
from dpstream.mechanisms.topk import ContinualTopK

from .conftest import Z_TOL, fixed_key


def _blt_stds(strategy, tau: float) -> np.ndarray:
    """The std of a BLT count at t = 1..T for noise scale tau, from dense matrices:
    sigma ||row_t(B)||, B = A C^-1, sigma = tau max_j ||C e_j|| (not the code's closed form)."""
    from scipy.linalg import toeplitz

    T = strategy.horizon
    C = np.tril(toeplitz(strategy.strategy_column()))
    B = np.tril(np.ones((T, T))) @ np.linalg.inv(C)
    sigma = tau * math.sqrt(np.sum(C * C, axis=0).max())
    return sigma * np.sqrt(np.sum(B * B, axis=1))


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_the_list_is_the_top_k_of_knownbase_once_started(counter):
    """Brute force against KnownDomainHistogram on the same key and stream: empty with
    status "not yet" until the largest noisy count exceeds z sigma_t (z =
    Phi^-1(1 - 0.05/(d T)), sigma_t the std of a count at t with the run's counter),
    then the k largest noisy counts, largest first."""
    d, horizon, k = 30, 80, 4
    rng = np.random.default_rng(4)
    rates = rng.uniform(0, 3, size=d)
    key = fixed_key("htopk")
    m = HistogramTopK(range(d), horizon, k=k, max_items=2, key=key, tau=0.7, counter=counter)
    ref = dps.KnownDomainHistogram(range(d), horizon, max_items=2, key=key, tau=0.7,
                                   counter=counter)
    stds = _blt_stds(ref.strategy, 0.7) if counter == "blt" else None
    z = float(-ndtri(0.05 / (d * horizon)))
    counts = np.zeros(d, dtype=np.int64)
    started = waited = 0
    for t in range(1, horizon + 1):
        if t > 5:  # five empty steps first: the list waits (unless noise alone clears z sigma)
            counts = counts + rng.poisson(rates)
        rel, full = m.release(t, counts), ref.release(t, counts)
        order = np.argsort(-full.values, kind="stable")[:k]
        sigma = (stds[t - 1] if stds is not None
                 else 0.7 * math.sqrt(sum(tree.digits(t, m.base)) * m.levels))
        started = started or full.values[order[0]] > z * sigma
        if not started:
            assert rel.items == [] and rel.meta == {"status": "not yet"}
            waited += 1
            continue
        assert list(rel.items) == [full.items[i] for i in order]
        assert np.array_equal(rel.values, full.values[order])
        assert rel.meta == {"status": "selected"}
    assert waited >= 1 and started
    assert m.privacy == ref.privacy  # post-processing: KnownBase's guarantee


def test_an_empty_stream_rarely_starts_a_list():
    """All counts 0: a list is started with probability <= 0.05 (union bound over d and T).
    200 keys, allowed 0.05 + Z_TOL SE; a threshold of z sigma with z = 1 starts at once."""
    d, horizon, n = 20, 50, 200
    zeros = np.zeros(d, dtype=np.int64)
    started = 0
    for rep in range(n):
        m = HistogramTopK(range(d), horizon, k=3, max_items=1, key=fixed_key(f"e{rep}"),
                          rho=1.0)
        started += any(m.release(t, zeros).items for t in range(1, horizon + 1))
    assert started / n <= 0.05 + Z_TOL * math.sqrt(0.05 * 0.95 / n)
    m = HistogramTopK(range(d), horizon, k=3, max_items=1, key=fixed_key("e0"), rho=1.0)
    m.start_z = 1.0  # too low: noise alone clears it
    assert any(m.release(t, zeros).items for t in range(1, 4))


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_choose_top_k_compares_the_count_noise_of_the_candidates(counter):
    """The errors compared are the worst-step std of a count with the run's counter:
    tau_2 sqrt(max_t |I_t| L_r) (SparseGumb's counters) and KnownBase's tau sqrt(max_t
    |I_t| L_r) for the tree; for BLT, sigma max_t ||row_t(B)|| with sigma from tau_2 and
    tau (dense matrices). The smaller one wins and is built."""
    domain = [f"i{j}" for j in range(50)]
    horizon = 500
    r = tree.optimal_base(horizon)
    factor = math.sqrt(tree.max_cells(horizon, r) * tree.num_levels(horizon, r))
    for max_items, want in ((2, "KnownBase top-k"), (400, "SparseGumb")):
        c = choose_top_k(domain, horizon, k=5, switches=3, max_items=max_items,
                         key=fixed_key("c"), epsilon=1.0, delta=1e-6, counter=counter)
        sparse = ContinualTopK(domain, horizon, k=5, switches=3, key=fixed_key("c"),
                               epsilon=1.0, delta=1e-6, counter=counter)
        known = dps.KnownDomainHistogram(domain, horizon, max_items=max_items,
                                         key=fixed_key("c"), epsilon=1.0, delta=1e-6,
                                         counter=counter)
        if counter == "blt":
            worst_sparse = _blt_stds(sparse.strategy, sparse.tau_2).max()
            worst_known = _blt_stds(known.strategy, known.tau).max()
        else:
            worst_sparse, worst_known = sparse.tau_2 * factor, known.tau * factor
        assert c.errors["SparseGumb"] == pytest.approx(worst_sparse, rel=1e-9)
        assert c.errors["KnownBase top-k"] == pytest.approx(worst_known, rel=1e-9)
        assert c.mechanism.counter == counter
        assert c.name == want and c.name in c.reason
        assert isinstance(c.mechanism, HistogramTopK if want == "KnownBase top-k"
                          else ContinualTopK)
        assert c.mechanism.privacy.epsilon <= 1.0


def test_events_over_max_items_are_refused():
    m = HistogramTopK(["a", "b", "c"], 10, k=1, max_items=1, key=fixed_key("x"), rho=1.0)
    with pytest.raises(dps.InvalidEventError):
        m.step(["a", "b"])
    with pytest.raises(ValueError, match="k must be"):
        HistogramTopK(["a", "b"], 10, k=3, max_items=1, key=fixed_key("x"), rho=1.0)


def test_plan_without_max_items_names_the_break_even_event_size(capsys):
    """plan -m top-k (no --max-items): the largest event size at which KnownBase's top-k
    has less count noise than SparseGumb; checked on both sides with choose_top_k."""
    import json

    from dpstream.cli import main

    assert main(["plan", "-m", "top-k", "-T", "400", "--domain-size", "30", "--k", "3",
                 "--switches", "2", "--epsilon", "1", "--delta", "1e-6", "--json"]) == 0
    n = json.loads(capsys.readouterr().out)["max_items_break_even"]
    domain = [f"item-{i}" for i in range(30)]
    kw = dict(k=3, switches=2, key=fixed_key("be"), epsilon=1.0, delta=1e-6)
    at = choose_top_k(domain, 400, max_items=n, **kw)
    above = choose_top_k(domain, 400, max_items=n + 1, **kw)
    assert n >= 2 and at.name == "KnownBase top-k" and above.name == "SparseGumb"
