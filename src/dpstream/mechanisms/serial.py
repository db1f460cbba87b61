"""One release at a time per mechanism: a step is checked and committed under a lock.

Layer 3 of dpstream (the mechanisms); stdlib only.

A mechanism checks that a step is new (``t`` after the last released step), draws
its noise and commits the step. Two threads releasing through one mechanism at once
could both pass the check before either committed (review 112): the same step went
out twice over different counts, with noise drawn from the same keyed values, so the
two releases gave away the exact difference of the data. :func:`one_at_a_time`
makes each call a unit: the second waits, then finds the step released and is
refused as a step released twice would be.

The lock is kept beside the mechanism (a table keyed by the object, dropped with
it), not in it: a mechanism's attributes are what its snapshot holds.

For the same reason a mechanism is never copied (:class:`OneStream`): a copy made
with ``copy.copy``, ``copy.deepcopy`` or pickle went on apart from the original
(MetaHistogram released step 1 from both, with the same noise over other counts).
A stream is kept for a later run as a snapshot (``dpstream.snapshot``), which
rebuilds the mechanism in place of the one it replaces.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["OneStream", "lock_of", "one_at_a_time"]

_F = TypeVar("_F", bound=Callable[..., Any])

_locks: dict[int, threading.RLock] = {}
_guard = threading.Lock()


def lock_of(obj: object) -> threading.RLock:
    """The lock a mechanism's releases take (reentrant): held, no release of ``obj``
    runs (a snapshot is written under it, so it never holds half a step)."""
    key = id(obj)
    lock = _locks.get(key)
    if lock is None:
        with _guard:
            lock = _locks.get(key)
            if lock is None:
                # dropped when the object goes, before its id can be another's; set up
                # first, so that an object without weak references (TypeError) leaves
                # no lock behind under its id (review 123: None's, then shared)
                weakref.finalize(obj, _locks.pop, key, None)
                lock = _locks[key] = threading.RLock()
    return lock


def one_at_a_time(method: _F) -> _F:
    """``method`` (a release: ``step``, ``step_batch``, ``release``) run by one thread
    at a time on one mechanism (reentrant: a release may call another)."""

    @functools.wraps(method)
    def serial(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock_of(self):
            return method(self, *args, **kwargs)

    return serial  # type: ignore[return-value]


class OneStream:
    """A mixin refusing copies of a mechanism: one mechanism object is one stream.

    A copy (``copy.copy``, ``copy.deepcopy``, pickle) would release the stream's next
    steps a second time, apart from the original, with noise from the same keyed
    values: the two releases of a step give away the exact difference of their
    counts. The snapshot format does not use these hooks (it saves attributes and
    rebuilds the object from its class), so ``--state`` is unchanged."""

    def _refuse_copy(self) -> TypeError:
        return TypeError(
            f"a {type(self).__name__} cannot be copied or pickled: a copy would release "
            "the stream's steps again with the same noise over other counts; to keep a "
            "stream for a later run use dpstream.snapshot.dump_snapshot and load it once "
            "(two loads are two copies; `dpstream run --state` keeps that rule)"
        )

    def __copy__(self) -> Any:
        raise self._refuse_copy()

    def __deepcopy__(self, memo: Any) -> Any:
        raise self._refuse_copy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._refuse_copy()
