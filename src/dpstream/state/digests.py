"""Keyed digests of the state file, its canonical JSON, and the private-file check.

Layer 6 of dpstream (the edges; :mod:`dpstream.state` says what the state holds and
why). Every digest the state stores is an HMAC-SHA256 under a subkey of the noise
key, so a reader without the key cannot test guesses of the input against it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..noise import NoiseKey

__all__ = ["StateDigests", "canonical_json", "check_private_file", "sha256_hex"]


def check_private_file(path: str, what: str, *, flag: str | None = None) -> None:
    """Refuse (:class:`PermissionError`) a file that group or others may read or write.

    ``what`` names the file in the message ("state file", "key file");
    ``flag`` is the command-line option that overrides the check, if any.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        override = f", or pass {flag} to use it anyway" if flag else ""
        raise PermissionError(
            f"{what} {path!r} can be read or written by other users (mode "
            f"{stat.S_IMODE(mode):04o}); it is as secret as the data: run `chmod 600 {path}`"
            f"{override}"
        )


class StateDigests:
    """Keyed digests (HMAC-SHA256 under a subkey of the noise key) for the state file.

    Without the key, a digest of a step's input cannot be matched against
    guesses of that input; with it, a resumed run proves its input unchanged.
    """

    #: the last whole file digested: (its path, device, inode, size, mtime), digest
    _last_file: tuple[tuple[str, int, int, int, int], str] | None

    def file(self, path: str) -> str:
        """The digest of a whole input file's bytes (to refuse an input fed twice); a
        run asks more than once, so the last one is kept for the same file unchanged
        (its device, inode, size and modification time)."""
        st = os.stat(path)
        ident = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._last_file is not None and self._last_file[0] == ident:
            return self._last_file[1]
        h = hmac.new(self._key, b"file\0", hashlib.sha256)
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        self._last_file = (ident, digest)
        return digest

    def files(self, root: str, paths: list[str]) -> str:
        """The digest of a directory input's files (a Parquet data lake): each file's path
        under ``root`` and its bytes, in the order given (to refuse an input fed twice)."""
        h = hmac.new(self._key, b"files\0", hashlib.sha256)
        for path in paths:
            name = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
            h.update(len(name).to_bytes(8, "big") + name + os.path.getsize(path).to_bytes(8, "big"))
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        return h.hexdigest()

    def __init__(self, key: NoiseKey) -> None:
        self._key = key.derive("state-digest/v2")
        self._last_file = None

    def mask(self, t: int) -> int:
        """A keyed 62-bit mask for step t: a position stored XOR this reveals nothing."""
        digest = hmac.new(self._key, b"mask\0" + t.to_bytes(16, "big"), hashlib.sha256)
        return int.from_bytes(digest.digest()[:8], "big") >> 2

    def release(self, data: bytes) -> str:
        """The digest of a release's bytes."""
        return hmac.new(self._key, b"release\0" + data, hashlib.sha256).hexdigest()

    def step_input(self, t: int, lines: Any, lengths: Any, raw: bytes | Iterable[bytes]) -> str:
        """The digest of step t's input records as read: their line numbers, their
        byte lengths (int64 arrays) and their raw bytes joined by line feeds (each
        record's line or lines without the terminator), as bytes or as pieces that
        make them up in order (a large step is read a block at a time). The lengths
        make the encoding unambiguous; nothing is parsed or re-encoded. t is bound
        in, so equal digests do not tell which steps had the same input (e.g. none)."""
        import numpy as np

        h = hmac.new(self._key, b"input/v3\0" + t.to_bytes(16, "big"), hashlib.sha256)
        lines = np.ascontiguousarray(lines, dtype="<i8")
        h.update(len(lines).to_bytes(8, "big"))
        h.update(lines.tobytes())
        h.update(np.ascontiguousarray(lengths, dtype="<i8").tobytes())
        for piece in (raw,) if isinstance(raw, bytes | bytearray | memoryview) else raw:
            h.update(piece)
        return h.hexdigest()

    def records(self, parts: Iterable[bytes], t: int = 0) -> str:
        """The digest of step t's input records, each given as bytes (t is bound in, so
        equal digests do not tell which steps had the same input, e.g. none)."""
        h = hmac.new(self._key, b"input\0" + t.to_bytes(16, "big"), hashlib.sha256)
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces: equal parameters give equal text."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
