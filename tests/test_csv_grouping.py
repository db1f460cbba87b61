"""CSV input: an event is every row of one event id in one time step, wherever the rows
stand (docs/privacy.md, rule 7).

Rows of one event used to have to be consecutive: a row whose id came back after
another event's row was dropped, so the row in between decided it, and one event's
presence changed another's count (not covered by the guarantee). These tests run that
attack: removing every row of one event changes the release by that event's items
only, and the same rows in any order give the same bytes (with truncation and per
user as well).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from dpstream.cli import main
from dpstream.io import RawEvent, read_csv

from .conftest import fixed_key, own_ledger

DOMAIN = ["a", "b", "c", "d", "e"]

#: (event, t, item) rows: events of several rows, interleaved with other events of
#: their step and of other steps, an id used in two steps (two events), a repeated
#: item, an empty item cell, and steps out of order.
ROWS = [
    ("A", 1, "a"),
    ("B", 1, "b"),
    ("A", 1, "c"),
    ("C", 2, "a"),
    ("B", 1, "d"),
    ("A", 2, "b"),
    ("D", 1, "a"),
    ("C", 2, "c"),
    ("A", 1, "a"),
    ("D", 1, ""),
    ("E", 2, "d"),
    ("B", 3, "e"),
    ("E", 2, "b"),
    ("B", 2, "c"),
    ("F", 1, "e"),
    ("C", 2, "d"),
    ("F", 1, "b"),
]


def _events(rows):
    """The reference: each (step, id) is one event, its items the set of its rows'."""
    events: dict[tuple[int, str], set[str]] = {}
    for eid, t, item in rows:
        got = events.setdefault((t, eid), set())
        if item:
            got.add(item)
    return events


def _prefix_counts(rows, horizon):
    """The true histogram released at every step (counts up to that step)."""
    counts = {x: 0 for x in DOMAIN}
    per_step = {t: [] for t in range(1, horizon + 1)}
    for (t, _), items in _events(rows).items():
        per_step[t].append(items)
    out = []
    for t in range(1, horizon + 1):
        for items in per_step[t]:
            for x in items:
                counts[x] += 1
        out.append(dict(counts))
    return out


@pytest.fixture
def runner(tmp_path):
    key_path = tmp_path / "k.key"
    fixed_key("csv-grouping").save(key_path)
    domain = tmp_path / "domain.txt"
    domain.write_text("\n".join(DOMAIN) + "\n")
    made = iter(range(10**6))

    def run(rows, *args, header="event,t,item"):
        n = next(made)
        src, out = tmp_path / f"in{n}.csv", tmp_path / f"out{n}.jsonl"
        src.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
        assert (
            main(
                [
                    "run",
                    "-q",
                    "--key-file",
                    str(key_path),
                    "-i",
                    str(src),
                    "-o",
                    str(out),
                    "--time-column",
                    "t",
                    "--max-invalid",
                    "1",
                    *own_ledger(out),
                    *args,
                ]
            )
            == 0
        )  # each run compared with others: a ledger of its own
        return out.read_bytes()

    run.domain = str(domain)
    return run


def _released(data: bytes):
    return [json.loads(line)["released"] for line in data.decode().splitlines()]


def _known_exact(runner, rows, horizon=3):
    """A known-domain run whose noise is negligible (tau 1e-9, exact floats)."""
    return _released(
        runner(
            rows,
            "-m",
            "known",
            "--domain",
            runner.domain,
            "-T",
            str(horizon),
            "--max-items",
            "5",
            "--tau",
            "1e-9",
            "--no-round",
        )
    )


def _assert_counts(released, expected):
    assert len(released) == len(expected)
    for got, want in zip(released, expected, strict=True):
        assert set(got) == set(want)
        for x in want:
            assert abs(got[x] - want[x]) < 1e-6, (got, want)


def test_read_csv_groups_an_events_rows_wherever_they_stand_in_its_step():
    text = "event,item,t\nX,a,1\nY,b,1\nX,c,1\nX,d,2\nY,e,1\n"
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    # X of step 1 at its first row's line, its items in row order, its rows as raw bytes
    assert recs == [
        RawEvent(2, 1, ("a", "c"), None),
        RawEvent(3, 1, ("b", "e"), None),
        RawEvent(5, 2, ("d",), None),
    ]  # X of step 2: another event
    assert recs[0].raw == b"X,a,1\nX,c,1" and recs[1].raw == b"Y,b,1\nY,e,1"
    # without a time column the id alone is the event (all rows are one step)
    assert list(read_csv(io.StringIO("event,item\ne1,a\ne2,b\ne1,c\n"))) == [
        RawEvent(2, None, ("a", "c"), None),
        RawEvent(3, None, ("b",), None),
    ]


def test_read_csv_a_row_without_a_step_is_a_record_of_its_own():
    """A row whose step cannot be read belongs to no event: the event of the rows
    that have the step keeps their items, whatever the broken row holds."""
    text = "event,item,t\nX,a,1\nX,b,x\nY,c,1\nX,d,1\nX,e,0\n"
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert recs[0] == RawEvent(2, 1, ("a", "d"), None)
    assert recs[1].line == 3 and "integer" in recs[1].error and recs[1].raw == b"X,b,x"
    assert recs[2] == RawEvent(4, 1, ("c",), None)
    assert recs[3].line == 6 and ">= 1" in recs[3].error
    assert len(recs) == 4


def test_read_csv_a_row_without_an_event_id_is_a_record_of_its_own():
    """Review 89: rows with an empty event-id cell were read as one event of their step
    (four unrelated rows, then truncated to --max-items as one); each is now an invalid
    record alone, as a null id is in Parquet, and the other events keep their items."""
    text = "event,item,t\n,a,1\n,b,1\nX,c,1\n,d,1\n,e,2\nX,f,1\n"
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert [r.line for r in recs] == [2, 3, 4, 5, 6]
    for r in (recs[0], recs[1], recs[3], recs[4]):
        assert r.t is None and r.items is None and "event id column" in r.error
    assert recs[2] == RawEvent(4, 1, ("c", "f"), None)
    assert recs[0].raw == b",a,1"


def test_read_csv_at_user_level_an_event_is_one_id_of_one_user_in_one_step():
    """Review 81: rows of two users under one id made the whole event invalid, so one
    user's rows could cancel any other user's events. Each user's rows under an id are
    that user's event; a row without a user id is a record alone."""
    text = "event,item,t,user\nX,a,1,u\nY,b,1,v\nX,c,1,w\nZ,d,1,\nZ,e,1,z\nW,f,2,u\nX,g,1,u\n"
    recs = list(read_csv(io.StringIO(text), time_column="t", user_column="user"))
    assert recs[0] == RawEvent(2, 1, ("a", "g"), None, "u")
    assert recs[1] == RawEvent(3, 1, ("b",), None, "v")
    assert recs[2] == RawEvent(4, 1, ("c",), None, "w")  # X of user w: its own event
    assert recs[3].line == 5 and recs[3].t is None and "user id column" in recs[3].error
    assert recs[4] == RawEvent(6, 1, ("e",), None, "z")
    assert recs[5] == RawEvent(7, 2, ("f",), None, "u")
    assert len(recs) == 6


def test_one_users_rows_under_other_users_event_ids_change_only_that_users_counts(runner):
    """Review 81's reproduction: users B, C and D have one event each (ids e1, e2, e3)
    and user A adds a row under each id; A's rows made all three events invalid (a, b
    and c released 0). Removing A now changes only A's own contribution."""
    others = [("e1", 1, "a", "B"), ("e2", 1, "b", "C"), ("e3", 1, "c", "D")]
    attack = [("e1", 1, "d", "A"), ("e2", 1, "d", "A"), ("e3", 1, "e", "A")]
    user = ("--user-field", "user", "--max-items-per-user", "2", "--max-count-per-item", "1")

    def exact(rows):
        return _released(
            runner(rows, "-m", "known", "--domain", runner.domain, "-T", "1", "--max-items",
                   "5", "--tau", "1e-9", "--no-round", *user, header="event,t,item,user")
        )  # fmt: skip

    with_a = exact([others[0], attack[0], others[1], attack[1], others[2], attack[2]])
    without_a = exact(others)
    _assert_counts(without_a, [{"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}])
    _assert_counts(with_a, [{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}])  # A: d once (Linf 1)


def test_interleaved_rows_one_event_does_not_change_another(runner):
    """The reproduction: X,1,a / Y,1,b / X,1,c released a=1, b=1, c=0, and without Y
    a=1, c=1: Y's row decided that X's "c" was dropped. X's items are now released
    the same with and without Y, and each run releases the true counts."""
    with_y = _known_exact(runner, [("X", 1, "a"), ("Y", 1, "b"), ("X", 1, "c")], 1)
    without_y = _known_exact(runner, [("X", 1, "a"), ("X", 1, "c")], 1)
    _assert_counts(with_y, [{"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}])
    _assert_counts(without_y, [{"a": 1, "b": 0, "c": 1, "d": 0, "e": 0}])
    assert with_y[0]["a"] == without_y[0]["a"] and with_y[0]["c"] == without_y[0]["c"]


def test_removing_one_event_changes_only_that_events_contributions(runner):
    """Brute force over every event (step, id) of an interleaved CSV: the run without
    all of its rows releases the full run's counts minus exactly that event's items
    (the true histograms, read from runs with negligible noise)."""
    full = _known_exact(runner, ROWS)
    _assert_counts(full, _prefix_counts(ROWS, 3))
    for (t, eid), items in _events(ROWS).items():
        rest = [r for r in ROWS if (r[1], r[0]) != (t, eid)]
        without = _known_exact(runner, rest)
        _assert_counts(without, _prefix_counts(rest, 3))
        for step, (got, less) in enumerate(zip(full, without, strict=True), 1):
            diff = {x: round(got[x] - less[x]) for x in DOMAIN}
            assert diff == {x: int(step >= t and x in items) for x in DOMAIN}, (t, eid)


def _shuffles(rows, n, seed):
    rng = np.random.default_rng(seed)  # simulation data only (the order of the rows)
    return [[rows[i] for i in rng.permutation(len(rows))] for _ in range(n)]


def _grouped(rows, key=lambda r: (r[1], r[0])):
    """The rows of each event together, at its first row's place (a stable sort)."""
    first: dict = {}
    for i, r in enumerate(rows):
        first.setdefault(key(r), i)
    return sorted(rows, key=lambda r: first[key(r)])


@pytest.mark.parametrize("mode", ["known", "truncate", "unknown"])
def test_the_same_rows_in_any_order_give_the_same_bytes(runner, mode):
    """Every event's rows shuffled within its step and across the input: the same
    bytes. With --on-invalid truncate and --max-items 1 each event of several items
    keeps one of its own items, whatever the order of its rows."""
    args = {
        "known": ["-m", "known", "--domain", runner.domain, "--max-items", "5"],
        "truncate": [
            "-m",
            "known",
            "--domain",
            runner.domain,
            "--max-items",
            "1",
            "--on-invalid",
            "truncate",
        ],
        "unknown": [
            "-m",
            "unknown",
            "--max-items",
            "2",
            "--on-invalid",
            "truncate",
            "--threshold-delta",
            "1e-3",
        ],
    }[mode]
    # unknown: noise small enough for the threshold to let the items through
    args += ["-T", "4", "--no-round", *(["--tau", "0.01"] if mode == "unknown" else ["--rho", "1"])]
    grouped = runner(sorted(ROWS, key=lambda r: (r[1], r[0])), *args)
    assert len(_released(grouped)[-1]) == len(DOMAIN)  # every item released
    assert runner(ROWS, *args) == grouped
    for rows in _shuffles(ROWS, 3, seed=11):
        assert runner(rows, *args) == grouped
    # and within each step only (the steps in order, their rows shuffled)
    by_step = [
        r for t in (1, 2, 3) for r in _shuffles([r for r in ROWS if r[1] == t], 1, seed=t)[0]
    ]
    assert runner(by_step, *args) == grouped


def test_truncation_keeps_the_same_items_grouped_or_interleaved(runner):
    """--max-items 1 with truncation: each event's kept item is released with
    negligible noise, and equals the grouped input's whatever the interleaving."""
    args = [
        "-m",
        "known",
        "--domain",
        runner.domain,
        "-T",
        "3",
        "--max-items",
        "1",
        "--on-invalid",
        "truncate",
        "--tau",
        "1e-9",
        "--no-round",
    ]
    grouped = runner(_grouped(ROWS), *args)
    released = _released(grouped)
    # every event keeps exactly one item: the last step counts one per non-empty event
    assert round(sum(released[-1].values())) == sum(1 for v in _events(ROWS).values() if v)
    for rows in _shuffles(ROWS, 4, seed=3):
        assert runner(rows, *args) == grouped


USER_ROWS = [  # (event, t, user, item): users with more items than their bound
    ("e1", 1, "u1", "a"),
    ("e2", 1, "u2", "b"),
    ("e1", 1, "u1", "b"),
    ("e3", 1, "u1", "c"),
    ("e2", 1, "u2", "c"),
    ("e1", 1, "u1", "d"),
    ("e4", 2, "u1", "e"),
    ("e5", 2, "u2", "a"),
    ("e4", 2, "u1", "a"),
    ("e6", 2, "u3", "a"),
    ("e5", 2, "u2", "d"),
    ("e6", 2, "u3", "b"),
    ("e7", 3, "u2", "e"),
    ("e1", 3, "u3", "c"),
    ("e7", 3, "u2", "b"),
    ("e1", 3, "u3", "d"),
]


def test_user_level_bounding_is_the_same_grouped_or_interleaved(runner):
    """Per user (first come, first kept): an event stands where its first row stands,
    so an interleaved input keeps the contributions its grouped form keeps. The bound
    (2 items per user) drops some of every user's contributions, so the order of each
    user's events matters, and the release shows which were kept."""
    args = [
        "-m",
        "known",
        "--domain",
        runner.domain,
        "-T",
        "3",
        "--user-field",
        "user",
        "--max-items-per-user",
        "2",
        "--max-count-per-item",
        "1",
        "--tau",
        "1e-9",
        "--no-round",
    ]
    header = "event,t,user,item"
    interleaved = runner(USER_ROWS, *args, header=header)
    grouped = runner(_grouped(USER_ROWS), *args, header=header)
    assert interleaved == grouped
    # brute force: first come, first kept, events by their first row, items in row order
    kept: dict[str, list[str]] = {}
    counts = {x: 0 for x in DOMAIN}
    expected = []
    events: dict[tuple[int, str], tuple[str, list[str]]] = {}
    for eid, t, user, item in USER_ROWS:
        events.setdefault((t, eid), (user, []))[1].append(item)
    for t in (1, 2, 3):
        for (s, _), (user, items) in events.items():
            if s != t:
                continue
            mine = kept.setdefault(user, [])
            for x in dict.fromkeys(items):
                if x not in mine and len(mine) < 2:
                    mine.append(x)
                    counts[x] += 1
        expected.append(dict(counts))
    _assert_counts(_released(interleaved), expected)
    for rows in _shuffles(USER_ROWS, 3, seed=5):  # any order keeping first rows in place
        firsts = _grouped(rows)
        assert runner(rows, *args, header=header) == runner(firsts, *args, header=header)


def test_follow_does_not_read_csv(runner, tmp_path, capsys):
    src = tmp_path / "f.csv"
    src.write_text("event,ts,item\nX,2026-01-01T00:00:00Z,a\n")
    code = main(
        [
            "run",
            "-q",
            "-m",
            "known",
            "--domain",
            runner.domain,
            "-T",
            "3",
            "--max-items",
            "1",
            "--rho",
            "1",
            "--key-file",
            str(tmp_path / "k.key"),
            "-i",
            str(src),
            "--input-format",
            "csv",
            "-o",
            str(tmp_path / "f.jsonl"),
            "--time-field",
            "ts",
            "--start",
            "2026-01-01T00:00:00Z",
            "--step",
            "1h",
            "--follow",
        ]
    )
    assert code != 0 and "--follow reads JSON Lines input" in capsys.readouterr().err


def test_a_header_naming_a_used_column_twice_is_refused() -> None:
    """Review 78: a header ``event,item,ts,ts`` was read from its last ``ts``, silently."""
    from dpstream.io.csv import _Columns

    with pytest.raises(ValueError, match="names the column 'ts' .* more than once"):
        _Columns.of(["event", "item", "ts", " ts"], "item", "event", "ts", None)
    assert _Columns.of(["event", "item", "ts", "ts2"], "item", "event", "ts", None).time == 2


def test_a_row_with_more_or_fewer_fields_than_the_header_is_a_record_of_its_own():
    """Attack 09: a row with a field more than the header was read with the extra field
    dropped, so an unquoted comma in an item (``Smith, John``) counted the item
    ``Smith``; a row of a used column's width under a wider header was read too. Every
    row has the header's fields: another count is a malformed record alone (of no
    event), and the events of the other rows keep their items."""
    text = (
        "t,event,item,note\n"
        "1,e1,Smith, John\n"  # 4 fields: Smith and John shift into item and note
        "1,e5,b,x\n"
        "1,e2,b,x,extra\n"
        "1,e3,c\n"  # the columns read are there, the last one is not
        "1,e4,a,\n"  # an empty last field is a field
    )
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert recs == [
        RawEvent(2, 1, ("Smith",), None),
        RawEvent(3, 1, ("b",), None),
        RawEvent(4, None, None, "CSV row has 5 fields, expected 4 (as the header has)"),
        RawEvent(5, None, None, "CSV row has 3 fields, expected 4 (as the header has)"),
        RawEvent(6, 1, ("a",), None),
    ]
    assert [r.raw for r in recs[2:4]] == [b"1,e2,b,x,extra", b"1,e3,c"]
    text = "t,event,item\n1,e1,Smith, John\n1,e2,b\n1,e3,c,\n2,e4\n"
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert recs == [
        RawEvent(2, None, None, "CSV row has 4 fields, expected 3 (as the header has)"),
        RawEvent(3, 1, ("b",), None),
        RawEvent(4, None, None, "CSV row has 4 fields, expected 3 (as the header has)"),
        RawEvent(5, None, None, "CSV row has 2 fields, expected 3 (as the header has)"),
    ]


def test_a_row_of_another_width_is_counted_under_on_invalid(runner, tmp_path, capsys):
    """Attack 09 on the command line: the row ``1,e1,Smith, John`` is a malformed record,
    refused by --max-invalid 0 before anything is written, and skipped (counted, not
    released as "Smith") when the operator allows it."""
    (tmp_path / "names.txt").write_text("Smith\nb\n")
    src, out = tmp_path / "names.csv", tmp_path / "names.jsonl"
    src.write_text("t,event,item\n1,e1,Smith, John\n1,e2,b,extra\n1,e3,b\n")
    argv = ["run", "-m", "known", "--domain", str(tmp_path / "names.txt"), "-T", "1",
            "--max-items", "1", "--tau", "1e-9", "--no-round", "--key-file",
            str(tmp_path / "k.key"), "-i", str(src), "--time-column", "t", "-o", str(out),
            *own_ledger(out)]  # fmt: skip
    assert main([*argv, "--max-invalid", "0"]) == 1
    err = capsys.readouterr().err
    assert "2 of 3 records (66.7%) are malformed. Nothing was written" in err
    assert not out.exists()
    assert main([*argv, "--max-invalid", "1"]) == 0
    err = capsys.readouterr().err
    assert ", 1 events, " in err and "invalid events: 0 truncated, 2 skipped (2 malformed)" in err
    _assert_counts(_released(out.read_bytes()), [{"Smith": 0, "b": 1}])


@pytest.mark.parametrize(
    ("cell", "error"),
    [
        ("1_0", "time step must be an integer, got '1_0'"),  # int() reads it as 10
        ("\uff11", "time step must be an integer, got '\uff11'"),  # fullwidth 1
        ("\u0663", "time step must be an integer, got '\u0663'"),  # Arabic-Indic 3
        ("+1", "time step must be an integer, got '+1'"),  # not a JSON number either
        ("1.0", "time step must be an integer, got '1.0'"),
        ("", "time step must be an integer, got ''"),
        ("9" * 5000, "time step must be an integer, got '" + "9" * 40 + "... (5000 characters)'"),
        ("-3", "time step must be >= 1, got '-3'"),
        ("0", "time step must be >= 1, got '0'"),
        (" 2 ", None),
        ("007", None),
    ],
)
def test_a_time_step_cell_is_ascii_digits_with_an_optional_minus(cell, error):
    """Attack 09: the time cell was read by Python's int(), so ``1_0`` was step 10 and a
    fullwidth ``１`` step 1 (JSON Lines' "t" reads neither). A step is ASCII digits with
    an optional minus, as a JSON integer; anything else is a malformed record alone."""
    recs = list(read_csv(io.StringIO(f"t,event,item\n{cell},e1,a\n2,e2,b\n"), time_column="t"))
    assert recs[1:] == [RawEvent(3, 2, ("b",), None)]
    if error is None:
        assert recs[0] == RawEvent(2, int(cell), ("a",), None)
    else:
        assert recs[0].t is None and recs[0].items is None and recs[0].line == 2
        assert recs[0].error == error


class _Bytes:
    """A text stream over bytes, as the run opens a file (its ``buffer`` read as bytes)."""

    def __init__(self, data: bytes, size: int) -> None:
        from .test_io_lines import _Reads

        self.buffer = _Reads(data, size)


def _csv_records(lines) -> list[tuple]:
    recs = read_csv(lines, time_column="t", item_column="item", event_column="event")
    return [(r.line, r.t, r.items, r.error, r.raw) for r in recs]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_csv_lines_are_cut_as_python_s_text_reader_cuts_them(end):
    """CSV is read by the line reader of JSON Lines (bytes, a line too long read past);
    its records are those of Python's own text reader of the same bytes (the reader
    before), on hostile rows: quoted line breaks, blank lines, a byte-order mark, bytes
    that are not UTF-8, an unclosed quote, a last line without its terminator."""
    from dpstream.io.lines import line_texts

    rows = [
        b"t,event,item", b"1,e1,a", b"", b'1,e2,"b' + end + b'c"', b"2,e1,\xff\xfe",
        b'2,e3,"d""q"', b"2,e4,x,y", b'3,e5,"open', b"3,e6,f", b"3,e6,g",
    ]  # fmt: skip
    data = b"\xef\xbb\xbf" + end.join(rows)
    text = io.TextIOWrapper(
        io.BytesIO(data), encoding="utf-8-sig", errors="surrogateescape", newline=""
    )
    want = _csv_records(text)
    assert len(want) >= 5
    for size in (1, 5, 64, 1 << 16):
        assert _csv_records(line_texts(_Bytes(data, size), "test", size, ends=True)) == want


def test_a_csv_line_too_long_to_read_is_one_invalid_record(monkeypatch):
    """A CSV line longer than MAX_LINE_BYTES (here 100) is read past: its record is "line
    too long" (its first OVERLONG_HEAD bytes for the digest), the rows around it keep
    their lines and events."""
    from dpstream.io import jsonl, lines, records
    from dpstream.io.lines import line_texts

    for module in (jsonl, lines, records):
        monkeypatch.setattr(module, "MAX_LINE_BYTES", 100, raising=False)
        monkeypatch.setattr(module, "OVERLONG_HEAD", 8, raising=False)
    import dpstream.io.csv as csv_reader

    monkeypatch.setattr(csv_reader, "OVERLONG_HEAD", 8)
    long_row = b"1,e2," + b"z" * 200
    data = b"t,event,item\n1,e1,a\n" + long_row + b"\n2,e3,b\n"
    for size in (1, 7, 64, 1 << 16):
        got = _csv_records(line_texts(_Bytes(data, size), "test", size, ends=True))
        assert got == [
            (2, 1, ("a",), None, b"1,e1,a"),
            (3, None, None, "line too long (205 bytes, more than 100): not read", long_row[:8]),
            (4, 2, ("b",), None, b"2,e3,b"),
        ], size


def test_a_csv_run_holds_its_rows_compactly(tmp_path):
    """Review 119: the CSV reader held a _CsvEvent, two lists and a bytes object per
    event and row, about 14 times the input (a 19.6 MB CSV of 500,000 two-row events
    peaked at 385 MB, floor 100 MB). Rows are now held in one buffer and arrays, events
    in a table per step keyed by their id (211 MB). Here 400,000 rows (200,000 events,
    7.7 MB): the run's peak over a run of 2 rows stood at 130 MB before (17 times the
    input) and is 65 MB now; the limit, 95 MB, is between.
    Peaks are read from the kernel in a fresh process (not timed)."""
    from .conftest import run_peak

    key = tmp_path / "k.key"
    fixed_key("csv-memory").save(key)

    def peak(rows: int) -> int:
        data = tmp_path / f"in{rows}.csv"
        with open(data, "w") as fh:
            fh.write("t,event,item\n")
            fh.writelines(f"{1 + i // 400},e{i // 2},item{i * 7919 % 1000}\n" for i in range(rows))
        out = tmp_path / f"out{rows}.jsonl"
        argv = [
            "run", "--quiet", "-m", "unknown", "--max-items", "4", "--rho", "1",
            "--threshold-delta", "1e-6", "-T", "1000", "--key-file", str(key), "-i",
            str(data), "--input-format", "csv", "--time-column", "t", "-o", str(out),
            "--no-fsync", *own_ledger(out),
        ]  # fmt: skip
        status, mb, err = run_peak(argv)
        assert status == 0, err
        return mb

    grown = peak(400_000) - peak(2)
    assert grown < 95, grown


def test_a_csv_without_a_header_is_not_quoted_without_verbose_errors(tmp_path, capsys):
    """Review 122: a CSV written without a header has a record as its first line, and
    the error for a missing column listed its fields (an item, an e-mail address).
    They are listed with --verbose-errors only."""
    key = tmp_path / "k.key"
    fixed_key("csv-header").save(key)
    data = tmp_path / "nohdr.csv"
    data.write_text("1,SECRETITEM,ev7,alice@example.com\n2,x,ev8,bob\n")
    argv = ["run", "-m", "unknown", "--max-items", "2", "--rho", "1", "--threshold-delta"]
    argv += ["1e-6", "-T", "3", "-i", str(data), "--time-column", "t", "--key-file", str(key)]
    argv += ["-o", str(tmp_path / "o.jsonl"), *own_ledger(tmp_path / "o.jsonl")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no column 'item'" in err and "4 fields" in err
    assert "SECRETITEM" not in err and "alice" not in err
    assert main([*argv, "--verbose-errors"]) == 1
    assert "SECRETITEM" in capsys.readouterr().err
