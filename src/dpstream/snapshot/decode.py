"""Reading a snapshot: checked first, then built from its header, and nothing else.

Layer 6 of dpstream (an edge; the format is described in :mod:`dpstream.snapshot`).
"""

from __future__ import annotations

import base64
import hmac
import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..errors import StateError
from ..noise import NoiseSource
from .format import (
    _ARRAY_KINDS,
    _MAC_LEN,
    _MAGIC,
    _NONFINITE,
    _PICKLE_MAGIC,
    _SCALAR_KINDS,
    _custom,
    _mac,
    _slot_names,
)
from .registry import REGISTRY

if TYPE_CHECKING:
    from ..noise import NoiseKey

__all__ = ["load_snapshot"]


class _Unreadable(Exception):  # noqa: N818 (private, caught here)
    """A header that does not describe a snapshot this version writes."""


class _Decoder:
    """Builds the objects a header describes, and nothing else."""

    def __init__(self, arrays: list[np.ndarray], key: NoiseKey) -> None:
        self._arrays = arrays
        self._key = key
        self._memo: dict[int, Any] = {}
        self._strs: dict[str, str] = {}  # equal strings share one object, as when written

    def node(self, n: Any) -> Any:
        t = type(n)
        if t is str:
            return self._strs.setdefault(n, n)
        if n is None or t is bool or t is int or t is float:
            return n
        if t is not dict:
            raise _Unreadable(f"unexpected {t.__name__} in the header")
        tag = n.get("$")
        if tag == "tuple":
            return tuple(self._items(n))
        if tag == "float":
            if n.get("v") not in _NONFINITE:
                raise _Unreadable("a float that is not nan or +-inf")
            return _NONFINITE[n["v"]]
        if tag == "bytes":
            return base64.b64decode(_typed(n, "v", str), validate=True)
        if tag == "np":
            dtype = _dtype(_typed(n, "dtype", str), _SCALAR_KINDS)
            value = self.node(n.get("v"))
            if type(value) not in (bool, int, float):
                raise _Unreadable("a NumPy scalar that is not a number")
            return dtype.type(value)
        if tag == "key":
            return self._key
        if tag == "source":
            return NoiseSource(self._key, _typed(n, "v", str))
        if tag == "ref":
            ref = _typed(n, "id", int)
            if ref not in self._memo:
                raise _Unreadable("a reference to nothing")
            return self._memo[ref]
        ref = _typed(n, "id", int)
        if ref in self._memo:
            raise _Unreadable("an id given twice")
        if tag == "list":
            out: Any = []
            self._memo[ref] = out
            out.extend(self._items(n))
            return out
        if tag in ("dict", "counter"):
            out = self._memo[ref] = {} if tag == "dict" else Counter()
            dict.update(out, self._pairs(n))  # (Counter.update would count the pairs)
            return out
        if tag in ("set", "frozenset"):
            items = self._items(n)
            out = self._memo[ref] = set(items) if tag == "set" else frozenset(items)
            return out
        if tag == "array":
            index = _typed(n, "v", int)
            if not 0 <= index < len(self._arrays):
                raise _Unreadable("a reference to a missing array")
            out = self._memo[ref] = self._arrays[index]
            return out
        if tag == "obj":
            return self._object(n, ref)
        raise _Unreadable(f"unknown node type {tag!r}")

    def _items(self, n: dict[str, Any]) -> list[Any]:
        return [self.node(x) for x in _typed(n, "v", list)]

    def _pairs(self, n: dict[str, Any]) -> zip[tuple[Any, Any]]:
        keys, values = _typed(n, "k", list), _typed(n, "v", list)
        if len(keys) != len(values):
            raise _Unreadable("a dict whose keys and values differ in number")
        return zip([self.node(k) for k in keys], [self.node(v) for v in values], strict=True)

    def _object(self, n: dict[str, Any], ref: int) -> Any:
        name = _typed(n, "cls", str)
        cls = REGISTRY.get(name)
        if cls is None:
            raise _Unreadable(f"a snapshot may not hold {name!r} (not a dpstream state class)")
        obj: Any  # an instance of cls: which methods it has is checked below (_custom)
        if "args" in n:
            if not _custom(cls, "__reduce__"):
                raise _Unreadable(f"{name} is not built from arguments")
            args = self.node(n["args"])
            if type(args) is not tuple:
                raise _Unreadable("constructor arguments that are not a tuple")
            obj = self._memo[ref] = cls(*args)
            return obj
        obj = self._memo[ref] = cls.__new__(cls)
        if "state" in n:
            if not _custom(cls, "__setstate__"):
                raise _Unreadable(f"{name} takes no custom state")
            obj.__setstate__(self.node(n["state"]))
            return obj
        slots = _slot_names(cls)
        for attr, value in self._attrs(n, "slots"):
            if attr not in slots:
                raise _Unreadable(f"{name} has no slot {attr!r}")
            object.__setattr__(obj, attr, value)
        if "dict" in n:
            if not hasattr(obj, "__dict__"):
                raise _Unreadable(f"{name} has no attribute dict")
            attrs = dict(self._attrs(n, "dict"))
            if _custom(cls, "__setstate__"):
                obj.__setstate__(attrs)
            else:
                obj.__dict__.update(attrs)
        return obj

    def _attrs(self, n: dict[str, Any], field: str) -> list[tuple[str, Any]]:
        if field not in n:
            return []
        part = n[field]
        if type(part) is not dict or part.get("$") != "dict":
            raise _Unreadable(f"object {field} that are not a dict")
        names, values = _typed(part, "k", list), _typed(part, "v", list)
        if len(names) != len(values) or any(type(a) is not str for a in names):
            raise _Unreadable("attribute names that are not strings")
        return list(zip(names, [self.node(v) for v in values], strict=True))


def _typed(n: dict[str, Any], field: str, kind: type) -> Any:
    value = n.get(field)
    if type(value) is not kind:
        raise _Unreadable(f"field {field!r} is not a {kind.__name__}")
    return value


def _dtype(text: str, kinds: frozenset[str]) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise _Unreadable(f"unknown dtype {text!r}") from None
    if dtype.kind not in kinds or dtype.fields is not None or dtype.hasobject:
        raise _Unreadable(f"dtype {text!r} is not allowed")
    return dtype


def _read_arrays(table: Any, data: memoryview) -> list[np.ndarray]:
    if type(table) is not list:
        raise _Unreadable("no array table")
    arrays = []
    for entry in table:
        if not (
            type(entry) is list
            and len(entry) == 4
            and type(entry[0]) is str
            and type(entry[1]) is list
            and all(type(d) is int and d >= 0 for d in entry[1])
            and type(entry[2]) is int
            and type(entry[3]) is int
        ):
            raise _Unreadable("a malformed array entry")
        dtype = _dtype(entry[0], _ARRAY_KINDS)
        shape, offset, nbytes = tuple(entry[1]), entry[2], entry[3]
        if offset < 0 or offset + nbytes > len(data) or nbytes != math.prod(shape) * dtype.itemsize:
            raise _Unreadable("an array that does not fit its bytes")
        arrays.append(
            np.frombuffer(data[offset : offset + nbytes], dtype=dtype).reshape(shape).copy()
        )
    return arrays


def load_snapshot(blob: bytes, key: NoiseKey, context: bytes = b"") -> Any:
    """The mechanism saved by :func:`dump_snapshot` with the same key and dpstream version.

    Builds nothing but the types the module docstring lists.

    Raises:
        StateError: the snapshot was not written under this key, was changed,
            was written by another version of dpstream or in the first
            (pickle) format, or describes something a snapshot cannot hold.
    """
    if blob.startswith(_PICKLE_MAGIC):
        raise StateError(
            "the state's snapshot was written in an older format (pickle, "
            "dpstream 0.3.0.dev0 and before) that this version does not read: "
            "finish the stream with the version that wrote it, or start it again "
            "with a new --state file"
        )
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + _MAC_LEN:
        raise StateError("the state's snapshot is not a dpstream snapshot")
    view = memoryview(blob)
    mac, body = view[len(_MAGIC) : len(_MAGIC) + _MAC_LEN], view[len(_MAGIC) + _MAC_LEN :]
    if not hmac.compare_digest(bytes(mac), _mac(key, context, body)):
        raise StateError(
            "the state's snapshot was not written for this run (another key, "
            "another stream's state, another step) or was changed since: "
            "refusing to load it"
        )
    end = bytes(body[:64]).find(b"\0")
    version = bytes(body[: end if end >= 0 else 64]).decode(errors="replace")
    if end < 0 or version != __version__:
        raise StateError(
            f"the state's snapshot was written by dpstream {version}, this is "
            f"{__version__}: go on with the version that wrote it"
        )
    rest = body[end + 1 :]
    try:
        size = int.from_bytes(rest[:8], "big")
        if len(rest) < 8 + size:
            raise _Unreadable("a header longer than the snapshot")
        header = json.loads(bytes(rest[8 : 8 + size]).decode("ascii"))
        if type(header) is not dict:
            raise _Unreadable("a header that is not an object")
        arrays = _read_arrays(header.get("arrays"), rest[8 + size :])
        return _Decoder(arrays, key).node(header.get("root"))
    except (
        _Unreadable,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        OverflowError,
        AttributeError,
        RecursionError,
    ) as exc:
        why = str(exc) if isinstance(exc, _Unreadable) else f"{type(exc).__name__}: {exc}"
        raise StateError(
            f"the state's snapshot cannot be read ({why}): refusing to load it"
        ) from None
