"""UnkGauss (algo:UnkGauss) and UnkGumb (algo:uGumb): one-shot, unknown domain."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpstream.oneshot.unknown import (
    unknown_domain_gaussian,
    unknown_domain_gaussian_privacy,
    unknown_domain_gumbel,
    unknown_domain_gumbel_privacy,
)

from .conftest import Z_TOL, fixed_key


def within(p_hat: float, p: float, n: int) -> bool:
    """|p_hat - p| within Z_TOL binomial standard errors of n independent trials."""
    return abs(p_hat - p) <= Z_TOL * math.sqrt(p * (1 - p) / n)


# --------------------------------------------------------------------------- UnkGauss


def test_unkgauss_returns_only_top_kbar_positive_items_sorted():
    """Items ranked below kbar never get noise, so they are never returned.

    With tau = 3 and delta = 0.4 the threshold sits about 1 + 3 sqrt(2) 0.25 =
    2.1 above h_(kbar+1) = 47, so "d" (47) and "e" (46) would be returned in a
    good share of the 300 calls if they got noise (checked below by counting
    how often the top-kbar items near them are returned).
    """
    key = fixed_key("unkgauss-top")
    counts = {"a": 50, "b": 49, "c": 48, "d": 47, "e": 46, "f": 45}
    returned = dict.fromkeys(counts, 0)
    for i in range(300):
        res = unknown_domain_gaussian(
            counts, kbar=3, tau=3.0, delta=0.4, key=key, purpose=f"top-{i}"
        )
        assert set(res.items) <= {"a", "b", "c"}
        assert list(res.values) == sorted(res.values, reverse=True)
        assert res.hit_threshold
        for it in res.items:
            returned[it] += 1
    assert returned["c"] > 50  # c (count 48, one above d) is often returned: d would be too
    # zero counts never get noise, even with a threshold far below 0 (delta = 0.99)
    for i in range(200):
        res = unknown_domain_gaussian(
            {"x": 0, "y": 0, "z": 2}, kbar=5, tau=1.0, delta=0.99, key=key, purpose=f"zero-{i}"
        )
        assert set(res.items) <= {"z"}


def test_unkgauss_ties_broken_by_a_fixed_order():
    """With kbar = 1 and a tie for first place, always the same item gets the slot."""
    key = fixed_key("ties")
    seen = set()
    for i in range(100):
        res = unknown_domain_gaussian(
            {"p": 100, "q": 100, "r": 1}, kbar=1, tau=1.0, delta=0.5, key=key, purpose=f"tie-{i}"
        )
        seen |= set(res.items)
    assert len(seen) == 1


@pytest.mark.statistical
def test_unkgauss_delta_bound_is_exact_at_h_next_plus_one():
    """lem:delta_bound: an item with count <= h_(kbar+1) + 1 is returned w.p. <= delta.

    With counts {u: 11, w: 10} and kbar = 1, u is returned iff 11 + Z_u >
    10 + 1 + sqrt(2) tau Phi^-1(1 - delta) + Z_bot, with Z_u - Z_bot ~ N(0,
    2 tau^2): probability exactly delta. With u at h_(kbar+1) (count 10 vs 10
    for the (kbar+1)-th) it is 1 - Phi(Phi^-1(1 - delta) + 1/(sqrt(2) tau)).
    n = 4000 independent calls (distinct purposes) give a binomial standard
    error of 0.0063 at delta = 0.2, and the test allows Z_TOL = 5 of them
    (0.032); a threshold without the sqrt(2) would give 0.276, 0.076 away.
    """
    key = fixed_key("delta-bound")
    tau, delta, n = 1.0, 0.2, 4000
    hit_plus_one = hit_equal = 0
    for i in range(n):
        r1 = unknown_domain_gaussian(
            {"u": 11, "w": 10}, kbar=1, tau=tau, delta=delta, key=key, purpose=f"db-{i}"
        )
        r2 = unknown_domain_gaussian(
            (["v", "w"], [10, 10]), kbar=1, tau=tau, delta=delta, key=key, purpose=f"db2-{i}"
        )
        hit_plus_one += len(r1)
        hit_equal += len(r2)
    assert within(hit_plus_one / n, delta, n)
    p_equal = 1 - stats.norm.cdf(stats.norm.ppf(1 - delta) + 1 / (math.sqrt(2) * tau))
    assert within(hit_equal / n, p_equal, n)
    assert hit_equal / n <= delta


@pytest.mark.statistical
def test_unkgauss_counts_are_true_plus_gaussian():
    """Returned counts of items far above the threshold are h + N(0, tau^2).

    2000 calls x 5 items = 10,000 independent noise values (distinct
    purposes/items): the mean is allowed Z_TOL tau / sqrt(n) and the variance
    ratio Z_TOL sqrt(2/n) = 7% of 1.
    """
    key = fixed_key("unkgauss-noise")
    tau, n_calls = 2.0, 2000
    counts = {f"i{j}": 1000 + 10 * j for j in range(5)}
    counts["low"] = 1
    z = []
    for i in range(n_calls):
        res = unknown_domain_gaussian(
            counts, kbar=5, tau=tau, delta=1e-9, key=key, purpose=f"n-{i}"
        )
        assert len(res) == 5
        z.extend(v - counts[it] for it, v in res.counts.items())
    z = np.asarray(z)
    assert abs(z.mean()) < Z_TOL * tau / math.sqrt(z.size)
    assert abs(z.var() / tau**2 - 1) < Z_TOL * math.sqrt(2 / z.size)


def test_oneshot_determinism_and_purposes():
    key = fixed_key("det")
    counts = {"a": 30, "b": 20, 7: 15, b"raw": 10}
    r1 = unknown_domain_gaussian(counts, kbar=3, tau=1.0, delta=1e-3, key=key, purpose="p")
    r2 = unknown_domain_gaussian(counts, kbar=3, tau=1.0, delta=1e-3, key=key, purpose="p")
    r3 = unknown_domain_gaussian(counts, kbar=3, tau=1.0, delta=1e-3, key=key, purpose="q")
    assert r1.items == r2.items and np.array_equal(r1.values, r2.values)
    assert not np.array_equal(r1.values, r3.values)
    # parallel sequences give the same as the Mapping
    r4 = unknown_domain_gaussian(
        (list(counts), list(counts.values())), kbar=3, tau=1.0, delta=1e-3, key=key, purpose="p"
    )
    assert r4.items == r1.items and np.array_equal(r4.values, r1.values)
    g1 = unknown_domain_gumbel(counts, k=2, kbar=3, tau=1.0, delta=1e-3, key=key, purpose="p")
    g2 = unknown_domain_gumbel(counts, k=2, kbar=3, tau=1.0, delta=1e-3, key=key, purpose="p")
    assert g1.items == g2.items and np.array_equal(g1.values, g2.values)
    empty = unknown_domain_gaussian({}, kbar=2, tau=1.0, delta=0.5, key=key, purpose="test")
    assert empty.items == ()
    with pytest.raises(AttributeError):
        r1.items = ()  # type: ignore[misc]  # a frozen result, and ...
    with pytest.raises(ValueError):
        r1.values[:] = 0.0  # ... read-only values


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"counts": {"a": -1}}, ValueError, ">= 0"),
        ({"counts": {"a": 1.5}}, TypeError, "integers"),
        ({"counts": ["a", "b"]}, TypeError, "Mapping"),
        ({"counts": (["a"], [1, 2])}, ValueError, "same length"),
        ({"counts": {1.5: 3}}, TypeError, "items"),
        ({"kbar": 0}, ValueError, "kbar"),
        ({"kbar": 2.0}, TypeError, "kbar"),
        ({"tau": 0.0}, ValueError, "tau"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"key": b"k" * 32}, TypeError, "key"),
    ],
)
def test_oneshot_invalid_input(kwargs, exc, match):
    args = {"counts": {"a": 3}, "kbar": 2, "tau": 1.0, "delta": 0.1, "key": fixed_key("inv")}
    args.update(kwargs)
    counts = args.pop("counts")
    with pytest.raises(exc, match=match):
        unknown_domain_gaussian(counts, **args, purpose="test")
    with pytest.raises(exc, match=match):
        unknown_domain_gumbel(counts, k=1, **args, purpose="test")


def exact_gaussian_delta(epsilon, mu):
    # Balle & Wang (2018), Theorem 8, written out independently of dpstream.privacy
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
        -epsilon / mu - mu / 2
    )


@pytest.mark.parametrize(
    "tau,delta,max_items,delta_prime",
    [(1.0, 1e-7, 1, 1e-6), (3.0, 1e-9, 4, 1e-5), (0.5, 1e-3, 2, 1e-2)],
)
def test_unkgauss_guarantee(tau, delta, max_items, delta_prime):
    g = unknown_domain_gaussian_privacy(
        tau=tau, delta=delta, max_items=max_items, delta_prime=delta_prime
    )
    assert g.rho == pytest.approx(max_items / (2 * tau**2), rel=1e-12)
    assert g.rho_delta == pytest.approx(max_items * delta, rel=1e-15)
    assert g.delta == pytest.approx(max_items * delta + delta_prime, rel=1e-15)
    mu = math.sqrt(max_items) / tau
    assert exact_gaussian_delta(g.epsilon, mu) == pytest.approx(delta_prime, rel=1e-6)
    paper = g.rho + 2 * math.sqrt(g.rho * math.log(1 / delta_prime))  # eq:epsilon
    cks = unknown_domain_gaussian_privacy(
        tau=tau, delta=delta, max_items=max_items, delta_prime=delta_prime, gaussian_exact=False
    )
    assert g.epsilon <= cks.epsilon <= paper * (1 + 1e-12)
    with pytest.raises(ValueError, match="< 1"):
        unknown_domain_gaussian_privacy(tau=1.0, delta=0.5, max_items=2, delta_prime=0.1)


# --------------------------------------------------------------------------- UnkGumb


@pytest.mark.statistical
def test_unkgumb_threshold_probability_closed_form():
    """An item at h_(kbar+1) + 1 beats the Gumbel threshold w.p. delta^2 / (1 + delta^2).

    Counts {a: 11, b: 10, c: 10}, kbar = 2, k = 1: only a is eligible (h > h_(3)
    = 10), and it is returned iff 11 + G_a > 11 + tau ln(1/delta) + G_bot. The
    difference of two Gumbel(tau/2) is Logistic(tau/2), so the probability is
    1 / (1 + exp(2 ln(1/delta))) = delta^2/(1 + delta^2) = 0.2 at delta = 0.5.
    Binomial standard error with n = 4000: 0.0063; tolerance Z_TOL of them.
    b and c (not above h_(3)) are never returned.
    """
    key = fixed_key("gumb-thr")
    tau, delta, n = 1.5, 0.5, 4000
    hits = 0
    for i in range(n):
        res = unknown_domain_gumbel(
            {"a": 11, "b": 10, "c": 10},
            k=1,
            kbar=2,
            tau=tau,
            delta=delta,
            key=key,
            purpose=f"g-{i}",
        )
        assert set(res.items) <= {"a"}
        assert res.hit_threshold == (len(res) == 0)
        hits += len(res)
    assert within(hits / n, delta**2 / (1 + delta**2), n)


@pytest.mark.statistical
def test_unkgumb_selection_is_gumbel_with_scale_tau_over_two():
    """Two items far above the threshold, counts 100 and 99, k = 1.

    The higher one is selected w.p. P(Logistic(tau/2) > -1) = 1/(1 + exp(-2/tau))
    = 0.731 at tau = 2. n = 6000 gives a standard error of 0.0057 (tolerance
    0.029); a Gumbel scale 30% too large would give 0.683.
    """
    key = fixed_key("gumb-sel")
    tau, n = 2.0, 6000
    wins = 0
    for i in range(n):
        res = unknown_domain_gumbel(
            {"hi": 100, "lo": 99, "x": 1, "y": 1},
            k=1,
            kbar=3,
            tau=tau,
            delta=1e-6,
            key=key,
            purpose=f"s-{i}",
        )
        assert len(res) == 1 and not res.hit_threshold
        wins += res.items[0] == "hi"
    assert within(wins / n, 1 / (1 + math.exp(-2 / tau)), n)


def test_unkgumb_returns_k_items_with_gaussian_counts():
    key = fixed_key("gumb-k")
    counts = {f"i{j}": 1000 - j for j in range(10)}
    res = unknown_domain_gumbel(counts, k=3, kbar=6, tau=0.1, delta=1e-6, key=key, purpose="test")
    assert len(res) == 3 and not res.hit_threshold
    assert set(res.items) <= {f"i{j}" for j in range(6)}
    for it, v in res.counts.items():
        assert abs(v - counts[it]) < 1.0  # N(0, 0.01): 10 sigma
    with pytest.raises(ValueError, match="kbar \\+ 1"):
        unknown_domain_gumbel(counts, k=8, kbar=6, tau=1.0, delta=0.1, key=key, purpose="test")


def test_unkgumb_guarantee_is_the_theorem():
    tau, delta, k, kbar, dp = 2.0, 1e-8, 3, 10, 1e-6
    g = unknown_domain_gumbel_privacy(tau=tau, delta=delta, k=k, kbar=kbar, delta_prime=dp)
    assert g.epsilon == pytest.approx(
        k / tau**2 + 2 / tau * math.sqrt(k * math.log(1 / dp)), rel=1e-12
    )
    assert g.delta == pytest.approx(kbar * delta + dp, rel=1e-15)
    assert g.rho_delta == pytest.approx(kbar * delta, rel=1e-15)
    assert g.conversion == "bun-steinke"
