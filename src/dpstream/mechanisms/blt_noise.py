"""Streamed keyed BLT noise, for a growing set of items (the BLT sibling of ``TreeNoise``).

Used by KnownBase, BLTCounter and the counters of SparseGumb when they run
with ``counter="blt"``. For every item u and time t the noise added to u's
count is y_t = (B z)_t, B = A C^-1 the BLT factorization's post-processing
matrix (:mod:`dpstream.factorization`) and

    z_s = Z(key, purpose, u, (0, s, 0)),  Z ~ N(0, sigma^2),  s = 1..t,

one keyed Gaussian per item and step. The state per item is the k buffers and
the running sum y (k + 1 floats); a step draws z_t for every item and runs
:func:`~dpstream.factorization.stream_step`.

Bit for bit, whatever the path: a jump from t0 to t runs the steps t0+1..t
one after the other (drawing each step's z in blocks of steps, which gives
the same values); an item added at t is replayed from step 1; restoring from
:meth:`BLTNoise.state` continues where the original stopped. Every path
performs, per item, the same IEEE operations in the same order, so event mode,
aggregate mode (any skipped steps), a resumed run and a Spark executor all
release the same bits. The price of a jump is one draw per item per skipped
step (the tree needs only the cells of I_t); an item added at t costs t
draws.

Items that join late (:meth:`BLTNoise.join_items`, UnkBase's items, first seen
at step s): instead of replaying steps 1..s-1, their state at s - 1 (the k
buffers and the running sum) is drawn directly from its exact distribution,
N(0, sigma^2 Sigma_(s-1)) (:func:`~dpstream.factorization.state_factor`), as
sigma F w with k + 1 keyed standard normals

    w_j = W(key, purpose + "/join", u, (0, s, j)),  j = 0..k,

and step s then runs as for every item (its z_s above). O(k^2) per joining
item at any s. Why that is exact: the state is the only thing a step carries
over (each step adds a fresh, independent z_t), so given the state at s - 1
the noise at s, s+1, ... is a fixed function of it and of z_s, z_(s+1), ...;
an item held from step 1 has at s - 1 a state distributed as N(0, sigma^2
Sigma_(s-1)), independent of z_s, z_(s+1), ...; the drawn state has that same
law and is independent of them too (other addresses of the PRF). So the whole
future noise sequence (y_s, y_(s+1), ...) has exactly the joint law it has for
an item held from step 1. Only its values before s differ, and those are never
used. A joined item's noise depends on s: event mode and aggregate mode agree
bit for bit when they first see the item at the same step (and a resumed run
goes on with the saved state), but an aggregate release that skips the steps
where an item appeared joins it later, with other (equally distributed) noise.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np

from .. import noise_kernel as kernel
from ..factorization import BLTStrategy, state_factor, stream_step
from ..noise import NoiseSource, PreparedItems

__all__ = ["BLTNoise", "BLT_LEVEL", "JOIN_LEVEL", "join_purpose"]

#: The first address coordinate of a BLT draw: (BLT_LEVEL, step, 0).
BLT_LEVEL = 0
#: The first address coordinate of a joining item's state draws, under
#: :func:`join_purpose`: (JOIN_LEVEL, step s, j) for j = 0..k.
JOIN_LEVEL = 0


def join_purpose(purpose: str) -> str:
    """The purpose of the state draws of items joining a BLT stream of ``purpose``
    (dedicated: no other noise is ever drawn under it; same noise version)."""
    return purpose + "/join"


#: A replay draws z for this many (item, step) pairs at once (bounds memory).
_CHUNK = 1 << 20


class BLTNoise:
    """Per-item streamed BLT noise with keyed draws.

    Args:
        source: the keyed noise source (its purpose names this stream's counter).
        strategy: the BLT (its horizon is T).
        sigma: the standard deviation of each keyed draw z.
        join_source: the source of :meth:`join_items`' state draws (its purpose
            :func:`join_purpose` of ``source``'s); ``None``: items are only added
            with :meth:`add_items`.
    """

    #: (for noise states saved before join_source existed)
    join_source: NoiseSource | None = None

    def __init__(
        self,
        source: NoiseSource,
        strategy: BLTStrategy,
        sigma: float,
        join_source: NoiseSource | None = None,
    ) -> None:
        if join_source is not None and join_source.purpose != join_purpose(source.purpose):
            raise ValueError("join_source must draw under join_purpose(source.purpose)")
        self.join_source = join_source
        self.source = source
        self.strategy = strategy
        self.horizon = strategy.horizon
        self.sigma = float(sigma)
        self._theta = strategy.theta
        self._omega = strategy.omega
        self.t = 0
        self._n = 0
        cap = 16
        self._buffers = np.zeros((strategy.buffers, cap))
        self._total = np.zeros(cap)
        # the prepared ids, rows 0..n-1 of a growing array (an item's join appends in
        # place: concatenating them all at every join step cost O(n) each time)
        self._words = np.zeros((cap, 2), dtype="<u8")

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore from a snapshot. One written before the prepared ids were kept in one
        growing array (a list ``_prepared``, dpstream 0.3.0.dev0 before 2026-11-26) is
        brought to the current layout: the same ids in the same order."""
        state = dict(state)
        if "_words" not in state:
            parts = state.pop("_prepared", None) or []
            state.pop("_prepared_all", None)
            words = np.zeros((state["_total"].shape[0], 2), dtype="<u8")
            if parts:
                joined = PreparedItems.concat(parts).words
                words[: joined.shape[0]] = joined
            state["_words"] = words
        self.__dict__.update(state)

    # -- items -------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def prepared(self) -> PreparedItems:
        """All items' prepared identifiers, in the order they were added (a view of
        the noise's own array: read it, never write to it)."""
        return PreparedItems(self._words[: self._n])

    def _reserve(self, n: int) -> None:
        cap = self._total.shape[0]
        if n <= cap:
            return
        cap = max(n, 2 * cap)  # a domain added at once: exactly its size; growth: doubling
        buffers = np.zeros((self._buffers.shape[0], cap))
        buffers[:, : self._n] = self._buffers[:, : self._n]
        total = np.zeros(cap)
        total[: self._n] = self._total[: self._n]
        words = np.zeros((cap, 2), dtype="<u8")
        words[: self._n] = self._words[: self._n]
        self._buffers, self._total, self._words = buffers, total, words

    def add_items(self, prepared: PreparedItems) -> None:
        """Append items; their noise at the current t is replayed from step 1."""
        m = len(prepared)
        if m == 0:
            return
        self._reserve(self._n + m)
        cols = slice(self._n, self._n + m)
        buffers = np.zeros((self._buffers.shape[0], m))
        total = np.zeros(m)
        self._run(prepared, buffers, total, 1, self.t)
        self._buffers[:, cols] = buffers
        self._total[cols] = total
        self._words[self._n : self._n + m] = prepared.words
        self._n += m

    def join_items(self, prepared: PreparedItems, joined: PreparedItems) -> None:
        """Append items first seen at the current step s = t >= 1: their state at s - 1
        is drawn from its exact law (see the module doc), then step s runs for them.

        ``prepared``: the items' ids prepared under ``source``; ``joined``: the same
        items, in the same order, prepared under ``join_source``. Elementwise
        arithmetic in a fixed order, so an item's values depend only on (key,
        purpose, item, s), not on which items join with it.
        """
        m = len(prepared)
        if len(joined) != m:
            raise ValueError(f"joined must hold the same {m} items, got {len(joined)}")
        if m == 0:
            return
        if self.join_source is None:
            raise ValueError("this BLT noise has no join_source: use add_items")
        s = self.t
        if s < 1:
            raise ValueError("join_items needs a step: advance to t >= 1 first")
        k = self.strategy.buffers
        buffers = np.zeros((k, m))
        total = np.zeros(m)
        if s > 1:
            factor = self._join_factor(s - 1)
            rows = [*buffers, total]
            addresses = [(JOIN_LEVEL, s, j) for j in range(k + 1)]
            per_chunk = max(1, _CHUNK // (k + 1))
            for lo in range(0, m, per_chunk):
                hi = min(m, lo + per_chunk)
                blocks = self.join_source.blocks_many(joined.subset(slice(lo, hi)), addresses)
                w = self.join_source.gaussian_values(blocks)  # (k + 1, items), N(0, 1)
                for i, row in enumerate(rows):
                    out = row[lo:hi]
                    for j in range(i + 1):  # F is lower-triangular
                        out += factor[i][j] * w[j]
        self._run(prepared, buffers, total, s, s)  # step s: z_s, as for every item
        self._reserve(self._n + m)
        cols = slice(self._n, self._n + m)
        self._buffers[:, cols] = buffers
        self._total[cols] = total
        self._words[self._n : self._n + m] = prepared.words
        self._n += m

    def _join_factor(self, steps: int) -> tuple[tuple[float, ...], ...]:
        """sigma F, F = :func:`state_factor` (once per step: every item joining then shares it)."""
        cached = getattr(self, "_join_cache", None)
        if cached is None or cached[0] != steps:
            factor = state_factor(self.strategy, steps)
            cached = (steps, tuple(tuple(self.sigma * f for f in row) for row in factor))
            self._join_cache = cached
        return cached[1]

    # -- time ----------------------------------------------------------------
    @overload
    def advance(self, t: int, counts: None = None) -> None: ...
    @overload
    def advance(self, t: int, counts: np.ndarray) -> np.ndarray: ...

    def advance(self, t: int, counts: np.ndarray | None = None) -> np.ndarray | None:
        """Move to time t (> current t), running every step in between.

        With ``counts`` (one per item, in item order), also return ``counts +
        noise()`` as a new float64 array (the tree counter's interface).
        """
        if t <= self.t:
            raise ValueError(f"t must increase: at {self.t}, asked for {t}")
        if t > self.horizon:
            raise ValueError(f"t must be <= horizon ({self.horizon}), got {t}")
        n = self._n
        if counts is not None and counts.shape != (n,):
            raise ValueError(f"counts must have shape ({n},), got {counts.shape}")
        if getattr(self, "_broken", False):
            raise RuntimeError(
                "this BLT noise state was left half-stepped by an error: "
                "rebuild the mechanism (or restore it from a snapshot)"
            )
        if n and t == self.t + 1:
            values = None if counts is None else np.empty(n)
            try:
                self._step(t, counts, values)
            except BaseException:
                # some columns may have taken step t: stepping them again would be wrong
                self._broken = True
                raise
            self.t = t
            return values
        if n:
            self._run(self.prepared, self._buffers[:, :n], self._total[:n], self.t + 1, t)
        self.t = t
        if counts is None:
            return None
        return counts + self._total[:n]

    def _step(self, t: int, counts: np.ndarray | None, values: np.ndarray | None) -> None:
        """Step t for every item, a cache-sized chunk at a time: draw the chunk's z,
        run :func:`stream_step` on its columns and, with ``counts``, write
        ``counts + total`` for them, while the chunk is in cache. The same
        elementwise operations as drawing z for all items first, so the same bits."""
        n, source, sigma = self._n, self.source, self.sigma
        words = self.prepared.words
        buffers, total = self._buffers, self._total
        theta, omega = self._theta, self._omega
        tile = source.tweak_tile(BLT_LEVEL, t, 0, n)
        bounds = kernel.chunk_bounds(n)

        def task(first: int, stop: int) -> None:
            ws = kernel.workspace(kernel.CHUNK_ITEMS)
            for lo, hi in bounds[first:stop]:
                z = ws.f[: hi - lo]  # (the kernel uses ws.f only to accumulate)
                source.noise_chunk(words[lo:hi], tile, "gaussian", sigma, z, False, ws)
                stream_step(theta, omega, buffers[:, lo:hi], total[lo:hi], z)
                if values is not None and counts is not None:  # (both or neither)
                    np.add(counts[lo:hi], total[lo:hi], out=values[lo:hi])

        kernel.run_tasks(len(bounds), task)

    def _run(
        self, prepared: PreparedItems, buffers: np.ndarray, total: np.ndarray, first: int, last: int
    ) -> None:
        """Steps first..last for ``prepared`` (views ``buffers``/``total``), in order."""
        m = len(prepared)
        if m == 0 or last < first:
            return
        per_chunk = max(1, _CHUNK // m)
        s = first
        while s <= last:
            stop = min(last, s + per_chunk - 1)
            addresses = [(BLT_LEVEL, step, 0) for step in range(s, stop + 1)]
            z = self.source.gaussian_values(
                self.source.blocks_many(prepared, addresses), self.sigma
            )
            for row in z:
                stream_step(self._theta, self._omega, buffers, total, row)
            s = stop + 1

    # -- state export ----------------------------------------------------------
    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the buffers (k, items) and running sums (items,): the whole state
        besides t and the prepared ids (for a checkpoint, e.g. Spark's streaming state)."""
        return self._buffers[:, : self._n].copy(), self._total[: self._n].copy()

    @classmethod
    def restore(
        cls,
        source: NoiseSource,
        strategy: BLTStrategy,
        sigma: float,
        prepared: PreparedItems,
        t: int,
        buffers: np.ndarray,
        total: np.ndarray,
    ) -> BLTNoise:
        """Rebuild a BLTNoise at time t from :meth:`state` and the prepared ids.

        The restored object continues bit for bit as the original would (no
        keyed draw is repeated).
        """
        bn = cls(source, strategy, sigma)
        n = len(prepared)
        buffers = np.asarray(buffers, dtype=np.float64)
        total = np.asarray(total, dtype=np.float64)
        if buffers.shape != (strategy.buffers, n) or total.shape != (n,):
            raise ValueError(
                f"state must have shapes ({strategy.buffers}, {n}) and ({n},), "
                f"got {buffers.shape} and {total.shape}"
            )
        if not 0 <= t <= strategy.horizon:
            raise ValueError(f"t must be in [0, {strategy.horizon}], got {t}")
        bn._reserve(n)
        bn._buffers[:, :n] = buffers
        bn._total[:n] = total
        bn._words[:n] = prepared.words
        bn._n = n
        bn.t = int(t)
        return bn

    # -- output ----------------------------------------------------------------
    def noise(self) -> np.ndarray:
        """The current noise of every item (a read-only view, valid until the next call)."""
        view = self._total[: self._n].view()
        view.flags.writeable = False
        return view
