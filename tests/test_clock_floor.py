"""An instant belongs to the step that holds it, at whatever precision it is given.

Review finding: epoch floats were rounded half-even to the microsecond
(``datetime.fromtimestamp``), so ``1772409599.9999995`` fell in the step after the
one holding it, while the ISO text of the same instant stayed in its step; and a
Parquet ``ns`` timestamp 500 ns before 1970 was truncated toward zero by Arrow's
cast, to 1970-01-01T00:00, the next step. The same events then gave other
releases in Parquet and in JSON Lines.

Events a few nanoseconds either side of step boundaries (one at the epoch, so
pre-1970 instants; one in 2026; one at a tenth of a second) go through every
reader that dates an event, written every way a timestamp can be given (ISO-8601
with 7 or 9 digits and an offset, epoch seconds as JSON numbers, JSON strings,
floats and CSV text, Parquet ``ns`` timestamps, strings and floats, one row per
event and per item), and each must land in the step a brute force gives over
exact integer nanoseconds (a float counts as its shortest decimal text, ``repr``,
which is what JSON holds of it). The command line then releases the same bytes
from JSON Lines, CSV and Parquet, equal to the exact counts (a huge budget makes
the rounded noise zero), and so does the Spark engine.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpstream.cli import main
from dpstream.clock import StepClock, parse_timestamp
from dpstream.io.csv import read_csv
from dpstream.io.jsonl import parse_jsonl_line, read_jsonl
from dpstream.io.parquet import read_parquet_records

from .conftest import fixed_key, own_ledger

NS = 10**9
UTC = dt.timezone.utc
#: (--start, --step, the start in epoch nanoseconds, the step in nanoseconds)
CLOCKS = {
    "epoch": ("1969-12-31T00:00Z", "1d", -86400 * NS, 86400 * NS),
    "2026": ("2026-03-01T00:00Z", "1d", 1772323200 * NS, 86400 * NS),
    "tenth": ("2026-03-01T00:00:00.1Z", "1h", 1772323200 * NS + NS // 10, 3600 * NS),
}
#: Nanoseconds from the end of step 1 (the boundary with step 2).
OFFSETS = [-1000, -999, -501, -500, -499, -100, -1, 0, 1, 499, 500, 501, 999, 1000]


def _brute(seconds: Fraction, clock: str) -> int | None:
    """The step of an instant (exact seconds since the epoch), or None before the start:
    the floor of (instant - start) / step over exact integers."""
    _, _, start, step = CLOCKS[clock]
    ns = seconds * NS
    assert ns.denominator == 1  # every instant here is a whole nanosecond
    t = (int(ns) - start) // step + 1
    return t if t >= 1 else None


def _instants(clock: str) -> list[int]:
    """Epoch nanoseconds around the boundary of steps 1 and 2 (and one well inside)."""
    _, _, start, step = CLOCKS[clock]
    return [start + step + off for off in OFFSETS] + [start + step // 2]


def _epoch_text(ns: int) -> str:
    """Exact epoch seconds with 9 decimals (``-0.000000500``)."""
    sign, n = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{n // NS}.{n % NS:09d}"


def _iso(ns: int, digits: int = 9, offset: int = 0) -> str:
    """ISO-8601 of an instant with ``digits`` fractional digits (exact: the instant must
    be a whole number of them) in the UTC offset of ``offset`` hours."""
    assert ns % 10 ** (9 - digits) == 0
    seconds, frac = divmod(ns, NS)
    zone = dt.timezone(dt.timedelta(hours=offset))
    wall = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)
    text = wall.astimezone(zone).replace(tzinfo=None).isoformat(timespec="seconds")
    zone_text = "Z" if offset == 0 else f"{offset:+03d}:00"
    return f"{text}.{frac // 10 ** (9 - digits):0{digits}d}{zone_text}"


def _written(clock: str) -> list[tuple[str, object, Fraction]]:
    """(how, the JSON value of the timestamp, its exact seconds) for every instant of
    ``clock`` and every way JSON Lines can give it."""
    out: list[tuple[str, object, Fraction]] = []
    for ns in _instants(clock):
        exact = Fraction(ns, NS)
        out.append(("iso9", _iso(ns), exact))
        out.append(("iso9+01", _iso(ns, offset=1), exact))
        out.append(("iso9-05", _iso(ns, offset=-5), exact))
        if ns % 100 == 0:
            out.append(("iso7", _iso(ns, 7), exact))
        out.append(("epoch-text", _epoch_text(ns), exact))
        out.append(("epoch-number", _Raw(_epoch_text(ns)), exact))
        f = float(_epoch_text(ns))
        out.append(("float", f, Fraction(repr(f))))
    return out


class _Raw(str):
    """A JSON number written as this text (its digits, more than a double holds)."""


def _line(value: object, item: str = "a") -> str:
    text = value if isinstance(value, _Raw) else json.dumps(value)
    return f'{{"ts": {text}, "items": ["{item}"]}}'


def _clock(name: str) -> StepClock:
    start, step, _, _ = CLOCKS[name]
    return StepClock.parse(start, step)


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_the_clock_floors_every_written_instant(clock) -> None:
    """parse_timestamp then step_of, on every way a JSON value gives an instant."""
    c = _clock(clock)
    for how, value, exact in _written(clock):
        want = _brute(exact, clock) or 0
        given = Decimal(value) if isinstance(value, _Raw) else value  # as the reader keeps it
        assert c.step_of(parse_timestamp(given)) == want, (how, value)


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_json_lines_dates_each_event_in_the_step_that_holds_it(clock) -> None:
    written = _written(clock)
    recs = list(read_jsonl([_line(v) for _, v, _ in written], time_field="ts", clock=_clock(clock)))
    assert len(recs) == len(written)
    for rec, (how, value, exact) in zip(recs, written, strict=True):
        want = _brute(exact, clock)
        assert rec.t == want, (how, value, rec.error)
        assert (rec.error is None) == (want is not None)


def test_the_reviewers_epoch_float_stays_before_the_boundary() -> None:
    """``1772409599.9999995`` (a double just before 2026-03-02T00:00Z) is in step 1,
    as its ISO text is; a number with more digits than a double is read as written."""
    line = {"time_field": "ts", "clock": _clock("2026")}
    for text in ("1772409599.9999995", "1772409599.99999999", '"2026-03-01T23:59:59.9999996Z"'):
        rec = parse_jsonl_line(f'{{"ts": {text}, "items": ["a"]}}', 1, **line)
        assert rec is not None and rec.t == 1, text
    rec = parse_jsonl_line('{"ts": 1772409600.0, "items": ["a"]}', 1, **line)
    assert rec is not None and rec.t == 2


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_csv_dates_each_event_in_the_step_that_holds_it(clock) -> None:
    """CSV text: ISO-8601 and epoch seconds (the cell's digits, exactly)."""
    cases = [(how, str(v), e) for how, v, e in _written(clock) if how != "float"]
    rows = ["ts,event,item"] + [f"{v},e{i},a" for i, (_, v, _) in enumerate(cases)]
    recs = list(
        read_csv(io.StringIO("\n".join(rows) + "\n"), time_column="ts", clock=_clock(clock))
    )
    assert len(recs) == len(cases)
    for rec, (how, value, exact) in zip(recs, cases, strict=True):
        assert rec.t == _brute(exact, clock), (how, value, rec.error)


def _parquet(path: Path, column: pa.Array, *, per_item: bool = False) -> None:
    n = len(column)
    if per_item:
        table = pa.table({"ts": column, "event": [f"e{i}" for i in range(n)], "item": ["a"] * n})
    else:
        table = pa.table({"ts": column, "items": pa.array([["a"]] * n, pa.list_(pa.string()))})
    pq.write_table(table, path)


@pytest.mark.parametrize("clock", list(CLOCKS))
@pytest.mark.parametrize(
    "kind", ["ns-utc", "ns-naive", "ns-paris", "ns-per-item", "iso-string", "float64"]
)
def test_parquet_dates_each_event_in_the_step_that_holds_it(tmp_path, clock, kind) -> None:
    """Parquet ns timestamps (floored on their integers, with and without a zone, one row
    per event and per item), ISO strings with 9 digits and float64 epoch seconds."""
    instants = _instants(clock)
    exact = [Fraction(ns, NS) for ns in instants]
    if kind.startswith("ns"):
        tz = {"ns-naive": None, "ns-paris": "Europe/Paris"}.get(kind, "UTC")
        column = pa.array(instants, pa.int64()).cast(pa.timestamp("ns", tz))
    elif kind == "iso-string":
        column = pa.array([_iso(ns) for ns in instants], pa.string())
    else:
        floats = [float(_epoch_text(ns)) for ns in instants]
        column = pa.array(floats, pa.float64())
        exact = [Fraction(repr(f)) for f in floats]
    path = tmp_path / "e.parquet"
    _parquet(path, column, per_item=kind == "ns-per-item")
    settings = {"time_field": "ts", "clock": _clock(clock)}
    if kind == "ns-per-item":
        settings["item_column"] = "item"
    recs = list(read_parquet_records(str(path), **settings))
    assert [r.t for r in recs] == [_brute(e, clock) for e in exact], [r.error for r in recs]


#: The command line: KnownBase with a budget so large that the rounded noise is zero,
#: so a release is the exact running count of each item.
EXACT = ["run", "-q", "-m", "known", "--max-items", "1", "--rho", "5e7", "-T", "2"]


def _events(clock: str) -> list[tuple[int, str]]:
    """(epoch ns, item) of the command-line runs: the boundary's instants, an item each
    from the instant's place (so a misplaced event changes the counts)."""
    return [(ns, "abc"[i % 3]) for i, ns in enumerate(_instants(clock))]


def _want(clock: str) -> list[dict]:
    """The exact release of :func:`_events`: each step's running count of each item."""
    counts = {1: dict.fromkeys("abc", 0), 2: dict.fromkeys("abc", 0)}
    for ns, item in _events(clock):
        t = _brute(Fraction(ns, NS), clock)
        assert t in (1, 2)
        for later in range(t, 3):
            counts[later][item] += 1
    return [counts[1], counts[2]]


def _inputs(tmp_path: Path, clock: str) -> dict[str, Path]:
    """The events of :func:`_events` as JSON Lines (ISO-8601, 9 digits; and epoch
    numbers), CSV (epoch text) and Parquet (ns timestamps)."""
    events = _events(clock)
    paths = {
        "iso.jsonl": [_line(_iso(ns), item) for ns, item in events],
        "epoch.jsonl": [_line(_Raw(_epoch_text(ns)), item) for ns, item in events],
        "epoch.csv": ["ts,event,item"]
        + [f"{_epoch_text(ns)},e{i},{item}" for i, (ns, item) in enumerate(events)],
    }
    out = {}
    for name, lines in paths.items():
        out[name] = tmp_path / name
        out[name].write_text("\n".join(lines) + "\n")
    out["ns.parquet"] = tmp_path / "ns.parquet"
    pq.write_table(
        pa.table(
            {
                "ts": pa.array([ns for ns, _ in events], pa.int64()).cast(
                    pa.timestamp("ns", "UTC")
                ),
                "items": pa.array([[item] for _, item in events], pa.list_(pa.string())),
            }
        ),
        out["ns.parquet"],
    )
    return out


def _released(path: Path) -> list[dict]:
    return [json.loads(line)["released"] for line in path.read_text().splitlines()]


def _exact_run(tmp_path: Path, clock: str, key_name: str) -> list[str]:
    """The arguments of a run whose rounded releases are the exact counts, on the clock
    ``clock`` (a key and a domain of three items written in ``tmp_path``)."""
    key = tmp_path / "k.key"
    fixed_key(key_name).save(key)
    (tmp_path / "dom.txt").write_text("a\nb\nc\n")
    start, step, _, _ = CLOCKS[clock]
    common = [*EXACT, "--domain", str(tmp_path / "dom.txt"), "--key-file", str(key)]
    return [*common, "--time-field", "ts", "--start", start, "--step", step]


@pytest.mark.parametrize("clock", ["epoch", "2026"])
def test_every_format_releases_the_exact_counts_and_the_same_bytes(tmp_path, clock) -> None:
    common = _exact_run(tmp_path, clock, "clock-floor")
    outs = []
    for name, path in _inputs(tmp_path, clock).items():
        out = tmp_path / f"{name}.out.jsonl"
        assert main([*common, "-i", str(path), "-o", str(out), *own_ledger(out)]) == 0
        assert _released(out) == _want(clock), name
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[3]  # JSON Lines and Parquet: one stream's bytes
    assert _released(tmp_path / "epoch.csv.out.jsonl") == _want(clock)


def test_offsets_with_seconds_and_foreign_digits_are_refused() -> None:
    """Review 78: Python reads an offset of a fraction of a second only as none (the
    event landed in another step), and a run of Arabic-Indic digits as epoch seconds; an
    offset is hours, minutes and whole seconds, and epoch seconds are ASCII digits. A
    duration too long for Python's dates is refused in words (an OverflowError before)."""
    from dpstream.clock import parse_duration, parse_timestamp

    for text in (
        "2026-03-01T01:00:00+00:00:00.5",
        "2026-03-01T01:00:00-00:00:00.000001",
        "2026-03-01T01:00:00+00:00:01.5",
    ):
        with pytest.raises(ValueError, match="hours and minutes"):
            parse_timestamp(text)
    # whole seconds: a zone's old local mean time (Paris before 1911)
    assert parse_timestamp("1900-01-01T00:09:21+00:09:21") == dt.datetime(
        1900, 1, 1, tzinfo=dt.timezone.utc
    )
    assert parse_timestamp("2026-03-01T01:00:00+05:30") == dt.datetime(
        2026, 2, 28, 19, 30, tzinfo=dt.timezone.utc
    )
    with pytest.raises(ValueError):
        parse_timestamp("\u0661\u0662\u0663")
    with pytest.raises(ValueError, match="at most 999999999 days"):
        parse_duration("99999999999999999999d")
