"""Keyed truncation: which ``max_items`` items of an over-large event are kept.

``on_invalid="truncate"`` (and ``dpstream run --on-invalid truncate``) cut an
event over Delta0 = ``max_items`` distinct items down to Delta0 of them. The cut
must be a *per-event transformation*: the items kept of an event e at step t
are a keyed function of (t, e's distinct items) alone, never of e's position
in the input or of other events. Then

* removing an event changes no other event's kept items, so the truncated
  streams of two neighbouring inputs are neighbours (they differ by the one
  event's kept items, at most Delta0 of them) and every guarantee of the
  mechanism holds as stated, for every value of the key;
* a stream fed in daily runs is cut exactly as one run over the concatenation
  (line numbers, which restart in every file, play no part).

The choice: every distinct item i of e gets the 128-bit block of the keyed
PRF :class:`~dpstream.noise.NoiseSource` at address (level 0, index t, draw
d(e)), and the Delta0 items with the smallest blocks are kept (in the event's
order). d(e) is a 48-bit keyed digest of e's item *set*: the XOR over its
distinct items of a keyed 48-bit value per item (the item's block at (1, 0, 0)).
Keying on the content as well as the step gives two events of one step with
different items independent rankings: a step whose large events all share
an item ranking would drop the same items from all of them, a larger
undercount of those items at that step than independent choices give. Two
identical events of one step (or a rare digest collision) share one choice,
which is still a function of each event alone. Each item is kept with
probability Delta0 / |e| per event (uniform PRF ranks). The purpose
``f"{stream}/truncate/v2"`` gives truncation its own keys, independent of the
release noise; :data:`METHOD` names the rule in a run's recorded parameters so
that a stream never changes rule half-way.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..noise import NoiseKey, NoiseSource

__all__ = ["METHOD", "truncation_source", "keep_ranked", "keyed_subset", "KeyedTruncator"]

#: The truncation rule (recorded by ``dpstream run --state``): keyed on (step, item set, item).
METHOD = "step-items/1"
_PURPOSE = "truncate/v2"
_DIGEST_BITS = 48  # d(e) is a draw number (MAX_DRAW = 2**48 - 1)


def truncation_source(key: NoiseKey, stream: str) -> NoiseSource:
    """The keyed source of the truncation choices of ``stream`` (purpose ``stream/truncate/v2``)."""
    return NoiseSource(key, f"{stream}/{_PURPOSE}")


def keep_ranked(
    source: NoiseSource,
    t: int,
    items: Sequence[Hashable],
    codes: np.ndarray,
    offsets: np.ndarray,
    k: int,
) -> np.ndarray:
    """Which occurrences survive the cut of several events of step ``t`` (a boolean mask).

    Event j is ``items[c]`` for ``c`` in ``codes[offsets[j]:offsets[j + 1]]``, each
    code at most once per event (distinct items; one item, one code). The mask
    keeps each event's ``k`` occurrences of smallest block at (0, t, d(event)),
    so an event's kept items depend on the key, ``t`` and its own item set only.
    """
    codes = np.asarray(codes, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = codes.size
    if n == 0:
        return np.zeros(0, dtype=bool)
    sizes = np.diff(offsets)
    uniq, inv = np.unique(codes, return_inverse=True)
    prepared = source.prepare([items[c] for c in uniq.tolist()])
    mine = source.blocks(prepared, 1, 0)[:, 0] >> np.uint64(64 - _DIGEST_BITS)
    occupied = sizes > 0
    digest = np.zeros(sizes.size, dtype=np.uint64)
    digest[occupied] = np.bitwise_xor.reduceat(mine[inv], offsets[:-1][occupied])
    event = np.repeat(np.arange(sizes.size), sizes)
    rank = source.blocks_at(prepared.subset(inv), 0, int(t), digest[event])
    order = np.lexsort((rank[:, 1], rank[:, 0], event))  # events stay where they are
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n, dtype=np.int64)
    return place - offsets[event] < k


def keyed_subset(
    source: NoiseSource, items: Sequence[Hashable], k: int, t: int
) -> tuple[Hashable, ...]:
    """``k`` of the distinct ``items`` of one event of step ``t``, in the event's order
    (all of them when there are at most ``k``): :func:`keep_ranked` for one event."""
    distinct = tuple(dict.fromkeys(items))
    if len(distinct) <= k:
        return distinct
    n = len(distinct)
    keep = keep_ranked(source, t, distinct, np.arange(n), np.array([0, n]), k)
    return tuple(distinct[i] for i in np.flatnonzero(keep).tolist())


class KeyedTruncator:
    """Keeps ``max_items`` of an event's items, chosen by a keyed PRF (``--on-invalid truncate``).

    Taking "the first k items" would let the order in which a client lists
    items decide what is counted; here the kept items of an event of step t
    are a keyed function of t and the event's own distinct items
    (:func:`keyed_subset`, :func:`keep_ranked`), never of its input line or of
    any other event. So removing an event changes no other event's kept items,
    the truncated streams of neighbouring inputs are neighbours, and a stream
    fed in daily runs is cut exactly as one run over all the days.
    """

    def __init__(self, source: NoiseSource, max_items: int) -> None:
        self.source = source
        self.max_items = max_items

    def __call__(self, items: Sequence[str], t: int) -> tuple[str, ...]:
        """The kept items of one event of step ``t``, in the event's order."""
        return keyed_subset(self.source, items, self.max_items, t)  # type: ignore[return-value]

    def keep(
        self, t: int, items: Sequence[Any], codes: np.ndarray, offsets: np.ndarray
    ) -> np.ndarray:
        """The kept occurrences of several events of step ``t`` (columns; see
        :func:`keep_ranked`)."""
        return keep_ranked(self.source, t, items, codes, offsets, self.max_items)
