"""Budgets outside the range the calibration's float arithmetic supports are refused in
words (review 61: tracebacks, a hang), by the library constructors and by ``plan`` and
``run`` before any input is read; budgets inside it calibrate to the same tau as before.
"""

from __future__ import annotations

import math

import pytest

import dpstream as dps
from dpstream import privacy
from dpstream.cli import main
from dpstream.privacy._checks import CKS_RHO_MAX
from dpstream.privacy.conversions import gaussian_delta

from .conftest import fixed_key

DOMAIN = ["a", "b", "c"]
OUTSIDE = "outside the range the calibration supports"


def _build(name: str, **budget: float) -> object:
    key = fixed_key("ranges")
    if name == "known":
        return dps.KnownDomainHistogram(DOMAIN, 15, max_items=1, key=key, **budget)
    if name == "unknown":
        return dps.UnknownDomainHistogram(15, max_items=1, key=key, **budget)
    if name == "top-k":
        return dps.ContinualTopK(DOMAIN, 15, k=1, switches=2, key=key, **budget)
    assert name == "meta"
    return dps.MetaHistogram(15, oneshot="gaussian", domain=DOMAIN, max_items=1, key=key, **budget)


# each crashed before (the error it gave), or calibrated a budget no float supports
REFUSED = [
    ("unknown", {"epsilon": 1e-300, "delta": 1e-6}),  # RuntimeError: Failed to converge
    ("known", {"epsilon": 1e-300, "delta": 1e-6}),  # calibrated (rho underflows elsewhere)
    ("known", {"epsilon": 1e300, "delta": 1e-6}),  # ZeroDivisionError
    ("top-k", {"epsilon": 1e300, "delta": 1e-6}),  # math domain error
    ("unknown", {"tau": 1e-300, "threshold_delta": 1e-6}),  # ZeroDivisionError
    ("top-k", {"tau": 1e-150}),  # math domain error
    ("meta", {"tau": 1e-300}),  # ZeroDivisionError
    ("top-k", {"rho": 1e40}),  # math domain error
    ("known", {"rho": 1e-310}),  # "tau must be positive and finite, got tau=inf"
    ("known", {"tau": 1e160}),  # "rho must be positive and finite, got rho=0.0"
    ("top-k", {"epsilon": 1.0, "delta": 1 - 1e-16}),  # math domain error
]


@pytest.mark.parametrize(
    "budget", [{"rho": 10**400}, {"tau": 10**400}, {"epsilon": 10**400, "delta": 1e-6}]
)
def test_an_int_past_the_float_range_is_refused_in_words(budget):
    """Review 121: an int budget too large for a float (10**400) raised a bare
    OverflowError ("int too large to convert to float") instead of the range's words."""
    with pytest.raises(ValueError, match="rho|tau|epsilon"):
        _build("known", **budget)


@pytest.mark.parametrize(("name", "budget"), REFUSED)
def test_a_budget_outside_the_supported_range_is_refused_in_words(name, budget):
    with pytest.raises(ValueError, match=OUTSIDE) as info:
        _build(name, **budget)
    assert "float arithmetic" in str(info.value)


# the smallest and largest of each form: inside, they calibrate (tau as before the ranges)
INSIDE = [
    ("known", {"rho": 1e-200}, 7.071067811865476e99),
    ("known", {"rho": 1e15}, 2.23606797749979e-08),
    ("known", {"epsilon": 1e-98, "delta": 1e-6}, 398942.287144309),
    # (review 97: the exact Gaussian delta's error bound now also holds where its terms
    # cancel, at a large mu or a delta near 1: these two ends moved, by 6e-16 and 4e-5)
    ("known", {"epsilon": 1e15, "delta": 1e-6}, 2.2360682151710187e-08),
    ("known", {"tau": 2.3e-10}, 2.3e-10),
    ("known", {"tau": 1e-9}, 1e-9),  # exact-count checks run here (rho = a * 1e18)
    ("known", {"tau": 1e99}, 1e99),
    ("known", {"epsilon": 1.0, "delta": 1 - 1e-12}, 0.06947872150092944),
    ("top-k", {"rho": 1e-200}, 1.2247448713915892e100),
    ("top-k", {"rho": 1e15}, 3.8729833462074174e-08),
    ("top-k", {"epsilon": 1e-98, "delta": 1e-6}, 1050541.9189703134),
    ("top-k", {"epsilon": 1e15, "delta": 1e-6}, 3.8729838014355506e-08),
    ("top-k", {"epsilon": 1.0, "delta": 1 - 1e-12}, 0.22889011806222728),
    ("unknown", {"rho": 1e15, "threshold_delta": 1e-6}, 2.23606797749979e-08),
    ("unknown", {"rho": 1e-200, "threshold_delta": 1e-6}, 7.071067811865476e99),
    # budgets in use: the tau of every release made with them is unchanged
    ("known", {"epsilon": 1.0, "delta": 1e-6}, 4.224678889328143),
    ("top-k", {"rho": 0.5}, 1.7320508075688774),
    ("unknown", {"epsilon": 1.0, "delta": 1e-6}, 4.333306253769449),
]


@pytest.mark.parametrize(("name", "budget", "tau"), INSIDE)
def test_a_budget_at_the_ends_of_the_range_calibrates_as_before(name, budget, tau):
    mech = _build(name, **budget)
    assert mech.tau == tau  # the value the code gave before the ranges were checked
    assert math.isfinite(mech.privacy.epsilon) and math.isfinite(mech.privacy.rho)


def test_the_ends_of_the_ranges_are_inside_and_the_next_floats_outside():
    for name, (low, high) in (
        ("rho", privacy.RHO_RANGE),
        ("epsilon", privacy.EPSILON_RANGE),
        ("tau", privacy.TAU_RANGE),
    ):
        assert privacy.budget_range_problem(name, low) is None
        assert privacy.budget_range_problem(name, high) is None
        below = privacy.budget_range_problem(name, math.nextafter(low, 0.0))
        above = privacy.budget_range_problem(name, math.nextafter(high, math.inf))
        assert below is not None and above is not None
        assert OUTSIDE in below and OUTSIDE in above
    assert privacy.delta_range_problem(privacy.DELTA_MAX) is None
    assert privacy.delta_range_problem(math.nextafter(privacy.DELTA_MAX, 1.0)) is not None
    # tau's range gives a rho the conversion takes at the smallest coefficient a = 1/2
    low, high = privacy.TAU_RANGE
    assert privacy.RHO_RANGE[0] <= 0.5 / (high * high) <= 0.5 / (low * low)
    assert 0.5 / (low * low) <= CKS_RHO_MAX


def test_a_tiny_epsilon_on_the_gaussian_curve_states_a_valid_claim():
    """UnkBase at epsilon 1e-20 (delta 1e-6): the root of the exact Gaussian curve in
    epsilon lies at 0, where the nudge's relative steps could not move it
    (ArithmeticError); the claim is now the smallest power of two that passes, and the
    curve confirms it."""
    mech = _build("unknown", epsilon=1e-20, delta=1e-6)
    g = mech.privacy
    mu = math.sqrt(2 * 0.5) / mech.tau  # Delta0 = 1
    assert gaussian_delta(g.epsilon, mu) <= g.delta - g.rho_delta
    assert g.epsilon < 1e-6


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize(
    ("mechanism", "budget", "flag"),
    [
        (
            ["-m", "unknown", "--max-items", "1"],
            ["--epsilon", "1e-300", "--delta", "1e-6"],
            "--epsilon",
        ),
        (
            ["-m", "known", "--max-items", "1"],
            ["--epsilon", "1e300", "--delta", "1e-6"],
            "--epsilon",
        ),
        (
            ["-m", "unknown", "--max-items", "1"],
            ["--tau", "1e-300", "--threshold-delta", "1e-6"],
            "--tau",
        ),
        (["-m", "top-k", "--k", "1"], ["--tau", "1e-150"], "--tau"),
        (["-m", "meta", "--oneshot", "gaussian"], ["--rho", "1e-310"], "--rho"),
        (
            ["-m", "known", "--max-items", "1"],
            ["--epsilon", "1", "--delta", "0.9999999999999"],
            "--delta",
        ),
    ],
)
def test_plan_and_run_refuse_a_budget_outside_the_range_before_reading_input(
    tmp_path, capsys, command, mechanism, budget, flag
):
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\n")
    if command == "plan":
        where = ["--domain-size", "2"] if "--k" in mechanism or "meta" in mechanism else []
        argv = ["plan", *mechanism, "--horizon", "15", *where, *budget]
    else:
        where = ["--domain", str(domain)] if "--k" in mechanism or "meta" in mechanism else []
        key = tmp_path / "k.key"
        fixed_key("ranges-cli").save(key)
        argv = [
            "run",
            *mechanism,
            "--horizon",
            "15",
            *where,
            *budget,
            "--key-file",
            str(key),
            "-i",
            str(tmp_path / "missing.jsonl"),  # never opened: refused before
            "-o",
            str(tmp_path / "out.jsonl"),
        ]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} " in err and OUTSIDE in err and "Traceback" not in err, err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("target", ["1e-300", "1e300"])
def test_plan_refuses_a_target_error_whose_noise_is_outside_the_range(capsys, target):
    """--target-error fixes tau = target / (the worst-step std at tau = 1): one outside
    the range is refused naming the target (it was a ZeroDivisionError at 1e-300 and
    "rho must be positive, got --rho 0.0" at 1e300)."""
    argv = ["plan", "-m", "known", "--horizon", "15", "--max-items", "1", "--domain-size", "3"]
    capsys.readouterr()
    assert main([*argv, "--target-error", target, "--delta", "1e-6"]) == 2
    err = capsys.readouterr().err
    assert f"--target-error {float(target)!r} needs the noise scale" in err, err
    assert OUTSIDE in err
