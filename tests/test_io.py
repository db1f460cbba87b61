"""Readers, step grouping, formatters and keyed truncation of dpstream.io."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from dpstream.io import (
    CsvFormatter,
    JsonlFormatter,
    KeyedTruncator,
    RawEvent,
    group_steps,
    read_csv,
    read_domain,
    read_jsonl,
)
from dpstream.mechanisms.base import Release
from dpstream.noise import NoiseSource

from .conftest import Z_TOL, fixed_key


def test_read_jsonl_forms_and_line_numbers():
    text = '{"items": ["a", "b"], "t": 2, "x": 1}\n\n["c", 5]\n{"t": 3}\nnot json\n[true]\n7\n'
    recs = list(read_jsonl(io.StringIO(text)))
    assert [r.line for r in recs] == [1, 3, 4, 5, 6, 7]
    assert recs[0] == RawEvent(1, 2, ("a", "b"), None)
    assert recs[1].error and '"t"' in recs[1].error  # no step: invalid, of no step
    assert recs[2] == RawEvent(4, 3, None, recs[2].error)  # bad items: keeps its step
    assert all(r.error for r in recs[1:])
    assert "items" in recs[2].error and "JSON" in recs[3].error


def test_read_jsonl_implicit_time_makes_every_line_a_step():
    """Review finding A: a broken or blank line must still be a step, or it shifts every
    later step (its neighbour, an empty event [], is a step)."""
    text = '["c", 5]\n\n[1.5]\n["\\ud83d"]\nnot json\n{"t": 3, "items": []}\n[]\n'
    recs = list(read_jsonl(io.StringIO(text), implicit=True))
    assert [r.line for r in recs] == [1, 2, 3, 4, 5, 6, 7]
    assert recs[0] == RawEvent(1, None, ("c", "5"), None)  # integer items read as text
    assert all(r.error for r in recs[1:6]) and recs[6] == RawEvent(7, None, (), None)
    steps = [(t, [r.line for r in rs]) for t, rs in group_steps(recs, 10, implicit=True)]
    assert steps == [(i, [i]) for i in range(1, 8)]


def test_read_jsonl_rejects_bad_t():
    recs = list(
        read_jsonl(['{"t": 0, "items": []}', '{"t": "3", "items": []}', '{"t": true, "items": []}'])
    )
    assert all(r.error and '"t"' in r.error for r in recs)


def test_read_csv_groups_rows_by_event_and_step():
    text = "event,item,t\ne1,a,1\ne1,b,1\ne2,a,1\ne3,,2\ne4,c,x\ne5,a,3\ne5,b,4\n"
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert recs[0] == RawEvent(2, 1, ("a", "b"), None)
    assert recs[1] == RawEvent(4, 1, ("a",), None)
    assert recs[2] == RawEvent(5, 2, (), None)
    assert recs[3].line == 6 and "integer" in recs[3].error
    # an id in two steps is two events (an event is an id in one step)
    assert recs[4:] == [RawEvent(7, 3, ("a",), None), RawEvent(8, 4, ("b",), None)]


def test_read_csv_missing_column_names_it():
    with pytest.raises(ValueError, match="'item'"):
        list(read_csv(io.StringIO("event,thing\n1,a\n")))


def _ev(line, t, items=("a",)):
    return RawEvent(line, t, tuple(items), None)


def test_group_steps_shared_t_gaps():
    recs = [_ev(1, 1), _ev(2, 1), _ev(3, 4), _ev(4, 6)]
    steps = [(t, [r.line for r in rs]) for t, rs in group_steps(recs, horizon=10)]
    assert steps == [(1, [1, 2]), (2, []), (3, []), (4, [3]), (5, []), (6, [4])]
    # a stream going on from step 4: the first step is 5
    steps = [(t, [r.line for r in rs]) for t, rs in group_steps([_ev(1, 6)], 10, start=4)]
    assert steps == [(5, []), (6, [1])]


def test_group_steps_a_record_counts_in_its_own_step_wherever_it_stands():
    bad = RawEvent(2, None, None, "broken")
    bad_items = RawEvent(6, 3, None, "bad items")  # its time is readable: it stays in step 3
    recs = [_ev(1, 1), bad, _ev(3, 2), _ev(4, 1), bad_items, _ev(5, 9)]
    steps = list(group_steps(recs, horizon=3))
    # the record past the horizon comes out at once, alone; then steps 1..3 in order
    assert [t for t, _ in steps] == [9, 1, 2, 3]
    # line 4 (step 1) after a step-2 record is not late: it counts in step 1; the
    # broken record without a time stays with the step of the record before it
    assert [r.line for r in steps[1][1]] == [1, 2, 4]
    assert all(r.error is None for r in steps[1][1] if r.line != 2)
    assert [r.line for r in steps[2][1]] == [3]
    assert steps[3][1] == [bad_items]
    trailing = list(group_steps([_ev(1, 1), _ev(2, 2), bad], horizon=3))
    assert trailing[-1] == (2, [_ev(2, 2), bad])
    assert list(group_steps([bad], horizon=3)) == [(None, [bad])]
    leading = list(group_steps([bad, _ev(3, 3)], horizon=5))
    assert leading == [(1, [bad]), (2, []), (3, [_ev(3, 3)])]
    again = list(group_steps([_ev(1, 2), _ev(2, 4)], horizon=5, start=2))
    assert [t for t, _ in again] == [3, 4] and "time order" in again[0][1][0].error


def test_group_steps_order_of_the_input_changes_no_step():
    """Neighbours: the same records in any order give each step the same records (in
    input order within the step), so one record cannot make others late."""
    rng = np.random.default_rng(5)  # simulation data only
    recs = [_ev(i, int(t)) for i, t in enumerate(rng.integers(1, 8, 60), start=1)]
    ordered = sorted(recs, key=lambda r: r.t)
    shuffled = [recs[i] for i in rng.permutation(len(recs))]

    def by_step(rs):
        return {t: sorted(r.line for r in group) for t, group in group_steps(rs, horizon=10)}

    assert by_step(shuffled) == by_step(ordered) == by_step(recs)
    assert all(r.error is None for _, group in group_steps(shuffled, horizon=10) for r in group)


def test_a_record_past_the_limit_does_not_move_time():
    """A record of a step past the limit (--until, or the horizon) is rejected by the
    caller; it must act as if it were not there. It used to close every step before
    it, so the in-range records after it were late: one record changed the counts of
    every event that followed it. Consecutive ones of one step come out together."""
    recs = [_ev(1, 1), _ev(2, 7), _ev(3, 7), _ev(4, 8), _ev(5, 1), _ev(6, 2), _ev(7, 50)]
    steps = [
        (t, [(r.line, r.error) for r in rs]) for t, rs in group_steps(recs, horizon=10, limit=5)
    ]
    assert steps == [
        (7, [(2, None), (3, None)]),
        (8, [(4, None)]),
        (50, [(7, None)]),
        (1, [(1, None), (5, None)]),
        (2, [(6, None)]),
    ]
    without = [
        (t, [(r.line, r.error) for r in rs])
        for t, rs in group_steps([recs[0], recs[4], recs[5]], horizon=10, limit=5)
    ]
    assert [s for s in steps if s[0] <= 5] == without  # the same steps, the same records


def test_read_domain_lines_and_json(tmp_path):
    (tmp_path / "d.txt").write_text("a\n\nb\n")
    (tmp_path / "d.json").write_text('["a", 2]')
    (tmp_path / "dup.txt").write_text("a\na\n")
    assert read_domain(str(tmp_path / "d.txt")) == ["a", "b"]
    assert read_domain(str(tmp_path / "d.json")) == ["a", "2"]
    with pytest.raises(ValueError, match="twice"):
        read_domain(str(tmp_path / "dup.txt"))


def test_jsonl_formatter_round_trips_floats_exactly():
    values = np.array([0.1 + 0.2, -1e-17, 12345.678901234567])
    rel = Release(t=3, items=["a", "b", "c"], values=values, meta={"threshold": np.float64(2.5)})
    obj = json.loads(JsonlFormatter().format(rel))
    assert obj["t"] == 3 and obj["meta"] == {"threshold": 2.5}
    assert np.array_equal(np.array(list(obj["released"].values())), values)
    assert json.loads(JsonlFormatter(round_counts=True).format(rel))["released"] == {
        "a": 0,
        "b": 0,
        "c": 12346,
    }


def test_csv_formatter():
    rel = Release(t=2, items=["x,y", "b"], values=np.array([1.5, -2.25]), meta={"noise_std": 0.75})
    f = CsvFormatter()
    assert f.header() == b"t,item,value,noise_std\n"
    assert f.format(rel) == b'2,"x,y",1.5,0.75\n2,b,-2.25,0.75\n'
    assert CsvFormatter(round_counts=True).format(rel) == b'2,"x,y",2,0.75\n2,b,-2,0.75\n'
    # a step that releases nothing is still a row (every step is in the table)
    empty = Release(t=3, items=[], values=np.array([]), meta={"noise_std": 0.5})
    assert f.format(empty) == b"3,,,0.5\n"


def test_keyed_truncation_is_deterministic_and_not_first_k():
    src = NoiseSource(fixed_key("trunc"), "default/truncate")
    trunc = KeyedTruncator(src, 2)
    items = ("a", "b", "c", "d", "a")
    assert trunc(items, 7) == trunc(items, 7)
    assert trunc(("a", "b"), 1) == ("a", "b")
    n = 4000
    kept = {i: 0 for i in "abcd"}
    for ordinal in range(1, n + 1):
        out = trunc(items, ordinal)
        assert len(out) == 2 and list(out) == sorted(out, key="abcd".index)
        for i in out:
            kept[i] += 1
    # Each item is kept with probability 2/4 = 1/2 per event (uniform keyed choice), so
    # its count is Binomial(n, 1/2): sd = sqrt(n/4) ~ 31.6; allow Z_TOL sd. "First k"
    # would keep a and b every time (count n), 63 sd away.
    sd = (n * 0.25) ** 0.5
    for i, c in kept.items():
        assert abs(c - n / 2) <= Z_TOL * sd, (i, c)


# --------------------------------------------------------------------------- hostile input


def test_read_csv_an_id_that_comes_back_is_the_same_event_not_a_second_one():
    # e1's rows are not consecutive: read as two events, e1 would count 2 items under
    # a bound of 1 item per event (review finding 8). They are one event, at its first
    # row's line, which --max-items bounds as a whole.
    recs = list(read_csv(io.StringIO("event,item\ne1,a\ne2,b\ne1,c\n")))
    assert recs == [RawEvent(2, None, ("a", "c"), None), RawEvent(3, None, ("b",), None)]
    # however many rows came between, in its step (t = 1), and in a step out of order
    step = "".join(f"e{i},a,1\n" for i in range(500))
    text = "event,item,t\n" + step + "e0,b,2\ne0,c,1\n" + step
    recs = list(read_csv(io.StringIO(text), time_column="t"))
    assert recs[0] == RawEvent(2, 1, ("a", "c", "a"), None)
    assert recs[1:500] == [RawEvent(i + 2, 1, ("a", "a"), None) for i in range(1, 500)]
    assert recs[500:] == [RawEvent(502, 2, ("b",), None)]  # e0 in step 2: another event


def test_read_csv_unclosed_quote_is_invalid_and_names_the_line_it_started():
    # a record over several lines is an invalid record per line (review 111: the rows
    # it swallowed counted as one invalid record, so --max-invalid let them go)
    to_eof = list(read_csv(io.StringIO('event,item\n0,"oops\n1,a\n2,a\n3,a\n')))
    assert [r.line for r in to_eof] == [2, 3, 4, 5]
    assert all("unclosed quote" in r.error for r in to_eof)
    closed_later = list(read_csv(io.StringIO('event,item\n0,"oops\n1,a\n2,a"\n3,a\n')))
    assert [r.line for r in closed_later[:3]] == [2, 3, 4]
    assert all("spans lines (lines 2-4" in r.error for r in closed_later[:3])
    assert closed_later[3:] == [RawEvent(5, None, ("a",), None)]
    # in a column the run does not read, too (its rows were dropped without a word)
    note = 'event,item,note\n0,a,"he said ""hi\n1,a,ok\n2,a,bye"\n3,b,ok\n'
    assert [(r.line, bool(r.error)) for r in read_csv(io.StringIO(note))] == [
        (2, True),
        (3, True),
        (4, True),
        (5, False),
    ]
    junk = list(read_csv(io.StringIO('event,item\n0,"a"b\n1,c\n')))  # strict: '"' then 'b'
    assert junk[0].line == 2 and junk[0].error and junk[1] == RawEvent(3, None, ("c",), None)
    long = list(read_csv(io.StringIO("event,item\n0," + "x" * 1001 + "\n1,a\n")))
    assert "1001 characters" in long[0].error and long[1].error is None
    assert list(read_csv(io.StringIO("event,item\n0," + "x" * 1000 + "\n")))[0].error is None


def test_bad_text_is_an_invalid_record_with_its_line(tmp_path):
    from dpstream.io import open_input

    path = tmp_path / "e.jsonl"
    path.write_bytes(
        b'["a"]\n["b\xff"]\n["\\ud800"]\n'
        + b"[" * 50_000
        + b"\n"
        + b'{"t": '
        + b"9" * 5000
        + b', "items": []}\n["c"]\n'
    )
    with open_input(str(path)) as fh:
        recs = list(read_jsonl(fh, implicit=True))
    assert [r.line for r in recs] == [1, 2, 3, 4, 5, 6]
    assert recs[0].items == ("a",) and recs[5].items == ("c",)
    assert "UTF-8" in recs[1].error and "surrogate" in recs[2].error
    assert "nested too deeply" in recs[3].error and "digits" in recs[4].error
    csv_path = tmp_path / "e.csv"
    csv_path.write_bytes(b"event,item\n1,a\xff\n2,b\n")
    with open_input(str(csv_path)) as fh:
        recs = list(read_csv(fh))
    assert "UTF-8" in recs[0].error and recs[1] == RawEvent(3, None, ("b",), None)


def test_inputs_may_start_with_a_byte_order_mark(tmp_path):
    from dpstream.io import open_input

    (tmp_path / "e.jsonl").write_bytes(b'\xef\xbb\xbf["a"]\n')
    (tmp_path / "e.csv").write_bytes(b"\xef\xbb\xbfevent,item\n1,a\n")
    (tmp_path / "d.txt").write_bytes(b"\xef\xbb\xbfa\nb\n")
    with open_input(str(tmp_path / "e.jsonl")) as fh:
        assert list(read_jsonl(fh, implicit=True)) == [RawEvent(1, None, ("a",), None)]
    with open_input(str(tmp_path / "e.csv")) as fh:
        assert list(read_csv(fh)) == [RawEvent(2, None, ("a",), None)]
    assert read_domain(str(tmp_path / "d.txt")) == ["a", "b"]
