"""Snapshots of a running mechanism, so that a stream can go on in a later run.

Layer 6 of dpstream (an edge, used by ``dpstream run --state``). A snapshot is
the mechanism's state after a step: its true counts, its noise state, its
selections. It is what lets a daily run continue yesterday's stream without
re-reading yesterday's input, and lets a crashed run restart from its last
snapshot instead of from step 1.

The format (``dpstream-snapshot/2``)
------------------------------------
A snapshot is data, never code: loading one can only build the types listed
here, so even a snapshot written with the key cannot make a run do anything
but hold other counts. It is::

    magic "dpstream-snapshot/2\\0" | HMAC-SHA256 (32 bytes) | body
    body = dpstream version "\\0" | header length (8 bytes, big-endian) | header | arrays

The header is JSON: ``{"arrays": [[dtype, shape, offset, nbytes], ...],
"root": node}``. A node is a JSON ``null``, ``true``/``false``, integer, finite
float or string, or an object tagged by its ``"$"`` key: a list, tuple, dict
(keys are nodes, so typed), set, frozenset or ``collections.Counter``; bytes
(base64); a non-finite float; a NumPy scalar (dtype-tagged); a NumPy array (its
raw bytes in the arrays part: booleans, integers, floats, complex or fixed-width
strings, never objects, never records); a reference to the key or to a noise
source; an object of a class in :data:`REGISTRY` (a stable name -> a dpstream
class), rebuilt with ``cls.__new__(cls)`` and its saved attributes (through the
class's ``__setstate__`` when it has one); or a reference to an object, list,
dict, set or array seen before (shared objects stay shared). Anything else is
refused when the snapshot is written (:class:`TypeError`: the run then logs
that the next run must read the whole stream again), and a header naming
anything else is refused when it is loaded (:class:`~dpstream.StateError`).

What is in it, and what is not
------------------------------
The secret is not: the :class:`~dpstream.NoiseKey` and every
:class:`~dpstream.noise.NoiseSource` (which holds keys derived from it) are
written as references (a purpose name) and rebuilt from the key the loading
run holds. So a snapshot never contains the key. It does contain true counts
and noise values: it is as private as the input, like the state file that
holds it (mode 0600).

A snapshot is authenticated with an HMAC-SHA256 under a subkey of the noise
key, bound to the run's context (its parameters, random id and step), and is
only parsed after that check passes, so a state file written by someone
without the key is refused before any of it is read. A snapshot is tied to the
dpstream version that wrote it (its classes): another version refuses it with a
clear message, and so does this version for a snapshot of the first format
(pickle, written by dpstream 0.3.0.dev0 and earlier), which it does not read
because unpickling can run code.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections import Counter
from typing import Any

import numpy as np

from ._version import __version__
from .bounding import BoundingStats, ContributionBounder, UnitBound, UserBounds, UserHasher
from .errors import StateError
from .factorization import BLTStrategy
from .mechanisms.base import EventLimit, TruncationStats
from .mechanisms.blt_noise import BLTNoise
from .mechanisms.histogram_topk import HistogramTopK
from .mechanisms.item_table import ItemTable, TableItems
from .mechanisms.known import BLTCounter, KnownDomainHistogram, TreeCounter
from .mechanisms.meta import MetaHistogram
from .mechanisms.topk import ContinualTopK
from .mechanisms.tree_noise import TreeNoise, _Segment
from .mechanisms.unknown import PrivacySplit, UnknownDomainHistogram
from .mechanisms.user_bounder import ColumnBounder
from .mechanisms.users import UserLevel
from .noise import NoiseKey, NoiseSource, PreparedItems
from .postprocess import ReadableCounts
from .privacy import Budget, PrivacyGuarantee

__all__ = ["REGISTRY", "dump_snapshot", "load_snapshot"]

_MAGIC = b"dpstream-snapshot/2\0"
#: The first format (a pickle), refused: reading it could run code.
_PICKLE_MAGIC = b"dpstream-snapshot/1\0"
_MAC_LEN = 32
#: Array element kinds a snapshot may hold: bool, int, uint, float, complex, bytes, str.
_ARRAY_KINDS = frozenset("biufcSU")
#: NumPy scalar kinds a snapshot may hold (their values are JSON numbers).
_SCALAR_KINDS = frozenset("biuf")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


#: The classes a snapshot may hold, by a stable name (the name is what the header
#: says; a class may move or be renamed without changing it). Every type that
#: ``dpstream run --state`` saves: the mechanisms of ``--mechanism`` with their
#: noise, item tables, user-level bounds, and the readable-counts publisher.
REGISTRY: dict[str, type[object]] = {
    "KnownDomainHistogram": KnownDomainHistogram,
    "UnknownDomainHistogram": UnknownDomainHistogram,
    "ContinualTopK": ContinualTopK,
    "HistogramTopK": HistogramTopK,
    "MetaHistogram": MetaHistogram,
    "TreeCounter": TreeCounter,
    "BLTCounter": BLTCounter,
    "TreeNoise": TreeNoise,
    "TreeNoise.Segment": _Segment,
    "BLTNoise": BLTNoise,
    "BLTStrategy": BLTStrategy,
    "PreparedItems": PreparedItems,
    "ItemTable": ItemTable,
    "TableItems": TableItems,
    "EventLimit": EventLimit,
    "TruncationStats": TruncationStats,
    "PrivacySplit": PrivacySplit,
    "UserLevel": UserLevel,
    "UserBounds": UserBounds,
    "UnitBound": UnitBound,
    "UserHasher": UserHasher,
    "ContributionBounder": ContributionBounder,
    "ColumnBounder": ColumnBounder,
    "BoundingStats": BoundingStats,
    "ReadableCounts": ReadableCounts,
    "Budget": Budget,
    "PrivacyGuarantee": PrivacyGuarantee,
}
_NAMES = {cls: name for name, cls in REGISTRY.items()}


def _mac_key(key: NoiseKey) -> bytes:
    return key.derive("snapshot/v1")


def _framed(context: bytes) -> bytes:
    return len(context).to_bytes(8, "big") + context


def _mac(key: NoiseKey, context: bytes, body: Any) -> bytes:
    """HMAC-SHA256 of magic, framed context and body (fed in parts: no copy of the body)."""
    mac = hmac.new(_mac_key(key), _MAGIC + _framed(context), hashlib.sha256)
    mac.update(body)
    return mac.digest()


# -- writing -----------------------------------------------------------------------------


def _slot_names(cls: type) -> list[str]:
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


class _Encoder:
    """Walks an object into a JSON tree and a list of arrays."""

    def __init__(self) -> None:
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
            return {"$": "source", "v": obj.purpose}
        if isinstance(obj, NoiseKey):
            if t is not NoiseKey:
                raise TypeError(f"{t.__name__} (a subclass of NoiseKey) cannot be saved")
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

    Raises:
        TypeError: the mechanism holds something that cannot be saved (for
            example a Python function given as a parameter, or a class not in
            :data:`REGISTRY`).
    """
    enc = _Encoder()
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


# -- reading -----------------------------------------------------------------------------


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
