"""The dpstream command: run (each mechanism, formats, config, bad input), plan, keygen, help."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtri

from dpstream import privacy
from dpstream.cli import build_parser, main
from dpstream.io import KeyedTruncator
from dpstream.mechanisms.known import KnownDomainHistogram
from dpstream.mechanisms.truncation import truncation_source
from dpstream.noise import NoiseKey
from dpstream.run.settings import scoped_stream
from dpstream.tree import max_cells, num_levels, optimal_base

from .conftest import fixed_key, own_ledger

#: The noise version `dpstream run` draws for a new stream (the library's default too).
CLI_NOISE = 2

SRC = str(Path(__file__).resolve().parents[1] / "src")
DOMAIN = [f"d{i}" for i in range(6)]


def _stream(seed: int = 1, steps: int = 30, max_items: int = 2) -> list[tuple[int, list[str]]]:
    """Simulated events (seeded NumPy generator: test data, not a release)."""
    rng = np.random.default_rng(seed)
    events = []
    for t in range(1, steps + 1):
        for _ in range(int(rng.integers(0, 4))):
            n = int(rng.integers(1, max_items + 1))
            events.append((t, [str(x) for x in rng.choice(DOMAIN, size=n, replace=False)]))
    return events


@pytest.fixture
def files(tmp_path):
    key = fixed_key("cli")
    key_path = tmp_path / "k.key"
    key.save(key_path)
    (tmp_path / "domain.txt").write_text("\n".join(DOMAIN) + "\n")
    events = _stream()
    with open(tmp_path / "ev.jsonl", "w") as fh:
        for t, items in events:
            fh.write(json.dumps({"t": t, "items": items}) + "\n")
    return argparse.Namespace(
        dir=tmp_path,
        key=key,
        key_path=str(key_path),
        events=events,
        domain=str(tmp_path / "domain.txt"),
        input=str(tmp_path / "ev.jsonl"),
    )


def _by_step(events, horizon):
    """The events of every step 1..horizon: a run releases them all (the public clock),
    the empty steps after the last event too."""
    steps = [[] for _ in range(horizon)]
    for t, items in events:
        steps[t - 1].append(items)
    return steps


def _run(*args: str) -> int:
    return main(["run", "--quiet", *args])


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _assert_same(lines, mech, steps, public_meta=(), rounded=True, clamp=True):
    """The command's output equals the library's releases: rounded to integers by
    default (the safe output), or exactly with --no-round; a count below 0 written
    as 0 (--clamp, the default)."""
    assert len(lines) == len(steps)
    for t, (obj, events) in enumerate(zip(lines, steps, strict=True), 1):
        rel = mech.step_batch(events)
        assert obj["t"] == t
        assert list(obj["released"]) == [str(i) for i in rel.items]
        values = list(obj["released"].values())
        if rounded:
            assert all(type(v) is int for v in values)
            want = rel.rounded().values.tolist()
            assert values == ([max(v, 0) for v in want] if clamp else want)
        else:
            # exact: JSON floats are written with the shortest round-tripping repr
            want = rel.values.tolist()
            assert values == ([max(v, 0.0) for v in want] if clamp else want)
        meta = dict(obj.get("meta", {}))
        assert meta.pop("noise_std") == pytest.approx(_noise_std(mech, t), rel=1e-12)
        assert meta == {k: v for k, v in rel.meta.items() if k in public_meta}


def _digit_sum(t: int, base: int) -> int:
    total = 0
    while t:
        t, s = divmod(t, base)
        total += s
    return total


def _blt_row_norms2(strategy) -> np.ndarray:
    """||row_t(B)||^2 for t = 1..T from the dense B = A C^-1 (C from its first column)."""
    from scipy.linalg import toeplitz

    T = strategy.horizon
    B = np.tril(np.ones((T, T))) @ np.linalg.inv(np.tril(toeplitz(strategy.strategy_column())))
    return np.sum(B * B, axis=1)


def _noise_std(mech, t: int) -> float:
    """The std of a count at t, by brute force: tau sqrt(|I_t| L_r) (thm:BinMechUtility); for
    mechanisms without a per-step value, the worst over all steps (tau_2 for top-k). With a
    BLT counter: sigma ||row_t(B)||, or its worst over the steps."""
    if getattr(mech, "strategy", None) is not None:
        rows = _blt_row_norms2(mech.strategy)
        if hasattr(mech, "noise_std_at"):
            return mech.sigma * math.sqrt(rows[t - 1])
        return mech.counter_std * math.sqrt(rows.max())
    levels = _digit_count(mech.horizon, mech.base)
    if hasattr(mech, "noise_std_at"):
        return mech.tau * math.sqrt(_digit_sum(t, mech.base) * levels)
    worst = max(_digit_sum(s, mech.base) for s in range(1, mech.horizon + 1))
    return getattr(mech, "tau_2", mech.tau) * math.sqrt(worst * levels)


def _digit_count(n: int, base: int) -> int:
    count = 0
    while n:
        n //= base
        count += 1
    return count


# --------------------------------------------------------------------------- end to end


def test_run_known_equals_library(files):
    out = files.dir / "out.jsonl"
    assert (
        _run(
            "--horizon",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--key-file",
            files.key_path,
            "--input",
            files.input,
            "--output",
            str(out),
        )
        == 0
    )
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, epsilon=1.0, delta=1e-6
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))


def test_no_round_writes_the_exact_floats(files):
    out = files.dir / "out.jsonl"
    assert (
        _run(
            "--horizon",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "--no-round",
            "--input",
            files.input,
            "--output",
            str(out),
        )
        == 0
    )
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40), rounded=False)


def test_run_unknown_equals_library(files):
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    out = files.dir / "out.jsonl"
    assert (
        _run(
            "-m",
            "unknown",
            "-T",
            "40",
            "--max-items",
            "2",
            "--rho",
            "2",
            "--threshold-delta",
            "1e-3",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(out),
        )
        == 0
    )
    mech = UnknownDomainHistogram(
        40,
        max_items=2,
        key=files.key,
        noise_version=CLI_NOISE,
        rho=2.0,
        threshold_delta=1e-3,
        remember=True,
    )  # on by default
    lines = _read_jsonl(out)
    _assert_same(lines, mech, _by_step(files.events, 40), public_meta=("threshold", "remember"))
    assert any(line["released"] for line in lines)  # the test does see released items
    assert all("items_seen" not in line.get("meta", {}) for line in lines)  # not private


def test_run_unknown_counters_and_blt_buffers_equal_library(files, capsys):
    """-m unknown takes --counter and --blt-buffers (BLT by default): each run releases
    what the library mechanism with that counter does, and a state refuses another."""
    from dpstream.factorization import blt_for_horizon
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    cmd = [
        "-m",
        "unknown",
        "-T",
        "40",
        "--max-items",
        "2",
        "--rho",
        "2",
        "--threshold-delta",
        "1e-2",
        "--key-file",
        files.key_path,
        "-i",
        files.input,
    ]
    outs = {}
    for name, extra, counter in (
        ("tree", ["--counter", "tree"], "tree"),
        ("blt2", ["--blt-buffers", "2"], blt_for_horizon(40, 2)),
    ):
        out, state = files.dir / f"{name}.jsonl", files.dir / f"{name}.sqlite"
        assert _run(*cmd, *extra, "-o", str(out), "--state", str(state)) == 0
        mech = UnknownDomainHistogram(
            40,
            max_items=2,
            key=files.key,
            noise_version=CLI_NOISE,
            rho=2.0,
            threshold_delta=1e-2,
            remember=True,
            counter=counter,
        )
        lines = _read_jsonl(out)
        _assert_same(lines, mech, _by_step(files.events, 40), public_meta=("threshold", "remember"))
        assert any(line["released"] for line in lines)
        outs[name] = out.read_bytes()
    assert outs["tree"] != outs["blt2"]
    capsys.readouterr()
    assert (
        _run(
            *cmd,
            "--blt-buffers",
            "3",
            "-o",
            str(files.dir / "blt2.jsonl"),
            "--state",
            str(files.dir / "blt2.sqlite"),
        )
        == 1
    )
    assert "other parameters" in capsys.readouterr().err


def test_run_topk_equals_library(files):
    from dpstream.mechanisms.topk import ContinualTopK

    out = files.dir / "out.jsonl"
    assert (
        _run(
            "-m",
            "top-k",
            "-T",
            "40",
            "--domain",
            files.domain,
            "--k",
            "2",
            "--switches",
            "3",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(out),
        )
        == 0
    )
    # --eta auto (the default) is the library's eta="auto", sized from the BLT counter's
    # noise (the default counter at T = 40; test_topk checks that quantile)
    mech = ContinualTopK(
        DOMAIN, 40, k=2, switches=3, eta="auto", key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    assert mech.counter == "blt"
    _assert_same(
        _read_jsonl(out),
        mech,
        _by_step(files.events, 40),
        public_meta=("status", "switches_left", "switched", "selection"),
    )


def test_run_topk_with_max_items_takes_the_more_accurate_candidate(files):
    from dpstream.mechanisms.histogram_topk import HistogramTopK, choose_top_k

    out = files.dir / "out.jsonl"
    assert (
        _run(
            "-m",
            "top-k",
            "-T",
            "40",
            "--domain",
            files.domain,
            "--k",
            "2",
            "--switches",
            "3",
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(out),
        )
        == 0
    )
    choice = choose_top_k(
        DOMAIN, 40, k=2, switches=3, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    # at max_items = 2 KnownBase's noise is far below SparseGumb's (a = 1 against k + 2)
    assert choice.name == "KnownBase top-k"
    mech = HistogramTopK(
        DOMAIN, 40, k=2, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40), public_meta=("status",))


def test_run_topk_with_fewer_blt_buffers_equals_library(files):
    """--blt-buffers reaches top-k's counters, SparseGumb's and KnownBase top-k's alike."""
    from dpstream.factorization import blt_for_horizon
    from dpstream.mechanisms.histogram_topk import HistogramTopK
    from dpstream.mechanisms.topk import ContinualTopK

    two = blt_for_horizon(40, 2)
    common = (
        "-m",
        "top-k",
        "-T",
        "40",
        "--domain",
        files.domain,
        "--k",
        "2",
        "--switches",
        "3",
        "--rho",
        "1",
        "--key-file",
        files.key_path,
        "-i",
        files.input,
        "--blt-buffers",
        "2",
    )
    out = files.dir / "sparse.jsonl"
    assert _run(*common, "-o", str(out)) == 0
    mech = ContinualTopK(
        DOMAIN,
        40,
        k=2,
        switches=3,
        eta="auto",
        key=files.key,
        noise_version=CLI_NOISE,
        rho=1.0,
        counter=two,
    )
    _assert_same(
        _read_jsonl(out),
        mech,
        _by_step(files.events, 40),
        public_meta=("status", "switches_left", "switched", "selection"),
    )
    out = files.dir / "hist.jsonl"
    assert _run(*common, "--max-items", "2", "-o", str(out)) == 0
    mech = HistogramTopK(
        DOMAIN, 40, k=2, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0, counter=two
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40), public_meta=("status",))


def test_run_topk_explicit_eta(files):
    from dpstream.mechanisms.topk import ContinualTopK

    out = files.dir / "out.jsonl"
    assert (
        _run(
            "-m",
            "top-k",
            "-T",
            "40",
            "--domain",
            files.domain,
            "--k",
            "1",
            "--switches",
            "4",
            "--eta",
            "0.5",
            "--tau",
            "0.3",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(out),
        )
        == 0
    )
    mech = ContinualTopK(
        DOMAIN, 40, k=1, switches=4, eta=0.5, key=files.key, noise_version=CLI_NOISE, tau=0.3
    )
    _assert_same(
        _read_jsonl(out),
        mech,
        _by_step(files.events, 40),
        public_meta=("status", "switches_left", "switched", "selection"),
    )


@pytest.mark.parametrize(
    "oneshot,extra",
    [
        ("gaussian", dict(domain=DOMAIN, max_items=2)),
        ("unknown-gumbel", dict(k=2, kbar=4)),
    ],
)
def test_run_meta_equals_library(files, oneshot, extra):
    from dpstream.mechanisms.meta import MetaHistogram

    out = files.dir / "out.jsonl"
    args = [
        "-m",
        "meta",
        "--oneshot",
        oneshot,
        "-T",
        "40",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--key-file",
        files.key_path,
        "-i",
        files.input,
        "-o",
        str(out),
    ]
    if "domain" in extra:
        args += ["--domain", files.domain, "--max-items", "2"]
    else:
        args += ["--k", "2", "--kbar", "4"]
    assert _run(*args) == 0
    mech = MetaHistogram(
        40,
        oneshot=oneshot,
        key=files.key,
        noise_version=CLI_NOISE,
        epsilon=2.0,
        delta=1e-5,
        **extra,
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))


def test_csv_in_csv_out_rounded(files):
    csv_in = files.dir / "ev.csv"
    with open(csv_in, "w") as fh:
        fh.write("id,product,step\n")
        for n, (t, items) in enumerate(files.events):
            for it in items:
                fh.write(f"e{n},{it},{t}\n")
    out = files.dir / "out.csv"
    assert (
        _run(
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            str(csv_in),
            "--item-column",
            "product",
            "--event-column",
            "id",
            "--time-column",
            "step",
            "-o",
            str(out),
            "--round",
        )
        == 0
    )
    stream = scoped_stream(
        {
            "stream": "default",
            "input": "x.csv",
            "item_column": "product",
            "event_column": "id",
            "time_column": "step",
        }
    )
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0, stream=stream
    )
    rows = Path(out).read_text().splitlines()
    assert rows[0] == "t,item,value,noise_std"
    expected, stds = [], []
    for t, events in enumerate(_by_step(files.events, 40), 1):
        rel = mech.step_batch(events)
        expected += [
            f"{t},{i},{max(int(np.rint(v)), 0)}"  # --clamp is on by default
            for i, v in zip(rel.items, rel.values, strict=True)
        ]
        stds += [_noise_std(mech, t)] * len(rel.items)
    assert [r.rsplit(",", 1)[0] for r in rows[1:]] == expected
    assert [float(r.rsplit(",", 1)[1]) for r in rows[1:]] == pytest.approx(stds, rel=1e-12)


def test_config_file_and_flag_override(files):
    cfg = files.dir / "run.toml"
    cfg.write_text(
        f'horizon = 40\ndomain = "{files.domain}"\nmax-items = 2\nrho = 5.0\n'
        f'key-file = "{files.key_path}"\n'
    )
    out = files.dir / "out.jsonl"
    assert _run("--config", str(cfg), "--rho", "1", "-i", files.input, "-o", str(out)) == 0
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))
    cfg.write_text("horizon = 40\nbogus = 1\n")
    assert _run("--config", str(cfg), "-i", files.input) == 1


def test_config_value_outside_integer_choices_is_named(files, capsys):
    # --noise-version's choices are integers: the error lists them (it was a TypeError
    # from joining them as text, shown as "sequence item 0: expected str instance")
    cfg = files.dir / "run.toml"
    cfg.write_text(
        f'horizon = 40\ndomain = "{files.domain}"\nkey-file = "{files.key_path}"\n'
        "noise-version = 3\n"
    )
    assert _run("--config", str(cfg), "-i", files.input) == 1
    err = capsys.readouterr().err
    assert "--noise-version must be one of 1, 2, got 3" in err


def test_stdin_to_stdout(files, monkeypatch, capsysbinary):
    monkeypatch.setattr(sys, "stdin", open(files.input))
    assert (
        _run(
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
        )
        == 0
    )
    lines = [json.loads(x) for x in capsysbinary.readouterr().out.decode().splitlines()]
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    _assert_same(lines, mech, _by_step(files.events, 40))


# --------------------------------------------------------------------------- bad input


def _bad_input(path):
    lines = [
        '{"t": 1, "items": ["d0", "d1"]}',
        '{"t": 2, "items": ["d0", "d1", "d2", "d3"]}',  # line 2: too many items
        '{"t": 2, "items": ["d4", "zzz"]}',  # line 3: outside the domain
        '{"t": 3, "items": [',  # line 4: malformed
        '{"t": 3, "items": ["d5"]}',
        '{"t": 9, "items": ["d5"]}',
    ]  # line 6: past the horizon T = 5
    path.write_text("\n".join(lines) + "\n")


def _policy_run(files, policy, capsys):
    bad = files.dir / "bad.jsonl"
    _bad_input(bad)
    out = files.dir / "out.jsonl"
    rc = main(
        [
            "run",
            "-T",
            "5",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            str(bad),
            "-o",
            str(out),
            "--on-invalid",
            policy,
            "--max-invalid",
            "1",
        ]
    )  # invalid on purpose
    return rc, _read_jsonl(out), capsys.readouterr().err


def test_on_invalid_error_names_the_line_and_writes_nothing(files, capsys):
    """A batch run reads its input before its first release, so --on-invalid error refuses
    the first invalid record before anything is written (review 109: the steps before
    its step were released, then the run stopped; the Spark engine wrote nothing)."""
    bad = files.dir / "bad.jsonl"
    _bad_input(bad)
    out = files.dir / "out.jsonl"
    argv = ["run", "-T", "5", "--domain", files.domain, "--max-items", "2", "--rho", "1"]
    argv += ["--key-file", files.key_path, "-i", str(bad), "-o", str(out)]
    assert main([*argv, "--on-invalid", "error"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "dpstream: error: input line 2: event has 4 distinct items, more than --max-items 2 "
        "(see --on-invalid)"
    ]
    assert not out.exists() and not Path(f"{out}.meta.json").exists()
    stream = scoped_stream({"stream": "default", "input": "x.jsonl", "on_invalid": "error"})
    assert stream.startswith("default~")  # another policy counts other events: other noise


@pytest.mark.parametrize(
    "line,message",
    [
        (3, "item 'zzz' is not in the domain"),
        (4, "not valid JSON"),
        (6, "past the horizon"),
    ],
)
def test_on_invalid_error_each_kind(files, capsys, line, message):
    bad = files.dir / "bad.jsonl"
    _bad_input(bad)
    text = bad.read_text().splitlines()
    keep = [text[0]] + [x for i, x in enumerate(text[1:], 2) if i >= line]
    if line == 6:
        keep = [text[0], text[4], text[5]]
        line = 3
    elif line == 4:
        line = 2
    elif line == 3:
        line = 2
    bad.write_text("\n".join(keep) + "\n")
    rc = main(
        [
            "run",
            "-T",
            "5",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            str(bad),
            "-o",
            str(files.dir / "o"),
            "--on-invalid",
            "error",
            "--verbose-errors",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and f"input line {line}: " in err and message in err
    assert len(err.strip().splitlines()) == 1


def test_error_messages_quote_no_item_without_verbose_errors(files, capsys):
    """Items are private: an error names the line and the reason, not the content."""
    bad = files.dir / "bad.jsonl"
    bad.write_text(
        '{"t": 1, "items": ["d0"]}\n{"t": 2, "items": ["secret-item"]}\n'
        '{"t": 3, "items": ["secret-json\n'
    )
    base = [
        "run",
        "-T",
        "5",
        "--domain",
        files.domain,
        "--max-items",
        "2",
        "--rho",
        "1",
        "--key-file",
        files.key_path,
        "--on-invalid",
        "error",
    ]
    assert (
        main([*base, "-i", str(bad), "-o", str(files.dir / "o1"), *own_ledger(files.dir / "o1")])
        == 1
    )
    err = capsys.readouterr().err
    assert "input line 2: an item is not in the --domain" in err and "secret" not in err
    bad.write_text('{"t": 1, "items": ["d0"]}\n{"t": 3, "items": ["secret-json\n')
    assert (
        main([*base, "-i", str(bad), "-o", str(files.dir / "o2"), *own_ledger(files.dir / "o2")])
        == 1
    )
    err = capsys.readouterr().err
    assert "input line 2: not valid JSON" in err and "secret" not in err
    # and the default policy (skip) reports only counts
    assert (
        main(
            [
                *base[:-2],
                "-i",
                str(bad),
                "-o",
                str(files.dir / "o3"),
                *own_ledger(files.dir / "o3"),
                "--max-invalid",
                "1",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "1 skipped" in err and "secret" not in err


def test_on_invalid_skip(files, capsys):
    rc, lines, err = _policy_run(files, "skip", capsys)
    assert rc == 0
    mech = KnownDomainHistogram(
        DOMAIN, 5, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    # steps 4 and 5 are released empty: the input jumps to t = 9, past T = 5
    _assert_same(lines, mech, [[["d0", "d1"]], [], [["d5"]], [], []])
    assert "0 truncated, 4 skipped" in err


def test_settings_that_count_other_events_draw_other_noise(files, capsys):
    """Review finding F: --on-invalid truncate against skip (or another clock) over the
    same input shared all noise: truncate minus skip was the exact count of truncated
    events. Now the two runs draw independent noise."""
    rc, skip, _ = _policy_run(files, "skip", capsys)
    (files.dir / "out.jsonl").unlink()
    rc2, cut, _ = _policy_run(files, "truncate", capsys)
    assert rc == rc2 == 0
    diff = {it: cut[1]["released"][it] - skip[1]["released"][it] for it in DOMAIN}
    # true counts at step 2 differ by at most 1 per item (one truncated event); with shared
    # noise every difference would be 0 or 1
    assert any(abs(d) > 1 for d in diff.values()), diff


def test_on_invalid_truncate_uses_keyed_prf(files, capsys):
    rc, lines, err = _policy_run(files, "truncate", capsys)
    assert rc == 0
    stream = scoped_stream({"stream": "default", "input": "x.jsonl", "on_invalid": "truncate"})
    cut = KeyedTruncator(truncation_source(files.key, stream), 2)(
        ("d0", "d1", "d2", "d3"), 2
    )  # the event of step 2
    assert len(cut) == 2
    mech = KnownDomainHistogram(
        DOMAIN, 5, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0, stream=stream
    )
    _assert_same(lines, mech, [[["d0", "d1"]], [list(cut), ["d4"]], [["d5"]], [], []])
    assert "2 truncated, 2 skipped" in err
    # the library's on_invalid="truncate" cuts the same events the same way
    lib = KnownDomainHistogram(
        DOMAIN,
        5,
        max_items=2,
        key=files.key,
        noise_version=CLI_NOISE,
        rho=1.0,
        stream=stream,
        on_invalid="truncate",
    )
    _assert_same(
        lines, lib, [[["d0", "d1"]], [["d0", "d1", "d2", "d3"], ["d4", "zzz"]], [["d5"]], [], []]
    )


# --------------------------------------------------------------------------- keys, errors


def test_keygen_mode_and_no_overwrite(tmp_path, capsys):
    path = tmp_path / "new.key"
    assert main(["keygen", str(path)]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    NoiseKey.load(path)
    assert str(path) in capsys.readouterr().err
    assert main(["keygen", str(path)]) == 1
    assert f"{path}: File exists" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.key"]  # no temporary left


def test_keygen_syncs_the_key_and_its_folder_and_writes_no_other_file(tmp_path, monkeypatch):
    """Review 107: the key file was not synced (the ledger beside it is): a power loss soon
    after a first run could keep the releases and lose the key. Review 108: a key written
    under a temporary name and linked in place left a second link of the secret when
    killed; it is written under its own name (never over a file, nor a link to nothing)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "new.key"
    NoiseKey.generate().save(path)
    assert synced == [str(path), str(tmp_path)]
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.key")
    with pytest.raises(FileExistsError):
        NoiseKey.generate().save(tmp_path / "dangling.key")
    assert not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.key", "new.key"]
    assert main(["keygen", str(tmp_path / "none" / "k.key")]) == 1  # names the key's path


def test_run_refuses_without_key(files, capsys):
    assert (
        _run(
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "-i",
            files.input,
        )
        == 2
    )  # a usage error
    assert "keygen" in capsys.readouterr().err


def test_missing_mechanism_option_is_one_line(files, capsys):
    assert (
        _run(
            "-m",
            "unknown",
            "-T",
            "40",
            "--rho",
            "1",
            "--threshold-delta",
            "1e-6",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
        )
        == 2
    )
    assert capsys.readouterr().err.count("\n") == 1


def test_error_is_one_line_without_traceback_in_a_subprocess(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpstream",
            "run",
            "-T",
            "5",
            "--rho",
            "1",
            "--key-file",
            str(tmp_path / "missing.key"),
            "--domain",
            "x",
            "--max-items",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "missing.key" in proc.stderr


def test_python_m_dpstream_help():
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-m", "dpstream", "--help"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0
    for cmd in ("run", "plan", "demo", "keygen"):
        assert cmd in proc.stdout


def test_every_option_help_states_its_default():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("dpstream", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.option_strings:  # positional
                assert "required" in action.help, (name, action.dest)
                continue
            assert "default" in action.help, (name, action.option_strings)
        sub.format_help()  # renders (no bad % in the help strings)


# --------------------------------------------------------------------------- plan


def _plan(capsys, *args) -> dict:
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_known_against_formulas(capsys):
    info = _plan(
        capsys,
        "-m",
        "known",
        "-T",
        "1000",
        "--max-items",
        "3",
        "--domain-size",
        "50",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--counter",
        "tree",
    )
    r = optimal_base(1000)
    tau = privacy.calibrate_tau(a=1.5, epsilon=1.0, delta=1e-6, gaussian_exact=True)
    std = tau * math.sqrt(max_cells(1000, r) * num_levels(1000, r))
    assert info["base"] == r == 4
    assert info["tau"] == pytest.approx(tau, rel=1e-12)
    assert info["noise_std_worst"] == pytest.approx(std, rel=1e-12)
    assert info["ci95_half_width"] == pytest.approx(1.959963984540054 * std, rel=1e-12)
    assert info["privacy"]["epsilon"] <= 1.0


def test_plan_unknown_threshold_against_eq_threshold(capsys):
    info = _plan(
        capsys,
        "-m",
        "unknown",
        "-T",
        "500",
        "--max-items",
        "2",
        "--rho",
        "0.5",
        "--threshold-delta",
        "1e-8",
        "--base",
        "3",
    )
    tau = math.sqrt(1.0 / 0.5)  # rho = (Delta0 / 2) / tau^2 with Delta0 = 2
    levels = num_levels(500, 3)
    m = tau * levels * math.sqrt(3 - 1) * float(-ndtri(1e-8 / 500)) + 1
    assert info["tau"] == pytest.approx(tau, rel=1e-12)
    assert info["threshold"] == pytest.approx(m, rel=1e-9)
    # per-step thresholds m_t = 1 + sqrt(|I_t| L) tau z: worst over t <= 500, and median
    z = float(-ndtri(1e-8 / 500))
    cells = sorted(sum(int(c) for c in np.base_repr(t, 3)) for t in range(1, 501))
    worst = 1 + math.sqrt(cells[-1] * levels) * tau * z
    typical = 1 + math.sqrt(cells[249] * levels) * tau * z
    assert info["threshold_worst"] == pytest.approx(worst, rel=1e-9) and worst < m
    assert info["threshold_typical"] == pytest.approx(typical, rel=1e-9)
    assert info["occurrences_to_show_half"] == math.ceil(worst)
    assert info["occurrences_to_show_half_typical"] == math.ceil(typical)
    assert "base 3, as given by --base" in info["base_reason"]
    # coarser steps: the same budget over ceil(T / c) steps, m_t from the closed form
    rows = info["coarser_steps"]
    assert [r["horizon"] for r in rows] == [500, 250, 72, 21, 17]
    for row in rows:
        h, lv = row["horizon"], num_levels(row["horizon"], 3)
        cs = sorted(sum(int(c) for c in np.base_repr(t, 3)) for t in range(1, h + 1))
        zc = float(-ndtri(1e-8 / h))
        assert row["threshold_worst"] == pytest.approx(
            1 + math.sqrt(cs[-1] * lv) * tau * zc, rel=1e-9
        )
    assert rows[-1]["threshold_worst"] < rows[0]["threshold_worst"]


def test_plan_topk_against_formulas(capsys):
    from dpstream.mechanisms.topk import svt_noise_tail

    info = _plan(
        capsys,
        "-m",
        "top-k",
        "-T",
        "200",
        "--domain-size",
        "30",
        "--k",
        "3",
        "--switches",
        "4",
        "--rho",
        "1",
        "--counter",
        "tree",
    )
    tau = math.sqrt((3 + 0.5) / 1.0)  # rho = (2k + 1) / (2 tau^2)
    r = optimal_base(200)
    levels = num_levels(200, r)
    s = 4
    tau_1, tau_2 = math.sqrt(s + 1) * tau, math.sqrt(s + 1) * tau  # s switches + the wait
    assert info["tau"] == pytest.approx(tau, rel=1e-12)
    assert (info["k"], info["switches"]) == (3, 4)
    # eta at t = 1 (one tree cell): the 1 - 0.05/T quantile of the comparison noise
    # (svt_noise_tail is checked against simulation in test_topk)
    assert svt_noise_tail(info["eta"], tau_1=tau_1, variance=levels * tau_2**2) == pytest.approx(
        0.05 / 200, rel=1e-6
    )
    assert svt_noise_tail(info["start_eta"], tau_1=tau_1) == pytest.approx(0.05 / 200, rel=1e-6)
    assert info["noise_std_worst"] == pytest.approx(
        math.sqrt(s + 1) * tau * math.sqrt(max_cells(200, r) * levels), rel=1e-12
    )


def test_plan_target_error_inverse(capsys):
    info = _plan(
        capsys,
        "-m",
        "known",
        "-T",
        "1000",
        "--max-items",
        "2",
        "--domain-size",
        "5",
        "--target-error",
        "25",
        "--delta",
        "1e-6",
        "--counter",
        "tree",
    )
    tau = 25 / (1.959963984540054 * math.sqrt(max_cells(1000, 4) * num_levels(1000, 4)))
    assert info["tau"] == pytest.approx(tau, rel=1e-12)
    assert info["ci95_half_width"] == pytest.approx(25, rel=1e-12)
    assert info["privacy"]["rho"] == pytest.approx(1.0 / tau**2, rel=1e-12)  # a = 1


def dense_blt_worst_variance(T: int) -> float:
    """V = max_t ||row_t(B)||^2 max_j ||C e_j||^2 from dense matrices (the BLT dpstream uses)."""
    from scipy.linalg import toeplitz

    from dpstream.factorization import blt_for_horizon

    C = np.tril(toeplitz(blt_for_horizon(T).strategy_column()))
    B = np.tril(np.ones((T, T))) @ np.linalg.inv(C)
    return float(np.sum(B * B, axis=1).max() * np.sum(C * C, axis=0).max())


def test_plan_blt_prints_both_counters(capsys):
    """Default counter for T = 1000 is BLT; the plan shows both counters at the budget."""
    info = _plan(
        capsys,
        "-m",
        "known",
        "-T",
        "1000",
        "--max-items",
        "3",
        "--domain-size",
        "50",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
    )
    tau = privacy.calibrate_tau(a=1.5, epsilon=1.0, delta=1e-6, gaussian_exact=True)
    assert info["counter"] == "blt" and info["base"] is None and info["buffers"] == 4
    assert info["tau"] == pytest.approx(tau, rel=1e-12)  # same budget, same tau
    std_blt = tau * math.sqrt(dense_blt_worst_variance(1000))
    std_tree = tau * math.sqrt(max_cells(1000, 4) * num_levels(1000, 4))
    assert info["noise_std_worst"] == pytest.approx(std_blt, rel=1e-9)
    assert info["counters_noise_std_worst"]["blt"] == pytest.approx(std_blt, rel=1e-9)
    assert info["counters_noise_std_worst"]["tree"] == pytest.approx(std_tree, rel=1e-12)
    assert (
        main(
            [
                "plan",
                "-m",
                "top-k",
                "-T",
                "200",
                "--domain-size",
                "30",
                "--k",
                "3",
                "--switches",
                "4",
                "--rho",
                "1",
                "--counter",
                "blt",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    tau2 = math.sqrt(5) * math.sqrt(3.5)  # tau_2 = sqrt(s + 1) tau, tau = sqrt(k + 1/2)
    assert "BLT matrix factorization, 4 buffers" in out
    assert f"blt {tau2 * math.sqrt(dense_blt_worst_variance(200)):.4g}" in out
    assert (
        main(
            [
                "plan",
                "-m",
                "unknown",
                "-T",
                "100",
                "--max-items",
                "1",
                "--rho",
                "1",
                "--threshold-delta",
                "1e-6",
                "--counter",
                "blt",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out  # unknown domains take the counter too
    assert "BLT matrix factorization, 4 buffers" in out and "at the median step" in out
    assert (
        main(
            [
                "plan",
                "-m",
                "known",
                "-T",
                "100",
                "--max-items",
                "1",
                "--rho",
                "1",
                "--domain-size",
                "3",
                "--counter",
                "blt",
                "--base",
                "3",
            ]
        )
        == 2
    )
    assert "applies to --counter tree only, got --base 3" in capsys.readouterr().err


def test_run_known_blt_equals_library(files):
    out = files.dir / "out.jsonl"
    assert (
        _run(
            "-m",
            "known",
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "3",
            "--counter",
            "blt",
            "--rho",
            "0.5",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(out),
        )
        == 0
    )
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=3, key=files.key, noise_version=CLI_NOISE, rho=0.5, counter="blt"
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))


def test_run_known_with_fewer_blt_buffers_equals_library_and_resumes_only_as_itself(files, capsys):
    """--blt-buffers K runs the K-buffer BLT of the shipped table: the releases of the
    library mechanism given that strategy, a plan that says so, a state file that
    refuses another K, and errors where a buffer count means nothing."""
    from dpstream.factorization import blt_for_horizon

    out, state = files.dir / "out.jsonl", files.dir / "s.sqlite"
    cmd = [
        "-m",
        "known",
        "-T",
        "40",
        "--domain",
        files.domain,
        "--max-items",
        "3",
        "--rho",
        "0.5",
        "--key-file",
        files.key_path,
        "-i",
        files.input,
    ]
    assert _run(*cmd, "--blt-buffers", "1", "-o", str(out), "--state", str(state)) == 0
    strategy = blt_for_horizon(40, 1)
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=3, key=files.key, noise_version=CLI_NOISE, rho=0.5, counter=strategy
    )
    assert mech.strategy.buffers == 1 and mech._noise._buffers.shape[0] == 1
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))
    default = KnownDomainHistogram(
        DOMAIN, 40, max_items=3, key=files.key, noise_version=CLI_NOISE, rho=0.5, counter="blt"
    )
    assert mech.tau == default.tau  # the same budget, the same tau; sigma is the strategy's
    assert mech.sigma != default.sigma
    capsys.readouterr()
    assert _run(*cmd, "--blt-buffers", "2", "-o", str(out), "--state", str(state)) == 1
    assert "other parameters" in capsys.readouterr().err
    info = _plan(
        capsys,
        "-m",
        "known",
        "-T",
        "1000",
        "--max-items",
        "3",
        "--domain-size",
        "50",
        "--rho",
        "1",
        "--blt-buffers",
        "2",
    )
    assert info["buffers"] == 2
    assert info["worst_case_variance"] == blt_for_horizon(1000, 2).worst_case_variance
    for extra, message in (
        (["--counter", "tree"], "--blt-buffers applies to the BLT counter only"),
        (["--base", "3"], "--blt-buffers applies to the BLT counter only"),
        (["--blt-buffers", "11"], "--blt-buffers must be 1 to 10, got 11"),
    ):
        args = [
            "plan",
            "-m",
            "known",
            "-T",
            "100",
            "--max-items",
            "1",
            "--rho",
            "1",
            "--domain-size",
            "3",
            *extra,
        ]
        if "--blt-buffers" not in extra:
            args += ["--blt-buffers", "2"]
        assert main(args) == 2
        assert message in capsys.readouterr().err
    info = _plan(
        capsys,
        "-m",
        "unknown",
        "-T",
        "100",
        "--max-items",
        "1",
        "--rho",
        "1",
        "--threshold-delta",
        "1e-6",
        "--blt-buffers",
        "2",
    )
    assert info["counter"] == "blt" and info["buffers"] == 2
    assert (
        main(
            [
                "plan",
                "-m",
                "meta",
                "-T",
                "100",
                "--max-items",
                "1",
                "--rho",
                "1",
                "--oneshot",
                "unknown-gaussian",
                "--k",
                "2",
                "--blt-buffers",
                "2",
            ]
        )
        == 2
    )
    assert "--blt-buffers does not apply to --mechanism meta" in capsys.readouterr().err


def test_plan_text(capsys):
    assert (
        main(
            [
                "plan",
                "-m",
                "unknown",
                "-T",
                "100",
                "--max-items",
                "1",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--counter",
                "tree",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "items need about" in out and "95% interval" in out and "the least noise" in out
    assert (
        main(
            [
                "plan",
                "-m",
                "unknown",
                "-T",
                "100",
                "--max-items",
                "1",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "items need about" in out and "BLT matrix factorization" in out


# --------------------------------------------------------------------------- hostile input


UNK = [
    "-m",
    "unknown",
    "-T",
    "50",
    "--max-items",
    "1",
    "--rho",
    "1",
    "--threshold-delta",
    "1e-3",
    "--no-round",
    "--implicit-time",
]
UNK_CSV = UNK[:-1]  # CSV gives each event's step in a column


def test_csv_event_rows_apart_are_one_event_in_their_step(files, capsys):
    """An event is every row of its id in its step, wherever they stand: e1's two rows
    of step 2 are one event of two items, refused under --max-items 1 (read as two
    events, they would get around the bound); e1 of step 1 is another event."""
    from dpstream.mechanisms.unknown import UnknownDomainHistogram

    src = files.dir / "ev.csv"
    src.write_text("event,item,t\ne1,a,1\ne1,b,2\ne2,b,2\ne1,c,2\n")
    out = files.dir / "out.jsonl"
    cmd = [*UNK_CSV, "--time-column", "t", "--key-file", files.key_path, "-i", str(src)]
    assert main(["run", *cmd, "-o", str(out), "--on-invalid", "error", "--verbose-errors"]) == 1
    err = capsys.readouterr().err
    assert "input line 3: event has 2 distinct items, more than --max-items 1" in err
    assert _run(*cmd, "-o", str(out), "--on-invalid", "skip", "--force", "--max-invalid", "1") == 0
    mech = UnknownDomainHistogram(
        50,
        max_items=1,
        key=files.key,
        noise_version=CLI_NOISE,
        rho=1.0,
        threshold_delta=1e-3,
        remember=True,
    )  # on by default
    _assert_same(
        _read_jsonl(out),
        mech,
        [[["a"]], [["b"]]] + [[]] * 48,
        ("threshold", "remember"),
        rounded=False,
    )


def test_csv_unclosed_quote_is_an_error_naming_its_first_line(files, capsys):
    src = files.dir / "ev.csv"
    src.write_text('event,item,t\n0,"oops,1\n1,a,1\n2,a,1\n3,a,1\n')
    assert (
        main(
            [
                "run",
                *UNK_CSV,
                "--time-column",
                "t",
                "--key-file",
                files.key_path,
                "-i",
                str(src),
                "-o",
                str(files.dir / "out.jsonl"),
                "--on-invalid",
                "error",
                "--verbose-errors",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "input line 2: " in err and "unclosed quote" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "role", ["input", "key", "state", "domain", "config", "symlink", "hardlink"]
)
def test_output_that_is_another_file_is_refused_before_anything_is_opened(files, role, capsys):
    cfg = files.dir / "run.toml"
    cfg.write_text("horizon = 40\n")
    state = files.dir / "s.sqlite"
    state.write_bytes(b"")
    link = files.dir / "link.jsonl"
    if role == "symlink":
        link.symlink_to(files.input)
    if role == "hardlink":
        os.link(files.input, link)
    target = {
        "input": files.input,
        "key": files.key_path,
        "state": str(state),
        "domain": files.domain,
        "config": str(cfg),
        "symlink": str(link),
        "hardlink": str(link),
    }[role]
    before = {p: Path(p).read_bytes() for p in (files.input, files.key_path, files.domain, cfg)}
    rc = main(
        [
            "run",
            "--config",
            str(cfg),
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "--state",
            str(state),
            "-o",
            target,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "is the same file as" in err and err.count("\n") == 1
    assert {p: Path(p).read_bytes() for p in before} == before
    assert state.read_bytes() == b""  # not even opened as a database


def test_state_that_is_another_file_is_refused(files, capsys):
    assert (
        _run(
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "--state",
            files.key_path,
            "-o",
            str(files.dir / "out.jsonl"),
        )
        == 1
    )
    assert "--state" in capsys.readouterr().err
    files.key.__class__.load(files.key_path)  # the key is intact


def test_gz_output_is_refused(files, capsys):
    assert (
        _run(
            "-T",
            "40",
            "--domain",
            files.domain,
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            files.input,
            "-o",
            str(files.dir / "out.csv.gz"),
        )
        == 1
    )
    assert "compressed output" in capsys.readouterr().err
    assert not (files.dir / "out.csv.gz").exists()


@contextlib.contextmanager
def _interrupted_at(t):
    """Ctrl-C as step ``t`` is about to be released: the run stops with steps 1..t-1 on
    record (and published), not finished."""
    from dpstream.run.pipeline import Stages

    release = Stages.release

    def stop(self, step, *args, **kwargs):
        if step == t:
            raise KeyboardInterrupt
        return release(self, step, *args, **kwargs)

    Stages.release = stop
    try:
        yield
    finally:
        Stages.release = release


def _stopped_run(files, lines, *extra):
    """A --state run to stop (:func:`_interrupted_at`): steps on record, not finished."""
    src = files.dir / "ev.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out, state = files.dir / "out.jsonl", files.dir / "s.sqlite"
    cmd = [
        *UNK,
        "--key-file",
        files.key_path,
        "-i",
        str(src),
        "-o",
        str(out),
        "--state",
        str(state),
        *extra,
    ]
    return src, out, state, cmd


def test_resume_checks_the_output_holds_the_releases_on_record(files, capsys):
    src, out, state, cmd = _stopped_run(files, ['["a"]', '["b"]', '["c"]'])
    with _interrupted_at(3):
        assert _run(*cmd) == 130
    capsys.readouterr()
    written = out.read_bytes()
    step1 = written[: written.index(b"\n") + 1]
    # the same length, other bytes in step 1: another file
    out.write_bytes(step1[:-5] + bytes([step1[-5] ^ 1]) + step1[-4:] + written[len(step1) :])
    changed = out.read_bytes()
    assert _run(*cmd) == 1
    err = capsys.readouterr().err
    assert "does not hold the release of step 1" in err and err.count("\n") == 1
    assert out.read_bytes() == changed  # refused before truncating
    out.write_bytes(written + b"more")  # bytes past the last step on record: not ours
    assert _run(*cmd) == 1
    assert "does not hold the release of step 2" in capsys.readouterr().err
    out.write_bytes(written[:-7])  # a crash while writing step 2 (on record before it)
    assert _run(*cmd) == 0
    ref = files.dir / "ref.jsonl"
    argv = [*UNK, "--key-file", files.key_path, "-i", str(src), "-o", str(ref)]
    assert _run(*argv, *own_ledger(ref)) == 0
    assert out.read_bytes() == ref.read_bytes()


def test_output_that_cannot_be_opened_leaves_the_state_usable(files, capsys):
    src, out, state, cmd = _stopped_run(files, ['["a"]'])
    missing_dir = files.dir / "nodir" / "out.jsonl"
    bad = [a if a != str(out) else str(missing_dir) for a in cmd]
    assert _run(*bad) == 1
    capsys.readouterr()
    assert _run(*cmd) == 0  # another output: accepted, nothing was released
    assert len(_read_jsonl(out)) == 50  # every step of the horizon


def test_a_state_with_no_committed_step_accepts_new_parameters(files, capsys):
    src, out, state, cmd = _stopped_run(files, ['["a"]', '["b"]'])
    with _interrupted_at(1):
        assert _run(*cmd) == 130
    assert state.exists()
    assert _run(*cmd, "--on-invalid", "truncate") == 0  # another policy: other noise
    assert [line["t"] for line in _read_jsonl(out)] == list(range(1, 51))


def test_a_new_run_refuses_an_output_that_holds_releases(files, capsys):
    """Review finding 6: after a crash before any step was on record, moving the state
    away and re-running (say with --stream other) would publish step 1 again with fresh
    noise. A step is on record before it is written, so an output holding releases that
    no state accounts for is refused unless --force."""
    src, out, state, cmd = _stopped_run(files, ['["a"]', '["b"]'])
    with _interrupted_at(1):
        assert _run(*cmd) == 130
    capsys.readouterr()
    out.write_bytes(b'{"t": 1, "released": {}}\n')  # releases the state does not know
    for extra in ([], ["--stream", "other"], ["--on-invalid", "skip"]):
        assert _run(*cmd, *extra) == 1
        err = capsys.readouterr().err
        assert "already holds releases" in err and "--overwrite" in err and err.count("\n") == 1
    state.unlink()
    assert _run(*cmd, "--stream", "other") == 1  # no state at all: the output still says
    assert "already holds releases" in capsys.readouterr().err
    assert _run(*cmd, "--on-invalid", "skip", "--force", "--max-invalid", "1") == 0
    assert [line["t"] for line in _read_jsonl(out)] == list(range(1, 51))


def test_force_never_overwrites_a_state_or_a_key_given_as_the_output(files, capsys):
    """Review 90: -o naming another stream's state (a typo) was "an output that already
    holds releases", and the --force that message suggests overwrote the database with
    releases, so that stream could never go on. A SQLite database or a key file is
    refused as what it is, with or without --force, in every output format."""
    src = files.dir / "ev2.jsonl"
    src.write_text('["a"]\n')  # (--implicit-time: a line is a step)
    other_state = files.dir / "a.sqlite"
    first = [*UNK, "--key-file", files.key_path, "-i", str(src), "--stream", "a"]
    assert _run(*first, "-o", str(files.dir / "a.jsonl"), "--state", str(other_state)) == 0
    other_key = files.dir / "other.key"  # another stream's key (this run's is refused)
    fixed_key("another").save(other_key)
    upper_key = files.dir / "upper.key"  # a key file NoiseKey.load reads, written by hand
    upper_key.write_text("  " + fixed_key("upper")._secret.hex().upper() + "\r\n")
    ledger = files.dir / "a.jsonl.ledger"  # (review 91) another key's release ledger
    ledger.write_text((files.dir / "k.key.ledger").read_text())
    targets = {
        other_state: "a SQLite database",
        other_key: "key file",
        upper_key: "key file",
        ledger: "a release ledger",
    }
    kept = {p: p.read_bytes() for p in targets}
    for target, what in targets.items():
        for fmt in ("jsonl", "csv", "parquet"):
            cmd = [*UNK, "--key-file", files.key_path, "-i", str(src), "--stream", "b"]
            cmd += ["-o", str(target), "--output-format", fmt]
            for extra in ([], ["--force"], ["--force", "--noise-version", "2"]):
                assert _run(*cmd, *extra) == 1, (target, fmt, extra)
                err = capsys.readouterr().err
                assert what in err and "not releases" in err, err
    assert {p: p.read_bytes() for p in kept} == kept


def test_an_output_that_is_a_directory_is_refused_before_anything_is_written(files, capsys):
    """Review 90: -o out.jsonl/ (a new name with a slash) wrote out.jsonl.meta.json, then
    failed with "Is a directory"; a directory output is refused before any file."""
    src = files.dir / "ev3.jsonl"
    src.write_text('["a"]\n')
    (files.dir / "folder").mkdir()
    for out in (f"{files.dir}/new.jsonl/", str(files.dir / "folder")):
        assert _run(*UNK, "--key-file", files.key_path, "-i", str(src), "-o", out) == 1
        assert "is a directory: give the path of a file" in capsys.readouterr().err
    assert sorted(p.name for p in files.dir.iterdir() if "new" in p.name or "folder" in p.name) == [
        "folder"
    ]
    assert list((files.dir / "folder").iterdir()) == []


def test_a_refused_output_leaves_no_new_state_behind(files, capsys):
    """Review 90: a new run refused for an output that holds releases left the empty
    state file it had made (operations.md: a refused run creates no state)."""
    src = files.dir / "ev4.jsonl"
    src.write_text('["a"]\n')
    out, state = files.dir / "held.jsonl", files.dir / "new.sqlite"
    out.write_bytes(b'{"t": 1, "released": {}}\n')
    cmd = [*UNK, "--key-file", files.key_path, "-i", str(src), "-o", str(out)]
    assert _run(*cmd, "--state", str(state)) == 1
    assert "already holds releases" in capsys.readouterr().err
    assert not state.exists() and not list(files.dir.glob("new.sqlite*"))


def test_a_finished_run_refuses_an_input_that_grew(files, capsys):
    src, out, state, cmd = _stopped_run(files, ['["a"]', '["b"]'])
    assert _run(*cmd) == 0
    finished = out.read_bytes()
    assert _run(*cmd) == 0  # unchanged input: nothing to do
    with open(src, "a") as fh:
        fh.write('["c"]\n')
    assert _run(*cmd) == 1
    err = capsys.readouterr().err
    assert "input line 3" in err and "never releases again" in err
    assert out.read_bytes() == finished


def test_readme_commands_run(tmp_path, monkeypatch):
    import shlex

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("## On the command line", 1)[1].split("```bash", 1)[1].split("```")[0]
    commands = [
        shlex.split(c.split("#")[0]) for c in block.replace("\\\n", " ").splitlines() if c.strip()
    ]
    assert [c[:2] for c in commands] == [
        ["dpstream", "demo"],
        ["dpstream", "keygen"],
        ["dpstream", "plan"],
        ["dpstream", "run"],
    ]
    monkeypatch.chdir(tmp_path)
    for argv in commands:  # as written: the demo writes the sample events.jsonl
        assert main(argv[1:]) == 0, argv
    # every step of the public clock, 1..--horizon, whatever the input holds
    lines = _read_jsonl(tmp_path / "releases.jsonl")
    assert [line["t"] for line in lines] == list(range(1, 657))
    assert any(line["released"] for line in lines)  # the FAA stream's items do show


def test_byte_order_marks_in_config_domain_and_input(files):
    cfg = files.dir / "run.toml"
    cfg.write_bytes(b"\xef\xbb\xbfhorizon = 40\n")
    dom = files.dir / "dom.txt"
    dom.write_bytes(b"\xef\xbb\xbf" + "\n".join(DOMAIN).encode() + b"\n")
    src = files.dir / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + Path(files.input).read_bytes())
    out = files.dir / "out.jsonl"
    assert (
        _run(
            "--config",
            str(cfg),
            "--domain",
            str(dom),
            "--max-items",
            "2",
            "--rho",
            "1",
            "--key-file",
            files.key_path,
            "-i",
            str(src),
            "-o",
            str(out),
        )
        == 0
    )
    mech = KnownDomainHistogram(
        DOMAIN, 40, max_items=2, key=files.key, noise_version=CLI_NOISE, rho=1.0
    )
    _assert_same(_read_jsonl(out), mech, _by_step(files.events, 40))


def _gz(tmp_path, kind):
    import gzip

    data = gzip.compress(b"".join(b'["a%d"]\n' % i for i in range(3000)))
    if kind == "truncated":
        data = data[: len(data) // 2]
    elif kind == "corrupt":
        data = data[:40] + bytes(160) + data[200:]
    else:
        data = b"not gzip at all\n"
    path = tmp_path / f"{kind}.jsonl.gz"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", ["truncated", "corrupt", "not-gzip"])
def test_a_bad_gz_input_is_a_one_line_error(files, capsys, kind):
    rc = _run(
        "-m",
        "unknown",
        "-T",
        "5000",
        "--max-items",
        "1",
        "--rho",
        "1",
        "--threshold-delta",
        "1e-3",
        "--key-file",
        files.key_path,
        "--on-invalid",
        "skip",
        "-i",
        str(_gz(files.dir, kind)),
        "-o",
        str(files.dir / "out.jsonl"),
    )
    err = capsys.readouterr().err
    assert rc == 1 and "truncated or corrupt" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "content,message",
    [
        (b'["a"]\n["b\xff"]\n', "not valid UTF-8"),
        (b'["a"]\n["\\udc80"]\n', "surrogate"),
        (b'["a"]\n' + b"[" * 100_000 + b"\n", "nested too deeply"),
        (b'["a"]\n{"t": ' + b"7" * 5000 + b', "items": ["a"]}\n', "too many digits"),
        (
            b'{"t": 1, "items": ["a"]}\n{"t": ' + b"7" * 4000 + b', "items": ["a"]}\n',
            "past the horizon",
        ),
    ],
)
def test_hostile_lines_are_invalid_records_naming_the_line(files, capsys, content, message):
    src = files.dir / "bad.jsonl"
    src.write_bytes(content)
    out = files.dir / "out.jsonl"
    args = UNK_CSV if "horizon" in message else UNK  # explicit steps, or one per line
    assert (
        main(
            [
                "run",
                *args,
                "--key-file",
                files.key_path,
                "-i",
                str(src),
                "-o",
                str(out),
                "--on-invalid",
                "error",
                "--verbose-errors",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "input line 2: " in err and message in err and err.count("\n") == 1
    assert len(err) < 300  # no 4,000-digit number in the message
    assert (
        _run(
            *args,
            "--key-file",
            files.key_path,
            "-i",
            str(src),
            "-o",
            str(out),
            "--force",
            "--max-invalid",
            "1",
        )
        == 0
    )  # the default: skip
    # every step 1..T is released, whatever the input holds
    assert [line["t"] for line in _read_jsonl(out)] == list(range(1, 51))


def test_untimed_event_past_the_horizon_says_which_step(files, capsys):
    src = files.dir / "ev.jsonl"
    src.write_text('["a"]\n["a"]\n')
    assert (
        main(
            [
                "run",
                *UNK[:2],
                "-T",
                "1",
                *UNK[4:],
                "--key-file",
                files.key_path,
                "-i",
                str(src),
                "-o",
                str(files.dir / "o.jsonl"),
                "--on-invalid",
                "error",
            ]
        )
        == 1
    )
    assert "input line 2: time step 2 is past the horizon --horizon 1" in capsys.readouterr().err


def test_broken_pipe_exits_quietly(files, tmp_path):
    src = tmp_path / "many.jsonl"
    src.write_text('["a"]\n' * 5000)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpstream",
            "run",
            "-q",
            *UNK[:2],
            "-T",
            "5000",
            *UNK[4:],
            "--key-file",
            files.key_path,
            "-i",
            str(src),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b'{"t": 1')
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in (0, 141)
    assert err == ""


def test_help_texts(capsys):
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "run"
    ]
    helps = {a.dest: a.help for a in run._actions}
    assert helps["time_column"].count("default") == 1
    assert "required for top-k" in helps["k"] and "8^S >= --horizon" in helps["switches"]
    assert "8 ms per step" in helps["fsync"] and "--no-fsync" in helps["fsync"]


def test_run_help_says_what_input_without_time_steps_does(files, capsys):
    """CSV without a time column is refused and a JSON event without t is an invalid
    record (each line is a step only with --implicit-time): the help says so."""
    parser = build_parser()
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "run"
    ]
    text = " ".join(run.format_help().split())
    assert (
        'an event without t (or a bare array such as ["a", "b"]) is an invalid record' in text
        and "CSV input without --time-column (or --time-field) is refused" in text
    )
    assert "An event without t is a step of its own" not in text
    assert "each event is a step of its own" not in text
    assert "NA, null or None" in " ".join(run.epilog.split())
    helps = {a.dest: " ".join(a.help.split()) for a in run._actions}
    assert "NA, null or None as empty (NaN): prefer parquet" in helps["output_format"]
    base = [
        "-T",
        "3",
        "--domain",
        files.domain,
        "--max-items",
        "2",
        "--rho",
        "1",
        "--key-file",
        files.key_path,
    ]
    (files.dir / "ev.csv").write_text("event,item\n1,d0\n2,d1\n")
    assert _run(*base, "-i", str(files.dir / "ev.csv"), "-o", str(files.dir / "c")) == 2
    assert "CSV input needs its time steps" in capsys.readouterr().err
    (files.dir / "untimed.jsonl").write_text('{"items": ["d0"]}\n["d1"]\n')
    out = files.dir / "u.jsonl"
    # every record invalid: refused by --max-invalid before anything is written ...
    assert main(["run", *base, "-i", str(files.dir / "untimed.jsonl"), "-o", str(out)]) == 1
    assert 'lack a time step "t"' in capsys.readouterr().err and not out.exists()
    # ... and skipped when the operator allows it
    assert (
        main(
            [
                "run",
                *base,
                "-i",
                str(files.dir / "untimed.jsonl"),
                "-o",
                str(out),
                "--max-invalid",
                "1",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "3 steps (t = 1..3 of T = 3), 0 events" in err and "2 skipped" in err
    assert len(out.read_text().splitlines()) == 3  # the public clock, not one step a line


def test_plan_reads_a_config_written_for_run(files, capsys):
    cfg = files.dir / "run.toml"
    cfg.write_text(
        f'horizon = 40\nmechanism = "unknown"\nmax-items = 2\nrho = 1.0\n'
        f'threshold-delta = 1e-3\nkey-file = "{files.key_path}"\n'
        f'input = "{files.input}"\nstate = "s.sqlite"\nfsync = false\n'
    )
    info = _plan(capsys, "--config", str(cfg))
    assert info["horizon"] == 40 and info["mechanism"] == "unknown"
    cfg.write_text("horizon = 40\nbogus = 1\n")
    assert main(["plan", "--config", str(cfg), "--rho", "1"]) == 1
    assert "bogus" in capsys.readouterr().err


def _status(argv: list[str]) -> int | str | None:
    """The exit status of ``dpstream argv`` (argparse's usage errors exit from main)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(
    "twice",
    [
        ["-i", "a.jsonl", "-i", "b.jsonl"],
        ["--input", "a.jsonl", "-i", "b.jsonl"],
        ["--epsilon", "1", "--delta", "1e-6", "--epsilon=8"],
        ["--round", "--no-round"],
        ["-i", "a.jsonl", "-ib.jsonl"],  # (review 123: a value attached went unseen)
        ["-ia.jsonl", "--input=b.jsonl"],
        ["-T5", "-i", "a.jsonl"],  # -T 5 as well as -T 5 in argv below
        ["-qi", "a.jsonl", "-i", "b.jsonl"],  # flags grouped, the last taking a value
    ],
)
def test_an_option_given_twice_is_refused(tmp_path, capsys, twice):
    """Review 122: argparse kept the last of an option given twice: ``-i day1 -i day2``
    read day2 only and released day1's steps empty; ``--epsilon 1 ... --epsilon 8``
    spent 8. A usage error now (exit 2), before anything is read or written."""
    out = tmp_path / "o.jsonl"
    argv = ["run", "-m", "unknown", "--max-items", "2", "-T", "5", "-o", str(out), *twice]
    if "--epsilon" not in twice:
        argv += ["--rho", "1"]
    assert _status(argv) == 2
    assert "an option given twice" in capsys.readouterr().err
    assert not out.exists()
    plan = ["plan", "-m", "unknown", "--max-items", "2", "-T", "5", "--rho", "1", "--rho=2"]
    assert _status(plan) == 2


def test_a_flag_given_again_as_it_was_is_no_slip(tmp_path, capsys):
    """Review 123: ``-q -q`` and ``--debug ... --debug`` change nothing: not refused."""
    key = tmp_path / "k.key"
    fixed_key("flags-twice").save(key)
    data = tmp_path / "in.jsonl"
    data.write_text('{"t": 1, "items": ["a"]}\n')
    argv = ["run", "-q", "-m", "unknown", "--max-items", "2", "--rho", "1", "-q"]
    argv += ["--threshold-delta", "1e-6", "-T", "1", "-i", str(data), "--key-file", str(key)]
    assert _status([*argv, "-o", str(tmp_path / "o.jsonl")]) == 0
    assert "given twice" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_prefix_of_an_option_is_no_spelling_of_it(capsys, command):
    """Review 122: ``--eps 2 --del 1e-6 --hor 10`` were taken as --epsilon, --delta and
    --horizon (argparse's abbreviations): a later option with the same prefix would
    take their place without a word."""
    assert _status([command, "-m", "known", "--max-items", "1", "--hor", "10", "--rho", "1"]) == 2
    assert "unrecognized arguments: --hor 10" in capsys.readouterr().err


@pytest.mark.parametrize(
    "output", [["-o", "o.parquet"], ["-o", "o.x", "--output-format", "parquet"]]
)
def test_follow_with_parquet_output_is_refused(tmp_path, monkeypatch, capsys, output):
    """Review 122: a Parquet file is written whole when the run ends, so a follower
    published nothing until its horizon passed (killed before, nothing at all, its
    budget on record). A usage error now, before a ledger or an output is made."""
    monkeypatch.chdir(tmp_path)
    fixed_key("follow-parquet").save(tmp_path / "k.key")
    (tmp_path / "live.jsonl").write_text("")
    argv = ["run", "-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta"]
    argv += ["1e-6", "-T", "30", "--follow", "--time-field", "ts", "--step", "1s", "--start"]
    argv += ["2026-11-28T00:00Z", "-i", "live.jsonl", "--key-file", "k.key", *output]
    assert main(argv) == 2
    assert "write jsonl or csv with --follow" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.key", "live.jsonl"]


def test_a_suffix_in_capitals_names_the_same_format(tmp_path, monkeypatch):
    """Review 122: ``-o out.CSV`` wrote JSON Lines, ``-i in.CSV`` was read as JSON Lines,
    and ``-o out.bz2`` was written uncompressed: a suffix names its format in any case,
    and an output named as compressed is refused before anything is written."""
    from dpstream.run.settings import auto_format

    for name, want in (("o.CSV", "csv"), ("o.Csv.GZ", "csv"), ("o.PARQUET", "parquet")):
        assert auto_format(name, "auto") == want
    monkeypatch.chdir(tmp_path)
    fixed_key("suffix").save(tmp_path / "k.key")
    (tmp_path / "in.CSV").write_text("t,event,item\n1,e1,a\n2,e2,b\n")
    argv = ["run", "-q", "-m", "unknown", "--max-items", "2", "--rho", "1"]
    argv += ["--threshold-delta", "1e-6", "-T", "2", "-i", "in.CSV", "--time-column", "t"]
    argv += ["--key-file", "k.key"]
    assert main([*argv, "-o", "out.CSV"]) == 0
    assert (tmp_path / "out.CSV").read_text().startswith("t,")  # a CSV table, not JSON
    for name in ("out.bz2", "out.JSONL.ZST"):
        assert main([*argv, "-o", name, "--ledger", f"{name}.ledger"]) == 1
        assert not (tmp_path / name).exists()


def test_an_output_in_the_key_registry_is_refused(tmp_path, key_registry, capsys):
    """Review 122: ``-o`` naming a key's registry entry, with --overwrite, replaced the
    record of where the key's ledger is with releases: every later run of the key was
    refused, with a message quoting a release as the ledger's path."""
    import os

    key = tmp_path / "k.key"
    fixed_key("registry-out").save(key)
    data = tmp_path / "in.jsonl"
    data.write_text('{"t": 1, "items": ["a"]}\n')
    argv = ["run", "-q", "-m", "unknown", "--max-items", "2", "--rho", "1"]
    argv += ["--threshold-delta", "1e-6", "-T", "2", "-i", str(data), "--key-file", str(key)]
    assert main([*argv, "-o", str(tmp_path / "o.jsonl")]) == 0
    entries = sorted(os.listdir(key_registry))
    entry = os.path.join(key_registry, next(e for e in entries if not e.endswith(".lock")))
    before = open(entry, "rb").read()
    assert main([*argv, "-o", entry, "--overwrite"]) == 1
    assert "key registry's folder" in capsys.readouterr().err
    assert open(entry, "rb").read() == before


def test_time_mode_problems_are_settings_problems_listed_at_once(tmp_path, capsys):
    """Review 122: a time mode's problems (--follow without a clock, --implicit-time
    with --until, --until past the horizon) exited 1, one at a time, where the README
    promises every problem of a command line at once, with exit status 2."""
    fixed_key("modes").save(tmp_path / "k.key")
    argv = ["run", "-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta"]
    argv += ["1e-6", "-T", "9", "--key-file", str(tmp_path / "k.key")]
    assert main([*argv, "--follow", "--implicit-time", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--follow needs the public clock" in err and "numbers the steps by line" in err
    assert main([*argv, "--until", "10", "-o", str(tmp_path / "o")]) == 2
    assert "--until 10 is past the horizon" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
