"""Noise versions on the command line: new runs draw version 2, a state keeps its version.

A state records ``noise_version`` only when it is not 1, so a state written
before versions existed (which drew version 1 noise) has the same parameters
as a version 1 run of today, and a resumed run takes the version from the
state, whatever the default is now.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpstream.cli import main
from dpstream.state import Checkpoint

from .conftest import fixed_key, own_ledger

T = 24


@pytest.fixture
def setup(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("noise-version-cli").save(key)
    rng = np.random.default_rng(3)  # simulated events (test data)
    words = [f"w{i}" for i in range(12)]
    (tmp_path / "domain.txt").write_text("\n".join(words) + "\n")
    halves = []
    for lo, hi in ((1, T // 2), (T // 2 + 1, T)):
        lines = [
            json.dumps({"t": t, "items": rng.choice(words, 2, replace=False).tolist()}) + "\n"
            for t in range(lo, hi + 1)
            for _ in range(int(rng.integers(0, 4)))
        ]
        halves.append("".join(lines))
    (tmp_path / "first.jsonl").write_text(halves[0])
    (tmp_path / "second.jsonl").write_text(halves[1])
    (tmp_path / "all.jsonl").write_text("".join(halves))
    args = [
        "run",
        "-q",
        "-T",
        str(T),
        "-m",
        "known",
        "--max-items",
        "2",
        "--rho",
        "1",
        "--domain",
        str(tmp_path / "domain.txt"),
        "--key-file",
        str(key),
        "--no-fsync",
    ]
    return tmp_path, args


def _params(state):
    with Checkpoint(str(state), fsync=False) as ckpt:
        return json.loads(ckpt.load().params)


def test_new_runs_draw_version_2_and_say_so(setup):
    base, args = setup
    v2, v1 = base / "v2.jsonl", base / "v1.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(v2)]) == 0
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(v1), "--noise-version", "1"]) == 0
    assert json.loads((base / "v2.jsonl.meta.json").read_text())["noise_version"] == 2
    assert json.loads((base / "v1.jsonl.meta.json").read_text())["noise_version"] == 1
    assert v1.read_bytes() != v2.read_bytes()  # independent noise


def test_a_version_1_state_goes_on_with_version_1(setup):
    """The first half with --noise-version 1 (as an old dpstream would have run it),
    the second without the flag: the state's version wins, and the output equals
    one version 1 run over everything."""
    base, args = setup
    ref = base / "ref.jsonl"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "all.jsonl"),
                "-o",
                str(ref),
                *own_ledger(ref),
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    out, state = base / "out.jsonl", base / "s.sqlite"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "first.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
                "--until",
                str(T // 2),
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    assert "noise_version" not in _params(state)  # as states written before versions
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "second.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
            ]
        )
        == 0
    )
    assert out.read_bytes() == ref.read_bytes()


def test_a_version_1_state_refuses_version_2(setup, capsys):
    base, args = setup
    out, state = base / "out.jsonl", base / "s.sqlite"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "first.jsonl"),
                "-o",
                str(out),
                "--state",
                str(state),
                "--until",
                str(T // 2),
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    before = out.read_bytes()
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "second.jsonl"),
                "-o",
                str(out),
                "--state",
                str(state),
                "--noise-version",
                "2",
            ]
        )
        == 1
    )
    assert "error" in capsys.readouterr().err
    assert out.read_bytes() == before


def test_writing_over_an_output_keeps_its_version(setup):
    """--force over an output whose sidecar says version 1 (or, from dpstream 0.1, says
    no version) draws version 1 again: the same noise for the steps already published."""
    base, args = setup
    ref, out = base / "ref.jsonl", base / "out.jsonl"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "all.jsonl"),
                "-o",
                str(ref),
                *own_ledger(ref),
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "first.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    meta = base / "out.jsonl.meta.json"
    info = json.loads(meta.read_text())
    del info["noise_version"]  # as dpstream 0.1 wrote it
    meta.write_text(json.dumps(info))
    assert (
        main([*args, "-i", str(base / "all.jsonl"), "-o", str(out), *own_ledger(out), "--force"])
        == 0
    )
    assert out.read_bytes() == ref.read_bytes()
    assert json.loads(meta.read_text())["noise_version"] == 1


def test_a_version_2_state_refuses_another_version(setup, capsys):
    base, args = setup
    out, state = base / "out.jsonl", base / "s.sqlite"
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "first.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
                "--until",
                str(T // 2),
            ]
        )
        == 0
    )
    assert _params(state)["noise_version"] == 2
    before = out.read_bytes()
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "second.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
                "--noise-version",
                "1",
            ]
        )
        == 1
    )
    assert "error" in capsys.readouterr().err
    assert out.read_bytes() == before
    # without the flag it goes on with version 2
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "second.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
            ]
        )
        == 0
    )
    ref = base / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    assert out.read_bytes() == ref.read_bytes()


def test_an_output_without_sidecar_needs_the_version_and_spark_defaults_to_2(setup, capsys):
    """Writing over an output whose version nothing records is refused without
    --noise-version; a Spark run draws version 2 unless told, as a new local run
    does (the same command line gives the same releases on both engines)."""
    from dpstream.run.record import noise_version_of as _noise_version

    base, args = setup
    out = base / "out.jsonl"
    assert (
        main([*args, "-i", str(base / "first.jsonl"), "-o", str(out), "--noise-version", "1"]) == 0
    )
    (base / "out.jsonl.meta.json").unlink()
    before = out.read_bytes()
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(out), "--force"]) == 1
    assert "--noise-version" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert (
        main(
            [
                *args,
                "-i",
                str(base / "all.jsonl"),
                "-o",
                str(out),
                "--force",
                "--noise-version",
                "1",
            ]
        )
        == 0
    )
    opts = {
        "engine": "spark",
        "state": None,
        "output": str(base / "new-dir"),
        "allow_readable_state": False,
        "force": False,
    }
    assert _noise_version({**opts, "noise_version": None}) == 2
    assert _noise_version({**opts, "noise_version": 1}) == 1
    assert _noise_version({**opts, "engine": "local", "noise_version": None}) == 2


def test_overwrite_alone_takes_nothing_of_the_stream_it_replaces(setup, capsys):
    """Review 116 (low): `--overwrite` (a new stream replacing the file) took the noise
    version of the replaced stream's sidecar, and refused an output without one unless
    given --noise-version. Only --force (the same stream again) goes on with them."""
    base, args = setup
    out = base / "out.jsonl"
    first = [*args, "-i", str(base / "first.jsonl"), "-o", str(out), *own_ledger(out)]
    assert main([*first, "--noise-version", "1"]) == 0
    meta = json.loads((base / "out.jsonl.meta.json").read_text())
    assert meta["noise_version"] == 1
    fixed_key("noise-version-cli, another stream").save(base / "k2.key")
    again = [*args, "-i", str(base / "all.jsonl"), "-o", str(out), *own_ledger(out)]
    again[again.index(str(base / "k.key"))] = str(base / "k2.key")
    assert main([*again, "--overwrite"]) == 0
    meta = json.loads((base / "out.jsonl.meta.json").read_text())
    assert meta["noise_version"] == 2  # its own: the newest
    (base / "out.jsonl.meta.json").unlink()  # no sidecar: --overwrite needs no version
    assert main([*again, "--overwrite", "--stream", "third"]) == 0
