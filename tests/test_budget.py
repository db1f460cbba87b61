"""One budget per dataset: composition of the runs on a dataset, and a cap that refuses a run.

Composition is checked against closed forms (the sums, and CKS20 at the total
rho computed by ``epsilon_cks`` directly); the ledger's budget lines against
what the runs appended, byte for byte where a refused run must change nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from dpstream.budget import DatasetSpend, dataset_name, format_budget, totals
from dpstream.ledger import BudgetCapError, LedgerError, ReleaseLedger
from dpstream.privacy import BudgetCap, Spend, compose, costlier, epsilon_cks, in_events

from .conftest import fixed_key, with_option

KEY = fixed_key("budget")


def _spend(rho: float, epsilon: float, delta: float = 1e-6, unit: str = "event") -> Spend:
    return Spend(rho=rho, rho_delta=0.0, epsilon=epsilon, delta=delta, unit=unit, label="x")


def _line(dataset: str, rho: float, epsilon: float, stream: str = "s") -> DatasetSpend:
    return DatasetSpend(dataset, stream, "known-domain histogram", _spend(rho, epsilon), "T")


# ------------------------------------------------------------------ composition


def test_compose_adds_rho_and_takes_the_better_analysis() -> None:
    a, b = _spend(0.1, 1.9), _spend(0.2, 2.9)
    total = compose([a, b])
    assert total.releases == 2 and total.rho == pytest.approx(0.3, rel=1e-15)
    assert total.epsilon_sum == pytest.approx(4.8) and total.delta_sum == pytest.approx(2e-6)
    # at delta = 1e-6 basic composition (delta 2e-6) does not apply: CKS20 at rho 0.3
    assert total.epsilon_at(1e-6) == epsilon_cks(total.rho, 1e-6)
    # at delta = 2e-6 both apply; the smaller wins (CKS20 at rho = 0.3 is about 3.8 < 4.8)
    assert total.epsilon_at(2e-6) == epsilon_cks(total.rho, 2e-6) < 4.8


def test_one_release_keeps_its_own_claim() -> None:
    # a claim from the exact Gaussian curve is tighter than CKS20 at the same rho:
    # the total of one release must not be worse than that release's own claim
    one = _spend(0.5, 1.0)
    assert epsilon_cks(0.5, 1e-6) > 1.0
    assert compose([one]).epsilon_at(1e-6) == 1.0
    assert compose([one]).within(BudgetCap(1.0, 1e-6))


def test_rho_delta_is_paid_out_of_the_delta() -> None:
    s = Spend(rho=0.1, rho_delta=4e-7, epsilon=2.0, delta=1e-6, unit="event", label="u")
    total = compose([s, s])
    assert total.rho_delta == pytest.approx(8e-7)
    assert total.epsilon_at(1e-6) == epsilon_cks(0.2, 1e-6 - 8e-7)
    assert total.epsilon_at(8e-7) == math.inf  # no delta left for the zCDP part


def test_units_compose_at_the_weaker_one() -> None:
    user, event = _spend(0.1, 1.0, unit="user"), _spend(0.1, 1.0)
    assert compose([user, user]).unit == "user"
    assert compose([user, user]).rho == pytest.approx(0.2)  # per user: plain sums
    mixed = compose([user, event])
    assert mixed.unit == "event"
    # per event a user-level release counts at group privacy for two: 4 rho, and its
    # claim at twice its delta is CKS20's at that rho
    assert mixed.rho == pytest.approx(4 * 0.1 + 0.1)
    assert mixed.epsilon_sum == pytest.approx(epsilon_cks(0.4, 2e-6) + 1.0)
    assert mixed.delta_sum == pytest.approx(3e-6)
    assert compose([]).epsilon_at(1e-6) == 0.0


def _first_come_bounded(events, max_items: int) -> dict[tuple[int, str], int]:
    """One user's kept (step, item) counts under first come, first kept: in input
    order, an item is kept while the user holds fewer than ``max_items`` distinct
    items, each counted at most once (``--max-count-per-item 1``)."""
    kept: dict[tuple[int, str], int] = {}
    held: set[str] = set()
    for t, items in events:
        for item in dict.fromkeys(items):
            if item in held or len(held) >= max_items:
                continue
            held.add(item)
            kept[(t, item)] = 1
    return kept


def _tree_cells(horizon: int) -> list[tuple[int, int]]:
    """The dyadic intervals [lo, hi] of 1..horizon (horizon a power of 2): a binary
    tree counter's cells, each holding the sum of its steps' counts."""
    cells, width = [], 1
    while width <= horizon:
        cells += [(lo, lo + width - 1) for lo in range(1, horizon + 1, width)]
        width *= 2
    return cells


def test_a_user_level_release_costs_more_per_event_than_per_user() -> None:
    """Brute force over every one-user input of up to 3 events (steps 1..4, items from
    {a, b}, 1 or 2 items an event) of a binary tree counter with one item a user kept:
    the largest change of the cells' counts when one event is removed, against the
    largest a whole user makes (the user-level sensitivity). Their squared ratio is
    what an event-level total must charge for rho; it exceeds 1 (the user-level
    numbers understate the release per event) and stays within in_events' 4."""
    import itertools

    horizon, max_items = 4, 1
    cells = _tree_cells(horizon)

    def norm2(kept: dict[tuple[int, str], int], other: dict[tuple[int, str], int]) -> int:
        total = 0
        for lo, hi in cells:
            for item in "ab":
                a = sum(v for (t, i), v in kept.items() if i == item and lo <= t <= hi)
                b = sum(v for (t, i), v in other.items() if i == item and lo <= t <= hi)
                total += (a - b) ** 2
        return total

    shapes = [("a",), ("b",), ("a", "b")]
    events = [(t, items) for t in range(1, horizon + 1) for items in shapes]
    user_sq = event_sq = 0
    for n in range(1, 4):
        for seq in itertools.product(events, repeat=n):
            seq = sorted(seq, key=lambda e: e[0])  # input order within the step's order
            kept = _first_come_bounded(seq, max_items)
            user_sq = max(user_sq, norm2(kept, {}))
            for j in range(n):
                rest = _first_come_bounded(seq[:j] + seq[j + 1 :], max_items)
                event_sq = max(event_sq, norm2(kept, rest))
    ratio = event_sq / user_sq  # rho scales with the squared sensitivity
    assert user_sq == 3 and event_sq == 6  # sqrt(2): {a} then {b} at step 1, {a} removed
    user = Spend(rho=0.1, rho_delta=0.0, epsilon=1.0, delta=1e-6, unit="user", label="u")
    assert ratio > 1.0  # the same numbers per event would understate it
    assert in_events(user).rho >= ratio * user.rho


def test_dataset_name_defaults_to_the_input_name() -> None:
    assert dataset_name({"dataset": "sales", "input": "/x/a.jsonl"}) == "sales"
    assert dataset_name({"input": "/data/lake/events/"}) == "events"
    assert dataset_name({"input": "/data/day1.jsonl.gz"}) == "day1.jsonl.gz"
    assert dataset_name({"input": "-"}) == "stdin"


def test_budget_line_round_trips_sealed() -> None:
    import base64

    k1, k2 = KEY.derive("budget-line/v1"), fixed_key("other").derive("budget-line/v1")
    line = _line("päivä data", 0.25, 1.5, stream="a b")
    payload = line.encode(k1)
    assert b" " not in payload and b"data" not in base64.urlsafe_b64decode(payload)
    back = DatasetSpend.decode(payload, k1)
    assert back.dataset == "päivä data" and back.spend.rho == 0.25 and back.spend.epsilon == 1.5
    for bad in (b"bm90IGpzb24", payload[:-4] + b"AAAA"):
        with pytest.raises(ValueError):
            DatasetSpend.decode(bad, k1)
    with pytest.raises(ValueError):  # another key cannot read it
        DatasetSpend.decode(payload, k2)


# ------------------------------------------------------------------ the ledger's budget lines


def _open(path, run: str, scope: str, line: DatasetSpend | None, cap=None, check_scope=True, **kw):
    """The ledger at ``path`` for run ``run`` (``check_scope=False``: a run with --force)."""
    return ReleaseLedger(
        str(path), KEY, run, fsync=False, scope=scope, check_scope=check_scope, budget=line,
        cap=cap, **kw,
    )  # fmt: skip


def test_runs_on_a_dataset_add_up_and_a_cap_refuses_before_anything(tmp_path) -> None:
    path = tmp_path / "k.ledger"
    cap = BudgetCap(epsilon=3.0, delta=2e-6)  # basic composition of two runs: (3, 2e-6)
    with _open(path, "a" * 32, "unknown:s1", _line("sales", 0.1, 1.5), cap) as led:
        assert led.budget_problem() is None
        led.claim_scope()
    with _open(path, "b" * 32, "top-k:s1", _line("sales", 0.1, 1.5), cap) as led:
        led.record(1, "1" * 64, "2" * 64)  # the scope and budget lines go with step 1
    with _open(path, "c" * 32, "x:s9", _line("other", 5.0, 20.0)) as led:  # no cap
        led.claim_scope()
    with _open(path, "d" * 32, "z", None) as led:
        got = led.spends()
    by = totals(line for _, line in got)
    assert set(by) == {"sales", "other"} and by["sales"].releases == 2
    assert by["sales"].rho == pytest.approx(0.2) and by["sales"].epsilon_sum == 3.0
    # a third run on "sales" would take it past epsilon 3 at delta 2e-6 by both analyses
    before = path.read_bytes()
    third = _line("sales", 0.1, 1.5)
    assert epsilon_cks(0.3, 2e-6) > 3.0
    with _open(path, "e" * 32, "meta:s1", third, cap) as led:
        problem = led.budget_problem()
        assert problem is not None and "'sales'" in problem and "epsilon = 3" in problem
        with pytest.raises(BudgetCapError):
            led.record(1, "1" * 64, "2" * 64)
    assert path.read_bytes() == before
    # the same run on another dataset is within its (absent) cap
    with _open(path, "e" * 32, "meta:s1", _line("fresh", 0.1, 1.5), cap) as led:
        assert led.budget_problem() is None
    text = format_budget([line for _, line in got], 2e-6, "sales")
    assert (
        text.startswith("dataset sales: epsilon = 3, delta = 2e-06 per event over 2 release")
        and text.count("stream s:") == 2
    )


def test_a_resumed_or_forced_run_adds_nothing(tmp_path) -> None:
    path = tmp_path / "k.ledger"
    cap = BudgetCap(epsilon=1.5, delta=1e-6)  # room for exactly one such run
    with _open(path, "a" * 32, "s", _line("d", 0.1, 1.5), cap) as led:
        led.record(1, "1" * 64, "2" * 64)
    with _open(path, "a" * 32, "s", _line("d", 0.1, 1.5), cap) as led:  # resumed: same run
        assert led.budget_problem() is None
        led.record(2, "3" * 64, "4" * 64)
    # --force: a new run under the same scope (check_scope off), the earlier one unpublished
    with _open(path, "f" * 32, "s", _line("d", 0.1, 1.5), cap, check_scope=False) as led:
        assert led.budget_problem() is None
        led.claim_scope()
        assert len(led.spends()) == 1  # counted once: the same scope on the same dataset
    # --force at a higher cost under the same scope (a setting outside the scope, such as
    # --threshold-delta, changed): counted once, at the larger cost, so the cap refuses it
    # (found by review: the first line's cost counted, and the cap let it through)
    with _open(path, "c" * 32, "s", _line("d", 0.2, 2.5), cap, check_scope=False) as led:
        assert led.budget_problem() is not None
        with pytest.raises(BudgetCapError):
            led.claim_scope()
    with _open(path, "c" * 32, "s", _line("d", 0.2, 2.5), check_scope=False) as led:
        # without the cap it runs, and the dataset's total is the larger cost
        led.claim_scope()
        ((_, line),) = led.spends()
        assert (line.spend.rho, line.spend.epsilon) == (0.2, 2.5)
    # each run keeps a line of its own (its later batches find their dataset by it)
    assert path.read_bytes().count(b"\nB1 ") == 3
    # --force on ANOTHER dataset is a new cost there: checked against its cap, recorded
    # (found by review: one line per scope let it pass a cap and go unrecorded)
    with _open(path, "e" * 32, "s", _line("B", 0.1, 1.5), BudgetCap(0.5, 1e-6), False) as led:
        assert led.budget_problem() is not None
        with pytest.raises(BudgetCapError):
            led.claim_scope()
    with _open(path, "e" * 32, "s", _line("B", 0.1, 1.5), check_scope=False) as led:
        led.claim_scope()
        assert sorted(x.dataset for _, x in led.spends()) == ["B", "d"]


def test_a_run_on_record_without_a_budget_line_gets_one_and_its_cap_checked(tmp_path) -> None:
    """A stream begun by a dpstream that kept scope lines but no budget lines: when it
    goes on, its cost is recorded (and a cap it would pass refuses it) before its next
    step (found by review: it used to go on unrecorded past the cap)."""
    path = tmp_path / "k.ledger"
    with ReleaseLedger(str(path), KEY, "a" * 32, fsync=False, scope="old") as led:
        led.record(1, "1" * 64, "2" * 64)  # no budget: as an older dpstream wrote it
    assert b"B1 " not in path.read_bytes()
    with _open(path, "b" * 32, "u", _line("C", 0.1, 1.0)) as led:
        led.claim_scope()  # another stream on C: (1, 1e-6)
    before = path.read_bytes()
    capped = ReleaseLedger(
        str(path),
        KEY,
        "a" * 32,
        fsync=False,
        scope="old",
        budget=_line("C", 0.1, 1.0),
        cap=BudgetCap(1.5, 1e-6),
    )
    with capped as led:
        with pytest.raises(BudgetCapError):
            led.claim_scope()
    assert path.read_bytes() == before
    with ReleaseLedger(
        str(path), KEY, "a" * 32, fsync=False, scope="old", budget=_line("C", 0.1, 1.0)
    ) as led:
        led.claim_scope()
        assert not led.needs_budget_line()
        led.record(2, "3" * 64, "4" * 64)
    assert path.read_bytes().count(b"\nB1 ") == 2


def test_two_runs_started_together_cannot_both_pass_the_cap(tmp_path) -> None:
    path = tmp_path / "k.ledger"
    cap = BudgetCap(epsilon=1.5, delta=1e-6)
    first = _open(path, "a" * 32, "s1", _line("d", 0.1, 1.5), cap)
    second = _open(path, "b" * 32, "s2", _line("d", 0.1, 1.5), cap)
    assert first.budget_problem() is None and second.budget_problem() is None
    first.claim_scope()
    with pytest.raises(BudgetCapError):  # checked again under the lock, after catching up
        second.claim_scope()
    first.close()
    second.close()


def test_each_budget_line_is_decoded_once_however_many_steps(tmp_path, monkeypatch) -> None:
    """A key with many runs on record: a run's every step asks for its own budget line;
    the lines are checked and decoded once, not once per step (that cost a 1,000-step
    run 2.3 s of CPU per 150 runs on record). Lines another run appends meanwhile are
    still read (and counted against the cap: the test above)."""
    path = tmp_path / "k.ledger"
    runs = 30
    for i in range(runs):
        with _open(path, f"{i:032x}", f"s{i}", _line(f"d{i}", 0.01, 0.1)) as led:
            led.record(1, "1" * 64, "2" * 64)
    calls = []
    real = DatasetSpend.decode
    monkeypatch.setattr(
        DatasetSpend, "decode", staticmethod(lambda *a: calls.append(1) or real(*a))
    )
    steps = 50
    with _open(path, "f" * 32, "mine", _line("mine", 0.01, 0.1)) as led:
        for t in range(1, steps + 1):
            led.claim_scope()
            led.record(t, f"{t:064x}", "2" * 64)
        # every line once, and this run's own line once (it appended it)
        assert len(calls) == runs + 1, len(calls)
        with _open(path, "e" * 32, "late", _line("mine", 0.01, 0.1)) as other:
            other.claim_scope()  # another run's line, appended meanwhile
        calls.clear()
        led.record(steps + 1, f"{steps + 1:064x}", "2" * 64)
        assert len(calls) == 1  # the new line only
        assert [line.dataset for _, _, line in led.budget_entries()].count("mine") == 2


def test_a_forged_budget_line_is_refused(tmp_path) -> None:
    path = tmp_path / "k.ledger"
    with _open(path, "a" * 32, "s", _line("d", 0.5, 4.0)) as led:
        led.claim_scope()
    raw = path.read_bytes()
    (line,) = [x for x in raw.split(b"\n") if x.startswith(b"B1 ")]
    fields = line.split(b" ")
    fields[4] = _line("d", 0.001, 0.01).encode(KEY.derive("budget-line/v1"))  # sealed right
    path.write_bytes(raw.replace(line, b" ".join(fields)))  # a smaller cost, the old tag
    with _open(path, "b" * 32, "t", _line("d", 0.1, 1.0), BudgetCap(5.0, 1e-6)) as led:
        with pytest.raises(LedgerError, match="not written with this key"):
            led.budget_problem()


# ------------------------------------------------------------------ the command line


def _events(path) -> None:
    import json

    rows = [{"t": 1 + i % 6, "items": [f"w{i % 5}", f"w{(i * 7) % 11}"]} for i in range(300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_runs_on_one_dataset_compose_and_a_run_past_the_cap_writes_nothing(
    tmp_path, capsys
) -> None:
    import json

    from dpstream.cli import main

    key = tmp_path / "k.key"
    fixed_key("budget-cli").save(key)
    _events(tmp_path / "sales.jsonl")
    (tmp_path / "domain.txt").write_text("".join(f"w{i}\n" for i in range(11)))
    common = ["run", "-q", "--key-file", str(key), "-i", str(tmp_path / "sales.jsonl")]
    common += ["-T", "6", "--max-items", "2"]
    capped = ["--budget-cap", "2.5", "--budget-cap-delta", "3e-6", "--dataset", "sales.jsonl"]
    # a cap needs the dataset named: the default (the file's name) is not the data's
    assert main([*common, "-m", "known", "--budget-cap", "2.5", "-o", "x.jsonl"]) == 2
    assert "--budget-cap needs --dataset NAME" in capsys.readouterr().err
    unknown = [*common, "-m", "unknown", "--epsilon", "1", "--delta", "1e-6"]
    topk = [*common, *capped, "-m", "top-k", "--k", "3", "--domain", str(tmp_path / "domain.txt")]
    topk += ["--epsilon", "1", "--delta", "1e-6"]
    assert main([*unknown, "-o", str(tmp_path / "u.jsonl")]) == 0
    assert main([*topk, "-o", str(tmp_path / "k.jsonl")]) == 0
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key), "--json", "--delta", "3e-6"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["sales.jsonl"]  # the input's name is the default dataset
    total = doc["sales.jsonl"]
    assert total["releases"] == 2 and [r["stream"] for r in total["runs"]] == ["default"] * 2
    # each run is (1, 1e-6)-DP: basic composition gives (2, 2e-6), within the cap
    assert total["epsilon"] <= 2.0 and sum(r["epsilon"] for r in total["runs"]) <= 2.0
    rhos = [r["rho"] for r in total["runs"]]
    assert total["rho"] == pytest.approx(sum(rhos), rel=1e-12)
    # a third run (epsilon 2 more) passes the cap (2.5) by both analyses (basic: 4; zCDP:
    # CKS20 at rho >= 0.024 + 0.024 + 0.088, the smallest rho of those claims, is 2.64):
    # refused, and nothing of it is written (no output, no sidecar, the ledger unchanged)
    ledger = tmp_path / "k.key.ledger"
    before = ledger.read_bytes()
    known = [*common, *capped, "-m", "known", "--domain", str(tmp_path / "domain.txt")]
    known += ["--epsilon", "2", "--delta", "1e-6", "-o", str(tmp_path / "third.jsonl")]
    assert main(known) == 1
    err = capsys.readouterr().err
    assert "dataset 'sales.jsonl' would pass its budget cap" in err and "Nothing was" in err
    assert ledger.read_bytes() == before
    assert not list(tmp_path.glob("third.jsonl*"))
    # plan says so beforehand, from the same ledger (and nothing is written)
    plan = ["plan", "-m", "known", "--domain", str(tmp_path / "domain.txt"), "-T", "6"]
    plan += ["--max-items", "2", "--epsilon", "2", "--delta", "1e-6", "--key-file", str(key)]
    plan += ["--budget-cap", "2.5", "--budget-cap-delta", "3e-6", "--json"]
    assert main([*plan, "--dataset", "sales.jsonl"]) == 0
    said = json.loads(capsys.readouterr().out)["budget"]
    assert said["releases_before"] == 2 and said["allowed"] is False
    assert main([*plan, "--dataset", "fresh"]) == 0
    said = json.loads(capsys.readouterr().out)["budget"]
    assert said["releases_before"] == 0 and said["allowed"] is True
    # a name a run refuses as a slip of one on record (review 90: plan allowed it)
    assert main([*plan, "--dataset", "Sales.jsonl"]) == 0
    said = json.loads(capsys.readouterr().out)["budget"]
    assert said["allowed"] is False and "differ only in case" in said["text"]
    assert ledger.read_bytes() == before
    # on another dataset the same run goes through; the text report names both
    other = with_option(with_option(known, "--dataset", "other"), "-o", str(tmp_path / "o.jsonl"))
    assert main(other) == 0
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key)]) == 0
    text = capsys.readouterr().out
    assert "dataset other: epsilon = 2" in text and "dataset sales.jsonl: epsilon =" in text
    assert text.count("stream default:") == 3
    # a resumed or repeated run adds nothing: the same unknown run again is refused by
    # the ledger's noise scope (not counted twice); with --force it is counted once
    assert main([*unknown, "-o", str(tmp_path / "u2.jsonl"), "--force"]) == 0
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key), "--json", "--dataset", "sales.jsonl"]) == 0
    assert json.loads(capsys.readouterr().out)["sales.jsonl"]["releases"] == 2
    # the sidecar states the dataset's total with the run (no other run's stream names),
    # and the view shows it
    side = json.loads((tmp_path / "k.jsonl.meta.json").read_text())["budget"]
    assert side["dataset"] == "sales.jsonl" and side["releases"] == 2
    assert side["cap_epsilon"] == 2.5 and side["delta"] == 3e-6 and side["epsilon"] <= 2.0
    page = tmp_path / "page.html"
    assert main(["view", str(tmp_path / "k.jsonl"), "--export", str(page)]) == 0
    html = page.read_text()
    assert "dataset budget spent" in html and "dataset sales.jsonl" in html
    assert "2 releases in all" in html and "cap ε = 2.5" in html


def test_a_shared_ledger_keeps_each_keys_budget_apart(tmp_path) -> None:
    path = tmp_path / "shared.ledger"
    with _open(path, "a" * 32, "s", _line("d", 0.5, 4.0)) as led:
        led.claim_scope()
    other = fixed_key("budget-other")
    with ReleaseLedger(
        str(path), other, "b" * 32, fsync=False, scope="s", budget=_line("d", 0.1, 1.0)
    ) as led:
        assert led.spends() == []  # the first key's line is not this key's budget
        led.claim_scope()
        assert [x.spend.epsilon for _, x in led.spends()] == [1.0]
    with _open(path, "c" * 32, "t", None) as led:
        assert [x.spend.epsilon for _, x in led.spends()] == [4.0]
        assert led.other_keys() == 1  # the other key's line: counted as unread


def test_a_cap_and_budget_say_that_another_keys_lines_are_not_counted(tmp_path, capsys):
    """Review 113 (medium): two keys' streams of one dataset on a shared ledger each
    passed the dataset's cap, and nothing said that a cap counts one key's runs (their
    lines are sealed under their keys). A capped run and `dpstream budget` now say so."""
    import logging

    from dpstream.cli import main

    _events(tmp_path / "sales.jsonl")
    ledger = str(tmp_path / "shared.ledger")
    keys = []
    for name in ("a", "b"):
        keys.append(tmp_path / f"{name}.key")
        fixed_key(f"budget-two-keys-{name}").save(keys[-1])
    common = ["run", "-m", "unknown", "-T", "6", "--max-items", "2", "--epsilon", "1"]
    common += ["--delta", "1e-6", "-i", str(tmp_path / "sales.jsonl"), "--ledger", ledger]
    common += ["--dataset", "sales", "--budget-cap", "1.5"]
    caplog_lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            caplog_lines.append(record.getMessage())

    keep = _Keep()
    logging.getLogger("dpstream").addHandler(keep)
    try:
        assert main([*common, "--key-file", str(keys[0]), "-o", str(tmp_path / "a.jsonl")]) == 0
        assert not any("other keys" in m for m in caplog_lines)
        assert main([*common, "--key-file", str(keys[1]), "-o", str(tmp_path / "b.jsonl")]) == 0
        assert any("1 budget line(s) of other keys" in m for m in caplog_lines)
        caplog_lines.clear()
        assert main(["budget", "--key-file", str(keys[0]), "--ledger", ledger]) == 0
        assert "dataset sales:" in capsys.readouterr().out
        assert any("1 budget line(s) of other keys, not counted" in m for m in caplog_lines)
    finally:
        logging.getLogger("dpstream").removeHandler(keep)


# ------------------------------------------------------------ whom a total protects


def test_user_costs_named_by_different_fields_add_up_per_event() -> None:
    """A per-account and a per-device release bound no one notion of person together
    (review 65): their total was stated per user. Each is an event-level guarantee at
    group privacy for two (4 rho, 2 rho_delta, CKS20 at 2 delta), so they add per event."""
    account = Spend(0.1, 1e-7, 1.0, 1e-6, "user", "a", user_field="account")
    device = Spend(0.2, 0.0, 1.5, 1e-6, "user", "b", user_field="device")
    same = compose([account, replace(account, label="c")])
    assert same.unit == "user" and same.rho == pytest.approx(0.2, rel=1e-15)
    both = compose([account, device])
    assert both.unit == "event"
    assert both.rho == pytest.approx(4 * 0.1 + 4 * 0.2, rel=1e-15)
    assert both.rho_delta == pytest.approx(2e-7, rel=1e-15)
    want = epsilon_cks(0.4, 2e-6 - 2e-7) + epsilon_cks(0.8, 2e-6)
    assert both.epsilon_sum == pytest.approx(want, rel=1e-12)
    # a line recorded before the field was kept ("") is not assumed to name the same users
    assert compose([account, replace(account, user_field="")]).unit == "event"
    # --force over a run with another field: the larger cost per event
    assert costlier(account, device).unit == "event"
    assert costlier(account, device).rho == pytest.approx(0.8, rel=1e-15)


def test_the_command_totals_runs_of_two_user_fields_per_event(tmp_path, capsys) -> None:
    import json

    from dpstream.cli import main

    key = tmp_path / "k.key"
    fixed_key("budget-fields").save(key)
    rows = [{"t": 1 + i % 4, "acct": f"a{i % 7}", "dev": f"d{i % 5}", "items": [f"w{i % 3}"]}
            for i in range(60)]  # fmt: skip
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dom.txt").write_text("w0\nw1\nw2\n")
    run = ["run", "-q", "-m", "known", "--domain", str(tmp_path / "dom.txt"), "-T", "4"]
    run += ["--epsilon", "1", "--delta", "1e-6", "--max-items-per-user", "2"]
    run += ["--max-count-per-item", "1", "--key-file", str(key), "--dataset", "S"]
    run += ["-i", str(tmp_path / "ev.jsonl")]

    def total() -> dict:
        capsys.readouterr()
        assert main(["budget", "--key-file", str(key), "--json", "--dataset", "S"]) == 0
        return json.loads(capsys.readouterr().out)["S"]

    out = [*run, "-o", str(tmp_path / "a.jsonl"), "--stream", "a", "--user-field", "acct"]
    assert main(out) == 0
    one = total()
    assert one["unit"] == "user"
    out = [*run, "-o", str(tmp_path / "b.jsonl"), "--stream", "b", "--user-field", "acct"]
    assert main(out) == 0
    assert total()["unit"] == "user"
    out = [*run, "-o", str(tmp_path / "c.jsonl"), "--stream", "c", "--user-field", "dev"]
    assert main(out) == 0
    three = total()
    assert three["unit"] == "event" and three["releases"] == 3
    assert three["rho"] == pytest.approx(4 * sum(r["rho"] for r in three["runs"]), rel=1e-12)
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key), "--dataset", "S"]) == 0
    assert "(named by 'dev')" in capsys.readouterr().out


def test_a_later_batch_on_another_dataset_is_refused(tmp_path, capsys) -> None:
    """A stream's cost is on the dataset its first batch named; a later batch given
    another --dataset was kept there silently, past the other dataset's --budget-cap."""
    from dpstream.cli import main

    key = tmp_path / "k.key"
    fixed_key("budget-batches").save(key)
    _events(tmp_path / "ev.jsonl")
    lines = (tmp_path / "ev.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "day1.jsonl").write_text("".join(x for x in lines if '"t": 1' in x))
    (tmp_path / "day2.jsonl").write_text("".join(x for x in lines if '"t": 2' in x))
    (tmp_path / "dom.txt").write_text("".join(f"w{i}\n" for i in range(11)))
    run = ["run", "-q", "-m", "known", "--domain", str(tmp_path / "dom.txt"), "-T", "6"]
    run += ["--max-items", "2", "--epsilon", "1", "--delta", "1e-6", "--key-file", str(key)]
    run += ["-o", str(tmp_path / "r.jsonl"), "--state", str(tmp_path / "s.sqlite")]
    day1, day2 = ["-i", str(tmp_path / "day1.jsonl")], ["-i", str(tmp_path / "day2.jsonl")]
    assert main([*run, *day1, "--until", "1", "--dataset", "A"]) == 0
    out_before = (tmp_path / "r.jsonl").read_bytes()
    capsys.readouterr()
    assert main([*run, *day2, "--until", "2", "--dataset", "B", "--budget-cap", "1.5"]) == 1
    err = capsys.readouterr().err
    assert "counted on dataset 'A'" in err and "--dataset 'A'" in err
    assert (tmp_path / "r.jsonl").read_bytes() == out_before
    assert main([*run, *day2, "--until", "2"]) == 0  # no --dataset: it goes on on A
    assert (tmp_path / "r.jsonl").read_bytes() != out_before


def _known_run(tmp_path, label: str, *, epsilon: float) -> tuple[Any, list[str]]:
    """A key, events and a domain in ``tmp_path``, and a known-domain run's arguments."""
    key = tmp_path / "k.key"
    fixed_key(label).save(key)
    _events(tmp_path / "ev.jsonl")
    (tmp_path / "dom.txt").write_text("".join(f"w{i}\n" for i in range(11)))
    run = ["run", "-q", "-m", "known", "--domain", str(tmp_path / "dom.txt"), "-T", "6"]
    run += ["--max-items", "2", "--epsilon", str(epsilon), "--delta", "1e-6"]
    run += ["--key-file", str(key), "-i", str(tmp_path / "ev.jsonl")]
    return key, run


def test_a_dataset_name_that_differs_only_in_case_or_spaces_is_refused(tmp_path, capsys) -> None:
    """Review 83: `--dataset Sales` and `--dataset 'sales '` each started a fresh budget
    beside `sales`, so the same data spent three times its --budget-cap unnoticed."""
    from dpstream.cli import main

    key, run = _known_run(tmp_path, "budget-names", epsilon=2)
    run += ["--budget-cap", "3"]
    assert main([*run, "-o", str(tmp_path / "a.jsonl"), "--dataset", "sales"]) == 0
    capsys.readouterr()
    # review 84: the same name in another Unicode form, or with an invisible character
    names = ["Sales", "sales ", " SALES", "\uff53ales", "sa\u200bles"]
    names += ["sales\u034f", "sales\ufe0f", "sales\u3164"]  # review 85: invisible, not Cf
    # review 113: the default name of `-i sales.jsonl`, and a path to it
    names += ["sales.jsonl", "./sales", "./Sales.csv.gz"]
    for k, name in enumerate(names):
        out = tmp_path / f"b{k}.jsonl"
        assert main([*run, "-o", str(out), "--stream", f"s{k}", "--dataset", name]) == 1
        err = capsys.readouterr().err
        assert f"--dataset {name!r} is not on record, but 'sales' is" in err
        assert not out.exists()
    # a name that differs by more is other data, with a budget of its own (a folder
    # of a name is part of it: 2026/sales and 2027/sales are two datasets)
    assert main([*run, "-o", str(tmp_path / "c.jsonl"), "--stream", "t", "--dataset", "stock"]) == 0
    for k, name in enumerate(["2026/sales", "2027/sales"]):
        out = str(tmp_path / f"d{k}.jsonl")
        assert main([*run, "-o", out, "--stream", f"d{k}", "--dataset", name]) == 0
    assert main(["budget", "--key-file", str(key), "--dataset", "Sales"]) == 0
    assert "(on record: '2026/sales', '2027/sales', 'sales', 'stock')" in capsys.readouterr().out


def test_a_dataset_name_on_record_is_never_refused_for_a_near_one(tmp_path, capsys, monkeypatch):
    """Review 84: a ledger written before the check could hold both "sales" and "Sales";
    each name, being on record, must still be usable (it was refused for the other)."""
    import dpstream.run.scope as scope
    from dpstream.cli import main

    _, run = _known_run(tmp_path, "budget-near", epsilon=1)
    assert main([*run, "-o", str(tmp_path / "a.jsonl"), "--dataset", "sales"]) == 0
    with monkeypatch.context() as m:  # as a dpstream without the check recorded it
        m.setattr(scope, "_folded", lambda name: name)
        assert main([*run, "-o", str(tmp_path / "b.jsonl"), "--stream", "b", "--dataset",
                     "Sales"]) == 0  # fmt: skip
    for k, name in enumerate(["sales", "Sales"]):
        out = tmp_path / f"c{k}.jsonl"
        assert main([*run, "-o", str(out), "--stream", f"c{k}", "--dataset", name]) == 0


def test_a_cost_of_epsilon_zero_is_a_cost(tmp_path, capsys) -> None:
    """Review 97: a tiny budget (--rho 1e-12: epsilon rounds to 0 at delta 1e-6, a true
    (0, delta) claim) was refused as "not a valid privacy cost" once Spend required
    epsilon > 0, and a ledger holding such a line could no longer be read. Only a
    negative epsilon is refused."""
    from dpstream.cli import main

    assert Spend(rho=1e-12, rho_delta=0.0, epsilon=0.0, delta=1e-6, unit="event", label="x")
    with pytest.raises(ValueError, match="not a valid privacy cost"):
        Spend(rho=1e-12, rho_delta=0.0, epsilon=-1e-300, delta=1e-6, unit="event", label="x")
    key, run = _known_run(tmp_path, "budget-zero", epsilon=1)
    at = run.index("--epsilon")
    run[at : at + 4] = ["--rho", "1e-12"]  # (in place of --epsilon 1 --delta 1e-6)
    assert main([*run, "-o", str(tmp_path / "a.jsonl"), "--dataset", "tiny"]) == 0
    capsys.readouterr()
    assert main(["budget", "--key-file", str(key), "--dataset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "dataset tiny: epsilon = 0, delta = 1e-06 per event over 1 release" in out, out


@pytest.mark.parametrize("flag", ["--dataset", "--stream"])
def test_a_name_too_long_for_the_ledger_is_refused_before_anything_is_written(
    tmp_path, capsys, flag
) -> None:
    """Review 106: an 800 KB --dataset (from a config file) wrote a budget line of 1 MB,
    which every later run and `dpstream budget` then refused as no ledger line. A name
    is at most 1,000 characters; 1,000 pass, and the ledger stays readable."""
    from dpstream.cli import main

    key = tmp_path / "k.key"
    fixed_key("budget-cli").save(key)
    _events(tmp_path / "sales.jsonl")
    common = ["run", "-q", "--key-file", str(key), "-i", str(tmp_path / "sales.jsonl"),
              "-T", "6", "--max-items", "2", "-m", "unknown", "--epsilon", "1",
              "--delta", "1e-6"]  # fmt: skip
    assert main([*common, flag, "é" * 1001, "-o", str(tmp_path / "a.jsonl")]) == 2
    assert f"{flag} is 1,001 characters long" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.key", "sales.jsonl"]
    assert main([*common, flag, "é" * 1000, "-o", str(tmp_path / "b.jsonl")]) == 0
    assert main(["budget", "--key-file", str(key)]) == 0
