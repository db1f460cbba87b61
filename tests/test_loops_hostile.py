"""The C loops (``dpstream._loops``) stay memory-safe on hostile arguments.

The module is private: dpstream's own callers never pass these arguments. But a
loop that checks some of its input (offsets, codes, positions) and then reads it
again must not be able to change it in between, whatever it is given: a written
array that shares bytes with another argument is refused with a ValueError, an
int64 offset near 2^63 does not wrap a bound check, and a finalizer run by the
garbage collector inside flatten_events cannot make it write past its list.

Each dangerous call runs in a subprocess: a regression is then a failed test (a
crash, or no ValueError), not a dead test process. Every hostile case here crashed,
wrote or read out of bounds, or returned without an error before these checks (the
public normals_into raised on arrays in other layouts); a few valid calls beside
them check that the results did not change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dpstream
from dpstream import compiled
from dpstream.ziggurat import normals_into

if os.environ.get(compiled.ENV) != "1" and not compiled.enabled():
    pytest.skip("the C loops are not built here (CI requires them)", allow_module_level=True)

# the subprocess imports the dpstream (and so the _loops) under test
_PATH = os.pathsep.join(
    [str(Path(dpstream.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
)

_PRELUDE = """
import gc, sys
import numpy as np
from dpstream import _loops

def refused(f, *args):
    try:
        r = f(*args)
    except ValueError as e:
        print("ValueError:", e, flush=True)
    else:
        print("returned", r, flush=True)
"""


def run_isolated(code: str) -> str:
    """Run ``code`` (after the prelude) in a fresh interpreter; its stdout, which it
    must reach the end of without crashing."""
    env = {**os.environ, "PYTHONPATH": _PATH}
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    return proc.stdout


def assert_refused(out: str, function: str, written: str, other: str) -> None:
    assert f"ValueError: {function}: {written} (written) overlaps {other}" in out, out


def test_ziggurat_restarts_refuses_out_over_pending():
    if not compiled.ndtri_enabled():
        pytest.skip("the loops run without SciPy's ndtri here")
    out = run_isolated("""
        from dpstream import compiled
        L = compiled.loops()
        assert compiled.ndtri_enabled()
        pending = np.array([1, 0], dtype=np.int64)  # both valid positions of out
        out = pending.view(np.float64)  # the same 16 bytes: out[1] rewrites pending[1]
        words = np.array([0x9E3779B97F4A7C15, 1], dtype=np.uint64)
        refused(L.ziggurat_restarts, words, pending, out)
        """)
    assert_refused(out, "ziggurat_restarts", "out", "pending")


def test_ziggurat_restarts_wrapper_reads_aliased_words_from_a_copy():
    """compiled.ziggurat_restarts copies words that share out's memory (NumPy reads
    them before writing): the C loop's refusal never reaches dpstream's callers."""
    if not compiled.ndtri_enabled():
        pytest.skip("the loops run without SciPy's ndtri here")
    from scipy.special import ndtri

    from dpstream.ziggurat import uniforms_from_words

    base = np.arange(1, 9, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    out = base.view(np.float64).copy()
    words = out.view(np.uint64)[:4]  # the first four values of out, as words
    pending = np.array([1, 0, 7, 2], dtype=np.int64)  # out[1] = words[1], read next
    want = out.copy()
    want[pending] = ndtri(uniforms_from_words(words.copy()))
    assert compiled.ziggurat_restarts(words, pending, out)
    assert np.array_equal(out.view(np.int64), want.view(np.int64))


def test_event_duplicates_refuses_keep_over_offsets():
    out = run_isolated("""
        n = 16
        buf = np.zeros(64, dtype=np.uint8)
        offsets = buf[0:16].view(np.int64)  # one event: offsets = [0, n]
        offsets[:] = [0, n]
        keep = buf[10:10 + n]  # keep[0] is byte 2 of offsets[1]
        cols = np.array([7] * 6 + list(range(100, 110)), dtype=np.int64)
        distinct = np.zeros(1, dtype=np.int64)
        refused(_loops.event_duplicates, cols, offsets, keep, distinct)
        # distinct over the offsets' bytes, and keep right after them (no shared byte)
        refused(_loops.event_duplicates, cols, offsets, buf[16:32], buf[8:16].view(np.int64))
        print("adjacent", _loops.event_duplicates(cols, offsets, buf[16:32], distinct))
        print(buf[16:32].tolist(), distinct.tolist())
        """)
    assert_refused(out, "event_duplicates", "keep", "offsets")
    assert_refused(out, "event_duplicates", "distinct", "offsets")
    assert "adjacent 5\n" in out
    assert f"{[1, 0, 0, 0, 0, 0] + [1] * 10} [11]" in out


def test_unique_codes_refuses_used_over_scratch():
    out = run_isolated("""
        base = np.full(10, -1, dtype=np.int64)
        codes = np.array([2, 3], dtype=np.int64)
        refused(_loops.unique_codes, codes, base, base[1:], np.empty(2, dtype=np.int64))
        # codes read while inverse is written over them
        c = np.array([2, 3, 2, 3], dtype=np.int64)
        refused(_loops.unique_codes, c, np.full(10, -1, dtype=np.int64),
                np.empty(4, dtype=np.int64), c)
        """)
    assert_refused(out, "unique_codes", "scratch", "used")
    assert_refused(out, "unique_codes", "inverse", "codes")


def test_item_insert_refuses_slots_over_offsets():
    out = run_isolated("""
        N = 3
        for i in range(1, 10**6):  # a key under which the empty item's first slot is 2
            key = np.array([i, 0], dtype=np.uint64)
            h = _loops.siphash13(key.tobytes(), b"")
            if ((h & 0xFFFFFFFF) * N) >> 32 == 2:
                break
        slots = np.zeros(N, dtype=np.uint32)
        offsets = slots[:3]  # offsets [0, 0, 0]: items 0 and 1 are both ""
        data = np.frombuffer(b"hello", dtype=np.uint8)
        refused(_loops.item_insert, key, data, offsets, slots, 0, 2)
        """)
    assert_refused(out, "item_insert", "slots", "offsets")


def test_item_lookup_refuses_out_over_the_table():
    out = run_isolated("""
        key = np.array([1, 2], dtype=np.uint64)
        data = np.frombuffer(b"ab", dtype=np.uint8)
        offsets = np.array([0, 1, 2], dtype=np.int64)
        slots = np.zeros(8, dtype=np.uint32)
        _loops.item_insert(key, data, offsets, slots, 0, 2)
        refused(_loops.item_lookup, ["a", "b"], key, data, offsets, slots,
                slots[:4].view(np.int64))
        refused(_loops.item_lookup, ["a", "b", "c"], key, data, offsets, slots,
                offsets.view(np.int64))
        """)
    assert_refused(out, "item_lookup", "out", "slots")
    assert_refused(out, "item_lookup", "out", "offsets")


def test_user_bound_refuses_keep_over_codes():
    out = run_isolated("""
        n = 4
        keys = np.full(64, -1, dtype=np.int64); counts = np.zeros(64, dtype=np.int32)
        uidx = np.array([0], dtype=np.int64); user_of = np.array([0], dtype=np.int64)
        iidx = np.array([0], dtype=np.int64)
        codes = np.zeros(n, dtype=np.int64); offsets = np.array([0, n], dtype=np.int64)
        keep = codes.view(np.uint8)[9:9 + n]  # keep[0] is byte 1 of codes[1]
        held = np.zeros(1, dtype=np.int64)
        pu, pc, pn, pb = (np.zeros(n, dtype=np.int64) for _ in range(4))
        refused(_loops.user_bound, keys, counts, 0, 0, uidx, user_of, iidx, codes, offsets,
                None, 1, 10, held, keep, pu, pc, pn, pb)
        # a pair array whose first entry is the offsets' last
        both = np.zeros(n + 1, dtype=np.int64)
        both[:2] = [0, n]
        refused(_loops.user_bound, keys, counts, 0, 0, uidx, user_of, iidx,
                np.zeros(n, dtype=np.int64), both[:2], None, 1, 10, held,
                np.zeros(n, dtype=np.uint8), both[1:], pc, pn, pb)
        """)
    assert_refused(out, "user_bound", "keep", "codes")
    assert_refused(out, "user_bound", "pair_user", "offsets")


def test_pair_store_and_top_k_refuse_shared_bytes():
    out = run_isolated("""
        keys = np.full(8, -1, dtype=np.int64)
        refused(_loops.pair_store, keys, np.zeros(8, dtype=np.int64), keys[:2],
                np.ones(2, dtype=np.int64), 0)
        v = np.arange(8, dtype=np.float64)
        refused(_loops.top_k, v, v[4:].view(np.int64))
        """)
    assert_refused(out, "pair_store", "keys", "new_keys")
    assert_refused(out, "top_k", "out", "values")


def test_item_prefix_equals_does_not_wrap_an_offset():
    """a = 2^63 - 2, z = a + 5 wrapped negative: z - a == 5 == len("hello") and
    z <= len(data), so the old check passed and compared bytes at data + a."""
    out = run_isolated("""
        data = np.frombuffer(b"hello", dtype=np.uint8)
        offsets = np.array([2**63 - 2, -2**63 + 3], dtype=np.int64)
        print("equal", _loops.item_prefix_equals(["hello"], data, offsets, 1))
        print("valid", _loops.item_prefix_equals(["hello"], data,
                                                 np.array([0, 5], dtype=np.int64), 1))
        """)
    assert "equal False\n" in out
    assert "valid True\n" in out


_FLATTEN = """
events = [["a"]]
offsets = np.full(2, -7, dtype=np.int64)
fired = []
class Evil:
    def __del__(self):
        if offsets[1] == 1 and not fired:  # the first pass is done: inside PyList_New
            fired.append(1)
            CHANGE
def arm():
    e = Evil(); e.me = e  # a cycle: freed only by the collector
hold = [[] for _ in range(200)]  # no list on the free list: PyList_New allocates
arm()
gc.set_threshold(1)  # the next allocation of a tracked object (PyList_New's) collects
flat = _loops.flatten_events(events, offsets)
gc.set_threshold(700)
assert fired, "the finalizer did not run inside flatten_events"
if flat is None:
    print("None")
else:  # a list of every item, and offsets that describe it
    assert len(flat) == sum(map(len, events)) == offsets[-1], (len(flat), offsets)
    print("flat", len(flat), [str(x) for x in flat[:3]], offsets.tolist())
"""


@pytest.mark.parametrize(
    "change",
    [
        'events[0].extend(["x"] * 1000); offsets[1] = 1001',  # 1000 items past the list
        "events[0].clear(); offsets[1] = 0",  # an entry of the list left empty
        'events[0].append("x")',  # the offsets left as they were
    ],
)
def test_flatten_events_survives_a_finalizer_that_changes_an_event(change):
    out = run_isolated(_FLATTEN.replace("CHANGE", change))
    assert out == "None\n", out


def test_flatten_events_unchanged_on_plain_events():
    events = [["a", "b"], ("c",), [], [1, b"d", "a"]]
    offsets = np.full(len(events) + 1, -1, dtype=np.int64)
    flat = compiled.loops().flatten_events(events, offsets)
    assert flat == ["a", "b", "c", 1, b"d", "a"]
    assert offsets.tolist() == [0, 2, 3, 3, 6]
    assert compiled.loops().flatten_events([["a"], [1.5]], np.empty(3, np.int64)) is None


def _normals(blocks, out, scratch=None):
    retry = lambda rows: (rows[:, 0] * np.uint64(0x9E3779B97F4A7C15)) ^ rows[:, 1]  # noqa: E731
    normals_into(blocks, out, retry, scratch)
    return out


@pytest.mark.parametrize("layout", ["rows_step", "reversed", "fortran"])
@pytest.mark.parametrize("out_step", [1, 2, -1])
def test_normals_into_any_layout_gives_the_numpy_values(layout, out_step):
    """The public normals_into: blocks and out in any layout give the NumPy path's
    bits (the C path once raised "ndarray is not C-contiguous" for them)."""
    rng = np.random.default_rng(5)
    big = rng.integers(0, 2**64 - 1, size=(2 * 3000, 2), dtype=np.uint64, endpoint=True)
    blocks = {
        "rows_step": big[::2],
        "reversed": big[::-1][:3000],
        "fortran": np.asfortranarray(big[:3000]),
    }[layout]
    c = blocks.shape[0]
    with compiled.numpy_only():
        want = _normals(np.ascontiguousarray(blocks), np.empty(c))
    out = np.empty(c * abs(out_step))[::out_step]
    assert np.array_equal(_normals(blocks, out).view(np.int64), want.view(np.int64))
    scratch = (
        np.empty(2 * c, np.uint64)[::2],
        np.empty(2 * c, np.int64)[::2],
        np.empty(2 * c)[::2],
    )
    out = np.empty(c)
    got = _normals(blocks, out, scratch)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
