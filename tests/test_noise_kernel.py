"""The chunked noise kernel against a per-block reference implementation of the PRF.

The reference below is written from the construction in the docstring of
``dpstream.noise``, one item and one AES block at a time, with nothing shared
with the kernel: the AES keys by HMAC-SHA256, the two-block CBC-MAC
``AES(AES(id) XOR tweak)``, the 53-bit uniform ``(k + 1/2) 2^-53`` and the
inverse CDFs. The kernel must give the same bits for random addresses (the full
range of level, index and draw), for batch sizes just below, at and above the
chunk size, with a tiny chunk forced so that many boundaries are crossed
cheaply, and on several threads. A kernel that mis-aligns a chunk, reuses a
stale scratch buffer, drops the ``+ 1/2`` or reorders an operation fails here.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy.special import ndtri

from dpstream import NoiseKey, NoiseSource, noise_kernel
from dpstream.mechanisms import tree_noise
from dpstream.mechanisms.tree_noise import TreeNoise, stored_suffix_rows
from dpstream.noise import MAX_DRAW, MAX_LEVEL, PreparedItems
from dpstream.tree import cells_by_level, num_levels

from .conftest import fixed_key

DISTRIBUTIONS = ("uniform", "gaussian", "laplace", "gumbel")


# -- the reference PRF, one block at a time -----------------------------------------------


class ReferencePRF:
    """Noise values straight from the construction, per item and per AES block."""

    def __init__(self, key: NoiseKey, purpose: str) -> None:
        secret = key.to_bytes()
        label = b"dpstream/noise/v1/item-noise:" + purpose.encode()
        self.aes_key = hmac.new(secret, label, hashlib.sha256).digest()
        self.hash_key = hmac.new(secret, b"dpstream/noise/v1/item-id", hashlib.sha256).digest()

    def aes_block(self, block: bytes) -> bytes:
        assert len(block) == 16
        enc = Cipher(algorithms.AES(self.aes_key), modes.ECB()).encryptor()
        return enc.update(block) + enc.finalize()

    def item_id(self, item: str) -> bytes:
        return hashlib.blake2b(b"s" + item.encode(), key=self.hash_key, digest_size=16).digest()

    def block(self, item_id: bytes, level: int, index: int, draw: int) -> bytes:
        tweak = (level | (draw << 16)).to_bytes(8, "little") + index.to_bytes(8, "little")
        first = self.aes_block(item_id)
        return self.aes_block(bytes(a ^ b for a, b in zip(first, tweak, strict=True)))

    @staticmethod
    def value(block: bytes, distribution: str, scale: float) -> float:
        k = int.from_bytes(block[:8], "little") >> 11  # top 53 bits of the first word
        u = min((float(k) + 0.5) * 2.0**-53, math.nextafter(1.0, 0.0))  # never 1.0
        if distribution == "uniform":
            return u
        if distribution == "gaussian":
            z = float(ndtri(u))
            return z * scale if scale != 1.0 else z
        # NumPy's log/log1p are the definition (they may differ from libm in the
        # last bit); applied to one scalar they run the same code as on arrays.
        if distribution == "laplace":
            v = u - 0.5
            return (-scale * math.copysign(1.0, v) if v else 0.0) * float(
                np.log1p(np.float64(-2.0 * abs(v)))
            )
        assert distribution == "gumbel"
        return -scale * float(np.log(np.float64(-float(np.log(np.float64(u))))))

    def values(
        self, ids: list[bytes], address: tuple[int, int, int], distribution: str, scale: float
    ) -> np.ndarray:
        blocks = [self.block(i, *address) for i in ids]
        return np.array([self.value(b, distribution, scale) for b in blocks])


def random_ids(rng: random.Random, n: int) -> list[bytes]:
    return [rng.getrandbits(128).to_bytes(16, "little") for _ in range(n)]


def as_words(ids: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(ids), dtype="<u8").reshape(-1, 2).copy()


def random_address(rng: random.Random) -> tuple[int, int, int]:
    return (
        rng.choice([0, 1, rng.randrange(MAX_LEVEL + 1), MAX_LEVEL]),
        rng.choice([0, 1, rng.getrandbits(64), 2**64 - 1]),
        rng.choice([0, 1, rng.randrange(MAX_DRAW + 1), MAX_DRAW]),
    )


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of 8 items, so a few dozen items cross several chunk boundaries."""
    monkeypatch.setattr(noise_kernel, "CHUNK_ITEMS", 8)
    return 8


@pytest.fixture
def two_threads():
    old = noise_kernel.set_threads(2)
    yield
    noise_kernel.set_threads(old)


# -- draws ------------------------------------------------------------------------------


def test_reference_agrees_with_the_documented_item_hash():
    """The reference's item ids and AES key are those of NoiseSource (checks the checker)."""
    key = fixed_key("kernel-hash")
    ref, src = ReferencePRF(key, "p"), NoiseSource(key, "p")
    items = ["a", "bc", ""]
    assert as_words([ref.item_id(i) for i in items]).tobytes() == src.item_ids(items).tobytes()
    prepared = src.prepare(items)
    want = ref.values([ref.item_id(i) for i in items], (2, 5, 1), "gaussian", 1.0)
    assert same_bits(src.gaussian(prepared, 2, 5, 1), want)


def test_the_top_word_gives_finite_noise_on_every_path():
    """k = 2^53 - 1 (a word with its top 53 bits set) would make the uniform
    (k + 1/2) 2^-53 round to 1.0, where ndtri, Laplace's and Gumbel's inverse CDFs
    are infinite: a released count of +inf whatever the data. It must give the
    largest double below 1 instead, in the whole-array definition, in the chunked
    kernel (fed the blocks by a stand-in cipher) and in the C restarts."""
    from dpstream import compiled
    from dpstream.ziggurat import UNIFORM_MAX, uniforms_from_words

    top = np.uint64(2**64 - 1)
    assert UNIFORM_MAX == math.nextafter(1.0, 0.0)
    assert uniforms_from_words(np.array([top, np.uint64(2**63)])).tolist() == [
        UNIFORM_MAX,
        0.5,
    ]  # k = 2^52: k + 1/2 rounds to 2^52 (even), exactly 1/2
    blocks = np.array([[top, top], [top - np.uint64(2**11), 7]], dtype="<u8")
    src = NoiseSource(fixed_key("top"), "top")
    defs = {
        "uniform": src.to_uniform(blocks),
        "gaussian": src.to_gaussian(blocks, 2.0),
        "laplace": src.to_laplace(blocks, 2.0),
        "gumbel": src.to_gumbel(blocks, 2.0),
    }
    assert defs["uniform"].tolist() == [UNIFORM_MAX, 1.0 - 2.0**-52]  # 2^53 - 3/2: to even
    assert all(np.isfinite(v).all() for v in defs.values())

    class Fixed:  # a cipher that "encrypts" to the chosen blocks
        def update_into(self, data, buf):
            raw = blocks.tobytes()
            buf[: len(raw)] = raw
            return len(raw)

    ws = noise_kernel.Workspace(4)
    tile = noise_kernel.tweak_tile(0, 0, 2)
    for dist, want in defs.items():
        got = np.empty(2)
        noise_kernel.noise_chunk(
            Fixed(),
            np.zeros((2, 2), "<u8"),
            tile,
            dist,
            1.0 if dist == "uniform" else 2.0,
            got,
            False,
            ws,
        )
        assert same_bits(got, want), dist
    assert compiled.ndtri_enabled() or not compiled.enabled()
    if compiled.ndtri_enabled():
        out = np.empty(1)
        assert compiled.ziggurat_restarts(np.array([top]), np.array([0]), out)
        assert np.isfinite(out).all() and same_bits(out, ndtri(np.array([UNIFORM_MAX])))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 45])
def test_draws_match_reference_across_tiny_chunk_boundaries(tiny_chunks, n):
    rng = random.Random(1000 + n)
    key = fixed_key("kernel-draws")
    ref, src = ReferencePRF(key, "test/kernel"), NoiseSource(key, "test/kernel")
    ids = random_ids(rng, n)
    prepared = src.prepare_ids(as_words(ids))
    for distribution in DISTRIBUTIONS:
        address = random_address(rng)
        scale = rng.choice([1.0, 0.37, 12.5])
        want = ref.values(ids, address, distribution, scale)
        got = src.draw_into(prepared, *address, distribution=distribution, scale=scale)
        assert same_bits(got, want), (distribution, address, scale)
        if distribution != "uniform":
            assert same_bits(getattr(src, distribution)(prepared, *address, scale=scale), want)
        # accumulate adds the same values to what is there (as the tree's sums do)
        base = np.linspace(-3.0, 3.0, n)
        got = src.draw_into(
            prepared,
            *address,
            distribution=distribution,
            scale=scale,
            out=base.copy(),
            accumulate=True,
        )
        assert same_bits(got, base + want)


def test_draws_match_reference_at_the_real_chunk_size():
    chunk = noise_kernel.CHUNK_ITEMS
    rng = random.Random(7)
    key = fixed_key("kernel-chunk")
    ref, src = ReferencePRF(key, "test/chunk"), NoiseSource(key, "test/chunk")
    ids = random_ids(rng, chunk + 1)
    address = random_address(rng)
    want = ref.values(ids, address, "gaussian", 2.5)
    for n in (chunk - 1, chunk, chunk + 1):
        got = src.gaussian(src.prepare_ids(as_words(ids[:n])), *address, scale=2.5)
        assert same_bits(got, want[:n]), n


def test_threads_give_the_same_values(tiny_chunks, two_threads):
    rng = random.Random(3)
    key = fixed_key("kernel-threads")
    ref, src = ReferencePRF(key, "t"), NoiseSource(key, "t")
    ids = random_ids(rng, 100)
    prepared = src.prepare_ids(as_words(ids))
    for distribution in DISTRIBUTIONS:
        address = random_address(rng)
        assert same_bits(
            src.draw_into(prepared, *address, distribution=distribution),
            ref.values(ids, address, distribution, 1.0),
        )


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_match_reference(tiny_chunks, threads):
    old = noise_kernel.set_threads(threads)
    try:
        rng = random.Random(11)
        key = fixed_key("kernel-blocks")
        ref, src = ReferencePRF(key, "b"), NoiseSource(key, "b")
        ids = random_ids(rng, 21)
        prepared = src.prepare_ids(as_words(ids))
        addresses = [random_address(rng) for _ in range(3)]
        many = src.blocks_many(prepared, addresses)
        assert many.shape == (3, 21, 2)
        for a, address in enumerate(addresses):
            want = b"".join(ref.block(i, *address) for i in ids)
            assert many[a].tobytes() == want
            assert src.blocks(prepared, *address).tobytes() == want
        assert src.blocks_many(prepared, []).shape == (0, 21, 2)
        assert src.blocks(src.prepare_ids(np.zeros((0, 2), "<u8")), 1, 1).shape == (0, 2)
    finally:
        noise_kernel.set_threads(old)


def test_draw_into_checks_its_arguments():
    src = NoiseSource(fixed_key("kernel-args"), "a")
    prepared = src.prepare(["x", "y"])
    with pytest.raises(ValueError, match="distribution"):
        src.draw_into(prepared, 1, 1, distribution="cauchy")
    with pytest.raises(ValueError, match="out"):
        src.draw_into(prepared, 1, 1, out=np.zeros(3))
    with pytest.raises(ValueError, match="out"):
        src.draw_into(prepared, 1, 1, out=np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="level"):
        src.draw_into(prepared, MAX_LEVEL + 1, 1)
    assert src.draw_into(src.prepare([]), 1, 1).shape == (0,)
    with pytest.raises(ValueError, match="threads"):
        noise_kernel.set_threads(0)
    with pytest.raises(TypeError, match="threads"):
        noise_kernel.set_threads(1.5)  # type: ignore[arg-type]


def test_run_tasks_covers_every_task_once_and_reraises(two_threads):
    seen: list[int] = []

    def record(lo: int, hi: int) -> None:
        seen.extend(range(lo, hi))

    noise_kernel.run_tasks(13, record)
    assert sorted(seen) == list(range(13))

    def fail(lo: int, hi: int) -> None:
        if lo > 0:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        noise_kernel.run_tasks(10, fail)


def test_run_tasks_inside_a_task_does_not_wait_on_its_own_pool(two_threads):
    import threading

    done: list[bool] = []

    def nested(lo: int, hi: int) -> None:
        inner: list[int] = []
        noise_kernel.run_tasks(8, lambda a, b: inner.extend(range(a, b)))
        assert sorted(inner) == list(range(8))
        done.append(True)

    runner = threading.Thread(target=noise_kernel.run_tasks, args=(8, nested), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive() and done == [True] * 8


# -- tree sums --------------------------------------------------------------------------


def reference_tree_noise(
    ref: ReferencePRF, ids: list[bytes], t: int, horizon: int, base: int, cell_std: float
) -> np.ndarray:
    """Per item: each level's cells added in increasing index from 0.0, then the levels
    added from the top level down (the definition in tree_noise's docstring)."""
    levels = num_levels(horizon, base)
    out = []
    for item_id in ids:
        sums = [0.0] * levels
        for lv, lo, hi in cells_by_level(t, base) if t else []:
            for j in range(lo, hi + 1):
                sums[lv - 1] += ref.value(ref.block(item_id, lv, j, 0), "gaussian", cell_std)
        total = sums[levels - 1]
        for row in range(levels - 2, -1, -1):
            total = total + sums[row]
        out.append(total)
    return np.array(out)


# refold budgets that store all 4 suffix rows above row 0, 3, 2, and 1
@pytest.mark.parametrize("budget", [0.0, 0.25, 1.0, 1e9])
def test_tree_noise_matches_reference_over_chunks_segments_and_steps(
    tiny_chunks, monkeypatch, budget
):
    monkeypatch.setattr(tree_noise, "_REFOLD_BUDGET", budget)
    monkeypatch.setattr(tree_noise, "_GROW_ITEMS", 16)  # many segments
    horizon, base, std = 200, 3, 1.7
    rng = random.Random(5)
    key = fixed_key("kernel-tree")
    ref, src = ReferencePRF(key, "tree"), NoiseSource(key, "tree")
    levels = num_levels(horizon, base)
    stored = stored_suffix_rows(levels, base)
    assert stored == {0.0: 4, 0.25: 3, 1.0: 2, 1e9: 1}[budget]
    tn = TreeNoise(src, horizon, base, std, kept_levels=levels)  # every level kept
    assert tn._stored == stored
    ids: list[bytes] = []
    t = 0
    checks = 0
    while t < 60:
        if rng.random() < 0.4:  # new items join at the current t (from scratch)
            new = random_ids(rng, rng.choice([1, 3, 9, 20]))
            tn.add_items(src.prepare_ids(as_words(new)))
            ids += new
        t += 1 if rng.random() < 0.8 else rng.randrange(2, 8)  # steps and jumps
        counts = np.arange(len(ids), dtype=np.int64)
        values = tn.advance(t, counts)
        want = reference_tree_noise(ref, ids, t, horizon, base, std)
        assert same_bits(tn.noise(), want), t
        assert same_bits(values, counts + want)
        checks += 1
    assert len(tn._segments) > 3 and checks > 30
    # a restore from the level sums continues bit for bit
    restored = TreeNoise.restore(
        src, horizon, base, std, tn.prepared, tn.t, tn.level_sums(), kept_levels=levels
    )
    for step in (t + 1, t + 2, t + 9):
        tn.advance(step)
        restored.advance(step)
        assert same_bits(restored.noise(), tn.noise())
    assert same_bits(tn.noise(), reference_tree_noise(ref, ids, t + 9, horizon, base, std))


@pytest.mark.parametrize("horizon,base", [(200, 3), (700, 5), (130, 2)])
def test_folded_levels_give_the_bits_of_every_level_kept(tiny_chunks, monkeypatch, horizon, base):
    """Keeping only the lowest A levels one by one (the others as their fold, drawn
    again at the steps that change them) must give, at every step, the noise and
    the level sums of the tree that keeps every level (which the test above holds
    to the reference), for every A, with items joining, jumps, and a restore from
    the exported level sums; and the default A must be the budget's choice."""
    monkeypatch.setattr(tree_noise, "_GROW_ITEMS", 16)
    levels = num_levels(horizon, base)
    src = NoiseSource(fixed_key("kernel-fold"), f"fold/{base}")
    rng = random.Random(horizon)
    trees = {a: TreeNoise(src, horizon, base, 0.8, kept_levels=a) for a in range(1, levels + 1)}
    default = TreeNoise(src, horizon, base, 0.8)
    want_kept = next(
        (
            a
            for a in range(1, levels)
            if (levels - a) * (base - 1) / 2 <= tree_noise._REDRAW_BUDGET * base**a
        ),
        levels,
    )
    assert default.kept_levels == want_kept
    assert 1 < want_kept < levels  # the default folds: this test covers it
    full = trees[levels]
    folds = t = 0
    while t < horizon - 8:
        if rng.random() < 0.3:
            new = src.prepare_ids(as_words(random_ids(rng, rng.choice([1, 4, 25]))))
            for tn in trees.values():
                tn.add_items(new)
        t += 1 if rng.random() < 0.85 else rng.randrange(2, 9)
        counts = np.arange(len(full), dtype=np.int64)
        want = full.advance(t, counts)
        for a, tn in trees.items():
            if tn is full:
                continue
            assert same_bits(tn.advance(t, counts), want), (a, t)
            assert same_bits(tn.noise(), full.noise()), (a, t)
        folds += t % base**want_kept == 0
    for a, tn in trees.items():
        assert same_bits(tn.level_sums(), full.level_sums()), a  # folded sums drawn again
        back = TreeNoise.restore(
            src, horizon, base, 0.8, tn.prepared, t, tn.level_sums(), kept_levels=a
        )
        for step in (t + 1, t + 3, horizon):
            back.advance(step)
            tn.advance(step)
            assert same_bits(back.noise(), tn.noise()), (a, step)
        assert same_bits(tn.noise(), trees[1].noise()), a
    assert len(full) > 100 and len(full._segments) > 3


def test_kept_levels_and_their_storage():
    """The default A per (T, r), the rows an item costs, and refusals."""
    src = NoiseSource(fixed_key("kernel-kept"), "k")
    for horizon, base, kept, stored, rows in [
        (1000, 5, 3, 1, 4),
        (10**6, 5, 4, 2, 5),
        (1000, 2, 6, 3, 7),
        (10**6, 2, 8, 4, 9),
        (20, 5, 2, 1, 2),
        (4, 5, 1, 0, 1),
    ]:
        tn = TreeNoise(src, horizon, base, 1.0)
        assert (tn.kept_levels, tn._stored, tn._rows) == (kept, stored, rows), (horizon, base)
        tn.add_items(src.prepare_ids(np.zeros((10, 2), "<u8")))
        (seg,) = tn._segments
        assert seg.level_sum.shape == (rows, 10) and seg.suffix.shape == (stored, 10)
    for bad in (0, 6, 2.0, True, "3"):
        with pytest.raises(ValueError, match="kept_levels"):
            TreeNoise(src, 1000, 5, 1.0, kept_levels=bad)
    assert TreeNoise(src, 1000, 5, 1.0, kept_levels=np.int64(2)).kept_levels == 2


def test_values_into_a_given_array_and_from_a_start():
    """advance(t, counts, out=) and plus_noise(counts, start=, out=) write counts +
    noise() (its slice from start) into the caller's array, and refuse a wrong one."""
    src = NoiseSource(fixed_key("kernel-out"), "out")
    tn = TreeNoise(src, 300, 3, 1.2)
    tn.add_items(src.prepare_ids(as_words(random_ids(random.Random(3), 40))))
    counts = np.arange(40, dtype=np.int64)
    buf = np.full(45, -7.0)
    got = tn.advance(1, counts, out=buf[:40])
    assert np.shares_memory(got, buf) and same_bits(buf[:40], counts + tn.noise())
    assert (buf[40:] == -7.0).all()
    for start in (0, 1, 17, 39, 40):
        part = np.empty(40 - start)
        assert tn.plus_noise(counts[start:], start=start, out=part) is part
        assert same_bits(part, counts[start:] + tn.noise()[start:]), start
        assert same_bits(tn.plus_noise(counts[start:], start=start), part)
    for bad in (np.empty(39), np.empty(40, np.float32), np.empty(80)[::2]):
        with pytest.raises(ValueError, match="out"):
            tn.advance(tn.t + 1, counts, out=bad)
    with pytest.raises(ValueError, match="start"):
        tn.plus_noise(counts, start=41)
    with pytest.raises(ValueError, match="counts"):
        tn.plus_noise(counts, start=1)


@pytest.mark.parametrize("purpose", ["late", "/v2/late"])
def test_items_joining_late_get_the_noise_of_items_there_from_the_start(purpose):
    """Items that join at t are computed from scratch: a few at a time draw all the
    cells of I_t in one kernel call (the batched path), many at a time cell by cell.
    Either way each item's noise must be, bit for bit, that of the same item held
    from t = 0 and stepped one draw at a time. Version 2 (the ziggurat) included:
    with ~40,000 late draws its restarts and tail points (~0.6% and ~0.4%) occur."""
    horizon, base, std = 400, 5, 1.3  # up to 4 cells a level: their order matters
    src = NoiseSource(fixed_key("kernel-late"), purpose)
    rng = random.Random(11)
    everyone = random_ids(rng, 16000)
    early = TreeNoise(src, horizon, base, std)
    early.add_items(src.prepare_ids(as_words(everyone)))
    late = TreeNoise(src, horizon, base, std)
    joined = 0
    batched = unbatched = 0
    for t in range(1, 301):
        early.advance(t)
        late.advance(t)
        big = t in (50, 121, 202, 263)  # many items at once: cell by cell
        if big or rng.random() < 0.5:
            m = 3000 if big else rng.choice([1, 2, 5, 17, 60])
            new = everyone[joined : joined + m]
            cells = sum(hi - lo + 1 for _, lo, hi in cells_by_level(t, base))
            if 1 < cells and cells * len(new) <= noise_kernel.CHUNK_ITEMS:
                batched += 1
            else:
                unbatched += 1
            late.add_items(src.prepare_ids(as_words(new)))
            joined += len(new)
        assert same_bits(late.noise(), early.noise()[:joined]), t
    assert batched > 100 and unbatched >= 4 and joined > 14000


def test_tree_noise_threads_and_chunks_do_not_change_values(tiny_chunks, two_threads):
    key = fixed_key("kernel-tree-threads")
    src = NoiseSource(key, "tt")
    ref = ReferencePRF(key, "tt")
    ids = random_ids(random.Random(9), 77)
    tn = TreeNoise(src, 500, 4, 0.9)
    tn.add_items(src.prepare_ids(as_words(ids)))
    for t in (1, 2, 3, 4, 5, 16, 17, 64, 65, 66):
        tn.advance(t)
        assert same_bits(tn.noise(), reference_tree_noise(ref, ids, t, 500, 4, 0.9)), t


# -- storage ----------------------------------------------------------------------------


def test_known_domain_storage_is_exact():
    src = NoiseSource(fixed_key("kernel-mem"), "m")
    for n in (5, 70_000):
        for kept, per_item in [(6, 80.0), (3, 56.0)]:  # every level; the default (folded)
            tn = TreeNoise(src, 10_000, 5, 1.0, kept_levels=None if kept < 6 else 6)
            assert tn.kept_levels == kept
            tn.add_items(src.prepare_ids(np.zeros((n, 2), "<u8")))
            (seg,) = tn._segments
            rows = kept + (kept < 6)
            assert seg.capacity == n and seg.level_sum.shape == (rows, n)
            assert seg.suffix.shape == (stored_suffix_rows(kept, 5), n)
            got = (seg.words.nbytes + seg.level_sum.nbytes + seg.suffix.nbytes) / n
            assert got == per_item


def test_growing_storage_is_amortised_and_bounded(monkeypatch):
    monkeypatch.setattr(tree_noise, "_GROW_ITEMS", 64)
    src = NoiseSource(fixed_key("kernel-grow"), "g")
    tn = TreeNoise(src, 1000, 3, 1.0)
    rng = random.Random(2)
    n = copies = 0
    ids = []
    for t in range(1, 200):
        m = rng.choice([0, 1, 2, 5, 30])
        before = [id(s.level_sum) for s in tn._segments]
        new = np.array([[n + i, t] for i in range(m)], dtype="<u8").reshape(m, 2)
        tn.add_items(src.prepare_ids(new))
        ids.append(new)
        n += m
        copies += sum(1 for s in tn._segments[: len(before)] if id(s.level_sum) not in before)
        tn.advance(t)
        capacity = sum(s.capacity for s in tn._segments)
        assert n <= capacity <= n + 64
        assert all(s.n == s.capacity for s in tn._segments[:-1])
    assert len(tn) == n and tn.level_sums().shape == (tn.levels, n)
    assert copies <= 8 * (len(tn._segments) + 1)  # doubling up to 64: a few copies per segment
    assert tn.prepared.words.tobytes() == src.prepare_ids(np.concatenate(ids)).words.tobytes()


def test_prepared_items_are_not_copied_for_one_segment():
    src = NoiseSource(fixed_key("kernel-share"), "s")
    prepared = src.prepare(range(10))
    tn = TreeNoise(src, 100, 2, 1.0)
    tn.add_items(prepared)
    assert np.shares_memory(tn.prepared.words, prepared.words)
    assert isinstance(tn.prepared, PreparedItems)


@pytest.mark.parametrize("horizon,base", [(3, 4), (5, 3), (40, 2)])  # 1, 2 and 6 levels
def test_tree_noise_matches_reference_for_few_and_many_levels(tiny_chunks, horizon, base):
    key = fixed_key("kernel-levels")
    src, ref = NoiseSource(key, "lv"), ReferencePRF(key, "lv")
    ids = random_ids(random.Random(horizon), 19)
    tn = TreeNoise(src, horizon, base, 1.1)
    tn.add_items(src.prepare_ids(as_words(ids)))
    for t in range(1, horizon + 1):
        values = tn.advance(t, np.ones(19, dtype=np.int64))
        want = reference_tree_noise(ref, ids, t, horizon, base, 1.1)
        assert same_bits(tn.noise(), want) and same_bits(values, 1 + want), t


def _draw_in_child(queue) -> None:
    src = NoiseSource(fixed_key("kernel-fork"), "f")
    queue.put(src.gaussian(src.prepare(range(100)), 1, 2).tobytes())


def test_a_forked_child_draws_with_threads(tiny_chunks, two_threads):
    """The parent's pool threads do not exist in a forked child; the kernel must not wait
    for them (it would hang)."""
    import multiprocessing

    src = NoiseSource(fixed_key("kernel-fork"), "f")
    here = src.gaussian(src.prepare(range(100)), 1, 2).tobytes()  # the pool now exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_draw_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and got == here


def test_threads_default_comes_from_the_environment():
    import subprocess
    import sys

    code = "from dpstream import noise_kernel as k; print(k.get_threads())"
    env = {"DPSTREAM_NOISE_THREADS": "3", "PATH": "", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "3"
    env["DPSTREAM_NOISE_THREADS"] = "many"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "DPSTREAM_NOISE_THREADS" in out.stderr
