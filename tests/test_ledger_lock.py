"""The release ledger's lock is never waited for in silence or for ever, and a ledger
path that is the output of a run in progress is refused.

Known gaps: ``--ledger`` naming a file another process holds a ``flock`` on (an
operator's ``flock LEDGER cmd``, a hung run) made ``dpstream run`` wait silently for
ever; and ``--ledger`` naming another live run's ``-o`` appended ledger lines into
that run's releases. Another process holds the lock here; the wait runs on a clock of
the test's own (the pauses advance it), so no test depends on the wall clock's pace.
Each test that blocked before has a guard: the holder lets go after a minute, so the
old code fails the test (it ran to the end) rather than hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpstream import ledger_file
from dpstream.cli import main

from .conftest import UNKNOWN_CLI, fixed_key
from .test_output_lock import Holder

T = 4


@pytest.fixture
def place(tmp_path: Path) -> dict[str, Path]:
    fixed_key("ledger-lock").save(tmp_path / "k.key")
    lines = [f'{{"t": {t}, "items": ["a{t % 2}"]}}\n' for t in range(1, T + 1)]
    (tmp_path / "ev.jsonl").write_text("".join(lines))
    return {"dir": tmp_path, "ledger": tmp_path / "l.ledger", "out": tmp_path / "o.jsonl"}


def _run(place: dict[str, Path], *more: str) -> int:
    base = place["dir"]
    return main(
        ["run", "-q", *UNKNOWN_CLI, "-T", str(T), "--no-fsync"]
        + ["--key-file", str(base / "k.key"), "-i", str(base / "ev.jsonl")]
        + ["-o", str(place["out"]), "--ledger", str(place["ledger"]), *more]
    )


class _Guarded(Holder):
    """A :class:`Holder` that lets go by itself after a minute (a guard against the
    old code's endless wait, never reached by the new code)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.released = False
        self._guard = threading.Timer(60, self.release)
        self._guard.start()

    def release(self) -> None:
        if not self.released:
            self.released = True
            super().release()

    def close(self) -> None:
        self._guard.cancel()
        self.release()

    def __enter__(self) -> _Guarded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The wait's clock, advanced by its pauses only: ``[now, pauses]``."""
    now = [0.0, 0.0]

    def sleep(seconds: float) -> None:
        assert seconds > 0
        now[0] += seconds
        now[1] += 1

    monkeypatch.setattr(ledger_file, "_now", lambda: now[0])
    monkeypatch.setattr(ledger_file, "_sleep", sleep)
    yield now


def _waited(err: str, ledger: Path) -> int:
    return err.count(f"waiting for the release ledger {ledger}, locked by another process")


# -- the ledger's lock, held by another process ------------------------------------------


def test_a_wait_of_0_refuses_at_once_and_writes_nothing(place, capsys, monkeypatch, clock):
    assert _run(place, "--stream", "first") == 0  # a ledger on record, and its output
    ledger = place["ledger"].read_bytes()
    place["out"] = place["dir"] / "o2.jsonl"
    monkeypatch.setenv(ledger_file.WAIT_ENV, "0")
    capsys.readouterr()
    with _Guarded(place["ledger"]):  # e.g. `flock l.ledger sleep 1000`
        assert _run(place, "--stream", "second") == 1
    err = capsys.readouterr().err
    assert f"the release ledger {str(place['ledger'])!r} is locked by another process" in err
    assert "still after 0 s" in err and f"set {ledger_file.WAIT_ENV}=SECONDS" in err
    assert err.count("\n") == 1 and _waited(err, place["ledger"]) == 0
    assert clock[1] == 0  # no pause
    assert place["ledger"].read_bytes() == ledger and not place["out"].exists()


def test_the_run_says_it_waits_and_goes_on_once_the_lock_is_released(place, capsys, clock):
    """Default wait: the holder lets go after two seconds of the run's waiting."""
    real = ledger_file._sleep
    with _Guarded(place["ledger"]) as holder:

        def sleep(seconds: float) -> None:
            real(seconds)  # the test's clock
            if clock[0] >= 2:
                holder.release()

        ledger_file._sleep = sleep  # type: ignore[assignment]  (undone by monkeypatch)
        assert _run(place) == 0
    err = capsys.readouterr().err
    assert _waited(err, place["ledger"]) == 1 and "up to 60 s in all" in err
    assert 2 <= clock[0] < 3  # went on at its first try after the release
    assert len(place["out"].read_text().splitlines()) == T
    assert place["ledger"].read_text().count("\n") >= 1  # its scope line


def test_a_lock_never_released_is_refused_after_the_wait(place, capsys, monkeypatch, clock):
    monkeypatch.setenv(ledger_file.WAIT_ENV, "5")
    with _Guarded(place["ledger"]):
        assert _run(place) == 1
    err = capsys.readouterr().err
    assert _waited(err, place["ledger"]) == 1 and "still after 5 s" in err
    assert clock[0] == pytest.approx(5)  # the last pause ends at the limit
    assert place["ledger"].read_bytes() == b"" and not place["out"].exists()


def test_a_read_waits_too(place, capsys, monkeypatch, clock):
    """``dpstream budget`` reads under a shared lock: an exclusive holder stops it."""
    assert _run(place, "--dataset", "d") == 0
    monkeypatch.setenv(ledger_file.WAIT_ENV, "0")
    capsys.readouterr()
    with _Guarded(place["ledger"]):
        args = ["budget", "--key-file", str(place["dir"] / "k.key")]
        assert main([*args, "--ledger", str(place["ledger"])]) == 1
    assert "is locked by another process" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "soon", "inf"])
def test_a_bad_wait_is_refused(place, capsys, monkeypatch, value):
    monkeypatch.setenv(ledger_file.WAIT_ENV, value)
    assert _run(place) == 1
    assert f"{ledger_file.WAIT_ENV}={value!r}" in capsys.readouterr().err
    assert not place["out"].exists()


# -- a ledger path that is the output of a run in progress -----------------------------


def _lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def test_the_output_of_a_run_in_progress_is_refused_as_the_ledger(place, capsys):
    """``--ledger`` at the ``-o`` of another run, which holds its output lock: refused
    before the ledger is made or opened (its lines would go into that run's output)."""
    ledger = place["ledger"]
    with _Guarded(_lock_file(ledger)):  # a run writing -o l.ledger
        assert _run(place) == 1
    err = capsys.readouterr().err
    assert f"the release ledger {str(ledger)!r} is the output file of a run in progress" in err
    assert err.count("\n") == 1
    assert not ledger.exists() and not place["out"].exists()
    assert _run(place) == 0  # that run ended (a killed run's lock file stops no one either)
    assert ledger.exists()


def test_a_lock_file_left_beside_the_ledger_stops_no_run(place):
    _lock_file(place["ledger"]).write_bytes(b"")  # a killed run's, writing -o l.ledger
    assert _run(place) == 0
    assert _lock_file(place["ledger"]).exists()  # not the run's to remove


@pytest.mark.parametrize("role", ["--state", "--input", "--output's lock file"])
def test_the_ledger_cannot_be_the_run_s_own_files(place, capsys, role):
    """The same run's files are refused by the paths check before anything (--output
    and --key-file: test_ledger.py), not by the lock."""
    base = place["dir"]
    state = base / "s.sqlite"
    paths = {"--state": state, "--input": base / "ev.jsonl"}
    place["ledger"] = paths.get(role, _lock_file(place["out"]))
    before = place["ledger"].read_bytes() if place["ledger"].exists() else None
    assert _run(place, "--state", str(state)) == 1
    err = capsys.readouterr().err
    assert f"--ledger {str(place['ledger'])!r} is the same file as {role} " in err
    assert err.count("\n") == 1
    assert not state.exists() and not place["out"].exists()
    assert (place["ledger"].read_bytes() if place["ledger"].exists() else None) == before
