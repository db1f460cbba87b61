"""Streams with no planned end: ``horizon=None`` in the library, no --horizon on the
command line (-m known and -m unknown).

What must hold: the counter's sensitivity is valid for every t (the limit of
sum_(n < T) c_n^2), the noise at t stays within 1.5x of the BLT fitted for
horizon t, the threshold's per-step deltas sum to at most delta over any number
of steps, daily runs equal one run, and a state cannot switch between a stream
with a horizon and one without.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.special import ndtr, ndtri

import dpstream as dps
from dpstream.cli import main
from dpstream.factorization import (
    MAX_BLT_HORIZON,
    blt_for_horizon,
    blt_unbounded,
    unbounded_std_ratio,
)
from dpstream.mechanisms.unknown import step_delta_divisor
from dpstream.state import recorded_params

from .conftest import UNKNOWN_CLI, fixed_key, own_ledger, with_option

# ----------------------------------------------------------------------- the counter


def test_the_sensitivity_is_the_limit_and_bounds_every_horizon():
    s = blt_unbounded()
    assert s.unbounded and s.horizon == MAX_BLT_HORIZON and s.buffers == 4
    limit = s.sensitivity_squared
    # the closed-form limit, term by term: 1 + sum omega_i omega_j / (1 - theta_i theta_j)
    pairs = list(zip(s.theta, s.omega, strict=True))
    brute = 1.0 + math.fsum(wi * wj / (1.0 - ti * tj) for ti, wi in pairs for tj, wj in pairs)
    assert limit == pytest.approx(brute, rel=1e-9)
    # the strategy column itself (fsum of c_n^2), and the sum up to T, for growing T
    column = s.strategy_column(100_000)
    assert math.fsum((column * column).tolist()) <= limit
    for horizon in (10, 1000, 1 << 20, 1 << 30, MAX_BLT_HORIZON):
        assert s.sensitivity_squared_closed_form(horizon) <= limit
    # a bounded statement of the same C at 2^40 is the finite sum (the limit is above it)
    assert s.at_horizon(1000).sensitivity_squared == limit  # stays the limit at any horizon


@pytest.mark.parametrize("t", [100, 1_000, 10_000, 100_000, 1_000_000])
def test_the_std_at_t_is_within_1_5x_of_the_blt_fitted_for_t(t):
    s = blt_unbounded()
    # brute force from the strategy: ||row_t(B)||^2 from B's column, V(t) of the fitted
    # BLT from its own column and strategy column (no closed form)
    row = s.variance_factors(t)[-1] if t <= 10_000 else s.variance_factor(t)
    fitted = blt_for_horizon(t)
    v_fitted = fitted.variance_factors(t)[-1] * fitted.sensitivity_squared
    ratio = math.sqrt(s.sensitivity_squared * row / v_fitted)
    assert ratio == pytest.approx(unbounded_std_ratio(t), rel=1e-9)
    assert ratio <= 1.5


def test_the_state_per_item_is_the_default_blt_s():
    assert blt_unbounded().buffers == blt_for_horizon(1000).buffers == 4
    key = fixed_key("noend")
    a = dps.KnownDomainHistogram(["a", "b"], None, max_items=1, key=key, rho=1.0)
    b = dps.KnownDomainHistogram(["a", "b"], 1000, max_items=1, key=key, rho=1.0)
    assert a._noise._buffers.shape == b._noise._buffers.shape


# ----------------------------------------------------------------------- the threshold


def test_the_per_step_deltas_sum_to_at_most_delta():
    # delta / (t (t + 1)) telescopes: sum_(t <= n) = delta (1 - 1/(n + 1)) < delta
    n = 200_000
    shares = [1.0 / step_delta_divisor(t, MAX_BLT_HORIZON, True) for t in range(1, n + 1)]
    assert math.fsum(shares) == pytest.approx(1.0 - 1.0 / (n + 1), rel=1e-12)
    assert math.fsum(shares) < 1.0
    assert step_delta_divisor(7, 1000, False) == 1000  # a horizon: delta / T at each step


def test_the_threshold_at_t_is_its_formula():
    key = fixed_key("noend")
    u = dps.UnknownDomainHistogram(None, max_items=2, key=key, epsilon=1.0, delta=1e-6)
    assert u.unbounded and u.privacy.for_all_t
    thr = u.threshold_delta
    assert 2 * thr < 1e-6  # Delta0 times it fits in the delta
    for t in (1, 2, 10, 1000, 123_456, 10**9):
        std = u.sigma * math.sqrt(u.strategy.variance_factor(t))
        assert u.noise_std_at(t) == std
        share = thr / (t * (t + 1))
        formula = 1.0 + std * float(-ndtri(share))
        m = u.threshold_at(t)
        assert m == pytest.approx(formula, rel=1e-12) and m >= formula
        assert float(ndtr(-(m - 1.0) / std)) <= share * (1 + 1e-12)
    # the worst threshold is the one at the step limit; thresholds grow with t
    assert u.threshold == u.threshold_at(MAX_BLT_HORIZON)
    assert u.threshold_at(10) < u.threshold_at(1000) < u.threshold


def test_no_horizon_in_the_library():
    key = fixed_key("noend")
    h = dps.KnownDomainHistogram(["a", "b"], None, max_items=1, key=key, rho=1.0)
    assert h.privacy.for_all_t and "for all t" in h.privacy.plain()
    assert h.privacy.to_dict()["for_all_t"] is True
    bounded = dps.KnownDomainHistogram(["a", "b"], 100, max_items=1, key=key, rho=1.0)
    assert "for_all_t" not in bounded.privacy.to_dict()  # unchanged for a horizon
    assert "for all t" not in bounded.privacy.plain()
    # same tau: the sigma is calibrated to the limit sensitivity
    assert h.tau == bounded.tau
    assert h.sigma == pytest.approx(
        h.tau * math.sqrt(blt_unbounded().sensitivity_squared), rel=1e-9
    )
    for t in range(1, 4):
        rel = h.step(["a"])
        assert rel.t == t
    with pytest.raises(ValueError, match="BLT counter"):
        dps.KnownDomainHistogram(["a"], None, max_items=1, key=key, rho=1.0, counter="tree")
    with pytest.raises(ValueError, match="BLT counter"):
        dps.UnknownDomainHistogram(
            None, max_items=1, key=key, rho=1.0, base=4, threshold_delta=1e-6
        )
    with pytest.raises(ValueError, match="every t"):
        dps.KnownDomainHistogram(
            ["a"], None, max_items=1, key=key, rho=1.0, counter=blt_for_horizon(1000)
        )


# ----------------------------------------------------------------------- the command line

DAYS, STEPS_PER_DAY = 30, 4
MECHS = {
    "known": ["-m", "known", "--max-items", "2", "--rho", "1"],
    "unknown": [*UNKNOWN_CLI, "--remember"],
    # the top-k of the known-domain histogram (rho alone: no unknown-domain candidate)
    "top-k": ["-m", "top-k", "--k", "3", "--max-items", "2", "--rho", "1", "--stream", "tk"],
}


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    base = tmp_path_factory.mktemp("noend")
    key_path = base / "k.key"
    fixed_key("noend-cli").save(key_path)
    rng = np.random.default_rng(5)  # simulated events (test data, not a release)
    words = [f"w{i}" for i in range(12)]
    (base / "domain.txt").write_text("\n".join(words) + "\n")
    everything = []
    for d in range(1, DAYS + 1):
        lines = []
        for t in range((d - 1) * STEPS_PER_DAY + 1, d * STEPS_PER_DAY + 1):
            for _ in range(int(rng.integers(0, 6))):
                items = rng.choice(words, size=int(rng.integers(1, 3)), replace=False)
                lines.append(json.dumps({"t": t, "items": items.tolist()}) + "\n")
        (base / f"day{d:02d}.jsonl").write_text("".join(lines))
        everything += lines
    (base / "all.jsonl").write_text("".join(everything))
    return base, key_path


def _args(base, key_path, mech):
    extra = ["--domain", str(base / "domain.txt")] if mech in ("known", "top-k") else []
    return ["run", "-q", *MECHS[mech], *extra, "--key-file", str(key_path), "--no-fsync"]


@pytest.mark.parametrize("mech", sorted(MECHS))
def test_thirty_daily_runs_with_no_horizon_equal_one_run(stream, tmp_path, mech):
    base, key_path = stream
    args = _args(base, key_path, mech)
    last = DAYS * STEPS_PER_DAY
    ref = tmp_path / "ref.jsonl"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "all.jsonl"),
                "-o",
                str(ref),
                "--until",
                str(last),
                *own_ledger(ref),
            ]
        )
        == 0
    )
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    for d in range(1, DAYS + 1):
        assert (
            main(
                [
                    *args,
                    "-i",
                    str(base / f"day{d:02d}.jsonl"),
                    "-o",
                    str(out),
                    "--state",
                    str(state),
                    "--until",
                    str(d * STEPS_PER_DAY),
                ]
            )
            == 0
        ), d
    assert out.read_bytes() == ref.read_bytes()
    releases = [json.loads(line) for line in ref.read_text().splitlines()]
    assert [r["t"] for r in releases] == list(range(1, last + 1))
    params = recorded_params(str(state))
    assert params["unbounded"] is True and params["horizon"] is None
    meta = json.loads((tmp_path / "ref.jsonl.meta.json").read_text())
    assert meta["unbounded"] is True and meta["horizon"] is None
    assert meta["privacy"]["for_all_t"] is True
    # the stream goes on past the last day (no horizon to reach): a quiet day later
    # (an empty input is refused unless the run says the steps had no events)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    quiet = [*args, "-i", str(empty), "-o", str(out), "--state", str(state)]
    assert main([*quiet, "--until", str(last + 3)]) == 1
    assert main([*quiet, "--until", str(last + 3), "--allow-empty"]) == 0
    more = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["t"] for r in more] == list(range(1, last + 4))


def test_a_resume_cannot_switch_between_a_horizon_and_none(stream, tmp_path, capsys):
    base, key_path = stream
    args = _args(base, key_path, "known")
    for n, (first, second) in enumerate(
        (
            (["--until", "4"], ["-T", "120", "--until", "8"]),
            (["-T", "120", "--until", "4"], ["--until", "8"]),
        )
    ):
        out, state = tmp_path / f"o{n}.jsonl", tmp_path / f"s{n}.sqlite"
        assert (
            main(
                [
                    *args,
                    *first,
                    "-i",
                    str(base / "day01.jsonl"),
                    "-o",
                    str(out),
                    "--state",
                    str(state),
                    *own_ledger(out),
                ]
            )
            == 0
        )
        capsys.readouterr()
        before = out.read_bytes()
        assert (
            main(
                [
                    *args,
                    *second,
                    "-i",
                    str(base / "day02.jsonl"),
                    "-o",
                    str(out),
                    "--state",
                    str(state),
                    *own_ledger(out),
                ]
            )
            == 1
        )
        err = capsys.readouterr().err
        assert "other parameters" in err and "horizon" in err
        assert out.read_bytes() == before


def test_no_horizon_needs_an_end_step_and_known_or_unknown(stream, tmp_path, capsys):
    base, key_path = stream
    args = _args(base, key_path, "known")
    out = tmp_path / "o.jsonl"
    assert main([*args, "-i", str(base / "day01.jsonl"), "-o", str(out)]) == 2
    assert "--until" in capsys.readouterr().err
    assert not out.exists()
    for bad, words in (
        (["--counter", "tree"], "--counter tree"),
        (["--blt-buffers", "2"], "--blt-buffers needs --horizon"),
    ):
        assert (
            main([*args, *bad, "-i", str(base / "day01.jsonl"), "-o", str(out), "--until", "4"])
            == 2
        )
        assert words in capsys.readouterr().err
    assert (
        main(
            [
                "plan",
                "-m",
                "known",
                "--domain-size",
                "5",
                "--max-items",
                "1",
                "--target-error",
                "10",
            ]
        )
        == 2
    )
    assert "--target-error needs --horizon" in capsys.readouterr().err
    assert main(["plan", "-m", "top-k", "--domain-size", "5", "--k", "2", "--rho", "1"]) == 2
    assert "top-k without --horizon needs --max-items" in capsys.readouterr().err
    assert main(["plan", "-m", "meta", "--oneshot", "unknown-gaussian", "--rho", "1"]) == 2
    assert "meta needs --horizon" in capsys.readouterr().err


def test_plan_without_a_horizon_shows_the_std_at_several_steps(capsys):
    assert (
        main(["plan", "-m", "unknown", "--max-items", "2", "--epsilon", "1", "--delta", "1e-6"])
        == 0
    )
    text = capsys.readouterr().out
    assert "no planned end" in text and "1,000,000:" in text and "for all t" in text
    assert (
        main(
            [
                "plan",
                "-m",
                "unknown",
                "--max-items",
                "2",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--json",
            ]
        )
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    mech = dps.UnknownDomainHistogram(
        None, max_items=2, key=fixed_key("x"), epsilon=1.0, delta=1e-6
    )
    assert info["unbounded"] is True and info["horizon"] is None
    assert sorted(int(t) for t in info["noise_std_at"]) == [10**e for e in range(1, 7)]
    for t, std in info["noise_std_at"].items():
        assert std == pytest.approx(mech.noise_std_at(int(t)), rel=1e-12)
        assert info["threshold_at"][t] == pytest.approx(mech.threshold_at(int(t)), rel=1e-12)
        assert f"{int(t):,}: {std:.4g}" in text
    assert all(r <= 1.5 for t, r in info["std_ratio_to_fitted"].items() if int(t) >= 100)


def test_messages_of_a_stream_with_no_planned_end_name_no_horizon(stream, tmp_path, capsys, caplog):
    """Review 115 (low): without --horizon, `--until 2^40 + 1` was refused as past
    "--horizon 1099511627776" (never given), and a follower's progress line said "step
    8985 of 1099511627776 (0%) ... about 339938h left". Both now say what holds."""
    import logging

    from dpstream.run.report import Progress

    base, key_path = stream
    args = _args(base, key_path, "known")
    out = tmp_path / "o.jsonl"
    argv = [*args, "-i", str(base / "day01.jsonl"), "-o", str(out), "--until", str(2**40 + 1)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "past the step limit 1099511627776 (2^40) of a stream with no planned end" in err
    assert "--horizon" not in err
    caplog.set_level(logging.INFO, logger="dpstream")
    caplog.clear()
    for total in (None, 100):
        progress = Progress(total, enabled=True, every=0.0)
        progress.bar_mode, progress.log_mode = False, True  # the log line, not a bar
        progress.update(40, 1000)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 40")]
    assert lines[0].startswith("step 40 (no planned end), 1,000 events")
    assert " of " not in lines[0] and "left" not in lines[0]
    assert lines[1].startswith("step 40 of 100 (40%)") and "left" in lines[1]


def test_the_view_of_a_stream_with_no_planned_end_says_so(stream, tmp_path):
    """Review 115 (low): the page said "horizon unknown", stated the guarantee without
    "for every t", showed a "worst step" half-width that was the one at t = 2^40, and
    drew the discovery threshold as the last step's without saying so."""
    base, key_path = stream
    out = tmp_path / "o.jsonl"
    argv = [*_args(base, key_path, "unknown"), "-i", str(base / "all.jsonl"), "-o", str(out)]
    argv = with_option(argv, "--rho", "1e4")
    assert main([*argv, "--until", str(STEPS_PER_DAY * DAYS)]) == 0
    page = tmp_path / "page.html"
    assert main(["view", str(out), "--export", str(page)]) == 0
    html = page.read_text()
    assert "no planned end" in html and "horizon unknown" not in html
    assert "for every t" in html and "worst step ±" not in html
    # the chart's line (items pass the threshold at this budget, so it is drawn)
    assert f"discovery threshold at step {STEPS_PER_DAY * DAYS} (it varies with t)" in html
