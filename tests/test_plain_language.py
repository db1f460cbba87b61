"""The command line speaks the user's words: no paper label, no Python keyword.

Paper labels (``lem:badOutcomes``, ``eq:opt_base``, ``Delta0``, ``m_delta``,
``L_r``...) and keyword-argument phrasing (``rho=``) belong in docstrings and in
``dpstream plan --explain``; every ``--help``, error and summary a user sees is
checked here by running the command line and grepping what it printed.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import io
import re

import pytest

from dpstream.cli import build_parser, main
from dpstream.view.model import ViewModel
from dpstream.view.render import render_page

from .conftest import fixed_key

#: What must not appear: the paper's labels and symbols, and Python keyword phrasing.
PAPER = re.compile(
    r"\b(lem|eq|thm|algo|defn|sec|cor|prop|app):\w|Delta0|rho_delta|"
    r"\btau_[12]\b|\bm_delta\b|\bm_t\b|\bL_r\b|\bI_t\b|(?<!-)\bkbar\b|\bSec\. \d|"
    r"\b(rho|epsilon|delta|tau|threshold_delta|max_items|k|base|counter)="
    r"(?=[\s,;)'\"]|$)|\b(max_items|threshold_delta)\b"
)


def _run(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit:  # argparse's own usage errors
            pass
    return out.getvalue() + err.getvalue()


def _page_text(page: str) -> str:
    """The words a reader sees on a view page (no script, style or tag)."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _helps() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        "dpstream --help": parser.format_help(),
        **{f"dpstream {n} --help": p.format_help() for n, p in sub.choices.items()},
    }


MECHS = {
    "known": ["--domain", "{dom}", "--max-items", "2"],
    "unknown": ["--max-items", "2"],
    "top-k": ["--domain", "{dom}", "--k", "1", "--switches", "2"],
    "meta": ["--oneshot", "unknown-gumbel", "--k", "1", "--kbar", "2"],
}


@pytest.fixture
def outputs(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("plain").save(key)
    events, dom = tmp_path / "ev.jsonl", tmp_path / "dom.txt"
    events.write_text('{"t":1,"items":["a","b"]}\n{"t":2,"items":["a","zz","b","c"]}\nbad\n')
    dom.write_text("a\nb\nc\n")
    texts = dict(_helps())
    for mech, extra in MECHS.items():
        extra = [x.format(dom=dom) for x in extra]
        budget = ["--epsilon", "1", "--delta", "1e-6"]
        texts[f"plan {mech}"] = _run(["plan", "-m", mech, "-T", "100", *budget, *extra])
        texts[f"plan {mech} target"] = _run(
            ["plan", "-m", mech, "-T", "100", "--target-error", "20", "--delta", "1e-6", *extra]
        )
        texts[f"plan {mech} explain"] = _run(
            ["plan", "-m", mech, "-T", "100", *budget, *extra, "--explain"]
        )
        texts[f"run {mech}"] = _run(
            [
                "run",
                "-m",
                mech,
                "-T",
                "10",
                *budget,
                *extra,
                "--key-file",
                str(key),
                "-i",
                str(events),
                "-o",
                str(tmp_path / f"{mech}.jsonl"),
            ]
        )
        model = ViewModel(tmp_path / f"{mech}.jsonl")
        model.refresh()
        texts[f"view card {mech}"] = _page_text(render_page(model.snapshot(), nonce=None))
    dom_args = ["--domain", str(dom), "--max-items", "2"]
    for name, argv in {
        "no budget": ["run", "-T", "10", *dom_args, "--key-file", str(key), "-i", str(events)],
        "two budgets": ["plan", "-T", "10", *dom_args, "--rho", "1", "--epsilon", "1"],
        "epsilon alone": ["plan", "-T", "10", *dom_args, "--epsilon", "1"],
        "no max-items": ["plan", "-T", "10", "--domain", str(dom), "--rho", "1"],
        "unknown with rho": ["plan", "-m", "unknown", "-T", "10", "--max-items", "2", "--rho", "1"],
        "invalid, error policy": [
            "run",
            "-T",
            "10",
            *dom_args,
            "--rho",
            "1",
            "--key-file",
            str(key),
            "-i",
            str(events),
            "-o",
            str(tmp_path / "x"),
            "--on-invalid",
            "error",
        ],
        "meta, k above the candidate list size": [
            "plan",
            "-m",
            "meta",
            "-T",
            "10",
            "--rho",
            "1",
            "--oneshot",
            "unknown-gumbel",
            "--k",
            "5",
            "--kbar",
            "2",
        ],
        "blt with base": [
            "plan",
            "-T",
            "10",
            *dom_args,
            "--rho",
            "1",
            "--counter",
            "blt",
            "--base",
            "3",
        ],
    }.items():
        texts[name] = _run(argv)
    return texts


#: The paper's names of the mechanisms and their parameters. At the edge a mechanism is
#: named by what it does ("unknown-domain histogram", "top-k with switches", "most items
#: per event", "candidate list size"); only ``plan --explain`` may cite a paper name, and
#: only inside parentheses, after the plain words (``_outside_parentheses``).
PAPER_NAMES = re.compile(
    r"KnownBase|UnkBase|SparseGumb|MetaAlgo|BinMech|(?<!-)\bkbar\b|Delta0|\blem:|"
    r"tree base r\b"
)


def _outside_parentheses(text: str) -> str:
    """``text`` with every parenthesised part (nesting included) blanked out."""
    out, depth = [], 0
    for ch in text:
        depth += ch == "("
        out.append(ch if depth == 0 else " ")
        depth -= ch == ")" and depth > 0
    return "".join(out)


def test_no_paper_label_in_any_help_error_or_summary(outputs):
    found = {
        name: sorted({m.group(0) for m in PAPER.finditer(text)})
        for name, text in outputs.items()
        if not name.endswith("explain")
    }
    assert {name: labels for name, labels in found.items() if labels} == {}
    assert all(text.strip() for text in outputs.values())  # every command said something


def test_mechanisms_are_named_by_what_they_do(outputs):
    """The paper's mechanism names nowhere at the edge; in ``plan --explain`` only in
    parentheses, after the plain words."""
    found = {
        name: sorted(
            {
                m.group(0)
                for m in PAPER_NAMES.finditer(
                    _outside_parentheses(text) if name.endswith("explain") else text
                )
            }
        )
        for name, text in outputs.items()
    }
    assert {name: labels for name, labels in found.items() if labels} == {}
    assert {"run --help", "plan --help", "view --help", "demo --help"} <= {
        name.removeprefix("dpstream ") for name in outputs
    }
    assert {f"view card {m}" for m in MECHS} <= set(outputs)


def test_the_name_checker_catches_what_it_looks_for():
    for bad in ("UnkBase", "SparseGumb's s", "MetaAlgo[x]", "kbar = 3", "tree base r = 8"):
        assert PAPER_NAMES.search(bad), bad
    assert not PAPER_NAMES.search(_outside_parentheses("top-k with switches (SparseGumb)"))
    assert PAPER_NAMES.search(_outside_parentheses("(a) UnkBase (b)"))
    for fine in ("--kbar 2", "unknown-domain histogram", "tree counter with base 8"):
        assert not PAPER_NAMES.search(fine), fine


def test_the_checker_catches_what_it_looks_for():
    for bad in (
        "see lem:badOutcomes",
        "Delta0 items",
        "give rho= or tau=",
        "m_delta = 3",
        "r* by eq:opt_base",
        "max_items * threshold_delta",
    ):
        assert PAPER.search(bad), bad
    for fine in ("epsilon = 1, delta = 1e-06 per event", "--max-items 2", "--rho 0.5"):
        assert not PAPER.search(fine), fine


def test_plan_explain_keeps_the_paper_references(tmp_path):
    text = _run(
        [
            "plan",
            "-m",
            "unknown",
            "-T",
            "100",
            "--max-items",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--explain",
        ]
    )
    assert "UnkBase" in text and "Cardoso" in text


def _tile_text(page: str, label: str) -> str:
    """The words of the header tile ``label`` of a view page."""
    found = re.search(
        rf'<div class="tile[^"]*"><div class="label">{label}</div>(.*?)</div></div>', page, re.S
    )
    assert found is not None, label
    return " ".join(_page_text(found.group(1)).split())


def test_the_views_mechanism_card_is_in_plain_words(tmp_path):
    """The card names the mechanism and its counter as a user would (not UnkBase,
    KnownBase or "tree base r = 8"), for a run with a clock too."""
    key = tmp_path / "k.key"
    fixed_key("plain-card").save(key)
    events, dom = tmp_path / "ev.jsonl", tmp_path / "dom.txt"
    events.write_text('{"ts":"2026-01-02","items":["a","b"]}\n{"ts":"2026-02-03","items":["a"]}\n')
    dom.write_text("a\nb\nc\n")
    clock = ["--time-field", "ts", "--start", "2026-01-01", "--step", "1mo", "-T", "12"]
    runs = {
        "known": (["-m", "known", "--domain", str(dom), "--counter", "tree", "--base", "8"]),
        "unknown": (["-m", "unknown", "--blt-buffers", "3"]),
    }
    cards = {}
    for name, extra in runs.items():
        out = tmp_path / f"{name}.jsonl"
        argv = ["run", "-q", *extra, "--max-items", "2", "--epsilon", "1", "--delta", "1e-6"]
        assert main([*argv, *clock, "--key-file", str(key), "-i", str(events), "-o", str(out)]) == 0
        model = ViewModel(out)
        model.refresh()
        page = render_page(model.snapshot(), nonce=None)
        cards[name] = _tile_text(page, "mechanism")
        assert not PAPER_NAMES.search(_page_text(page)), name
        assert "2026-12-01 – 2027-01-01" in _page_text(page)  # the step shown, in dates
    assert cards == {
        "known": "known-domain histogram tree counter (base 8)",
        "unknown": "unknown-domain histogram BLT counter (3 buffers)",
    }
