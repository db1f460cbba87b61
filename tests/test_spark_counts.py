"""``dpstream run --engine spark`` at event level: the Python workers count the events
as they parse them (:mod:`dpstream.spark.read_counts`), with the local engine's
decisions, and only the counts reach the JVM."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dpstream.clock import StepClock
from dpstream.io.jsonl import parse_jsonl_line

from .conftest import assert_spark_csv_matches, fixed_key, own_ledger

pytestmark = pytest.mark.spark

if os.environ.get("DPSTREAM_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: Spark cannot start", allow_module_level=True)

import pandas as pd  # noqa: E402

from dpstream.errors import InvalidEventError  # noqa: E402
from dpstream.spark import command  # noqa: E402
from dpstream.spark.read_counts import _arrow_counter, count_chunk, count_lines  # noqa: E402

from .test_spark_read import CLOCK, TRICKY  # noqa: E402

#: The corpus without its event of no step (``"t": null``), which the counting path
#: leaves to the path that reads the events (its step is the record's before it).
STEPPED = [line for line in TRICKY if b'"t": null' not in line]


def _brute(lines: list[bytes], until: int, max_items: int, domain, **mode):
    """(counts, totals) by the rules of docs/privacy.md, one parse per line: a bad
    record is skipped, an event is skipped whole when its step is past ``until``, when
    it has more than ``max_items`` distinct items or an item outside ``domain``, else
    each distinct item counts once in its step."""
    counts: Counter = Counter()
    totals: Counter = Counter()
    for raw in lines:
        rec = parse_jsonl_line(raw.decode("utf-8", "surrogateescape"), 1, **mode)
        if rec is None:
            continue
        if rec.error is not None:
            totals["bad"] += 1
        elif rec.t is None:
            totals["unstepped"] += 1
        else:
            totals["events"] += 1
            items = set(rec.items)
            if rec.t > until:
                totals["late"] += 1
            elif len(items) > max_items:
                totals["oversized"] += 1
            elif domain is not None and not items <= domain:
                totals["outside"] += 1
            else:
                counts.update((rec.t, item) for item in items)
    names = ("events", "bad", "late", "oversized", "outside", "unstepped")
    return dict(counts), [totals[n] for n in names]


@pytest.mark.parametrize("clock", [False, True])
@pytest.mark.parametrize("domain", [None, {"a", "b", "caf\u00e9", "padded", "clock"}])
def test_count_lines_counts_what_the_local_rules_keep(clock, domain) -> None:
    """The corpus (twice, in two calls, as two batches of a task) counted against the
    brute force, with and without a known domain, on integer steps and on a clock."""
    mode = {"time_field": CLOCK[0], "clock": StepClock.parse(CLOCK[1], CLOCK[2])} if clock else {}
    counts: dict = {}
    totals = [0] * 6
    for _ in range(2):
        count_lines(list(TRICKY), counts, totals, until=6, max_items=3, domain=domain, **mode)
    want, want_totals = _brute(TRICKY * 2, 6, 3, domain, **mode)
    assert counts == want
    assert totals == want_totals
    assert want and want_totals[0] and want_totals[1]  # events and bad lines are there
    assert clock or (want_totals[2] and want_totals[3] and want_totals[5])  # late, oversized...
    assert domain is None or want_totals[4]  # ... and outside the domain


def _columnar(batches: list[list[bytes]], until: int, max_items: int, domain) -> tuple:
    """(counts, totals) of the lines of ``batches`` through a task's columnar counter
    (``_arrow_counter`` on integer steps: the batches gathered into chunks), each batch
    an Arrow array sliced out of a larger one, as a task's batches can be."""
    import pyarrow as pa

    whole = pa.array([b"x", *(line for batch in batches for line in batch)], pa.binary())
    arrays, at = [], 1
    for batch in batches:
        arrays.append(pa.RecordBatch.from_arrays([whole.slice(at, len(batch))], ["value"]))
        at += len(batch)
    known = None if domain is None else (lambda: domain)
    out = list(_arrow_counter(until, max_items, known, None, None)(iter(arrays)))
    counts: Counter = Counter()
    for b in out[:-1]:
        d = b.to_pydict()
        for t, item, n in zip(d["t"], d["item"], d["n"], strict=True):
            counts[(t, item)] += n
    last = out[-1].to_pydict()  # the task's totals: steps -1, -2, ... in TOTALS' order
    assert last["t"] == [-1, -2, -3, -4, -5, -6] and last["item"] == [None] * 6
    return dict(counts), last["n"]


def _arrow_takes(lines: list[bytes]) -> bool:
    """Whether the counter's columnar path takes these lines as one chunk."""
    import pyarrow as pa

    from dpstream.io.jsonl import arrow_chunk
    from dpstream.io.lines import arrow_line_block

    return arrow_chunk(arrow_line_block(pa.array(lines, pa.binary()))) is not None


def _random_lines(*, seed: int, n: int, steps: int, items: int, longest: int) -> list[bytes]:
    """``n`` plain JSON Lines events (simulated data): steps 1..``steps``, 1..``longest``
    items each drawn from ``x0``..``x{items - 1}`` (repeats within an event)."""
    import random

    rng = random.Random(seed)
    return [
        b'{"t": %d, "items": [%s]}'
        % (
            rng.randint(1, steps),
            b", ".join(
                b'"x%d"' % rng.randint(0, items - 1) for _ in range(rng.randint(1, longest))
            ),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("domain", [None, {"a", "b", "caf\u00e9", "padded", "5", "x1"}])
def test_columnar_counts_are_the_brute_force_counts(domain, monkeypatch) -> None:
    """A task's counter against the brute force of the rules (one parse per line): on
    chunks Arrow takes whole (counted as columns, with rows Arrow leaves to the one-line
    parser: null items, steps past int64 or below 1, no step), on chunks it does not
    (every line decided alone), and on both in one task."""

    from dpstream.spark import read_counts

    monkeypatch.setattr(read_counts, "_CHUNK_BYTES", 30_000)  # several chunks a task
    many = _random_lines(seed=7, n=3000, steps=9, items=7, longest=5)
    taken = [line for line in TRICKY if _arrow_takes([line])]
    assert len(taken) > 20 and not _arrow_takes(TRICKY)
    columnar = [*many[:1000], *taken, *many[1000:], *taken]
    assert _arrow_takes(columnar)
    for batches in (
        [columnar[:7], columnar[7:2500], columnar[2500:]],  # columns only
        [TRICKY, TRICKY],  # every line alone
        [many[:500], TRICKY, many[500:]],  # both in one task
        [[]],
    ):
        lines = [line for batch in batches for line in batch]
        want = _brute(lines, 6, 3, domain)
        assert _columnar(batches, 6, 3, domain) == want
        # bad records, events without a step, late and oversized ones are there
        assert not lines or all(want[1][i] for i in (0, 1, 2, 3, 5))
        # steps near 2^62 kept (a tree counter's horizon may be that large)
        huge = _brute(lines, 1 << 62, 3, domain)
        assert _columnar(batches, 1 << 62, 3, domain) == huge
        assert not lines or max(t for t, _ in huge[0]) > 1 << 59
    # one line per chunk, through the local engine's chunk reader (Arrow's rows or the
    # one-line parser's): the columns counted as the lines are
    import pyarrow as pa

    from dpstream.io.jsonl import jsonl_chunk
    from dpstream.io.lines import arrow_line_block

    counts: Counter = Counter()
    totals = [0] * 6
    for line in TRICKY:
        ts, items, ns = count_chunk(
            jsonl_chunk(arrow_line_block(pa.array([line], pa.binary()))), totals,
            until=6, max_items=3, domain=domain,
        )  # fmt: skip
        pairs = zip(ts.tolist(), items.to_pylist(), strict=True)
        counts.update(dict(zip(pairs, ns.tolist(), strict=True)))
    assert (dict(counts), totals) == _brute(TRICKY, 6, 3, domain)


def test_distinct_in_records_keeps_each_records_items_once() -> None:
    """The (record, item) keys of a chunk made distinct, by comparing each with the
    keys before it in its record (records of up to 32 items) or by a sort (a longer
    record): the same set of keys as a brute force that walks each record with a set,
    and (on the first path) in input order."""
    from dpstream.spark.read_counts import _SHIFTS, _distinct_in_records

    rng = np.random.default_rng(31)
    for longest in (1, 2, 5, _SHIFTS, _SHIFTS + 1, 200):
        sizes = rng.integers(0, longest + 1, 400)
        sizes[rng.integers(400)] = longest
        k = 9  # item codes 0..8: many repeats within a record
        owner = np.repeat(np.arange(400), sizes)
        keys = owner * k + rng.integers(0, k, len(owner))
        want = []
        for rec in range(400):
            seen: set[int] = set()
            for key in keys[owner == rec].tolist():
                if key not in seen:
                    seen.add(key)
                    want.append(key)
        got = _distinct_in_records(keys, sizes).tolist()
        assert sorted(got) == sorted(want) and len(got) == len(set(got))
        if longest <= _SHIFTS:
            assert got == want
    assert _distinct_in_records(np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0


def test_columnar_counts_of_long_events_are_the_brute_force_counts() -> None:
    """Events of up to 60 items (past the comparison path's 32) with repeats, counted
    as columns: the brute force's counts, at a --max-items that keeps some and drops
    others as oversized."""
    lines = _random_lines(seed=60, n=400, steps=5, items=41, longest=60)
    assert _arrow_takes(lines)
    want = _brute(lines, 6, 30, None)
    assert want[1][3] > 0 and want[0]  # some oversized, some kept
    assert _columnar([lines[:150], lines[150:]], 6, 30, None) == want


def _cli(tmp_path: Path, mech: str, *extra: str) -> list[str]:
    key = tmp_path / "k.key"
    if not key.exists():
        fixed_key("spark-counts").save(key)
    args = ["run", "-m", mech, "-T", "10", "--rho", "2", "--max-items", "3", "--no-clamp"]
    if mech == "known":
        domain = tmp_path / "domain.txt"
        domain.write_text("a\nb\nc\\d\ncaf\u00e9\npadded\ncrlf\n5\n", encoding="utf-8")
        args += ["--domain", str(domain)]
    else:
        args += ["--threshold-delta", "1e-3"]
    return [*args, "--key-file", str(key), *extra]


@pytest.mark.parametrize("mech", ["known", "unknown"])
def test_counted_run_matches_the_local_engine(tmp_path, capsys, monkeypatch, mech) -> None:
    """The corpus through the counting path (the path that reads the events is made to
    fail): the same releases and the same number of skipped events as the local
    engine, KnownBase skipping the events with an item outside its domain."""
    from dpstream import cli

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(x + b"\n" for x in [*STEPPED, *STEPPED]))

    def no_events(*args, **kwargs):
        raise AssertionError("the run read the events instead of counting them")

    monkeypatch.setattr(command, "_parsed", no_events)
    skip = ["--on-invalid", "skip", "--max-invalid", "100%", "-i", str(inp)]
    local, spark_out = tmp_path / "local.csv", tmp_path / "spark.csv"
    capsys.readouterr()
    assert cli.main([*_cli(tmp_path, mech, *skip), "-o", str(local), *own_ledger(local)]) == 0
    local_skipped = re.findall(r"0 truncated, (\d+) skipped", capsys.readouterr().err)
    on_spark = ["--engine", "spark", "--master", "local[2]", "-o", str(spark_out)]
    assert cli.main([*_cli(tmp_path, mech, *skip), *on_spark, *own_ledger(spark_out)]) == 0
    spark_skipped = re.findall(r"\((\d+) invalid skipped\)", capsys.readouterr().err)
    assert len(local_skipped) == 1 and int(local_skipped[0]) > 40
    assert spark_skipped == local_skipped
    assert_spark_csv_matches(local, spark_out)


def test_an_oversized_event_stops_the_run_before_the_release(tmp_path) -> None:
    """``--on-invalid error``: an event over ``--max-items`` stops the run with an
    InvalidEventError before the noise scope is claimed and before anything is
    written (it once failed inside the release job, after the claim)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"t": 1, "items": ["a"]}\n{"t": 2, "items": ["a", "b", "c", "d"]}\n')
    out = tmp_path / "out"
    claimed: list[object] = []
    opts = {
        "mechanism": "unknown",
        "horizon": 4,
        "max_items": 3,
        "rho": 1.0,
        "threshold_delta": 1e-3,
        "input": str(inp),
        "output": str(out),
        "on_invalid": "error",
        "stream": "default",
    }
    with pytest.raises(
        InvalidEventError,
        match=r"^input line 2: event has 4 distinct items, more than --max-items 3 \(see",
    ):
        command.run_cli(
            opts, master="local[1]", key=fixed_key("spark-counts"), before_release=claimed.append
        )
    assert claimed == [] and not out.exists()


def test_an_event_without_a_step_counts_in_the_step_before_it(tmp_path) -> None:
    """An event with ``"t": null`` counts in the step of the last record before it with
    a step up to ``--until`` (a bad record with a step too; not one past ``--until``),
    else in the first step, as on the local engine; the Spark engine once dropped it
    (counted as an event, neither released nor skipped)."""
    from dpstream import cli

    lines = [
        '{"t": null, "items": ["lead"]}',
        '{"t": 1, "items": ["a"]}',
        '{"t": null, "items": ["b"]}',
        '{"t": 3, "items": [1.5]}',
        '{"t": null, "items": ["c"]}',
        '{"t": 9, "items": ["late"]}',
        '{"t": null, "items": ["d"]}',
        '{"t": 2, "items": ["e"]}',
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(x + "\n" for x in lines * 20))
    outs = {"local": tmp_path / "local.csv", "spark": tmp_path / "spark.csv"}
    base = ["run", "-q", "-m", "unknown", "-T", "4", "--max-items", "2", "--rho", "50"]
    base += ["--threshold-delta", "0.1", "--counter", "tree", "--on-invalid", "skip"]
    base += ["--max-invalid", "100%", "--key-file", str(tmp_path / "k.key"), "-i", str(inp)]
    fixed_key("spark-unstepped").save(tmp_path / "k.key")
    assert cli.main([*base, "-o", str(outs["local"]), *own_ledger(outs["local"])]) == 0
    on_spark = ["--engine", "spark", "--master", "local[2]", "-o", str(outs["spark"])]
    assert cli.main([*base, *on_spark, *own_ledger(outs["spark"])]) == 0
    assert {"lead", "b", "c", "d"} <= set(pd.read_csv(outs["local"])["item"])  # each released
    assert_spark_csv_matches(outs["local"], outs["spark"])


def test_columnar_counts_skip_an_event_with_a_null_item_as_oversized() -> None:
    """A record whose items hold a null (which the parsers word as an error today, but
    a chunk may carry) is skipped as too many items, as :func:`count_lines` skips it."""
    import numpy as np

    from dpstream.io.chunks import Chunk

    chunk = Chunk(
        lines=np.arange(1, 4),
        t=np.array([1, 1, 2]),
        errors={},
        offsets=np.array([0, 2, 3, 5]),
        codes=np.array([0, 1, 0, 2, 0]),  # {a, null}, {a}, {b, a}
        items=["a", None, "b"],
        buf=b"",
        starts=np.zeros(3, np.int64),
        ends=np.zeros(3, np.int64),
    )
    totals = [0] * 6
    ts, items, ns = count_chunk(chunk, totals, until=6, max_items=3)
    got = dict(zip(zip(ts.tolist(), items.to_pylist(), strict=True), ns.tolist(), strict=True))
    assert got == {(1, "a"): 1, (2, "a"): 1, (2, "b"): 1}
    assert totals == [3, 0, 0, 1, 0, 0]


def test_grouped_counts_are_the_flat_counts_per_item(monkeypatch) -> None:
    """A task's flat partial counts regrouped as one row per item (what crosses to the
    JVM): every (step, item) once with the sum of its counts, an item's steps ascending,
    the totals row last and unchanged, however the pairs fall into batches and flushes."""
    import pyarrow as pa

    from dpstream.spark import read_counts

    rng = np.random.default_rng(76)
    for flush in (1 << 20, 5):
        monkeypatch.setattr(read_counts, "_FLUSH", flush)
        batches, want = [], Counter()
        for _ in range(6):
            n = int(rng.integers(0, 12))
            ts = rng.integers(1, 6, n).tolist()
            items = [f"i{x}" for x in rng.integers(0, 5, n).tolist()]
            ns = rng.integers(1, 4, n).tolist()
            batches.append(pa.RecordBatch.from_pydict({"t": ts, "item": items, "n": ns}))
            for t, u, c in zip(ts, items, ns, strict=True):
                want[(t, u)] += c
        totals = read_counts._totals_batch(pa, [9, 8, 7, 6, 5, 4])
        out = list(read_counts.group_counts(iter([*batches, totals])))
        assert out[-1].to_pydict() == {"item": [None], "ts": [[-1, -2, -3, -4, -5, -6]],
                                       "ns": [[9, 8, 7, 6, 5, 4]]}  # fmt: skip
        got: Counter = Counter()
        for batch in out[:-1]:
            d = batch.to_pydict()
            if flush > 100:
                assert len(set(d["item"])) == len(d["item"])  # one row per item
            for u, ts, ns in zip(d["item"], d["ts"], d["ns"], strict=True):
                assert ts == sorted(set(ts)) and len(ts) == len(ns) and min(ns) >= 1
                for t, c in zip(ts, ns, strict=True):
                    got[(t, u)] += c
        assert got == want and sum(want.values()) > 0


@pytest.mark.parametrize("content", ["", '{"t": 6, "items": ["a"]}\n'])
def test_a_batch_with_nothing_for_its_steps_is_refused_on_spark(tmp_path, content) -> None:
    """Review 120, on Spark as in the local engine: an empty input, or one whose records
    are all for steps after --until, is refused before anything is written (the noise
    scope unclaimed); --allow-empty releases the steps."""
    from dpstream.run.guard import EmptyInputError

    inp = tmp_path / "in.jsonl"
    inp.write_text(content)
    out = tmp_path / "out"
    claimed: list[object] = []
    opts = {
        "mechanism": "unknown", "horizon": 8, "until": 4, "max_items": 3, "rho": 1.0,
        "threshold_delta": 1e-3, "input": str(inp), "output": str(out), "stream": "default",
    }  # fmt: skip
    key = fixed_key("spark-empty")
    with pytest.raises(EmptyInputError, match="--allow-empty"):
        command.run_cli(opts, master="local[1]", key=key, before_release=claimed.append)
    assert claimed == [] and not out.exists()
    opts["allow_empty"] = True
    command.run_cli(opts, master="local[1]", key=key, before_release=claimed.append)
    assert claimed and out.exists()
