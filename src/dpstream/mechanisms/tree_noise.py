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
new array by :meth:`TreeNoise.noise`. Only the lowest A levels' sums are kept
one by one (:func:`default_kept_levels`); the levels above them change together once
every r^A steps, so they are kept as one row, their fold ``suffix[A]``, and
at the steps that change them (and at no other) that row is computed again
from the keyed source, from scratch, as a jump would. Of the suffix rows
between, only those a frequent step needs are stored (rows 1..k, see
:func:`stored_suffix_rows`); a rare step that changes a higher level refolds
the chain from ``suffix[A]``, with the same additions in the same order. Per
item that is ``8 (A + 1 + k) + 16`` bytes (kept level sums, the fold of the
others, stored suffix rows, prepared id): 56 for T = 1,000 and 72 for
T = 10^6 at r = 5 (A = 3 and 4), against ``8 (L + k) + 16`` = 72 and 112 with
every level kept (``kept_levels=L``, which Spark's state uses). Items live
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

import operator
from collections.abc import Callable
from typing import overload

import numpy as np

from .. import noise_kernel as kernel
from ..noise import NoiseSource, PreparedItems
from ..tree import cells_by_level, iter_level_changes, num_levels

__all__ = ["TreeNoise", "default_kept_levels", "stored_suffix_rows"]

#: A segment with fewer items than this doubles to take new items; a full one
#: this large is left as it is and new items start a new segment.
_GROW_ITEMS = 65536
#: Most level-sum rows a step may read, on average, to refold suffix rows that
#: are not stored (see stored_suffix_rows).
_REFOLD_BUDGET = 0.5
#: Most extra keyed draws per item per step, on average, that recomputing the
#: fold of the levels above the kept ones may cost (see kept_levels). A step
#: draws about r/(r-1) values per item anyway: 0.05 is under 5% of that.
_REDRAW_BUDGET = 0.05


def stored_suffix_rows(chain: int, base: int) -> int:
    """How many suffix rows above row 0 TreeNoise stores (rows 1..k).

    ``chain``: the rows a refold from the chain's start reads, the kept levels
    A (L with every level kept; else the chain starts at the stored fold
    ``suffix[A]`` and reads it and rows A-1..k+1).
    A step that changes levels 1..m+1 (rows 0..m, m >= 0) needs suffix row
    m + 1. With rows 1..k stored, a step with m >= k (one step in base**k)
    refolds the chain from its top, reading about chain - k rows. The
    smallest k whose refolds cost at most ``_REFOLD_BUDGET`` rows per step on
    average is used: 1 of 2 rows for r = 5 and A = 3, 2 of 5 for L = 6.
    """
    for k in range(1, chain):
        if chain - k <= _REFOLD_BUDGET * base**k:
            return k
    return max(chain - 1, 0)


def default_kept_levels(levels: int, base: int) -> int:
    """How many of the lowest levels TreeNoise keeps one by one (A; L for all).

    The levels A+1..L change only at steps t that are multiples of r^A, and
    together; their sums are kept as one row (their fold). At such a step the
    row is computed again from scratch, which draws every cell of I_t at those
    levels, at most (r - 1) (L - A), about (r - 1) (L - A) / 2 on average. The
    smallest A whose average stays within ``_REDRAW_BUDGET`` draws per item per
    step is used: 3 for T = 1,000 and r = 5, 4 for T = 10^6; 6 and 8 at r = 2.
    """
    for kept in range(1, levels):
        if (levels - kept) * (base - 1) / 2 <= _REDRAW_BUDGET * base**kept:
            return kept
    return levels


class _Segment:
    """A run of consecutive items: prepared ids, level sums, stored suffix rows.

    ``level_sum[l]`` holds level l's sum for the kept levels l < A, and with
    fewer than L levels kept, ``level_sum[A]`` holds suffix row A (the fold of
    the levels above). ``suffix[i]`` holds suffix row i + 1.
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
        seg = _Segment(
            np.zeros((capacity, 2), dtype="<u8"),
            self.n,
            self.level_sum.shape[0],
            self.suffix.shape[0],
        )
        n = self.n
        seg.words[:n] = self.words[:n]
        seg.level_sum[:, :n] = self.level_sum[:, :n]
        seg.suffix[:, :n] = self.suffix[:, :n]
        return seg


#: A chunk of a segment: (segment, first column, end column, index of its first item).
_Chunk = tuple[_Segment, int, int, int]


def _values_out(out: np.ndarray | None, n: int) -> np.ndarray:
    """``out`` checked as the place for n release values, or a new array."""
    if out is None:
        return np.empty(n)
    if out.shape != (n,) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float64 array of shape ({n},)")
    return out


class TreeNoise:
    """Per-item tree noise for a stream of horizon T in base r.

    Args:
        source: the keyed noise source (its purpose names this stream's tree).
        horizon: T.
        base: r.
        cell_std: standard deviation of each cell's noise (sqrt(L_r) tau).
        kept_levels: how many of the lowest levels to keep one by one (A, 1..L);
            the default is :func:`default_kept_levels`. Every choice gives the same
            values, bit for bit; L keeps every level (no step redraws a cell),
            which a caller that exports :meth:`level_sums` at every step wants.
    """

    def __init__(
        self,
        source: NoiseSource,
        horizon: int,
        base: int,
        cell_std: float,
        kept_levels: int | None = None,
    ) -> None:
        self.source = source
        self.horizon = horizon
        self.base = base
        self.cell_std = float(cell_std)
        self.levels = num_levels(horizon, base)
        if kept_levels is None:
            kept_levels = default_kept_levels(self.levels, base)
        try:
            kept = None if isinstance(kept_levels, bool) else operator.index(kept_levels)
        except TypeError:
            kept = None
        if kept is None or not 1 <= kept <= self.levels:
            raise ValueError(
                f"kept_levels must be an int in [1, {self.levels}], got {kept_levels!r}"
            )
        self.t = 0
        self._n = 0
        self._kept = kept
        self._stored = stored_suffix_rows(kept, base)
        self._segments: list[_Segment] = []

    @property
    def kept_levels(self) -> int:
        """A: the levels whose sums are kept one by one (L: all of them)."""
        return self._kept

    @property
    def _folded(self) -> bool:
        """Whether the levels above A are kept as one row (their fold, suffix row A)."""
        return self._kept < self.levels

    @property
    def _chain(self) -> int:
        """The row the suffix chain starts from: suffix row A = level_sum[A] when
        folded, else suffix row L-1 = level_sum[L-1]."""
        return self._kept if self._folded else self.levels - 1

    @property
    def _rows(self) -> int:
        """Rows of ``level_sum`` per item: A kept level sums and the fold, or L."""
        return self._kept + 1 if self._folded else self.levels

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
                seg = _Segment(words[done:], 0, self._rows, self._stored)
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
    @overload
    def advance(self, t: int, counts: None = None, out: None = None) -> None: ...
    @overload
    def advance(self, t: int, counts: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    def advance(
        self, t: int, counts: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Move to time t (> current t): one step incrementally, a jump from scratch.

        With ``counts`` (one count per item, in item order), also return
        ``counts + noise()`` as a float64 array, added while each chunk is in
        cache (a histogram release in one pass): a new array, or ``out``.
        """
        if t <= self.t:
            raise ValueError(f"t must increase: at {self.t}, asked for {t}")
        if t > self.horizon:
            raise ValueError(f"t must be <= horizon ({self.horizon}), got {t}")
        if counts is not None and counts.shape != (self._n,):
            raise ValueError(f"counts must have shape ({self._n},), got {counts.shape}")
        values = None if counts is None else _values_out(out, self._n)
        changes = list(iter_level_changes(t, self.base)) if t == self.t + 1 else []
        top = changes[-1][0] - 1 if changes else 0  # the highest row that changes
        if t != self.t + 1 or top >= self._kept:
            # a jump, or a step that changes the folded levels (one in r^A): their
            # fold is computed again, with every other row, as a jump computes them
            self.t = t
            self._from_scratch(self._chunks(), counts, values)
            return values
        resets: list[int] = []
        draws: list[tuple[int, np.ndarray]] = []
        for level, j in changes:
            if j == 0:
                resets.append(level - 1)
            elif self._n:
                draws.append((level - 1, self.source.tweak_tile(level, j, 0, self._n)))
        self.t = t
        source, std = self.source, self.cell_std

        def step(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, _ = chunk
            rows = seg.level_sum
            for row in resets:
                rows[row, lo:hi] = 0.0
            for row, tile in draws:
                source.noise_chunk(
                    seg.words[lo:hi], tile, "gaussian", std, rows[row, lo:hi], True, ws
                )
            self._suffix_chunk(seg, lo, hi, top, ws)
            if counts is not None and values is not None:
                self._values_chunk(chunk, counts, values, ws)

        self._run(self._chunks(), step)
        return values

    def _cells(self, items: int) -> list[tuple[int, np.ndarray]]:
        """I_t's cells as (level-sum row, tweak tile), by level, in increasing index."""
        if self.t == 0:
            return []
        return [
            (lv - 1, self.source.tweak_tile(lv, j, 0, items))
            for lv, lo, hi in cells_by_level(self.t, self.base)
            for j in range(lo, hi + 1)
        ]

    def _draw_sums(
        self,
        seg: _Segment,
        lo: int,
        hi: int,
        cells: list[tuple[int, np.ndarray]],
        dest: Callable[[int], np.ndarray],
        ws: kernel.Workspace,
    ) -> None:
        """Add each cell's noise into ``dest(row)`` (zeroed by the caller), in the order
        of ``cells``: each level's cells in increasing index from 0.0, as the
        incremental path adds them one step at a time."""
        source, std = self.source, self.cell_std
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
                out = dest(row)
                np.add(out, z[k * m : (k + 1) * m], out=out)
        else:
            for row, tile in cells:
                source.noise_chunk(seg.words[lo:hi], tile, "gaussian", std, dest(row), True, ws)

    def _draw_all(
        self,
        seg: _Segment,
        lo: int,
        hi: int,
        cells: list[tuple[int, np.ndarray]],
        ws: kernel.Workspace,
    ) -> dict[int, np.ndarray]:
        """Draw the sums of ``cells`` on columns lo:hi: a kept level's into its row
        of ``level_sum`` (zeroed by the caller), a folded level's into a new array.
        Returns the folded levels' sums, row -> values (a level without cells in
        I_t is absent: its sum is 0.0)."""
        rows, kept = seg.level_sum, self._kept
        upper: dict[int, np.ndarray] = {}

        def dest(row: int) -> np.ndarray:
            if row < kept:
                return rows[row, lo:hi]
            if row not in upper:
                upper[row] = np.zeros(hi - lo)
            return upper[row]

        self._draw_sums(seg, lo, hi, cells, dest, ws)
        return upper

    def _fold(self, out: np.ndarray, upper: dict[int, np.ndarray]) -> None:
        """suffix row A = level_sum[L-1] + ... + level_sum[A], added top-down (the
        additions the chain of every level kept performs), into ``out``."""
        last = self.levels - 1
        for row in range(last, self._kept - 1, -1):
            part = upper.get(row)
            if row == last:
                if part is None:
                    out.fill(0.0)
                else:
                    np.copyto(out, part)
            else:
                np.add(out, 0.0 if part is None else part, out=out)

    def _from_scratch(
        self,
        chunks: list[_Chunk],
        counts: np.ndarray | None = None,
        values: np.ndarray | None = None,
    ) -> None:
        """Level sums, their fold and stored suffix rows at self.t of ``chunks``,
        ignoring their old values.

        Each level's cells are added in increasing index from 0.0, as the
        incremental path adds them one step at a time.
        """
        if (counts is None) != (values is None):
            raise ValueError("counts and values must be given together")
        if not chunks:
            return
        cells = self._cells(max(hi - lo for _, lo, hi, _ in chunks))

        def fill(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, _ = chunk
            seg.level_sum[:, lo:hi] = 0.0
            upper = self._draw_all(seg, lo, hi, cells, ws)
            if self._folded:
                self._fold(seg.level_sum[self._kept, lo:hi], upper)
            self._suffix_chunk(seg, lo, hi, self._chain, ws)
            if counts is not None and values is not None:
                self._values_chunk(chunk, counts, values, ws)

        self._run(chunks, fill)

    def _suffix_chunk(
        self, seg: _Segment, lo: int, hi: int, top: int, ws: kernel.Workspace
    ) -> None:
        """Recompute the stored suffix rows among top..1 on columns lo:hi.

        ``top`` is the highest row that changed (the chain's start when all
        did). suffix[row] = suffix[row + 1] + level_sum[row], down from the
        chain's start C: suffix[C] = level_sum[C] (the fold of the levels above
        A when folded, C = A; else the top level's sum, C = L-1). A row that is
        not stored is computed in scratch space when the chain passes through it.
        """
        k, head = self._stored, self._chain
        if top == 0 or k == 0:
            return  # no stored row depends on the changed rows
        rows, suffix = seg.level_sum, seg.suffix
        row = min(top, k)
        if row + 1 <= k:
            prev = suffix[row, lo:hi]  # suffix row row + 1
        else:  # from the chain's start
            prev = rows[head, lo:hi]
            if head <= k:  # every row stored: the start is stored as a suffix row too
                np.copyto(suffix[head - 1, lo:hi], prev)
            row = head - 1
        scratch = ws.g[: hi - lo]
        while row >= 1:
            out = suffix[row - 1, lo:hi] if row <= k else scratch
            np.add(prev, rows[row, lo:hi], out=out)
            prev = out
            row -= 1

    def _noise_chunk(
        self, seg: _Segment, lo: int, hi: int, out: np.ndarray, ws: kernel.Workspace
    ) -> None:
        """The noise (suffix row 0) of columns lo:hi into ``out``."""
        if self._stored:  # suffix row 1 is always stored when there is one
            np.add(seg.suffix[0, lo:hi], seg.level_sum[0, lo:hi], out=out)
        elif self._folded:  # A = 1: suffix row 1 is the fold
            np.add(seg.level_sum[1, lo:hi], seg.level_sum[0, lo:hi], out=out)
        else:  # one level: the noise is its sum
            np.copyto(out, seg.level_sum[0, lo:hi])

    def _values_chunk(
        self, chunk: _Chunk, counts: np.ndarray, values: np.ndarray, ws: kernel.Workspace
    ) -> None:
        seg, lo, hi, at = chunk
        noise = ws.f[: hi - lo]
        self._noise_chunk(seg, lo, hi, noise, ws)
        np.add(counts[at : at + hi - lo], noise, out=values[at : at + hi - lo])

    def _chunks(self, start: int = 0) -> list[_Chunk]:
        """The chunks of the items from ``start`` on; a chunk's index counts from start."""
        out: list[_Chunk] = []
        at = 0
        for seg in self._segments:
            for lo, hi in kernel.chunk_bounds(seg.n):
                if at + hi > start:
                    lo = max(lo, start - at)
                    out.append((seg, lo, hi, at + lo - start))
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
        besides t and the prepared ids (for a checkpoint, e.g. Spark's streaming state).

        The sums of folded levels (above :attr:`kept_levels`) are drawn again from
        the keyed source (the same values); a caller that exports at every step
        keeps every level instead (``kept_levels=L``).
        """
        if not self._segments:
            return np.zeros((self.levels, 0))
        if not self._folded:
            return np.concatenate([seg.level_sum[:, : seg.n] for seg in self._segments], axis=1)
        out = np.zeros((self.levels, self._n))
        kept = self._kept
        cells = [c for c in self._cells(kernel.CHUNK_ITEMS) if c[0] >= kept]

        def export(chunk: _Chunk, ws: kernel.Workspace) -> None:
            seg, lo, hi, at = chunk
            out[:kept, at : at + hi - lo] = seg.level_sum[:kept, lo:hi]
            for row, part in self._draw_all(seg, lo, hi, cells, ws).items():
                out[row, at : at + hi - lo] = part

        self._run(self._chunks(), export)
        return out

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
        kept_levels: int | None = None,
    ) -> TreeNoise:
        """Rebuild a TreeNoise at time t from :meth:`level_sums` and the prepared ids.

        The fold of the levels above ``kept_levels`` and the suffix sums depend
        only on the level sums, so the restored object continues bit for bit as
        the original would (no keyed draw is repeated).
        """
        tn = cls(source, horizon, base, cell_std, kept_levels)
        level_sums = np.asarray(level_sums, dtype=np.float64)
        if level_sums.shape != (tn.levels, len(prepared)):
            raise ValueError(
                f"level_sums must have shape ({tn.levels}, {len(prepared)}), got {level_sums.shape}"
            )
        if not 0 <= t <= horizon:
            raise ValueError(f"t must be in [0, {horizon}], got {t}")
        n = len(prepared)
        tn.t = int(t)
        if n:
            seg = _Segment(prepared.words, n, tn._rows, tn._stored)
            kept = tn._kept
            seg.level_sum[:kept] = level_sums[:kept]
            if tn._folded:
                upper = {row: level_sums[row] for row in range(kept, tn.levels)}
                tn._fold(seg.level_sum[kept], upper)
            tn._segments.append(seg)
            tn._n = n
            tn._run(tn._chunks(), lambda chunk, ws: tn._suffix_chunk(*chunk[:3], tn._chain, ws))
        return tn

    # -- output ----------------------------------------------------------------
    def plus_noise(
        self, counts: np.ndarray, start: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``counts + noise()[start:]`` as a float64 array (a new one, or ``out``), for
        the items from ``start`` on (one count each, in item order), added chunk by
        chunk while each chunk's noise is in cache: the same bits as the two-step
        form, without a noise array of every item."""
        if not 0 <= start <= self._n:
            raise ValueError(f"start must be in [0, {self._n}], got {start}")
        m = self._n - start
        if counts.shape != (m,):
            raise ValueError(f"counts must have shape ({m},), got {counts.shape}")
        values = _values_out(out, m)
        self._run(
            self._chunks(start), lambda chunk, ws: self._values_chunk(chunk, counts, values, ws)
        )
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
