"""The snapshot's framing: its magic, its authentication, and what its nodes may hold.

Layer 6 of dpstream (an edge; the format is described in :mod:`dpstream.snapshot`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..noise import NoiseKey

_MAGIC = b"dpstream-snapshot/2\0"
#: The first format (a pickle), refused: reading it could run code.
_PICKLE_MAGIC = b"dpstream-snapshot/1\0"
_MAC_LEN = 32
#: Array element kinds a snapshot may hold: bool, int, uint, float, complex, bytes, str.
_ARRAY_KINDS = frozenset("biufcSU")
#: NumPy scalar kinds a snapshot may hold (their values are JSON numbers).
_SCALAR_KINDS = frozenset("biuf")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _mac_key(key: NoiseKey) -> bytes:
    return key.derive("snapshot/v1")


def _framed(context: bytes) -> bytes:
    return len(context).to_bytes(8, "big") + context


def _mac(key: NoiseKey, context: bytes, body: Any) -> bytes:
    """HMAC-SHA256 of magic, framed context and body (fed in parts: no copy of the body)."""
    mac = hmac.new(_mac_key(key), _MAGIC + _framed(context), hashlib.sha256)
    mac.update(body)
    return mac.digest()


def _slot_names(cls: type) -> list[str]:
    """The slots of ``cls`` and its bases, in order (without ``__dict__`` and ``__weakref__``)."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


def _custom(cls: type, method: str) -> bool:
    """Whether ``cls`` defines ``method`` itself (not object's default)."""
    return getattr(cls, method, None) is not getattr(object, method, None)
