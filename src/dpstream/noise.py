"""Keyed noise: every noise value is a pure function of (key, purpose, item, cell, draw).

Layer 2 of dpstream (docs/architecture.md). A release path never calls ``np.random``;
it asks a :class:`NoiseSource` for the noise at an address, and the same address
gives the same value in every process, after any restart, on the local engine
and on Spark. That is what lets a mechanism be restarted, run next to any
aggregator from the prefix histogram alone, or be spread over executors,
without a table of drawn values and without ever drawing a value twice.

Construction
------------
* The secret is a 32-byte :class:`NoiseKey` from the OS CSPRNG (``secrets``).
* Items are mapped to 128-bit identifiers by a keyed hash (BLAKE2b with a key
  derived from the secret, 16-byte digest) of a canonical, type-tagged byte
  encoding of the item (``"5"`` and ``5`` are different items).
* Each *purpose* (e.g. ``"default/tree"`` for the tree noise of a stream) gets
  its own AES-256 key, derived from the secret by HMAC-SHA256.
* The 128-bit block for (item, cell, draw) under a purpose is the two-block
  CBC-MAC ``AES_p(AES_p(item_id) XOR tweak(cell, draw))``. CBC-MAC on messages
  of one fixed length (here always two blocks) is a pseudorandom function
  (Bellare, Kilian and Rogaway), so blocks at distinct addresses are
  computationally independent uniform strings. ``AES_p(item_id)`` depends on
  the item alone and is computed once per item ("prepared" ids), so a step over
  n items costs one vectorised AES call over n blocks.
* Noise that belongs to no item (a sparse-vector threshold, say) uses a separate
  per-purpose key on the single block tweak(cell, draw).
* Uniforms take the top 53 bits of a 64-bit word, ``(k + 1/2) / 2**53`` rounded
  to a double, and the one word that rounds to 1.0 (k = 2**53 - 1) gives the
  largest double below 1 instead, so they lie strictly inside (0, 1) and no
  inverse CDF is infinite; Laplace and Gumbel come from their inverse CDFs.
* Gaussians depend on the *noise version*, which the purpose carries:

  - version 1 (purposes as given): the inverse CDF of the uniform
    (``scipy.special.ndtri``);
  - version 2 (purposes that start with ``"/v2/"``): the ziggurat method of
    :mod:`dpstream.ziggurat`, exact like the inverse CDF and about 1.4x as
    fast per draw; its rare restarts read the AES of the block under a third
    key of the purpose (``"gaussian-retry:"``).

  Every new stream draws version 2: mechanisms, counters, the Spark classes and
  ``dpstream run`` (both engines) alike (:data:`DEFAULT_NOISE_VERSION`).
  Version 1 stays only to go on with a stream that began with it (dpstream 0.1,
  or the library and Spark classes of 0.2, which drew it unless told):
  ``noise_version=1``, or ``dpstream run`` on a state or sidecar that records
  it. Because the version is part of the purpose, the two versions draw
  independent noise: a stream must keep its version.

The whole-array transforms (:meth:`NoiseSource.to_uniform` and siblings, and
:meth:`NoiseSource.gaussian_values` for the purpose's Gaussian) are the
definition. The draw methods compute the same values, bit for bit, with the
chunked kernel of :mod:`dpstream.noise_kernel`: a cache-sized chunk of items at
a time, without an n-long temporary per stage, optionally on several threads.

Why 128-bit item identifiers
----------------------------
If two items got the same identifier they would get the same noise at every
cell, and the difference of their released counts would be the difference of
their true counts, exactly: a complete privacy failure for both. By the
birthday bound, n items collide with probability about n^2 / 2^(b+1) for b-bit
identifiers. With b = 64 and a domain of 10^8 items (a search-query or URL
stream) that is about 3e-4, far larger than any delta a release would accept,
and an adversary who can choose items (hashtags) can search for a collision
among 2^32 candidates in minutes. With b = 128 the same domain collides with
probability about 1.5e-23.

Floating point
--------------
Values are bit-identical wherever the same NumPy/SciPy builds run. Continuous
noise added in floating point is open to the known low-order-bit attacks; the
distributions sit behind this one module so that an integer (discrete
Gaussian) mode can replace them without touching the mechanisms.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from . import compiled
from . import noise_kernel as _kernel
from .special import ndtri
from .ziggurat import normals_into, uniforms_from_words

__all__ = [
    "NoiseKey",
    "NoiseSource",
    "PreparedItems",
    "encode_item",
    "digest_chunks",
    "item_chunks",
    "canonical_item",
    "MAX_LEVEL",
    "MAX_DRAW",
    "DEFAULT_NOISE_VERSION",
    "NOISE_VERSION",
    "NOISE_VERSIONS",
    "purpose_version",
    "versioned_purpose",
]

KEY_BYTES = 32
_KEY_FILE_MAX = 4096  # the most a key file may hold (a saved key is 65 bytes)
#: Largest tree level (or first address coordinate) a tweak can hold.
MAX_LEVEL = 0xFFFF
#: Largest draw number a tweak can hold (48 bits).
MAX_DRAW = (1 << 48) - 1
_MAX_INDEX = (1 << 64) - 1
_DOMAIN = b"dpstream/noise/v1/"

#: The noise versions this dpstream can draw (see the module doc).
NOISE_VERSIONS = (1, 2)
#: The newest version: what every new stream draws.
NOISE_VERSION = 2
#: What a mechanism draws unless given ``noise_version``: the newest version.
#: Pass ``noise_version=1`` only to go on with a stream that drew version 1
#: (any stream of dpstream 0.1; one of the 0.2 library or Spark classes built
#: without ``noise_version``): another version would publish independent noise
#: for the steps it already released.
DEFAULT_NOISE_VERSION = NOISE_VERSION
#: Version 2 purposes start with this (mechanism purposes start with a stream
#: name, which holds no "/", so no version 1 purpose of theirs can).
_V2_PREFIX = "/v2/"


def check_noise_version(version: object) -> int:
    """``version`` if it is one of :data:`NOISE_VERSIONS`, else ValueError."""
    if isinstance(version, bool) or version not in NOISE_VERSIONS:
        raise ValueError(f"noise_version must be one of {NOISE_VERSIONS}, got {version!r}")
    return int(version)  # type: ignore[call-overload]


def versioned_purpose(purpose: str, version: int) -> str:
    """The purpose that draws noise of ``version`` (1: as given; 2: ``"/v2/" + purpose``)."""
    version = check_noise_version(version)
    if version == 1:
        if purpose.startswith(_V2_PREFIX):
            raise ValueError(f"a version 1 purpose cannot start with {_V2_PREFIX!r}")
        return purpose
    return purpose if purpose.startswith(_V2_PREFIX) else _V2_PREFIX + purpose


def purpose_version(purpose: str) -> int:
    """The noise version a purpose draws (2 when it starts with ``"/v2/"``, else 1)."""
    return 2 if purpose.startswith(_V2_PREFIX) else 1


def is_key_text(text: str) -> bool:
    """Whether ``text`` is what a key file holds: 64 hex digits (a key's 32 bytes), in
    either case, with whitespace anywhere (around them, spaced, or on two lines as
    ``xxd -p`` writes them). A file of it is never a domain or an output."""
    digits = "".join(text.split())
    return len(digits) == 2 * KEY_BYTES and all(c in "0123456789abcdefABCDEF" for c in digits)


class NoiseKey:
    """The secret from which every noise value of a release derives.

    Anyone holding the key can recompute the noise and subtract it, so it must
    be kept like a password: :meth:`save` writes it with mode 0600. The key is
    never printed (``repr`` shows a fingerprint only).

    The noise is a pure function of the key and an address, so one key and
    stream name used for two different data sets gives both the same noise,
    and the difference of the releases is the difference of the data. Use one
    key per stream (or distinct ``stream=`` names), and a new key for a re-run
    on corrected data.

    Example:
        >>> key = NoiseKey.generate()
        >>> len(key.fingerprint())
        16
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)):
            raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
        if len(secret) != KEY_BYTES:
            raise ValueError(f"secret must be {KEY_BYTES} bytes, got {len(secret)}")
        if len(set(secret)) == 1:  # review 121: load refused these, the constructor not
            raise ValueError(
                f"secret holds one byte value {KEY_BYTES} times (0x{secret[0]:02x}): a "
                "placeholder, not a secret (anyone can remove its noise); make a key with "
                "NoiseKey.generate() or `dpstream keygen`"
            )
        self._secret = bytes(secret)

    @classmethod
    def generate(cls) -> NoiseKey:
        """A new key from the operating system's CSPRNG (``secrets``)."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def from_bytes(cls, secret: bytes) -> NoiseKey:
        """A key from 32 bytes you already hold (from a secret store, say)."""
        return cls(secret)

    def to_bytes(self) -> bytes:
        """The raw 32 secret bytes (for a secret store; handle with care)."""
        return self._secret

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key to ``path`` (hex, one line), readable by the owner only.

        Refuses to overwrite an existing file (or a link, even to nothing), so a key in
        use is never lost; the file is synced to disk, with its folder's entry. (A kill
        while it is written leaves a short file, which ``load`` refuses in words.)
        """
        path = Path(path)
        # written, synced, and its folder synced (review 107: the ledger beside a key is
        # synced, the key was not, so a power loss soon after a first run could keep
        # the ledger and the releases and lose the key). Written under its own name:
        # a temporary name linked in place (tried first) left, when killed, a second
        # link of the secret that outlived the key file's removal (review 108)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(self._secret.hex() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, 0o600)
        with contextlib.suppress(OSError):
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NoiseKey:
        """Read a key written by :meth:`save` (64 hex characters).

        Warns (:class:`UserWarning`) when group or others may read the file:
        anyone who reads the key can remove the noise (the command line
        refuses such a file unless ``--allow-readable-key``).
        """
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a pipe is read once (there is a ledger beside the
            # key to find too), and a device such as /dev/zero never ends
            raise ValueError(
                f"key file {str(path)!r} is not a regular file (a pipe or a device): "
                "save the key in a file of mode 0600"
            )
        if mode & 0o077:
            warnings.warn(
                f"key file {str(path)!r} can be read or written by other users "
                f"(mode {mode & 0o777:04o}): run `chmod 600` on it",
                stacklevel=2,
            )
        with open(path, "rb") as fh:
            data = fh.read(_KEY_FILE_MAX + 1)  # a key file is 65 bytes: never read a
        if len(data) > _KEY_FILE_MAX:  # large file given as the key whole
            raise ValueError(
                f"key file {str(path)!r} is larger than a key file ({_KEY_FILE_MAX} bytes "
                "at most): is it the key?"
            )
        try:
            secret = bytes.fromhex(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"key file {str(path)!r} does not hold a hex key") from None
        if len(secret) != KEY_BYTES:
            raise ValueError(
                f"key file {str(path)!r} holds {len(secret)} bytes, expected {KEY_BYTES}"
            )
        try:  # review 112: 64 zeros was taken as a key (the constructor refuses it)
            return cls(secret)
        except ValueError as exc:
            raise ValueError(f"key file {str(path)!r}: {exc}") from None

    def derive(self, label: str) -> bytes:
        """A 32-byte subkey for ``label`` (HMAC-SHA256), independent across labels."""
        return hmac.new(self._secret, _DOMAIN + label.encode("utf-8"), hashlib.sha256).digest()

    def fingerprint(self) -> str:
        """A short public identifier of the key (to check a checkpoint's key)."""
        return self.derive("fingerprint").hex()[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NoiseKey):
            return NotImplemented
        return hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return f"NoiseKey(fingerprint={self.fingerprint()!r})"

    def __reduce__(self):  # pickling for Spark executors carries the secret on purpose
        return (NoiseKey, (self._secret,))


def _refuse_flag_or_duration(item: object) -> None:
    """Refuse a bool (``1 == True`` would make two items one) and a NumPy duration (a
    NumPy integer subclass: a duration, not an id), which the int rule would take."""
    if isinstance(item, (bool, np.bool_)):
        raise TypeError(f"items must be str, int or bytes, got {item!r} (bool)")
    if isinstance(item, np.timedelta64):
        raise TypeError(f"items must be str, int or bytes, got {item!r} (a duration)")


def canonical_item(item: object) -> str | int | bytes:
    """The item as the plain Python value dpstream releases it as.

    NumPy integers and strings become ``int`` and ``str`` (so a label never shows
    which representation arrived first); bools, floats and anything else are
    refused with ``TypeError``, by the same rule as :func:`encode_item`.
    """
    _refuse_flag_or_duration(item)
    if isinstance(item, str):
        return str(item)
    if isinstance(item, (int, np.integer)):
        return int(item)
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    raise TypeError(f"items must be str, int or bytes, got {type(item).__name__}: {item!r}")


def encode_item(item: object) -> bytes:
    """The canonical, type-tagged bytes of an item (what the item hash reads).

    Strings, integers and bytes are items; NumPy scalars count as their Python
    equivalents. ``True``/``False`` and floats are refused: a float item is
    almost always a parsing mistake, and ``1 == True`` would make two items
    share an identity.
    """
    if type(item) is str:  # the common case first, without the isinstance chain
        return b"s" + item.encode("utf-8", "surrogatepass")
    _refuse_flag_or_duration(item)
    if isinstance(item, str):
        return b"s" + item.encode("utf-8", "surrogatepass")
    if isinstance(item, (int, np.integer)):
        return b"i" + str(int(item)).encode("ascii")
    if isinstance(item, (bytes, bytearray)):
        return b"b" + bytes(item)
    raise TypeError(f"items must be str, int or bytes, got {type(item).__name__}: {item!r}")


#: Items hashed per join by :func:`digest_chunks`.
DIGEST_CHUNK = 1 << 16


def digest_chunks(digest: Callable[[Any], bytes], items: Iterable[Any]) -> Iterator[bytes]:
    """``digest`` of every item, joined ``DIGEST_CHUNK`` items at a time.

    The same bytes as ``b"".join(map(digest, items))`` in pieces: that join holds
    every item's digest as its own bytes object at once (~50 bytes each, plus the
    list), which for a 10^8-item domain is gigabytes that also stay resident in
    the allocator's arenas after they are freed.
    """
    it = iter(items)
    while batch := list(islice(it, DIGEST_CHUNK)):
        yield b"".join(map(digest, batch))


def item_chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """``items`` as lists of ``DIGEST_CHUNK`` items (the last shorter), read as they
    are needed: how the item hashes (ids, the domain fingerprint) walk their input."""
    it = iter(items)
    while batch := list(islice(it, DIGEST_CHUNK)):
        yield batch


class PreparedItems:
    """Items made ready for noise under one purpose: ``AES_p(item_id)`` per item.

    Holds an ``(n, 2)`` array of 64-bit words; cheap to slice with
    :meth:`subset` and to concatenate with :meth:`concat`.
    """

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray) -> None:
        words = np.ascontiguousarray(words, dtype="<u8")
        if words.ndim != 2 or words.shape[1] != 2:
            raise ValueError("prepared words must have shape (n, 2)")
        self.words = words

    def __len__(self) -> int:
        return int(self.words.shape[0])

    def subset(self, index: np.ndarray | Sequence[int] | slice) -> PreparedItems:
        return PreparedItems(self.words[index])

    @staticmethod
    def concat(parts: Sequence[PreparedItems]) -> PreparedItems:
        if not parts:
            return PreparedItems(np.zeros((0, 2), dtype="<u8"))
        return PreparedItems(np.concatenate([p.words for p in parts], axis=0))


def _tweak(level: int, index: int, draw: int) -> tuple[int, int]:
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"level must be in [0, {MAX_LEVEL}], got {level}")
    if not 0 <= index <= _MAX_INDEX:
        raise ValueError(f"index must be in [0, 2**64), got {index}")
    if not 0 <= draw <= MAX_DRAW:
        raise ValueError(f"draw must be in [0, 2**48), got {draw}")
    return (int(level) | (int(draw) << 16), int(index))


class NoiseSource:
    """Noise for one purpose under one key.

    Args:
        key: the secret.
        purpose: a name that separates uses of the key, e.g. ``"default/tree"``
            for the tree-cell noise of stream ``default``. Two releases that
            must not share noise must use different purposes (or keys).

    Every draw method takes an address and returns the same values for the
    same (key, purpose, item, cell, draw), whatever was drawn before.
    """

    def __init__(self, key: NoiseKey, purpose: str) -> None:
        if not isinstance(key, NoiseKey):
            raise TypeError(f"key must be a dpstream.NoiseKey, got {type(key).__name__}")
        if not isinstance(purpose, str) or not purpose:
            raise ValueError(f"purpose must be a non-empty string, got {purpose!r}")
        self.key = key
        self.purpose = purpose
        self._item_hash_key = key.derive("item-id")
        # Labels are prefix-free ("item-noise:" vs "scalar-noise:"), so no purpose
        # string can make the item key of one purpose equal the scalar key of another.
        # ECB contexts keep no state between blocks, so one encryptor per key serves
        # every call (creating one per call cost ~17% of a small step).
        self._item_key = key.derive("item-noise:" + purpose)
        self._cipher = Cipher(algorithms.AES(self._item_key), modes.ECB()).encryptor()
        # kernel threads each use their own encryptor (a context is not shared)
        self._local = threading.local()
        self._local.enc = self._cipher
        self._scalar_cipher = Cipher(
            algorithms.AES(key.derive("scalar-noise:" + purpose)), modes.ECB()
        ).encryptor()
        #: the noise version (1: inverse-CDF Gaussians, 2: ziggurat), from the purpose
        self.version = purpose_version(purpose)
        self._gaussian = _kernel.ZIGGURAT if self.version == 2 else "gaussian"
        self._retry_key = key.derive("gaussian-retry:" + purpose) if self.version == 2 else None

    def __reduce__(self) -> Any:
        """Refuse pickling and ``copy.deepcopy`` in words (review 112: the message was
        ``cryptography``'s, about a cipher context). A copy of a mechanism would go on
        releasing its steps apart from the original, with the same noise over other
        counts; a stream is saved with :func:`dpstream.snapshot.dump_snapshot`, which
        writes a noise source as a reference and rebuilds it from the key."""
        raise TypeError(
            f"a NoiseSource (purpose {self.purpose!r}) cannot be pickled or deep-copied: "
            "a copy of a mechanism would release its steps again with the same noise "
            "over other counts; to keep a stream for a later run use "
            "dpstream.snapshot.dump_snapshot and load it once (or `dpstream run --state`)"
        )

    # -- item identifiers -------------------------------------------------
    def item_ids(self, items: Iterable[object]) -> np.ndarray:
        """128-bit keyed identifiers of ``items`` as an ``(n, 2)`` uint64 array."""
        if isinstance(items, (list, tuple)):  # in place: no object outlives its chunk
            n = len(items)
            out = np.empty((n, 2), dtype="<u8")
            pos = 0
            for chunk in item_chunks(items):
                if pos + len(chunk) > n:
                    break
                self._ids_into(chunk, out[pos : pos + len(chunk)])
                pos += len(chunk)
            else:
                if pos == n:
                    return out
            raise ValueError("the items changed while their ids were computed")
        parts = []
        for chunk in item_chunks(items):
            parts.append(np.empty((len(chunk), 2), dtype="<u8"))
            self._ids_into(chunk, parts[-1])
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype="<u8")

    def _ids_into(self, chunk: list[object], out: np.ndarray) -> None:
        """The ids of ``chunk`` into the ``(len(chunk), 2)`` rows ``out``: in C when the
        compiled loops are on (the same digests, ~1/3 of the time), else by hashlib."""
        if compiled.item_digests_into(chunk, self._item_hash_key, encode_item, out):
            return
        # keyed BLAKE2b: a copy of a hasher that has taken the key block (the key is
        # 128 bytes of compression per item otherwise); the same digests
        keyed = hashlib.blake2b(key=self._item_hash_key, digest_size=16)

        def digest(item: object) -> bytes:
            h = keyed.copy()
            h.update(encode_item(item))
            return h.digest()

        joined = b"".join(map(digest, chunk))
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(joined, dtype=np.uint8)

    def prepare(self, items: Iterable[object]) -> PreparedItems:
        """Hash ``items`` and encrypt their identifiers once under this purpose."""
        ids = self.item_ids(items)
        return self.prepare_ids(ids)

    def prepare_ids(self, ids: np.ndarray) -> PreparedItems:
        """Like :meth:`prepare`, from identifiers already computed by :meth:`item_ids`."""
        return PreparedItems(self._encrypt(self._encryptor(), np.ascontiguousarray(ids, "<u8")))

    def item_ids_of(self, prepared: PreparedItems) -> np.ndarray:
        """The identifiers :meth:`prepare_ids` was given, from what it returned (AES
        decryption under this purpose): a mechanism that keeps the prepared ids need
        not keep the identifiers too (16 bytes an item)."""
        words = prepared.words
        if words.size == 0:
            return np.zeros(words.shape, dtype="<u8")
        dec = Cipher(algorithms.AES(self._item_key), modes.ECB()).decryptor()
        out = bytearray(words.nbytes + 15)
        n = dec.update_into(np.ascontiguousarray(words).data.cast("B"), out)
        return np.frombuffer(out, dtype="<u8", count=n // 8).reshape(words.shape).copy()

    # -- raw blocks -------------------------------------------------------
    @staticmethod
    def _encrypt(enc: Any, words: np.ndarray) -> np.ndarray:
        if words.size == 0:
            return np.zeros(words.shape, dtype="<u8")
        out = bytearray(words.nbytes + 15)
        n = enc.update_into(words.data.cast("B"), out)
        return np.frombuffer(out, dtype="<u8", count=n // 8).reshape(words.shape)

    def _encryptor(self) -> Any:
        """The calling thread's AES-ECB encryptor for item noise."""
        enc = getattr(self._local, "enc", None)
        if enc is None:
            enc = Cipher(algorithms.AES(self._item_key), modes.ECB()).encryptor()
            self._local.enc = enc
        return enc

    def _retry_encryptor(self) -> Any:
        """The calling thread's AES-ECB encryptor for the ziggurat's restarts (version 2)."""
        if self._retry_key is None:
            return None
        enc = getattr(self._local, "retry", None)
        if enc is None:
            enc = Cipher(algorithms.AES(self._retry_key), modes.ECB()).encryptor()
            self._local.retry = enc
        return enc

    def _kernel_distribution(self, distribution: str) -> str:
        return self._gaussian if distribution == "gaussian" else distribution

    def tweak_tile(self, level: int, index: int, draw: int, items: int) -> np.ndarray:
        """The checked tweak of (level, index, draw), tiled for ``items`` items (kernel input)."""
        return _kernel.tweak_tile(*_tweak(level, index, draw), min(items, _kernel.CHUNK_ITEMS))

    def noise_chunk(
        self,
        words: np.ndarray,
        tile: np.ndarray,
        distribution: str,
        scale: float,
        out: np.ndarray,
        accumulate: bool,
        ws: _kernel.Workspace,
    ) -> None:
        """Kernel entry for callers that fuse more work per chunk (the tree sums).

        ``words`` is a chunk of prepared ids (at most the tile's length and
        ``ws.size`` items); see :func:`dpstream.noise_kernel.noise_chunk`.
        """
        _kernel.noise_chunk(
            self._encryptor(),
            words,
            tile,
            self._kernel_distribution(distribution),
            scale,
            out,
            accumulate,
            ws,
            self._retry_encryptor(),
        )

    def blocks(self, prepared: PreparedItems, level: int, index: int, draw: int = 0) -> np.ndarray:
        """The pseudorandom 128-bit blocks of (item, (level, index), draw) for every item."""
        return self.blocks_many(prepared, [(level, index, draw)])[0]

    def blocks_many(
        self, prepared: PreparedItems, addresses: Sequence[tuple[int, int, int]]
    ) -> np.ndarray:
        """Blocks for several (level, index, draw) addresses: shape ``(m, n, 2)``."""
        n = len(prepared)
        tiles = [self.tweak_tile(*a, n) for a in addresses]
        if not tiles or n == 0:
            return np.zeros((len(tiles), n, 2), dtype="<u8")
        raw = bytearray(len(tiles) * n * 16 + 15)
        out = memoryview(raw)
        words = prepared.words
        bounds = _kernel.chunk_bounds(n)

        def task(first: int, stop: int) -> None:
            enc = self._encryptor()
            ws = _kernel.workspace(_kernel.CHUNK_ITEMS)
            for k in range(first, stop):
                a, b = divmod(k, len(bounds))
                lo, hi = bounds[b]
                x = ws.x[: 2 * (hi - lo)]
                np.bitwise_xor(words[lo:hi].reshape(-1), tiles[a][: x.size], out=x)
                start = (a * n + lo) * 16
                enc.update_into(x.data.cast("B"), out[start : start + x.nbytes + 15])

        _kernel.run_tasks(len(tiles) * len(bounds), task)
        return np.frombuffer(raw, dtype="<u8", count=len(tiles) * n * 2).reshape(-1, n, 2)

    def blocks_at(
        self, prepared: PreparedItems, level: int, index: int, draws: np.ndarray
    ) -> np.ndarray:
        """The block of each item at its own draw: row r is item r's block at
        (level, index, ``draws[r]``), the value :meth:`blocks` gives it there. Shape ``(n, 2)``."""
        draws = np.asarray(draws, dtype=np.uint64)
        n = len(prepared)
        if draws.shape != (n,):
            raise ValueError(f"draws must have shape ({n},), got {draws.shape}")
        _, w1 = _tweak(level, index, int(draws.max()) if n else 0)  # checks the address
        x = np.empty((n, 2), dtype="<u8")
        np.bitwise_xor(
            prepared.words[:, 0], (draws << np.uint64(16)) | np.uint64(level), out=x[:, 0]
        )
        np.bitwise_xor(prepared.words[:, 1], np.uint64(w1), out=x[:, 1])
        return self._encrypt(self._encryptor(), x)

    def scalar_blocks(self, addresses: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """Blocks for noise that belongs to no item: shape ``(m, 2)``."""
        if not addresses:
            return np.zeros((0, 2), dtype="<u8")
        tw = np.array([_tweak(*a) for a in addresses], dtype="<u8")
        return self._encrypt(self._scalar_cipher, tw)

    # -- distributions ----------------------------------------------------
    @staticmethod
    def to_uniform(blocks: np.ndarray) -> np.ndarray:
        """Uniform(0, 1) values from the first word of each block."""
        return uniforms_from_words(blocks[..., 0])

    def gaussian_values(self, blocks: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """N(0, scale^2) values of blocks drawn under this purpose, by its noise version.

        Version 1: :meth:`to_gaussian`. Version 2: the ziggurat
        (:func:`dpstream.ziggurat.normals_into`), then ``* scale``. The draw
        methods compute the same values, bit for bit.
        """
        if self.version == 1:
            return self.to_gaussian(blocks, scale)
        flat = np.ascontiguousarray(blocks, dtype="<u8").reshape(-1, 2)
        z = np.empty(flat.shape[0])
        retry = self._retry_encryptor()
        normals_into(flat, z, lambda rows: _kernel.retry_words(retry, rows))
        if scale != 1.0:
            z *= scale
        return z.reshape(blocks.shape[:-1])

    @classmethod
    def to_gaussian(cls, blocks: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """N(0, scale^2) values by noise version 1 (inverse CDF of a 53-bit uniform)."""
        z = ndtri(cls.to_uniform(blocks))
        if scale != 1.0:
            z *= scale
        return z

    @classmethod
    def to_laplace(cls, blocks: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Laplace(0, scale) values: density exp(-|x|/scale) / (2 scale)."""
        u = cls.to_uniform(blocks) - 0.5
        return -scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))

    @classmethod
    def to_gumbel(cls, blocks: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Gumbel(0, scale) values: CDF exp(-exp(-x/scale))."""
        return -scale * np.log(-np.log(cls.to_uniform(blocks)))

    # -- convenience: one address for all prepared items -------------------
    def draw_into(
        self,
        prepared: PreparedItems,
        level: int,
        index: int,
        draw: int = 0,
        *,
        distribution: str = "gaussian",
        scale: float = 1.0,
        out: np.ndarray | None = None,
        accumulate: bool = False,
    ) -> np.ndarray:
        """Noise of every prepared item at (level, index, draw), into ``out``.

        ``distribution`` is "gaussian", "laplace", "gumbel" or "uniform"
        (``scale`` is ignored for uniforms). ``out`` (float64, one value per
        item, contiguous) receives the values, or has them added with
        ``accumulate=True``; without ``out`` a new array is returned. The
        values are those of ``to_<distribution>(blocks(...), scale)`` (for
        Gaussians, ``gaussian_values``: the purpose's noise version), bit for
        bit, computed a cache-sized chunk at a time.
        """
        if distribution not in _kernel.DISTRIBUTIONS:
            raise ValueError(
                f"distribution must be one of {_kernel.DISTRIBUTIONS}, got {distribution!r}"
            )
        n = len(prepared)
        if out is None:
            out = np.zeros(n) if accumulate else np.empty(n)
        elif (
            not isinstance(out, np.ndarray)
            or out.shape != (n,)
            or out.dtype != np.float64
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(f"out must be a writeable contiguous float64 array of shape ({n},)")
        tile = self.tweak_tile(level, index, draw, n)
        words = prepared.words
        bounds = _kernel.chunk_bounds(n)
        scale = float(scale)
        kind = self._kernel_distribution(distribution)

        def task(first: int, stop: int) -> None:
            enc, retry = self._encryptor(), self._retry_encryptor()
            ws = _kernel.workspace(_kernel.CHUNK_ITEMS)
            for lo, hi in bounds[first:stop]:
                _kernel.noise_chunk(
                    enc, words[lo:hi], tile, kind, scale, out[lo:hi], accumulate, ws, retry
                )

        _kernel.run_tasks(len(bounds), task)
        return out

    def gaussian(
        self, prepared: PreparedItems, level: int, index: int, draw: int = 0, scale: float = 1.0
    ) -> np.ndarray:
        """N(0, scale^2) noise of every prepared item at (level, index, draw)."""
        return self.draw_into(prepared, level, index, draw, distribution="gaussian", scale=scale)

    def laplace(
        self, prepared: PreparedItems, level: int, index: int, draw: int = 0, scale: float = 1.0
    ) -> np.ndarray:
        """Laplace(0, scale) noise of every prepared item at (level, index, draw)."""
        return self.draw_into(prepared, level, index, draw, distribution="laplace", scale=scale)

    def gumbel(
        self, prepared: PreparedItems, level: int, index: int, draw: int = 0, scale: float = 1.0
    ) -> np.ndarray:
        """Gumbel(0, scale) noise of every prepared item at (level, index, draw)."""
        return self.draw_into(prepared, level, index, draw, distribution="gumbel", scale=scale)

    def scalar(
        self, distribution: str, level: int, index: int, draw: int = 0, scale: float = 1.0
    ) -> float:
        """One noise value that belongs to no item ("gaussian", "laplace", "gumbel")."""
        b = self.scalar_blocks([(level, index, draw)])
        conv = {
            "gaussian": self.gaussian_values,
            "laplace": self.to_laplace,
            "gumbel": self.to_gumbel,
        }.get(distribution)
        if conv is None:
            raise ValueError(
                f"distribution must be gaussian, laplace or gumbel, got {distribution!r}"
            )
        return float(conv(b, scale)[0])
