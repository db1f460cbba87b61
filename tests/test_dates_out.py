"""Dates out: a run with a public clock records it in its sidecar, and every row of its
long outputs (CSV, jsonl-long, Parquet) says when its step begins and ends.

The expected dates are worked out here from ``--start`` plus k steps with
``datetime`` arithmetic (calendar months by year and month numbers), never by the
clock code under test. Without a clock the long outputs keep their four columns.
"""

from __future__ import annotations

import csv
import datetime as dt
import json

import pytest

from dpstream.run.output import long_layout_clock

from .conftest import fixed_key, run_unknown

FORMATS = {"csv": "csv", "jsonl-long": "jsonl", "parquet": "parquet"}


def _zone(hours: int) -> dt.timezone:
    return dt.timezone(dt.timedelta(hours=hours))


def _months_later(when: dt.datetime, k: int) -> dt.datetime:
    """``when`` k calendar months later, same day and time, same offset."""
    index = when.year * 12 + when.month - 1 + k
    return when.replace(year=index // 12, month=index % 12 + 1)


#: (--start, --step, T, step k's start as a function of k = t - 1)
CLOCKS = {
    # month steps across a year's end, in a positive offset, starting mid-month
    "months": (
        "2026-10-15T06:00:00+02:00",
        "1mo",
        5,
        lambda k: _months_later(dt.datetime(2026, 10, 15, 6, tzinfo=_zone(2)), k),
    ),
    # days across the US change to summer time (2026-03-08): the clock's zone is the
    # fixed offset of --start, so every step is 24 h and stays at -05:00
    "days over a DST change": (
        "2026-03-06T00:00:00-05:00",
        "1d",
        5,
        lambda k: dt.datetime(2026, 3, 6, tzinfo=_zone(-5)) + k * dt.timedelta(days=1),
    ),
    # 6 h steps across the European return to winter time (2026-10-25)
    "hours over a DST change": (
        "2026-10-24T12:00:00+02:00",
        "6h",
        6,
        lambda k: dt.datetime(2026, 10, 24, 12, tzinfo=_zone(2)) + k * dt.timedelta(hours=6),
    ),
}


@pytest.fixture
def keyed(tmp_path):
    key = tmp_path / "k.key"
    fixed_key("dates-out").save(key)
    return tmp_path, str(key)


def _run(key: str, src, out, fmt: str, *clock: str) -> int:
    return run_unknown(key, src, out, "--output-format", fmt, *clock)


def _rows(out, fmt: str) -> list[dict]:
    if fmt == "csv":
        with open(out, newline="") as fh:
            return list(csv.DictReader(fh))
    if fmt == "jsonl-long":
        return [json.loads(x) for x in out.read_text().splitlines()]
    import pyarrow.parquet as pq

    return pq.read_table(out).to_pylist()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", list(CLOCKS))
def test_long_outputs_carry_each_steps_start_and_end(keyed, fmt, name):
    tmp_path, key = keyed
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    start, step, horizon, start_of = CLOCKS[name]
    first = start_of(0)
    events = [
        {"ts": (first + dt.timedelta(minutes=7 * i)).isoformat(), "items": ["a", "b"]}
        for i in range(40)
    ]
    src = tmp_path / "ev.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / f"out.{FORMATS[fmt]}"
    clock = ["--time-field", "ts", "--start", start, "--step", step, "-T", str(horizon)]
    assert _run(key, src, out, fmt, *clock) == 0

    rows = _rows(out, fmt)
    assert list(rows[0]) == ["t", "item", "value", "noise_std", "step_start", "step_end"]
    assert {int(r["t"]) for r in rows} == set(range(1, horizon + 1))  # every step
    for row in rows:
        t = int(row["t"])
        assert row["step_start"] == start_of(t - 1).isoformat()
        assert row["step_end"] == start_of(t).isoformat()
    offsets = {r["step_end"][-6:] for r in rows} | {r["step_start"][-6:] for r in rows}
    assert offsets == {start[-6:]}  # one fixed offset, the one of --start

    # the sidecar records the clock: start, step, zone and the end of step T
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta["clock"] == {
        "start": start,
        "step": step,
        "time_zone": start[-6:],
        "end": start_of(horizon).isoformat(),
        "lateness_seconds": 0.0,
    }
    assert meta["horizon"] == horizon


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_without_a_clock_the_long_outputs_keep_four_columns(keyed, fmt):
    tmp_path, key = keyed
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    src = tmp_path / "ev.jsonl"
    src.write_text('{"t": 1, "items": ["a"]}\n{"t": 3, "items": ["b", "a"]}\n')
    out = tmp_path / f"out.{FORMATS[fmt]}"
    assert _run(key, src, out, fmt, "-T", "4") == 0
    rows = _rows(out, fmt)
    assert all(list(r) == ["t", "item", "value", "noise_std"] for r in rows)
    if fmt == "csv":
        assert out.read_text().splitlines()[0] == "t,item,value,noise_std"
    assert "clock" not in json.loads(out.with_name(out.name + ".meta.json").read_text())


@pytest.mark.parametrize("fmt", ["csv", "jsonl-long"])
def test_a_resumed_clocked_stream_writes_what_one_run_writes(keyed, fmt):
    """Day by day with --state and --until, the long output (with step_end) is byte for
    byte the output of one uninterrupted run."""
    tmp_path, key = keyed
    start = dt.datetime(2026, 1, 1, tzinfo=_zone(1))
    days = [
        [{"ts": (start + dt.timedelta(hours=h)).isoformat(), "items": ["a"]} for h in hours]
        for hours in ((1, 5, 30), (50, 51), (80,))
    ]
    clock = ["--time-field", "ts", "--start", start.isoformat(), "--step", "1d", "-T", "4"]
    out, state = tmp_path / f"out.{FORMATS[fmt]}", tmp_path / "s.sqlite"
    for n, (events, until) in enumerate(zip(days, ("2", "3", None), strict=True)):
        src = tmp_path / f"day{n}.jsonl"
        src.write_text("".join(json.dumps(e) + "\n" for e in events))
        more = ["--state", str(state), *(["--until", until] if until else [])]
        assert _run(key, src, out, fmt, *clock, *more) == 0
    whole = tmp_path / "all.jsonl"
    whole.write_text("".join(json.dumps(e) + "\n" for d in days for e in d))
    ref = tmp_path / f"ref.{FORMATS[fmt]}"
    assert _run(key, whole, ref, fmt, *clock) == 0
    assert out.read_bytes() == ref.read_bytes()
    assert [r["step_end"] for r in _rows(out, fmt)][-1] == "2026-01-05T00:00:00+01:00"


def test_a_long_output_keeps_the_clock_columns_it_was_begun_with(tmp_path):
    """A stream goes on with the layout of its file: one begun by a dpstream that wrote
    ``step_start`` only (or no clock column) keeps it, so the bytes on record stay."""
    cases = {
        ("csv", "t,item,value,noise_std\n"): (),
        ("csv", "t,item,value,noise_std,step_start\n"): ("step_start",),
        ("csv", "t,item,value,noise_std,step_start,step_end\n"): ("step_start", "step_end"),
        ("jsonl-long", '{"t": 1, "item": "a", "value": 1, "noise_std": 1.0}\n'): (),
        (
            "jsonl-long",
            '{"t": 1, "item": "a", "value": 1, "noise_std": 1.0, "step_start": "x"}\n',
        ): ("step_start",),
        (
            "jsonl-long",
            '{"t": 1, "item": null, "value": null, "noise_std": 1.0, "step_start": "x", '
            '"step_end": "y"}\n',
        ): ("step_start", "step_end"),
        ("csv", ""): None,  # nothing begun: the full layout
        ("jsonl-long", "not json\n"): None,
    }
    for (fmt, text), want in cases.items():
        path = tmp_path / "o"
        path.write_text(text)
        assert long_layout_clock(str(path), fmt) == want, (fmt, text)
    assert long_layout_clock(str(tmp_path / "absent"), "csv") is None


@pytest.mark.parametrize("round_counts", [True, False])
def test_every_path_of_the_long_formatters_writes_the_same_clock_columns(round_counts):
    """The columnar paths (Arrow's kernels, the C row joiner) write step_start and
    step_end as the row by row reference does, for items that need escaping too."""
    import numpy as np

    from dpstream import Release
    from dpstream.io import CsvFormatter, JsonlLongFormatter

    items = ["plain", "a,b", 'q"uote', "caf\u00e9", "new\nline"] + [f"i{k}" for k in range(300)]
    values = np.linspace(-50.4, 1e4, len(items))  # made-up counts

    def begins(t: int) -> str:
        return f"2026-01-{t:02d}T00:00:00+01:00"

    def ends(t: int) -> str:
        return f"2026-01-{t + 1:02d}T00:00:00+01:00"

    for its in (items, items[5:]):
        rel = Release(t=7, items=its, values=values[: len(its)], meta={"noise_std": 2.5})
        for cls in (CsvFormatter, JsonlLongFormatter):
            f = cls(round_counts, begins, ends)
            rows = f._format_rows(rel)
            assert f._format_columns(rel) == rows, cls.__name__
            assert f.format(rel) == rows
        lines = JsonlLongFormatter(round_counts, begins, ends).format(rel).decode().splitlines()
        assert [json.loads(x)["step_end"] for x in lines] == [ends(7)] * len(its)
        assert [json.loads(x)["item"] for x in lines] == its
        text = CsvFormatter(round_counts, begins, ends).format(rel).decode()
        got = list(csv.reader(text.splitlines(keepends=True)))
        assert [r[4:] for r in got] == [[begins(7), ends(7)]] * len(its)


def test_a_refused_parquet_run_writes_nothing(keyed):
    """A run refused before its first release (here: most events after --end) leaves no
    Parquet file; it used to leave an empty one, which then made the corrected run
    fail ("holds releases but no metadata sidecar")."""
    tmp_path, key = keyed
    pytest.importorskip("pyarrow")
    src = tmp_path / "ev.jsonl"
    src.write_text(
        "".join(json.dumps({"ts": f"2026-{m:02d}-10", "items": ["a"]}) + "\n" for m in (1, 5, 6))
    )
    out = tmp_path / "out.parquet"
    clock = ["--time-field", "ts", "--start", "2026-01-01", "--step", "1mo"]
    assert _run(key, src, out, "parquet", *clock, "--end", "2026-02-01") == 1
    assert not out.exists() and not out.with_name(out.name + ".meta.json").exists()
    assert _run(key, src, out, "parquet", *clock, "--end", "2026-07-01") == 0
    assert [r["step_end"][:7] for r in _rows(out, "parquet")] == [
        f"2026-{m:02d}" for m in range(2, 8)
    ]
