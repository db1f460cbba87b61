"""`plan` and `run` check the mechanism, budget and bounds settings with one function:
every problem of a command line is reported at once (exit status 2), and the two
commands accept and refuse the same settings."""

from __future__ import annotations

import pytest

from dpstream.cli import main

from .conftest import fixed_key


def _problems(err: str) -> list[str]:
    """The problems a refused command printed: one line, or a header and one a line."""
    lines = err.strip().splitlines()
    if len(lines) > 1 and lines[0].endswith("problems with the settings:"):
        assert lines[0] == f"dpstream: error: {len(lines) - 1} problems with the settings:"
        assert all(line.startswith("  - ") for line in lines[1:])
        return [line[4:] for line in lines[1:]]
    assert len(lines) == 1 and lines[0].startswith("dpstream: error: "), err
    return [lines[0][len("dpstream: error: ") :]]


@pytest.fixture
def files(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("settings").save(key)
    (tmp_path / "dom.txt").write_text("a\nb\nc\n")
    (tmp_path / "ev.jsonl").write_text(
        '{"t": 1, "user": "u1", "items": ["a", "b"]}\n{"t": 3, "user": "u2", "items": ["c"]}\n'
    )
    return tmp_path


def test_plan_reports_every_missing_option_at_once(capsys):
    assert main(["plan", "-m", "unknown"]) == 2  # (no --horizon: a stream with no end)
    err = capsys.readouterr().err
    assert _problems(err) == [
        "give a privacy budget: --epsilon E --delta D, or --rho R (or --tau for the noise "
        "scale itself)",
        "--mechanism unknown needs --max-items N (the most items an event holds)",
    ]
    assert (
        main(
            [
                "plan",
                "-m",
                "top-k",
                "-T",
                "10",
                "--epsilon",
                "1",
                "--k",
                "2",
                "--user-field",
                "user",
            ]
        )
        == 2
    )
    assert _problems(capsys.readouterr().err) == [
        "--epsilon needs --delta as well (the budget is the pair)",
        "--mechanism top-k needs --domain FILE (the known items; for `plan`, --domain-size N "
        "will do)",
        "--user-field needs --max-items-per-user and --max-count-per-item (how much of the "
        "stream one user may contribute)",
    ]


def test_run_reports_every_problem_at_once_with_the_missing_key(files, capsys):
    assert (
        main(
            [
                "run",
                "-q",
                "-m",
                "known",
                "--rho",
                "1",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--max-items-per-user",
                "2",
                "-i",
                str(files / "ev.jsonl"),
            ]
        )
        == 2
    )
    assert _problems(capsys.readouterr().err) == [
        "give one privacy budget, not several (got --epsilon, --delta, --rho): --epsilon E "
        "--delta D, or --rho R, or --tau",
        "--mechanism known needs --domain FILE (the known items; for `plan`, --domain-size N "
        "will do)",
        "user-level privacy needs --max-items-per-user and --max-count-per-item together "
        "(missing --max-count-per-item)",
        "--max-items-per-user/--max-count-per-item need --user-field (the field or column "
        "holding each event's user id)",
        "without --horizon (a stream with no planned end) a run needs --until N, the last "
        "time step it releases (a public end step; run again with the same --state and a "
        "later --until to go on), or --follow",
        "no key: pass --key-file PATH (create one with `dpstream keygen PATH`; keep it secret)",
    ]


USER = ["--user-field", "user"]
BOUNDS = ["--max-items-per-user", "2", "--max-count-per-item", "1"]
KNOWN = ["-m", "known", "--domain", "{dom}"]
TOPK = ["-m", "top-k", "--domain", "{dom}", "--k", "1"]

#: (settings, accepted): every case is given to `plan` and to `run` alike.
MATRIX = [
    ([*KNOWN, "--max-items", "2", "--rho", "1"], True),
    ([*KNOWN, "--max-items", "2", "--rho", "1", *USER], False),  # per-event plan, refused run
    ([*KNOWN, "--rho", "1", *USER, *BOUNDS], True),
    ([*KNOWN, "--max-items", "2", "--rho", "1", *USER, *BOUNDS], True),
    ([*KNOWN, "--rho", "1", *BOUNDS], False),  # bounds without the user field
    ([*KNOWN, "--rho", "1", *USER, *BOUNDS[:2]], False),  # one bound
    ([*KNOWN, "--max-items", "2"], False),  # no budget
    ([*KNOWN, "--max-items", "2", "--epsilon", "1"], False),
    ([*KNOWN, "--max-items", "2", "--delta", "1e-6"], False),
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--tau", "2"], False),
    ([*KNOWN, "--max-items", "2", "--epsilon", "1", "--delta", "1"], False),
    ([*KNOWN, "--rho", "1"], False),  # no --max-items
    (["-m", "known", "--max-items", "2", "--rho", "1"], False),  # no --domain
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--k", "2", "--oneshot", "gaussian"], False),
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--counter", "blt", "--base", "3"], False),
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--counter", "tree", "--base", "3"], True),
    ([*TOPK, "--switches", "2", "--rho", "1"], True),
    ([*TOPK, "--rho", "1"], True),  # no --switches: SparseGumb's default s for T
    ([*TOPK, "--switches", "2", "--rho", "1", "--max-items", "2"], True),
    ([*TOPK, "--max-items", "2", "--rho", "1"], True),  # a histogram's top-k may be chosen
    ([*TOPK, "--max-items", "2", "--epsilon", "1", "--delta", "1e-6"], True),
    ([*TOPK, "--max-items", "2", "--epsilon", "1", "--delta", "1e-6", "--counter", "tree"], True),
    (
        [
            *TOPK,
            "--max-items",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--threshold-delta",
            "1e-7",
        ],
        False,
    ),  # UnkBase's threshold is calibrated, not a top-k option
    ([*TOPK, "--switches", "2", "--epsilon", "1", "--delta", "1e-6", *USER, *BOUNDS], True),
    ([*TOPK, "--switches", "2", "--epsilon", "1", "--delta", "1e-6", *USER], False),
    # review 113: per event a user-level run counts at twice its delta, which must be < 1
    ([*KNOWN, "--epsilon", "1", "--delta", "0.6", *USER, *BOUNDS], False),
    ([*KNOWN, "--epsilon", "1", "--delta", "0.4", *USER, *BOUNDS], True),
    ([*KNOWN, "--max-items", "2", "--epsilon", "1", "--delta", "0.6"], True),
    ([*TOPK[:-2], "--switches", "2", "--rho", "1", "--k", "5"], False),  # k past the domain
    (["-m", "unknown", "--max-items", "2", "--epsilon", "1", "--delta", "1e-6"], True),
    (["-m", "unknown", "--max-items", "2", "--rho", "1"], False),  # no --threshold-delta
    (["-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta", "1e-6"], True),
    (["-m", "unknown", "--domain", "{dom}", "--max-items", "2", "--rho", "1"], False),
    (["-m", "unknown", "--max-items", "2", "--rho", "1", "--counter", "blt"], False),
    (["-m", "unknown", "--rho", "1", "--threshold-delta", "1e-6", *USER, *BOUNDS], True),
    (
        [
            "-m",
            "meta",
            "--oneshot",
            "unknown-gumbel",
            "--k",
            "1",
            "--kbar",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
        ],
        True,
    ),
    (["-m", "meta", "--epsilon", "1", "--delta", "1e-6"], False),  # no --oneshot
    # a "~" in a given name could spell another run's scoped name (name~tag of its input
    # settings, e.g. --on-invalid truncate) and draw that run's noise on other counts
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--stream", "default~c51aa1342050d6b3"], False),
    ([*KNOWN, "--max-items", "2", "--rho", "1", "--stream", "daily-2026"], True),
    (
        [
            "-m",
            "meta",
            "--oneshot",
            "unknown-gumbel",
            "--k",
            "1",
            "--kbar",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            *USER,
            *BOUNDS,
        ],
        False,
    ),
]


@pytest.mark.parametrize(
    "settings,accepted", MATRIX, ids=[" ".join(s).replace("{dom}", "D") for s, _ in MATRIX]
)
def test_plan_and_run_accept_and_refuse_the_same_settings(files, capsys, settings, accepted):
    settings = [s.format(dom=files / "dom.txt") for s in settings]
    plan = main(["plan", "-T", "4", *settings])
    plan_err = capsys.readouterr().err
    out = files / "out.jsonl"
    run = main(
        [
            "run",
            "-q",
            "-T",
            "4",
            *settings,
            "--key-file",
            str(files / "k.key"),
            "-i",
            str(files / "ev.jsonl"),
            "-o",
            str(out),
        ]
    )
    run_err = capsys.readouterr().err
    assert (plan, run) == ((0, 0) if accepted else (2, 2)), (plan_err, run_err)
    if accepted:
        assert len(out.read_text().splitlines()) == 4  # every step of the clock
    else:
        assert _problems(plan_err) == _problems(run_err)
        assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("oneshot", ["unknown-gaussian", "unknown-gumbel"])
def test_meta_unknown_one_shots_need_kbar(capsys, oneshot):
    """Without --kbar the command said "--kbar must be an int, got NoneType None"."""
    argv = ["plan", "-m", "meta", "--oneshot", oneshot, "-T", "100", "--max-items", "2"]
    argv += ["--epsilon", "1", "--delta", "1e-6"] + (["--k", "3"] if "gumbel" in oneshot else [])
    assert main(argv) == 2
    assert _problems(capsys.readouterr().err) == [
        f"--oneshot {oneshot} needs --kbar N (how many candidates each selection may "
        "consider, at least --k)"
    ]
    assert main([*argv, "--kbar", "5"]) == 0
