"""A known domain that is the key, the input, the state or the ledger is refused.

Every release of a known domain names each of its items, so a ``--domain`` given the
key file (a slip of one option) published the key, and with it the noise of every
stream under it, in every release line (review 102: exit 0, not a word on stderr,
with ``--on-invalid truncate`` or an empty input); given the input, it published the
raw records. These are refused before any file is written: by path, by the
content of a file of lines (one line of 64 hex characters; JSON objects), and, in
every known-domain mechanism, a domain that holds the mechanism's own key.
"""

from __future__ import annotations

import json

import pytest

import dpstream as dps
from dpstream.cli import main
from dpstream.mechanisms.histogram_topk import HistogramTopK

from .conftest import fixed_key

BASE = ["run", "-q", "-m", "known", "-T", "4", "--max-items", "2", "--rho", "1", "--no-fsync"]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fixed_key("domain-roles").save(tmp_path / "k.key")
    fixed_key("another key").save(tmp_path / "other.key")
    events = [{"t": t, "items": ["a", "b"], "user": f"person{t}"} for t in range(1, 5)]
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "empty.jsonl").write_text("")
    return tmp_path


def _nothing_written(tmp_path) -> bool:
    return not any(p.name.startswith("out") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "domain,inp,message",
    [
        ("k.key", "ev.jsonl", "--domain 'k.key' is the same file as --key-file 'k.key'"),
        ("k.key", "empty.jsonl", "--domain 'k.key' is the same file as --key-file 'k.key'"),
        ("other.key", "empty.jsonl", "holds 64 hexadecimal characters: a noise key file"),
        ("ev.jsonl", "ev.jsonl", "--domain 'ev.jsonl' is the same file as --input 'ev.jsonl'"),
        ("copy.jsonl", "empty.jsonl", "its line 1 is a JSON object"),
    ],
)
def test_a_domain_file_of_another_role_is_refused_before_anything_is_written(
    files, capsys, domain, inp, message
):
    (files / "copy.jsonl").write_bytes((files / "ev.jsonl").read_bytes())
    argv = [*BASE, "--domain", domain, "--key-file", "k.key", "-i", inp, "-o", "out.jsonl"]
    argv += ["--ledger", "led", "--on-invalid", "truncate"]
    assert main(argv) == 1
    assert message in capsys.readouterr().err
    assert _nothing_written(files)


def test_a_domain_holding_the_key_is_refused_by_every_known_domain_mechanism():
    """The library too: the key's hex text (lower or upper case) or its bytes."""
    key = fixed_key("domain-roles")
    for item in (key.to_bytes().hex(), key.to_bytes().hex().upper()):
        domain = ["a", item]
        builds = [
            lambda d=domain: dps.KnownDomainHistogram(
                horizon=4, domain=d, max_items=1, key=key, rho=1
            ),
            lambda d=domain: dps.ContinualTopK(d, 4, k=1, switches=2, key=key, rho=1),
            lambda d=domain: HistogramTopK(d, 4, k=1, max_items=1, key=key, rho=1),
        ]
        for build in builds:
            with pytest.raises(ValueError, match="holds the noise key itself"):
                build()
    # another key's hex is an item like any other (it is not this key)
    dps.KnownDomainHistogram(
        horizon=4, domain=["a", fixed_key("x").to_bytes().hex()], max_items=1, key=key, rho=1
    )


def test_a_domain_of_one_key_like_item_is_given_as_a_json_array(files):
    """A real domain of one 64-hex item (a hash) is not a key file when given as an array."""
    item = "ab" * 32
    (files / "dom.json").write_text(json.dumps([item]))
    argv = [*BASE, "--domain", "dom.json", "--key-file", "k.key", "-i", "ev.jsonl"]
    assert main([*argv, "-o", "out.jsonl", "--on-invalid", "truncate", "--ledger", "led"]) == 0
    assert item in (files / "out.jsonl").read_text()


def test_a_key_written_on_two_lines_or_spaced_is_refused_as_a_domain(files, capsys):
    """Review 104: NoiseKey.load takes hex with whitespace inside (xxd -p writes two
    lines), but only one 64-hex line was taken for a key file: a two-line copy of the
    run's key as --domain published it in two halves, exit 0."""
    text = fixed_key("domain-roles").to_bytes().hex()
    for name, body in (
        ("two.hex", f"{text[:60]}\n{text[60:]}\n"),
        ("spaced.hex", " ".join(text[i : i + 2] for i in range(0, 64, 2)) + "\n"),
    ):
        (files / name).write_text(body)
        argv = [*BASE, "--domain", name, "--key-file", "k.key", "-i", "ev.jsonl", "-o", "out.jsonl"]
        assert main([*argv, "--on-invalid", "truncate"]) == 1
        assert "holds 64 hexadecimal characters: a noise key file" in capsys.readouterr().err
        assert _nothing_written(files)
    # the library: halves of the key (16 or more of its digits) are the key's
    key = fixed_key("domain-roles")
    for items in (["a", text[:32], text[32:]], ["a", text[5:21].upper()]):
        with pytest.raises(ValueError, match="holds the noise key itself"):
            dps.KnownDomainHistogram(items, 4, max_items=1, key=key, rho=1)
    dps.KnownDomainHistogram(["a", text[:15]], 4, max_items=1, key=key, rho=1)  # too short


def test_another_csv_input_given_as_the_domain_is_refused(files, capsys):
    """Review 104: another day's CSV file as --domain published its rows (user ids
    included) as items, exit 0: its header names the item and time columns."""
    (files / "day1.csv").write_text("t,event,item,user\n1,e1,flu,alice@example.com\n")
    (files / "day2.csv").write_text("t,event,item,user\n2,e2,flu,bob@example.com\n")
    argv = [*BASE, "--domain", "day1.csv", "--key-file", "k.key", "-i", "day2.csv"]
    argv += ["--time-column", "t", "-o", "out.jsonl", "--on-invalid", "truncate"]
    assert main(argv) == 1
    assert "starts with a CSV header naming the item and time columns" in capsys.readouterr().err
    assert _nothing_written(files)
