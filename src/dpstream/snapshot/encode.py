"""Writing a snapshot: an object walked into a JSON header and raw arrays, authenticated.

Layer 6 of dpstream (an edge; the format is described in :mod:`dpstream.snapshot`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import math
from collections import Counter
from typing import Any

import numpy as np

from .._version import __version__
from ..mechanisms.serial import lock_of
from ..noise import NoiseKey, NoiseSource
from .format import _ARRAY_KINDS, _MAGIC, _SCALAR_KINDS, _custom, _framed, _mac_key, _slot_names
from .registry import _NAMES

__all__ = ["dump_snapshot"]


class _Encoder:
    """Walks an object into a JSON tree and a list of arrays."""

    def __init__(self, key: NoiseKey) -> None:
        self.key = key  # every key the object holds must be this one (review 121)
        self.arrays: list[np.ndarray] = []
        self._memo: dict[int, int] = {}
        self._keep: list[Any] = []  # memoised objects stay alive (their ids stay unique)

    def _seen(self, obj: Any) -> tuple[int, bool]:
        """(id of obj in the snapshot, whether it was seen before)."""
        ref = self._memo.get(id(obj))
        if ref is not None:
            return ref, True
        ref = self._memo[id(obj)] = len(self._memo)
        self._keep.append(obj)
        return ref, False

    def node(self, obj: Any) -> Any:
        t = type(obj)
        if obj is None or t is bool or t is int or t is str:
            return obj
        if t is float:
            if math.isfinite(obj):
                return obj
            return {"$": "float", "v": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
        if t is tuple:
            return {"$": "tuple", "v": [self.node(x) for x in obj]}
        if t is bytes:
            return {"$": "bytes", "v": base64.b64encode(obj).decode("ascii")}
        if isinstance(obj, np.generic):
            return self._scalar(obj)
        if isinstance(obj, NoiseSource):
            self._same_key(obj.key)
            return {"$": "source", "v": obj.purpose}
        if isinstance(obj, NoiseKey):
            if t is not NoiseKey:
                raise TypeError(f"{t.__name__} (a subclass of NoiseKey) cannot be saved")
            self._same_key(obj)
            return {"$": "key"}
        ref, seen = self._seen(obj)
        if seen:
            return {"$": "ref", "id": ref}
        if t is list:
            return {"$": "list", "id": ref, "v": [self.node(x) for x in obj]}
        if t is dict or t is Counter:
            return {
                "$": "dict" if t is dict else "counter",
                "id": ref,
                "k": [self.node(k) for k in obj],
                "v": [self.node(v) for v in obj.values()],
            }
        if t is set or t is frozenset:
            return {"$": t.__name__, "id": ref, "v": [self.node(x) for x in obj]}
        if t is np.ndarray:
            return {"$": "array", "id": ref, "v": self._array(obj)}
        name = _NAMES.get(t)
        if name is None:
            raise TypeError(f"a snapshot cannot hold a {t.__module__}.{t.__qualname__}")
        return {"$": "obj", "id": ref, "cls": name, **self._state(obj)}

    def _same_key(self, held: NoiseKey) -> None:
        """Refuse a key of the object's that is not the snapshot's: the snapshot holds no
        key, and is loaded under the one it was written with, so the mechanism would go
        on under that key (review 121: its users' bounds forgotten, as its hashes of user
        ids change, and the noise of tree cells already released drawn again)."""
        if held != self.key:
            raise ValueError(
                f"the mechanism runs on the key {held.fingerprint()}, not on the key "
                f"{self.key.fingerprint()} given to dump_snapshot: loaded under that key "
                "it would draw new noise for steps it has released and forget its users' "
                "bounds; write the snapshot with the mechanism's own key"
            )

    def _scalar(self, obj: np.generic) -> Any:
        dtype = obj.dtype
        if dtype.kind not in _SCALAR_KINDS:
            raise TypeError(f"a snapshot cannot hold a NumPy scalar of type {dtype}")
        return {"$": "np", "dtype": dtype.str, "v": self.node(obj.item())}

    def _array(self, arr: np.ndarray) -> int:
        dtype = arr.dtype
        if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.hasobject:
            raise TypeError(f"a snapshot cannot hold an array of type {dtype}")
        self.arrays.append(arr)
        return len(self.arrays) - 1

    def _state(self, obj: Any) -> dict[str, Any]:
        cls = type(obj)
        if _custom(cls, "__reduce__") and not _custom(cls, "__getstate__"):
            # a class that rebuilds itself from constructor arguments (UserHasher: from
            # the key, never its derived hash key)
            made = obj.__reduce__()
            if not (isinstance(made, tuple) and len(made) == 2 and made[0] is cls):
                raise TypeError(
                    f"a snapshot cannot hold a {cls.__qualname__} "
                    "(it does not rebuild from its own class)"
                )
            return {"args": self.node(tuple(made[1]))}
        if _custom(cls, "__getstate__"):  # ItemTable: its bytes and offsets, not its slots
            return {"state": self.node(obj.__getstate__())}
        out: dict[str, Any] = {}
        attrs = getattr(obj, "__dict__", None)
        if attrs is not None:
            out["dict"] = {
                "$": "dict",
                "k": list(attrs),
                "v": [self.node(v) for v in attrs.values()],
            }
        slots = {name: getattr(obj, name) for name in _slot_names(cls) if hasattr(obj, name)}
        if slots:
            out["slots"] = {
                "$": "dict",
                "k": list(slots),
                "v": [self.node(v) for v in slots.values()],
            }
        return out


def dump_snapshot(mechanism: Any, key: NoiseKey, context: bytes = b"") -> bytes:
    """The mechanism's state as authenticated bytes, without the key.

    ``context`` is bound into the authentication (the run's parameters, its
    random id and the step): a snapshot is only ever loaded by the run and at
    the step it was written for, never copied into another stream's state.

    It is written under the lock the mechanism's releases take, so a release in
    another thread never leaves it half a step ahead.

    Raises:
        TypeError: the mechanism holds something that cannot be saved (for
            example a Python function given as a parameter, or a class not in
            :data:`REGISTRY`).
        ValueError: the mechanism holds another key than ``key``.
    """
    # under the lock its releases take: a step released by another thread meanwhile
    # would leave some of its arrays a step ahead of the rest (review 121: a snapshot
    # that passed its check, 69-82% of its items' noise state a step ahead)
    parts = mechanism if type(mechanism) is tuple else (mechanism,)  # (the run saves
    with contextlib.ExitStack() as held:  # its mechanism with its post-processing)
        for part in parts:
            with contextlib.suppress(TypeError):  # a plain value: no release to wait for
                held.enter_context(lock_of(part))
        return _dump(mechanism, key, context)


def _dump(mechanism: Any, key: NoiseKey, context: bytes) -> bytes:
    enc = _Encoder(key)
    try:
        root = enc.node(mechanism)
    except (TypeError, AttributeError, RecursionError) as exc:
        raise TypeError(f"this mechanism cannot be saved for a later run: {exc}") from None
    table: list[list[Any]] = []
    parts: list[memoryview] = []
    offset = 0
    for arr in enc.arrays:
        # the array's own bytes (a copy only when it is not contiguous): copied once, below
        data = np.ascontiguousarray(arr).reshape(-1).data.cast("B")
        table.append([arr.dtype.str, list(arr.shape), offset, data.nbytes])
        parts.append(data)
        offset += data.nbytes
    header = json.dumps(
        {"arrays": table, "root": root}, allow_nan=False, separators=(",", ":")
    ).encode("ascii")
    body: list[bytes | memoryview] = [
        __version__.encode(),
        b"\0",
        len(header).to_bytes(8, "big"),
        header,
        *parts,
    ]
    mac = hmac.new(_mac_key(key), _MAGIC + _framed(context), hashlib.sha256)
    for part in body:
        mac.update(part)
    return b"".join([_MAGIC, mac.digest(), *body])
