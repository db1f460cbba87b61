"""on_invalid="truncate" in the Python API, the share of dropped occurrences, and the plan hint."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dpstream as dps
from dpstream.cli import main
from dpstream.io import KeyedTruncator
from dpstream.mechanisms.truncation import keyed_subset, truncation_source
from dpstream.noise import NoiseSource

from .conftest import Z_TOL, fixed_key, own_ledger


def keep_by_hand(key, stream, items, k, t):
    """The keyed choice, by hand from the noise blocks: each distinct item's block at
    (0, t, d), d the XOR of the items' blocks at (1, 0, 0) (top 48 bits); the k
    smallest (as 128-bit words), in the event's order."""
    distinct = list(dict.fromkeys(items))
    if len(distinct) <= k:
        return distinct
    src = NoiseSource(key, f"{stream}/truncate/v2")
    d = 0
    for it in distinct:
        d ^= int(src.blocks(src.prepare([it]), 1, 0)[0, 0]) >> 16
    rank = {it: tuple(int(w) for w in src.blocks(src.prepare([it]), 0, t, d)[0]) for it in distinct}
    smallest = sorted(distinct, key=rank.__getitem__)[:k]
    return [it for it in distinct if it in smallest]


def test_known_truncates_like_the_hand_computation_and_counts_the_drop():
    key = fixed_key("trunc")
    domain = [f"w{i}" for i in range(30)]
    rng = np.random.default_rng(1)  # simulated events
    steps = [
        [
            list(rng.choice(domain, size=int(rng.integers(0, 9)), replace=False))
            + (["outside"] if rng.random() < 0.2 else [])
            for _ in range(int(rng.integers(0, 4)))
        ]
        for _ in range(40)
    ]
    m = dps.KnownDomainHistogram(domain, 40, max_items=3, key=key, rho=1.0, on_invalid="truncate")
    ref = dps.KnownDomainHistogram(domain, 40, max_items=3, key=key, rho=1.0)
    ordinal = occurrences = dropped = cut = 0
    for t, events in enumerate(steps, 1):
        kept = []
        for ev in events:
            ordinal += 1
            inside = [i for i in ev if i in domain]
            k = keep_by_hand(key, "default", inside, 3, t)
            occurrences += len(ev)
            dropped += len(ev) - len(k)
            cut += len(k) < len(ev)
            kept.append(k)
        a, b = m.step_batch(events), ref.step_batch(kept)
        assert np.array_equal(a.values, b.values)
    st = m.truncation
    assert (st.events, st.truncated_events, st.occurrences, st.dropped) == (
        ordinal,
        cut,
        occurrences,
        dropped,
    )
    assert st.dropped_share == pytest.approx(dropped / occurrences) and dropped > 20


def test_unknown_and_meta_truncate_too_and_errors_change_nothing():
    key = fixed_key("trunc-u")
    u = dps.UnknownDomainHistogram(
        20, max_items=2, key=key, tau=1.0, threshold_delta=0.1, on_invalid="truncate"
    )
    ref = dps.UnknownDomainHistogram(20, max_items=2, key=key, tau=1.0, threshold_delta=0.1)
    big = ["a", "b", "c", "d", "e"]
    a = u.step_batch([big, ["a"]])
    b = ref.step_batch([keep_by_hand(key, "default", big, 2, 1), ["a"]])
    assert u.items_seen == ref.items_seen and np.array_equal(a.values, b.values)
    assert (u.truncation.dropped, u.truncation.occurrences) == (3, 6)
    with pytest.raises(dps.InvalidItemError):
        u.step_batch([big, [2.5]])  # a bad item after a truncated event: nothing recorded
    assert u.t == 1 and (u.truncation.events, u.truncation.dropped) == (2, 3)
    m = dps.MetaHistogram(
        20, oneshot="gaussian", domain=big, max_items=2, key=key, rho=1.0, on_invalid="truncate"
    )
    m.step_batch([big + ["zz"]])
    assert (m.truncation.occurrences, m.truncation.dropped) == (6, 4)
    with pytest.raises(dps.InvalidEventError):
        dps.KnownDomainHistogram(big, 20, max_items=2, key=key, rho=1.0).step(big)
    with pytest.raises(ValueError, match="on_invalid"):
        dps.KnownDomainHistogram(big, 20, max_items=2, key=key, rho=1.0, on_invalid="skip")


def test_keyed_subset_is_a_uniform_choice_and_the_cli_truncator_agrees():
    """Each of 5 items is kept with probability 2/5: one event at each of 20,000 steps,
    Z_TOL binomial SE per item; the command's KeyedTruncator makes the same choices, and
    so does a second event of another item set in the same step, independently."""
    key = fixed_key("uniform")
    src = truncation_source(key, "default")
    items = ["a", "b", "c", "d", "e"]
    other = ["a", "b", "c", "d", "e", "f"]
    n = 20_000
    kept = {it: 0 for it in items}
    both = 0  # steps where the two events keep the same pair of a..e
    cli = KeyedTruncator(src, 2)
    for t in range(1, n + 1):
        sub = keyed_subset(src, items, 2, t)
        assert len(sub) == 2 and list(sub) == [i for i in items if i in sub]
        for it in sub:
            kept[it] += 1
        if t <= 200:
            assert cli(items, t) == sub == tuple(keep_by_hand(key, "default", items, 2, t))
            assert keyed_subset(src, items[::-1] + ["a"], 2, t) == sub[::-1]  # a set function
        both += keyed_subset(src, other, 2, t) == sub
    se = math.sqrt(0.4 * 0.6 / n)
    for it, c in kept.items():
        assert abs(c / n - 0.4) <= Z_TOL * se, it
    # independent rankings: P(the 6-item event keeps the same pair) = 1 / C(6, 2) = 1/15;
    # one ranking shared by both events would keep it whenever f is not among the two
    # smallest (2/3)
    p = 1 / 15
    assert abs(both / n - p) <= Z_TOL * math.sqrt(p * (1 - p) / n)


def test_run_summary_reports_the_dropped_share(tmp_path, capsys):
    key_path = tmp_path / "k.key"
    fixed_key("summary").save(key_path)
    (tmp_path / "ev.jsonl").write_text('["a","b","c","d"]\n["a"]\n["b","c","d","e","f"]\n')
    assert (
        main(
            [
                "run",
                "-m",
                "unknown",
                "-T",
                "5",
                "--max-items",
                "2",
                "--rho",
                "1",
                "--threshold-delta",
                "1e-3",
                "--key-file",
                str(key_path),
                "-i",
                str(tmp_path / "ev.jsonl"),
                "-o",
                str(tmp_path / "out.jsonl"),
                "--on-invalid",
                "truncate",
                "--implicit-time",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    # 10 occurrences, 2 + 3 dropped
    assert "truncation dropped 5 of 10 item occurrences (50.0%" in err
    assert "2 truncated" in err


def test_plan_max_items_hint_against_the_gaussian_calibration(capsys):
    import json

    from dpstream.privacy import calibrate_tau
    from dpstream.tree import max_cells, num_levels, optimal_base

    assert (
        main(
            [
                "plan",
                "-m",
                "known",
                "-T",
                "300",
                "--domain-size",
                "10",
                "--max-items",
                "3",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--counter",
                "tree",
                "--json",
            ]
        )
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    r = optimal_base(300)
    factor = math.sqrt(max_cells(300, r) * num_levels(300, r))
    rows = info["max_items_hint"]
    assert [x["max_items"] for x in rows] == [1, 2, 3, 5, 10, 20, 50, 100]
    for x in rows:  # tau = sqrt(Delta0) / mu(epsilon, delta): exact Gaussian calibration
        tau = calibrate_tau(a=x["max_items"] / 2, epsilon=1.0, delta=1e-6, gaussian_exact=True)
        assert x["noise_std_worst"] == pytest.approx(tau * factor, rel=1e-12)
    assert rows[-1]["noise_std_worst"] == pytest.approx(
        10 * rows[0]["noise_std_worst"], rel=1e-9
    )  # grows as sqrt(Delta0)


DAYS, STEPS_PER_DAY = 30, 8


@pytest.fixture(scope="module")
def big_events(tmp_path_factory):
    """30 days of events, most of them over --max-items 2 (simulated test data)."""
    base = tmp_path_factory.mktemp("daily-truncate")
    key_path = base / "k.key"
    fixed_key("daily-truncate").save(key_path)
    rng = np.random.default_rng(27)
    words = [f"w{i}" for i in range(25)]
    (base / "domain.txt").write_text("\n".join(words[:20]) + "\n")  # w20..w24: outside
    everything = []
    for d in range(1, DAYS + 1):
        lines = []
        for t in range((d - 1) * STEPS_PER_DAY + 1, d * STEPS_PER_DAY + 1):
            for _ in range(int(rng.integers(0, 5))):
                items = rng.choice(words, size=int(rng.integers(1, 7)), replace=False).tolist()
                items += items[:1] if rng.random() < 0.3 else []  # a repeated item
                lines.append(json.dumps({"t": t, "items": items}) + "\n")
        (base / f"day{d:02d}.jsonl").write_text("".join(lines))
        everything += lines
    (base / "all.jsonl").write_text("".join(everything))
    return base, key_path


@pytest.mark.parametrize("mech", ["unknown", "known"])
def test_thirty_daily_truncating_runs_equal_one_run(big_events, tmp_path, mech):
    """Issue #27 (4): the kept items were keyed on the input line number, which restarts
    in every file, so a day's events were cut unlike the same events in one run over the
    concatenation. Now the cut is keyed on each event's step and items: the same bytes."""
    base, key_path = big_events
    extra = (
        ["-m", "known", "--domain", str(base / "domain.txt")]
        if mech == "known"
        else ["-m", "unknown", "--threshold-delta", "1e-3"]
    )
    args = [
        "run",
        "-q",
        "-T",
        str(DAYS * STEPS_PER_DAY),
        *extra,
        "--max-items",
        "2",
        "--rho",
        "1",
        "--on-invalid",
        "truncate",
        "--key-file",
        str(key_path),
        "--no-fsync",
    ]
    ref = tmp_path / "ref.jsonl"
    assert main([*args, "-i", str(base / "all.jsonl"), "-o", str(ref), *own_ledger(ref)]) == 0
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"
    for d in range(1, DAYS + 1):
        until = [] if d == DAYS else ["--until", str(d * STEPS_PER_DAY)]
        assert (
            main(
                [
                    *args,
                    "-i",
                    str(base / f"day{d:02d}.jsonl"),
                    "-o",
                    str(out),
                    *own_ledger(out),
                    "--state",
                    str(state),
                    *until,
                ]
            )
            == 0
        ), d
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("known", [False, True])
def test_removing_an_event_changes_no_other_events_kept_items(known):
    """Brute force over every event of a stream: ``dpstream run``'s cut (the validator)
    of the stream without event j equals the full stream's cut without event j's, event
    by event; the lines are renumbered as in the file without that line (the old rule
    keyed the cut on them, so removing one event re-cut the events after it)."""
    from dpstream.io import KeyedTruncator, RawEvent
    from dpstream.run.validate import RunStats
    from dpstream.run.validate import Validator as _Validator

    key = fixed_key("neighbour")
    rng = np.random.default_rng(5)  # simulated events
    words = [f"w{i}" for i in range(12)]
    domain = words[:9] if known else None
    events = [
        (t, tuple(rng.choice(words, size=int(rng.integers(1, 8)))))
        for t in range(1, 11)
        for _ in range(int(rng.integers(0, 9)))
    ]
    trunc = KeyedTruncator(truncation_source(key, "s"), 2)

    def cut(evs):
        v = _Validator(
            policy="truncate", domain=domain, max_items=2, truncator=trunc, stats=RunStats()
        )
        recs = [RawEvent(line, t, items, None) for line, (t, items) in enumerate(evs, 1)]
        out = []
        for t in range(1, 11):
            out += [sorted(e) for e in v.events([r for r in recs if r.t == t]).events()]
        return out

    full = cut(events)
    for (t, items), kept in zip(events, full, strict=True):  # the rule, by hand
        inside = [i for i in items if domain is None or i in domain]
        assert kept == sorted(keep_by_hand(key, "s", inside, 2, t))
    assert sum(len(set(items)) > 2 for _, items in events) >= 30  # many events are cut
    for j in range(len(events)):
        assert cut(events[:j] + events[j + 1 :]) == full[:j] + full[j + 1 :], j


def test_a_state_of_the_line_keyed_rule_is_refused(big_events, tmp_path, capsys):
    """A stream begun by a dpstream that keyed the cut on line numbers (its state records
    --on-invalid truncate but no ``truncation`` rule) must not go on under the new rule:
    refused, with the reason, and nothing written."""
    import sqlite3

    base, key_path = big_events
    args = [
        "run",
        "-q",
        "-T",
        str(DAYS * STEPS_PER_DAY),
        "-m",
        "unknown",
        "--threshold-delta",
        "1e-3",
        "--max-items",
        "2",
        "--rho",
        "1",
        "--on-invalid",
        "truncate",
        "--key-file",
        str(key_path),
        "--no-fsync",
        "-o",
        str(tmp_path / "out.jsonl"),
        *own_ledger(tmp_path / "out.jsonl"),
        "--state",
        str(tmp_path / "s.sqlite"),
    ]
    assert main([*args, "-i", str(base / "day01.jsonl"), "--until", "8"]) == 0
    db = sqlite3.connect(tmp_path / "s.sqlite")
    params = json.loads(db.execute("SELECT params FROM run").fetchone()[0])
    assert params.pop("truncation") == "step-items/1"
    db.execute(
        "UPDATE run SET params = ?", (json.dumps(params, sort_keys=True, separators=(",", ":")),)
    )
    db.commit()
    db.close()
    before = (tmp_path / "out.jsonl").read_bytes()
    capsys.readouterr()
    assert main([*args, "-i", str(base / "day02.jsonl"), "--until", "16"]) == 1
    assert "--on-invalid truncate by an older rule" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").read_bytes() == before


def test_the_chunked_and_record_readers_cut_alike():
    """The same JSON Lines read in chunks of 64 bytes (a step over many chunks, one item
    under several codes), in one chunk, and record by record: the same kept items, the
    hand-computed ones (the command reads the item 5 as "5": one item, listed twice)."""
    import io

    from dpstream.io import KeyedTruncator
    from dpstream.io.chunks import records_step
    from dpstream.io.grouping import group_steps, step_steps
    from dpstream.io.jsonl import read_jsonl, read_jsonl_chunks
    from dpstream.run.validate import RunStats
    from dpstream.run.validate import Validator as _Validator

    key = fixed_key("readers")
    rng = np.random.default_rng(9)  # simulated events
    pool = [f"w{i}" for i in range(8)] + [5, "5", 7]
    lines = [
        json.dumps({"t": t, "items": [pool[i] for i in rng.integers(0, 11, 6)]})
        for t in range(1, 7)
        for _ in range(int(rng.integers(1, 12)))
    ]
    text = "\n".join(lines) + "\n"
    trunc = KeyedTruncator(truncation_source(key, "r"), 3)

    def kept(steps):
        v = _Validator(
            policy="truncate", domain=None, max_items=3, truncator=trunc, stats=RunStats()
        )
        return [sorted(map(repr, e)) for step in steps for e in v.events(step).events()]

    want = [
        sorted(
            map(
                repr,
                keep_by_hand(
                    key, "r", [str(i) for i in json.loads(x)["items"]], 3, json.loads(x)["t"]
                ),
            )
        )
        for x in lines
    ]
    for chunk_bytes in (64, 1 << 20):
        steps = step_steps(read_jsonl_chunks(io.StringIO(text), chunk_bytes=chunk_bytes), 6)
        assert kept(steps) == want, chunk_bytes
    records = group_steps(read_jsonl(io.StringIO(text)), 6)
    assert kept(records_step(t, recs) for t, recs in records) == want
