"""BLT counters in the mechanisms: keyed noise = B z, covariance, privacy, replay paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.linalg import toeplitz

import dpstream as dps
from dpstream.factorization import BLTStrategy, blt_for_horizon, fit_blt
from dpstream.mechanisms.blt_noise import BLTNoise
from dpstream.noise import NoiseSource

from .conftest import Z_TOL, fixed_key


def dense(strategy: BLTStrategy) -> tuple[np.ndarray, np.ndarray]:
    """C and B = A C^-1, dense, from the strategy column alone."""
    T = strategy.horizon
    C = np.tril(toeplitz(strategy.strategy_column()))
    B = np.tril(np.ones((T, T))) @ np.linalg.inv(C)
    return C, B


# --------------------------------------------------------------------------- covariance


def covariance_z_scores(y: np.ndarray, cov: np.ndarray, ts: list[int]) -> np.ndarray:
    """|z|-scores of the sample variances at t and lag-1 covariances (t, t+1) of y
    (rows = independent samples, columns = steps 1..T) against the model ``cov``.

    The noise has mean 0 by construction, so the estimators use it: for a
    bivariate normal (x, w) with variances a, b and covariance c, mean(x w) is
    unbiased with variance (a b + c^2) / n (and mean(x^2) has 2 a^2 / n). The
    scores are then standard normal under the model (n = 200,000 here).
    """
    n = y.shape[0]
    out = []
    for t in ts:
        i = t - 1
        a, b, c = cov[i, i], cov[i + 1, i + 1], cov[i, i + 1]
        var_hat = np.mean(y[:, i] ** 2)
        out.append((var_hat - a) / math.sqrt(2 * a * a / n))
        cov_hat = np.mean(y[:, i] * y[:, i + 1])
        out.append((cov_hat - c) / math.sqrt((a * b + c * c) / n))
        # the increment y_(t+1) - y_t: its variance pins down the covariance sharply
        inc = a + b - 2 * c
        inc_hat = np.mean((y[:, i + 1] - y[:, i]) ** 2)
        out.append((inc_hat - inc) / math.sqrt(2 * inc * inc / n))
    return np.abs(np.array(out))


@pytest.mark.statistical
@pytest.mark.parametrize("horizon,buffers", [(64, 4), (100, 2)])
def test_streamed_noise_has_covariance_sigma2_b_bt(horizon, buffers):
    """The noise of one item over many keys (and items) has covariance sigma^2 B B^T.

    40 keys x 5,000 items = 200,000 independent noise paths. Each score is
    N(0, 1) under the model and allowed Z_TOL = 5. Power check on the same
    samples: the right variances without the correlation between steps, and
    sigma^2 B B^T with a sigma 5% too small, must both be rejected.
    """
    strategy = fit_blt(horizon, buffers) if buffers != 4 else blt_for_horizon(horizon)
    _, B = dense(strategy)
    n_items, n_keys, tau = 5000, 40, 0.9
    paths = []
    zeros = np.zeros(n_items, dtype=np.int64)
    for k in range(n_keys):
        h = dps.KnownDomainHistogram(
            range(n_items),
            horizon,
            max_items=1,
            counter=strategy,
            key=fixed_key(f"cov{k}"),
            tau=tau,
        )
        y = np.empty((n_items, horizon))
        for t in range(1, horizon + 1):
            y[:, t - 1] = h.release(t, zeros).values
        paths.append(y)
    y = np.concatenate(paths)
    sigma = h.sigma
    cov = sigma**2 * (B @ B.T)
    ts = [1, 2, 5, 17, horizon // 2, horizon - 1]
    assert covariance_z_scores(y, cov, ts).max() < Z_TOL
    # the tester rejects wrong models
    assert covariance_z_scores(y, np.diag(np.diag(cov)), ts).max() > Z_TOL
    assert covariance_z_scores(y, cov * 0.95**2, ts).max() > Z_TOL


# --------------------------------------------------------------------------- brute force


def test_releases_are_counts_plus_dense_b_times_keyed_draws():
    """Brute force: value - count at t = sum_(s <= t) B[t, s] z_s, z_s the keyed draw of
    the item at (0, s, 0) under the mechanism's purpose, z ~ N(0, sigma^2)."""
    T, key = 40, fixed_key("bf-blt")
    h = dps.KnownDomainHistogram(["a", "b", 7], T, max_items=2, key=key, rho=0.5, counter="blt")
    _, B = dense(h.strategy)
    src = NoiseSource(key, h.noise_purpose)
    z = {
        u: np.array(
            [src.gaussian(src.prepare([u]), 0, s, 0, scale=h.sigma)[0] for s in range(1, T + 1)]
        )
        for u in h.domain
    }
    rng = np.random.default_rng(0)
    for t in range(1, T + 1):
        pick = rng.choice(3, size=2, replace=False)
        rel = h.step_batch([[h.domain[i] for i in pick]])
        for u, v, c in zip(rel.items, rel.values, h.counts, strict=True):
            assert v - c == pytest.approx(B[t - 1, :t] @ z[u][:t], abs=1e-9)


# --------------------------------------------------------------------------- privacy


@pytest.mark.parametrize("horizon,max_items", [(7, 1), (100, 3), (512, 2), (5000, 1)])
def test_privacy_is_delta0_times_sensitivity_over_two_sigma_squared(horizon, max_items):
    h = dps.KnownDomainHistogram(
        range(4), horizon, max_items=max_items, key=fixed_key("p"), rho=0.3, counter="blt"
    )
    col = h.strategy.strategy_column()
    if horizon <= 512:
        C = np.tril(toeplitz(col))
        sens2 = np.sum(C * C, axis=0).max()
    else:  # the columns of a lower Toeplitz C are truncations of the first
        sens2 = float(np.sum(col * col))
    rho = max_items * sens2 / (2 * h.sigma**2)
    assert h.privacy.rho == pytest.approx(rho, rel=1e-9)
    assert rho <= h.privacy.rho <= 0.3  # sigma rounded up: never more than stated
    assert h.privacy.rho == pytest.approx(0.3, rel=1e-12)


def exact_gaussian_delta(epsilon: float, mu: float) -> float:
    # Balle & Wang (2018), Theorem 8, written out independently of dpstream.privacy
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
        -epsilon / mu - mu / 2
    )


@pytest.mark.parametrize("epsilon,delta,max_items", [(1.0, 1e-6, 1), (0.5, 1e-8, 3)])
def test_epsilon_delta_calibration_is_the_exact_gaussian_curve(epsilon, delta, max_items):
    h = dps.KnownDomainHistogram(
        range(3),
        1000,
        max_items=max_items,
        key=fixed_key("cal"),
        epsilon=epsilon,
        delta=delta,
        counter="blt",
    )
    # l2 sensitivity of the stacked C x^u over the draw's std
    mu = math.sqrt(max_items) * h.strategy.sensitivity / h.sigma
    assert exact_gaussian_delta(epsilon, mu) <= delta * (1 + 1e-9)
    assert exact_gaussian_delta(epsilon, mu * 1.001) > delta  # the smallest such sigma
    tree = dps.KnownDomainHistogram(
        range(3),
        1000,
        max_items=max_items,
        key=fixed_key("cal"),
        epsilon=epsilon,
        delta=delta,
        counter="tree",
    )
    assert h.tau == tree.tau and h.privacy.epsilon == tree.privacy.epsilon
    # same budget, less noise: the worst-case std is 2.5x smaller at T = 1000
    assert h.noise_std_worst * 2.5 < tree.noise_std_worst


def test_noise_std_matches_dense_rows_of_b():
    c = dps.BLTCounter(300, key=fixed_key("std"), tau=1.3)
    _, B = dense(c.strategy)
    rows = np.sqrt(np.sum(B * B, axis=1)) * c.sigma
    for t in (1, 2, 50, 299, 300):
        assert c.noise_std_at(t) == pytest.approx(rows[t - 1], rel=1e-10)
    assert c.noise_std_worst == pytest.approx(rows.max(), rel=1e-10)
    assert c.noise_std_worst == pytest.approx(
        1.3 * math.sqrt(c.strategy.worst_case_variance), rel=1e-10
    )


# --------------------------------------------------------------------------- replay paths


def test_blt_noise_paths_agree_bit_for_bit():
    """Step by step, jumps, items added late and a restored state: the same bits."""
    s = blt_for_horizon(200)
    src = NoiseSource(fixed_key("paths"), "p")
    prepared = src.prepare(range(40))
    step = BLTNoise(src, s, 1.7)
    step.add_items(prepared)
    jumpy = BLTNoise(src, s, 1.7)
    jumpy.add_items(prepared)
    late = BLTNoise(src, s, 1.7)
    late.add_items(prepared.subset(slice(0, 10)))
    restored = None
    for t in range(1, 201):
        step.advance(t)
        if t == 30:
            late.advance(t)
            late.add_items(prepared.subset(slice(10, 40)))  # replayed from step 1
        if t % 9 == 0 or t == 200:
            jumpy.advance(t)
            assert np.array_equal(jumpy.noise(), step.noise())
        if t > 30 and t % 5 == 0:
            late.advance(t)
            assert np.array_equal(late.noise(), step.noise())
        if t == 120:
            buffers, total = step.state()
            assert buffers.shape == (s.buffers, 40) and total.shape == (40,)  # k + 1 floats
            restored = BLTNoise.restore(src, s, 1.7, step.prepared, t, buffers, total)
        if restored is not None and t > 120:
            restored.advance(t)
            assert np.array_equal(restored.noise(), step.noise())
    with pytest.raises(ValueError, match="shapes"):
        BLTNoise.restore(src, s, 1.7, prepared, 5, np.zeros((2, 40)), np.zeros(40))
    with pytest.raises(ValueError, match="increase"):
        step.advance(200)


def test_blt_counter_agrees_with_one_item_histogram():
    key = fixed_key("ctr")
    c = dps.BLTCounter(100, key=key, tau=1.0, stream="s")
    h = dps.KnownDomainHistogram(
        ["__counter__"], 100, max_items=1, key=key, tau=1.0, stream="s", counter="blt"
    )
    bits = np.random.default_rng(3).integers(0, 2, 100)
    for b in bits:
        assert c.step(int(b)) == h.step(["__counter__"] if b else []).values[0]
    assert c.count == bits.sum()
    assert c.privacy.rho == pytest.approx(0.5)
    assert "BLT" in repr(c)


# --------------------------------------------------------------------------- choosing


def test_default_counter_is_the_one_with_less_worst_case_noise():
    key = fixed_key("d")
    for T in (2, 3, 10, 100, 1000, 10**5):
        h = dps.KnownDomainHistogram(["a"], T, max_items=1, key=key, rho=1.0)
        tree = dps.KnownDomainHistogram(["a"], T, max_items=1, key=key, rho=1.0, counter="tree")
        assert h.counter == "blt" and h.base is None and h.levels is None
        assert h.noise_std_worst < tree.noise_std_worst
    one = dps.KnownDomainHistogram(["a"], 1, max_items=1, key=key, rho=1.0)
    assert one.counter == "tree"  # T = 1: a tie, the paper's counter
    assert (
        dps.KnownDomainHistogram(["a"], 100, max_items=1, key=key, rho=1.0, base=3).counter
        == "tree"
    )  # a base means the tree


def test_counter_arguments():
    key = fixed_key("args")
    with pytest.raises(ValueError, match="base applies to counter='tree'"):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=key, rho=1.0, counter="blt", base=2)
    with pytest.raises(ValueError, match="counter must be"):
        dps.KnownDomainHistogram(["a"], 10, max_items=1, key=key, rho=1.0, counter="bin")
    with pytest.raises(ValueError, match="counter must be"):
        dps.ContinualTopK(["a"], 10, k=1, switches=0, eta=1.0, key=key, rho=1.0, counter="x")
    with pytest.raises(TypeError, match="strategy"):
        dps.BLTCounter(10, key=key, rho=1.0, strategy="blt")
    # a strategy fitted elsewhere is restated for this horizon
    s = fit_blt(50, 3)
    h = dps.KnownDomainHistogram(["a"], 20, max_items=1, key=key, rho=1.0, counter=s)
    assert h.strategy.horizon == 20 and h.strategy.theta == s.theta


def test_settings_shape_the_purpose():
    """Other BLT parameters, sigma or counter: independent noise (another purpose)."""
    key = fixed_key("purpose")
    a = dps.KnownDomainHistogram(["a"], 100, max_items=1, key=key, rho=1.0, counter="blt")
    b = dps.KnownDomainHistogram(["a"], 100, max_items=1, key=key, rho=1.0, counter=fit_blt(100, 3))
    c = dps.KnownDomainHistogram(["a"], 100, max_items=1, key=key, rho=2.0, counter="blt")
    d = dps.KnownDomainHistogram(["a"], 100, max_items=1, key=key, rho=1.0, counter="tree")
    purposes = {m.noise_purpose for m in (a, b, c, d)}
    assert len(purposes) == 4
    assert a.tree_purpose is None and d.tree_purpose == d.noise_purpose


def test_docs_counters_python_example_runs():
    """docs/counters.md's example runs as written (and prints what it says it prints)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "counters.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    env = {"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"}
    outputs = []
    for code in blocks:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert len(outputs) == 2
    assert outputs[0].startswith("blt True\n2.56\n")
    assert "zCDP" in outputs[0]
    # fewer buffers: V(2 buffers) / V(4 buffers) at T = 1000 is 11.03 / 10.66 (table in the doc)
    assert outputs[1] == "2 True\n1.017\n"
