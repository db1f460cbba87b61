"""The optional C loops (``dpstream._loops``) give the NumPy path's values, bit for bit.

The NumPy path is itself checked against an independent per-block reference in
``tests/test_ziggurat.py`` (which also runs through the C loops for chunks of 64
items and more); here the two paths are compared on inputs chosen to reach every
branch: the fast path, the tail, wedge points clearly under or above the curve,
and points within an ulp or so of it (which the C loop must hand back to be
decided exactly). CI sets ``DPSTREAM_COMPILED=1``, so there the C module must be
built and these tests cannot skip.
"""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest

from dpstream import NoiseSource, compiled, noise_kernel
from dpstream.ziggurat import TABLE, normals_into

from .conftest import fixed_key
from .test_noise_kernel import as_words, random_address, random_ids, same_bits
from .test_ziggurat import LIMIT, F, X, _wedge_block, below_density_exactly

if os.environ.get(compiled.ENV) != "1" and not compiled.enabled():
    pytest.skip("the C loops are not built here (CI requires them)", allow_module_level=True)


def retry_words(rows: np.ndarray) -> np.ndarray:
    """A stand-in retry: a fixed function of the block (the real one is AES)."""
    return (rows[:, 0] * np.uint64(0x9E3779B97F4A7C15)) ^ rows[:, 1]


def both_paths(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    fast = np.empty(len(blocks))
    normals_into(blocks, fast, retry_words)
    with compiled.numpy_only():
        slow = np.empty(len(blocks))
        normals_into(blocks, slow, retry_words)
    return fast, slow


def test_the_loops_are_on():
    assert compiled.enabled()
    with compiled.numpy_only():
        assert not compiled.enabled()
    assert compiled.enabled()


def test_random_blocks_give_the_numpy_values():
    # 2^20 blocks: ~1.5% leave the fast path (~15,500), ~0.025% are tails (~260:
    # region 0 is 1/256 of the blocks, and 1 in 15 of those fall past the fast
    # part); every branch but the close calls, many times. The counts are
    # binomial: the bounds below are more than 7 standard deviations under them.
    rng = np.random.default_rng(3)
    blocks = rng.integers(
        0, np.iinfo(np.uint64).max, size=(1 << 20, 2), dtype=np.uint64, endpoint=True
    )
    fast, slow = both_paths(blocks)
    assert same_bits(fast, slow)
    w0 = blocks[:, 0]
    h = (w0 >> np.uint64(11)).astype(np.float64) + 0.5
    off_fast = h >= TABLE.limit[(w0 & np.uint64(511)).astype(np.int64)]
    tails = off_fast & ((w0 & np.uint64(255)) == 0)
    assert tails.sum() > 150 and off_fast.sum() > 14_500


def test_every_chunk_size_around_the_threshold():
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, np.iinfo(np.uint64).max, size=(300, 2), dtype=np.uint64)
    for c in (1, compiled.MIN_ITEMS - 1, compiled.MIN_ITEMS, compiled.MIN_ITEMS + 1, 300):
        fast, slow = both_paths(np.ascontiguousarray(blocks[:c]))
        assert same_bits(fast, slow), c


def test_points_at_the_curve_are_decided_exactly():
    """Wedge points within a few ulps of f(x), padded with random blocks to a chunk the
    C loop takes: each must follow the exact decision (and so both paths agree)."""
    rng = np.random.default_rng(5)
    region = 200
    ks = [int(LIMIT[region]) + d for d in (5, 1000, 123_456)]
    near = np.concatenate(
        [_wedge_block(region, k, nudge) for k in ks for nudge in range(-510, 511, 170)]
    )
    pad = rng.integers(0, np.iinfo(np.uint64).max, size=(500, 2), dtype=np.uint64)
    blocks = np.ascontiguousarray(np.concatenate([pad, near, pad]))
    fast, slow = both_paths(blocks)
    assert same_bits(fast, slow)
    restarted = set()
    for (w0, w1), z in zip(near.tolist(), fast[500 : 500 + len(near)].tolist(), strict=True):
        k = w0 >> 11
        x = ((k + 0.5) * 2.0**-53) * X[region]
        v = ((w1 >> 11) + 0.5) * 2.0**-53
        height = F[region] + v * (F[region + 1] - F[region])
        accepted = below_density_exactly(height, x)
        restarted.add(not accepted)
        if accepted:
            assert z == x
        else:
            assert z != x and math.isfinite(z)
    assert restarted == {True, False}


def test_keyed_draws_and_accumulation_give_the_numpy_values():
    rng = random.Random(6)
    src = NoiseSource(fixed_key("compiled"), "/v2/test/compiled")
    n = noise_kernel.CHUNK_ITEMS + 777
    prepared = src.prepare_ids(as_words(random_ids(rng, n)))
    address = random_address(rng)
    base = np.linspace(-3.0, 3.0, n)

    def draws() -> tuple[np.ndarray, ...]:
        return (
            src.gaussian(prepared, *address),
            src.gaussian(prepared, *address, scale=0.37),
            src.draw_into(prepared, *address, scale=3.0, out=base.copy(), accumulate=True),
            src.gaussian_values(src.blocks(prepared, *address), 2.5),
        )

    got = draws()
    with compiled.numpy_only():
        want = draws()
    for g, w in zip(got, want, strict=True):
        assert same_bits(g, w)


def test_bad_arrays_are_refused():
    from dpstream import _loops

    blocks = np.zeros((100, 2), dtype=np.uint64)
    pending = np.empty(100, np.int64)
    t = TABLE
    with pytest.raises(TypeError):  # float blocks
        _loops.ziggurat(
            blocks.astype(float),
            np.empty(100),
            t.scaled,
            t.limit,
            t.bottom,
            t.rise,
            pending,
            pending.copy(),
            t.tail_probability,
        )
    with pytest.raises(ValueError):  # out of another length
        _loops.ziggurat(
            blocks,
            np.empty(99),
            t.scaled,
            t.limit,
            t.bottom,
            t.rise,
            pending,
            pending.copy(),
            t.tail_probability,
        )
    with pytest.raises(ValueError):  # a table of the wrong size
        _loops.ziggurat(
            blocks,
            np.empty(100),
            t.scaled[:256],
            t.limit,
            t.bottom,
            t.rise,
            pending,
            pending.copy(),
            t.tail_probability,
        )
    with pytest.raises((TypeError, ValueError, BufferError)):  # read-only output
        out = np.empty(100)
        out.flags.writeable = False
        _loops.ziggurat(
            blocks,
            out,
            t.scaled,
            t.limit,
            t.bottom,
            t.rise,
            pending,
            pending.copy(),
            t.tail_probability,
        )
    with pytest.raises((TypeError, ValueError, BufferError)):  # not contiguous
        _loops.ziggurat(
            np.zeros((100, 4), np.uint64)[:, :2],
            np.empty(100),
            t.scaled,
            t.limit,
            t.bottom,
            t.rise,
            pending,
            pending.copy(),
            t.tail_probability,
        )


def test_scipys_ndtri_runs_in_c_with_the_ufuncs_bits():
    """The C loops draw the tail and the restarts with SciPy's ndtri, taken from
    ``scipy.special.cython_special``; it must give the ufunc's bits on inputs the
    start-up check never saw: uniforms of random words over the whole (0, 1), and
    the same scaled into the tail's range (0, P(Z > r))."""
    from dpstream import _loops

    assert compiled.ndtri_enabled()  # CI's SciPy has the capsule and it passes the check
    rng = np.random.default_rng(11)
    w = rng.integers(0, np.iinfo(np.uint64).max, size=1 << 18, dtype=np.uint64, endpoint=True)
    u = ((w >> np.uint64(11)).view(np.int64) + 0.5) * 2.0**-53
    p = np.concatenate([u, u * TABLE.tail_probability])
    got = np.empty_like(p)
    _loops.ndtri_into(p, got)
    from scipy.special import ndtri

    assert same_bits(got, ndtri(p))
    # the restarts' loop: out[pending[i]] = ndtri(uniform(words[i])), others untouched
    out = np.full(10, 7.0)
    assert compiled.ziggurat_restarts(w[:3], np.array([8, 0, 4]), out)
    assert same_bits(out[[8, 0, 4]], ndtri(u[:3]))
    assert (np.delete(out, [8, 0, 4]) == 7.0).all()


@pytest.fixture
def ndtri_off():
    """The C loops without their ndtri (a SciPy without the capsule, or one whose
    ndtri failed the check): tails and restarts go back to the NumPy code."""
    from dpstream import _loops

    compiled.enabled()
    saved = compiled._state["ndtri"]
    _loops.set_ndtri(None)
    compiled._state["ndtri"] = False
    try:
        yield
    finally:
        compiled._state["ndtri"] = saved
        if saved:
            from scipy.special import cython_special

            _loops.set_ndtri(cython_special.__pyx_capi__["ndtri"])


def test_without_ndtri_the_c_loop_leaves_tails_to_numpy(ndtri_off):
    assert compiled.enabled() and not compiled.ndtri_enabled()
    rng = np.random.default_rng(12)
    blocks = rng.integers(
        0, np.iinfo(np.uint64).max, size=(1 << 16, 2), dtype=np.uint64, endpoint=True
    )
    t = TABLE
    c = len(blocks)
    pending, close = np.empty(c, np.int64), np.empty(c, np.int64)
    n_restart, n_tail, n_close = compiled.ziggurat(blocks, np.empty(c), t, pending, close)
    assert n_tail > 0  # handed back, not drawn (~16 expected: 65536 / 256 / 15)
    fast, slow = both_paths(blocks)
    assert same_bits(fast, slow)
    assert not compiled.ziggurat_restarts(blocks[:2, 0], np.arange(2), np.empty(2))


def test_the_ndtri_check_refuses_a_function_one_bit_off():
    """_attach_ndtri keeps the C ndtri only if it matches the ufunc on every check point."""
    from scipy.special import ndtri

    class Loops:
        def __init__(self, skew: int) -> None:
            self.skew, self.fn = skew, "unset"

        def set_ndtri(self, capsule):
            self.fn = capsule

        def ndtri_into(self, p, out):
            out[:] = ndtri(p)
            bits = out.view(np.int64)
            bits[len(p) // 2] += self.skew  # one point, one ulp

    good, bad = Loops(0), Loops(1)
    assert compiled._attach_ndtri(good) and good.fn is not None
    assert not compiled._attach_ndtri(bad) and bad.fn is None
    points = compiled.ndtri_check_points()
    assert ((points > 0) & (points <= 1)).all()
    assert (points < TABLE.tail_probability).sum() > 8000  # the tail's inputs are covered


def test_ziggurat_restarts_refuses_bad_arrays():
    from dpstream import _loops

    out = np.empty(5)
    with pytest.raises(IndexError):
        _loops.ziggurat_restarts(np.zeros(1, np.uint64), np.array([5]), out)
    with pytest.raises(IndexError):
        _loops.ziggurat_restarts(np.zeros(1, np.uint64), np.array([-1]), out)
    with pytest.raises(ValueError):
        _loops.ziggurat_restarts(np.zeros(2, np.uint64), np.array([1]), out)
    with pytest.raises(TypeError):
        _loops.ziggurat_restarts(np.zeros(1), np.array([1]), out)
    with pytest.raises(ValueError):
        _loops.ndtri_into(np.full(3, 0.5), np.empty(2))


def test_flatten_events_in_c_matches_the_python_twin():
    from collections import namedtuple

    from dpstream.mechanisms.columns import flatten_events

    class Text(str):
        pass

    class Events(list):
        pass

    class Steps(tuple):
        pass

    Pair = namedtuple("Pair", "first second")

    cases = [
        [],
        [[]],
        [["a", 1, b"x"], ("b",), []],
        (["a"], ["a", "a"]),
        [["a", True]],
        [["a"], [Text("b")]],
        [["a"], {"b"}],
        [["a"], "ab"],
        [["a", 1.5]],
        [["a", None]],
        [[("a",)]],
        [["é", 2**70, -3]],
        "generator",
        Events([["a", "b"], ("c",)]),
        Steps((["a"], ["b", 1])),
        Pair(["a"], ["b"]),
        [Events(["a"])],
        Events([["a", True]]),
    ]
    for case in cases:

        def events(case=case):
            return (e for e in [["a"], ["b", "c"]]) if case == "generator" else case

        got = flatten_events(events())
        with compiled.numpy_only():
            want = flatten_events(events())
        if want is None:
            assert got is None, case
        else:
            assert got is not None, case
            assert got[0] == want[0] and [type(x) for x in got[0]] == [type(x) for x in want[0]]
            assert np.array_equal(got[1], want[1]) and got[1].dtype == np.int64
    from dpstream import _loops

    with pytest.raises(TypeError):
        _loops.flatten_events(iter([["a"]]), np.empty(2, np.int64))
    with pytest.raises(ValueError):
        _loops.flatten_events([["a"]], np.empty(3, np.int64))


def test_the_environment_switch(monkeypatch):
    monkeypatch.setattr(compiled, "_state", {})
    monkeypatch.setenv(compiled.ENV, "0")
    assert not compiled.enabled()
    monkeypatch.setattr(compiled, "_state", {})
    monkeypatch.setenv(compiled.ENV, "yes")
    with pytest.raises(ValueError, match=compiled.ENV):
        compiled.enabled()
    monkeypatch.setattr(compiled, "_state", {})
    monkeypatch.setenv(compiled.ENV, "1")

    def missing():
        raise ImportError("not built")

    monkeypatch.setattr(compiled, "_build", missing)
    with pytest.raises(ImportError):
        compiled.enabled()
    monkeypatch.setattr(compiled, "_state", {})
    monkeypatch.delenv(compiled.ENV)
    assert not compiled.enabled()  # unset: falls back silently


def test_blocks_in_the_other_byte_order_give_the_numpy_values():
    """Blocks not in the machine's byte order (the ``"<u8"`` blocks of a big-endian
    machine; ``">u8"`` here) must be read as their values, not as native words: the
    C loop reads native words, so such a chunk stays on the NumPy path."""
    rng = np.random.default_rng(7)
    native = rng.integers(
        0, np.iinfo(np.uint64).max, size=(4096, 2), dtype=np.uint64, endpoint=True
    )
    swapped = native.astype(native.dtype.newbyteorder())
    assert not swapped.dtype.isnative and np.array_equal(swapped, native)
    got = np.empty(len(native))
    normals_into(swapped, got, retry_words)
    with compiled.numpy_only():
        want = np.empty(len(native))
        normals_into(native, want, retry_words)
    assert same_bits(got, want)


def test_join_rows_against_python():
    """The C row joiner against the same rows built in Python (str(int) per value),
    including the extremes of int64, every width of a decimal (10^k - 1, 10^k and their
    negatives), empty items, multi-byte text, items of 16 bytes and more, short items at
    the very end of the data, pieces (head, mid, tail, separator) of 0 to 40 bytes, and
    both kinds of offsets; bad offsets are refused, not followed. (Pieces and items of at
    most 16 bytes are copied 16 bytes at a time into slack: the brute force holds those
    copies to the exact bytes.)"""
    from dpstream import _loops

    rng = random.Random(11)
    widths = [s * (10**k + d) for k in range(19) for d in (-1, 0) for s in (1, -1)]
    n = 500 + len(widths)
    items = ["", "a", "é日本", "x" * 300, "y" * 15, "z" * 16, "q" * 17]
    items += [f"w{rng.randrange(10**6)}" for _ in range(n - len(items) - 3)] + ["", "b", "cd"]
    blobs = [x.encode() for x in items]
    data = b"".join(blobs)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    values = np.array(
        [0, -1, 2**63 - 1, -(2**63), *widths]
        + [rng.randrange(-(10**9), 10**9) for _ in range(n - 4 - len(widths))],
        np.int64,
    )
    long = bytes(range(65, 65 + 40))
    for head, mid, tail, sep in (
        (b"", b": ", b"", b", "),
        (b"7,", b",", b",1.5", b"\n"),
        (b"{", b"", b"}", b""),
        (long[:16], long[:17], long[:40], long[:15]),
        (long[:17], b"=", long[:16], long[:33]),
    ):
        want = sep.join(
            head + b + mid + str(int(v)).encode() + tail
            for b, v in zip(blobs, values.tolist(), strict=True)
        )
        for off in (offsets, offsets.astype(np.uint32)):
            assert _loops.join_rows(data, off, values, head, mid, tail, sep) == want
        # a release's own start and end, written around the rows
        for first, last in ((b"{", b"}\n"), (long, b""), (b"", long[:3])):
            got = _loops.join_rows(data, offsets, values, head, mid, tail, sep, first, last)
            assert got == first + want + last
    assert (
        _loops.join_rows(b"", np.zeros(1, np.int64), np.zeros(0, np.int64), b"h", b"m", b"t", b",")
        == b""
    )
    no_rows = (b"", np.zeros(1, np.int64), np.zeros(0, np.int64), b"h", b"m", b"t", b",")
    assert _loops.join_rows(*no_rows, b"[", b"]") == b"[]"
    bad = [
        (offsets[:-1], values),  # one offset short
        (np.array([0, 5, 3], np.int64), values[:2]),  # decreasing
        (np.array([0, len(data) + 1], np.int64), values[:1]),  # past the data
        (np.array([-1, 0], np.int64), values[:1]),
    ]  # before the data
    for off, val in bad:
        with pytest.raises(ValueError):
            _loops.join_rows(data, off, val, b"", b"", b"", b"")
    with pytest.raises(TypeError):
        _loops.join_rows(data, offsets, values.astype(np.float64), b"", b"", b"", b"")


@pytest.mark.parametrize("meta", [{}, {"noise_std": 3.25, "threshold": 1.5}])
def test_rounded_releases_format_alike_with_and_without_the_loops(meta):
    """The three text formats of rounded releases: the C joiner, Arrow's kernels (NumPy
    only) and the row-by-row reference write the same bytes."""
    import dpstream as dps
    from dpstream.io import CsvFormatter, JsonlFormatter, JsonlLongFormatter

    rng = np.random.default_rng(5)  # simulation data only
    items = [f"i{k}" for k in range(5000)] + ["a,b", 'q"uote', "new\nline", "caf\u00e9", ""]
    values = rng.normal(0, 1e3, len(items)) * rng.choice([1e-6, 1.0, 1e12], len(items))
    rel = dps.Release(t=123456, items=items, values=values, meta=meta)
    for cls in (JsonlFormatter, CsvFormatter, JsonlLongFormatter):
        fast = cls(True)._format_columns(rel)
        with compiled.numpy_only():
            arrow = cls(True)._format_columns(rel)
        f = cls(True)
        want = f._format_dict(rel) if hasattr(f, "_format_dict") else f._format_rows(rel)
        assert fast == arrow == want == f._format_rows(rel), cls.__name__


# --------------------------------------------------------------------------- item hashes


def random_items(rng: random.Random, n: int) -> list[object]:
    """Items of every kind encode_item takes, at lengths around the hashes' block
    boundaries (SHA-256: 64 bytes with 9 of padding; BLAKE2b: 128): ASCII and
    non-ASCII str (2-, 3- and 4-byte UTF-8, lone surrogates), empty str and bytes,
    ints of any size and sign, bytes, bytearray, NumPy integers and str, and str and
    int subclasses (hashed through encode_item itself)."""

    class Label(str):
        pass

    class Number(int):
        pass

    lengths = [0, 1, 2, 21, 31, 32, 33, 41, 42, 43, 54, 55, 56, 63, 64, 65, 100]
    lengths += [126, 127, 128, 129, 200, 255, 256, 257, 1000, 5000]
    wide = [0xE9, 0x3B1, 0x20AC, 0x4E2D, 0xD800, 0xDFFF, 0x1F600, 0x10FFFF, 0x7F, 0x80]
    out: list[object] = []
    for _ in range(n):
        size = rng.choice(lengths)
        kind = rng.randrange(10)
        if kind == 0:
            out.append("".join(chr(rng.randrange(32, 127)) for _ in range(size)))
        elif kind == 1:
            out.append("".join(chr(rng.choice(wide)) for _ in range(size)))
        elif kind == 2:
            out.append(rng.randrange(-(10 ** min(size, 1000)), 10 ** min(size, 1000) + 1))
        elif kind == 3:
            out.append(bytes(rng.randrange(256) for _ in range(size)))
        elif kind == 4:
            out.append(bytearray(rng.randrange(256) for _ in range(size)))
        elif kind == 5:
            out.append(np.int64(rng.randrange(-(2**63), 2**63)))
        elif kind == 6:
            out.append(np.str_("n" * size))
        elif kind == 7:
            out.append(Label("x" * size))
        elif kind == 8:
            out.append(Number(rng.randrange(-(2**70), 2**70)))
        else:
            out.append(rng.randrange(-3, 4))
    return out


def hashlib_ids(key: bytes, items: list[object]) -> np.ndarray:
    import hashlib

    from dpstream.noise import encode_item

    return np.array(
        [
            np.frombuffer(
                hashlib.blake2b(encode_item(x), key=key, digest_size=16).digest(), dtype="<u8"
            )
            for x in items
        ]
    ).reshape(-1, 2)


@pytest.fixture(params=["sha-extensions", "portable"])
def sha_path(request):
    """Run SHA-256 with the x86 SHA extensions where the CPU has them, then with the
    portable rounds (on a CPU without them, both are the portable rounds)."""
    loops = compiled.loops()
    loops.sha256_portable(request.param == "portable")
    yield request.param
    loops.sha256_portable(False)


def test_domain_fingerprints_in_c_are_hashlibs(sha_path):
    """The C sum of SHA-256 fingerprints is hashlib's, on every kind of item, for
    every prefix length across a block, and the domain tag is the Python path's."""
    import hashlib

    from dpstream.mechanisms.known import _ITEM_PREFIX, domain_tag, item_fingerprint
    from dpstream.noise import encode_item

    rng = random.Random(7)
    items = random_items(rng, 3000)
    want = sum(item_fingerprint(x) for x in items) % (1 << 128)
    assert compiled.fingerprint_sum(items, _ITEM_PREFIX, encode_item) == want
    for x in items[:600]:  # one at a time: each item's own digest, not only the sum
        assert compiled.fingerprint_sum([x], _ITEM_PREFIX, encode_item) == item_fingerprint(x)
    for size in range(0, 130):  # prefixes that push the message over block edges
        prefix = bytes(rng.randrange(256) for _ in range(size))
        part = items[size * 10 : size * 10 + 10]
        expect = sum(
            int.from_bytes(hashlib.sha256(prefix + encode_item(x)).digest()[:16], "big")
            for x in part
        )
        assert compiled.fingerprint_sum(part, prefix, encode_item) == expect % (1 << 128)
    tag = domain_tag(items)
    with compiled.numpy_only():
        assert domain_tag(items) == tag
    assert domain_tag(iter(items)) == tag and domain_tag(tuple(items)) == tag


def test_item_ids_in_c_are_hashlibs():
    """Keyed BLAKE2b-128 in C gives hashlib's digests on every kind of item, for
    keys of 1 to 64 bytes, and NoiseSource.item_ids the Python path's ids."""
    rng = random.Random(8)
    items = random_items(rng, 3000)
    from dpstream.noise import encode_item

    for size in (1, 7, 16, 32, 33, 63, 64):
        key = bytes(rng.randrange(256) for _ in range(size))
        out = np.empty((len(items), 2), dtype="<u8")
        assert compiled.item_digests_into(items, key, encode_item, out)
        assert np.array_equal(out, hashlib_ids(key, items)), size
    src = NoiseSource(fixed_key("ids"), "p")
    ids = src.item_ids(items)
    with compiled.numpy_only():
        assert np.array_equal(src.item_ids(items), ids)
        assert np.array_equal(src.item_ids(iter(items)), ids)
    assert np.array_equal(src.item_ids(iter(items)), ids)
    assert np.array_equal(src.item_ids(tuple(items)), ids)


def test_item_hashes_in_c_refuse_what_encode_item_refuses():
    """A bool, a float or another object among str items: the TypeError of
    encode_item, from the C loops as from the Python path; bad arguments refused."""
    from dpstream.mechanisms.known import _ITEM_PREFIX, domain_tag
    from dpstream.noise import encode_item

    src = NoiseSource(fixed_key("ids"), "p")
    for bad in (True, np.bool_(False), 1.5, None, ("a",)):
        items = [f"a{i}" for i in range(100)] + [bad]
        with pytest.raises(TypeError, match="items must be str, int or bytes"):
            src.item_ids(items)
        with pytest.raises(TypeError, match="items must be str, int or bytes"):
            domain_tag(items)
    loops = compiled.loops()
    with pytest.raises(ValueError, match="two words per item"):
        loops.blake2b_ids(["a", "b"], b"k", encode_item, np.empty((1, 2), dtype="<u8"))
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        loops.blake2b_ids(["a"], b"k" * 65, encode_item, np.empty((1, 2), dtype="<u8"))
    with pytest.raises(TypeError):
        loops.blake2b_ids(["a"], b"k", encode_item, np.empty((1, 2), dtype=np.float64))
    with pytest.raises(TypeError, match="non-empty bytes"):
        loops.sha256_sum([1.5], _ITEM_PREFIX, lambda x: "s")


# --------------------------------------------------------------------------- BLT step


def test_blt_step_in_c_gives_the_numpy_bits():
    """stream_step through the C loop and through NumPy, from the same state: the same
    bits in z, the buffers and the running sums, for 0 to 6 buffers, on contiguous
    arrays and on column slices of wider ones (as BLTNoise steps a chunk), over
    many steps (errors would compound) and values of every magnitude."""
    from dpstream.factorization import blt_for_horizon, stream_step

    rng = np.random.default_rng(11)
    for k in range(7):
        if k:
            s = blt_for_horizon(1000, k)
            theta, omega = s.theta, s.omega
        else:
            theta, omega = (), ()
        for n, lo in ((1, 0), (7, 3), (1000, 0), (5000, 123)):
            wide = rng.standard_normal((k, n + lo + 9)) * 10.0 ** rng.integers(-8, 9, (k, 1))
            total = rng.standard_normal(n + lo) * 1e3
            states = []
            for use_c in (True, False):
                b, tot = wide.copy(), total.copy()
                zs = []
                for step in range(20):
                    z = np.random.default_rng(step).standard_normal(n) * 3.0
                    if use_c:
                        assert compiled.blt_step(theta, omega, b[:, lo : lo + n], tot[lo:], z)
                    else:
                        with compiled.numpy_only():
                            stream_step(theta, omega, b[:, lo : lo + n], tot[lo:], z)
                    zs.append(z)
                states.append((b, tot, np.array(zs)))
            for got, want in zip(states[0], states[1], strict=True):
                assert np.array_equal(got.view(np.int64), want.view(np.int64)), (k, n)


def test_blt_step_in_c_leaves_other_layouts_to_numpy():
    """Arrays the C loop does not read (another dtype, a strided running sum,
    buffers whose rows are not contiguous) go to the NumPy path, untouched."""
    theta, omega = (0.9, 0.5), (0.1, 0.2)
    buffers, total, z = np.zeros((2, 8)), np.zeros(8), np.ones(8)
    assert not compiled.blt_step(theta, omega, buffers.astype(np.float32), total, z)
    assert not compiled.blt_step(theta, omega, buffers, np.zeros(16)[::2], z)
    assert not compiled.blt_step(theta, omega, np.zeros((8, 2)).T, total, z)
    assert not total.any() and np.array_equal(z, np.ones(8))
    with pytest.raises(ValueError, match="shapes"):
        compiled.loops().blt_step(np.array(theta), np.array(omega), buffers, total, np.ones(7))


def test_event_duplicates_refuses_inconsistent_arrays():
    """Offsets that do not cover the columns, run backwards or make an event wider
    than 64: an error, nothing read out of bounds."""
    loops = compiled.loops()
    cols = np.arange(100, dtype=np.int64)
    keep, distinct = np.empty(100, dtype=bool), np.empty(2, dtype=np.int64)
    for offsets in ([0, 50, 99], [0, 60, 50], [0, 30, 100]):
        off = np.array(offsets, dtype=np.int64)
        with pytest.raises(ValueError):
            loops.event_duplicates(cols, off, keep, distinct)
    off = np.array([0, 50, 100], dtype=np.int64)
    assert loops.event_duplicates(cols, off, keep, distinct) == 0
    assert keep.all() and distinct.tolist() == [50, 50]
    with pytest.raises(ValueError, match="do not agree"):
        loops.event_duplicates(cols, off, np.empty(99, dtype=bool), distinct)


def _top_k_brute(values: np.ndarray, k: int) -> list[int]:
    """The rule by its definition: sort every index by (value descending, index)."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]


def test_top_k_in_c_and_its_twin_follow_the_rule():
    # Values drawn from few integers so that ties (also at the k-th place) are common:
    # the rule "larger value first, then smaller index" decides them, in C and NumPy.
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        pool = int(rng.integers(1, 8)) if trial % 2 else 10**9
        values = rng.integers(-3, pool, n).astype(np.float64)
        if trial % 5 == 0:
            values[rng.integers(0, n, 3)] = [np.inf, -np.inf, -0.0]
        for k in (0, 1, int(rng.integers(1, n + 1)), n):
            want = _top_k_brute(values, k)
            assert compiled.top_k(values, k).tolist() == want
            assert compiled._top_k_numpy(values, k).tolist() == want
            with compiled.numpy_only():
                assert compiled.top_k(values, k).tolist() == want


def test_top_k_with_nan_leaves_the_choice_to_numpy():
    # No release holds a NaN; if one did, the C loop declines and NumPy's order holds
    # (NaN below every number), so the two paths cannot disagree.
    values = np.array([1.0, np.nan, 3.0, 2.0, np.nan])
    assert not compiled.loops().top_k(values, np.empty(2, dtype=np.int64))
    assert compiled.top_k(values, 2).tolist() == [2, 3]
    assert compiled.top_k(values, 4).tolist()[:3] == [2, 3, 0]


def test_top_k_refuses_more_indices_than_values():
    with pytest.raises(ValueError, match="more indices"):
        compiled.loops().top_k(np.zeros(2), np.empty(3, dtype=np.int64))
