"""The Spark engine dates events as the local one: an instant is in the step that holds
it (floored, never rounded), tests/test_clock_floor.py's boundary instants counted by
the workers (:mod:`dpstream.spark.read_counts`), parsed for the event path
(:mod:`dpstream.spark.read_jsonl`) and released by ``--engine spark`` against the
exact counts of a brute force over integer nanoseconds."""

from __future__ import annotations

from collections import Counter

import pytest

from .conftest import own_ledger, require_spark
from .test_clock_floor import (
    CLOCKS,
    _brute,
    _clock,
    _exact_run,
    _inputs,
    _line,
    _want,
    _written,
)

pytestmark = pytest.mark.spark

require_spark()

from dpstream.spark.read_counts import count_lines  # noqa: E402
from dpstream.spark.read_jsonl import parse_lines  # noqa: E402


def _cases(clock: str) -> list[tuple[bytes, int | None, str]]:
    """(line, its exact step, its item) for every written instant of ``clock``."""
    out = []
    for i, (_, value, exact) in enumerate(_written(clock)):
        item = "abc"[i % 3]
        out.append((_line(value, item).encode(), _brute(exact, clock), item))
    return out


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_the_workers_count_each_event_in_the_step_that_holds_it(clock) -> None:
    cases = _cases(clock)
    counts: dict = {}
    totals = [0] * 6
    count_lines(
        [line for line, _, _ in cases],
        counts,
        totals,
        until=2,
        max_items=1,
        time_field="ts",
        clock=_clock(clock),
    )
    want = Counter((t, item) for _, t, item in cases if t is not None)
    assert counts == dict(want)
    assert totals[1] == sum(t is None for _, t, _ in cases)  # before --start: invalid


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_the_workers_parse_each_event_into_the_step_that_holds_it(clock) -> None:
    cases = _cases(clock)
    ts, _, errors, _ = parse_lines([line for line, _, _ in cases], "ts", _clock(clock), False, None)
    assert ts == [t for _, t, _ in cases], [e for e in errors if e]


@pytest.mark.parametrize("users", [False, True])
def test_the_spark_engine_releases_the_exact_counts(tmp_path, users) -> None:
    """--engine spark on ISO-8601 (9 digits) and epoch numbers around the epoch's
    boundary: the local engine's release, which is the exact running counts."""
    from dpstream.cli import main

    from .conftest import assert_spark_csv_matches

    clock = "epoch"
    common = _exact_run(tmp_path, clock, "spark-clock-floor")
    inputs = _inputs(tmp_path, clock)
    want = _want(clock)
    for name in ("iso.jsonl", "epoch.jsonl"):
        path = inputs[name]
        if users:  # a user each: the event path (read_jsonl), not the counts
            lines = path.read_text().splitlines()
            path.write_text("".join(f'{raw[:-1]}, "u": "u{i}"}}\n' for i, raw in enumerate(lines)))
        extra = ["--user-field", "u", "--max-items-per-user", "1", "--max-count-per-item", "1"]
        extra = extra if users else []
        local, spark = tmp_path / f"{name}.csv", tmp_path / f"{name}.spark.csv"
        run = [*common, *extra, "-i", str(path)]
        assert main([*run, "-o", str(local), *own_ledger(local)]) == 0
        assert main([*run, "--engine", "spark", "--master", "local[2]", "-o", str(spark),
                     *own_ledger(spark)]) == 0  # fmt: skip
        assert_spark_csv_matches(local, spark)
        import pandas as pd

        rows = pd.read_csv(local)
        got = [
            {item: int(v) for item, v in zip(g["item"], g["value"], strict=True)}
            for _, g in rows.sort_values(["t", "item"]).groupby("t")
        ]
        assert got == want, name
