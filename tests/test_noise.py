"""The keyed noise source: determinism, separation of addresses, distributions."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from dpstream import NoiseKey, NoiseSource
from dpstream.noise import encode_item

from .conftest import fixed_key

N = 200_000
# KS test threshold: under the null, P(p-value < 1e-6) = 1e-6. The power check
# below shows the same test rejects a sampler whose scale is 5% off at this n
# (the KS statistic of a 5% scale error is ~0.02, about 9x the null's
# sqrt(-ln(1e-6)/2)/sqrt(n) = 0.0083 critical value).
KS_ALPHA = 1e-6


def draws(kind: str, key: NoiseKey | None = None) -> np.ndarray:
    src = NoiseSource(key or fixed_key("dist"), "test/" + kind)
    prepared = src.prepare(range(N))
    return getattr(src, kind)(prepared, 3, 17, draw=2)


@pytest.mark.statistical
@pytest.mark.parametrize(
    "kind,dist",
    [("gaussian", stats.norm()), ("laplace", stats.laplace()), ("gumbel", stats.gumbel_r())],
)
def test_distribution_matches(kind, dist):
    x = draws(kind)
    assert stats.kstest(x, dist.cdf).pvalue > KS_ALPHA
    # power: the same test must reject the right family at a 5% wrong scale
    assert stats.kstest(x * 1.05, dist.cdf).pvalue < KS_ALPHA


@pytest.mark.statistical
def test_uniform_bits_and_independence_across_cells():
    src = NoiseSource(fixed_key("ind"), "test/ind")
    prepared = src.prepare(range(N))
    a = src.gaussian(prepared, 1, 1)
    b = src.gaussian(prepared, 1, 2)
    c = src.gaussian(prepared, 2, 1)
    d = src.gaussian(prepared, 1, 1, draw=1)
    # sample correlation of independent N(0,1) pairs has sd 1/sqrt(N)
    for other in (b, c, d):
        assert abs(np.corrcoef(a, other)[0, 1]) < 5 / np.sqrt(N)
    u = NoiseSource.to_uniform(src.blocks(prepared, 5, 5))
    assert 0.0 < u.min() and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > KS_ALPHA


def test_same_address_same_value_and_separation():
    key = fixed_key("sep")
    src = NoiseSource(key, "p")
    items = ["a", "b", 5, "5", b"5"]
    prepared = src.prepare(items)
    z1 = src.gaussian(prepared, 2, 3)
    z2 = NoiseSource(NoiseKey.from_bytes(key.to_bytes()), "p").gaussian(
        NoiseSource(key, "p").prepare(items), 2, 3
    )
    assert np.array_equal(z1, z2)
    assert len(set(z1.tolist())) == len(items)  # 5, "5" and b"5" are different items
    q = NoiseSource(key, "q")
    assert not np.array_equal(z1, q.gaussian(q.prepare(items), 2, 3))
    other_key = fixed_key("sep2")
    assert not np.array_equal(
        z1, NoiseSource(other_key, "p").gaussian(NoiseSource(other_key, "p").prepare(items), 2, 3)
    )
    # one item's noise does not depend on which other items are drawn with it
    alone = src.gaussian(src.prepare(["b"]), 2, 3)
    assert alone[0] == z1[1]
    # blocks_many agrees with one address at a time
    many = src.to_gaussian(src.blocks_many(prepared, [(2, 3, 0), (1, 1, 0)]))
    assert np.array_equal(many[0], z1)
    assert np.array_equal(many[1], src.gaussian(prepared, 1, 1))
    # scalar draws are deterministic and differ by address
    assert src.scalar("laplace", 0, 7, 1) == src.scalar("laplace", 0, 7, 1)
    assert src.scalar("laplace", 0, 7, 1) != src.scalar("laplace", 0, 8, 1)


def test_same_values_in_a_fresh_process():
    key = fixed_key("proc")
    here = NoiseSource(key, "x").gaussian(NoiseSource(key, "x").prepare(["u", "v", 9]), 4, 2, 1)
    code = (
        "import sys, numpy as np; from dpstream import NoiseKey, NoiseSource;"
        f"k = NoiseKey.from_bytes(bytes.fromhex('{key.to_bytes().hex()}'));"
        "s = NoiseSource(k, 'x');"
        "print(s.gaussian(s.prepare(['u', 'v', 9]), 4, 2, 1).tobytes().hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == here.tobytes().hex()


def test_key_file_roundtrip_and_permissions(tmp_path):
    key = NoiseKey.generate()
    path = tmp_path / "k.key"
    key.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert NoiseKey.load(path) == key
    with pytest.raises(FileExistsError):
        key.save(path)  # a key in use is never overwritten
    assert key.to_bytes().hex() not in repr(key)
    assert NoiseKey.generate() != key


def test_bad_keys_and_items():
    with pytest.raises(ValueError, match="32 bytes"):
        NoiseKey.from_bytes(b"short")
    with pytest.raises(TypeError):
        NoiseKey.from_bytes("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bool"):
        encode_item(True)
    with pytest.raises(TypeError, match="float"):
        encode_item(1.5)
    assert encode_item(np.int64(5)) == encode_item(5)
    with pytest.raises(ValueError, match="purpose"):
        NoiseSource(fixed_key("x"), "")


def test_item_ids_are_128_bit_and_distinct():
    src = NoiseSource(fixed_key("ids"), "p")
    ids = src.item_ids(range(100_000))
    assert ids.shape == (100_000, 2) and ids.dtype == np.dtype("<u8")
    assert len({(int(a), int(b)) for a, b in ids}) == 100_000


def test_prepared_ids_are_aes_of_the_ids_and_give_them_back():
    """prepare_ids is AES-ECB of each 16-byte identifier under the purpose's item key
    (checked block by block with the cipher itself); item_ids_of inverts it."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = fixed_key("unprepare")
    src = NoiseSource(key, "p/unprepare")
    ids = src.item_ids([f"x{i}" for i in range(1000)] + ["", "\u00e9"])
    prepared = src.prepare_ids(ids)
    enc = Cipher(algorithms.AES(key.derive("item-noise:p/unprepare")), modes.ECB()).encryptor()
    for row in (0, 1, 500, len(ids) - 1):
        block = enc.update(ids[row].astype("<u8").tobytes())
        assert prepared.words[row].astype("<u8").tobytes() == block
    back = src.item_ids_of(prepared)
    assert back.dtype == np.dtype("<u8") and np.array_equal(back, ids)
    assert np.array_equal(src.item_ids_of(prepared.subset([5, 2])), ids[[5, 2]])
    assert not np.array_equal(NoiseSource(key, "p/other").item_ids_of(prepared), ids)
    assert src.item_ids_of(prepared.subset(slice(0, 0))).shape == (0, 2)


def test_loading_a_key_that_others_can_read_warns(tmp_path):
    import os
    import warnings

    from dpstream import NoiseKey

    path = tmp_path / "k.key"
    NoiseKey.generate().save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NoiseKey.load(path)  # 0600: silent
    os.chmod(path, 0o644)
    with pytest.warns(UserWarning, match="chmod 600"):
        NoiseKey.load(path)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 16])
def test_ids_and_domain_tag_hashed_in_chunks_are_the_per_item_values(monkeypatch, chunk):
    """Item ids and the domain tag are computed a chunk of items at a time (bounded
    memory); any chunk size gives, for a list and for a one-pass iterator, the values
    of hashing each item alone (keyed BLAKE2b by hashlib directly, and the tag as the
    sum of item_fingerprint mod 2^128)."""
    import hashlib

    from dpstream import noise
    from dpstream.mechanisms.known import combine_fingerprints, domain_tag, item_fingerprint

    monkeypatch.setattr(noise, "DIGEST_CHUNK", chunk)
    src = NoiseSource(fixed_key("chunks"), "p")
    items = [f"it{i}" for i in range(20)] + [5, b"\x00raw", "é"]
    want = np.array(
        [
            np.frombuffer(
                hashlib.blake2b(encode_item(x), key=src._item_hash_key, digest_size=16).digest(),
                dtype="<u8",
            )
            for x in items
        ]
    )
    assert np.array_equal(src.item_ids(items), want)
    assert np.array_equal(src.item_ids(iter(items)), want)
    assert src.item_ids([]).shape == (0, 2)
    tag = combine_fingerprints(sum(item_fingerprint(x) for x in items), len(items))
    assert domain_tag(items) == tag and domain_tag(iter(items)) == tag
    with pytest.raises(TypeError, match="items must be str, int or bytes"):
        src.item_ids(items[:5] + [1.5])

    # a list that grows or shrinks while it is hashed (an item whose encoding edits it)
    def editing(edit, victim):
        class Editing(str):
            def encode(self, *args, **kwargs):
                edit(victim)
                return str.encode(self, *args, **kwargs)

        return Editing

    for edit in (lambda xs: xs.append("more"), lambda xs: xs.pop()):
        victim = [f"v{i}" for i in range(10)]
        victim[2] = editing(edit, victim)("v2")
        before = [str(x) for x in victim]
        if chunk < 10:  # the edit lands in a chunk not read yet
            with pytest.raises(ValueError, match="the items changed while their ids"):
                src.item_ids(victim)
        else:  # one chunk, taken before any item was hashed: the items of the call
            assert np.array_equal(src.item_ids(victim), src.item_ids(before))


def test_blocks_at_gives_each_item_its_own_draw():
    """Row r of blocks_at is item r's block at (level, index, draws[r]), as blocks gives it."""
    from dpstream.noise import MAX_DRAW

    src = NoiseSource(fixed_key("blocks-at"), "s/p")
    prepared = src.prepare(["a", 5, b"c", "a"])
    draws = np.array([0, 7, MAX_DRAW, 7], dtype=np.uint64)
    got = src.blocks_at(prepared, 3, 2**64 - 1, draws)
    for r in range(4):
        want = src.blocks(prepared.subset([r]), 3, 2**64 - 1, int(draws[r]))[0]
        assert got[r].tolist() == want.tolist()
    assert got[0].tolist() != got[3].tolist()  # one item, two draws
    with pytest.raises(ValueError, match="draw"):
        src.blocks_at(prepared, 0, 1, draws + np.uint64(1))
    with pytest.raises(ValueError, match="shape"):
        src.blocks_at(prepared, 0, 1, draws[:2])


@pytest.mark.parametrize("byte", ["00", "ff", "5a"])
def test_a_key_file_of_one_byte_value_is_refused(tmp_path, byte):
    """Review 112: a key file of 64 zeros (a placeholder from a secret store, say) was a
    key, whose noise anyone can remove."""
    path = tmp_path / "k.key"
    path.write_text(byte * 32 + "\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="placeholder, not a secret"):
        NoiseKey.load(path)


@pytest.mark.parametrize("byte", [0, 1, 255])
def test_a_placeholder_secret_is_refused_in_python_too(byte):
    """Review 121: NoiseKey(bytes(32)) and NoiseKey.from_bytes(b"\\x01" * 32) were keys
    (whose noise anyone can remove), though NoiseKey.load refused the same secret."""
    for make in (NoiseKey, NoiseKey.from_bytes):
        with pytest.raises(ValueError, match="placeholder, not a secret"):
            make(bytes([byte]) * 32)
    NoiseKey(bytes([byte]) * 31 + bytes([byte ^ 1]))  # one byte apart: a key
