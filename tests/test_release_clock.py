"""The release clock is public: neighbouring inputs release the same steps (review finding 1).

The attack: with a clock read from the data (steps 1..last event; implicit time
making every line a step), the number of output lines told whether one event
was in the input, with no error at all. These tests run that distinguisher on
neighbouring inputs and require it to learn nothing from which steps exist.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main

from .conftest import fixed_key, own_ledger


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["t"] for line in path.read_text().splitlines()]


def _run(tmp_path, key_path, lines, name, *extra: str) -> list[int]:
    src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    src.write_text("".join(line + "\n" for line in lines))
    assert (
        main(
            [
                "run",
                "-q",
                "-m",
                "unknown",
                "-T",
                "40",
                "--max-items",
                "2",
                "--rho",
                "1",
                "--threshold-delta",
                "1e-3",
                "--key-file",
                str(key_path),
                "-i",
                str(src),
                "-o",
                str(out),
                *own_ledger(out),
                *extra,
            ]
        )
        == 0
    )
    return _steps(out)


@pytest.mark.parametrize("seed", range(5))
def test_implicit_time_neighbours_release_the_same_steps(tmp_path, seed):
    """Every line its own step: removing one line used to remove one output line."""
    key_path = tmp_path / "k.key"
    fixed_key(f"clock-{seed}").save(key_path)
    lines = ['["a", "b"]'] * 30
    full = _run(tmp_path, key_path, lines, "full", "--implicit-time")
    neighbour = _run(
        tmp_path,
        key_path,
        lines[:seed] + ["[]"] + lines[seed + 1 :],
        "neighbour",
        "--implicit-time",
    )
    assert full == neighbour == list(range(1, 41))


@pytest.mark.parametrize("bad", ['["caf\udce9"]', "[1.5]", '["\\ud83d"]', "not json", ""])
def test_a_broken_line_is_a_step_like_its_empty_neighbour(tmp_path, bad):
    """Review finding A: with implicit time, a line whose item is broken (not UTF-8, a
    float, a lone surrogate) or a blank line was no step, while its neighbour [] was: every
    later step moved. Now both are steps, and with the broken event dropped (skip) the two
    outputs are byte for byte the same."""
    key_path = tmp_path / "k.key"
    fixed_key("clock-broken").save(key_path)
    lines = ['["a", "b"]', '["a"]', bad, '["b"]', '["a", "b"]']
    outs = []
    for name, middle in (("broken", bad), ("empty", "[]")):
        src = tmp_path / f"{name}.jsonl"
        src.write_bytes(
            "".join(x + "\n" for x in [*lines[:2], middle, *lines[3:]]).encode(
                "utf-8", "surrogateescape"
            )
        )
        out = tmp_path / f"{name}.out.jsonl"
        assert (
            main(
                [
                    "run",
                    "-q",
                    "-m",
                    "unknown",
                    "-T",
                    "10",
                    "--max-items",
                    "2",
                    "--rho",
                    "9",
                    "--threshold-delta",
                    "0.3",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(src),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    "--implicit-time",
                    "--remember",
                    "--max-invalid",
                    "1",
                ]
            )
            == 0
        )  # a broken line on purpose
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert b'"a"' in outs[0]  # the runs do release items


def test_an_event_with_a_broken_item_keeps_its_step(tmp_path):
    """Review finding A, explicit steps: a record with a bad item lost its "t", so its
    empty neighbour moved time on and made the events after it late."""
    key_path = tmp_path / "k.key"
    fixed_key("clock-broken-t").save(key_path)
    outs = []
    for name, items in (("broken", "[1.5]"), ("empty", "[]")):
        src = tmp_path / f"{name}.jsonl"
        src.write_text(
            '{"t": 1, "items": ["a"]}\n'
            + '{"t": 2, "items": '
            + items
            + "}\n"
            + '{"t": 1, "items": ["b"]}\n{"t": 2, "items": ["a", "b"]}\n'
        )
        out = tmp_path / f"{name}.out.jsonl"
        assert (
            main(
                [
                    "run",
                    "-q",
                    "-m",
                    "unknown",
                    "-T",
                    "6",
                    "--max-items",
                    "2",
                    "--rho",
                    "9",
                    "--threshold-delta",
                    "0.3",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(src),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    "--max-invalid",
                    "1",
                ]
            )
            == 0
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_an_event_alone_in_the_last_step_does_not_decide_whether_the_step_exists(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("clock-last").save(key_path)
    lines = [json.dumps({"t": t, "items": ["a"]}) for t in (1, 2, 2, 5)]
    full = _run(tmp_path, key_path, lines + ['{"t": 9, "items": ["b"]}'], "full")
    neighbour = _run(tmp_path, key_path, lines, "neighbour")
    assert full == neighbour == list(range(1, 41))
    # no event at all: still every step (said so: an empty input is refused otherwise)
    empty = _run(tmp_path, key_path, [], "empty", "--allow-empty")
    assert empty == list(range(1, 41))


def test_until_is_a_public_end_step_and_a_later_run_goes_on(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("clock-until").save(key_path)
    days = {"day1": (1, 3), "day2": (12,), "day3": ()}
    for name, steps in days.items():
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in steps)
        )
    (tmp_path / "all.jsonl").write_text(
        "".join((tmp_path / f"{n}.jsonl").read_text() for n in days)
    )
    out, state, ref = tmp_path / "out.jsonl", tmp_path / "s.sqlite", tmp_path / "ref.jsonl"
    base = [
        "run",
        "-q",
        "-m",
        "unknown",
        "-T",
        "40",
        "--max-items",
        "2",
        "--rho",
        "1",
        "--threshold-delta",
        "1e-3",
        "--key-file",
        str(key_path),
    ]

    def day(name, *extra):
        return main(
            [
                *base,
                "-i",
                str(tmp_path / f"{name}.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
                "--state",
                str(state),
                *extra,
            ]
        )

    assert day("day1", "--until", "10") == 0
    assert _steps(out) == list(range(1, 11))
    assert day("day2", "--until", "10") == 1  # steps up to 10 are out already
    assert day("day2", "--until", "8") == 1
    assert day("day1", "--until", "25") == 1  # the same input twice: refused
    assert day("day2", "--until", "25") == 0
    assert day("day3") == 1  # an empty day: refused unless the run says it had no events
    assert day("day3", "--allow-empty") == 0  # to the horizon
    assert main([*base, "-i", str(tmp_path / "all.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    assert out.read_bytes() == ref.read_bytes()  # as one uninterrupted run
    assert (
        main(
            [
                *base,
                "-i",
                str(tmp_path / "all.jsonl"),
                "-o",
                str(tmp_path / "x.jsonl"),
                *own_ledger(tmp_path / "x.jsonl"),
                "--until",
                "41",
            ]
        )
        == 2  # past the horizon: a setting's problem
    )


@pytest.mark.parametrize("mode", ["unknown", "known", "top-k"])
@pytest.mark.parametrize("extra, far", [((), 41), (("--until", "20"), 25), (("--until", "20"), 41)])
def test_a_record_past_the_end_changes_no_other_event(tmp_path, mode, extra, far):
    """A record of a step past --until (or past the horizon) is dropped, and must act
    as if it were not there. It used to close every step before it, so every in-range
    event after it was late and dropped: one record decided the counts of all the
    events that followed it. Neighbours (with it, without it) now give the same bytes."""
    key_path = tmp_path / "k.key"
    fixed_key("clock-past").save(key_path)
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\nc\n")
    lines = [json.dumps({"t": 1 + i // 6, "items": ["abc"[i % 3]]}) for i in range(90)]
    outs = []
    for name, body in (
        ("with", lines[:30] + [json.dumps({"t": far, "items": ["c"]})] + lines[30:]),
        ("without", lines),
    ):
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        src.write_text("".join(line + "\n" for line in body))
        args = [
            "run",
            "-q",
            "-m",
            mode,
            "-T",
            "40",
            "--max-items",
            "1",
            "--key-file",
            str(key_path),
            "-i",
            str(src),
            "-o",
            str(out),
            *own_ledger(out),
            *extra,
        ]
        if mode == "unknown":
            args += ["--rho", "50", "--threshold-delta", "0.3"]
        elif mode == "known":
            args += ["--rho", "50", "--domain", str(domain)]
        else:
            args += ["--rho", "50", "--domain", str(domain), "--k", "1", "--switches", "2"]
        assert main(args) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    last = json.loads(outs[0].splitlines()[14])  # step 15: events after the far record
    assert last["t"] == 15


@pytest.mark.parametrize("mode", ["unknown", "known", "top-k"])
def test_a_batch_run_counts_every_event_in_its_own_step_whatever_the_order(tmp_path, mode):
    """A step used to close when an event of a later step arrived, so that event decided
    that the events after it were late and dropped: with one early event of step 30, the
    neighbour of an input changed the counts of every event after it. A batch run now
    reads its input to the end before it releases: the same events in any order give
    the same bytes (each step's events in input order is all a step's digest keeps)."""
    key_path = tmp_path / "k.key"
    fixed_key("clock-order").save(key_path)
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\nc\n")
    ordered = [json.dumps({"t": 1 + i // 6, "items": ["abc"[i % 3]]}) for i in range(120)]
    early = [ordered[-1], *ordered[:-1]]  # the last event (step 20) first
    rng = np.random.default_rng(4)  # simulation data only
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    outs = []
    for name, body in (("ordered", ordered), ("early", early), ("shuffled", shuffled)):
        src, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
        src.write_text("".join(line + "\n" for line in body))
        args = [
            "run",
            "-q",
            "-m",
            mode,
            "-T",
            "40",
            "--max-items",
            "1",
            "--key-file",
            str(key_path),
            "-i",
            str(src),
            "-o",
            str(out),
            *own_ledger(out),
            "--rho",
            "50",
        ]
        if mode == "unknown":
            args += ["--threshold-delta", "0.3"]
        else:
            args += ["--domain", str(domain)]
        if mode == "top-k":
            args += ["--k", "1", "--switches", "2"]
        assert main(args) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_interleaved_csv_events_are_grouped_in_their_step(tmp_path, capsys):
    """A CSV row between two rows of another event used to make that event's later
    rows come back, and they were dropped (the row in between decided it; the run
    only warned). An event is now every row of its id in its step (docs/privacy.md,
    rule 7): the interleaved and grouped rows give the same bytes, and no warning."""
    key_path = tmp_path / "k.key"
    fixed_key("clock-csv").save(key_path)
    domain = tmp_path / "domain.txt"
    domain.write_text("a\nb\nc\n")
    outs = {}
    for name, rows in (
        ("split", ["X,1,a", "Y,1,b", "X,1,c"]),
        ("grouped", ["X,1,a", "X,1,c", "Y,1,b"]),
    ):
        src, out = tmp_path / f"{name}.csv", tmp_path / f"{name}.out.jsonl"
        src.write_text("event,t,item\n" + "".join(r + "\n" for r in rows))
        assert (
            main(
                [
                    "run",
                    "-q",
                    "-m",
                    "known",
                    "--domain",
                    str(domain),
                    "-T",
                    "2",
                    "--max-items",
                    "3",
                    "--rho",
                    "1",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(src),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    "--time-column",
                    "t",
                    "--max-invalid",
                    "1",
                ]
            )
            == 0
        )
        outs[name] = (out.read_bytes(), capsys.readouterr().err)
    assert outs["split"][0] == outs["grouped"][0]
    assert outs["split"][1] == outs["grouped"][1] == ""  # -q: nothing to warn about
