"""The release ledger anchors the noise scope: a new run cannot release a stream again.

Noise is a pure function of (key, noise scope, item, cell, draw). A state and
an output deleted (or restored from a backup taken before the first run) make
the next run a new one, with a new run id but the same key and settings: fed
other data, it released the same steps under the same noise, and the
difference of the two releases was the exact difference of the true counts.
The same with two runs without ``--state`` over different inputs. The ledger
now records each run's keyed scope digest, and a new run whose scope another
run released under is refused before anything is written.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpstream.cli import main

from .conftest import day_event_lines, fixed_key, with_option

STEPS_PER_DAY = 6
T = 3 * STEPS_PER_DAY
WORDS = [f"w{i}" for i in range(8)]


def _day_lines(day: int, seed: int = 11) -> list[str]:
    return day_event_lines(
        day, steps_per_day=STEPS_PER_DAY, words=WORDS, events_per_step=(10, 25), seed=seed
    )


@pytest.fixture
def stream(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("scope").save(key_path)
    (tmp_path / "domain.txt").write_text("\n".join(WORDS) + "\n")
    days = {d: _day_lines(d) for d in (1, 2, 3)}
    for d, lines in days.items():
        (tmp_path / f"day{d}.jsonl").write_text("".join(lines))
        (tmp_path / f"day{d}-cut.jsonl").write_text("".join(lines[5:]))  # 5 events fewer
    base = [
        "run",
        "-q",
        "-m",
        "known",
        "--max-items",
        "2",
        "--rho",
        "1",
        "-T",
        str(T),
        "--domain",
        str(tmp_path / "domain.txt"),
        "--no-round",
        "--no-fsync",
        "--key-file",
        str(key_path),
    ]
    return tmp_path, key_path, base


def _day(base, tmp_path, name, day, out="out.jsonl", state="s.sqlite"):
    cmd = [
        *base,
        "-i",
        str(tmp_path / f"{name}.jsonl"),
        "--until",
        str(day * STEPS_PER_DAY),
        "-o",
        str(tmp_path / out),
    ]
    return [*cmd, "--state", str(tmp_path / state)] if state else cmd


def _releases(path: Path) -> dict[int, dict[str, float]]:
    return {r["t"]: r["released"] for r in map(json.loads, path.read_text().splitlines())}


def _written(tmp_path: Path, out="out.jsonl", state="s.sqlite") -> list[str]:
    return [
        p.name
        for p in (tmp_path / out, tmp_path / f"{out}.meta.json", tmp_path / state)
        if p.exists()
    ]


def _delete(tmp_path: Path, out="out.jsonl", state="s.sqlite") -> None:
    for name in _written(tmp_path, out, state):
        (tmp_path / name).unlink()


def test_a_deleted_state_cannot_release_the_stream_again_from_other_data(stream, capsys):
    """Days 1 and 2 released; the state and the output deleted; days 1..2 again with
    other input (5 events fewer a day): refused, and nothing written (no output, no
    sidecar, no state). Without the ledger's scope line (another ledger) the two
    releases differ by exactly the true counts of the removed events: the attack."""
    tmp_path, key_path, base = stream
    for d in (1, 2):
        assert main(_day(base, tmp_path, f"day{d}", d)) == 0
    published = _releases(tmp_path / "out.jsonl")
    ledger = Path(f"{key_path}.ledger").read_bytes()
    _delete(tmp_path)

    capsys.readouterr()
    assert main(_day(base, tmp_path, "day1-cut", 1)) == 1
    err = capsys.readouterr().err
    assert "same key and settings" in err and "--stream" in err and "--force" in err
    assert "counts one key's runs), or resume the existing one with the --state" in err
    assert _written(tmp_path) == []
    assert Path(f"{key_path}.ledger").read_bytes() == ledger

    # the attack it stops: a fresh ledger lets the new state through, same noise
    other = ["--ledger", str(tmp_path / "elsewhere.ledger")]
    for d in (1, 2):
        assert main([*_day(base, tmp_path, f"day{d}-cut", d), *other]) == 0
    again = _releases(tmp_path / "out.jsonl")
    removed = [json.loads(x) for d in (1, 2) for x in _day_lines(d)[:5]]
    for t in range(1, 2 * STEPS_PER_DAY + 1):
        truth = dict.fromkeys(WORDS, 0)
        for rec in removed:
            if rec["t"] <= t:
                for item in rec["items"]:
                    truth[item] += 1
        for item in WORDS:
            assert published[t][item] - again[t][item] == pytest.approx(truth[item], abs=1e-6)


def test_two_runs_without_state_of_one_key_and_settings(stream, capsys):
    """No --state: the second run of one key and settings over other data (to another
    output) is refused, nothing written; the first run's ledger lines are its keyed
    scope digest and its budget line, sealed (no stream name, no settings in clear)."""
    tmp_path, key_path, base = stream
    base = [*base, "--stream", "clinic-visits"]
    assert main(_day(base, tmp_path, "day1", 3, out="a.jsonl", state=None)) == 0
    text = Path(f"{key_path}.ledger").read_text()
    assert [x[:3] for x in text.splitlines()] == ["S1 ", "B1 "]
    # (outside the sealed payload, whose base64 may spell anything by chance)
    clear = " ".join(f for x in text.splitlines() for i, f in enumerate(x.split(" ")) if i != 4)
    assert "clinic" not in clear and "rho" not in clear and "known" not in clear
    payload = base64.urlsafe_b64decode(text.splitlines()[1].split(" ")[4])
    assert b"clinic" not in payload and b"rho" not in payload
    capsys.readouterr()
    assert main(_day(base, tmp_path, "day2", 3, out="b.jsonl", state=None)) == 1
    assert "same key and settings" in capsys.readouterr().err
    assert _written(tmp_path, out="b.jsonl") == []
    assert Path(f"{key_path}.ledger").read_text() == text
    # the first run's output deleted does not help either
    (tmp_path / "a.jsonl").unlink()
    assert main(_day(base, tmp_path, "day2", 3, out="a.jsonl", state=None)) == 1
    assert not (tmp_path / "a.jsonl").exists()


def test_force_lets_a_repeated_scope_through_with_a_warning(stream, capsys):
    """--force is the operator's word that the earlier release was never published:
    the run goes on, says so, and records its scope too (a third run is refused)."""
    tmp_path, key_path, base = stream
    assert main(_day(base, tmp_path, "day1", 1)) == 0
    _delete(tmp_path)
    capsys.readouterr()
    assert main([*_day(base, tmp_path, "day1-cut", 1), "--force"]) == 0
    err = capsys.readouterr().err
    assert "--force" in err and "never published" in err
    assert (tmp_path / "out.jsonl").read_text().count("\n") == STEPS_PER_DAY
    scopes = [x for x in Path(f"{key_path}.ledger").read_text().splitlines() if x.startswith("S1 ")]
    assert len(scopes) == 2 and len({x.split(" ")[1] for x in scopes}) == 1
    assert main(_day(base, tmp_path, "day2", 2)) == 0  # the forced run goes on
    assert main([*_day(base, tmp_path, "day1", 3, out="c.jsonl", state=None)]) == 1
    assert main([*_day(base, tmp_path, "day1", 3, out="c.jsonl", state=None), "--force"]) == 0


def test_another_stream_name_or_key_is_a_new_stream(stream):
    """The refusal is for the same noise only: another --stream name, another key (on
    the same ledger) or another setting that shapes the noise is allowed."""
    tmp_path, key_path, base = stream
    ledger = ["--ledger", str(tmp_path / "shared.ledger")]
    assert main([*_day(base, tmp_path, "day1", 1), *ledger]) == 0
    _delete(tmp_path)
    assert main([*_day(base, tmp_path, "day1-cut", 1), *ledger, "--stream", "other"]) == 0
    _delete(tmp_path)
    other_key = tmp_path / "k2.key"
    fixed_key("scope-2").save(other_key)
    with_key = [a if a != str(key_path) else str(other_key) for a in base]
    assert main([*_day(with_key, tmp_path, "day1-cut", 1), *ledger]) == 0
    _delete(tmp_path)
    assert main([*_day(with_option(base, "--rho", "0.5"), tmp_path, "day1-cut", 1), *ledger]) == 0
    _delete(tmp_path)
    assert main([*_day(base, tmp_path, "day1-cut", 1), *ledger]) == 1  # the first again


def test_resuming_and_continuing_the_same_state_is_allowed(stream, monkeypatch):
    """Daily batches go on with their state; a run killed right after its first ledger
    append (the scope line and step 1, before the state recorded step 1) resumes with
    the same command, to the bytes of an uninterrupted run."""
    from dpstream.state import Checkpoint

    tmp_path, key_path, base = stream
    ref = ["--ledger", str(tmp_path / "ref.ledger")]
    for d in (1, 2, 3):
        assert (
            main([*_day(base, tmp_path, f"day{d}", d, out="ref.jsonl", state="r.sqlite"), *ref])
            == 0
        )
    commit = Checkpoint.commit

    def killed_at_1(self, t, **kw):
        if t == 1:
            raise KeyboardInterrupt  # as a kill right after the ledger's first append
        return commit(self, t, **kw)

    monkeypatch.setattr(Checkpoint, "commit", killed_at_1)
    assert main(_day(base, tmp_path, "day1", 1)) == 130
    monkeypatch.setattr(Checkpoint, "commit", commit)
    lines = Path(f"{key_path}.ledger").read_text().splitlines()
    assert [x[:3] for x in lines] == ["S1 ", "B1 ", "L1 "]
    with closing(sqlite3.connect(tmp_path / "s.sqlite")) as db:
        assert db.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 0
    for d in (1, 2, 3):
        assert main(_day(base, tmp_path, f"day{d}", d)) == 0
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_a_state_restored_to_before_its_first_step_cannot_start_again(stream, monkeypatch, capsys):
    """A state saved after its run was recorded but before its first step (it looks
    like a kill between the ledger and the state), restored once the run released day
    1: the ledger holds more than that run's first step, so a new run from it is
    refused."""
    from dpstream.state import Checkpoint

    tmp_path, key_path, base = stream
    commit = Checkpoint.commit
    saved = tmp_path / "saved.sqlite"

    def backed_up_at_1(self, t, **kw):
        if t == 1:
            with closing(sqlite3.connect(saved)) as copy:
                self._db.backup(copy)
        return commit(self, t, **kw)

    monkeypatch.setattr(Checkpoint, "commit", backed_up_at_1)
    assert main(_day(base, tmp_path, "day1", 1)) == 0
    monkeypatch.setattr(Checkpoint, "commit", commit)
    _delete(tmp_path)
    saved.chmod(0o600)
    saved.rename(tmp_path / "s.sqlite")
    with closing(sqlite3.connect(tmp_path / "s.sqlite")) as db:
        assert db.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 0
    before = (tmp_path / "s.sqlite").read_bytes()
    capsys.readouterr()
    assert main(_day(base, tmp_path, "day1-cut", 1)) == 1
    assert "same key and settings" in capsys.readouterr().err
    assert _written(tmp_path) == ["s.sqlite"]
    assert (tmp_path / "s.sqlite").read_bytes() == before


def test_a_stream_begun_before_scope_lines_gets_its_line_when_it_goes_on(stream, capsys):
    """A ledger written before runs recorded their scope (its scope and budget lines
    removed here: a budget line names the scope too): the stream's next batch records
    it, and a new state of that scope is then refused."""
    tmp_path, key_path, base = stream
    assert main(_day(base, tmp_path, "day1", 1)) == 0
    ledger = Path(f"{key_path}.ledger")
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join(x for x in lines if not x.startswith(("S1 ", "B1 "))))
    assert main(_day(base, tmp_path, "day2", 2)) == 0
    assert sum(x.startswith("S1 ") for x in ledger.read_text().splitlines()) == 1
    _delete(tmp_path)
    capsys.readouterr()
    assert main(_day(base, tmp_path, "day1-cut", 1)) == 1
    assert "same key and settings" in capsys.readouterr().err
    assert _written(tmp_path) == []


@pytest.mark.parametrize(
    "mech",
    [
        ["-m", "known", "--max-items", "1"],
        ["-m", "unknown", "--max-items", "1", "--threshold-delta", "0.3"],
        ["-m", "top-k", "--k", "1", "--switches", "2"],
        ["-m", "top-k", "--k", "1", "--switches", "2", "--max-items", "1"],  # KnownBase top-k
        ["-m", "meta", "--max-items", "1", "--oneshot", "gaussian"],
    ],
)
def test_every_mechanism_names_its_exact_noise_scope(tmp_path, mech, capsys):
    """The scope is the mechanism's noise purpose, not just the stream name: the same
    settings again are refused, while a setting that changes the noise (the budget) is
    a new scope and goes on."""
    key_path = tmp_path / "k.key"
    fixed_key("scope-mech").save(key_path)
    (tmp_path / "domain.txt").write_text("a\nb\nc\n")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["b"]}\n')
    domain = [] if mech[1] == "unknown" else ["--domain", str(tmp_path / "domain.txt")]
    cmd = [
        "run",
        "-q",
        "-T",
        "4",
        *mech,
        *domain,
        "--key-file",
        str(key_path),
        "-i",
        str(tmp_path / "ev.jsonl"),
        "--no-fsync",
    ]
    assert main([*cmd, "--rho", "1", "-o", str(tmp_path / "a.jsonl")]) == 0
    assert main([*cmd, "--rho", "2", "-o", str(tmp_path / "b.jsonl")]) == 0
    capsys.readouterr()
    assert main([*cmd, "--rho", "1", "-o", str(tmp_path / "c.jsonl")]) == 1
    assert "same key and settings" in capsys.readouterr().err


def test_a_state_under_another_run_id_or_a_scope_line_deleted_is_refused(stream, capsys):
    """Review 99, without the key: (1) the state's run id is not sealed, so a state
    edited to another run id (its snapshot deleted, the output cut back to day 1) was
    "a run the ledger held none of": warned, adopted, and day 2's steps were released
    again under the same noise from other input, publishing the exact difference of the
    true counts. (2) Deleting the ledger's one scope line let a second stream of the
    scope through. (3) A budget line renamed to another kind was skipped, hiding its
    cost. Each is refused now, and nothing is written."""
    import sqlite3
    from contextlib import closing

    tmp_path, key_path, base = stream
    ledger = Path(f"{key_path}.ledger")
    assert main(_day(base, tmp_path, "day1", 1)) == 0
    day1 = (tmp_path / "out.jsonl").read_bytes()
    assert main(_day(base, tmp_path, "day2", 2)) == 0
    with closing(sqlite3.connect(tmp_path / "s.sqlite")) as db, db:
        db.execute("UPDATE run SET run_id = '00112233445566778899aabbccddeeff'")
        db.execute("DELETE FROM snapshot")
        db.execute(f"DELETE FROM steps WHERE t > {STEPS_PER_DAY}")
        db.execute("DELETE FROM batches WHERE n > 1")
    (tmp_path / "out.jsonl").write_bytes(day1)
    before = ledger.read_bytes()
    capsys.readouterr()
    assert main(_day(base, tmp_path, "day1", 2)) == 1  # (its events: none after day 1)
    err = capsys.readouterr().err
    assert "1 other run(s) of the same key and settings" in err, err
    assert ledger.read_bytes() == before and (tmp_path / "out.jsonl").read_bytes() == day1

    # (2) a second stream of the scope, with the scope line deleted (no key needed)
    lines = before.split(b"\n")
    ledger.write_bytes(b"\n".join(x for x in lines if not x.startswith(b"S1 ")))
    assert main(_day(base, tmp_path, "day1-cut", 1, out="b.jsonl", state="b.sqlite")) == 1
    assert "same key and settings" in capsys.readouterr().err
    assert not (tmp_path / "b.jsonl").exists()

    # (3) a budget line renamed to a kind the ledger does not know, or to a step line
    for kind in (b"X1 ", b"L1 "):
        ledger.write_bytes(before.replace(b"\nB1 ", b"\n" + kind, 1))
        assert main(["budget", "--key-file", str(key_path)]) == 1
        assert "is no ledger line (edited?)" in capsys.readouterr().err
    ledger.write_bytes(before + b"\n")  # an empty line hides nothing: read past
    assert main(["budget", "--key-file", str(key_path)]) == 0


def test_a_state_given_the_run_id_of_a_run_it_forced_over_is_refused(stream, capsys):
    """Review 100: run R1 released day 1; its state lost, day 1 was run again with
    --force (R2), then day 2. A state edited to R1's run id (its snapshot and later
    steps deleted, the output cut back) matched R1's steps in the ledger and went on:
    day 2's steps again under the same noise. A run is refused past a step another run
    of its scope released (--force: the operator's word), while R2 goes on."""
    import sqlite3
    from contextlib import closing

    tmp_path, key_path, base = stream
    state = tmp_path / "s.sqlite"
    assert main(_day(base, tmp_path, "day1", 1)) == 0
    with closing(sqlite3.connect(state)) as db:
        (r1,) = db.execute("SELECT run_id FROM run").fetchone()
    _delete(tmp_path)
    assert main([*_day(base, tmp_path, "day1", 1), "--force"]) == 0
    day1 = (tmp_path / "out.jsonl").read_bytes()
    saved = state.read_bytes()
    assert main(_day(base, tmp_path, "day2", 2)) == 0  # R2 goes on (R1 is behind it)
    with closing(sqlite3.connect(state)) as db, db:
        db.execute("UPDATE run SET run_id = ?", (r1,))
        db.execute("DELETE FROM snapshot")
        db.execute(f"DELETE FROM steps WHERE t > {STEPS_PER_DAY}")
        db.execute("DELETE FROM batches WHERE n > 1")
    (tmp_path / "out.jsonl").write_bytes(day1)
    capsys.readouterr()
    assert main(_day(base, tmp_path, "day1", 2)) == 1
    assert f"released steps after step {STEPS_PER_DAY}" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == day1
    assert saved  # (R2's own state, restored, would go on: the ledger holds its steps)


def test_overwriting_an_output_is_not_a_statement_that_it_was_never_published(stream, capsys):
    """Review 113 (medium): a daily job without --state that writes the same output was
    told "pass --force to overwrite it", and that --force, kept in the job, also let the
    replay of the noise scope through: day 2 went out with day 1's noise over other
    events (their difference was the exact count difference), and the budget counted
    one release. The output's refusal now names --overwrite, which replaces the file
    and nothing more: the ledger still refuses a second run of the key and settings,
    until --force says that day 1 was never published."""
    tmp_path, key_path, base = stream
    assert main(_day(base, tmp_path, "day1", 1, state=None)) == 0
    published = _releases(tmp_path / "out.jsonl")
    fixed_key("scope, day 2").save(tmp_path / "k2.key")
    other_key = _day(base, tmp_path, "day1-cut", 1, state=None)
    other_key[other_key.index(str(key_path))] = str(tmp_path / "k2.key")
    capsys.readouterr()
    assert main(other_key) == 1  # the output holds releases (the ledger has no objection)
    err = capsys.readouterr().err
    assert "already holds releases" in err and "--overwrite" in err and "--force" not in err
    ledger = Path(f"{key_path}.ledger").read_bytes()
    assert main([*_day(base, tmp_path, "day1-cut", 1, state=None), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "same key and settings" in err and "--force" in err
    assert _releases(tmp_path / "out.jsonl") == published
    assert Path(f"{key_path}.ledger").read_bytes() == ledger
    assert main([*other_key, "--overwrite"]) == 0  # another key's stream replaces the file
    assert _releases(tmp_path / "out.jsonl") != published
