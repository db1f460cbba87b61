"""HistogramTopK and UnknownTopK (top-k of KnownBase and UnkBase, post-processing) and
choose_top_k."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtri

import dpstream as dps
from dpstream import tree
from dpstream.mechanisms.histogram_topk import HistogramTopK, UnknownTopK, choose_top_k
from dpstream.mechanisms.topk import ContinualTopK, default_switches, svt_noise_tail
from dpstream.words import plain_mechanism

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
    ref = dps.KnownDomainHistogram(
        range(d), horizon, max_items=2, key=key, tau=0.7, counter=counter
    )
    stds = _blt_stds(ref.strategy, 0.7) if counter == "blt" else None
    z = float(-ndtri(0.05 / (d * horizon)))
    counts = np.zeros(d, dtype=np.int64)
    started = waited = 0
    for t in range(1, horizon + 1):
        if t > 5:  # five empty steps first: the list waits (unless noise alone clears z sigma)
            counts = counts + rng.poisson(rates)
        rel, full = m.release(t, counts), ref.release(t, counts)
        order = np.argsort(-full.values, kind="stable")[:k]
        sigma = (
            stds[t - 1]
            if stds is not None
            else 0.7 * math.sqrt(sum(tree.digits(t, m.base)) * m.levels)
        )
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
        m = HistogramTopK(range(d), horizon, k=3, max_items=1, key=fixed_key(f"e{rep}"), rho=1.0)
        started += any(m.release(t, zeros).items for t in range(1, horizon + 1))
    assert started / n <= 0.05 + Z_TOL * math.sqrt(0.05 * 0.95 / n)
    m = HistogramTopK(range(d), horizon, k=3, max_items=1, key=fixed_key("e0"), rho=1.0)
    m.start_z = 1.0  # too low: noise alone clears it
    assert any(m.release(t, zeros).items for t in range(1, 4))


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_choose_top_k_reports_the_count_noise_of_the_candidates(counter):
    """The noise reported is the worst-step std of a count with the run's counter:
    tau_2 sqrt(max_t |I_t| L_r) (SparseGumb's counters) and KnownBase's tau sqrt(max_t
    |I_t| L_r) for the tree; for BLT, sigma max_t ||row_t(B)|| with sigma from tau_2 and
    tau (dense matrices). The candidate of smallest error is built."""
    domain = [f"i{j}" for j in range(50)]
    horizon = 500
    r = tree.optimal_base(horizon)
    factor = math.sqrt(tree.max_cells(horizon, r) * tree.num_levels(horizon, r))
    for max_items, want in ((2, "KnownBase top-k"), (400, "SparseGumb")):
        c = choose_top_k(
            domain,
            horizon,
            k=5,
            switches=3,
            max_items=max_items,
            key=fixed_key("c"),
            epsilon=1.0,
            delta=1e-6,
            counter=counter,
        )
        sparse = ContinualTopK(
            domain,
            horizon,
            k=5,
            switches=3,
            key=fixed_key("c"),
            epsilon=1.0,
            delta=1e-6,
            counter=counter,
        )
        known = dps.KnownDomainHistogram(
            domain,
            horizon,
            max_items=max_items,
            key=fixed_key("c"),
            epsilon=1.0,
            delta=1e-6,
            counter=counter,
        )
        if counter == "blt":
            worst_sparse = _blt_stds(sparse.strategy, sparse.tau_2).max()
            worst_known = _blt_stds(known.strategy, known.tau).max()
        else:
            worst_sparse, worst_known = sparse.tau_2 * factor, known.tau * factor
        assert c.noise_std["SparseGumb"] == pytest.approx(worst_sparse, rel=1e-9)
        assert c.noise_std["KnownBase top-k"] == pytest.approx(worst_known, rel=1e-9)
        assert c.mechanism.counter == counter
        assert c.name == want and c.reason.startswith(plain_mechanism(c.name) + ":")
        assert c.name == min(c.errors, key=c.errors.get)
        assert isinstance(
            c.mechanism, HistogramTopK if want == "KnownBase top-k" else ContinualTopK
        )
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

    assert (
        main(
            [
                "plan",
                "-m",
                "top-k",
                "-T",
                "400",
                "--domain-size",
                "30",
                "--k",
                "3",
                "--switches",
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
    n = json.loads(capsys.readouterr().out)["max_items_break_even"]
    domain = [f"item-{i}" for i in range(30)]
    kw = dict(k=3, switches=2, key=fixed_key("be"), epsilon=1.0, delta=1e-6)
    at = choose_top_k(domain, 400, max_items=n, **kw)
    above = choose_top_k(domain, 400, max_items=n + 1, **kw)
    assert n >= 2 and at.name == "KnownBase top-k" and above.name == "SparseGumb"


# --------------------------------------------------------------------------- the choice


def _hand_errors(
    d: int, horizon: int, *, k: int, s: int, max_items: int, rho: float, threshold_delta: float
) -> dict[str, float]:
    """The three errors from public parameters, by the formulas (tree counters, the
    optimal base): KnownBase top-k z sigma with z = Phi^-1(1 - 0.05/(d T)) and sigma =
    tau sqrt(max_t |I_t| L_r), tau = sqrt(Delta0 / (2 rho)); UnkBase's threshold at the
    worst step 1 + sigma Phi^-1(1 - threshold_delta/T), same sigma (rho alone sets its
    noise); SparseGumb's eta at the worst step: the x with P(D > x) = 0.05/T (checked
    through the closed-form tail, not computed here) with tau_1 = tau_2 = sqrt(s+1) tau,
    tau = sqrt((k + 1/2) / rho)."""
    r = tree.optimal_base(horizon)
    cells = tree.max_cells(horizon, r) * tree.num_levels(horizon, r)
    sigma = math.sqrt(max_items / (2 * rho)) * math.sqrt(cells)
    return {
        "KnownBase top-k": -ndtri(0.05 / (d * horizon)) * sigma,
        "UnkBase top-k": 1 + sigma * -ndtri(threshold_delta / horizon),
        "tau_sparse": math.sqrt(s + 1) * math.sqrt((k + 0.5) / rho),
        "cells": cells,
    }


@pytest.mark.parametrize(
    "max_items,threshold_delta,want",
    [
        (2, 1e-9, "KnownBase top-k"),  # a small domain: z of 0.05/(d T) is the lower bar
        (2, 1e-2, "UnkBase top-k"),  # a lax threshold: m_t is below z sigma
        (40, 1e-9, "SparseGumb"),  # large events: both histograms' noise grows as Delta0
    ],
)
def test_choose_top_k_picks_the_smallest_error_computed_by_hand(max_items, threshold_delta, want):
    """Each of the three candidates wins in one case, and the errors are those of the
    formulas (public parameters only: d, T, k, s, Delta0, rho, threshold_delta)."""
    d, horizon, k, s = 40, 100, 3, 2
    domain = [f"i{j}" for j in range(d)]
    c = choose_top_k(
        domain,
        horizon,
        k=k,
        switches=s,
        max_items=max_items,
        key=fixed_key("choice"),
        rho=1.0,
        counter="tree",
        threshold_delta=threshold_delta,
    )
    hand = _hand_errors(
        d, horizon, k=k, s=s, max_items=max_items, rho=1.0, threshold_delta=threshold_delta
    )
    assert set(c.errors) == {"KnownBase top-k", "UnkBase top-k", "SparseGumb"}
    for name in ("KnownBase top-k", "UnkBase top-k"):
        assert c.errors[name] == pytest.approx(hand[name], rel=1e-9), name
    # SparseGumb: eta at the worst step is the 1 - 0.05/T quantile of Lap(4 tau_1) -
    # Lap(2 tau_1) - N(0, tau_2^2 max_t |I_t| L_r)
    tau_1 = hand["tau_sparse"]
    eta = c.errors["SparseGumb"]
    assert svt_noise_tail(eta, tau_1=tau_1, variance=tau_1**2 * hand["cells"]) == pytest.approx(
        0.05 / horizon, rel=1e-6
    )
    assert c.name == want == min(c.errors, key=c.errors.get)
    kind = {
        "KnownBase top-k": HistogramTopK,
        "UnkBase top-k": UnknownTopK,
        "SparseGumb": ContinualTopK,
    }[want]
    assert isinstance(c.mechanism, kind) and c.switches == s and plain_mechanism(want) in c.reason


def test_choose_top_k_without_switches_uses_the_default():
    c = choose_top_k(
        [f"i{j}" for j in range(10)], 379, k=3, max_items=1000, key=fixed_key("dflt"), rho=1.0
    )
    assert c.name == "SparseGumb" and c.switches == 3 == c.mechanism.switches


def test_default_switches_is_the_smallest_s_with_8_to_the_s_at_least_the_horizon():
    got = {T: default_switches(T) for T in (1, 2, 8, 9, 64, 65, 379, 512, 513, 1000, 10**6)}
    assert got == {1: 0, 2: 1, 8: 1, 9: 2, 64: 2, 65: 3, 379: 3, 512: 3, 513: 4, 1000: 4, 10**6: 7}


def test_unknown_top_k_is_the_top_k_of_the_unkbase_release():
    """Brute force against UnknownDomainHistogram on the same key and stream: at every
    step the k largest of the items it shows, largest first (ties: release order);
    "not yet" while it shows none. Its guarantee is UnkBase's."""
    d, horizon, k = 40, 60, 5
    rng = np.random.default_rng(7)
    rates = 1.0 / (1.0 + np.arange(d)) ** 1.2  # a few items stand out, over time
    key = fixed_key("utopk")
    m = UnknownTopK(
        [f"i{j}" for j in range(d)], horizon, k=k, max_items=3, key=key, epsilon=1.0, delta=1e-6
    )
    ref = dps.UnknownDomainHistogram(horizon, max_items=3, key=key, epsilon=1.0, delta=1e-6)
    assert m.privacy == ref.privacy and m.mechanism_name == "UnkBase top-k"
    shown = 0
    for _ in range(horizon):
        events = []
        for _ in range(rng.poisson(6)):
            size = int(rng.integers(1, 4))
            events.append(sorted({f"i{j}" for j in rng.choice(d, size, p=rates / rates.sum())}))
        got, want = m.step_batch(events), ref.step_batch(events)
        top = want.top(k)
        assert list(got.items) == [i for i, _ in top]
        assert got.values.tolist() == [v for _, v in top]
        assert got.meta["status"] == ("selected" if top else "not yet")
        shown += bool(top)
    assert 0 < shown < horizon  # both "not yet" and lists were checked
    with pytest.raises(dps.InvalidEventError):
        m.step(["not-in-domain"])


def test_cli_top_k_with_max_items_needs_no_switches(tmp_path, capsys):
    """`-m top-k --k 10 --max-items 20` without --switches: plan names the chosen top-k,
    run releases every step with it (the run's sidecar says which one)."""
    import json

    from dpstream.cli import main
    from dpstream.run.meta import read_run_meta, sidecar_path

    domain = [f"w{j}" for j in range(200)]
    (tmp_path / "dom.txt").write_text("\n".join(domain) + "\n")
    rng = np.random.default_rng(3)
    with open(tmp_path / "ev.jsonl", "w") as fh:
        for t in range(1, 31):
            for _ in range(40):
                items = sorted({domain[int(i) % 200] for i in rng.zipf(1.5, size=30)})
                fh.write(json.dumps({"t": t, "items": items}) + "\n")
    key = tmp_path / "k.key"
    fixed_key("cli-topk").save(key)
    opts = [
        "-m",
        "top-k",
        "--k",
        "10",
        "--max-items",
        "20",
        "--domain",
        str(tmp_path / "dom.txt"),
        "-T",
        "30",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
    ]
    assert main(["plan", *opts, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["top_k"] == "KnownBase top-k" == plan["algorithm"]
    assert plan["top_k"] == min(plan["candidates"], key=plan["candidates"].get)
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "run",
                "-q",
                *opts,
                "--on-invalid",
                "truncate",
                "--key-file",
                str(key),
                "-i",
                str(tmp_path / "ev.jsonl"),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["t"] for r in lines] == list(range(1, 31))
    assert read_run_meta(sidecar_path(out))["algorithm"] == "KnownBase top-k"
    assert len(lines[-1]["released"]) == 10


# ------------------------------------------------------------------ no planned end


def _noend_stream(d: int, steps: int, seed: int) -> list[list[list[str]]]:
    """Simulated steps of events (<= 2 items each, skewed): test data, not a release."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, d + 1)
    weights /= weights.sum()
    return [
        [
            [f"i{j}" for j in rng.choice(d, size=int(rng.integers(1, 3)), replace=False, p=weights)]
            for _ in range(int(rng.integers(0, 12)))
        ]
        for _ in range(steps)
    ]


@pytest.mark.parametrize("which", ["known", "unknown"])
def test_no_horizon_top_k_is_the_top_k_of_the_no_horizon_histogram(which):
    """With no planned end, the histograms' top-k is post-processing of the no-horizon
    histogram: its guarantee is that histogram's (for all t), and its list at every
    step is the k largest values of the same keyed histogram run separately, largest
    first, with the same values bit for bit (KnownBase's list from its start test z_t
    sigma_t on, z_t = Phi^-1(1 - 0.05/(d t (t + 1))))."""
    d, k, steps = 25, 3, 60
    domain = [f"i{j}" for j in range(d)]
    key = fixed_key(f"noend-topk-{which}")
    budget = dict(rho=0.5) if which == "known" else dict(rho=0.5, threshold_delta=1e-3)
    if which == "known":
        top = HistogramTopK(domain, None, k=k, max_items=2, key=key, **budget)
        hist = dps.KnownDomainHistogram(domain, None, max_items=2, key=key, **budget)
    else:
        top = UnknownTopK(domain, None, k=k, max_items=2, key=key, **budget)
        hist = dps.UnknownDomainHistogram(None, max_items=2, key=key, **budget)
    assert top.unbounded and hist.unbounded and top.privacy == hist.privacy
    assert top.privacy.for_all_t
    listed = 0
    started = False
    for t, events in enumerate(_noend_stream(d, steps, seed=2), start=1):
        got, ref = top.step_batch(events), hist.step_batch(events)
        vals = np.asarray(ref.values, dtype=np.float64)
        order = np.lexsort((np.arange(vals.size), -vals))[:k]
        if which == "known":
            z = float(-ndtri(0.05 / (d * t * (t + 1))))
            started = started or vals.max() > z * hist.noise_std_at(t)
            assert top.start_threshold_at(t) == z * hist.noise_std_at(t)
        else:
            started = vals.size > 0
        if not started:
            assert got.items == [] and got.meta["status"] == "not yet", t
            continue
        assert got.items == [ref.items[i] for i in order], t
        assert np.array_equal(got.values, vals[order]), t
        listed += 1
    assert 10 < listed  # lists are released (and the comparison is not empty)


def test_no_horizon_top_k_choice_and_its_refusals():
    """choose_top_k with no horizon compares the histograms' top-k at step 10^6 and never
    SparseGumb (which needs T); --switches or --eta then are refused in plain words, and
    so is -m top-k without --max-items or -m meta with no --horizon."""
    from dpstream.registry import build_mechanism
    from dpstream.run.checks import settings_problems

    domain = [f"i{j}" for j in range(40)]
    key = fixed_key("noend-choice")
    choice = choose_top_k(domain, None, k=5, max_items=2, key=key, epsilon=1.0, delta=1e-6)
    assert set(choice.errors) == {"KnownBase top-k", "UnkBase top-k"}
    known = choice.errors["KnownBase top-k"]
    hist = dps.KnownDomainHistogram(domain, None, max_items=2, key=key, epsilon=1.0, delta=1e-6)
    z = float(-ndtri(0.05 / (40 * 10**6 * (10**6 + 1))))
    assert known == pytest.approx(z * hist.noise_std_at(10**6), rel=1e-12)
    unk = dps.UnknownDomainHistogram(None, max_items=2, key=key, epsilon=1.0, delta=1e-6)
    assert choice.errors["UnkBase top-k"] == unk.threshold_at(10**6)
    assert choice.name == min(choice.errors, key=choice.errors.__getitem__)
    assert choice.mechanism.unbounded and "no planned end" in choice.reason
    with pytest.raises(ValueError, match="--switches: a setting of top-k with switches"):
        choose_top_k(domain, None, k=5, max_items=2, key=key, switches=3, rho=1.0)
    opts = dict(mechanism="top-k", k=5, rho=1.0, horizon=None, domain_size=40)
    with pytest.raises(ValueError, match="without --horizon needs --max-items"):
        build_mechanism("top-k", opts, key, domain)
    assert "without --horizon needs --max-items" in settings_problems(opts)[0]
    assert settings_problems({**opts, "max_items": 2}) == []
    assert "--switches" in settings_problems({**opts, "max_items": 2, "switches": 3})[0]
    built = build_mechanism("top-k", {**opts, "max_items": 2}, key, domain)
    assert isinstance(built, HistogramTopK) and built.unbounded  # rho alone: no UnkBase
    meta = dict(mechanism="meta", oneshot="gaussian", rho=1.0, horizon=None)
    assert "meta needs --horizon" in settings_problems(meta)[0]
    with pytest.raises(ValueError, match="meta needs --horizon .* tree is sized for T"):
        build_mechanism("meta", meta, key, domain)


def test_choice_at_one_tau_is_refused(tmp_path, capsys):
    """At one tau the three candidates are at three privacy levels: KnownBase's top-k at
    rho = Delta0 / (2 tau^2) (T = 40, the BLT) and SparseGumb at its own, so comparing
    their errors compared guarantees of different strength. The library, ``run`` and
    ``plan`` refuse a fixed noise (--tau, or plan's --target-error) for the choice,
    before anything is written."""
    from dpstream.cli import main

    domain = [f"w{j}" for j in range(20)]
    key = fixed_key("tau-choice")
    at_tau = dict(k=3, max_items=2, key=key, tau=0.5)
    sparse = ContinualTopK(domain, 40, k=3, switches=default_switches(40), key=key, tau=0.5)
    known = HistogramTopK(domain, 40, k=3, max_items=2, key=key, tau=0.5)
    assert sparse.privacy.rho != pytest.approx(known.privacy.rho, rel=0.01)  # why
    for horizon in (40, None):
        with pytest.raises(ValueError, match="fixes the noise, not the privacy"):
            choose_top_k(domain, horizon, **at_tau)
    (tmp_path / "dom.txt").write_text("\n".join(domain) + "\n")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["w1"]}\n')
    fixed_key("tau-choice").save(tmp_path / "k.key")
    common = ["-m", "top-k", "--k", "3", "--max-items", "2", "-T", "40"]
    out = tmp_path / "r.jsonl"
    run = ["run", *common, "--domain", str(tmp_path / "dom.txt"), "--tau", "0.5"]
    run += ["--key-file", str(tmp_path / "k.key"), "-i", str(tmp_path / "ev.jsonl")]
    assert main([*run, "-o", str(out)]) == 2
    assert "fixes the noise, not the privacy" in capsys.readouterr().err
    assert not out.exists()
    assert main(["plan", *common, "--domain-size", "20", "--tau", "0.5"]) == 2
    assert "fixes the noise, not the privacy" in capsys.readouterr().err
    target = ["--target-error", "30", "--delta", "1e-6"]
    assert main(["plan", *common, "--domain-size", "20", *target]) == 2
    assert "one noise level is a different budget for each" in capsys.readouterr().err
    # without --max-items top-k with switches runs at --tau, as before
    assert main(["plan", *common[:4], "-T", "40", "--domain-size", "20", "--tau", "0.5"]) == 0


@pytest.mark.parametrize("users", [False, True])
def test_unknown_top_k_counts_events_given_as_generators(users):
    """Review 112: UnknownTopK checked each event's items against its domain by reading
    them, then handed the exhausted generators on: the events counted as empty."""
    key = dps.NoiseKey(bytes(range(22, 54)))
    bounds = {"max_items_per_user": 2, "max_count_per_item": 5} if users else {}
    m = UnknownTopK(["a", "b"], 10, k=1, max_items=2, key=key, tau=0.001,
                    threshold_delta=1e-6, counter="tree", **bounds)  # fmt: skip
    events = [iter(["a"]), (x for x in ["a", "b"])]
    m.step_batch([(f"u{j}", e) for j, e in enumerate(events)] if users else events)
    counts = dict(zip(m.histogram.items_seen, m.histogram.counts.tolist(), strict=True))
    assert counts == {"a": 2, "b": 1}  # as a list of lists gives


def test_unknown_top_k_checks_a_frame_s_items_not_its_column_names():
    """Review 112: a frame's column names ("item", "count") were checked against the
    domain, not its items: refused in misleading words, or, with a domain holding
    "item" and "count", items outside the domain were released."""
    pd = pytest.importorskip("pandas")
    key = dps.NoiseKey(bytes(range(31, 63)))
    m = UnknownTopK(["a", "b"], 10, k=1, max_items=2, key=key, tau=0.001, threshold_delta=1e-6)
    rel = m.release(1, pd.DataFrame({"item": ["a", "b"], "count": [3, 4]}))
    assert list(rel.items) == ["b"]
    m2 = UnknownTopK(["item", "count"], 10, k=1, max_items=2, key=key, tau=0.001,
                     threshold_delta=1e-6)  # fmt: skip
    with pytest.raises(dps.InvalidEventError, match="'x' is not in the domain"):
        m2.release(1, pd.DataFrame({"item": ["x", "y"], "count": [3, 4]}))
    assert m2.t == 0
    m3 = UnknownTopK(["a", "b"], 10, k=1, max_items=2, key=key, tau=0.001, threshold_delta=1e-6)
    assert list(m3.release(1, ["a", "b"], [3, 4]).items) == ["b"]  # items and counts
