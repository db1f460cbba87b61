"""Running sums of keyed tree-cell noise, for a growing set of items.

Shared by TreeCounter, KnownBase, UnkBase and the counters of SparseGumb. For
every item u and time t the noise added to u's count is

    sum over cells (level, j) in I_t(r) of Z(key, purpose, u, (level, j)),
    Z ~ N(0, cell_std^2),

computed without a table of drawn values and without re-summing I_t at each
step:

* ``level_sum[l]`` holds, per item, the sum of the noise of the cells of I_t at
  level l, added in increasing cell index from 0.0. From t-1 to t a level's set
  either gains one cell (one keyed draw) or empties (reset to 0.0); levels above
  the lowest non-dividing one do not change (``tree.iter_level_changes``).
* ``suffix[l]`` = level_sum[L-1] + ... + level_sum[l], added top-down. A step
  that changed levels 0..m recomputes suffix[m..0] only: amortised r/(r-1)
  vector additions and r/(r-1) keyed draws per step.

Computing the same quantities from scratch at any t (a jump, a restart, a new
item) performs exactly the same floating-point operations in the same order,
so the incremental and the from-scratch paths agree bit for bit. That is what
makes event mode, aggregate mode and a resumed run give identical releases.
"""

from __future__ import annotations

import numpy as np

from ..noise import NoiseSource, PreparedItems
from ..tree import cells_by_level, iter_level_changes, num_levels

__all__ = ["TreeNoise"]


class TreeNoise:
    """Per-item tree noise for a stream of horizon T in base r.

    Args:
        source: the keyed noise source (its purpose names this stream's tree).
        horizon: T.
        base: r.
        cell_std: standard deviation of each cell's noise (sqrt(L_r) tau).
    """

    def __init__(self, source: NoiseSource, horizon: int, base: int, cell_std: float) -> None:
        self.source = source
        self.horizon = horizon
        self.base = base
        self.cell_std = float(cell_std)
        self.levels = num_levels(horizon, base)
        self.t = 0
        self._n = 0
        self._prepared: list[PreparedItems] = []
        self._prepared_all: PreparedItems | None = None
        cap = 16
        self._level_sum = np.zeros((self.levels, cap))
        self._suffix = np.zeros((self.levels, cap))

    # -- items -------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def prepared(self) -> PreparedItems:
        """All items' prepared identifiers, in the order they were added."""
        if self._prepared_all is None or len(self._prepared_all) != self._n:
            self._prepared_all = PreparedItems.concat(self._prepared)
            self._prepared = [self._prepared_all]
        return self._prepared_all

    def _reserve(self, n: int) -> None:
        cap = self._level_sum.shape[1]
        if n <= cap:
            return
        while cap < n:
            cap *= 2
        for name in ("_level_sum", "_suffix"):
            old = getattr(self, name)
            new = np.zeros((self.levels, cap))
            new[:, : self._n] = old[:, : self._n]
            setattr(self, name, new)

    def add_items(self, prepared: PreparedItems) -> None:
        """Append items; their noise at the current t is computed from scratch."""
        m = len(prepared)
        if m == 0:
            return
        self._reserve(self._n + m)
        cols = slice(self._n, self._n + m)
        self._level_sum[:, cols] = 0.0
        if self.t > 0:
            self._fill_from_scratch(prepared, cols, self.t)
        self._recompute_suffix(self.levels - 1, cols)
        self._prepared.append(prepared)
        self._n += m

    # -- time ----------------------------------------------------------------
    def advance(self, t: int) -> None:
        """Move to time t (> current t): one step incrementally, a jump from scratch."""
        if t <= self.t:
            raise ValueError(f"t must increase: at {self.t}, asked for {t}")
        if t > self.horizon:
            raise ValueError(f"t must be <= horizon ({self.horizon}), got {t}")
        cols = slice(0, self._n)
        if t == self.t + 1:
            top = -1
            for level, j in iter_level_changes(t, self.base):
                row = level - 1
                if j == 0:
                    self._level_sum[row, cols] = 0.0
                elif self._n:
                    self._level_sum[row, cols] += self.source.gaussian(
                        self.prepared, level, j, scale=self.cell_std
                    )
                top = row
            self.t = t
            if top >= 0:
                self._recompute_suffix(top, cols)
            return
        self.t = t
        self._level_sum[:, cols] = 0.0
        if self._n:
            self._fill_from_scratch(self.prepared, cols, t)
        self._recompute_suffix(self.levels - 1, cols)

    def _fill_from_scratch(self, prepared: PreparedItems, cols: slice, t: int) -> None:
        by_level = cells_by_level(t, self.base)
        addresses = [(lv, j, 0) for lv, lo, hi in by_level for j in range(lo, hi + 1)]
        if not addresses:
            return
        z = self.source.to_gaussian(self.source.blocks_many(prepared, addresses), self.cell_std)
        k = 0
        for lv, lo, hi in by_level:
            row = self._level_sum[lv - 1, cols]
            for _ in range(lo, hi + 1):
                row += z[k]
                k += 1

    def _recompute_suffix(self, top_row: int, cols: slice) -> None:
        last = self.levels - 1
        for row in range(top_row, -1, -1):
            if row == last:
                self._suffix[row, cols] = self._level_sum[row, cols]
            else:
                np.add(self._suffix[row + 1, cols], self._level_sum[row, cols],
                       out=self._suffix[row, cols])

    # -- state export ----------------------------------------------------------
    def level_sums(self) -> np.ndarray:
        """A copy of the per-level noise sums, shape (levels, items): the whole state
        besides t and the prepared ids (for a checkpoint, e.g. Spark's streaming state)."""
        return self._level_sum[:, : self._n].copy()

    @classmethod
    def restore(
        cls,
        source: NoiseSource,
        horizon: int,
        base: int,
        cell_std: float,
        prepared: PreparedItems,
        t: int,
        level_sums: np.ndarray,
    ) -> TreeNoise:
        """Rebuild a TreeNoise at time t from :meth:`level_sums` and the prepared ids.

        The suffix sums depend only on the level sums, so the restored object
        continues bit for bit as the original would (no keyed draw is repeated).
        """
        tn = cls(source, horizon, base, cell_std)
        level_sums = np.asarray(level_sums, dtype=np.float64)
        if level_sums.shape != (tn.levels, len(prepared)):
            raise ValueError(f"level_sums must have shape ({tn.levels}, {len(prepared)}), "
                             f"got {level_sums.shape}")
        if not 0 <= t <= horizon:
            raise ValueError(f"t must be in [0, {horizon}], got {t}")
        n = len(prepared)
        tn._reserve(n)
        tn._level_sum[:, :n] = level_sums
        tn._prepared = [prepared]
        tn._n = n
        tn.t = int(t)
        tn._recompute_suffix(tn.levels - 1, slice(0, n))
        return tn

    # -- output ----------------------------------------------------------------
    def noise(self) -> np.ndarray:
        """The current noise of every item (a read-only view, valid until the next call)."""
        view = self._suffix[0, : self._n]
        view = view.view()
        view.flags.writeable = False
        return view
