"""on_invalid="truncate" in the Python API, the share of dropped occurrences, and the plan hint."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpstream as dps
from dpstream.cli import main
from dpstream.io import KeyedTruncator
from dpstream.mechanisms.base import keyed_subset
from dpstream.noise import NoiseSource

from .conftest import Z_TOL, fixed_key


def keep_by_hand(key, stream, items, k, ordinal):
    """The keyed choice, by hand: keyed uniforms at (0, ordinal), the k smallest, in order."""
    distinct = list(dict.fromkeys(items))
    if len(distinct) <= k:
        return distinct
    src = NoiseSource(key, f"{stream}/truncate")
    u = [float(NoiseSource.to_uniform(src.blocks(src.prepare([it]), 0, ordinal))[0])
         for it in distinct]
    smallest = sorted(range(len(distinct)), key=lambda i: (u[i], i))[:k]
    return [distinct[i] for i in sorted(smallest)]


def test_known_truncates_like_the_hand_computation_and_counts_the_drop():
    key = fixed_key("trunc")
    domain = [f"w{i}" for i in range(30)]
    rng = np.random.default_rng(1)  # simulated events
    steps = [[list(rng.choice(domain, size=int(rng.integers(0, 9)), replace=False))
              + (["outside"] if rng.random() < 0.2 else [])
              for _ in range(int(rng.integers(0, 4)))] for _ in range(40)]
    m = dps.KnownDomainHistogram(domain, 40, max_items=3, key=key, rho=1.0,
                                 on_invalid="truncate")
    ref = dps.KnownDomainHistogram(domain, 40, max_items=3, key=key, rho=1.0)
    ordinal = occurrences = dropped = cut = 0
    for events in steps:
        kept = []
        for ev in events:
            ordinal += 1
            inside = [i for i in ev if i in domain]
            k = keep_by_hand(key, "default", inside, 3, ordinal)
            occurrences += len(ev)
            dropped += len(ev) - len(k)
            cut += len(k) < len(ev)
            kept.append(k)
        a, b = m.step_batch(events), ref.step_batch(kept)
        assert np.array_equal(a.values, b.values)
    st = m.truncation
    assert (st.events, st.truncated_events, st.occurrences, st.dropped) == (
        ordinal, cut, occurrences, dropped)
    assert st.dropped_share == pytest.approx(dropped / occurrences) and dropped > 20


def test_unknown_and_meta_truncate_too_and_errors_change_nothing():
    key = fixed_key("trunc-u")
    u = dps.UnknownDomainHistogram(20, max_items=2, key=key, tau=1.0, threshold_delta=0.1,
                                   on_invalid="truncate")
    ref = dps.UnknownDomainHistogram(20, max_items=2, key=key, tau=1.0, threshold_delta=0.1)
    big = ["a", "b", "c", "d", "e"]
    a = u.step_batch([big, ["a"]])
    b = ref.step_batch([keep_by_hand(key, "default", big, 2, 1), ["a"]])
    assert u.items_seen == ref.items_seen and np.array_equal(a.values, b.values)
    assert (u.truncation.dropped, u.truncation.occurrences) == (3, 6)
    with pytest.raises(dps.InvalidItemError):
        u.step_batch([big, [2.5]])  # a bad item after a truncated event: nothing recorded
    assert u.t == 1 and (u.truncation.events, u.truncation.dropped) == (2, 3)
    m = dps.MetaHistogram(20, oneshot="gaussian", domain=big, max_items=2, key=key, rho=1.0,
                          on_invalid="truncate")
    m.step_batch([big + ["zz"]])
    assert (m.truncation.occurrences, m.truncation.dropped) == (6, 4)
    with pytest.raises(dps.InvalidEventError):
        dps.KnownDomainHistogram(big, 20, max_items=2, key=key, rho=1.0).step(big)
    with pytest.raises(ValueError, match="on_invalid"):
        dps.KnownDomainHistogram(big, 20, max_items=2, key=key, rho=1.0, on_invalid="skip")


def test_keyed_subset_is_a_uniform_choice_and_the_cli_truncator_agrees():
    """Each of 5 items is kept with probability 2/5: 20,000 events (ordinals), Z_TOL
    binomial SE per item; the command's KeyedTruncator makes the same choices."""
    key = fixed_key("uniform")
    src = NoiseSource(key, "default/truncate")
    items = ["a", "b", "c", "d", "e"]
    n = 20_000
    kept = {it: 0 for it in items}
    cli = KeyedTruncator(src, 2)
    for ordinal in range(1, n + 1):
        sub = keyed_subset(src, items, 2, ordinal)
        assert len(sub) == 2 and list(sub) == [i for i in items if i in sub]
        for it in sub:
            kept[it] += 1
        if ordinal <= 200:
            assert cli(items, ordinal) == sub
    se = math.sqrt(0.4 * 0.6 / n)
    for it, c in kept.items():
        assert abs(c / n - 0.4) <= Z_TOL * se, it


def test_run_summary_reports_the_dropped_share(tmp_path, capsys):
    key_path = tmp_path / "k.key"
    fixed_key("summary").save(key_path)
    (tmp_path / "ev.jsonl").write_text('["a","b","c","d"]\n["a"]\n["b","c","d","e","f"]\n')
    assert main(["run", "-m", "unknown", "-T", "5", "--max-items", "2", "--rho", "1",
                 "--threshold-delta", "1e-3", "--key-file", str(key_path), "-i",
                 str(tmp_path / "ev.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                 "--on-invalid", "truncate", "--implicit-time"]) == 0
    err = capsys.readouterr().err
    # 10 occurrences, 2 + 3 dropped
    assert "truncation dropped 5 of 10 item occurrences (50.0%" in err
    assert "2 truncated" in err


def test_plan_max_items_hint_against_the_gaussian_calibration(capsys):
    import json

    from dpstream.privacy import calibrate_tau
    from dpstream.tree import max_cells, num_levels, optimal_base

    assert main(["plan", "-m", "known", "-T", "300", "--domain-size", "10", "--max-items", "3",
                 "--epsilon", "1", "--delta", "1e-6", "--counter", "tree", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    r = optimal_base(300)
    factor = math.sqrt(max_cells(300, r) * num_levels(300, r))
    rows = info["max_items_hint"]
    assert [x["max_items"] for x in rows] == [1, 2, 3, 5, 10, 20, 50, 100]
    for x in rows:  # tau = sqrt(Delta0) / mu(epsilon, delta): exact Gaussian calibration
        tau = calibrate_tau(a=x["max_items"] / 2, epsilon=1.0, delta=1e-6, gaussian_exact=True)
        assert x["noise_std_worst"] == pytest.approx(tau * factor, rel=1e-12)
    assert rows[-1]["noise_std_worst"] == pytest.approx(10 * rows[0]["noise_std_worst"],
                                                        rel=1e-9)  # grows as sqrt(Delta0)
