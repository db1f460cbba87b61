"""The release clock is public: neighbouring inputs release the same steps (review finding 1).

The attack: with a clock read from the data (steps 1..last event; implicit time
making every line a step), the number of output lines told whether one event
was in the input, with no error at all. These tests run that distinguisher on
neighbouring inputs and require it to learn nothing from which steps exist.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpstream.cli import main

from .conftest import fixed_key


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["t"] for line in path.read_text().splitlines()]


def _run(tmp_path, key_path, lines, name, *extra) -> list[int]:
    src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    src.write_text("".join(line + "\n" for line in lines))
    assert main(["run", "-q", "-m", "unknown", "-T", "40", "--max-items", "2", "--rho", "1",
                 "--threshold-delta", "1e-3", "--key-file", str(key_path), "-i", str(src),
                 "-o", str(out), *extra]) == 0
    return _steps(out)


@pytest.mark.parametrize("seed", range(5))
def test_implicit_time_neighbours_release_the_same_steps(tmp_path, seed):
    """Every line its own step: removing one line used to remove one output line."""
    key_path = tmp_path / "k.key"
    fixed_key(f"clock-{seed}").save(key_path)
    lines = ['["a", "b"]'] * 30
    full = _run(tmp_path, key_path, lines, "full")
    neighbour = _run(tmp_path, key_path, lines[:seed] + lines[seed + 1:], "neighbour")
    assert full == neighbour == list(range(1, 41))


def test_an_event_alone_in_the_last_step_does_not_decide_whether_the_step_exists(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("clock-last").save(key_path)
    lines = [json.dumps({"t": t, "items": ["a"]}) for t in (1, 2, 2, 5)]
    full = _run(tmp_path, key_path, lines + ['{"t": 9, "items": ["b"]}'], "full")
    neighbour = _run(tmp_path, key_path, lines, "neighbour")
    assert full == neighbour == list(range(1, 41))
    empty = _run(tmp_path, key_path, [], "empty")  # no event at all: still every step
    assert empty == list(range(1, 41))


def test_until_is_a_public_end_step_and_a_later_until_goes_on(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("clock-until").save(key_path)
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 3, 12)))
    out, state, ref = tmp_path / "out.jsonl", tmp_path / "s.sqlite", tmp_path / "ref.jsonl"
    base = ["run", "-q", "-m", "unknown", "-T", "40", "--max-items", "2", "--rho", "1",
            "--threshold-delta", "1e-3", "--key-file", str(key_path), "-i", str(src)]
    assert main([*base, "-o", str(out), "--state", str(state), "--until", "10"]) == 0
    assert _steps(out) == list(range(1, 11))  # the event at t = 12 waits for a later run
    assert main([*base, "-o", str(out), "--state", str(state), "--until", "10"]) == 1
    assert main([*base, "-o", str(out), "--state", str(state), "--until", "8"]) == 1
    assert main([*base, "-o", str(out), "--state", str(state), "--until", "25"]) == 0
    assert main([*base, "-o", str(out), "--state", str(state)]) == 0  # to the horizon
    assert main([*base, "-o", str(ref)]) == 0
    assert out.read_bytes() == ref.read_bytes()  # as one uninterrupted run
    assert main([*base, "-o", str(tmp_path / "x.jsonl"), "--until", "41"]) == 1
