"""`dpstream demo`: bundled real data, simulated Zipf stream, table and plots."""

from __future__ import annotations

from dpstream.cli import main
from dpstream.demo import load_birdstrikes, zipf_stream


def test_bundled_dataset_shape():
    horizon, events = load_birdstrikes()
    assert horizon == 656 and len(events) == 10000
    assert all(
        len(items) == 2 and items[0].startswith("species:") and items[1].startswith("airport:")
        for _, items in events
    )
    assert [t for t, _ in events] == sorted(t for t, _ in events)


def test_zipf_stream_is_seeded_and_skewed():
    a = list(zipf_stream(items=50, steps=20, events_per_step=30, exponent=1.1, seed=3))
    b = list(zipf_stream(items=50, steps=20, events_per_step=30, exponent=1.1, seed=3))
    assert a == b
    counts: dict[str, int] = {}
    for step in a:
        for ev in step:
            assert 1 <= len(ev) <= 3 and len(set(ev)) == len(ev)
            for i in ev:
                counts[i] = counts.get(i, 0) + 1
    # P(item-0000) / P(item-0049) = 50^1.1 ~ 74 under the Zipf law
    assert counts["item-0000"] > 10 * counts.get("item-0049", 0)


def test_demo_prints_tables_and_writes_plots(tmp_path, capsys):
    out = tmp_path / "demo"
    assert (
        main(["demo", "--out", str(out), "--zipf-steps", "150", "--zipf-items", "80", "--top", "5"])
        == 0
    )
    text = capsys.readouterr().out
    assert "FAA wildlife strikes" in text and "simulated" in text and "fresh key" in text
    assert "private" in text and "true" in text
    for name in ("birdstrikes.png", "zipf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_known_mechanism_with_key_file(tmp_path, capsys):
    assert main(["keygen", str(tmp_path / "k")]) == 0
    assert (
        main(
            [
                "demo",
                "--mechanism",
                "known",
                "--key-file",
                str(tmp_path / "k"),
                "--no-plot",
                "--zipf-steps",
                "50",
                "--zipf-items",
                "40",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "known-domain histogram" in out and "KnownBase" not in out  # plain words


def test_demo_prints_rounded_private_counts(capsys):
    import re

    assert main(["demo", "--no-plot", "--zipf-steps", "50", "--zipf-items", "40"]) == 0
    rows = [
        line.split("│") for line in capsys.readouterr().out.splitlines() if line.count("│") == 5
    ]
    private = [r[3].strip() for r in rows]  # item | true | private | private - true
    assert sum(bool(re.fullmatch(r"-?\d+", p)) for p in private) >= 5
    assert all(re.fullmatch(r"-?\d+|not shown|", p) for p in private), private


def test_write_events_gives_the_readme_its_sample_input_and_never_overwrites(tmp_path, capsys):
    import json

    path = tmp_path / "events.jsonl"
    assert main(["demo", "--write-events", str(path)]) == 0
    lines = path.read_text().splitlines()
    horizon, events = load_birdstrikes()
    assert [(json.loads(x)["t"], json.loads(x)["items"]) for x in lines] == events
    assert main(["demo", "--write-events", str(path)]) == 1  # exists: refused
    assert "exists" in capsys.readouterr().err


def test_the_demo_folder_ignores_itself_in_git(tmp_path):
    out = tmp_path / "demo-out"
    assert main(["demo", "--out", str(out), "--zipf-steps", "20", "--zipf-items", "30"]) == 0
    assert (out / ".gitignore").read_text().splitlines()[-1] == "*"
    assert sorted(p.name for p in out.glob("*.png")) == ["birdstrikes.png", "zipf.png"]


def test_demo_caption_names_the_thresholds_delta(capsys):
    """UnkBase pays part of delta outside zCDP (its threshold): the caption says so, in
    the words of ``PrivacyGuarantee.plain`` (a reader adding up rho would miss it)."""
    assert main(["demo", "--no-plot", "--zipf-steps", "20", "--zipf-items", "30"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the caption may wrap
    # the FAA table (UnkBase) has it, the Zipf one (KnownBase, pure zCDP) has not
    assert text.count("of delta for what the noise cannot hide") == 1
