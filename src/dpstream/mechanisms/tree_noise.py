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

Memory and speed: the noise itself (suffix row 0) is not stored. It is
``suffix[1] + level_sum[0]``, added where it is used: into the release values
while a chunk is in cache (:meth:`TreeNoise.advance` with counts), or into a
new array by :meth:`TreeNoise.noise`. Of the rows above, only those a frequent
step needs are stored (rows 1..k, see :func:`stored_suffix_rows`); a rare step
that changes a higher level refolds the chain from the level sums, with the
same additions in the same order. Per item that is ``8 (L + k) + 16`` bytes
(level sums, stored suffix rows, prepared id): 80 for L = 6, r = 5. Items live
in segments: a batch added when there is no room gets a segment of exactly its
size (a known domain: one segment, no spare room); a segment smaller than
``_GROW_ITEMS`` doubles (one copy) when items are added to it, so a domain
that grows every step costs amortised O(1) per item and wastes at most the
spare room of the last segment. A step runs the chunked kernel of
:mod:`dpstream.noise_kernel`: per cache-sized chunk of items it draws the new
cells' noise into the level sums, updates the stored suffix rows and adds the
noise to the counts, while the chunk is in cache.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import noise_kernel as kernel
from ..noise import NoiseSource, PreparedItems
from ..tree import cells_by_level, iter_level_changes, num_levels

__all__ = ["TreeNoise", "stored_suffix_rows"]

#: A segment with fewer items than this doubles to take new items; a full one
#: this large is left as it is and new items start a new segment.
_GROW_ITEMS = 65536
#: Most level-sum rows a step may read, on average, to refold suffix rows that
#: are not stored (see stored_suffix_rows).
_REFOLD_BUDGET = 0.25


def stored_suffix_rows(levels: int, base: int) -> int:
    """How many suffix rows above row 0 TreeNoise stores (rows 1..k).

    A step that changes levels 1..m+1 (rows 0..m, m >= 0) needs suffix row
    m + 1. With rows 1..k stored, a step with m >= k (one step in base**k)
    refolds the chain from the top, reading about levels - k rows. The
    smallest k whose refolds cost at most ``_REFOLD_BUDGET`` rows per step on
    average is used: 2 of 5 rows for r = 5 (L = 6), 6 of 13 for r = 2 (L = 14).
    """
    for k in range(1, levels):
        if levels - k <= _REFOLD_BUDGET * base**k:
            return k
    return max(levels - 1, 0)


class _Segment:
    """A run of consecutive items: prepared ids, level sums, stored suffix rows.

    ``suffix[i]`` holds suffix row i + 1.
    """

    __slots__ = ("words", "level_sum", "suffix", "n")

    def __init__(self, words: np.ndarray, n: int, levels: int, stored: int) -> None:
        cap = words.shape[0]
        self.words = words
        self.level_sum = np.zeros((levels, cap))
        self.suffix = np.zeros((stored, cap))
        self.n = n

    @property
    def capacity(self) -> int:
        return int(self.words.shape[0])

    def grown(self, capacity: int) -> _Segment:
        """A copy with room for ``capacity`` items."""
        seg = _Segment(np.zeros((capacity, 2), dtype="<u8"), self.n, self.level_sum.shape[0],
                       self.suffix.shape[0])
        n = self.n
        seg.words[:n] = self.words[:n]
        seg.level_sum[:, :n] = self.level_sum[:, :n]
        seg.suffix[:, :n] = self.suffix[:, :n]
        return seg


#: A chunk of a segment: (segment, first column, end column, index of its first item).
_Chunk = tuple[_Segment, int, int, int]


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
        self._stored = stored_suffix_rows(self.levels, base)
        self._segments: list[_Segment] = []

    # -- items -------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def prepared(self) -> PreparedItems:
        """All items' prepared identifiers, in the order they were added."""
        parts = [seg.words[: seg.n] for seg in self._segments]
        if len(parts) == 1:
            return PreparedItems(parts[0])
        return PreparedItems.concat([PreparedItems(w) for w in parts])

    def add_items(self, prepared: PreparedItems) -> None:
        """Append items; their noise at the current t is computed from scratch."""
        words = prepared.words
        m = words.shape[0]
        done = 0
        while done < m:
            rest = m - done
            last = self._segments[-1] if self._segments else None
            if last is not None and last.n < last.capacity:
                take = min(rest, last.capacity - last.n)
                last.words[last.n : last.n + take] = words[done : done + take]
                self._fill_new(last, last.n, last.n + take)
                last.n += take
                done += take
            elif last is not None and last.capacity < _GROW_ITEMS:
                want = max(2 * last.capacity, last.n + min(rest, _GROW_ITEMS))
                self._segments[-1] = last.grown(min(want, _GROW_ITEMS))
            else:
                # a segment of exactly the rest, sharing the caller's words: it is
                # full, so nothing is written into them (a small one is copied when
                # it grows)
                seg = _Segment(words[done:], 0, self.levels, self._stored)
                self._segments.append(seg)
                self._fill_new(seg, 0, rest)
                seg.n = rest
                done = m
        self._n += m

    def _fill_new(self, seg: _Segment, lo: int, hi: int) -> None:
        """Level sums and stored suffix rows of new columns lo:hi of ``seg`` at the current t."""
        chunks = [(seg, lo + a, lo + b, -1) for a, b in kernel.chunk_bounds(hi - lo)]
        self._from_scratch(chunks)

    # -- time ----------------------------------------------------------------
    def advance(self, t: int, counts: np.ndarray | None = None) -> np.ndarray | None:
        """Move to time t (> current t): one step incrementally, a jump from scratch.

        With ``counts`` (one count per item, in item order), also return
        ``counts + noise()`` as a new float64 array, added while each chunk is
        in cache (a histogram release in one pass).
        """
        if t <= self.t:
            raise ValueError(f"t must increase: at {self.t}, asked for {t}")
        if t > self.horizon:
            raise ValueError(f"t must be <= horizon ({self.horizon}), got {t}")
        if counts is not None and counts.shape != (self._n,):
            raise ValueError(f"counts must have shape ({self._n},), got {counts.shape}")
        values = None if counts is None else np.empty(self._n)
        if t != self.t + 1:
            self.t = t
            self._from_scratch(self._chunks(), counts, values)
            return values
        resets: list[int] = []
        draws: list[tuple[int, np.ndarray]] = []
        top = 0
        for level, j in iter_level_changes(t, self.base):
            if j == 0:
                resets.append(level - 1)
            elif self._n:
                draws.append((level - 1, self.source.tweak_tile(level, j, 0, self._n)))
            top = level - 1
        self.t = t
        source, std = self.source, self.cell_std

        def step(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, _ = chunk
            rows = seg.level_sum
            for row in resets:
                rows[row, lo:hi] = 0.0
            for row, tile in draws:
                source.noise_chunk(seg.words[lo:hi], tile, "gaussian", std, rows[row, lo:hi],
                                   True, ws)
            self._suffix_chunk(seg, lo, hi, top, ws)
            if values is not None:
                self._values_chunk(chunk, counts, values, ws)

        self._run(self._chunks(), step)
        return values

    def _from_scratch(self, chunks: list[_Chunk], counts: np.ndarray | None = None,
                      values: np.ndarray | None = None) -> None:
        """Level sums and stored suffix rows at self.t of ``chunks``, ignoring their old values.

        Each level's cells are added in increasing index from 0.0, as the
        incremental path adds them one step at a time.
        """
        if not chunks:
            return
        items = max(hi - lo for _, lo, hi, _ in chunks)
        draws = [] if self.t == 0 else [
            (lv - 1, [self.source.tweak_tile(lv, j, 0, items) for j in range(lo, hi + 1)])
            for lv, lo, hi in cells_by_level(self.t, self.base)
        ]
        source, std = self.source, self.cell_std

        cells = [(row, tile) for row, tiles in draws for tile in tiles]

        def fill(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, _ = chunk
            rows = seg.level_sum
            rows[:, lo:hi] = 0.0
            m = hi - lo
            if 1 < len(cells) and len(cells) * m <= ws.size:
                # a few new items (most steps of an open domain): every cell's draws
                # in one kernel call, whose fixed cost would otherwise be paid per
                # cell; then added cell by cell in the same order, so the same bits
                words = np.tile(seg.words[lo:hi], (len(cells), 1))
                tiles = np.concatenate([tile[: 2 * m] for _, tile in cells])
                z = np.empty(len(cells) * m)
                source.noise_chunk(words, tiles, "gaussian", std, z, False, ws)
                for k, (row, _) in enumerate(cells):
                    np.add(rows[row, lo:hi], z[k * m : (k + 1) * m], out=rows[row, lo:hi])
            else:
                for row, tile in cells:
                    source.noise_chunk(seg.words[lo:hi], tile, "gaussian", std,
                                       rows[row, lo:hi], True, ws)
            self._suffix_chunk(seg, lo, hi, self.levels - 1, ws)
            if values is not None:
                self._values_chunk(chunk, counts, values, ws)

        self._run(chunks, fill)

    def _suffix_chunk(self, seg: _Segment, lo: int, hi: int, top: int,
                      ws: kernel.Workspace) -> None:
        """Recompute the stored suffix rows among top..1 on columns lo:hi.

        ``top`` is the highest level-sum row that changed. suffix[row] =
        suffix[row + 1] + level_sum[row], from suffix[L-1] = level_sum[L-1]
        down; a row that is not stored is recomputed in scratch space when
        the chain passes through it.
        """
        k, last = self._stored, self.levels - 1
        if top == 0 or k == 0:
            return  # no stored row depends on the changed rows
        rows, suffix = seg.level_sum, seg.suffix
        row = min(top, k)
        if row < last and row + 1 <= k:
            prev = suffix[row, lo:hi]  # suffix row row + 1
        else:
            prev = suffix[last - 1, lo:hi] if last <= k else ws.g[: hi - lo]
            np.copyto(prev, rows[last, lo:hi])
            row = last - 1
        while row >= 1:
            out = suffix[row - 1, lo:hi] if row <= k else prev
            np.add(prev, rows[row, lo:hi], out=out)
            prev = out
            row -= 1

    def _noise_chunk(self, seg: _Segment, lo: int, hi: int, out: np.ndarray,
                     ws: kernel.Workspace) -> None:
        """The noise (suffix row 0) of columns lo:hi into ``out``."""
        if self._stored:  # suffix row 1 is always stored when there is one
            np.add(seg.suffix[0, lo:hi], seg.level_sum[0, lo:hi], out=out)
        else:  # one level: the noise is its sum
            np.copyto(out, seg.level_sum[0, lo:hi])

    def _values_chunk(self, chunk: _Chunk, counts: np.ndarray, values: np.ndarray,
                      ws: kernel.Workspace) -> None:
        seg, lo, hi, at = chunk
        noise = ws.f[: hi - lo]
        self._noise_chunk(seg, lo, hi, noise, ws)
        np.add(counts[at : at + hi - lo], noise, out=values[at : at + hi - lo])

    def _chunks(self) -> list[_Chunk]:
        out: list[_Chunk] = []
        at = 0
        for seg in self._segments:
            out.extend((seg, lo, hi, at + lo) for lo, hi in kernel.chunk_bounds(seg.n))
            at += seg.n
        return out

    @staticmethod
    def _run(chunks: list[_Chunk], fn: Callable[[_Chunk, kernel.Workspace], None]) -> None:
        """``fn`` over every chunk, spread over the kernel's threads (see noise_kernel)."""

        def task(first: int, stop: int) -> None:
            ws = kernel.workspace(kernel.CHUNK_ITEMS)
            for chunk in chunks[first:stop]:
                fn(chunk, ws)

        kernel.run_tasks(len(chunks), task)

    # -- state export ----------------------------------------------------------
    def level_sums(self) -> np.ndarray:
        """A copy of the per-level noise sums, shape (levels, items): the whole state
        besides t and the prepared ids (for a checkpoint, e.g. Spark's streaming state)."""
        if not self._segments:
            return np.zeros((self.levels, 0))
        return np.concatenate([seg.level_sum[:, : seg.n] for seg in self._segments], axis=1)

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
        tn.t = int(t)
        if n:
            seg = _Segment(prepared.words, n, tn.levels, tn._stored)
            seg.level_sum[:] = level_sums
            tn._segments.append(seg)
            tn._n = n
            last = tn.levels - 1
            tn._run(tn._chunks(),
                    lambda chunk, ws: tn._suffix_chunk(*chunk[:3], last, ws))
        return tn

    # -- output ----------------------------------------------------------------
    def plus_noise(self, counts: np.ndarray) -> np.ndarray:
        """``counts + noise()`` as a new float64 array (one count per item, in item
        order), added chunk by chunk while each chunk's noise is in cache: the same
        bits as the two-step form, without a noise array of every item."""
        if counts.shape != (self._n,):
            raise ValueError(f"counts must have shape ({self._n},), got {counts.shape}")
        values = np.empty(self._n)
        self._run(self._chunks(), lambda chunk, ws: self._values_chunk(chunk, counts, values, ws))
        return values

    def noise(self) -> np.ndarray:
        """The current noise of every item (a new array each call: not kept, so the
        state holds no per-item array beyond the level sums and suffix rows)."""
        out = np.empty(self._n)

        def compute(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, at = chunk
            self._noise_chunk(seg, lo, hi, out[at : at + hi - lo], ws)

        self._run(self._chunks(), compute)
        return out
