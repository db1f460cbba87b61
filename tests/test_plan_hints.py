"""``plan``'s --max-items hints for KnownBase and its top-k are worked out over the
domain's first k items (the noise of a count does not depend on the domain's size);
here they are held against the mechanisms built over the whole domain."""

from __future__ import annotations

import json

import pytest

from dpstream import planning
from dpstream.cli import main
from dpstream.mechanisms.histogram_topk import HistogramTopK
from dpstream.mechanisms.known import KnownDomainHistogram

from .conftest import fixed_key

DOMAIN = [f"item-{i}" for i in range(300)]  # the names plan gives --domain-size 300


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", "-T", "100", "--domain-size", "300", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("budget", [["--epsilon", "1", "--delta", "1e-6"], ["--rho", "0.1"]])
def test_known_hints_match_the_whole_domain(capsys, budget):
    info = _plan(capsys, "-m", "known", "--max-items", "2", *budget)
    kw = {"epsilon": 1.0, "delta": 1e-6} if budget[0] == "--epsilon" else {"rho": 0.1}
    for hint in info["max_items_hint"]:
        whole = KnownDomainHistogram(
            DOMAIN, 100, max_items=hint["max_items"], key=fixed_key("hint"), **kw
        )
        assert hint["noise_std_worst"] == planning.noise_std_worst(whole)


def test_top_k_hints_match_the_whole_domain(capsys):
    info = _plan(capsys, "-m", "top-k", "--k", "5", "--max-items", "2", "--rho", "0.1")
    assert len(info["max_items_hint"]) >= 5
    for hint in info["max_items_hint"]:
        whole = HistogramTopK(
            DOMAIN, 100, k=5, max_items=hint["max_items"], key=fixed_key("hint"), rho=0.1
        )
        assert hint["noise_std_worst"] == float(whole.noise_std_worst)


def test_hints_leave_out_what_the_settings_cannot_take(capsys):
    """Review 106: with --threshold-delta 5e-6 and --delta 1e-5, the hint's --max-items 2
    pays the threshold's delta twice, all of --delta: the plan of settings `run` takes
    (--max-items 1) ended in that error. The hint now leaves such values out; the value
    given is always there."""
    args = ["-m", "unknown", "--max-items", "1", "--epsilon", "1", "--delta", "1e-5"]
    info = _plan(capsys, *args, "--threshold-delta", "5e-6")
    assert [h["max_items"] for h in info["max_items_hint"]] == [1]
    info = _plan(capsys, *args, "--threshold-delta", "3e-6")  # up to 3 items fit
    assert [h["max_items"] for h in info["max_items_hint"]] == [1, 2]
    given = ["plan", "-T", "100", *args[:3], "5", *args[4:], "--threshold-delta", "3e-6"]
    assert main(given) in (1, 2)  # the value given: refused, as by run
    assert "delta" in capsys.readouterr().err


def test_coarser_steps_leave_out_a_horizon_the_base_cannot_take(capsys):
    """Review 113: `plan --counter tree --base 3 -T 20` ended in "base must be in [2, 2]"
    (the coarser-steps hint rebuilt the mechanism at T = 20 / 24), which `run` takes.
    The hint leaves that horizon out; the run's own horizon is always there, and a base
    the run's own horizon cannot take is refused as by run."""
    args = ["-m", "unknown", "-T", "20", "--max-items", "2", "--epsilon", "1"]
    args += ["--delta", "1e-6", "--counter", "tree"]
    assert main(["plan", *args, "--base", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["coarser_steps"]
    assert [r["horizon"] for r in rows] == [20, 10, 3]  # T/24 and T/30 (one step) left out
    assert {r["base"] for r in rows} == {3}
    assert main(["plan", *args, "--base", "21"]) != 0
    assert "base" in capsys.readouterr().err
