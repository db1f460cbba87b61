"""A run's files by every name they have: the key's ledger through links, SQLite's side files.

Review 51 found two ways around the checks that keep a run from replaying noise
or destroying a file:

* the default ledger was ``KEY-FILE.ledger`` for the key's path *as given*: a
  symbolic link to the key found a fresh ledger, so the noise-replay refusal and
  ``--budget-cap`` let a second run over other data through (the difference of
  the two releases was the exact difference of the true counts). The ledger is
  now named after the key's resolved path, and a ledger left beside the name as
  given is refused, not silently ignored;
* the same-file checks did not know the files SQLite writes beside the state
  (``STATE-wal``, ``STATE-shm``, ``STATE-journal``) and deletes when it closes:
  ``-i s.sqlite-wal --state s.sqlite`` deleted the input, ``--ledger
  t.sqlite-wal --state t.sqlite`` the ledger. They are now the state's files in
  every check (the ledger is a text file: it has none).

Each test runs the review's scenario through ``dpstream.cli.main``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dpstream.cli import main
from dpstream.ledger import default_ledger_path
from dpstream.run.config import RunConfig
from dpstream.run.output import run_files

from .conftest import fixed_key

T = 20
RUN = [
    "run", "-q", "-m", "known", "-T", str(T), "--max-items", "1", "--epsilon", "1",
    "--delta", "1e-6", "--no-fsync",
]  # fmt: skip


def _events(path: Path, seed: int, per_step: int = 3) -> None:
    """Simulated events (a seeded generator; never a release): ``per_step`` a step."""
    r = random.Random(seed)
    with path.open("w") as fh:
        for t in range(1, T + 1):
            for _ in range(per_step):
                row = {"t": t, "user": f"u{r.randint(1, 5)}", "items": [r.choice("abc")]}
                fh.write(json.dumps(row) + "\n")


@pytest.fixture
def place(tmp_path, monkeypatch, key_registry):
    """A key, a domain and two inputs in ``tmp_path`` (the working directory, so paths
    are relative, as an operator types them), with a key registry of the test's own."""
    monkeypatch.chdir(tmp_path)
    fixed_key("run-paths").save(tmp_path / "k.key")
    (tmp_path / "dom.txt").write_text("a\nb\nc\n")
    _events(tmp_path / "ev.jsonl", seed=1)
    _events(tmp_path / "other.jsonl", seed=2)
    os.symlink("k.key", tmp_path / "link.key")
    return tmp_path


def _run(key: str, src: str, out: str, *more: str) -> int:
    return main([*RUN, "--domain", "dom.txt", "--key-file", key, "-i", src, "-o", out, *more])


def _true_counts(path: Path) -> list[Counter[str]]:
    """The running totals of each step (brute force)."""
    by_step: dict[int, list[str]] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        by_step.setdefault(event["t"], []).extend(event["items"])
    total: Counter[str] = Counter()
    out = []
    for t in range(1, T + 1):
        total.update(by_step.get(t, []))
        out.append(Counter(total))
    return out


# -- A: the key's ledger, whatever the key file's name -------------------------------------


def test_a_link_to_the_key_finds_its_ledger_and_cannot_replay_the_noise(place, capsys):
    budget = ["--dataset", "D", "--budget-cap", "1.5"]
    assert _run("k.key", "ev.jsonl", "r1.jsonl", *budget) == 0
    capsys.readouterr()
    assert _run("link.key", "other.jsonl", "r3.jsonl", *budget) == 1
    err = capsys.readouterr().err
    assert "records 1 earlier run(s)" in err and err.count("\n") == 1
    assert not Path("r3.jsonl").exists() and not Path("link.key.ledger").exists()
    # the same key and settings released over other data: what the refusals prevent (a
    # ledger of its own is refused too while the registry knows the key's: review 107)
    assert _run("k.key", "other.jsonl", "r3.jsonl", "--ledger", "apart.ledger") == 1
    assert "--ledger names another file" in capsys.readouterr().err
    assert not Path("r3.jsonl").exists() and not Path("apart.ledger").exists()
    os.environ["DPSTREAM_KEY_REGISTRY"] = "off"  # (monkeypatched: undone after the test)
    assert _run("k.key", "other.jsonl", "r3.jsonl", "--ledger", "apart.ledger") == 0
    r1 = [json.loads(x)["released"] for x in Path("r1.jsonl").read_text().splitlines()]
    r3 = [json.loads(x)["released"] for x in Path("r3.jsonl").read_text().splitlines()]
    a, b = _true_counts(place / "ev.jsonl"), _true_counts(place / "other.jsonl")
    cells = [(t, i) for t in range(T) for i in "abc" if r1[t][i] > 0 and r3[t][i] > 0]
    assert cells and all(r1[t][i] - r3[t][i] == a[t][i] - b[t][i] for t, i in cells)


def test_a_link_to_the_key_counts_against_the_same_budget(place, capsys):
    assert _run("k.key", "ev.jsonl", "r1.jsonl", "--dataset", "D") == 0
    capsys.readouterr()
    # another stream (its own noise) on the same dataset: the cap of 1.5 leaves no room
    capped = ["--dataset", "D", "--budget-cap", "1.5", "--stream", "second"]
    assert _run("link.key", "other.jsonl", "r2.jsonl", *capped) == 1
    err = capsys.readouterr().err
    assert "would pass its budget cap" in err and err.count("\n") == 1
    assert not Path("r2.jsonl").exists()
    assert main(["budget", "--key-file", "link.key", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["D"]["releases"] == 1


def test_every_name_of_the_key_gives_one_ledger_path(place):
    assert default_ledger_path("k.key") == "k.key.ledger"  # as given: messages unchanged
    assert default_ledger_path("./k.key") == "./k.key.ledger"
    assert default_ledger_path("link.key") == f"{place / 'k.key'}.ledger"
    os.mkdir("keys")
    os.symlink("../link.key", "keys/chain.key")  # a link to a link
    assert default_ledger_path("keys/chain.key") == f"{place / 'k.key'}.ledger"
    cfg = RunConfig.from_args(
        _args("--key-file", "keys/chain.key", "-i", "ev.jsonl", "-o", "o.jsonl")
    )
    assert dict(run_files(cfg)[1])["--ledger"] == f"{place / 'k.key'}.ledger"


def _args(*argv: str):
    from dpstream.cli import build_parser

    return build_parser().parse_args([*RUN, "--domain", "dom.txt", *argv])


@pytest.mark.parametrize("resolved_exists", [True, False])
def test_a_ledger_beside_the_link_is_refused_not_forgotten(place, capsys, resolved_exists):
    # what a dpstream that did not follow links left: a ledger named after the link
    assert _run("k.key", "ev.jsonl", "r1.jsonl", "--ledger", "link.key.ledger") == 0
    if resolved_exists:
        more = ("--stream", "first", "--ledger", "k.key.ledger")  # a second ledger, as
        with pytest.MonkeyPatch.context() as mp:  # an older dpstream left it
            mp.setenv("DPSTREAM_KEY_REGISTRY", "off")
            assert _run("k.key", "ev.jsonl", "r0.jsonl", *more) == 0
        assert Path("k.key.ledger").exists()
    before = Path("link.key.ledger").read_bytes()
    capsys.readouterr()
    assert _run("link.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'link.key.ledger'" in err and "--ledger PATH" in err
    resolved = f"{place / 'k.key'}.ledger"
    assert f"{resolved!r}" in err
    assert ("both" in err and "append the lines" in err) == resolved_exists
    assert ("move 'link.key.ledger' to" in err) == (not resolved_exists)
    assert not Path("r2.jsonl").exists() and Path("link.key.ledger").read_bytes() == before
    assert main(["budget", "--key-file", "link.key"]) == 1  # budget and plan read it too
    assert "'link.key.ledger'" in capsys.readouterr().err
    plan = ["plan", "-m", "known", "-T", str(T), "--domain", "dom.txt", "--max-items", "1"]
    plan += ["--epsilon", "1", "--delta", "1e-6", "--key-file", "link.key", "--dataset", "D"]
    assert main(plan) == 1
    assert "'link.key.ledger'" in capsys.readouterr().err
    # the operator's answer: the ledger named with --ledger
    more = ("--stream", "second", "--ledger", "link.key.ledger")
    assert _run("link.key", "other.jsonl", "r2.jsonl", *more) == 0


def test_a_ledger_beside_the_link_that_is_the_ledger_is_used(place):
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    os.symlink("k.key.ledger", "link.key.ledger")  # one file by two names: no question
    assert _run("link.key", "other.jsonl", "r2.jsonl") == 1  # its scope is on record
    assert _run("link.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 0
    assert Path("k.key.ledger").read_text().count("S1 ") == 2


def test_release_frame_with_a_link_to_the_key_finds_its_ledger(place):
    pa = pytest.importorskip("pyarrow")
    import dpstream

    rows = [json.loads(x) for x in Path("ev.jsonl").read_text().splitlines()]
    frame = pa.table({"t": [r["t"] for r in rows], "items": [r["items"] for r in rows]})
    settings = {"horizon": T, "max_items": 1, "epsilon": 1.0, "delta": 1e-6, "domain": "dom.txt"}
    dpstream.release_frame(frame, "known", key="k.key", **settings)
    with pytest.raises(Exception, match="records 1 earlier run"):
        dpstream.release_frame(frame, "known", key="link.key", **settings)
    assert not Path("link.key.ledger").exists()


# -- B: SQLite's side files of the state are the state's files ---------------------------


@pytest.mark.parametrize(
    "role, side",
    [
        ("--input", "-wal"),
        ("--ledger", "-wal"),
        ("--output", "-shm"),
        ("--key-file", "-journal"),
        ("--domain", "-wal"),
    ],
)
def test_a_file_of_the_run_at_a_side_file_of_the_state_is_refused(place, capsys, role, side):
    state = "s.sqlite"
    path = f"{state}{side}"
    files = {"--input": "ev.jsonl", "--ledger": "l.ledger", "--output": "o.jsonl"}
    files |= {"--key-file": "k.key", "--domain": "dom.txt"}
    source = {"--input": "ev.jsonl", "--key-file": "k.key", "--domain": "dom.txt"}.get(role)
    if source is not None:  # the operator's file, under the side file's name
        Path(path).write_bytes(Path(source).read_bytes())
        os.chmod(path, 0o600)  # as private as the key must be
    files[role] = path
    before = Path(path).read_bytes() if Path(path).exists() else None
    argv = [*RUN, "--input-format", "jsonl", "--output-format", "jsonl", "--state", state]
    for option, value in files.items():
        argv += [option, value]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--state's SQLite side file {path!r}" in err and f"{role} {path!r}" in err
    assert "is the same file as" in err and err.count("\n") == 1
    assert not Path(state).exists()  # refused before anything was opened
    assert (Path(path).read_bytes() if Path(path).exists() else None) == before
    assert not Path("o.jsonl").exists() and not Path("l.ledger").exists()


def test_the_ledger_at_a_side_file_of_the_state_is_kept_and_refuses_a_replay(place, capsys):
    """The review's scenario: the ledger at ``t.sqlite-wal`` was deleted when the state
    closed, and a new state over other data then released the same noise again."""
    common = ["--ledger", "t.sqlite-wal", "--stream", "x"]
    assert _run("k.key", "ev.jsonl", "o2.jsonl", "--state", "t.sqlite", *common) == 1
    assert "--state's SQLite side file" in capsys.readouterr().err
    assert not Path("t.sqlite").exists() and not Path("o2.jsonl").exists()
    assert _run("k.key", "ev.jsonl", "o2.jsonl", "--state", "t1.sqlite", *common) == 0
    assert Path("t.sqlite-wal").stat().st_size > 0
    capsys.readouterr()
    assert _run("k.key", "other.jsonl", "o3.jsonl", "--state", "t2.sqlite", *common) == 1
    assert "records 1 earlier run(s)" in capsys.readouterr().err
    assert not Path("o3.jsonl").exists()


def test_the_side_files_of_a_state_behind_a_link_are_its_target_s(place, capsys):
    """SQLite names the side files after the file a link points to."""
    os.close(os.open("real.sqlite", os.O_WRONLY | os.O_CREAT, 0o600))  # a new state
    os.symlink("real.sqlite", "s.sqlite")
    Path("real.sqlite-wal").write_bytes(Path("ev.jsonl").read_bytes())
    argv = ["--input-format", "jsonl", "--state", "s.sqlite", "--ledger", "l.ledger"]
    assert _run("k.key", "real.sqlite-wal", "o.jsonl", *argv) == 1
    err = capsys.readouterr().err
    side = str(place / "real.sqlite-wal")  # the link's target's side file, by its path
    assert f"--state's SQLite side file {side!r} is the same file as --input" in err
    assert Path("real.sqlite-wal").read_bytes() == Path("ev.jsonl").read_bytes()
    assert Path("real.sqlite").read_bytes() == b""  # not opened as a database


def test_the_output_s_sidecar_cannot_be_the_state(place, capsys):
    assert _run("k.key", "ev.jsonl", "o.jsonl", "--state", "o.jsonl.meta.json") == 1
    err = capsys.readouterr().err
    assert "--state 'o.jsonl.meta.json' is the same file as --output's sidecar" in err
    assert not Path("o.jsonl.meta.json").exists() and not Path("o.jsonl").exists()


def test_spark_s_force_guard_is_given_the_side_files(place):
    """``run_files`` is the list Spark's ``--force`` guard keeps out of a replaced
    output directory (:func:`dpstream.spark.output.check_output`)."""
    cfg = RunConfig.from_args(
        _args("--key-file", "k.key", "-i", "e.jsonl", "-o", "o.jsonl", "--state", "d/s.sqlite")
    )
    reads, records = run_files(cfg)
    guarded = {path for _, path in [*reads, *records]}
    assert {f"d/s.sqlite{s}" for s in ("-wal", "-shm", "-journal")} <= guarded


# -- C: a copy of the key finds its key's ledger (dpstream.ledger_registry) -------------


def _released(path: str) -> list[dict[str, int]]:
    return [json.loads(x)["released"] for x in Path(path).read_text().splitlines()]


def test_a_copy_of_the_key_is_sent_to_its_ledger(place, capsys, monkeypatch):
    """A copy of the key resolves to another file, so its default ledger was a fresh
    one: the scope's refusal let a run over other data through, and the difference of
    the two releases was the difference of the true counts. The registry names the
    key's ledger; the copy is refused before anything is written."""
    shutil.copy("k.key", "copy.key")
    os.mkdir("sub")
    shutil.copy("k.key", "sub/k.key")
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    capsys.readouterr()
    recorded = f"{place / 'k.key'}.ledger"
    for copy in ("copy.key", "sub/k.key"):
        assert _run(copy, "other.jsonl", "r2.jsonl") == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--ledger {recorded!r}" in err
        assert not Path("r2.jsonl").exists() and not Path(f"{copy}.ledger").exists()
    # named with --ledger, the copy meets the scope's refusal of its key's ledger
    assert _run("copy.key", "other.jsonl", "r2.jsonl", "--ledger", recorded) == 1
    assert "records 1 earlier run(s)" in capsys.readouterr().err
    # what the refusal prevents (the registry off: the copy's own fresh ledger)
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", "off")
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 0
    r1, r2 = _released("r1.jsonl"), _released("r2.jsonl")
    a, b = _true_counts(place / "ev.jsonl"), _true_counts(place / "other.jsonl")
    cells = [(t, i) for t in range(T) for i in "abc" if r1[t][i] > 0 and r2[t][i] > 0]
    assert cells and all(r1[t][i] - r2[t][i] == a[t][i] - b[t][i] for t, i in cells)


def test_a_hard_link_of_the_key_is_sent_to_its_ledger(place, capsys):
    """Review 81: a hard link of the key is the same inode under another name, so the
    registry took it for the key file on record and let it use the default ledger beside
    its own name, a fresh one: the same noise over other data (the exact difference of
    the counts), past the dataset's budget cap. It is now refused as a copy is."""
    os.link("k.key", "hard.key")
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    capsys.readouterr()
    assert _run("hard.key", "other.jsonl", "r2.jsonl") == 1
    err = capsys.readouterr().err
    recorded = f"{place / 'k.key'}.ledger"
    assert f"--ledger {recorded!r}" in err
    assert not Path("r2.jsonl").exists() and not Path("hard.key.ledger").exists()
    assert _run("k.key", "other.jsonl", "r3.jsonl", "--stream", "second") == 0  # the key


def test_a_key_moved_with_its_ledger_keeps_its_record(place, capsys):
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    os.mkdir("moved")
    os.rename("k.key", "moved/k.key")
    os.rename("k.key.ledger", "moved/k.key.ledger")  # the recorded ledger is gone
    capsys.readouterr()
    assert _run("moved/k.key", "other.jsonl", "r2.jsonl") == 1  # the moved ledger's scope
    assert "records 1 earlier run(s)" in capsys.readouterr().err
    assert _run("moved/k.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 0
    # the registry now names the moved ledger: a copy left at the old place is refused
    shutil.copy("moved/k.key", "k.key")
    assert _run("k.key", "ev.jsonl", "r3.jsonl", "--stream", "third") == 1
    assert f"{place / 'moved' / 'k.key'}.ledger" in capsys.readouterr().err


def test_the_registry_holds_no_secret_and_an_unwritable_one_only_warns(
    place, capsys, monkeypatch, caplog
):
    import logging

    from dpstream.ledger_registry import registry_dir

    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    folder = Path(registry_dir() or "")
    entry = folder / fixed_key("run-paths").fingerprint()
    secret = Path("k.key").read_text().strip()
    assert sorted(p.name for p in folder.iterdir()) == [entry.name, f"{entry.name}.lock"]
    ledger = os.stat(f"{place / 'k.key'}.ledger")
    ids = f"{ledger.st_dev} {ledger.st_ino} {os.stat(place).st_dev}"  # its identity
    size = ledger.st_size  # its mark: the size the run left it at, and a digest of
    tail = hashlib.sha256(Path("k.key.ledger").read_bytes()[-64:]).hexdigest()[:32]  # its end
    want = f"{place / 'k.key'}.ledger\n{place / 'k.key'}\n{ids}\n{size} {tail}\n"
    assert entry.read_text() == want
    assert all(secret not in p.name + p.read_text() for p in folder.iterdir())
    Path("plain").write_text("")
    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", str(place / "plain" / "keys"))
    with caplog.at_level(logging.WARNING, logger="dpstream"):
        assert _run("k.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 0
    assert caplog.text.count("could not record the key's ledger") == 1  # once a run


def _registry_entry() -> Path:
    from dpstream.ledger_registry import registry_dir

    return Path(registry_dir() or "") / fixed_key("run-paths").fingerprint()


def test_a_copy_is_sent_to_the_ledger_its_key_was_given_with(place, capsys):
    """A key first used with --ledger (shared storage, as the docs advise): a copy run
    without --ledger found a fresh ledger."""
    os.mkdir("shared")
    shutil.copy("k.key", "copy.key")
    assert _run("k.key", "ev.jsonl", "r1.jsonl", "--ledger", "shared/k.ledger") == 0
    capsys.readouterr()
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 1
    assert f"--ledger {str(place / 'shared' / 'k.ledger')!r}" in capsys.readouterr().err
    assert not Path("r2.jsonl").exists()


def test_a_forgotten_ledger_flag_is_refused_not_a_fresh_ledger(place, capsys):
    """Review 106: a key file given --ledger and a --budget-cap, then run once without
    --ledger over one day's changed input, found a fresh default ledger: the same noise
    over other data (the releases' difference was the true counts' difference), each
    ledger within the cap, and `budget` saw no run. Now refused before anything is
    written, by `run`, `plan` and `budget` alike; with the flag the replay is refused."""
    budget = ["--dataset", "sales", "--budget-cap", "1.5"]
    shared = str(place / "secure.ledger")
    assert _run("k.key", "ev.jsonl", "r1.jsonl", "--ledger", shared, *budget) == 0
    capsys.readouterr()
    assert _run("k.key", "other.jsonl", "r2.jsonl", *budget) == 1
    err = capsys.readouterr().err
    assert "named with --ledger, and this run names none" in err and f"{shared!r}" in err
    assert not Path("r2.jsonl").exists() and not Path("k.key.ledger").exists()
    assert main(["budget", "--key-file", "k.key"]) == 1
    assert f"{shared!r}" in capsys.readouterr().err
    assert _run("k.key", "other.jsonl", "r2.jsonl", "--ledger", shared, *budget) == 1
    assert "records 1 earlier run(s)" in capsys.readouterr().err  # the replay, seen
    assert main(["budget", "--key-file", "k.key", "--ledger", shared]) == 0


def test_a_ledger_named_elsewhere_is_refused_while_the_keys_ledger_exists(place, capsys):
    """Review 107: a run with the default ledger, then the same command over other data
    with --ledger naming a fresh file (a relative path typed in another folder, say),
    drew the same noise with only a warning. A ledger moved with `mv` is followed."""
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    capsys.readouterr()
    os.mkdir("elsewhere")
    assert _run("k.key", "other.jsonl", "r2.jsonl", "--ledger", "elsewhere/L") == 1
    err = capsys.readouterr().err
    assert "--ledger names another file" in err and "k.key.ledger" in err
    assert not Path("r2.jsonl").exists() and not Path("elsewhere/L").exists()
    os.rename("k.key.ledger", "elsewhere/L")  # moved: the record follows it
    assert _run("k.key", "other.jsonl", "r2.jsonl", "--ledger", "elsewhere/L") == 1
    assert "records 1 earlier run(s)" in capsys.readouterr().err  # its runs, still seen
    more = ("--ledger", "elsewhere/L", "--stream", "second")
    assert _run("k.key", "other.jsonl", "r2.jsonl", *more) == 0
    assert _run("k.key", "other.jsonl", "r3.jsonl", "--stream", "third") == 1  # the default
    assert "elsewhere/L" in capsys.readouterr().err


def test_a_ledger_that_cannot_be_reached_is_not_replaced(place, capsys):
    """A ledger that cannot be reached is refused as such, and one that is certainly
    gone (no file in a folder that exists) as gone: a volume that is not mounted, or a
    folder renamed, handed the key to the copy, and the original was refused on its
    return."""
    os.mkdir("vol")
    shutil.copy("k.key", "vol/k.key")
    shutil.copy("k.key", "copy.key")
    assert _run("vol/k.key", "ev.jsonl", "r1.jsonl") == 0
    os.rename("vol", "vol.unmounted")
    capsys.readouterr()
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 1
    err = capsys.readouterr().err
    assert "cannot be reached now" in err and "remove the registry entry" in err
    os.rename("vol.unmounted", "vol")
    # a recorded ledger that is not a file (an entry edited to name a folder): refused
    _registry_entry().write_text(f"{place / 'vol'}\n{place / 'vol' / 'k.key'}\n")
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 1
    assert "cannot be reached now" in capsys.readouterr().err
    # the ledger removed (its folder is there): refused too, as gone, until its entry is
    # removed on purpose; then the copy records its own
    _registry_entry().write_text(f"{place / 'vol' / 'k.key.ledger'}\n{place / 'vol' / 'k.key'}\n")
    os.remove("vol/k.key.ledger")
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 1
    assert "which is gone" in capsys.readouterr().err
    _registry_entry().unlink()
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 0


def test_the_first_run_creates_its_ledger_before_it_records_it(place, capsys):
    """The entry and the ledger are made under the registry's lock for the key, so a
    copy starting right after sees a ledger that exists (not one that is "gone"), even
    before the first run appended a line: two first runs cannot both record."""
    from dpstream.ledger import ledger_path

    shutil.copy("k.key", "copy.key")
    assert ledger_path({"key_file": "k.key"}, record=True) == "k.key.ledger"
    assert Path("k.key.ledger").exists() and Path("k.key.ledger").stat().st_size == 0
    assert _run("copy.key", "ev.jsonl", "r1.jsonl") == 1
    err = capsys.readouterr().err
    assert "holds no releases yet" in err and "if none uses it, remove it" in err


def test_the_refusal_says_how_to_merge_two_ledgers_of_one_key(place, capsys):
    """A copy whose own ledger holds lines (runs before the registry): moving the
    recorded ledger over it, as the message said, would have lost those lines."""
    shutil.copy("k.key", "copy.key")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSTREAM_KEY_REGISTRY", "off")  # as before the registry
        assert _run("copy.key", "ev.jsonl", "r0.jsonl", "--stream", "old") == 0
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    capsys.readouterr()
    assert _run("copy.key", "other.jsonl", "r2.jsonl") == 1
    err = capsys.readouterr().err
    assert "both hold releases of this key" in err
    assert f"cat {place / 'copy.key'}.ledger >> {place / 'k.key'}.ledger" in err
    assert "move that ledger" not in err


def test_plan_and_budget_record_only_a_ledger_that_exists(place, capsys):
    """After an upgrade, `dpstream budget --key-file KEY` records the key's ledger;
    neither command makes a ledger file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSTREAM_KEY_REGISTRY", "off")
        assert _run("k.key", "ev.jsonl", "r1.jsonl", "--dataset", "D") == 0
    plan = ["plan", "-m", "known", "-T", str(T), "--domain", "dom.txt", "--max-items", "1"]
    plan += ["--epsilon", "1", "--delta", "1e-6", "--dataset", "D"]
    shutil.copy("k.key", "copy.key")
    assert main([*plan, "--key-file", "copy.key"]) == 0  # nothing recorded: no ledger
    assert not Path("copy.key.ledger").exists() and not _registry_entry().exists()
    assert main(["budget", "--key-file", "k.key"]) == 0
    assert _registry_entry().read_text().startswith(f"{place / 'k.key'}.ledger\n")
    capsys.readouterr()
    assert _run("copy.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 1


def test_a_ledger_path_that_is_no_ledger_is_refused(place, capsys):
    """--ledger naming a finished output, a state or a sidecar appended ledger lines
    into it."""
    assert _run("k.key", "ev.jsonl", "r1.jsonl", "--state", "s.sqlite") == 0
    for other in ("r1.jsonl", "s.sqlite", "r1.jsonl.meta.json"):
        before = Path(other).read_bytes()
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:  # (the registry would refuse any other)
            mp.setenv("DPSTREAM_KEY_REGISTRY", "off")
            code = _run("k.key", "other.jsonl", "r2.jsonl", "--stream", "x", "--ledger", other)
        assert code == 1 and "is not a release ledger" in capsys.readouterr().err
        assert Path(other).read_bytes() == before and not Path("r2.jsonl").exists()


def test_a_relative_registry_is_refused_and_a_relative_xdg_ignored(place, capsys, monkeypatch):
    from dpstream.ledger_registry import registry_dir

    monkeypatch.setenv("DPSTREAM_KEY_REGISTRY", "reg")
    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 1
    assert "is a relative path" in capsys.readouterr().err
    monkeypatch.delenv("DPSTREAM_KEY_REGISTRY")
    monkeypatch.setenv("XDG_STATE_HOME", "state")
    monkeypatch.setenv("HOME", str(place / "home"))
    assert registry_dir() == str(place / "home" / ".local" / "state" / "dpstream" / "keys")


def test_a_key_registry_entry_that_is_no_small_text_file_is_refused(place, capsys):
    """Review 99: the registry entry was read whole, so one linked to /dev/zero used up
    memory until the run was killed, and a binary one gave a bare codec error. Each is
    refused in one line naming the entry, before anything is written."""
    from dpstream.noise import NoiseKey

    entry = Path(os.environ["DPSTREAM_KEY_REGISTRY"]) / NoiseKey.load("k.key").fingerprint()
    entry.parent.mkdir(parents=True, exist_ok=True)
    for make, words in (
        (lambda: entry.symlink_to("/dev/zero"), "is not a regular file"),
        (lambda: entry.write_bytes(b"\xff\xfe\x00ledger\n"), "is not text"),
    ):
        entry.unlink(missing_ok=True)
        make()
        capsys.readouterr()
        assert _run("k.key", "ev.jsonl", "r.jsonl") == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and repr(str(entry)) in err, err
        assert not Path("r.jsonl").exists()
    entry.unlink()


def test_a_registry_that_cannot_be_written_warns_and_its_entries_still_hold(
    place, capsys, monkeypatch, key_registry
):
    """Review 108: a registry folder that exists but cannot be written (a read-only
    home, a folder left to root by sudo) stopped every run, `plan` and `budget` with
    the lock file's error. It is a warning now, and what the registry holds is still
    read: a run with another ledger than the key's is refused as before."""
    import errno
    import tempfile

    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0  # recorded while writable
    real_open = os.open

    def read_only(path, flags, *rest):
        if str(path).startswith(key_registry) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *rest)

    def no_temp(*_, **__):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "open", read_only)
    monkeypatch.setattr(tempfile, "mkstemp", no_temp)
    capsys.readouterr()
    assert _run("k.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 0
    assert "could not record the key's ledger" in capsys.readouterr().err
    assert _run("k.key", "other.jsonl", "r3.jsonl", "--stream", "third", "--ledger", "x") == 1
    assert "--ledger names another file" in capsys.readouterr().err


def test_a_ledger_whose_folder_is_now_another_file_system_is_not_replaced(place, capsys):
    """Review 108: a ledger at the root of a volume that was then unmounted counted as
    deleted (its folder, the bare mount point, exists), so the next run started a new
    ledger there and released the stream again under the same noise. The registry keeps
    the ledger folder's device: a folder on another device now is unreachable."""
    from dpstream.ledger_registry import registry_dir

    assert _run("k.key", "ev.jsonl", "r1.jsonl") == 0
    entry = Path(registry_dir() or "") / fixed_key("run-paths").fingerprint()
    path, key_file, ids, _ = entry.read_text().splitlines()
    dev, ino, folder_dev = ids.split()
    # what an unmounted volume shows: the folder's device is not the one recorded
    entry.write_text(f"{path}\n{key_file}\n{dev} {ino} {int(folder_dev) + 1}\n")
    os.rename("k.key.ledger", "elsewhere.ledger")  # (the file, no longer reachable)
    capsys.readouterr()
    assert _run("k.key", "other.jsonl", "r2.jsonl") == 1
    assert "cannot be reached now" in capsys.readouterr().err
    assert not Path("k.key.ledger").exists() and not Path("r2.jsonl").exists()


def test_a_key_and_ledger_moved_with_their_folder_keep_their_record(place, capsys):
    """Review 108: renaming the folder that holds the key and its ledger was taken for
    an unmounted volume, and refused. The registry knows the ledger's file (device and
    inode): found at the new place, the record follows it, and the replay is refused."""
    os.mkdir("old")
    shutil.copy("k.key", "old/k.key")
    os.unlink("k.key")
    assert _run("old/k.key", "ev.jsonl", "r1.jsonl") == 0
    os.rename("old", "new")
    capsys.readouterr()
    assert _run("new/k.key", "other.jsonl", "r2.jsonl") == 1  # its scope is on record
    assert "records 1 earlier run(s)" in capsys.readouterr().err
    assert _run("new/k.key", "other.jsonl", "r2.jsonl", "--stream", "second") == 0
    assert Path("new/k.key.ledger").read_text().count("S1 ") == 2
