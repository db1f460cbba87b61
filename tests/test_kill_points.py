"""Kill harness: a daily stream killed at every point of a batch resumes to the same bytes.

A 3-batch stream (``--state``, ``--until``; batch 3 ends at the horizon) is
run once without a crash (the reference). Then, from the files the batches
before it left, batch k runs in a forked child that SIGKILLs itself
(:mod:`dpstream._crashpoints`) just before its N-th SQLite statement, for
every N in turn; just before its N-th write of a published file (releases,
metadata sidecar, release ledger); and after half of its N-th write. The enumeration stops
at the first N the run outlives, so every point is covered, none sampled.
After each kill the same command must give the reference's output, sidecar
and state, and the later batches the reference's bytes; the next batch's
command run first instead must change nothing and say what to give.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dpstream._crashpoints import ENV
from dpstream.cli import main

from .conftest import UNKNOWN_CLI, fixed_key

STEPS, BATCHES = 3, 3
T = STEPS * BATCHES
MECHS = {
    "unknown": [*UNKNOWN_CLI, "--remember"],
    "top-k": ["-m", "top-k", "--k", "2", "--switches", "3", "--rho", "1"],
}
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked child")


def _events(batch: int) -> str:
    """A few events per step over a small domain; the middle step of batch 2 is empty."""
    lines = []
    for t in range((batch - 1) * STEPS + 1, batch * STEPS + 1):
        if t == STEPS + 2:
            continue
        for j in range(1 + t % 3):
            items = [f"w{(t + j) % 5}", f"w{(t * j) % 6}"]
            lines.append(json.dumps({"t": t, "items": sorted(set(items))}) + "\n")
    return "".join(lines)


class Stream:
    """One stream's files in one directory (the state records the output's path)."""

    def __init__(self, base: Path, mech: str, out: str = "out.jsonl") -> None:
        self.out = out
        self.dir = base / "work"
        self.dir.mkdir()
        key = base / "k.key"
        fixed_key(f"kill-{mech}").save(key)
        (base / "domain.txt").write_text("".join(f"w{i}\n" for i in range(6)))
        domain = ["--domain", str(base / "domain.txt")] if mech != "unknown" else []
        self.args = [
            "run",
            "-q",
            "-T",
            str(T),
            *MECHS[mech],
            *domain,
            "--key-file",
            str(key),
            "--no-fsync",
            "-o",
            str(self.dir / out),
            "--ledger",
            str(self.dir / "ledger"),
            "--state",
            str(self.dir / "s.sqlite"),
        ]
        for b in range(1, BATCHES + 1):
            (base / f"day{b}.jsonl").write_text(_events(b))
        self.base = base

    def cmd(self, batch: int) -> list[str]:
        until = ["--until", str(batch * STEPS)] if batch < BATCHES else []
        return [*self.args, "-i", str(self.base / f"day{batch}.jsonl"), *until]

    def save(self, name: str) -> Path:
        saved = self.base / name
        shutil.copytree(self.dir, saved)
        return saved

    def restore(self, saved: Path) -> None:
        shutil.rmtree(self.dir)
        shutil.copytree(saved, self.dir)

    def outcome(self) -> dict[str, object]:
        """The output, the sidecar and everything the state records but its timestamps
        (None for what does not exist yet: a run killed early in batch 1)."""
        files = {
            name: (self.dir / name).read_bytes() if (self.dir / name).exists() else None
            for name in (self.out, f"{self.out}.meta.json", "ledger")
        }
        queries = {
            "run": "SELECT params, key_fingerprint, input, output, summary, "
            "finished IS NOT NULL FROM run",
            "run_id": "SELECT run_id FROM run",
            "steps": "SELECT * FROM steps ORDER BY t",
            "batches": "SELECT * FROM batches ORDER BY n",
            "snapshot": "SELECT t, data FROM snapshot",
        }
        state: dict[str, object] = dict.fromkeys(queries)
        if (self.dir / "s.sqlite").exists():  # (connecting would create it)
            with closing(sqlite3.connect(self.dir / "s.sqlite")) as db:
                for name, query in queries.items():
                    try:
                        state[name] = db.execute(query).fetchall()
                    except sqlite3.OperationalError:  # no such table
                        pass
        return {**files, **state}


def _run_killed(cmd: list[str], point: str) -> int | None:
    """Run ``cmd`` in a forked child armed to SIGKILL itself at ``point``: None if it was
    killed there, else its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.environ[ENV] = point
            code = main(cmd)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return None
    return os.WEXITSTATUS(status)


def _same(got: dict, ref: dict, k: int) -> bool:
    """Equal outcomes. A stream killed in batch 1 starts a new state, with a new random
    run id, which the snapshot's authentication and the release ledger's lines bind:
    those differ (the snapshot's content shows in the next batches' bytes)."""
    if k == 1:
        got, ref = (
            {n: v for n, v in d.items() if n not in ("run_id", "snapshot", "ledger")}
            for d in (got, ref)
        )
    return got == ref


def _stuck_after_kill(
    stream: Stream, k: int, refs: dict[int, dict], killed: Path, capsys: pytest.CaptureFixture[str]
) -> str | None:
    """What is wrong after batch ``k`` was killed (files as in ``killed``), or None.

    The same command must finish batch k to the reference's output, sidecar and state,
    and every later batch must then give the reference's. Run first instead, the next
    batch's command must change nothing and say to give the same input, unless batch k
    had released no step (then it goes on without it, as if batch k never ran).
    """
    if main(stream.cmd(k)) != 0:
        return "the same command fails: " + capsys.readouterr().err.strip()[-200:]
    if not _same(stream.outcome(), refs[k], k):
        return "batch resumed to other bytes or state"
    for b in range(k + 1, BATCHES + 1):
        if main(stream.cmd(b)) != 0 or not _same(stream.outcome(), refs[b], k):
            return f"batch {b} then fails or differs"
    if k < BATCHES:
        stream.restore(killed)
        before = stream.outcome()
        capsys.readouterr()
        if main(stream.cmd(k + 1)) != 0:
            err = capsys.readouterr().err  # batch 1 has no snapshot: its input path is bound
            if not any(
                remedy in err
                for remedy in (
                    "give it the same input",
                    "belongs to a run reading",
                    "Give this run the input those steps were released from",
                    "run it again with that input first",  # killed before its first step
                )
            ):
                return "the next batch's command, run first, is refused: " + err.strip()[-300:]
            after = stream.outcome()
            if after != before:
                return "the next batch's command, refused, changed " + ", ".join(
                    f"{n}: {before[n]} -> {after[n]}"
                    for n in after
                    if after[n] != before[n] and n != "snapshot"
                )
        elif any(row[0] > (k - 1) * STEPS for row in before["steps"] or []) or (
            k == 1 and b"\nL1 " in b"\n" + (before["ledger"] or b"")  # type: ignore[operator]
        ):  # (review 101: a step the ledger holds, the state not, was passed over too)
            return "the next batch's command went on past released steps"
    return None


@pytest.mark.parametrize(
    "mech,k,out",
    [
        ("unknown", 1, "out.jsonl"),
        ("unknown", 2, "out.jsonl"),
        ("unknown", 3, "out.jsonl"),
        ("top-k", 2, "out.jsonl"),
        ("unknown", 1, "out.csv"),  # a header before the first step's rows
    ],
)
def test_a_batch_killed_at_every_statement_and_write_resumes_to_the_same_bytes(
    tmp_path, mech, k, out, capsys
):
    """Batch k of 3 killed at each point; batch 3 ends at the horizon (finishes the run)."""
    stream = Stream(tmp_path, mech, out)
    refs: dict[int, dict] = {}
    for b in range(1, BATCHES + 1):
        if b == k:
            start = stream.save("start")
        assert main(stream.cmd(b)) == 0
        refs[b] = stream.outcome()
    lines = refs[BATCHES][out].count(b"\n")  # type: ignore[union-attr]
    assert (lines >= T if out.endswith(".csv") else lines == T) and refs[BATCHES]["run"][0][-1] == 1

    stuck: list[str] = []
    killed = {}
    for kind in ("sql", "write", "torn"):
        n = 0
        while True:
            n += 1
            point = f"{kind}:{n}"
            stream.restore(start)
            status = _run_killed(stream.cmd(k), point)
            if status is not None:  # the run outlived every point of this kind
                assert status == 0, point
                break
            copy = stream.save(f"killed-{kind}-{n}")
            problem = _stuck_after_kill(stream, k, refs, copy, capsys)
            if problem is not None:
                stuck.append(f"{point}: {problem}")
            shutil.rmtree(copy)
        killed[kind] = n - 1
    # every statement of the batch (its own 3 commits and more); its releases, its
    # ledger lines (one append a step, before the state records the step) and sidecar,
    # and a CSV output's header
    writes = 2 * STEPS + 1 + out.endswith(".csv")
    assert killed["sql"] > 4 * STEPS and killed["write"] == killed["torn"] == writes
    assert not stuck, f"{len(stuck)} of {sum(killed.values())} kill points: {stuck}"


def test_the_same_command_after_its_batch_ended_has_nothing_to_do(tmp_path, capsys):
    """A kill just after a batch's end record commits looks to the operator like any other
    kill: the same command again must succeed without writing anything. Another input
    with the same --until is still refused (it would add nothing)."""
    stream = Stream(tmp_path, "unknown")
    for b in (1, 2):
        assert main(stream.cmd(b)) == 0
    done = stream.outcome()
    capsys.readouterr()
    assert main(stream.cmd(2)) == 0
    assert stream.outcome() == done
    other = [*stream.cmd(2)]
    other[other.index(str(tmp_path / "day2.jsonl"))] = str(tmp_path / "day1.jsonl")
    assert main(other) == 1
    assert "released every step up to --until 6 already" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")  # no digest (as stdin): cannot tell, refused
    other[other.index(str(tmp_path / "day1.jsonl"))] = str(tmp_path / "empty.jsonl")
    assert main(other) == 1
    assert "that run had completed" in capsys.readouterr().err
    assert stream.outcome() == done
    assert main(stream.cmd(3)) == 0
    assert main(stream.cmd(3)) == 0  # a finished stream: nothing to do, as before


@pytest.mark.parametrize("untils", [(3,), (2, 4)])
def test_a_follow_run_killed_between_its_two_records_resumes_with_a_late_event_late(
    tmp_path, capsys, untils
):
    """``--follow`` over a backlog (its steps all due), in one batch or two (``--until``);
    the last batch killed at every statement; then an event for step 2 (3 with two
    batches) comes while it is stopped, so the followed file grew. The same command must
    finish: a step the release ledger holds and the state does not (killed between the
    two records) closes where its ledger record says, so the new event is late, as it
    would have been for the run that released the step; a step not released yet counts
    it. It used to refuse for good: the step closed at the new last line (other input
    than the ledger's), and a second batch was bound to the whole file's bytes."""
    key = tmp_path / "k.key"
    fixed_key("kill-follow").save(key)
    events = [(0, m, "a") for m in range(10, 30)] + [(0, m, "c") for m in range(30, 45)]
    events += [(1, m, "c") for m in range(10, 30)] + [(2, m, "a") for m in range(10, 30)]
    events += [(3, m, "c") for m in range(10, 30)]
    backlog = "".join(
        json.dumps({"ts": f"2026-03-01T0{h}:{m}:00Z", "items": [item]}) + "\n"
        for h, m, item in events
    )
    late_t = 2 if len(untils) == 1 else 3
    late = json.dumps({"ts": f"2026-03-01T0{late_t - 1}:50:00Z", "items": ["c"]}) + "\n"
    work = tmp_path / "w"

    def cmd(until: int) -> list[str]:
        return [
            "run", "-q", *UNKNOWN_CLI, "-T", "6", "--until", str(until), "--key-file", str(key),
            "--no-fsync", "--no-round", "--time-field", "ts", "--start", "2026-03-01T00:00Z",
            "--step", "1h", "--follow", "-i", str(work / "live.jsonl"),
            "-o", str(work / "out.jsonl"), "--state", str(work / "s.sqlite"),
            "--ledger", str(work / "led"),
        ]  # fmt: skip

    def fresh(text: str) -> None:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "live.jsonl").write_text(text)
        for until in untils[:-1]:  # the batches before the killed one, whole
            assert main(cmd(until)) == 0

    refs = {}
    for name, text in (("without", backlog), ("with", backlog + late)):
        fresh(text)
        assert main(cmd(untils[-1])) == 0
        refs[name] = (work / "out.jsonl").read_bytes()
    assert refs["without"] != refs["with"]  # the event changes its step when it is on time

    stuck, seen, n, late_kept = [], [], 0, 0
    while True:
        n += 1
        fresh(backlog)
        if _run_killed(cmd(untils[-1]), f"sql:{n}") is not None:
            break
        with open(work / "live.jsonl", "a") as fh:
            fh.write(late)
        capsys.readouterr()
        if main(cmd(untils[-1])) != 0:
            stuck.append(f"sql:{n}: {capsys.readouterr().err.strip()[-160:]}")
            continue
        got = (work / "out.jsonl").read_bytes()
        if got not in (refs["without"], refs["with"]):
            stuck.append(f"sql:{n}: other releases")
        late_kept += got == refs["without"]
        seen.append(f"{n}:{'late' if got == refs['without'] else 'counted'}")
    assert n > 10 and not stuck, (stuck, seen)
    assert late_kept, seen  # some kill points came after the step was released: it was late


def test_the_recorded_cut_is_the_prefix_whose_digest_the_ledger_holds():
    """``_recorded_cut`` takes each prefix's digest over slices of the step built once:
    the same digest as the prefix built alone, so it finds the ledger's prefix (records
    with escapes and several lines between them too), and None when none matches."""
    import random

    from dpstream.io.chunks import records_step
    from dpstream.io.jsonl import parse_jsonl_line
    from dpstream.run.pipeline import _recorded_cut
    from dpstream.state.digests import StateDigests

    digests = StateDigests(fixed_key("cut"))
    rng = random.Random(3)
    recs = []
    for i in range(1, 80):
        its = ", ".join(f'"x{rng.randint(0, 9)}"' for _ in range(rng.randint(1, 3)))
        text = (
            '{"t": 2, "items": ["caf\\u00e9"]}' if i % 7 == 0 else f'{{"t": 2, "items": [{its}]}}'
        )
        recs.append(parse_jsonl_line(text, 3 * i))

    class _Ledger:
        def __init__(self, mac: str | None) -> None:
            self.mac = mac

        def entry(self, t: int) -> object | None:
            return None if self.mac is None else object()

        def same(self, t: int, mac: str) -> bool:
            return mac == self.mac

    shuffled = rng.sample(recs, len(recs))  # as pending holds them: any order
    for j in (0, 1, 40, len(recs)):
        step = records_step(2, recs[:j])
        ledger = _Ledger(digests.step_input(2, step.lines, step.lengths, step.raw))
        cut = _recorded_cut(ledger, digests, resume_t=1)  # type: ignore[arg-type]
        assert cut is not None and cut(2, shuffled) == (recs[j - 1].line if j else 0)
        assert cut(1, shuffled) is None  # a step on the state's record: not looked for
    assert _recorded_cut(_Ledger("0" * 64), digests, 1)(2, shuffled) is None  # type: ignore[arg-type,misc]
    assert _recorded_cut(_Ledger(None), digests, 1)(2, shuffled) is None  # type: ignore[arg-type,misc]


def test_a_killed_batch_resumed_with_another_top_is_told_to_give_the_killed_runs_top(
    tmp_path, capsys
) -> None:
    """Review 90: a batch killed after some steps and resumed with another --top was
    refused as "another dpstream or numeric library version?": --top is the batch's
    post-processing (the next batch may change it), so the message now names --top and
    --min-value, and the killed run's --top finishes the batch."""
    stream = Stream(tmp_path, "top-k")  # (its domain) as a known histogram, little noise
    at = stream.args.index("-m")
    known = ["-m", "known", "--max-items", "2", "--tau", "1e-4"]
    stream.args[at : at + len(MECHS["top-k"])] = known
    assert _run_killed([*stream.cmd(1), "--top", "3"], "write:6") is None
    written = (stream.dir / stream.out).read_text().splitlines()
    assert len(written) == 2 and len(json.loads(written[0])["released"]) == 3
    capsys.readouterr()
    assert main([*stream.cmd(1), "--top", "2"]) == 1
    err = capsys.readouterr().err
    assert "give the --top and --min-value of the run that wrote it" in err, err
    assert main([*stream.cmd(1), "--top", "3"]) == 0


def _kills(
    stream: Stream, batch: int, start: Path, kind: str, want: Callable[[Stream], bool]
) -> Iterator[int]:
    """Each N of the kill points ``kind:N`` of ``batch`` in turn (from the files saved in
    ``start``) after which ``want(stream)`` holds, the stream's files left as the kill
    left them; it ends at the first N the run outlives."""
    n = 0
    while True:
        n += 1
        stream.restore(start)
        if _run_killed(stream.cmd(batch), f"{kind}:{n}") is not None:
            return
        if want(stream):
            yield n


def _first_step_unrecorded(stream: Stream) -> bool:
    """Whether a kill left a recorded run with no step in the state while the release
    ledger holds lines (its scope, maybe its first step): a kill at the first step."""
    state = stream.outcome()
    return bool(state["run_id"]) and not state["steps"] and state["ledger"] is not None


def test_a_first_batch_killed_twice_at_its_first_step_resumes(tmp_path, capsys):
    """Two kills in a row at the first step of a stream, then the same command: it must
    finish to the reference's bytes, and the next batches too. The second run replaces
    the first's run id in the state; the ledger may hold the first run's scope and
    first step (a kill between the ledger and the state) and the second's. The state
    keeps the replaced run ids, so the third run is let through; it used to be refused
    as "another run" of the scope (--force needed). First kills: every torn write that
    leaves the stream there; second kills: every write and torn write of the next run."""
    stream = Stream(tmp_path, "unknown")
    start = stream.save("start")
    refs: dict[int, dict] = {}
    for b in range(1, BATCHES + 1):
        assert main(stream.cmd(b)) == 0
        refs[b] = stream.outcome()

    tried, stuck = 0, []
    for n1 in _kills(stream, 1, start, "torn", _first_step_unrecorded):
        once = stream.save(f"once-{n1}")
        for kind in ("write", "torn"):
            n2 = 0
            while True:
                n2 += 1
                stream.restore(once)
                if _run_killed(stream.cmd(1), f"{kind}:{n2}") is not None:
                    break
                tried += 1
                capsys.readouterr()
                if main(stream.cmd(1)) != 0:
                    stuck.append(f"torn:{n1}, {kind}:{n2}: " + capsys.readouterr().err[-200:])
                    continue
                for b in range(1, BATCHES + 1):
                    if b > 1 and main(stream.cmd(b)) != 0:
                        stuck.append(f"torn:{n1}, {kind}:{n2}: batch {b} fails")
                    elif not _same(stream.outcome(), refs[b], 1):
                        stuck.append(f"torn:{n1}, {kind}:{n2}: batch {b} differs")
        shutil.rmtree(once)
    assert tried >= 4, tried  # the kills this test is about happened
    assert not stuck, f"{len(stuck)} of {tried}: {stuck}"


@contextlib.contextmanager
def _append_only(path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``path`` made append-only (``chattr +a``, which docs/operations.md suggests for the
    ledger: ``ftruncate`` then fails with EPERM) while the block runs. Where chattr is
    not allowed (not root, a file system without the attribute), ``os.ftruncate`` of
    that file fails as it would, in this process (the forked kills write only by
    appending, as every run does)."""
    made = subprocess.run(["chattr", "+a", str(path)], capture_output=True).returncode == 0
    if not made:
        real = os.ftruncate

        def refuse(fd: int, length: int) -> None:
            if os.path.samefile(f"/proc/self/fd/{fd}", path):
                raise PermissionError(errno.EPERM, "Operation not permitted")
            real(fd, length)

        monkeypatch.setattr(os, "ftruncate", refuse)
    try:
        yield
    finally:
        if made:
            subprocess.run(["chattr", "-a", str(path)], check=True)
        monkeypatch.undo()


def test_a_torn_ledger_line_on_an_append_only_ledger_is_closed_not_cut(tmp_path, monkeypatch):
    """Batch 2 killed in the middle of each of its writes (torn), the ledger then made
    append-only (so the torn line cannot be cut off), and the same command run again,
    killed once more in the middle of each of its writes: then a plain run must finish
    the batch to the reference's output and state, and batch 3 too. The torn line is
    closed with a tag under the key and read past; it used to make every later append
    fail ("cannot append ... Operation not permitted"), the stream stopped for good."""
    stream = Stream(tmp_path, "unknown")
    refs: dict[int, dict] = {}
    for b in range(1, BATCHES + 1):
        if b == 2:
            start = stream.save("start")
        assert main(stream.cmd(b)) == 0
        refs[b] = stream.outcome()
    ledger = stream.dir / "ledger"
    torn_lines, stuck = 0, []

    def ledger_torn(_: Stream) -> bool:  # (not another file)
        return not ledger.read_bytes().endswith(b"\n")

    for n1 in _kills(stream, 2, start, "torn", ledger_torn):
        torn_lines += 1
        once = stream.save(f"once-{n1}")
        for n2 in range(0, 8):
            stream.restore(once)
            with _append_only(ledger, monkeypatch):
                if n2 and _run_killed(stream.cmd(2), f"torn:{n2}") is not None:
                    break
                ok = [main(stream.cmd(b)) == 0 for b in (2, 3)]
                text = ledger.read_bytes()
            got = {k: v for k, v in stream.outcome().items() if k != "ledger"}
            want = {k: v for k, v in refs[3].items() if k != "ledger"}
            if not all(ok) or got != want:
                stuck.append(f"torn:{n1}, then torn:{n2}: {ok}")
            elif text.count(b"\0") < 1:
                stuck.append(f"torn:{n1}, then torn:{n2}: the torn line is not closed")
        shutil.rmtree(once)
    assert torn_lines >= STEPS, torn_lines  # one append a step, each torn in turn
    assert not stuck, stuck


def test_a_line_with_a_nul_byte_is_refused_unless_closed_with_the_key(tmp_path, capsys):
    """A line hidden behind a NUL byte (an edit that would make the ledger read past a
    budget or step line) is refused, and nothing is written; only a closing tag under
    the key reads past a line."""
    stream = Stream(tmp_path, "unknown")
    assert main(stream.cmd(1)) == 0
    before = stream.outcome()
    ledger = stream.dir / "ledger"
    lines = ledger.read_bytes().split(b"\n")
    assert lines[1].startswith(b"B1 ")
    other = fixed_key("another key").derive("release-ledger/v1")
    seals = (b"0" * 32, b"", hmac.digest(other, b"torn line\0" + lines[1], "sha256").hex()[:32])
    for seal in seals:
        edited = [*lines]
        edited[1] += b"\0" + (seal if isinstance(seal, bytes) else seal.encode())
        ledger.write_bytes(b"\n".join(edited))
        capsys.readouterr()
        assert main(stream.cmd(2)) == 1
        assert "line 2 of the release ledger" in capsys.readouterr().err
        assert {k: v for k, v in stream.outcome().items() if k != "ledger"} == {
            k: v for k, v in before.items() if k != "ledger"
        }


def _kill_until(stream: Stream, batch: int, start: Path, want: Callable[[dict], bool]) -> str:
    """The first kill point (sql statements, in order) of ``batch`` after which the
    stream's files satisfy ``want``; the files are left so."""
    n = next(_kills(stream, batch, start, "sql", lambda s: want(s.outcome())), None)
    assert n is not None, "no such kill point"
    return f"sql:{n}"


def test_a_first_batch_killed_after_its_ledger_step_goes_on_only_from_its_input(tmp_path, capsys):
    """Review 101: batch 1 killed between the ledger's record of step 1 and the state's;
    the first batch's file then changed in place (same path). The same command is
    refused at step 1 (released from other input than the ledger's record), its events
    count only with the input that was read; --replace-unfinished gives them up."""
    stream = Stream(tmp_path, "unknown")
    start = stream.save("start")
    _kill_until(
        stream, 1, start, lambda o: not o["steps"] and b"\nL1 " in b"\n" + (o["ledger"] or b"")
    )
    day1 = tmp_path / "day1.jsonl"
    original = day1.read_text()
    day1.write_text(original.replace('"w1"', '"w5"', 1))  # step 1 reads otherwise
    capsys.readouterr()
    assert main(stream.cmd(1)) == 1
    assert "records step 1 of this stream's first run" in capsys.readouterr().err
    assert main([*stream.cmd(1), "--replace-unfinished"]) == 0
    day1.write_text(original)


def test_a_first_batch_killed_after_a_step_finishes_from_a_corrected_file(tmp_path):
    """Review 101: --replace-unfinished with a corrected file at another path was refused
    in batch 1 ("belongs to a run reading day1.jsonl"), as it is not in later batches.
    The corrected file (more events at step 3) finishes the batch to the bytes of an
    uninterrupted run over it."""
    fixed = tmp_path / "fix"
    fixed.mkdir()
    ref = Stream(fixed, "unknown")
    extra = json.dumps({"t": 3, "items": ["w1", "w2"]}) + "\n"
    (fixed / "day1.jsonl").write_text((fixed / "day1.jsonl").read_text() + extra * 6)
    assert main(ref.cmd(1)) == 0
    want = ref.outcome()
    base = tmp_path / "killed"
    base.mkdir()
    stream = Stream(base, "unknown")
    start = stream.save("start")
    _kill_until(stream, 1, start, lambda o: bool(o["steps"]) and len(o["steps"]) < STEPS)
    (base / "day1fix.jsonl").write_text((fixed / "day1.jsonl").read_text())
    cmd = [str(base / "day1fix.jsonl") if x.endswith("day1.jsonl") else x for x in stream.cmd(1)]
    assert main([*cmd, "--replace-unfinished"]) == 0
    got = stream.outcome()
    assert got["out.jsonl"] == want["out.jsonl"] and got["steps"] == want["steps"]


def test_a_ledger_line_longer_than_any_it_writes_is_refused_unsplit(tmp_path, capsys):
    """Review 103: a 50 MB line of spaces was split into 50 million fields (580 MB) before
    it was refused; no line the ledger writes is near 1 MB, so a longer one is refused
    as it is."""
    stream = Stream(tmp_path, "unknown")
    assert main(stream.cmd(1)) == 0
    ledger = stream.dir / "ledger"
    ledger.write_bytes(ledger.read_bytes() + b" " * (2 << 20) + b"\n")
    capsys.readouterr()
    assert main(stream.cmd(2)) == 1
    assert "is no ledger line (2,097,152 bytes; edited?)" in capsys.readouterr().err
