"""Snapshots of a running mechanism, so that a stream can go on in a later run.

Layer 6 of dpstream (an edge, used by ``dpstream run --state``). A snapshot is
the mechanism's state after a step: its true counts, its noise state, its
selections. It is what lets a daily run continue yesterday's stream without
re-reading yesterday's input, and lets a crashed run restart from its last
snapshot instead of from step 1.

What is in it, and what is not
------------------------------
The mechanism is serialised with :mod:`pickle`, except the secret: the
:class:`~dpstream.NoiseKey` and every :class:`~dpstream.noise.NoiseSource`
(which holds keys derived from it) are written as references (a purpose name)
and rebuilt from the key the loading run holds. So a snapshot never contains
the key. It does contain true counts and noise values: it is as private as
the input, like the state file that holds it (mode 0600).

A snapshot is authenticated with an HMAC-SHA256 under a subkey of the noise
key and is only unpickled after that check passes, so a state file written by
someone without the key is refused before any of it is interpreted; classes
are only looked up in dpstream, NumPy and the standard containers. A snapshot
is tied to the dpstream version that wrote it (its classes): another version
refuses it with a clear message.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
from typing import Any

from . import __version__
from .errors import StateError
from .noise import NoiseKey, NoiseSource

__all__ = ["dump_snapshot", "load_snapshot"]

_MAGIC = b"dpstream-snapshot/1\0"
_ALLOWED_MODULES = ("dpstream", "numpy", "builtins", "collections", "copyreg", "_codecs",
                    "datetime", "functools")


def _mac_key(key: NoiseKey) -> bytes:
    return key.derive("snapshot/v1")


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, NoiseKey):
            return ("key",)
        if isinstance(obj, NoiseSource):
            return ("source", obj.purpose)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, key: NoiseKey) -> None:
        super().__init__(io.BytesIO(data))
        self._key = key

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("key",):
            return self._key
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "source":
            return NoiseSource(self._key, pid[1])
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in _ALLOWED_MODULES:
            raise pickle.UnpicklingError(f"a snapshot may not refer to {module}.{name}")
        return super().find_class(module, name)


def dump_snapshot(mechanism: Any, key: NoiseKey, context: bytes = b"") -> bytes:
    """The mechanism's state as authenticated bytes, without the key.

    ``context`` is bound into the authentication (the run's parameters, its
    random id and the step): a snapshot is only ever loaded by the run and at
    the step it was written for, never copied into another stream's state.

    Raises:
        TypeError: the mechanism holds something that cannot be saved (for
            example a Python function given as a parameter).
    """
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(mechanism)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(f"this mechanism cannot be saved for a later run: {exc}") from None
    body = __version__.encode() + b"\0" + buf.getvalue()
    mac = hmac.new(_mac_key(key), _MAGIC + _framed(context) + body, hashlib.sha256).digest()
    return _MAGIC + mac + body


def _framed(context: bytes) -> bytes:
    return len(context).to_bytes(8, "big") + context


def load_snapshot(blob: bytes, key: NoiseKey, context: bytes = b"") -> Any:
    """The mechanism saved by :func:`dump_snapshot` with the same key and dpstream version.

    Raises:
        StateError: the snapshot was not written under this key, was changed,
            or was written by another version of dpstream.
    """
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 32:
        raise StateError("the state's snapshot is not a dpstream snapshot")
    mac, body = blob[len(_MAGIC):len(_MAGIC) + 32], blob[len(_MAGIC) + 32:]
    expected = hmac.new(_mac_key(key), _MAGIC + _framed(context) + body,
                        hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise StateError("the state's snapshot was not written for this run (another key, "
                         "another stream's state, another step) or was changed since: "
                         "refusing to load it")
    version, _, data = body.partition(b"\0")
    if version.decode() != __version__:
        raise StateError(f"the state's snapshot was written by dpstream {version.decode()}, "
                         f"this is {__version__}: go on with the version that wrote it")
    return _Unpickler(data, key).load()
