"""``dpstream reproduce --quick``: every figure and the report are produced, and the claim
checks in the report are computed from the data (they change when the data do)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dpstream.experiments import topk_zipf, unknown_domain
from dpstream.experiments.base_noise import claims_from_ratios
from dpstream.experiments.common import data_rng, trial_key

FIGURES = (
    "fig1_base_noise.png",
    "fig2_sparsegumb_zipf.png",
    "fig3_unknown_domain.png",
    "fig4_error_vs_epsilon.png",
    "fig5_counters.png",
)
CLAIM_LINE = re.compile(r"^- \*\*(HOLDS|DIFFERS|PARTLY|NOT TESTED)\*\*: ", re.M)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick reproduction, through the command line as CI and users run it."""
    from dpstream.cli import main

    out = tmp_path_factory.mktemp("reproduction")
    assert main(["reproduce", "--quick", "--quiet", "--out", str(out)]) == 0
    report = out / "REPORT.md"
    return out, report, report.read_text()


def test_report_is_written_in_out_dir(quick_run):
    out, report, _ = quick_run
    assert report == out / "REPORT.md"
    assert report.stat().st_size > 5000


@pytest.mark.parametrize("name", FIGURES)
def test_each_figure_exists_and_is_not_trivial(quick_run, name):
    import matplotlib.image as mpimg

    out, _, text = quick_run
    path = out / name
    assert path.is_file()
    assert path.stat().st_size > 20_000  # a blank 110-dpi canvas of this size is ~10 kB
    img = mpimg.imread(path)[..., :3]
    assert img.std() > 0.05  # not a uniform image
    non_white = np.mean(img.min(axis=-1) < 0.9)
    assert 0.01 < non_white < 0.9  # something is drawn, not a filled rectangle
    assert f"]({name})" in text  # embedded in the report


def test_report_records_provenance_and_parameters(quick_run):
    _, _, text = quick_run
    assert "dpstream reproduce --out" in text and "--quick" in text
    assert re.search(r"\| commit \| `([0-9a-f]{40}|unknown[^`]*)` \|", text)
    assert re.search(r"\| experiment seed \| \d+ \|", text)
    assert "Simulation mode" in text
    assert text.count("### Parameters") == len(FIGURES)


def test_report_has_computed_claim_lines_for_every_figure(quick_run):
    _, _, text = quick_run
    sections = text.split("\n## ")[1:]
    figure_sections = [s for s in sections if s.startswith("Figure")]
    assert len(figure_sections) == len(FIGURES)
    for section in figure_sections:
        claims = CLAIM_LINE.findall(section)
        assert len(claims) >= 2, section[:80]
        # every claim states what was measured, with numbers, and how it was judged
        for block in re.split(CLAIM_LINE, section)[2::2]:
            measured = re.search(r"  - measured: (.*)", block).group(1)
            assert re.search(r"\d", measured)
            assert "  - criterion: " in block
    assert "## Experiments that did not run" not in text


def test_base_noise_verdicts_follow_the_numbers():
    # the same grid with made-up ratios: the verdict must flip with the data
    T = np.array([10, 100, 1000, 10**4, 10**5, 10**6, 10**7])
    rstar = np.array([4, 5, 4, 5, 7, 4, 6])
    flat = np.ones(len(T))
    good = claims_from_ratios(T, rstar, 0.85 * flat, 0.85 * flat, 1.01 * flat)
    bad = claims_from_ratios(T, np.full(len(T), 20), 0.6 * flat, 0.6 * flat, 1.5 * flat)
    assert [c.verdict for c in good] == ["HOLDS", "HOLDS", "HOLDS"]
    assert [c.verdict for c in bad] == ["DIFFERS", "DIFFERS", "DIFFERS"]
    assert "15.0%" in good[0].measured and "40.0%" in bad[0].measured


def test_counter_verdicts_follow_the_numbers():
    from dpstream.experiments.counters import claims_from_variances

    T = np.array([10, 100, 1000, 10**4, 10**5, 10**6])
    bound = np.array([2.2, 4.7, 8.4, 13.2, 19.1, 26.0])
    good = claims_from_variances(T, rstar=bound * 8, blt=bound * 1.2, bound=bound)
    bad = claims_from_variances(T, rstar=bound * 1.1, blt=bound * 1.5, bound=bound)
    assert [c.verdict for c in good] == ["HOLDS", "HOLDS", "HOLDS"]
    assert [c.verdict for c in bad] == ["DIFFERS", "DIFFERS", "DIFFERS"]
    assert "1.200" in good[0].measured and "1.500" in bad[0].measured


def _fake_topk_means(params, meta_level: float) -> dict[str, np.ndarray]:
    T = params["T"]
    t = np.arange(1, T + 1, dtype=float)
    mean: dict[str, np.ndarray] = {}
    for cfg in topk_zipf.curves(params):
        lb = cfg["label"]
        level = {"known": 50.0, "meta": meta_level}.get(cfg["kind"], 20.0 + cfg.get("s", 0))
        mean[f"{lb}|err"] = np.full(T, level)
        mean[f"{lb}|hit"] = np.ones(T)
        if cfg["kind"] == "sparse":
            mean[f"{lb}|err"] = mean[f"{lb}|err"] + (0.2 * t if cfg["s"] == 1 else 0.0)
            mean[f"{lb}|used"] = np.full(T, float(cfg["s"]))
            mean[f"{lb}|exhausted"] = np.ones(T) if cfg["s"] == 1 else np.zeros(T)
    return mean


def test_topk_verdicts_follow_the_numbers():
    params = dict(topk_zipf.PARAMS)
    rhos = dict.fromkeys((c["label"] for c in topk_zipf.curves(params)), 0.5)
    best, _ = topk_zipf.judge(params, _fake_topk_means(params, 5.0), 10, rhos)
    worst, _ = topk_zipf.judge(params, _fake_topk_means(params, 500.0), 10, rhos)
    v_best = {c.statement: c.verdict for c in best}
    v_worst = {c.statement: c.verdict for c in worst}
    meta_claim = next(s for s in v_best if "MetaAlgo outperforms" in s)
    assert (v_best[meta_claim], v_worst[meta_claim]) == ("HOLDS", "DIFFERS")
    linear = next(s for s in v_best if "runs out of switches before" in s)
    assert v_best[linear] == "HOLDS"  # s=1 curves grow by 0.2 per step and are exhausted
    rhos_off = dict(rhos, **{"KnownBase (Delta0=d)": 0.6})
    eq = topk_zipf.judge(params, _fake_topk_means(params, 5.0), 10, rhos_off)[0][0]
    assert eq.verdict == "DIFFERS"


def test_unknown_domain_verdict_follows_the_numbers():
    params = dict(unknown_domain.PARAMS, T=100)
    T = params["T"]

    def fake(unk: float, meta: float) -> dict[str, np.ndarray]:
        mean = {"lemma_clusters": np.zeros((0, 3))}
        for lb in unknown_domain.CURVES:
            level = meta if lb.startswith("Meta") else unk
            for k in ("err_top", "found", "err_found", "max_err_found"):
                mean[f"{lb}|{k}"] = np.full(T, level)
        return mean

    same = dict.fromkeys(unknown_domain.CURVES, "rho=1")
    assert unknown_domain.judge(params, fake(10.0, 10.0), same)[0][0].verdict == "HOLDS"
    assert unknown_domain.judge(params, fake(30.0, 10.0), same)[0][0].verdict == "DIFFERS"
    lemma = unknown_domain.judge(params, fake(10.0, 10.0), same)[0][2]
    assert lemma.verdict == "NOT TESTED"


def test_trials_are_deterministic_and_independent():
    params = dict(topk_zipf.PARAMS, d=10, T=40, switches=(1,), etas=(0.0,))
    a = topk_zipf.one_trial(0, 7, params)
    b = topk_zipf.one_trial(0, 7, params)
    c = topk_zipf.one_trial(1, 7, params)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a if k.endswith("|err"))
    assert trial_key(7, "x", "c", 0) != trial_key(7, "x", "c", 1)
    assert trial_key(7, "x", "c", 0) != trial_key(7, "x", "d", 0)
    assert data_rng(7, "x", 0).integers(1 << 30) == data_rng(7, "x", 0).integers(1 << 30)
