"""The columnar paths against their brute-force twins: the per-event code and the
record-at-a-time reader.

* step_batch from lists (the fast path), from generators (which force the
  original per-event loop) and from EventColumns release the same bits, and
  aggregate mode from arrays and from pandas/polars/Arrow frames releases the
  same bits as event mode;
* the columnar JSON Lines reader (chunks, Arrow where it applies) gives the same
  steps, records and messages as read_jsonl + group_steps, on hostile lines and
  with chunk boundaries anywhere;
* a step's digest material is exactly its records' raw lines.

A wrong fast path (a dropped duplicate check, a lost record, a mis-assigned
step, a different message) makes one of these comparisons fail.
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

import dpstream as dps
from dpstream.errors import InvalidEventError
from dpstream.io.grouping import group_steps, step_steps
from dpstream.io.jsonl import read_jsonl, read_jsonl_chunks
from dpstream.mechanisms.columns import EventColumns

from .conftest import fixed_key

T = 12


def _steps(seed: int, domain: list[str], max_items: int) -> list[list[list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(T):
        step = []
        for _ in range(rng.randrange(0, 30)):
            k = rng.randrange(0, max_items + 1)
            ev = [rng.choice(domain[:40]) for _ in range(k)]
            if ev and rng.random() < 0.3:
                ev.append(ev[0])  # a repeat inside an event counts once
            step.append(ev)
        out.append(step)
    return out


def _columns(step: list[list[str]]) -> EventColumns:
    items = sorted({x for ev in step for x in ev})
    code = {x: i for i, x in enumerate(items)}
    codes = np.array([code[x] for ev in step for x in ev], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(ev) for ev in step])]).astype(np.int64)
    return EventColumns(items, codes, offsets)


def _same(a: dps.Release, b: dps.Release) -> None:
    assert list(a.items) == list(b.items)
    assert np.asarray(a.values).tobytes() == np.asarray(b.values).tobytes()


@pytest.mark.parametrize("kind", ["unknown", "known", "topk"])
def test_event_paths_and_aggregate_forms_release_the_same_bits(kind):
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    pa = pytest.importorskip("pyarrow")
    domain = [f"d{i}" for i in range(60)]
    steps = _steps(3, domain, 3)
    key = fixed_key(f"columns-{kind}")

    def make():
        if kind == "unknown":
            return dps.UnknownDomainHistogram(
                T, max_items=3, key=key, rho=1.0, threshold_delta=1e-6, base=3
            )
        if kind == "known":
            return dps.KnownDomainHistogram(domain, T, max_items=3, key=key, rho=1.0)
        return dps.ContinualTopK(domain, T, k=4, switches=3, eta=1.0, key=key, rho=1.0)

    fast, slow, cols = make(), make(), make()
    forms = {name: make() for name in ("arrays", "pandas", "polars", "arrow")}
    counts: dict[str, int] = {}
    for t, step in enumerate(steps, 1):
        rel = fast.step_batch(step)
        _same(rel, slow.step_batch([iter(ev) for ev in step]))  # the per-event loop
        _same(rel, cols.step_batch(_columns(step)))
        for ev in step:
            for x in dict.fromkeys(ev):
                counts[x] = counts.get(x, 0) + 1
        items = list(counts)
        values = np.array([counts[x] for x in items], dtype=np.int64)
        _same(rel, forms["arrays"].release(t, np.array(items), values))
        _same(rel, forms["pandas"].release(t, pd.DataFrame({"item": items, "count": values})))
        _same(rel, forms["polars"].release(t, pl.DataFrame({"item": items, "count": values})))
        _same(rel, forms["arrow"].release(t, pa.table({"item": items, "count": values})))


def test_fast_path_errors_match_the_per_event_path():
    key = fixed_key("columns-errors")
    u = dps.UnknownDomainHistogram(T, max_items=2, key=key, rho=1.0, threshold_delta=1e-6)
    with pytest.raises(InvalidEventError, match="3 distinct items, more than max_items=2"):
        u.step_batch([["a"], ["a", "b", "c", "a"]])
    with pytest.raises(dps.InvalidItemError):
        u.step_batch([["a", True]])
    assert u.t == 0 and len(u) == 0  # nothing changed
    h = dps.KnownDomainHistogram(["a", "b"], T, max_items=2, key=key, rho=1.0)
    with pytest.raises(InvalidEventError, match="'z' is not in the domain"):
        h.step_batch([["a"], ["b", "z"]])
    with pytest.raises(ValueError, match="distinct"):
        h.release(1, ["a", "a"], [1, 2])
    with pytest.raises(TypeError, match="integers"):
        u.release(1, ["a"], [1.5])


HOSTILE = [
    '{"t": 1, "items": ["a", "b"]}',
    '{"t":1,"items":["a","a","c"]}',
    "",
    "   ",
    '["x", "y"]',
    '{"t": 2.0, "items": ["a"]}',
    '{"t": "3", "items": []}',
    '{"t": 0, "items": ["a"]}',
    '{"t": 2, "items": null}',
    '{"t": 2}',
    "{}",
    '{"t": 2, "items": ["a", null]}',
    '{"t": 2, "items": [5, "a"]}',
    '{"t": 2, "items": [true]}',
    '{"t": 2, "items": ["\\ud800"]}',
    '{"t": 2, "items": ["\\u00e9t\\u00e9"]}',
    '{"t": 2, "items": ["caf\u00e9"]}',
    '\ufeff{"t": 2, "items": ["a"]}',
    '{"t": 2, "items": ["a"], "x": NaN}',
    '{"t": 2, "items": ["a"], "t": 3}',
    '{"t": 99999999999999999999999, "items": ["a"]}',
    '{"t": 1, "items": ["late"]}',
    '{"t": 3, "items": ["a"]} {"t": 4, "items": ["b"]}',
    '{"t": 3,',
    '"items": []}',
    '{"t": 4, "items": ["' + "w" * 1200 + '"]}',
    "[" * 3000 + "]" * 3000,
    '{"t": 4, "items": [' + "1" * 5000 + "]}",
    '{"t": 4, "items": ["a"], "z": {"q": [1]}}',
    '{"t": 4, "items": ["tab\there"]}',
    "not json",
    "5",
    '{"t": 6, "items": []}',
    '{"items": ["no t"]}',
    '{"t": 9, "items": ["past"]}',
    '{"t": 7, "items": ["back"]}',
]


def _stream(text: str, binary: bool) -> io.TextIOBase:
    """The text as a file opens it (bytes, utf-8-sig), or as a plain text stream."""
    if binary:
        data = text.encode("utf-8", "surrogatepass")
        return io.TextIOWrapper(
            io.BufferedReader(io.BytesIO(data)),
            encoding="utf-8-sig",
            errors="surrogateescape",
            newline="",
        )
    return io.StringIO(text, newline="")


def _reference(text: str, horizon: int, binary: bool) -> list[tuple]:
    records = read_jsonl(_stream(text, binary))
    out = []
    for t, recs in group_steps(records, horizon):
        out.append((t, [(r.line, r.error, r.items) for r in recs], b"\n".join(r.raw for r in recs)))
    return out


def _columnar(text: str, horizon: int, chunk_bytes: int, binary: bool) -> list[tuple]:
    stream = _stream(text, binary)
    out = []
    for step in step_steps(read_jsonl_chunks(stream, chunk_bytes=chunk_bytes), horizon):
        recs = {line: (line, err, None) for line, err in step.errors}
        for k, line in enumerate(step.event_lines.tolist()):
            a, b = step.offsets[k], step.offsets[k + 1]
            recs[line] = (line, None, tuple(step.items[c] for c in step.codes[a:b].tolist()))
        assert sorted(recs) == step.lines.tolist()
        assert len(step.raw) == int(step.lengths.sum()) + max(step.records - 1, 0)
        out.append((step.t, [recs[line] for line in sorted(recs)], step.raw))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_columnar_reader_matches_the_record_reader(seed):
    rng = random.Random(seed)
    lines = [rng.choice(HOSTILE) for _ in range(120)]
    lines += [
        f'{{"t": {t}, "items": ["i{rng.randrange(9)}", "j"]}}'
        for t in range(1, 9)
        for _ in range(rng.randrange(0, 25))
    ]
    rng.shuffle(lines)
    lines.sort(key=lambda s: (s.count('"t": ') and s[6:7].isdigit() and int(s[6])) or 0)
    ending = rng.choice(["\n", "\r\n"])
    text = ending.join(lines) + rng.choice(["", ending])
    for binary in (True, False):
        expected = _reference(text, 8, binary)
        for chunk_bytes in (64, 1000, 1 << 20):
            assert _columnar(text, 8, chunk_bytes, binary) == expected


def test_all_fast_lines_take_the_arrow_path_and_match():
    pytest.importorskip("pyarrow")
    rng = random.Random(5)
    lines = [
        f'{{"t": {1 + i // 40}, "items": ["x{rng.randrange(50)}", "y{rng.randrange(5)}"]}}'
        for i in range(400)
    ]
    text = "\n".join(lines) + "\n"
    assert _columnar(text, 10, 1 << 20, True) == _reference(text, 10, True)


@pytest.mark.parametrize("seed", range(4))
def test_arrow_chunks_with_unusable_rows_match(seed):
    """Chunks that pass the screen (no tab, no escape, no BOM) go to Arrow; the rows
    it cannot use (null items, t < 1, one row for two objects) must still match."""
    pytest.importorskip("pyarrow")
    clean = [s for s in HOSTILE if "\\u" not in s and "\t" not in s and "\ufeff" not in s]
    rng = random.Random(seed)
    lines = [f'{{"t": {1 + i // 30}, "items": ["x{rng.randrange(20)}"]}}' for i in range(200)]
    for _ in range(25):
        lines.insert(rng.randrange(len(lines)), rng.choice(clean))
    text = "\n".join(lines) + "\n"
    assert _columnar(text, 9, 1 << 20, True) == _reference(text, 9, True)


@pytest.mark.parametrize("use_c", [True, False])
@pytest.mark.parametrize("width,values", [(1, 12), (3, 12), (16, 12), (40, 12), (64, 40)])
@pytest.mark.parametrize("width_extra", [0, 1, 50])
def test_distinct_in_events_against_brute_force(width, values, width_extra, use_c):
    """The C loop (events up to 64 wide) and the NumPy paths (shifted copies up to
    16, a sort beyond) against sets, with and without repeats."""
    from dpstream import compiled
    from dpstream.mechanisms.columns import distinct_in_events

    if use_c and not compiled.enabled():
        pytest.skip("the C loops are not built here")
    rng = np.random.default_rng(width + width_extra)  # simulation data only
    sizes = rng.integers(0, width + width_extra + 1, 200)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cols = rng.integers(0, values, int(offsets[-1]))
    if width_extra == 1:  # no repeats at all
        cols = np.arange(int(offsets[-1]), dtype=np.int64)
    if use_c:
        keep, distinct = distinct_in_events(cols, offsets)
    else:
        with compiled.numpy_only():
            keep, distinct = distinct_in_events(cols, offsets)
    want_keep, want_distinct = [], []
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        seen: set[int] = set()
        for c in cols[a:b].tolist():
            want_keep.append(c not in seen)
            seen.add(c)
        want_distinct.append(len(seen))
    got_keep = np.ones(cols.size, bool) if keep is None else keep
    assert got_keep.tolist() == want_keep and distinct.tolist() == want_distinct


@pytest.mark.parametrize("round_counts", [True, False])
def test_columnar_formatters_write_the_row_by_row_bytes(round_counts):
    from dpstream.io import CsvFormatter, JsonlFormatter, JsonlLongFormatter

    rng = np.random.default_rng(7)  # simulation data only
    items = ["plain", "", "a,b", 'q"uote', "caf\u00e9", "new\nline", " space", "\u2028"]
    items += ["car\rriage", "end\r", "\r\n"]  # quoted in CSV, as a reader needs
    items += [f"i{k}" for k in range(200)]
    values = rng.normal(0, 1e3, len(items)) * rng.choice([1e-9, 1.0, 1e12], len(items))
    plain = [x for x in items if not any(c in x for c in ',"\r\n')]  # no escapes
    for meta, its in (
        (m, i)
        for m in ({"noise_std": 12.25, "threshold": 3.5}, {}, {"noise_std": None})
        for i in (items, plain)
    ):
        vals = values[: len(its)]
        rel = dps.Release(t=42, items=its, values=vals, meta=meta)
        for cls in (JsonlFormatter, CsvFormatter, JsonlLongFormatter):
            f = cls(round_counts)
            fast = f._format_columns(rel)
            slow = f._format_dict(rel) if hasattr(f, "_format_dict") else f._format_rows(rel)
            if slow is not None:
                assert fast == slow, cls.__name__
    # jsonl-long: the fast path against json.dumps row by row
    rel = dps.Release(t=3, items=items, values=values, meta={"noise_std": 1.5})
    import json

    pairs = zip(items, values, strict=True)
    want = "".join(
        json.dumps(
            {
                "t": 3,
                "item": i,
                "value": (int(np.rint(v)) if round_counts else float(v)),
                "noise_std": 1.5,
            },
            ensure_ascii=False,
        )
        + "\n"
        for i, v in pairs
    )
    assert JsonlLongFormatter(round_counts).format(rel) == want.encode("utf-8")


def test_jsonl_writes_items_of_one_text_alike_on_both_paths():
    """Items 1 and "1" share their text; both paths write one pair per item (a dict
    would keep only the last), so the output does not depend on the release's size."""
    import json

    from dpstream.io import JsonlFormatter

    items = [1, "1", "a"]
    rel = dps.Release(t=5, items=items, values=np.array([2.0, 3.0, 4.0]), meta={"noise_std": 1.5})
    for round_counts in (True, False):
        f = JsonlFormatter(round_counts)
        rows, cols = f._format_rows(rel), f._format_columns(rel)
        assert rows == cols == f._format_dict(rel)
        text = rows.decode()
        two, three, four = ("2", "3", "4") if round_counts else ("2.0", "3.0", "4.0")
        want = (
            '{"t": 5, "released": {"1": '
            + two
            + ', "1": '
            + three
            + ', "a": '
            + four
            + '}, "meta": {"noise_std": 1.5}}\n'
        )
        assert text == want
        assert json.loads(text)["t"] == 5  # still JSON (a reader keeps the last pair)


def test_formatters_choose_the_columnar_path_by_size_and_cached_text():
    from dpstream import compiled
    from dpstream.io import CsvFormatter, JsonlFormatter, JsonlLongFormatter
    from dpstream.io.text import _COLUMNAR_FRESH_MIN, _COLUMNAR_MIN

    small = [f"s{i}" for i in range(_COLUMNAR_MIN)]
    fresh = dps.Release(t=1, items=small, values=np.ones(len(small)))
    tiny = dps.Release(t=1, items=small[:-1], values=np.ones(len(small) - 1))
    for cls in (CsvFormatter, JsonlLongFormatter):
        # a row per item on the row path: the C joiner of rounded counts from 64 items
        assert cls(True)._columnar(fresh) == compiled.enabled()
        assert not cls(True)._columnar(tiny) and not cls(False)._columnar(fresh)
        with compiled.numpy_only():
            assert not cls(True)._columnar(fresh)
    assert not JsonlFormatter(True)._columnar(fresh)  # one json.dumps of a dict: faster
    with compiled.numpy_only():
        for cls in (JsonlFormatter, CsvFormatter):
            f = cls(True)
            rel = dps.Release(t=1, items=small, values=np.ones(len(small)))
            assert not f._columnar(rel)  # fresh items: json.dumps is faster
            first = f.format(rel)  # rows
            assert f.format(rel) == first  # the same items again: columns, text now cached
            assert f._text.holds(small) and f._columnar(rel)
            other = dps.Release(t=1, items=list(small), values=np.ones(len(small)))
            assert not f._columnar(other) and f.format(other) == first
            big = [f"b{i}" for i in range(_COLUMNAR_FRESH_MIN)]
            assert f._columnar(dps.Release(t=1, items=big, values=np.ones(len(big))))


def _event_and_aggregate_steps(name: str, words: list[str], n_steps: int):
    """UnkBase in event mode and an aggregate-mode twin over the same simulated steps.

    Yields (t, the event-mode release, the twin before its release at t, the prefix
    counts, the items in ``items_seen`` order then the new ones)."""
    key = fixed_key(name)
    steps = _steps(n_steps, words, 3)

    def make():
        return dps.UnknownDomainHistogram(
            T, max_items=3, key=key, rho=1.0, threshold_delta=1e-6, base=2
        )

    ev, agg = make(), make()
    counts: dict[str, int] = {}
    for t, step in enumerate(steps[:-1], 1):
        rel = ev.step_batch(step)
        for e in step:
            for x in dict.fromkeys(e):
                counts[x] = counts.get(x, 0) + 1
        seen = agg.items_seen
        yield t, rel, agg, counts, seen + [x for x in counts if x not in set(seen)]


def test_aggregate_in_items_seen_order_takes_no_lookup_and_matches():
    for t, rel, agg, counts, order in _event_and_aggregate_steps(
        "columns-aligned", [f"d{i}" for i in range(60)], 11
    ):
        values = np.array([counts[x] for x in order], dtype=np.int64)
        assert agg._aligned(np.array(order, dtype=object)) == len(agg)
        _same(rel, agg.release(t, np.array(order, dtype=object), values))
    with pytest.raises(ValueError, match="distinct"):  # an item seen, listed again after
        agg.release(T, agg.items_seen + [agg.items_seen[0]], list(agg.counts) + [1])


def test_aligned_object_arrays_are_recognised_by_address_and_only_then():
    """An object array (or pandas column) of the very objects of items_seen, in order,
    is recognised by comparing addresses; the same objects in another order, equal
    strings that are other objects, a strided view, or a mechanism unpickled in
    between all take the other paths. Every form releases the event-mode bits."""
    pd = pytest.importorskip("pandas")
    from dpstream.mechanisms.columns import object_addresses
    from dpstream.snapshot import dump_snapshot, load_snapshot

    key = fixed_key("columns-addresses")
    for t, rel, agg, counts, order in _event_and_aggregate_steps(
        "columns-addresses", [f"w{i}" for i in range(40)], 7
    ):
        seen = agg.items_seen
        same = np.array(order, dtype=object)
        assert np.array_equal(object_addresses(same), [id(x) for x in order])
        forms = {
            "same objects": same,
            # equal strings, other objects: not by address, but by equality
            "copies": np.array(["".join(x) for x in order], dtype=object),
            "strided": np.array([x for x in order for _ in (0, 1)], dtype=object)[::2],
        }
        if len(seen) > 1:  # the same objects, two swapped: must not pass as aligned
            swapped = list(order)
            swapped[0], swapped[1] = swapped[1], swapped[0]
            forms["swapped"] = np.array(swapped, dtype=object)
            assert agg._aligned(forms["swapped"]) == 0
        assert agg._aligned(same) == len(seen)
        assert object_addresses(forms["strided"]) is None
        for items in forms.values():
            # a copy through a snapshot (another process's view): no address cache
            other = load_snapshot(dump_snapshot(agg, key), key)
            assert "_addresses" not in other.__dict__
            values = np.array([counts[x] for x in items.tolist()], dtype=np.int64)
            _same(rel, other.release(t, items, values))
        frame = pd.DataFrame({"item": same, "count": [counts[x] for x in order]})
        _same(rel, agg.release(t, frame))
        # the cache follows the items added by that release
        assert agg._aligned(np.array(agg.items_seen, dtype=object)) == len(agg)


def _validate_by_hand(records, policy, domain, max_items, truncator):
    """The --on-invalid rules record by record (the code the vectorised validator
    replaced): (kept events, invalid (line, message) in order, truncated count)."""
    out, bad, cut = [], [], 0
    for rec in records:
        if rec.error is not None:
            bad.append((rec.line, rec.error))
            continue
        items = tuple(dict.fromkeys(rec.items))
        changed = False
        if domain is not None:
            outside = [i for i in items if i not in domain]
            if outside:
                if policy != "truncate":
                    bad.append((rec.line, f"item {outside[0]!r} is not in the domain"))
                    continue
                items = tuple(i for i in items if i in domain)
                changed = True
        if max_items is not None and len(items) > max_items:
            if policy != "truncate":
                bad.append(
                    (
                        rec.line,
                        f"event has {len(items)} distinct items, more than --max-items {max_items}",
                    )
                )
                continue
            items = truncator(items, rec.t)
            changed = True
        cut += changed
        out.append(list(items))
    return out, bad, cut


@pytest.mark.parametrize("policy", ["skip", "truncate"])
@pytest.mark.parametrize("known", [True, False])
def test_vectorised_validator_matches_the_rules_record_by_record(policy, known):
    from dpstream.io import KeyedTruncator, RawEvent
    from dpstream.noise import NoiseSource
    from dpstream.run.validate import RunStats
    from dpstream.run.validate import Validator as _Validator

    rng = random.Random(hash((policy, known)) % 1000)
    domain = frozenset(f"d{i}" for i in range(8)) if known else None
    records = []
    for line in range(1, 300):
        if rng.random() < 0.1:
            records.append(RawEvent(line, 1, None, "not valid JSON (Expecting value)"))
            continue
        items = tuple(rng.choice([f"d{i}" for i in range(10)]) for _ in range(rng.randrange(0, 6)))
        records.append(RawEvent(line, 1, items, None))
    trunc = KeyedTruncator(NoiseSource(fixed_key("validator"), "v/truncate"), 3)
    stats = RunStats()
    v = _Validator(policy=policy, domain=domain, max_items=3, truncator=trunc, stats=stats)
    cols = v.events(records)
    want, bad, cut = _validate_by_hand(records, policy, domain, 3, trunc)
    assert [sorted(e) for e in cols.events()] == [sorted(e) for e in want]
    assert stats.skipped == len(bad) and stats.truncated == cut
    with pytest.raises(InvalidEventError) as err:  # --on-invalid error: the first, in order
        _Validator(
            policy="error",
            domain=domain,
            max_items=3,
            truncator=trunc,
            stats=RunStats(),
            verbose=True,
        ).events(records)
    first = _validate_by_hand(records, "error", domain, 3, trunc)[1][0]
    assert f"input line {first[0]}: {first[1]}" in str(err.value)


@pytest.mark.parametrize("kind", ["known", "topk", "histogram_topk", "meta"])
def test_validator_reads_the_mechanisms_domain_table(kind):
    """``dpstream run --domain`` hands the validator the mechanism's own item table
    (``domain_index``) instead of building a second one: the same object, and the
    same events kept as with a table built from the list."""
    from dpstream.io import KeyedTruncator, RawEvent
    from dpstream.noise import NoiseSource
    from dpstream.run.validate import RunStats
    from dpstream.run.validate import Validator as _Validator

    domain = [f"d{i}" for i in range(8)]
    key = fixed_key("validator-shared")
    if kind == "known":
        mech = dps.KnownDomainHistogram(domain, T, max_items=3, key=key, rho=1.0)
    elif kind == "topk":
        mech = dps.ContinualTopK(domain, T, k=2, switches=2, eta=1.0, key=key, rho=1.0)
    elif kind == "histogram_topk":
        from dpstream.mechanisms.histogram_topk import HistogramTopK

        mech = HistogramTopK(domain, T, k=2, max_items=3, key=key, rho=1.0)
    else:
        mech = dps.MetaHistogram(
            T, oneshot="gaussian", domain=domain, max_items=3, key=key, rho=1.0
        )
    table = mech.domain_index
    assert table.lookup(domain + ["d9"]).tolist() == list(range(8)) + [-1]
    rng = random.Random(7)
    records = [
        RawEvent(
            line,
            1,
            tuple(rng.choice([f"d{i}" for i in range(10)]) for _ in range(rng.randrange(0, 6))),
            None,
        )
        for line in range(1, 200)
    ]
    trunc = KeyedTruncator(NoiseSource(key, "v/truncate"), 3)
    shared = _Validator(
        policy="skip",
        domain=domain,
        max_items=3,
        truncator=trunc,
        stats=RunStats(),
        domain_index=table,
    )
    own = _Validator(policy="skip", domain=domain, max_items=3, truncator=trunc, stats=RunStats())
    assert shared.domain is table and own.domain is not table
    assert shared.events(records).events() == own.events(records).events()
    with pytest.raises(ValueError, match="does not match"):
        _Validator(
            policy="skip",
            domain=domain[:5],
            max_items=3,
            truncator=trunc,
            stats=RunStats(),
            domain_index=table,
        )


def test_aggregate_frames_and_counts_refuse_what_they_cannot_release_exactly():
    """A pandas column of timestamps is not a column of items (a TypeError, as the
    Mapping form and event mode say), and uint64 counts past int64 are refused as
    such, not wrapped into negatives."""
    pd = pytest.importorskip("pandas")
    m = dps.UnknownDomainHistogram(
        T, max_items=1, key=fixed_key("frames"), rho=1.0, threshold_delta=1e-6
    )
    stamps = pd.DataFrame({"item": pd.to_datetime(["2024-01-02", "2024-01-03"]), "count": [1, 2]})
    with pytest.raises(TypeError):
        m.release(1, stamps)
    k = dps.KnownDomainHistogram(["a", "b"], T, max_items=1, key=fixed_key("frames"), rho=1.0)
    with pytest.raises(ValueError, match="fit in int64"):
        k.release(1, np.array([1, 2**63], dtype=np.uint64))


@pytest.mark.parametrize("round_counts", [True, False])
def test_formatters_write_a_table_view_as_its_list(round_counts):
    """A known domain's releases carry a view of its compact table; every formatter
    writes the bytes it writes for the list of the same items (both paths)."""
    from dpstream import compiled
    from dpstream.io import CsvFormatter, JsonlFormatter, JsonlLongFormatter
    from dpstream.mechanisms.item_table import TableItems, domain_table

    if not compiled.enabled():
        pytest.skip("no compact table without the C loops (CI requires them)")
    items = [f"i{k}" for k in range(300)] + ["a,b", 'q"uote', "caf\u00e9", "new\nline"]
    view = TableItems(domain_table(items))
    values = np.random.default_rng(3).normal(0, 50, len(items))  # simulation data only
    for cls in (JsonlFormatter, CsvFormatter, JsonlLongFormatter):
        want = cls(round_counts).format(dps.Release(t=2, items=items, values=values))
        f = cls(round_counts)
        rel = dps.Release(t=2, items=view, values=values, meta={})
        assert f.format(rel) == want and f.format(rel) == want, cls.__name__  # rows, columns
        assert f._format_rows(rel) == want and f._format_columns(rel) == want
        if hasattr(f, "_format_dict"):
            assert f._format_dict(rel) == want


@pytest.mark.parametrize("meta", [{}, {"noise_std": 0.5, "threshold": 2.25}])
def test_jsonl_plain_fresh_items_are_joined_as_json_dumps_writes_them(meta):
    """Fresh str items of a rounded release go through one join and the C pass when
    none needs escaping; otherwise (a quote, a backslash, a control character, a lone
    surrogate, a value that is not finite, an int item) through json.dumps. Every case
    gives json.dumps's bytes."""
    import json

    from dpstream.io import JsonlFormatter

    cases = [
        [f"w{i}" for i in range(50)],
        ["caf\u00e9", "\u65e5\u672c", "", "a b"],
        ['q"uote', "x"],
        ["back\\slash"],
        ["tab\there"],
        ["\ud800"],
        [1, "1"],
        ["\u2028", "\x7f"],
    ]
    for items in cases:
        for vals in (np.arange(len(items)) * 7.4 - 3, np.full(len(items), np.nan)):
            rel = dps.Release(t=9, items=items, values=vals, meta=meta)
            f = JsonlFormatter(True)
            if "\ud800" in items:  # not UTF-8: both paths refuse it alike
                for path in (f._format_dict, f._format_rows):
                    with pytest.raises(UnicodeEncodeError), np.errstate(invalid="ignore"):
                        path(rel)
                continue
            with np.errstate(invalid="ignore"):  # NaN to int64: the paths only have to agree
                want = f._format_dict(rel)
                assert f._format_rows(rel) == want
            if not np.isfinite(vals).all():
                continue  # (counts + noise is never NaN; the paths only have to agree)
            if all(type(x) is str for x in items):
                obj = {
                    "t": 9,
                    "released": {x: int(np.rint(v)) for x, v in zip(items, vals, strict=True)},
                }
                if meta:
                    obj["meta"] = meta
                assert want == (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def test_a_steps_unique_codes_are_numpys():
    """The step reader's unique-with-inverse against ``np.unique`` (the definition):
    the same values (sorted without the C loops; in order of first appearance
    with them, the scratch map left clear for the next step), each code's index."""
    from dpstream import compiled
    from dpstream.io.chunks import _code_scratch, _unique_inverse

    rng = np.random.default_rng(21)
    cases = [np.array([5]), np.array([3, 3, 3]), np.arange(10)[::-1].copy()]
    cases += [rng.integers(0, hi, size) for hi, size in [(2, 50), (100, 3000), (10**6, 5000)]]
    for codes in cases:
        codes = codes.astype(np.int64)
        size = int(codes.max()) + 1 + int(rng.integers(0, 3))
        want_used, want_inverse = np.unique(codes, return_inverse=True)
        with compiled.numpy_only():
            used, inverse = _unique_inverse(codes, size)
        assert np.array_equal(used, want_used) and np.array_equal(inverse, want_inverse)
        used, inverse = _unique_inverse(codes, size)  # the C loop in CI
        assert inverse.dtype == np.int64 and np.array_equal(used[inverse], codes)
        assert np.array_equal(np.sort(used), want_used)
        if compiled.enabled():
            first = sorted(
                range(len(want_used)), key=lambda j: int(np.flatnonzero(codes == want_used[j])[0])
            )
            assert np.array_equal(used, want_used[first])  # order of first appearance
            assert (_code_scratch.buf == -1).all()


def test_unique_codes_refuses_what_it_cannot_map():
    from dpstream import compiled

    loops = compiled.loops()
    if loops is None:
        pytest.skip("the C loops are not built here (CI requires them)")
    scratch = np.full(4, -1, dtype=np.int64)
    used, inverse = np.empty(3, np.int64), np.empty(3, np.int64)
    with pytest.raises(IndexError):
        loops.unique_codes(np.array([0, 4, 1]), scratch, used, inverse)
    with pytest.raises(IndexError):
        loops.unique_codes(np.array([0, -1, 1]), scratch, used, inverse)
    assert (scratch == -1).all()
    scratch[2] = 0  # not clear: refused, and the entries this call wrote are undone
    with pytest.raises(ValueError, match="scratch"):
        loops.unique_codes(np.array([1, 2, 3]), scratch, used, inverse)
    assert scratch.tolist() == [-1, -1, 0, -1]
    with pytest.raises(ValueError):
        loops.unique_codes(np.array([1, 2, 3]), np.full(4, -1), used, np.empty(2, np.int64))


def test_arrow_buffer_readers_match_to_numpy():
    """The ingest's buffer readers against pyarrow's own conversion, on arrays with
    nulls, slices at every bit offset (the validity bitmap is bit-packed) and each
    signed width; and a float array is refused rather than read as integers."""
    pa = pytest.importorskip("pyarrow")
    from dpstream.io.arrow import arrow_ints as _arrow_ints
    from dpstream.io.arrow import arrow_valid as _arrow_valid

    rng = random.Random(3)
    values = [None if rng.random() < 0.3 else rng.randrange(-50, 50) for _ in range(70)]
    for typ in (pa.int8(), pa.int16(), pa.int32(), pa.int64()):
        whole = pa.array(values, typ)
        for lo in range(0, 17):
            for hi in (lo, lo + 1, lo + 9, 70):
                arr = whole.slice(lo, hi - lo)
                valid = _arrow_valid(arr)
                assert valid.tolist() == [v is not None for v in values[lo:hi]]
                got = _arrow_ints(arr)
                assert got.dtype == np.int64
                assert [g for g, ok in zip(got.tolist(), valid, strict=True) if ok] == [
                    v for v in values[lo:hi] if v is not None
                ]
    no_nulls = pa.array([4, 5, 6], pa.int32()).slice(1)
    assert _arrow_valid(no_nulls).tolist() == [True, True]
    assert _arrow_ints(no_nulls).tolist() == [5, 6]
    assert _arrow_valid(pa.nulls(3)).tolist() == [False] * 3
    with pytest.raises(TypeError, match="signed-integer"):
        _arrow_ints(pa.array([1.5]))


def test_an_unknown_domain_run_does_not_import_pandas(tmp_path):
    """pyarrow's to_numpy imports pandas on its first call (~0.3 s of a command's
    start); the JSON Lines ingest reads Arrow buffers instead. A fresh process, so
    that nothing else imported pandas first."""
    pytest.importorskip("pyarrow")
    import subprocess
    import sys

    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(f'{{"t": {1 + i // 50}, "items": ["a{i % 7}", "b"]}}\n' for i in range(500))
    )
    key = tmp_path / "key"
    code = (
        "import sys\n"
        "from dpstream.cli import main\n"
        f"assert main(['keygen', {str(key)!r}]) == 0\n"
        f"assert main(['run', '--quiet', '-m', 'unknown', '-T', '10', '--max-items', '2',"
        f" '--epsilon', '1', '--delta', '1e-6', '--key-file', {str(key)!r},"
        f" '-i', {str(events)!r}, '-o', {str(tmp_path / 'out.jsonl')!r}]) == 0\n"
        "import dpstream.io.jsonl\n"
        "print('pandas' in sys.modules, 'pyarrow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-2:] == ["False", "True"]  # pyarrow read the lines, pandas never loaded


@pytest.mark.parametrize("round_counts", [True, False])
def test_csv_rows_read_back_as_the_items_they_release(round_counts):
    """Every item, a bare carriage return in it too, comes back from Python's csv reader
    as it was released (an unquoted "\r" split its row), by both ways of writing."""
    import csv
    import io

    from dpstream.io import CsvFormatter

    items = ["a\rb", "c\r", "\r", "x\ny", "\r\n", 'q"r', "s,t", " sp ", "plain"]
    rel = dps.Release(t=5, items=items, values=np.arange(len(items), dtype=float), meta={})
    f = CsvFormatter(round_counts)
    for text in (f._format_rows(rel), f._format_columns(rel)):
        if text is None:
            continue
        rows = list(csv.reader(io.StringIO(text.decode("utf-8"), newline="")))
        assert [r[1] for r in rows] == items and {r[0] for r in rows} == {"5"}
