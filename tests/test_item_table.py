"""The item table (UTF-8 bytes + C hash probe) against a plain dict, and UnkBase on it.

Every check compares against a brute-force reference (a list and a dict built
in the test), including items that are not ASCII, empty, hold NULs, share
prefixes, or are longer than SipHash's 8-byte words; a forged hash collision
checks that a slot is only trusted after the bytes compare equal.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpstream as dps
from dpstream import compiled
from dpstream.mechanisms.item_table import ItemTable, TableItems

from .conftest import fixed_key

if os.environ.get(compiled.ENV) != "1" and not compiled.enabled():
    pytest.skip("the C loops are not built here (CI requires them)", allow_module_level=True)

from dpstream import _loops  # noqa: E402 (after the skip)

ITEMS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)


def reference(items: list) -> dict:
    return {x: i for i, x in enumerate(items)}


def check_against(table: ItemTable, stored: list, queries: list) -> None:
    ref = reference(stored)
    assert table.lookup(queries).tolist() == [ref.get(q, -1) for q in queries]
    assert table.to_list() == stored
    assert len(table) == len(stored)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(ITEMS, max_size=30), max_size=8), st.lists(ITEMS, max_size=40))
def test_lookups_match_a_dict(batches, queries):
    table = ItemTable()
    stored: list[str] = []
    for batch in batches:
        new = [x for x in dict.fromkeys(batch) if x not in set(stored)]
        table.extend(new)
        stored.extend(new)
        check_against(table, stored, queries + batch + stored[:5])
    assert table.compact


@pytest.fixture(params=["uint32", "uint64"])
def slot_width(request, monkeypatch):
    """Run a test on each slot layout: uint32 slots (every table a test builds) and
    uint64 slots (used past 2^26 slots, forced here by lowering that limit to 0)."""
    from dpstream.mechanisms import item_table

    if request.param == "uint64":
        monkeypatch.setattr(item_table, "_NARROW_MAX_SLOTS", 0)
    return np.dtype(request.param)


@pytest.fixture(params=["uint32", "int64"])
def offset_width(request, monkeypatch):
    """Run a test on each offsets layout: uint32 (bytes below 2^32: every table a test
    builds) and int64 (used from 2^32 bytes on, forced here by lowering that limit)."""
    from dpstream.mechanisms import item_table

    if request.param == "int64":
        monkeypatch.setattr(item_table, "_NARROW_MAX_BYTES", 0)
    return np.dtype(request.param)


def slot_entry(h: int, pos: int, nslots: int, width: np.dtype) -> int:
    """A slot's value by the layout's definition (the C module's comment): uint64:
    the hash's high half, then pos + 1 in the low 32 bits; uint32 of n slots, s the
    bit length of n - 1: the top 32 - s bits of the high half, then pos + 1 in the low
    s bits."""
    high = h >> 32
    if width == np.uint64:
        return (high << 32) | (pos + 1)
    s = (nslots - 1).bit_length()
    assert pos + 1 < nslots
    return ((high >> s) << s) | (pos + 1)


def first_slot(h: int, nslots: int, width: np.dtype) -> int:
    """The first slot probed for hash h: the low bits (uint64 slots, a power of 2 of
    them); the low 32 bits scaled to [0, n) by a multiply-shift (uint32, any n)."""
    if width == np.uint64:
        return h % nslots
    return ((h & 0xFFFFFFFF) * nslots) >> 32


@pytest.mark.parametrize("fixed", [False, True])
def test_slots_hold_the_tag_and_position_of_each_item(slot_width, fixed):
    """Every stored item's slot, found by linear probing from its first slot, holds
    exactly the entry the layout defines, and nothing else is stored: in a growing
    table (1024 slots) and a fixed one (379 uint32 slots, not a power of two; 512
    uint64 ones)."""
    items = [f"s{i}" for i in range(300)] + ["", "é", "日本語" * 5]
    table = ItemTable.of(items, fixed=fixed)
    slots = table._slots
    assert slots.size == ((379 if slot_width == np.uint32 else 512) if fixed else 1024)
    assert slots.dtype == slot_width
    key = table._key.tobytes()
    n = slots.size
    want = set()
    for pos, x in enumerate(items):
        h = _loops.siphash13(key, x.encode())
        entry = slot_entry(h, pos, n, slot_width)
        s = first_slot(h, n, slot_width)
        while int(slots[s]) != entry:
            assert slots[s] != 0, f"{x!r} not found by probing"
            s = (s + 1) % n
        want.add(entry)
    assert set(int(e) for e in slots if e) == want


def test_many_items_and_growth(slot_width, offset_width):
    rng = random.Random(1)
    stored = [f"item{i}" for i in range(50_000)] + ["", "\x00", "a\x00b", "é", "日本語" * 9]
    rng.shuffle(stored)
    table = ItemTable()
    at = 0
    while at < len(stored):  # steps of varying size, crossing many slot rebuilds
        m = rng.randint(1, 3000)
        table.extend(stored[at : at + m])
        at += m
    absent = [f"item{i}" for i in range(50_000, 52_000)] + ["x", "a\x00", "\x00\x00", "日本"]
    queries = stored + absent
    rng.shuffle(queries)
    check_against(table, stored, queries)
    assert table.take([3, 0, 3]) == [stored[3], stored[0], stored[3]]
    # slots: the smallest power of two (>= 16) holding twice the items (at most half full)
    size = table._slots.size
    assert size >= 2 * len(stored) and (size // 2 < 2 * len(stored) or size == 16)
    assert table._slots.dtype == slot_width
    assert table._offsets.dtype == offset_width
    view = TableItems(table)
    assert view.to_arrow().to_pylist() == stored
    picked = [len(stored) - 1, 0, 17, -2]
    assert view.take(picked) == [stored[i] for i in picked]
    assert table.starts(stored + ["more"]) and not table.starts(stored[1:] + ["x"] * 2)
    back = pickle.loads(pickle.dumps(table))
    check_against(back, stored, queries[:5000])


def test_offsets_turn_int64_past_their_limit(monkeypatch):
    """A table whose bytes pass the uint32 limit (lowered here to 1,000 bytes) keeps
    its items and positions across the switch, and keeps int64 offsets from then on."""
    from dpstream.mechanisms import item_table

    monkeypatch.setattr(item_table, "_NARROW_MAX_BYTES", 1000)
    items = [f"word-{i:05d}" for i in range(300)]  # 10 bytes each: passes 1,000 at 101
    table = ItemTable()
    for lo in range(0, 300, 40):
        table.extend(items[lo : lo + 40])
        assert table._offsets.dtype == (np.uint32 if lo + 40 <= 100 else np.int64)
        check_against(table, items[: lo + 40], items + ["word-x"])


def test_a_forged_collision_is_resolved_by_the_bytes(slot_width):
    """Put item b's slot where item a's hash leads, carrying a's tag: the probe for a
    must compare the bytes, reject b, and go on to a's own slot."""
    table = ItemTable()
    table.extend(["a", "b"])
    slots = table._slots
    n = slots.size
    key = table._key.tobytes()
    h_a = _loops.siphash13(key, b"a")
    home = first_slot(h_a, n, slot_width)
    slots[:] = 0
    slots[home] = slot_entry(h_a, 1, n, slot_width)  # b (position 1) under a's tag
    slots[(home + 1) % n] = slot_entry(h_a, 0, n, slot_width)  # a itself, one slot on
    assert table.lookup(["a", "b"]).tolist() == [0, -1]  # b's own slot is gone: absent


def test_siphash13_reference_vectors():
    # SipHash-1-3 of bytes 0..n-1 under the key 00..0f (the reference vectors)
    key = bytes(range(16))
    want = {
        0: 0xABAC0158050FC4DC,
        1: 0xC9F49BF37D57CA93,
        2: 0x82CB9B024DC7D44D,
        3: 0x8BF80AB8E7DDF7FB,
        6: 0xC50D2B50C59F22A7,
        8: 0x369095118D299A8E,
        9: 0x25A48EB36C063DE4,
    }
    for n, value in want.items():
        assert _loops.siphash13(key, bytes(range(n))) == value, n


def test_other_types_and_surrogates_switch_to_the_plain_layout():
    for odd in (7, b"raw", "lone \ud800"):
        table = ItemTable()
        table.extend(["a", "é"])
        table.extend([odd, "z"])
        assert not table.compact
        check_against(table, ["a", "é", odd, "z"], ["z", odd, "a", "é", "q", 8])


def test_starts():
    table = ItemTable()
    stored = [f"s{i}" for i in range(1000)] + ["ü"]
    table.extend(stored)
    same_values = ["".join(x) for x in stored]  # equal strings, other objects
    assert table.starts(same_values) and table.starts(same_values + ["new"])
    assert table.starts(np.array(same_values, dtype=object))
    assert table.starts(np.array(same_values))  # a NumPy unicode array
    swapped = same_values[:]
    swapped[3], swapped[4] = swapped[4], swapped[3]
    assert not table.starts(swapped)
    assert not table.starts(same_values[:-1])
    assert not table.starts(same_values[:-1] + [b"\xc3\xbc"])
    assert not table.starts(same_values[:-1] + ["u"])


def test_pickle_round_trip_draws_a_new_key():
    for items in (["a", "b", "ç"], ["a", 2, b"c"]):
        table = ItemTable()
        table.extend(items)
        back = pickle.loads(pickle.dumps(table))
        check_against(back, items, items + ["zz"])
        assert back.compact == table.compact
        if table.compact:
            assert not np.array_equal(back._key, table._key)


def test_a_bad_state_is_refused():
    table = ItemTable()
    with pytest.raises(ValueError):
        table.__setstate__(
            {"data": np.frombuffer(b"abc", np.uint8), "offsets": np.array([0, 2, 5], np.int64)}
        )


def test_without_the_c_loops_the_table_is_a_dict():
    with compiled.numpy_only():
        table = ItemTable()
    assert not table.compact
    table.extend(["a", "b"])
    check_against(table, ["a", "b"], ["b", "c"])
    back = pickle.loads(pickle.dumps(table))  # loads compact where the loops are on
    check_against(back, ["a", "b"], ["b", "c"])


def test_the_c_loops_refuse_bad_arrays():
    table = ItemTable()
    table.extend(["a"])
    out = np.empty(1, np.int64)
    data, offsets = table._data[:1], table._offsets[:2]
    with pytest.raises(ValueError):  # slots not a power of two
        _loops.item_lookup(["a"], table._key, data, offsets, np.zeros(12, np.uint64), out)
    with pytest.raises(ValueError):  # out of the wrong length
        _loops.item_lookup(["a", "b"], table._key, data, offsets, table._slots, out)
    with pytest.raises(ValueError):  # a table more than half full
        _loops.item_insert(table._key, data, offsets, np.zeros(1, np.uint64), 0, 1)
    for dtype in (np.int32, np.uint16, np.int64, np.float64, ">u4"):  # not uint32/uint64
        with pytest.raises(TypeError):
            _loops.item_lookup(["a"], table._key, data, offsets, np.zeros(16, dtype), out)
    with pytest.raises(IndexError):
        _loops.item_strings(data, offsets, np.array([1], np.int64))


def test_unknown_domain_releases_do_not_depend_on_the_layout():
    """UnkBase on the compact table and on the plain one (no C loops): the same
    releases, bit for bit, in event mode and aggregate mode, with unicode items."""
    rng = random.Random(2)
    words = [f"w{i}" for i in range(40)] + ["é", "日本", "", "x\x00y"]
    steps = [
        [rng.sample(words, rng.randint(1, 3)) for _ in range(rng.randint(0, 40))] for _ in range(30)
    ]

    def run(events_mode: bool) -> list:
        u = dps.UnknownDomainHistogram(
            30, max_items=3, key=fixed_key("table"), epsilon=8.0, delta=1e-3, noise_version=2
        )
        totals: dict[str, int] = {}
        out = []
        for t, events in enumerate(steps, start=1):
            for e in events:
                for x in e:
                    totals[x] = totals.get(x, 0) + 1
            if events_mode:
                rel = u.step_batch(events)
            else:
                seen = u.items_seen
                items = seen + [x for x in totals if x not in set(seen)]
                rel = u.release(t, items, [totals.get(x, 0) for x in items])
            out.append((rel.items, rel.values.tobytes()))
        return out

    compact = run(True)
    assert sum(len(items) for items, _ in compact) > 100  # items were shown
    assert run(False) == compact
    with compiled.numpy_only():
        assert run(True) == compact
        assert run(False) == compact


# Each case calls the C loops with arrays that do not match each other (as a bug in
# the Python side, or a caller of the private module, could pass): before the
# bounds checks these read past the offsets or the data (segfault) or probed a
# table with no empty slot forever. Run in a child process, so that a crash or a
# hang fails this test rather than killing the test run.
_INCONSISTENT = """
import numpy as np
from dpstream import _loops
from dpstream.mechanisms.item_table import ItemTable

t = ItemTable()
t.extend(["a", "bb", "ccc"])
key, data, off, slots = t._key, t._data[:t._size], t._offsets[:4], t._slots
far = np.array([0, 1, (1 << 40) - 3, 1 << 40], np.int64)  # past the data
far32 = np.array([0, 1, (1 << 32) - 3, (1 << 32) - 1], np.uint32)
h = _loops.siphash13(key.tobytes(), b"ccc")
past = np.zeros(16, np.uint32)  # ccc's tag, naming position 10 of 3
past[((h & 0xFFFFFFFF) * 16) >> 32] = (((h >> 32) >> 4) << 4) | 11
cases = {
    "slots past the offsets": lambda: _loops.item_lookup(
        ["ccc"], key, data, off[:2], slots, np.empty(1, np.int64)),
    "offsets past the data": lambda: _loops.item_lookup(
        ["ccc"], key, data, far, slots, np.empty(1, np.int64)),
    "no empty slot (lookup)": lambda: _loops.item_lookup(
        ["zz"], key, data, off, np.full(4, 1, np.uint64), np.empty(1, np.int64)),
    "no empty uint32 slot (lookup)": lambda: _loops.item_lookup(
        ["zz"], key, data, off, np.full(4, 1, np.uint32), np.empty(1, np.int64)),
    "uint32 slot past the offsets": lambda: _loops.item_lookup(
        ["ccc"], key, data, off, past, np.empty(1, np.int64)),
    "no empty uint32 slot (insert)": lambda: _loops.item_insert(
        key, data, off, np.full(16, 1, np.uint32), 0, 3),
    "offsets going down (insert)": lambda: _loops.item_insert(
        key, data, np.array([0, 1 << 40, 3, 6], np.int64), np.zeros(16, np.uint64), 0, 2),
    "no empty slot (insert)": lambda: _loops.item_insert(
        key, data, off, np.full(16, 1, np.uint64), 0, 3),
    "byte-swapped offsets": lambda: _loops.item_lookup(
        ["ccc"], key, data, off.astype(">i8"), slots, np.empty(1, np.int64)),
    "byte-swapped uint32 offsets": lambda: _loops.item_lookup(
        ["ccc"], key, data, off.astype(">u4"), slots, np.empty(1, np.int64)),
    "uint32 offsets past the data": lambda: _loops.item_lookup(
        ["ccc"], key, data, far32, slots, np.empty(1, np.int64)),
    "int32 offsets": lambda: _loops.item_strings(data, off.astype(np.int32),
                                                 np.array([0], np.int64)),
    "uint32 offsets going down (strings)": lambda: _loops.item_strings(
        data, np.array([0, 5, 3, 6], np.uint32), np.array([1], np.int64)),
}
for name, call in cases.items():
    try:
        call()
    except (ValueError, TypeError, IndexError):
        continue
    raise SystemExit(f"not refused: {name}")
neg = np.array([-(1 << 40), -(1 << 40) + 1], np.int64)  # before the data
assert _loops.item_prefix_equals(["a"], data, neg, 1) is False
print("refused")
"""


def test_inconsistent_arrays_are_refused_not_followed():
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _INCONSISTENT], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "refused", (
        done.returncode,
        done.stdout,
        done.stderr[-2000:],
    )


def run_known_domain(m, domain: list, steps: list, events_mode: bool, summary) -> list:
    """``summary`` of each release of a known-domain mechanism over ``steps``, in
    event mode or in aggregate mode (a Mapping and two arrays in turn), after
    checking ``domain``; then an item outside the domain, in each mode, raises."""
    assert m.domain == domain
    totals = dict.fromkeys(domain, 0)
    out = []
    for t, events in enumerate(steps, start=1):
        for e in events:
            for x in e:
                totals[x] += 1
        if events_mode:
            rel = m.step_batch(events)
        elif t % 2:
            rel = m.release(t, dict(totals))
        else:
            rel = m.release(t, list(totals), list(totals.values()))
        out.append(summary(rel))
    after = len(steps) + 1
    for bad in (
        lambda: m.step_batch([[domain[1], "nope"]]),
        lambda: m.release(after, {"nope": 1}),
        lambda: m.release(after, ["nope"], [1]),
    ):
        with pytest.raises(dps.InvalidEventError, match="nope"):
            bad()
    return out


def test_top_k_releases_do_not_depend_on_the_layout():
    """ContinualTopK (SparseGumb) over a str domain held in the compact table and in
    the plain one: the same releases in event mode and aggregate mode, the same
    errors for an item outside the domain, and ``domain`` the items given."""
    rng = random.Random(3)
    domain = [f"d{i}" for i in range(60)] + ["é", "日本", "", "x\x00y"]
    steps = [
        [
            rng.sample(domain[:20] if rng.random() < 0.7 else domain, 2)
            for _ in range(rng.randint(0, 30))
        ]
        for _ in range(25)
    ]

    def run(events_mode: bool) -> list:
        m = dps.ContinualTopK(
            domain,
            30,
            k=4,
            switches=3,
            eta=1.0,
            key=fixed_key("table-topk"),
            rho=2.0,
            noise_version=2,
        )
        return run_known_domain(
            m, domain, steps, events_mode, lambda rel: (rel.items, rel.values.tobytes())
        )

    compact = run(True)
    assert sum(len(items) for items, _ in compact) > 20
    assert run(False) == compact
    with compiled.numpy_only():
        assert run(True) == compact
        assert run(False) == compact


def test_table_items_behave_as_the_list_of_the_items():
    """The read-only view of a compact table against the list it was made from: every
    Sequence operation, one C call for many positions, and Arrow from the bytes."""
    import pyarrow as pa

    from dpstream.mechanisms.item_table import TableItems, domain_table

    items = [f"w{i}" for i in range(40_000)] + ["é", "日本", "", "x\x00y", "a,b", 'q"']
    view = TableItems(domain_table(items))
    assert len(view) == len(items) and list(view) == items  # iteration spans chunks
    for i in (0, 1, 39_999, -1, -6, np.int64(7), len(items) - 1):
        assert view[i] == items[i]
    for s in (slice(3, 9), slice(None, None, -7000), slice(-4, None), slice(5, 2)):
        assert view[s] == items[s]
    for bad in (len(items), -len(items) - 1):
        with pytest.raises(IndexError):
            view[bad]
        with pytest.raises(IndexError):
            view.take([0, bad])
    picks = [5, -1, 40_002, 0, 5]
    assert view.take(picks) == [items[i] for i in picks]
    assert "日本" in view and "nope" not in view and 3 not in view
    assert view.index("x\x00y") == items.index("x\x00y") and view.count("é") == 1
    with pytest.raises(ValueError):
        view.index("nope")
    assert view == items and view == tuple(items) and view == view
    assert view != items[:-1] and view != [*items[:-1], "other"] and view != "w0"
    assert view.to_arrow().equals(pa.array(items, pa.string()))
    with pytest.raises(TypeError):
        hash(view)
    again = pickle.loads(pickle.dumps(view))
    assert list(again) == items and again.take([3]) == [items[3]]
    with pytest.raises(ValueError, match="distinct"):
        domain_table(["a", "b", "a"])
    with pytest.raises(ValueError, match="distinct"):
        domain_table([1, 2, 1])  # the plain layout finds duplicates too


def test_known_domain_releases_do_not_depend_on_the_layout():
    """KnownBase over a str domain held in the compact table (releases carry a view of
    it) and in the plain one (a tuple): the same releases in event and aggregate mode,
    the same errors, the same top items, and ``domain`` the items given."""
    rng = random.Random(5)
    domain = [f"k{i}" for i in range(80)] + ["é", "日本", "", "x\x00y"]
    steps = [[rng.sample(domain, 2) for _ in range(rng.randint(0, 20))] for _ in range(20)]

    def run(events_mode: bool) -> list:
        m = dps.KnownDomainHistogram(
            domain, 24, max_items=2, key=fixed_key("table-known"), rho=2.0, noise_version=2
        )
        return run_known_domain(
            m,
            domain,
            steps,
            events_mode,
            lambda rel: (
                list(rel.items),
                rel.values.tobytes(),
                rel.top(3),
                rel.to_arrow().column("item").to_pylist(),
            ),
        )

    compact = run(True)
    assert all(items == domain for items, *_ in compact)
    from dpstream.mechanisms.item_table import TableItems

    for layout in (contextlib.nullcontext(), compiled.numpy_only()):
        with layout:  # the same type of release items with and without the C loops
            m = dps.KnownDomainHistogram(domain, 4, max_items=1, key=fixed_key("k"), rho=1.0)
            items = m.step_batch([]).items
            assert isinstance(items, TableItems) and items == domain
    ints = dps.KnownDomainHistogram([3, 1], 4, max_items=1, key=fixed_key("k"), rho=1.0)
    assert ints.step_batch([]).items == (3, 1)  # other types: a tuple
    assert run(False) == compact
    with compiled.numpy_only():
        assert run(True) == compact
        assert run(False) == compact


@pytest.mark.parametrize("oneshot", ["gaussian", "gumbel"])
def test_meta_known_releases_do_not_depend_on_the_layout(oneshot):
    """MetaAlgo with a known str domain in the compact table and in the plain one: the
    same releases (items and bits), and ``domain`` the items given."""
    from dpstream.mechanisms.meta import MetaHistogram

    rng = random.Random(9)
    domain = [f"m{i}" for i in range(40)] + ["é", "日本", ""]
    steps = [
        [
            rng.sample(domain[:12] if rng.random() < 0.8 else domain, 1)
            for _ in range(rng.randint(0, 12))
        ]
        for _ in range(20)
    ]
    kw = dict(max_items=1) if oneshot == "gaussian" else dict(k=3)

    def run() -> list:
        m = MetaHistogram(
            32,
            oneshot=oneshot,
            domain=domain,
            key=fixed_key("table-meta"),
            rho=4.0,
            base=2,
            noise_version=2,
            **kw,
        )
        assert m.domain == domain
        out = [(list(r.items), r.values.tobytes()) for r in map(m.step_batch, steps)]
        with pytest.raises(dps.InvalidEventError, match="nope"):
            m.step_batch([["nope"]])
        return out

    compact = run()
    assert sum(len(items) for items, _ in compact) > 10
    with compiled.numpy_only():
        assert run() == compact


def test_table_items_index_like_a_tuple():
    """The view takes the indices a tuple takes (ints, NumPy ints, bools) and refuses
    others (a float, a numeric string) with TypeError, as a tuple does; index() reads
    negative bounds from the end; membership of an unhashable value is False; reversed
    decodes in one pass."""
    from dpstream.mechanisms.item_table import TableItems, domain_table

    items = [f"w{i}" for i in range(3000)]
    tup = tuple(items)
    for layout in ("compact", "plain"):
        if layout == "compact":
            view = TableItems(domain_table(items))
        else:
            with compiled.numpy_only():
                view = TableItems(domain_table(items))
        for good in (np.int32(2), True, np.uint8(1)):
            assert view[good] == tup[good]
        for bad in (1.7, "2", np.float64(1.0), None):
            with pytest.raises(TypeError):
                tup[bad]
            with pytest.raises(TypeError):
                view[bad]
        for args in (("w2998", -5), ("w5", 2, -1), ("w5", -3000, 6), ("w5", 0, 10**9)):
            assert view.index(*args) == tup.index(*args)
        for args in (("w2990", -5), ("w5", 0, -2995), ("w5", 6)):
            with pytest.raises(ValueError):
                tup.index(*args)
            with pytest.raises(ValueError):
                view.index(*args)
        assert [1] not in view and {} not in view
        assert list(reversed(view)) == items[::-1]


@pytest.mark.parametrize("n", [1, 12, 13, 25, 26, 200, 1000, 4097])
def test_a_fixed_domain_fills_its_slots_to_four_fifths(n, slot_width, offset_width):
    """A fixed table (a known domain) takes the fewest uint32 slots it fills at most to
    4/5, at least 16 (uint64 slots, past 2^26 of them: the smallest power of two); a
    growing one the smallest power of two it fills at most half of; lookups of stored
    and absent items against a dict at that fill, in both; pickling keeps the fill."""
    from dpstream.mechanisms.item_table import domain_table

    items = [f"f{i}" for i in range(n)]
    queries = items[::-1] + [f"g{i}" for i in range(n)] + [""]
    for table, num, den in ((domain_table(items), 4, 5), (ItemTable.of(items), 1, 2)):
        size = table._slots.size
        want = max(16, -(-n * den // num))  # ceil(n den / num)
        if num == 1 or slot_width == np.uint64:
            want = 1 << (want - 1).bit_length()
        assert size == want and n * den <= size * num
        check_against(table, items, queries)
        again = pickle.loads(pickle.dumps(table))
        assert again._slots.size == size
        check_against(again, items, queries)


def test_the_c_insert_refuses_more_than_four_fifths():
    t = ItemTable.of([f"a{i}" for i in range(20)], fixed=True)  # 20 = 4/5 of 25
    assert t._slots.size == 25
    full = np.zeros(16, dtype=np.uint64)  # 20 items would fill 16 slots past 4/5
    with pytest.raises(ValueError, match="full"):
        _loops.item_insert(t._key, t._data[: t._size], t._offsets[:21], full, 0, 20)
    _loops.item_insert(t._key, t._data[: t._size], t._offsets[:21], full, 0, 12)  # 12/16


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from("abcdefghij"), max_size=6), min_size=1, max_size=8),
    st.lists(st.lists(st.sampled_from("abcdefghijklmn"), max_size=10), min_size=1, max_size=8),
    st.booleans(),
)
def test_lookup_rows_is_lookup_of_the_rows_items(grows, steps, fixed):
    """``lookup_rows`` (a cache of each run-wide row's position) answers exactly as
    ``lookup`` of the rows' items, the brute force below, step after step: while
    this table grows (a row absent at one step is found at the next), while the run
    table grows, and when another run table is asked about (the cache is dropped)."""
    mine, twin = ItemTable(fixed), ItemTable(fixed)  # twin: asked about other tables too
    run = ItemTable()
    for i, step in enumerate(steps):
        run.positions(step)  # the run-wide table learns the step's items
        rows = run.lookup(step)
        new = [x for x in dict.fromkeys(grows[i % len(grows)]) if x not in mine]
        mine.extend(new)
        twin.extend(new)
        want = [mine.get(x, -1) for x in step]  # brute force: a dict-like get per item
        assert mine.lookup_rows(run, rows).tolist() == want
        assert mine.lookup_rows(run, rows).tolist() == want  # from the cache
        assert twin.lookup_rows(run, rows).tolist() == want
        other = ItemTable.of(list(dict.fromkeys(reversed(step))))
        assert twin.lookup_rows(other, other.lookup(step)).tolist() == want


def test_lookup_rows_works_on_the_rows_asked_for_not_the_whole_run_table():
    """An open domain's table grows at every step. A step that asks for a few rows of a
    large run-wide table must cost what those rows cost: the cache was once swept
    whole at every step the table had grown (a 1-byte mask per run-wide row, ~10 ms
    a step at 10^7 distinct items, where making the step's strings cost ~1 ms).
    Measured as memory allocated during the call (tracemalloc sees NumPy's buffers),
    not time; the answers are held against ``lookup`` of the rows' items."""
    import tracemalloc

    n = 400_000
    run = ItemTable.of([f"q{i}" for i in range(n)])
    mine = ItemTable()
    rng = np.random.default_rng(5)
    peaks = []
    for _ in range(12):
        rows = np.unique(rng.integers(0, n, 300))
        rows[:50] = np.arange(50)  # rows asked at every step: cached once found
        tracemalloc.start()
        got = mine.lookup_rows(run, rows)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert got.tolist() == mine.lookup(run.take(rows)).tolist()
        absent = rows[got < 0]
        mine.extend(run.take(absent[: absent.size // 2]))  # grows: some rows found later
    # the first call makes the cache (8 bytes a row); every later one stays small
    assert peaks[0] >= 8 * n
    assert max(peaks[1:]) < n // 4, peaks
