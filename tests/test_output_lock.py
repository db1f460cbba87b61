"""One run at a time writes an output: a second run is refused before it records anything.

Review finding: two new runs (no ``--state``, different ``--stream``) started together
on one ``-o`` both passed the check that the output held no releases, both recorded
their scope and budget in the release ledger, and truncated and wrote the same file:
it ended with one run's lines and garbage, and both exited 0. A run now holds an
exclusive lock (``.NAME.lock`` beside its output) from before it opens its state to its
last write. Here another process holds that lock, as a run in its first moments would
(before it wrote a byte): no timing is involved.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpstream.cli import main
from dpstream.errors import StateError

from .conftest import UNKNOWN_CLI, fixed_key

T = 6
_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


class Holder:
    """Another process holding the lock file ``path`` until :meth:`release` (or
    :meth:`kill`, which leaves the file behind, as a SIGKILLed run does)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "held\n"  # blocks until it is held

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait() == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdin is not None
        self.proc.stdin.close()


@pytest.fixture
def stream(tmp_path: Path) -> dict[str, Path]:
    """A key, one input, and a shared release ledger that already holds another run."""
    fixed_key("output-lock").save(tmp_path / "k.key")
    lines = [f'{{"t": {t}, "items": ["a{t % 3}"]}}\n' for t in range(1, T + 1)]
    (tmp_path / "ev.jsonl").write_text("".join(lines))
    (tmp_path / "day1.jsonl").write_text("".join(lines[:3]))
    (tmp_path / "day2.jsonl").write_text("".join(lines[3:]))
    files = {"dir": tmp_path, "ledger": tmp_path / "shared.ledger"}
    assert _run(files, tmp_path / "other.jsonl", "--stream", "other") == 0
    return files


def _run(files: dict[str, Path], out: Path, *more: str, src: str = "ev.jsonl") -> int:
    base = files["dir"]
    return main(
        [
            "run",
            "-q",
            *UNKNOWN_CLI,
            "-T",
            str(T),
            "--no-fsync",
            "--key-file",
            str(base / "k.key"),
            "-i",
            str(base / src),
            "-o",
            str(out),
            "--ledger",
            str(files["ledger"]),
            *more,
        ]
    )


def _lock_file(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def _refused(capsys: pytest.CaptureFixture[str], out: Path) -> None:
    err = capsys.readouterr().err
    assert "another run is writing output file" in err and str(out) in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["shared.jsonl", "shared.csv"])
def test_a_new_run_is_refused_while_another_holds_its_output(stream, capsys, name):
    out = stream["dir"] / name
    ledger = stream["ledger"].read_bytes()
    holder = Holder(_lock_file(out))  # a run that has not written its first byte yet
    try:
        assert _run(stream, out, "--stream", "B") == 1
        _refused(capsys, out)
        # nothing recorded, nothing written: not the ledger, not the output or its sidecar
        assert stream["ledger"].read_bytes() == ledger
        assert not out.exists() and not Path(f"{out}.meta.json").exists()
        assert _lock_file(out).exists()  # the refused run leaves the holder's lock alone
    finally:
        holder.release()
    assert _run(stream, out, "--stream", "B") == 0
    rows = out.read_text().splitlines()
    assert len(rows) >= T + name.endswith(".csv") and rows[-1].startswith(
        f"{T}," if name.endswith(".csv") else f'{{"t": {T},'
    )
    assert len(stream["ledger"].read_bytes()) > len(ledger)
    assert not _lock_file(out).exists()  # removed by the run as it finished


def test_a_run_with_a_state_is_refused_before_it_opens_the_state(stream, capsys):
    """A new state is not even made; a resumed one is left as it was."""
    out, state = stream["dir"] / "s.jsonl", stream["dir"] / "s.sqlite"
    day1 = ("--state", str(state), "--until", "3")
    holder = Holder(_lock_file(out))
    try:
        assert _run(stream, out, *day1, src="day1.jsonl") == 1
        _refused(capsys, out)
        assert not state.exists() and not out.exists()
    finally:
        holder.release()
    assert _run(stream, out, *day1, src="day1.jsonl") == 0
    before = [p.read_bytes() for p in (out, state, stream["ledger"])]
    holder = Holder(_lock_file(out))
    try:  # the next batch
        assert _run(stream, out, "--state", str(state), src="day2.jsonl") == 1
        _refused(capsys, out)
        assert [p.read_bytes() for p in (out, state, stream["ledger"])] == before
    finally:
        holder.release()
    assert _run(stream, out, "--state", str(state), src="day2.jsonl") == 0
    assert [row["t"] for row in map(json.loads, out.read_text().splitlines())] == [*range(1, T + 1)]


def test_another_name_of_the_output_shares_its_lock(stream, capsys):
    out = stream["dir"] / "real.jsonl"
    link = stream["dir"] / "link.jsonl"
    link.symlink_to(out.name)
    holder = Holder(_lock_file(out))
    try:
        assert _run(stream, link, "--stream", "B") == 1
        _refused(capsys, link)
        assert not out.exists()
    finally:
        holder.release()


def test_a_killed_runs_lock_file_stops_no_one(stream):
    """The kernel drops a dead process's lock: the file it leaves is locked again."""
    out = stream["dir"] / "k.jsonl"
    holder = Holder(_lock_file(out))
    holder.kill()
    assert _lock_file(out).exists()
    assert _run(stream, out, "--stream", "B") == 0
    assert len(out.read_text().splitlines()) == T
    assert not _lock_file(out).exists()


def test_a_lock_file_removed_while_locking_it_is_locked_again(tmp_path, monkeypatch):
    """A run that locks the file its finishing holder has just removed locks the new one:
    two runs never hold locks on two files of one name."""
    from dpstream.run import lock

    out = tmp_path / "o.jsonl"
    path = _lock_file(out)
    flock = fcntl.flock
    calls = []

    def flock_after_removal(fd: int, op: int) -> None:
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:  # the holder removes it between our open and our lock
            path.unlink()
        flock(fd, op)

    monkeypatch.setattr(lock.fcntl, "flock", flock_after_removal)
    with lock.output_lock(str(out)):
        assert len(calls) == 2 and path.exists()
        monkeypatch.setattr(lock.fcntl, "flock", flock)
        fd = os.open(path, os.O_RDONLY)
        try:  # the file there now is the one held
            with pytest.raises(BlockingIOError):
                flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert not path.exists()


def test_a_file_at_the_lock_files_name_is_never_deleted(tmp_path, capsys):
    """The lock's name holding the run's input is refused before anything (the run
    deleted it), and a file of content there that is no file of the run is refused
    and left as it was (an empty file there is a lock file: locked, then removed)."""
    fixed_key("output-lock").save(tmp_path / "k.key")
    out = tmp_path / "out.jsonl"
    data = b'{"t": 1, "items": ["a"]}\n'
    _lock_file(out).write_bytes(data)
    args = ["run", "-q", *UNKNOWN_CLI, "-T", str(T), "--key-file", str(tmp_path / "k.key")]
    assert main([*args, "-i", str(_lock_file(out)), "-o", str(out)]) == 1
    assert "is the same file as --input" in capsys.readouterr().err
    assert _lock_file(out).read_bytes() == data and not out.exists()
    (tmp_path / "ev.jsonl").write_bytes(data)
    assert main([*args, "-i", str(tmp_path / "ev.jsonl"), "-o", str(out)]) == 1
    assert "holds something else (a lock file is empty)" in capsys.readouterr().err
    assert _lock_file(out).read_bytes() == data and not out.exists()
    _lock_file(out).write_bytes(b"")  # a killed run's lock file
    assert main([*args, "-i", str(tmp_path / "ev.jsonl"), "-o", str(out)]) == 0
    assert out.exists() and not _lock_file(out).exists()


def test_the_lock_file_is_readable_by_all(tmp_path):
    """Made 0644 whatever the umask, so that another user's run can lock the file a
    killed run left (flock needs only a read-only descriptor)."""
    from dpstream.run import lock

    old = os.umask(0o077)
    try:
        with lock.output_lock(str(tmp_path / "o.jsonl")):
            assert (_lock_file(tmp_path / "o.jsonl").stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)


def test_a_link_into_a_folder_that_takes_no_new_file_locks_the_output_itself(tmp_path, monkeypatch):
    """``-o link`` to a file in a folder where the run may write only that file (it
    failed with 'Operation not permitted'): the output itself is the lock, so two
    such links from two folders still exclude each other (a lock file beside each
    link did not), and nothing is made beside either."""
    import errno

    from dpstream.run import lock

    (tmp_path / "tgt").mkdir()
    (tmp_path / "tgt" / "out.jsonl").write_bytes(b"")
    links = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        links.append(tmp_path / name / "out.jsonl")
        links[-1].symlink_to(tmp_path / "tgt" / "out.jsonl")
    real_open = lock._open_lock

    def no_new_file_in_tgt(path: str) -> int:
        if os.path.dirname(path) == str(tmp_path / "tgt"):
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_open(path)

    monkeypatch.setattr(lock, "_open_lock", no_new_file_in_tgt)
    with lock.output_lock(str(links[0])):
        with pytest.raises(StateError, match="holds a lock on output file"):
            with lock.output_lock(str(links[1])):
                pass
    with lock.output_lock(str(links[1])):  # released: it runs
        pass
    assert sorted(p.name for p in (tmp_path / "tgt").iterdir()) == ["out.jsonl"]
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["out.jsonl"]
    (tmp_path / "tgt" / "out.jsonl").unlink()  # no output there, and no way to make one
    with pytest.raises(PermissionError):
        with lock.output_lock(str(links[0])):
            pass


def test_an_output_whose_link_changed_since_the_lock_is_not_written(tmp_path):
    """``-o cur/out.jsonl`` with ``cur -> A`` at the start and ``cur -> B`` by the time
    the output opens: the run holds A's lock, and another run may hold B's."""
    from dpstream.run import lock

    for name in ("A", "B"):
        (tmp_path / name).mkdir()
    cur = tmp_path / "cur"
    cur.symlink_to(tmp_path / "A")
    out = str(cur / "out.jsonl")
    with lock.output_lock(out):
        lock.check_target(out)  # unchanged: fine
        cur.unlink()
        cur.symlink_to(tmp_path / "B")
        with pytest.raises(StateError, match="a link changed"):
            lock.check_target(out)
    lock.check_target(out)  # no lock held: nothing to compare


def test_a_pipe_as_the_output_is_written_not_read(tmp_path):
    """``-o FIFO``: the check that a new output holds no releases opened the pipe to
    read it and waited for a writer for good; a pipe or a device holds nothing. The
    command runs in a child with a reader on the pipe; 120 s is only a guard against a
    hang, far above what the run takes."""
    fixed_key("output-lock").save(tmp_path / "k.key")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n')
    fifo = tmp_path / "ff"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    args = ["run", "-q", *UNKNOWN_CLI, "-T", str(T), "--key-file", str(tmp_path / "k.key")]
    args += ["-i", str(tmp_path / "ev.jsonl"), "-o", str(fifo), "--output-format", "jsonl"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dpstream", *args], capture_output=True, timeout=120
        )
    finally:
        got, _ = reader.communicate(timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(got.splitlines()) == T
    assert not (tmp_path / "ff.meta.json").exists()  # no sidecar beside a pipe or device


def test_a_lock_held_on_the_output_itself_by_another_tool_stops_no_run(tmp_path):
    """A cron job wrapped in ``flock OUTPUT dpstream run ... -o OUTPUT`` runs: the run
    locks ``.NAME.lock``, not the output (a version that locked both refused it)."""
    fixed_key("output-lock").save(tmp_path / "k.key")
    (tmp_path / "ev.jsonl").write_text('{"t": 1, "items": ["a"]}\n')
    out = tmp_path / "o.jsonl"
    holder = Holder(out)  # makes the (empty) output and locks it, as flock(1) would
    try:
        args = ["run", "-q", *UNKNOWN_CLI, "-T", str(T), "--key-file", str(tmp_path / "k.key")]
        assert main([*args, "-i", str(tmp_path / "ev.jsonl"), "-o", str(out)]) == 0
    finally:
        holder.release()
    assert len(out.read_text().splitlines()) == T


def test_a_parquet_output_is_checked_when_its_file_is_made(tmp_path):
    """The Parquet writer makes its file at its first rows, after the run's checks: the
    check (that the name still leads where the run's lock is) runs right before."""
    pytest.importorskip("pyarrow")
    from dpstream.io import ParquetWriter

    calls = []

    def refuse() -> None:
        calls.append(1)
        raise StateError("the output's name leads elsewhere now")

    import numpy as np

    from dpstream.mechanisms.base import Release

    writer = ParquetWriter(str(tmp_path / "o.parquet"), before_open=refuse, rows_per_group=1)
    release = Release(t=1, items=["a"], values=np.array([1.0]), meta={"noise_std": 0.5})
    with pytest.raises(StateError):
        writer.write(release)
    assert calls == [1] and not (tmp_path / "o.parquet").exists()
