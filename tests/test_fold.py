"""A batch run folds its input into per-step counts as it reads it (dpstream.run.fold):
the same releases and input digests whether its counts stay in memory or are spilled to
a temporary file (``--memory``), and the temporary file never outlives the run (a run
killed outright leaves it in a private directory that the next run removes)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main
from dpstream.run.fold import _merge, parse_size, spread

from .conftest import fixed_key, own_ledger, run_peak

SRC = str(Path(__file__).resolve().parents[1] / "src")
WORDS = [f"w{i}" for i in range(40)]
T = 60


def _input(path: Path, *, users: bool) -> None:
    """Simulated events (a seeded generator): out of time order, records without a
    step (they count in the step before), invalid lines, oversized events, a record
    before any step, records past --until."""
    rng = np.random.default_rng(5)
    lines = ['{"items": ["w1"]}', "not json"]  # before any step: counted in step 1
    for _ in range(900):
        t = int(rng.integers(1, T + 1))
        ev: dict = {"t": t, "items": rng.choice(WORDS, int(rng.integers(1, 5))).tolist()}
        if users:
            ev["user"] = f"u{int(rng.zipf(1.5)) % 30}"
        if rng.random() < 0.05:
            del ev["t"]
        lines.append(json.dumps(ev))
        if rng.random() < 0.01:
            lines.append("{broken")
    path.write_text("\n".join(lines) + "\n")


UNKNOWN = ["-m", "unknown", "--max-items", "3", "--epsilon", "1", "--delta", "1e-6"]
#: a domain of 36 of the 40 words: events with another item are invalid (or cut)
KNOWN = ["-m", "known", "--max-items", "3", "--rho", "1", "--domain", "@DOMAIN"]
TOPK = ["-m", "top-k", "--domain", "@DOMAIN", "--k", "2", "--switches", "3", "--rho", "1"]
META = ["-m", "meta", "--oneshot", "unknown-gumbel", "--k", "2", "--kbar", "4", "--epsilon", "2",
        "--delta", "1e-5"]  # fmt: skip
META_KNOWN = ["-m", "meta", "--oneshot", "gaussian", "--max-items", "3", "--epsilon", "2",
              "--delta", "1e-5", "--domain", "@DOMAIN"]  # fmt: skip


def _run(
    tmp: Path, name: str, extra: list[str], *, users: bool = False, mech: list[str] = UNKNOWN
) -> tuple[bytes, list]:
    domain = tmp / "domain.txt"
    domain.write_text("\n".join(WORDS[:36]) + "\n")
    mech = [str(domain) if a == "@DOMAIN" else a for a in mech]
    key = tmp / "k.key"
    if not key.exists():
        fixed_key("fold").save(key)
    data = tmp / ("users.jsonl" if users else "events.jsonl")
    if not data.exists():
        _input(data, users=users)
    out, state = tmp / f"{name}.jsonl", tmp / f"{name}.state"
    argv = [
        "run", "--quiet", *mech, "-T", str(T), "--until", str(T - 5), "--key-file", str(key),
        "-i", str(data), "-o", str(out), "--state", str(state), "--no-fsync",
        "--max-invalid", "1", *own_ledger(out), *extra,
    ]  # fmt: skip
    if users:
        argv += ["--user-field", "user", "--max-items-per-user", "2", "--max-count-per-item", "2"]
    assert main(argv) == 0
    with closing(sqlite3.connect(state)) as db:
        macs = db.execute("SELECT t, input_mac FROM steps ORDER BY t").fetchall()
    return out.read_bytes(), macs


@pytest.mark.parametrize(
    ("users", "policy", "mech"),
    [
        (False, "skip", UNKNOWN),
        (False, "truncate", UNKNOWN),
        (True, "skip", UNKNOWN),
        (True, "truncate", UNKNOWN),
        (False, "skip", KNOWN),
        (False, "truncate", KNOWN),
        (True, "skip", KNOWN),
        (False, "skip", TOPK),
        (True, "truncate", TOPK),
        (False, "skip", META),
        (False, "truncate", META_KNOWN),
    ],
)
def test_spilled_counts_give_the_same_bytes(tmp_path, monkeypatch, users, policy, mech):
    """A run whose counts are all written to the temporary file (--memory 1k) releases
    the same bytes, and records the same input digests, as one that holds them, and as
    the run that holds every chunk of its input until the end."""
    spill_root = tmp_path / "tmp"
    spill_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_root))
    seen = []
    from dpstream.run import fold

    real = fold.FoldedInput._spill_all

    def spy(self):
        seen.append(1)
        return real(self)

    monkeypatch.setattr(fold.FoldedInput, "_spill_all", spy)
    leads = []
    real_lead = fold.FoldedInput._write_lead

    def spy_lead(self, part):
        leads.append(len(part.errors))
        return real_lead(self, part)

    monkeypatch.setattr(fold.FoldedInput, "_write_lead", spy_lead)
    # a step's bytes read back for its digest 7 bytes at a time: the same digests
    monkeypatch.setattr(fold, "_READ_BLOCK", 7)
    from dpstream.io import jsonl, lines

    # small chunks: a step's records come in many chunks, out of order
    monkeypatch.setattr(jsonl, "line_blocks", lambda s, n, _: lines.line_blocks(s, n, 1500))
    held = _run(tmp_path, "held", ["--on-invalid", policy], users=users, mech=mech)
    assert not seen  # the default budget holds this input's counts
    spilled = _run(
        tmp_path, "spilled", ["--on-invalid", policy, "--memory", "1k"], users=users, mech=mech
    )
    assert seen  # and 1k does not
    assert leads == [2]  # the two records before any step went to the file too
    assert held[0] == spilled[0] and held[0].count(b"\n") >= T - 5
    assert held[1] == spilled[1] and len(held[1]) == T - 5
    assert os.listdir(spill_root) == []
    # the run that holds the input's chunks to the end (its steps grouped from them)
    from dpstream.run import source

    monkeypatch.setattr(source, "_folded", lambda *a: None)
    chunks = _run(tmp_path, "chunks", ["--on-invalid", policy], users=users, mech=mech)
    assert chunks == held


def test_spread_keeps_each_count_in_distinct_events():
    """spread() against brute force: every item in exactly its count of events, never
    twice in one, no event over ceil(total / events)."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        events = int(rng.integers(1, 30))
        k = int(rng.integers(0, 12))
        counts = rng.integers(0, events + 1, k)
        codes, offsets = spread(np.arange(k), counts, events)
        assert offsets.size == events + 1 and offsets[-1] == counts.sum()
        per_event = [codes[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        assert all(len(set(e)) == len(e) for e in per_event)
        cap = -(-int(counts.sum()) // events)
        assert max(map(len, per_event)) <= cap
        assert np.array_equal(np.bincount(codes, minlength=k), counts)


def test_merged_counts_are_exact_in_any_stored_type():
    """_merge against a dict of sums: segments stored as uint8, uint16 and int32 (the
    narrowest type of each), merged again and again, with counts that pass 255 and
    65,535 only once added up."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        truth: dict[int, int] = {}
        held: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(int(rng.integers(1, 6))):
            ids = rng.integers(0, 20, int(rng.integers(0, 40)))
            top = int(rng.choice([3, 250, 60_000, 3_000_000]))
            counts = rng.integers(1, top + 1, ids.size)
            for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
                truth[i] = truth.get(i, 0) + c
            held.append(_merge(ids, counts))
            if rng.random() < 0.5:  # a step's segments merged part-way, as _merge_step does
                held = [_merge(np.concatenate([h[0] for h in held]),
                               np.concatenate([h[1] for h in held]))]  # fmt: skip
        ids, counts = _merge(np.concatenate([h[0] for h in held]),
                             np.concatenate([h[1] for h in held]))  # fmt: skip
        assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == truth
        assert counts.dtype.itemsize <= 4 or int(counts.max()) > 2**31 - 1


def test_parse_size():
    assert parse_size("512M") == 512 << 20
    assert parse_size("2g") == 2 << 30
    assert parse_size("100k") == 102400
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("lots")


def _spill_dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.name.startswith("dpstream-spill-")]


def _open_spill_files() -> list[int]:
    """The modes of this process's open files that were spill files (unlinked)."""
    modes = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "dpstream-spill-" in target and target.endswith(".bin (deleted)"):
                modes.append(stat.S_IMODE(os.fstat(int(fd)).st_mode))
    return modes


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_temporary_file_is_private_and_has_no_name_on_disk(tmp_path, monkeypatch):
    """During the run the counts and the digests' bytes are in an open 0600 file that
    has no name on disk (unlinked with its 0700 directory as soon as it is made), and
    nothing is left once the run ends or fails mid-release (found by review: the file
    and its raw event bytes used to stay on disk while the run held them, and after a
    SIGKILL or SIGTERM)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    from dpstream.run import pipeline

    real = pipeline.public_release
    during = []

    def look(*args, **kwargs):
        if not during:
            during.append((list(root.iterdir()), _open_spill_files()))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "public_release", look)
    _run(tmp_path, "ok", [])
    names, modes = during[0]
    assert names == [] and modes == [0o600]
    assert list(root.iterdir()) == [] and _open_spill_files() == []

    def fail(*args, **kwargs):
        look(*args, **kwargs)
        raise RuntimeError("a failure in the middle of the releases")

    during.clear()
    monkeypatch.setattr(pipeline, "public_release", fail)
    with pytest.raises(RuntimeError):
        _run(tmp_path, "failed", [])
    assert during and list(root.iterdir()) == [] and _open_spill_files() == []


def test_a_killed_run_leaves_nothing_on_disk(tmp_path):
    """SIGKILL mid-release leaves no temporary file or directory (the file had no name
    on disk); a stale directory of an older dpstream is removed by the next run."""
    root = tmp_path / "tmp"
    root.mkdir()
    key = tmp_path / "k.key"
    fixed_key("fold").save(key)
    data = tmp_path / "events.jsonl"
    _input(data, users=False)

    def run(out: str, kill: str | None) -> int:
        env = {**os.environ, "PYTHONPATH": SRC, "TMPDIR": str(root)}
        env.pop("DPSTREAM_TEST_KILL_AT", None)
        if kill:
            env["DPSTREAM_TEST_KILL_AT"] = kill
        argv = [
            sys.executable, "-m", "dpstream", "run", "--quiet", "-m", "unknown", "-T",
            str(T), "--max-items", "3", "--epsilon", "1", "--delta", "1e-6", "--key-file",
            str(key), "-i", str(data), "-o", str(tmp_path / out), "--state",
            str(tmp_path / f"{out}.state"), "--no-fsync", "--max-invalid", "0.5",
            *own_ledger(tmp_path / out),
        ]  # fmt: skip
        return subprocess.run(argv, env=env, capture_output=True).returncode

    assert run("a.jsonl", "write:6") == -9
    assert list(root.iterdir()) == []
    stale = root / "dpstream-spill-999999999-abcd1234"  # an older dpstream's, its process gone
    stale.mkdir(mode=0o700)
    (stale / "x.bin").write_bytes(b"old")
    assert run("b.jsonl", None) == 0
    assert list(root.iterdir()) == []


def test_a_step_read_from_two_chunks_lists_each_item_once():
    """A step whose records straddle two chunks: an item both chunks hold is one item of
    the step, so a user's occurrences of it are one (user, item) pair to the per-user
    bound (with two codes, Linf was applied to each half: more kept than the bound)."""
    from dpstream.io.chunks import StepPart, chunks_from_records, step_input
    from dpstream.io.records import RawEvent

    def chunk(line: int, items: tuple[str, ...]):
        rec = RawEvent(line, 1, items, None, user="u", raw=b"r")
        return next(chunks_from_records([rec]))

    a, b = chunk(1, ("x", "y")), chunk(2, ("y", "x"))
    step = step_input(1, [StepPart(a, 0, 1), StepPart(b, 0, 1)])
    assert sorted(step.items) == ["x", "y"]
    assert [step.items[c] for c in step.codes.tolist()] == ["x", "y", "y", "x"]

    from dpstream.bounding import UserBounds
    from dpstream.mechanisms.columns import EventColumns
    from dpstream.mechanisms.user_bounder import ColumnBounder

    cols = EventColumns(step.items, step.codes, step.offsets)
    bounder = ColumnBounder(UserBounds(max_items_per_user=2, max_count_per_item=1))
    keep, _ = bounder.bound_columns(["u"], np.zeros(2, np.int64), cols.items, cols.codes,
                                    cols.offsets)  # fmt: skip
    assert keep.tolist() == [True, True, False, False]  # each item once (Linf = 1)


def _error_input(path: Path, bad: str) -> None:
    """Valid events in steps 1..T (shuffled within reach), and one invalid record."""
    rng = np.random.default_rng(9)
    lines = []
    for k in range(600):
        t = min(T, k // 10 + 1 + int(rng.integers(0, 3)))
        lines.append(json.dumps({"t": t, "items": rng.choice(WORDS[:36], 2).tolist()}))
    at = {"middle": 300, "past": 500, "lead": 0, "late-step": 250}[bad]
    record = {
        "middle": '{"t": 31, "items": ["w39"]}',  # outside the domain
        "past": '{"t": 58, "items": ["w1"]}',  # after --until 55
        "lead": "not json",  # before any step: in step 1
        "late-step": '{"t": 20, "items": ["w1", "w2", "w3", "w4"]}',  # > --max-items
    }[bad]
    lines.insert(at, record)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("bad", ["middle", "past", "lead", "late-step"])
def test_on_invalid_error_stops_where_the_run_that_holds_its_chunks_stops(
    tmp_path, monkeypatch, capsys, bad
):
    """--on-invalid error over a folded input and over held chunks: the same message,
    naming the first invalid record in the order the run releases, and nothing written
    (review 109: the steps before it were released; a batch has read its whole input by
    then, so it refuses before its first release, as the Spark engine does)."""
    from dpstream.io import jsonl, lines
    from dpstream.run import source

    monkeypatch.setattr(jsonl, "line_blocks", lambda s, n, _: lines.line_blocks(s, n, 1500))
    key = tmp_path / "k.key"
    fixed_key("fold").save(key)
    domain = tmp_path / "domain.txt"
    domain.write_text("\n".join(WORDS[:36]) + "\n")
    data = tmp_path / "events.jsonl"
    _error_input(data, bad)
    results = []
    for name in ("folded", "chunks"):
        if name == "chunks":
            monkeypatch.setattr(source, "_folded", lambda *a: None)
        out = tmp_path / f"{name}.jsonl"
        argv = [
            "run", "--quiet", *KNOWN[:-1], str(domain), "-T", str(T), "--until", str(T - 5),
            "--key-file", str(key), "-i", str(data), "-o", str(out), "--state",
            str(tmp_path / f"{name}.state"), "--no-fsync", "--on-invalid", "error",
            *own_ledger(out),
        ]  # fmt: skip
        code = main(argv)
        err = capsys.readouterr().err
        written = [p.name for p in tmp_path.iterdir() if p.name.startswith(name)]
        ledger = Path(f"{out}.ledger")  # made (empty) when the run opened it
        assert ledger.read_bytes() == b""
        written.remove(ledger.name)
        results.append((code, err, written))
    assert results[0] == results[1]
    line = {"middle": 301, "past": 501, "lead": 1, "late-step": 251}[bad]
    assert results[0][0] == 1 and f"input line {line}:" in results[0][1]
    assert results[0][2] == []  # no output, sidecar or state (a new one is removed)


def test_a_step_s_digest_does_not_hold_its_input(tmp_path):
    """A daily run of one step a day with --state read the step's bytes back whole for
    its digest, and held them three times: a 59 MB step added 188 MB to the run's peak
    (444 MB against 256 MB without --state), so a daily input larger than memory could
    not run. They are read a block (4 MB) at a time. Measured in fresh processes (their
    own peak, VmHWM: ru_maxrss outlives exec): 400,000 events in one step (18 MB) added
    49 MB before (230 MB against 181 MB) and add nothing now (180 MB); the test allows
    25 MB, half of what they added."""
    rng = np.random.default_rng(3)
    words = np.array([f"item{i}" for i in range(100_000)])
    sizes = rng.integers(1, 4, 400_000)  # up to --max-items 3
    picks = words[rng.integers(0, words.size, int(sizes.sum()))]
    ends = np.cumsum(sizes)
    data = tmp_path / "day.jsonl"
    with open(data, "w") as fh:
        for lo, hi in zip(ends - sizes, ends, strict=True):
            fh.write(json.dumps({"t": 1, "items": picks[lo:hi].tolist()}) + "\n")
    key = tmp_path / "k.key"
    fixed_key("fold").save(key)

    def peak(name: str, *extra: str) -> int:
        out = tmp_path / f"{name}.jsonl"
        argv = [
            "run", "--quiet", *UNKNOWN, "-T", "1", "--key-file", str(key), "-i", str(data),
            "-o", str(out), "--no-fsync", *own_ledger(out), *extra,
        ]  # fmt: skip
        code, mb, err = run_peak(argv, {"PYTHONPATH": SRC})
        assert code == 0, err
        return mb

    plain = peak("plain")
    state = peak("state", "--state", str(tmp_path / "s.db"))
    assert state - plain < 25, (plain, state)


@pytest.mark.parametrize("stepped", [True, False])
def test_records_before_any_step_are_held_on_disk_past_the_budget(tmp_path, monkeypatch, stepped):
    """Review 119: a daily run over a file that grows by a day held its earlier days (all
    late: before any record of a step it releases) in memory until the input ended, at
    about 8 times their size, whatever --memory said. Past the budget they now go to the
    temporary file, and the run releases the same bytes and digests as one that holds
    them; also when no record has a step (they are then the run's only records)."""
    from dpstream.run import fold

    key = tmp_path / "k.key"
    fixed_key("fold").save(key)
    lines = [json.dumps({"items": [f"w{i % 7}"]}) for i in range(3000)]  # no step
    if stepped:
        lines += [json.dumps({"t": 1 + i % 5, "items": [f"w{i % 3}"]}) for i in range(500)]
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(lines) + "\n")

    def run(name: str, *extra: str) -> tuple[bytes, list]:
        out, state = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.state"
        argv = [
            "run", "--quiet", *UNKNOWN, "-T", "5", "--key-file", str(key), "-i", str(data),
            "-o", str(out), "--state", str(state), "--no-fsync", "--max-invalid", "1",
            *own_ledger(out), *extra,
        ]  # fmt: skip
        assert main(argv) == 0
        with closing(sqlite3.connect(state)) as db:
            macs = db.execute("SELECT t, input_mac FROM steps ORDER BY t").fetchall()
        return out.read_bytes(), macs

    held = run("held")
    written = []
    real = fold.FoldedInput._write_lead

    def spy(self, part):
        written.append(1)
        return real(self, part)

    monkeypatch.setattr(fold.FoldedInput, "_write_lead", spy)
    spilled = run("spilled", "--memory", "1k")
    assert written and spilled == held
    assert len(held[1]) == 5  # every step released (with no record of a step: empty)
