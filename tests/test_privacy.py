"""Tests of dpstream.privacy: conversions against independent computations,
calibration at its optimum, argument checking and the composition ledger."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from scipy import integrate, optimize, stats

import dpstream.privacy
from dpstream.errors import BudgetExhaustedError, DPStreamError
from dpstream.privacy import (
    DEFAULT_DELTA,
    ZCDP,
    ApproxDP,
    Budget,
    PrivacyGuarantee,
    PrivacyLedger,
    calibrate_tau,
    delta_bun_steinke,
    delta_cks,
    epsilon_bun_steinke,
    epsilon_cks,
    gaussian_delta,
    gaussian_epsilon,
    guarantee_for_tau,
    mu_for_gaussian,
    resolve_budget,
    rho_for_epsilon_delta,
    tau_for_rho,
)

RHOS = [1e-6, 1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 100.0]
DELTAS = [1e-12, 1e-9, 1e-6, 1e-3, 0.1, 0.5]
# 0.1% smaller noise must break the target: the calibrated tau is the smallest.
SHRINK = 0.999


def cks_bound(alpha: float, rho: float, delta: float) -> float:
    """CKS20 Corollary 13 at one alpha, written out independently of the module."""
    return alpha * rho + (
        math.log(1 / delta) + (alpha - 1) * math.log(1 - 1 / alpha) - math.log(alpha)
    ) / (alpha - 1)


def cks_delta_bound(alpha: float, rho: float, epsilon: float) -> float:
    """CKS20 delta at one alpha: exp((a-1)(a rho - eps)) / (a-1) * (1 - 1/a)^a.

    Evaluated in log space so that large alpha gives inf, not an OverflowError.
    """
    log_d = (alpha - 1) * (alpha * rho - epsilon) - math.log(alpha - 1)
    log_d += alpha * math.log(1 - 1 / alpha)
    return math.exp(log_d) if log_d < 700 else math.inf


def quad_gaussian_delta(epsilon: float, mu: float) -> float:
    """delta(eps) = E_{x ~ N(mu, 1)}[max(0, 1 - exp(eps - L(x)))], by quadrature.

    L(x) = log N(x; mu, 1) / N(x; 0, 1) is the privacy loss of the Gaussian
    mechanism; the kink of the integrand is where L(x) = eps, found by a root
    finder on the log densities themselves.
    """

    def loss(x: float) -> float:
        return stats.norm.logpdf(x, loc=mu) - stats.norm.logpdf(x)

    lo, hi = mu - 15.0, mu + 15.0
    if loss(hi) <= epsilon:
        return 0.0
    kink = optimize.brentq(lambda x: loss(x) - epsilon, lo - 1e3, hi + 1e3)

    def integrand(x: float) -> float:
        return stats.norm.pdf(x, loc=mu) * -math.expm1(epsilon - loss(x))

    start = max(kink, lo)
    value, _ = integrate.quad(integrand, start, hi, epsabs=1e-14, epsrel=1e-10, limit=200)
    return value


# ----------------------------------------------------------------- zCDP conversions


@pytest.mark.parametrize(
    "rho, delta, expected",
    [
        (0.5, 1e-6, 0.5 + 2 * math.sqrt(0.5 * math.log(1e6))),
        (1.0, math.exp(-4), 1.0 + 2 * math.sqrt(4.0)),  # = 5 exactly
        (0.01, 1e-5, 0.01 + 2 * math.sqrt(0.01 * 5 * math.log(10))),
    ],
)
def test_epsilon_bun_steinke_closed_form(rho: float, delta: float, expected: float) -> None:
    assert epsilon_bun_steinke(rho, delta) == pytest.approx(expected, rel=1e-14)


def test_epsilon_bun_steinke_known_value() -> None:
    assert epsilon_bun_steinke(1.0, math.exp(-4)) == pytest.approx(5.0, rel=1e-14)


def test_delta_bun_steinke_inverts() -> None:
    for rho in RHOS:
        for delta in DELTAS:
            eps = epsilon_bun_steinke(rho, delta)
            assert delta_bun_steinke(rho, eps) == pytest.approx(delta, rel=1e-9)
    assert delta_bun_steinke(0.5, 0.4) == 1.0


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", DELTAS)
def test_epsilon_cks_never_exceeds_bun_steinke(rho: float, delta: float) -> None:
    assert 0.0 <= epsilon_cks(rho, delta) <= epsilon_bun_steinke(rho, delta)


def test_epsilon_cks_strictly_better_for_typical_values() -> None:
    cks, bs = epsilon_cks(0.5, 1e-6), epsilon_bun_steinke(0.5, 1e-6)
    assert cks < bs - 0.4  # 5.22 vs 5.76


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3])
def test_epsilon_cks_is_the_infimum_over_alpha(rho: float, delta: float) -> None:
    """Compare with a dense log-spaced grid and with a bounded scalar minimiser."""
    alphas = 1.0 + np.logspace(-8, 6, 20001)
    grid = min(cks_bound(float(a), rho, delta) for a in alphas)
    res = optimize.minimize_scalar(
        lambda la: cks_bound(1.0 + math.exp(la), rho, delta),
        bounds=(-20.0, 15.0),
        method="bounded",
        options={"xatol": 1e-12},
    )
    # A negative bound means (0, delta)-DP: epsilon is clamped at 0.
    reference = max(0.0, min(grid, res.fun, epsilon_bun_steinke(rho, delta)))
    got = epsilon_cks(rho, delta)
    assert got <= reference + 1e-12 * max(1.0, reference)
    assert got >= reference - 1e-6 * max(1.0, reference)


@pytest.mark.parametrize("rho", [1e-3, 0.1, 0.5, 2.0, 20.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3])
def test_delta_cks_round_trip(rho: float, delta: float) -> None:
    eps = epsilon_cks(rho, delta)
    assert delta_cks(rho, eps) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize("rho, epsilon", [(0.5, 1.0), (0.5, 5.0), (0.01, 0.5), (2.0, 12.0)])
def test_delta_cks_is_the_infimum_over_alpha(rho: float, epsilon: float) -> None:
    alphas = 1.0 + np.logspace(-6, 4, 20001)
    grid = min(cks_delta_bound(float(a), rho, epsilon) for a in alphas)
    reference = min(1.0, grid, delta_bun_steinke(rho, epsilon))
    got = delta_cks(rho, epsilon)
    assert got <= reference * (1 + 1e-10)
    assert got >= reference * (1 - 1e-4)


@pytest.mark.parametrize("rho", [1e-4, 0.1, 2.0, 10.0, 1e4])
@pytest.mark.parametrize("epsilon", [0.0, 0.5, 3.0])
def test_delta_cks_is_sound_against_the_gaussian(rho: float, epsilon: float) -> None:
    # N(0, 1) noise on sensitivity sqrt(2 rho) is rho-zCDP, and its exact delta is a
    # lower bound for any valid zCDP conversion.
    exact = gaussian_delta(epsilon, math.sqrt(2 * rho))
    assert exact <= delta_cks(rho, epsilon) <= 1.0


def test_epsilon_cks_can_reach_zero_for_large_delta() -> None:
    # TV distance of a 1e-4-zCDP mechanism is far below 0.5, so (0, 0.5)-DP holds.
    assert epsilon_cks(1e-4, 0.5) == 0.0
    assert delta_cks(1e-4, 0.0) <= 0.5


@pytest.mark.parametrize(
    "func, args, name",
    [
        (epsilon_cks, (0.0, 1e-6), "rho"),
        (epsilon_cks, (0.5, 0.0), "delta"),
        (epsilon_cks, (0.5, 1.0), "delta"),
        (epsilon_bun_steinke, (-1.0, 1e-6), "rho"),
        (epsilon_bun_steinke, (math.inf, 1e-6), "rho"),
        (delta_cks, (0.5, -1.0), "epsilon"),
        (gaussian_delta, (1.0, 0.0), "mu"),
        (gaussian_delta, (-1.0, 1.0), "epsilon"),
        (gaussian_epsilon, (0.0, 1.0), "delta"),
        (gaussian_epsilon, (1e-6, -1.0), "mu"),
    ],
)
def test_conversions_reject_bad_values(func, args, name) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=name):
        func(*args)


def test_conversions_reject_bool() -> None:
    with pytest.raises(TypeError, match="rho"):
        epsilon_cks(True, 1e-6)


# ----------------------------------------------------------------- exact Gaussian curve


@pytest.mark.parametrize(
    "epsilon, mu",
    [
        (0.0, 1.0),
        (0.5, 0.5),
        (1.0, 1.0),
        (1.0, 0.3),
        (3.0, 2.0),
        (10.0, 3.0),
        (0.1, 0.05),
        (5.0, 5.0),
        (50.0, 20.0),
    ],
)
def test_gaussian_delta_matches_quadrature(epsilon: float, mu: float) -> None:
    expected = quad_gaussian_delta(epsilon, mu)
    assert gaussian_delta(epsilon, mu) == pytest.approx(expected, rel=1e-7, abs=1e-13)


def test_gaussian_delta_large_epsilon_does_not_overflow() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gaussian_delta(800.0, 40.0)  # e^800 overflows a float
        tiny = gaussian_delta(800.0, 1.0)
    assert got == pytest.approx(quad_gaussian_delta(800.0, 40.0), rel=1e-7)
    assert math.isfinite(got) and 0.0 < got < 1.0
    assert tiny == 0.0


def test_gaussian_delta_monotone() -> None:
    eps = np.linspace(0.0, 10.0, 101)
    d = [gaussian_delta(float(e), 2.0) for e in eps]
    assert all(a > b for a, b in zip(d, d[1:], strict=False) if b > 0)
    mus = np.linspace(0.1, 5.0, 50)
    d = [gaussian_delta(1.0, float(m)) for m in mus]
    assert all(a < b for a, b in zip(d, d[1:], strict=False))


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3, 0.05])
def test_gaussian_epsilon_inverts_and_is_conservative(mu: float, delta: float) -> None:
    eps = gaussian_epsilon(delta, mu)
    assert gaussian_delta(eps, mu) <= delta
    if eps > 0:
        assert gaussian_delta(eps * (1 - 1e-9), mu) > delta or eps < 1e-12
        assert gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3])
def test_gaussian_exact_is_tightest(mu: float, delta: float) -> None:
    rho = mu * mu / 2
    exact = gaussian_epsilon(delta, mu)
    assert exact <= epsilon_cks(rho, delta) <= epsilon_bun_steinke(rho, delta)


def test_gaussian_epsilon_zero_when_delta_large() -> None:
    # delta(0, mu) = 2 Phi(mu/2) - 1, the TV distance.
    tv = 2 * stats.norm.cdf(0.25) - 1
    assert gaussian_delta(0.0, 0.5) == pytest.approx(tv, rel=1e-12)
    assert gaussian_epsilon(tv + 1e-3, 0.5) == 0.0


# ----------------------------------------------------------------- calibration

TARGETS = [  # (epsilon, delta, a)
    (1.0, 1e-6, 1.5),  # KnownBase with Delta0 = 3
    (0.1, 1e-9, 0.5),  # BinMech
    (8.0, 1e-5, 7.0),  # SparseGumb with k = 5
    (2.0, 1e-3, 10.0),  # MetaAlgo-Gumbel with k = 10
    (0.5, 1e-8, 50.0),  # KnownBase with Delta0 = 100
]


def _three_taus(epsilon: float, delta: float, a: float) -> tuple[float, float, float]:
    tau_gauss = calibrate_tau(a=a, epsilon=epsilon, delta=delta, gaussian_exact=True)
    tau_cks = calibrate_tau(a=a, epsilon=epsilon, delta=delta)
    tau_bs = tau_for_rho(rho_for_epsilon_delta(epsilon, delta, "bun-steinke"), a)
    return tau_gauss, tau_cks, tau_bs


def _target_id(target: tuple[float, float, float]) -> str:
    eps, delta, a = target
    tg, tc, tb = _three_taus(eps, delta, a)
    return f"eps={eps:g},delta={delta:g},a={a:g}:gauss={tg:.4f}<cks={tc:.4f}<bs={tb:.4f}"


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_calibrate_gaussian_exact_is_smallest(target: tuple[float, float, float]) -> None:
    eps, delta, a = target
    tau = calibrate_tau(a=a, epsilon=eps, delta=delta, gaussian_exact=True)
    sens = math.sqrt(2 * a)
    assert gaussian_delta(eps, sens / tau) <= delta
    assert gaussian_delta(eps, sens / (tau * SHRINK)) > delta


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_calibrate_cks_is_smallest(target: tuple[float, float, float]) -> None:
    eps, delta, a = target
    tau = calibrate_tau(a=a, epsilon=eps, delta=delta)
    assert epsilon_cks(a / tau**2, delta) <= eps
    assert epsilon_cks(a / (tau * SHRINK) ** 2, delta) > eps


@pytest.mark.parametrize("target", TARGETS, ids=_target_id)
def test_calibration_order_gauss_cks_bun_steinke(target: tuple[float, float, float]) -> None:
    tau_gauss, tau_cks, tau_bs = _three_taus(*target)
    print(f"{target}: gaussian-exact {tau_gauss:.6f} < cks2020 {tau_cks:.6f} < bs {tau_bs:.6f}")
    assert tau_gauss < tau_cks < tau_bs
    eps, delta, a = target
    assert epsilon_bun_steinke(a / tau_bs**2, delta) <= eps
    assert epsilon_bun_steinke(a / (tau_bs * SHRINK) ** 2, delta) > eps


@pytest.mark.parametrize("rho", [1e-4, 0.1, 0.5, 3.0])
@pytest.mark.parametrize("a", [0.5, 1.5, 7.0, 1000.0])
def test_tau_for_rho_rounds_up(rho: float, a: float) -> None:
    tau = tau_for_rho(rho, a)
    assert a / tau**2 <= rho
    assert a / (tau * SHRINK) ** 2 > rho
    assert tau == pytest.approx(math.sqrt(a / rho), rel=1e-15)
    assert calibrate_tau(a=a, rho=rho) == tau


@pytest.mark.parametrize("conversion", ["cks2020", "bun-steinke"])
@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-9), (1.0, 1e-6), (10.0, 1e-5), (3.0, 0.2)])
def test_rho_for_epsilon_delta_is_largest(conversion: str, epsilon: float, delta: float) -> None:
    convert = epsilon_cks if conversion == "cks2020" else epsilon_bun_steinke
    rho = rho_for_epsilon_delta(epsilon, delta, conversion)  # type: ignore[arg-type]
    assert convert(rho, delta) <= epsilon
    assert convert(rho * 1.001, delta) > epsilon
    assert convert(rho, delta) == pytest.approx(epsilon, rel=1e-9)


def test_rho_for_epsilon_delta_rejects_unknown_conversion() -> None:
    with pytest.raises(ValueError, match="conversion"):
        rho_for_epsilon_delta(1.0, 1e-6, "gaussian-exact")  # type: ignore[arg-type]


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-9), (1.0, 1e-6), (10.0, 1e-5), (0.01, 0.3)])
def test_mu_for_gaussian_is_largest(epsilon: float, delta: float) -> None:
    mu = mu_for_gaussian(epsilon, delta)
    assert gaussian_delta(epsilon, mu) <= delta
    assert gaussian_delta(epsilon, mu * 1.001) > delta


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"a": 1.0}, ValueError, "rho"),
        ({"a": 1.0, "rho": 0.5, "epsilon": 1.0, "delta": 1e-6}, ValueError, "rho"),
        ({"a": 1.0, "epsilon": 1.0}, ValueError, "delta"),
        ({"a": 0.0, "rho": 0.5}, ValueError, "a"),
        ({"a": "1", "rho": 0.5}, TypeError, "a"),
        ({"a": 1.0, "epsilon": 1.0, "delta": 1.5}, ValueError, "delta"),
    ],
)
def test_calibrate_tau_validates(kwargs: dict, exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=name):
        calibrate_tau(**kwargs)


# ----------------------------------------------------------------- guarantees


def test_guarantee_for_tau_meets_calibration_target() -> None:
    a, eps, delta = 1.5, 1.0, 1e-6
    for exact in (False, True):
        tau = calibrate_tau(a=a, epsilon=eps, delta=delta, gaussian_exact=exact)
        g = guarantee_for_tau(
            tau=tau,
            a=a,
            delta=delta,
            mechanism="KnownBase",
            theorem="lem: KnownBase",
            gaussian_exact=exact,
        )
        assert g.epsilon <= eps
        assert g.epsilon == pytest.approx(eps, rel=1e-6)
        assert g.rho == pytest.approx(a / tau**2)
        assert g.conversion == ("gaussian-exact" if exact else "cks2020")


def test_guarantee_for_tau_spends_rho_delta_first() -> None:
    g = guarantee_for_tau(
        tau=3.0, a=1.5, delta=1e-5, rho_delta=4e-6, mechanism="UnkBase", theorem="thm: UnkBase"
    )
    assert g.delta == 1e-5 and g.rho_delta == 4e-6
    assert g.epsilon == pytest.approx(epsilon_cks(1.5 / 9.0, 6e-6), rel=1e-12)
    with pytest.raises(ValueError, match="rho_delta"):
        guarantee_for_tau(
            tau=3.0, a=1.5, delta=1e-5, rho_delta=1e-5, mechanism="UnkBase", theorem="x"
        )


def test_guarantee_for_tau_default_delta() -> None:
    assert DEFAULT_DELTA == 1e-6
    g = guarantee_for_tau(
        tau=tau_for_rho(0.5, 0.5),
        a=0.5,
        delta=DEFAULT_DELTA,
        mechanism="BinMech",
        theorem="lem: BinMech (1/(2 tau^2)-zCDP)",
    )
    assert g.rho <= 0.5
    assert g.epsilon == pytest.approx(epsilon_cks(0.5, 1e-6), rel=1e-9)


def test_guarantee_str_and_dict() -> None:
    g = PrivacyGuarantee(
        rho=0.5,
        epsilon=5.2215,
        delta=1e-6,
        conversion="cks2020",
        mechanism="KnownBase",
        theorem="lem: KnownBase (Delta0/(2 tau^2)-zCDP)",
    )
    text = str(g)
    assert text.startswith(
        "rho-zCDP with rho=0.5; (epsilon=5.2215, delta=1e-06)-DP via cks2020, per event"
    )
    assert "KnownBase" in text
    assert g.unit == "event" and "same time step" in g.neighbours
    d = g.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["rho_delta"] == 0.0 and d["mechanism"] == "KnownBase"
    g2 = dataclasses.replace(g, rho_delta=1e-7)
    assert "rho_delta=1e-07" in str(g2)
    assert g.zcdp == ZCDP(0.5) and g.approx_dp == ApproxDP(5.2215, 1e-6)


@pytest.mark.parametrize(
    "change, exc, name",
    [
        ({"rho": 0.0}, ValueError, "rho"),
        ({"rho": math.nan}, ValueError, "rho"),
        ({"epsilon": -1.0}, ValueError, "epsilon"),
        ({"delta": 0.0}, ValueError, "delta"),
        ({"delta": 1e-8, "rho_delta": 1e-7}, ValueError, "rho_delta"),
        ({"conversion": "rdp"}, ValueError, "conversion"),
        ({"mechanism": 3}, TypeError, "mechanism"),
        ({"rho": True}, TypeError, "rho"),
    ],
)
def test_guarantee_validates(change: dict, exc: type[Exception], name: str) -> None:
    base = {
        "rho": 0.5,
        "epsilon": 5.0,
        "delta": 1e-6,
        "conversion": "cks2020",
        "mechanism": "KnownBase",
        "theorem": "lem",
    }
    with pytest.raises(exc, match=name):
        PrivacyGuarantee(**{**base, **change})


def test_small_guarantee_values() -> None:
    assert ZCDP(np.float32(0.5)).rho == 0.5
    assert str(ZCDP(0.5)) == "rho-zCDP with rho=0.5"
    assert ApproxDP(0.0, 0.0).delta == 0.0
    with pytest.raises(ValueError, match="rho"):
        ZCDP(math.inf)
    with pytest.raises(ValueError, match="epsilon"):
        ApproxDP(-0.1, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        ApproxDP(1.0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ZCDP(0.5).rho = 1.0  # type: ignore[misc]


# ----------------------------------------------------------------- resolve_budget


def test_resolve_budget_forms() -> None:
    b = resolve_budget(rho=np.float64(0.5), epsilon=None, delta=None, tau=None)
    assert b == Budget(kind="rho", rho=0.5)
    assert type(b.rho) is float and b.reporting_delta == DEFAULT_DELTA
    b = resolve_budget(rho=None, epsilon=1, delta=1e-6, tau=None)
    assert (b.kind, b.epsilon, b.delta, b.reporting_delta) == ("epsilon-delta", 1.0, 1e-6, 1e-6)
    b = resolve_budget(rho=None, epsilon=None, delta=None, tau=np.int64(3))
    assert (b.kind, b.tau) == ("tau", 3.0)
    assert b.calibrate(1.5) == 3.0
    assert resolve_budget(rho=0.5).calibrate(1.5) == tau_for_rho(0.5, 1.5)


@pytest.mark.parametrize(
    "kwargs, exc, fragments",
    [
        ({}, ValueError, ["rho=", "epsilon=", "tau="]),
        ({"rho": 0.5, "epsilon": 1.0}, ValueError, ["exactly one", "rho=0.5", "epsilon=1.0"]),
        ({"rho": 0.5, "tau": 2.0}, ValueError, ["exactly one", "tau=2.0"]),
        ({"rho": 0.5, "delta": 1e-6}, ValueError, ["exactly one", "delta=1e-06"]),
        ({"epsilon": 1.0}, ValueError, ["delta", "epsilon=1.0"]),
        ({"delta": 1e-6}, ValueError, ["epsilon", "delta=1e-06"]),
        ({"rho": 0.0}, ValueError, ["rho", "0.0"]),
        ({"rho": -1.0}, ValueError, ["rho", "-1.0"]),
        ({"rho": math.inf}, ValueError, ["rho", "inf"]),
        ({"rho": math.nan}, ValueError, ["rho", "nan"]),
        ({"epsilon": 0.0, "delta": 1e-6}, ValueError, ["epsilon", "0.0"]),
        ({"epsilon": math.inf, "delta": 1e-6}, ValueError, ["epsilon", "inf"]),
        ({"epsilon": 1.0, "delta": 0.0}, ValueError, ["delta", "0.0"]),
        ({"epsilon": 1.0, "delta": 1.0}, ValueError, ["delta", "1.0"]),
        ({"epsilon": 1.0, "delta": -0.1}, ValueError, ["delta", "-0.1"]),
        ({"tau": 0.0}, ValueError, ["tau", "0.0"]),
        ({"tau": -math.inf}, ValueError, ["tau", "-inf"]),
        ({"rho": "0.5"}, TypeError, ["rho", "'0.5'"]),
        ({"rho": True}, TypeError, ["rho", "True"]),
        ({"epsilon": 1.0, "delta": np.bool_(True)}, TypeError, ["delta"]),
        ({"tau": [1.0]}, TypeError, ["tau"]),
        ({"epsilon": 1 + 0j, "delta": 1e-6}, TypeError, ["epsilon"]),
    ],
)
def test_resolve_budget_errors(kwargs: dict, exc: type[Exception], fragments: list[str]) -> None:
    with pytest.raises(exc) as info:
        resolve_budget(**kwargs)
    assert type(info.value) is exc
    for fragment in fragments:
        assert fragment in str(info.value)


def test_budget_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="kind"):
        Budget(kind="eps")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tau"):
        Budget(kind="rho", rho=0.5, tau=1.0)


# ----------------------------------------------------------------- ledger


def test_ledger_adds_rho() -> None:
    ledger = PrivacyLedger(rho_budget=1.0)
    for label in "abcd":
        ledger.spend(0.25, label)
    assert ledger.spent == 1.0 and ledger.remaining == 0.0
    assert ledger.entries == (("a", 0.25), ("b", 0.25), ("c", 0.25), ("d", 0.25))


def test_ledger_refuses_overspend_without_recording() -> None:
    ledger = PrivacyLedger(rho_budget=0.5)
    ledger.spend(0.3, "counter")
    with pytest.raises(BudgetExhaustedError, match="top-k") as info:
        ledger.spend(0.25, "top-k")
    assert isinstance(info.value, DPStreamError)
    assert ledger.spent == 0.3
    assert ledger.entries == (("counter", 0.3),)
    ledger.spend(0.2, "fits")
    assert ledger.spent == pytest.approx(0.5)


def test_ledger_rounds_against_the_spender() -> None:
    # 0.1 + 0.2 is 0.30000000000000004 in floats: over a 0.3 budget, so refused.
    ledger = PrivacyLedger(rho_budget=0.3)
    ledger.spend(0.1, "a")
    with pytest.raises(BudgetExhaustedError):
        ledger.spend(0.2, "b")


def test_ledger_without_budget_and_validation() -> None:
    ledger = PrivacyLedger()
    ledger.spend(100.0, "big")
    assert ledger.remaining is None and ledger.spent == 100.0
    with pytest.raises(ValueError, match="rho"):
        ledger.spend(0.0, "zero")
    with pytest.raises(TypeError, match="label"):
        ledger.spend(0.1, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rho_budget"):
        PrivacyLedger(rho_budget=-1.0)
    assert ledger.entries == (("big", 100.0),)


# --------------------------------------------------------------------------- high precision


def _mp_gaussian_delta(epsilon: float, mu: float):
    import mpmath

    mpmath.mp.dps = 60
    e, m = mpmath.mpf(epsilon), mpmath.mpf(mu)
    return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)


@pytest.mark.parametrize(
    "epsilon,mu",
    [
        (0.01, 0.001),
        (0.01, 0.0015),
        (1e-4, 1e-5),
        (0.1, 0.02),
        (1.0, 0.3),
        (1.0, 1.0),
        (5.0, 1.0),
        (20.0, 2.0),
        (0.5, 3.0),
        (50.0, 8.0),
    ],
)
def test_gaussian_delta_is_an_upper_bound_of_the_exact_value(epsilon, mu):
    """Against 60-digit mpmath: never below the exact delta, and within 1e-4 of it.

    Small mu is where Phi(x) - e^eps Phi(y) cancels catastrophically in floating
    point (a review found the unguarded formula 1e-11 too low there). The guard
    widens the bound by the cancellation's error, which at mu = 1e-5 is about
    1.5e-6 relative: 1e-4 still catches a bound that is loose for no reason.
    """
    exact = _mp_gaussian_delta(epsilon, mu)
    got = gaussian_delta(epsilon, mu)
    assert got >= exact
    assert got <= exact * (1 + 1e-4) + 1e-300


def test_the_gaussian_claim_holds_at_a_large_mu() -> None:
    """Review 97: at a large mu (a tiny --tau: rho up to 1e19) the bound's allowance was
    scaled by |log_b| though log_b is two terms of size epsilon that cancel, and x's two
    terms (of size mu / 2) cancel too: the claimed epsilon at delta 1e-6 had a true
    delta of 0.79 at --tau 1e-9. Against 60-digit mpmath, at the claimed epsilon of 60
    log-spaced mu from 1e2 to 4e9 (each claim at delta 1e-6 and 1e-10) and at that
    epsilon nudged 1e-9 either way: never below the exact delta (a bound that must
    hold, so no tolerance). The old bound fails here from mu ~ 2e3."""
    for mu in np.geomspace(1e2, 4e9, 60).tolist():
        for target in (1e-6, 1e-10):
            eps = gaussian_epsilon(target, mu)
            assert _mp_gaussian_delta(eps, mu) <= target, (mu, target)
            for e in (eps * (1 - 1e-9), eps * (1 + 1e-9)):
                assert gaussian_delta(e, mu) >= _mp_gaussian_delta(e, mu), (mu, e)


def test_gaussian_epsilon_refuses_a_mu_past_float_arithmetic() -> None:
    """Review 98: mu past ~1e154 made mu * mu infinite and the bracket's search looped
    for ever; it is refused in words."""
    with pytest.raises(ValueError, match="too large for float arithmetic"):
        gaussian_epsilon(1e-6, 1e160)


@pytest.mark.parametrize("epsilon,delta", [(0.01, 1e-15), (0.01, 1e-6), (1.0, 1e-6), (3.0, 1e-9)])
def test_exact_gaussian_calibration_meets_target_in_high_precision(epsilon, delta):
    mu = mu_for_gaussian(epsilon, delta)
    assert _mp_gaussian_delta(epsilon, mu) <= delta
    assert gaussian_epsilon(delta, mu) >= 0


# --------------------------------------------------------------------------- the package layout

#: The modules of dpstream.privacy, in their import order: each may import only
#: the ones before it (docs/architecture.md, layer 1).
PACKAGE_ORDER = [
    "_checks",
    "_roots",
    "guarantees",
    "conversions",
    "calibration",
    "budgets",
    "composition",
]


def _package_imports(path: pathlib.Path) -> set[str]:
    """The dpstream.privacy modules that ``path`` imports, anywhere in it (a
    function-level import counts too: it would be a cycle all the same)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y, from . import x
                found.update(
                    [node.module.split(".")[0]]
                    if node.module
                    else [alias.name for alias in node.names]
                )
            elif node.level == 0 and (node.module or "").startswith("dpstream.privacy"):
                rest = node.module.split(".")[2:]
                found.update(rest[:1] or [alias.name for alias in node.names])
            elif node.level == 2 and node.module in ("privacy", None):
                found.add("__init__")  # from .. import privacy, from ..privacy import x
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dpstream.privacy"):
                    found.add((alias.name.split(".")[2:] or ["__init__"])[0])
    return found


def test_privacy_package_imports_point_one_way() -> None:
    """Each module imports only modules before it in PACKAGE_ORDER: no cycle."""
    package = pathlib.Path(dpstream.privacy.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert modules == sorted(PACKAGE_ORDER), "a new module must be placed in PACKAGE_ORDER"
    for i, name in enumerate(PACKAGE_ORDER):
        imported = _package_imports(package / f"{name}.py")
        later = imported - set(PACKAGE_ORDER[:i])
        assert not later, f"privacy/{name}.py imports {sorted(later)}, not before it"


def test_importing_privacy_leaves_scipy_optimize_unloaded() -> None:
    """``scipy.optimize`` costs ~0.2 s of a command's start: the package does not load
    it (Brent's method is SciPy's compiled routine, :mod:`dpstream.rootfind`)."""
    code = "import sys, dpstream.privacy; print('scipy.optimize' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cks_epsilon_never_fails_at_extreme_rho() -> None:
    """At rho ~ 1e18 (tau = 1e-9, used by tests for exact counts; the total of several
    such runs on a dataset) the optimal alpha - 1 ~ 1e-9 is rounded away and the root
    bracket lost its sign change: a ValueError from brentq. Any alpha > 1 is a valid
    CKS20 bound, so the result must be finite and never above Bun-Steinke's."""
    for rho in np.logspace(8, 19, 45):
        for delta in (1e-9, 1e-6, 2e-6, 3e-6, 1e-3):
            eps = epsilon_cks(float(rho), delta)
            assert math.isfinite(eps) and eps <= epsilon_bun_steinke(float(rho), delta)
            assert eps >= float(rho)  # epsilon >= rho for every alpha > 1 at delta < 1


def test_the_conversions_hold_at_extreme_inputs_without_a_bare_math_error():
    """Review 112: epsilon_cks(1e300, 1e-6) raised "math domain error" (alpha rounds to 1)
    and delta_cks(1, 1e300) an OverflowError; each falls back on Bun-Steinke's bound,
    which holds for every input (closed forms: rho + 2 sqrt(rho ln(1/delta)), and
    delta = exp(-(eps - rho)^2 / (4 rho)) = 0.0 in floating point for eps = 1e300)."""
    rho, delta = 1e300, 1e-6
    assert dpstream.privacy.epsilon_cks(rho, delta) == rho + 2 * math.sqrt(rho * -math.log(delta))
    assert dpstream.privacy.delta_cks(1.0, 1e300) == 0.0
    assert dpstream.privacy.delta_bun_steinke(1e-300, 1e300) == 0.0
