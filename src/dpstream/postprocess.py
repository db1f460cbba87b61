"""Readable counts: documented post-processing of published releases.

Layer 6 of dpstream (the edges). A noisy count can be negative, and a running
count can go down from one step to the next although the true count never
does; readers take both for bugs. :class:`ReadableCounts` turns each release
into what is published, using only

* the current release (already private), and
* the values it published before (already public),

so it is post-processing: the privacy guarantee is unchanged, and no data is
read. It is deterministic, so replaying the releases of steps 1..t (as
``dpstream run`` does on resume) rebuilds its state exactly.

Options (``dpstream run --clamp/--no-clamp --monotone/--no-monotone``):

* ``clamp``: a count below 0 is published as 0 (true counts are never
  negative). It moves a count only when the noise pushed it below 0, so it
  only helps items whose true count is near 0: their error shrinks, at an
  upward bias.
* ``monotone``: an item's published count never falls below the last count
  published for it (a running maximum of the published values). True running
  counts never go down, so this removes the "decreasing count" that readers
  report, at an upward bias that grows with the number of steps since the
  item's count last moved (a maximum of noisy values).

``docs/utility.md`` measures both on real streams; the command's defaults
follow those numbers.

Rounding (``round_counts``) happens first, so what is compared and stored is
the published integer. With ``ranked=True`` (a mechanism that releases a list,
largest first: top-k, the unknown domain) the list is re-ordered by the
published values, so it still reads largest first.

Example:
    >>> import numpy as np
    >>> from dpstream.mechanisms.base import Release
    >>> pp = ReadableCounts(clamp=True, monotone=True)
    >>> pp(Release(1, ["a", "b"], np.array([5.2, -1.0]))).values.tolist()
    [5, 0]
    >>> pp(Release(2, ["a", "b"], np.array([4.9, 2.0]))).values.tolist()
    [5, 2]
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .mechanisms.base import Release, take_items
from .mechanisms.item_table import TableItems

__all__ = ["ReadableCounts"]


class ReadableCounts:
    """Post-process releases into readable counts (see the module docstring).

    Args:
        clamp: publish max(count, 0).
        monotone: publish max(count, last published count of the item).
        round_counts: round to the nearest integer first (the default, and what
            ``dpstream run`` publishes by default); the values are then int64, as
            :meth:`~dpstream.mechanisms.base.Release.rounded` gives them. False
            keeps the floats, whose low-order bits can give away true counts
            (docs/privacy.md): for tests, not for publishing.
        ranked: the releases are lists ordered by value, largest first: keep
            them ordered by the published value (ties in release order).

    The state is the last published value of every item published so far (a
    dict), so memory grows with the number of distinct items published.
    """

    def __init__(
        self,
        *,
        clamp: bool = True,
        monotone: bool = False,
        round_counts: bool = True,
        ranked: bool = False,
    ) -> None:
        for name, value in (
            ("clamp", clamp),
            ("monotone", monotone),
            ("round_counts", round_counts),
            ("ranked", ranked),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.clamp = clamp
        self.monotone = monotone
        self.round_counts = round_counts
        self.ranked = ranked
        self._last: dict[Hashable, float] = {}
        # fast path for a mechanism that releases the same item list every step
        # (KnownBase: its domain list): the last values as an array aligned with it
        self._same_items: tuple[Hashable, ...] | TableItems | None = None
        self._same_last: np.ndarray | None = None
        self._t = 0

    @property
    def active(self) -> bool:
        """Whether any option changes a value (rounding aside)."""
        return self.clamp or self.monotone

    def __call__(self, release: Release) -> Release:
        """The published form of ``release`` (the next step's)."""
        if release.t <= self._t:
            raise ValueError(
                f"releases must come in time order: got t={release.t} after t={self._t}"
            )
        values = np.asarray(release.values, dtype=np.float64)
        if self.round_counts:
            values = np.rint(values)
        else:
            values = values.copy()
        if self.clamp:
            np.maximum(values, 0.0, out=values)
        # the release's own item sequence unless reordered: a known domain's list is
        # then the same object at every step, and the output formatters encode its
        # text once per run instead of once per step
        items = release.items
        if self.monotone and len(items):
            self._running_max(release.items, values)
        self._t = release.t
        if self.ranked and len(items) > 1:
            order = np.argsort(-values, kind="stable")
            if not np.array_equal(order, np.arange(len(order))):
                items = take_items(items, order)
                values = values[order]
        if self.round_counts:
            values = values.astype(np.int64)
        return Release(t=release.t, items=items, values=values, meta=release.meta)

    def _running_max(self, items: object, values: np.ndarray) -> None:
        """values <- max(values, last published), and remember them (in place)."""
        if self._same_items is not None and items is self._same_items:
            assert self._same_last is not None
            np.maximum(values, self._same_last, out=values)
            self._same_last = values.copy()
            return
        if self._same_items is not None:  # other items: back to the per-item table
            assert self._same_last is not None
            self._last.update(zip(self._same_items, self._same_last.tolist(), strict=True))
            self._same_items = self._same_last = None
        seq = list(items)  # type: ignore[call-overload]
        last = self._last
        before = np.fromiter(
            (last.get(it, -np.inf) for it in seq), dtype=np.float64, count=len(seq)
        )
        np.maximum(values, before, out=values)
        # the same tuple (or a known domain's read-only view) next step is the same
        # items (a list could have been changed)
        if not last and len(seq) > 1000 and isinstance(items, (tuple, TableItems)):
            self._same_items, self._same_last = items, values.copy()
        else:
            last.update(zip(seq, values.tolist(), strict=True))

    def __repr__(self) -> str:
        return (
            f"ReadableCounts(clamp={self.clamp}, monotone={self.monotone}, "
            f"round_counts={self.round_counts}, t={self._t})"
        )
