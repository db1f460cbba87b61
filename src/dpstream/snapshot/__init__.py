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

The package: :mod:`.format` (the framing and its authentication), :mod:`.registry`
(the classes a snapshot may hold), :mod:`.encode` (writing) and :mod:`.decode`
(reading, which builds nothing else).
"""

from __future__ import annotations

from .decode import load_snapshot
from .encode import dump_snapshot
from .registry import REGISTRY

__all__ = ["REGISTRY", "dump_snapshot", "load_snapshot"]
