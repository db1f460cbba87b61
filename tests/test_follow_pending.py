"""--follow holds the records of steps not yet due within --memory (review 115: a
million lines dated a century ahead took the follower from 62 MB to 625 MB, with no
limit). Past the budget they go to a private temporary database and come back, in
input order, when their step is taken: the records of each step are the same."""

from __future__ import annotations

import random

from dpstream.io.records import RawEvent
from dpstream.run.follow_pending import PendingRecords


def _records(n: int, seed: int) -> list[RawEvent]:
    """Records in input order (lines 1..n), each for a step in 1..40, some with a user,
    items with quotes, non-ASCII and empty strings (simulation data)."""
    rng = random.Random(seed)
    out = []
    for line in range(1, n + 1):
        items = tuple(
            rng.choice(["a", 'q"uote', "é", "", "x" * 30]) for _ in range(rng.randint(1, 4))
        )
        user = rng.choice([None, "u1", "ü2"])
        t = rng.randint(1, 40)
        raw = f'{{"t": {t}, "line": {line}}}'.encode()
        out.append(RawEvent(line=line, t=t, items=items, user=user, raw=raw))
    return out


def test_every_step_gets_its_records_in_input_order_whatever_the_budget():
    """Against a brute-force dict of lists: with no room (every add spills), a little
    (spills now and then) and plenty (never spills), interleaving adds and takes."""
    records = _records(3000, seed=115)
    for budget in (0, 20_000, 10**9):
        pending = PendingRecords(budget)
        want: dict[int, list[RawEvent]] = {}
        next_t = 1
        for k, rec in enumerate(records):
            if rec.t < next_t:  # a late record is never held (the follower rejects it)
                continue
            pending.add(rec)
            want.setdefault(rec.t, []).append(rec)
            if k % 150 == 149:  # a step falls due
                assert pending.pop(next_t) == want.pop(next_t, []), (budget, next_t)
                next_t += 1
        for t in range(next_t, 41):
            assert pending.pop(t) == want.pop(t, []), (budget, t)
        assert pending.pop(41) == [] and not want
        assert (pending.spilled > 0) == (budget < 10**9), budget
        pending.close()


def test_the_records_held_in_memory_stay_within_the_budget():
    """The estimate of what is held in memory never passes the budget once an add
    returns (its records moved to the database), whatever was read."""
    pending = PendingRecords(50_000)
    for rec in _records(2000, seed=7):
        pending.add(rec)
        assert pending._held <= 50_000
    assert pending.spilled > 1500
    pending.close()


def test_a_follow_run_within_a_small_memory_gives_the_same_bytes(tmp_path, monkeypatch):
    """End to end: a backlog of every step's events (the step-3 ones first, so they
    wait) followed with --memory 1K (they go to the database) and with the default
    (they stay in memory): the same releases, byte for byte."""
    import datetime as dt
    import json

    from dpstream.cli import main

    from .conftest import fixed_key, own_ledger

    key = tmp_path / "k.key"
    fixed_key("follow-pending").save(key)
    start = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)  # long past: every step is due
    rng = random.Random(3)
    lines = []
    for t in (3, 1, 2, 3):  # a backlog: step 3's first events ahead of steps 1 and 2
        for k in range(60):
            at = (start + dt.timedelta(seconds=t - 1 + k / 100)).isoformat()
            lines.append(json.dumps({"ts": at, "items": [rng.choice("abcdefg")]}))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(line + "\n" for line in lines))
    spilled: list[int] = []
    close = PendingRecords.close

    def counted_close(self):
        spilled.append(self.spilled)
        close(self)

    monkeypatch.setattr(PendingRecords, "close", counted_close)
    outs = []
    for memory in ("1K", "512M"):
        out = tmp_path / f"out-{memory}.jsonl"
        argv = ["run", "-q", "-m", "unknown", "--max-items", "1", "--rho", "0.5",
                "--threshold-delta", "1e-6", "-T", "10", "--key-file", str(key), "-i",
                str(src), "-o", str(out), *own_ledger(out), "--time-field", "ts", "--step",
                "1s", "--start", start.isoformat(), "--follow", "--no-round", "--until", "3",
                "--memory", memory]  # fmt: skip
        assert main(argv) == 0
        outs.append(out.read_bytes())
    assert spilled[0] >= 60 and spilled[1] == 0  # 1K: held in the database; 512M: not
    assert outs[0] == outs[1]
    assert [json.loads(x)["t"] for x in outs[0].splitlines()] == [1, 2, 3]
