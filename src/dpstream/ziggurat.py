"""Standard normals from pseudorandom blocks by the ziggurat method (noise version 2).

Layer 2, used by :mod:`dpstream.noise` and :mod:`dpstream.noise_kernel`.
Noise version 1 turns a 53-bit uniform into a normal with the inverse CDF
(``scipy.special.ndtri``), which costs ~9 ns a value, more than AES and all
the rest of a keyed draw together. The ziggurat of Marsaglia and Tsang
("The ziggurat method for generating random variables", J. Stat. Softw.
2000) is an exact method, not an approximation: it covers the density
f(x) = exp(-x^2/2) on x >= 0 with 256 regions of equal area (a base region
holding the tail, and 255 rectangles), picks a region and a point in it
uniformly, and returns the point's abscissa when the point lies under the
curve. Nearly 99% of the time the point lies in the part of a rectangle that
is entirely under the curve, and one multiplication and one comparison
decide; NumPy evaluates that for a whole chunk with a few vector passes.

One value from one 128-bit block ``(w0, w1)``, whose bits are uniform and
independent (they come from the PRF):

* region ``i = w0 & 255``, sign from bit 8 of w0, and the 53-bit uniform
  ``u = ((w0 >> 11) + 1/2) 2^-53`` (the version 1 uniform, bits 11..63; the
  top word's u rounds to 1, which is harmless here: a point on the region's
  outer edge, decided by the tests below like any other);
* ``x = u * X[i]``; if ``(w0 >> 11) + 1/2 < fast_limit[i]``, the largest
  double below ``2^53 X[i+1] / X[i]``, then ``x < X[i+1]`` exactly, the point
  is under the curve, and the value is ``+-x`` (fast path);
* otherwise, with the second uniform ``v`` from w1 (same formula):

  - region 0 (x beyond r = X[1]): the value is ``+-x`` with x drawn from
    the tail beyond r by its inverse CDF, ``x = -ndtri(v P(Z > r))``;
  - region i >= 1 (the point is in the rectangle's part that the curve
    cuts): the point's height is ``y = f(X[i]) + v (f(X[i+1]) - f(X[i]))``;
    if ``y < f(x)`` the value is ``+-x`` (decided as in exact arithmetic: see
    :func:`_below_density`, so that a machine whose ``exp`` differs in the
    last bit decides the same);
  - else the point lies above the curve, and the ziggurat would start again
    with fresh bits. Here the fresh bits are one more block, the AES of this
    block under a separate key of the purpose (``retry``), turned into a
    normal by the exact inverse CDF. That is the same distribution: a
    restart returns a fresh N(0, 1) value whatever method draws it.

So the value is N(0, 1) up to the float64 rounding of the shipped table
(computed at 60 digits, ``data/ziggurat256.json``) and of the operations.
The regions the float64 table describes have equal areas to within 2e-14
relative (the top ones lose digits in ``f(X[i+1]) - f(X[i])``; see
``tests/test_ziggurat.py``), which bounds the total variation distance of
the values from N(0, 1) by about that much: far below any delta a release
uses, and the same standard as version 1's inverse CDF, whose values carry
the rounding of ``ndtri``. Every value is a pure function of its block,
and every operation is elementwise, so a chunk of items gives the same bits
as the whole batch. The values use IEEE-rounded arithmetic, the table and
SciPy's ``ndtri`` (the same code on every CPU of one SciPy build); the one
call whose last bit depends on the CPU, NumPy's ``exp``, only takes part in a
comparison that is decided exactly when it is close.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable
from importlib import resources

import numpy as np

from . import compiled
from .special import ndtri

__all__ = ["LAYERS", "Table", "TABLE", "UNIFORM_MAX", "normals_into", "uniforms_from_words"]

LAYERS = 256
_INDEX_BITS = np.uint64(2 * LAYERS - 1)  # region (8 bits) and sign (bit 8)
_LAYER_BITS = np.uint64(LAYERS - 1)
_SHIFT = np.uint64(11)
_TWO_POW_MINUS_53 = 2.0**-53


class Table:
    """The shipped ziggurat (``data/ziggurat256.json``) and the lookup tables built from it.

    ``x``, ``f``: the 257 region edges and f at them; ``fast_limit``: per
    region, the bound on ``k + 1/2`` below which the point is under the curve.
    For the vector passes, the sign bit joins the region index (9 bits,
    ``j = w0 & 511``): ``scaled[j] = +-x[j & 255] 2^-53`` (minus for j >= 256;
    scaling by a power of two is exact) and ``limit[j] = fast_limit[j & 255]``.
    """

    __slots__ = (
        "x",
        "f",
        "fast_limit",
        "r",
        "area",
        "tail_probability",
        "scaled",
        "limit",
        "bottom",
        "rise",
    )

    def __init__(self, data: dict) -> None:
        if data.get("layers") != LAYERS:
            raise ValueError(f"the ziggurat table must have {LAYERS} layers")
        x = np.array([float.fromhex(s) for s in data["x"]])
        f = np.array([float.fromhex(s) for s in data["f"]])
        limit = np.array([float.fromhex(s) for s in data["fast_limit"]])
        if x.shape != (LAYERS + 1,) or f.shape != (LAYERS + 1,) or limit.shape != (LAYERS,):
            raise ValueError("the ziggurat table must have 257 edges and 256 limits")
        self.x, self.f, self.fast_limit = x, f, limit
        self.r = float.fromhex(data["r"])
        self.area = float.fromhex(data["area"])
        self.tail_probability = float.fromhex(data["tail_probability"])
        scaled = x[:LAYERS] * _TWO_POW_MINUS_53
        self.scaled = np.concatenate([scaled, -scaled])
        self.limit = np.concatenate([limit, limit])
        # a region's height range: from f(x[i]) (its bottom) up by f(x[i+1]) - f(x[i])
        self.bottom = f[:LAYERS].copy()
        self.rise = f[1:] - f[:LAYERS]


def _load() -> Table:
    text = resources.files("dpstream").joinpath("data/ziggurat256.json").read_text("ascii")
    return Table(json.loads(text))


TABLE = _load()


#: The largest double below 1. ``k + 1/2`` needs 54 bits for k >= 2^52, so it is
#: rounded (to even), and the top k = 2^53 - 1 would round to 2^53: u = 1.0,
#: where the inverse CDFs are infinite. That one word gives this value instead.
UNIFORM_MAX = 1.0 - 2.0**-53


def uniforms_from_words(
    words: np.ndarray, out: np.ndarray | None = None, shifted: np.ndarray | None = None
) -> np.ndarray:
    """``min(((w >> 11) + 1/2) 2^-53, UNIFORM_MAX)`` for 64-bit words: uniforms
    strictly inside (0, 1). The one definition of the uniform (the C loops' twin
    is ``uniform53``). ``shifted``: optional uint64 scratch for ``w >> 11``."""
    k = np.right_shift(words, _SHIFT, out=shifted)
    if out is None:
        out = np.empty(k.shape)
    # < 2^53: exact as int64 (which converts a little faster than uint64), then
    # rounded
    np.add(k.view(np.int64), 0.5, out=out)
    np.multiply(out, _TWO_POW_MINUS_53, out=out)
    np.minimum(out, UNIFORM_MAX, out=out)
    return out


def normals_into(
    blocks: np.ndarray,
    out: np.ndarray,
    retry: Callable[[np.ndarray], np.ndarray],
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """Write one N(0, 1) value per 128-bit block into ``out`` (see the module doc).

    ``blocks``: (c, 2) uint64; ``out``: c contiguous float64. ``retry(rows)``
    gets the (k, 2) blocks whose point fell above the curve and returns k
    64-bit words, independent of everything else (the AES of each block under
    the purpose's retry key). ``scratch``: optional (uint64, int64, float64)
    buffers of at least c values, so a kernel chunk allocates nothing.
    """
    c = blocks.shape[0]
    t = TABLE
    if c >= compiled.MIN_ITEMS:
        if scratch is None:
            pending, close = np.empty(c, np.int64), np.empty(c, np.int64)
        else:
            pending, close = scratch[1][:c], scratch[0][:c].view(np.int64)
        counts = compiled.ziggurat(blocks, out, t, pending, close)
        if counts is not None:
            n_restart, n_tail, n_close = counts
            if n_tail:
                tail = pending[c - n_tail :]
                v = uniforms_from_words(blocks[tail, 1])
                out[tail] = np.copysign(-ndtri(v * t.tail_probability), out[tail])
            if n_close:
                near = close[:n_close]
                layer = (blocks[near, 0] & _LAYER_BITS).view(np.int64)
                _slow_path(blocks, out, layer, near, retry)
            if n_restart:
                _restart(blocks, out, pending[:n_restart], retry)
            return
    if scratch is None:
        k_buf, j_buf, g_buf = np.empty(c, np.uint64), np.empty(c, np.int64), np.empty(c)
    else:
        k_buf, j_buf, g_buf = scratch[0][:c], scratch[1][:c], scratch[2][:c]
    w0 = blocks[:, 0]
    # j: region (bits 0..7) and sign (bit 8); out: k + 1/2 for the 53-bit k (bits 11..63)
    np.bitwise_and(w0, _INDEX_BITS, out=j_buf.view(np.uint64))
    np.right_shift(w0, _SHIFT, out=k_buf)
    np.add(k_buf.view(np.int64), 0.5, out=out)
    np.take(t.limit, j_buf, out=g_buf)
    slow = np.flatnonzero(np.greater_equal(out, g_buf))
    # x = +-u x[i], u = (k + 1/2) 2^-53
    np.take(t.scaled, j_buf, out=g_buf)
    np.multiply(out, g_buf, out=out)
    if slow.size:
        _slow_path(blocks, out, j_buf[slow] & (LAYERS - 1), slow, retry)


def _slow_path(
    blocks: np.ndarray,
    out: np.ndarray,
    layer: np.ndarray,
    slow: np.ndarray,
    retry: Callable[[np.ndarray], np.ndarray],
) -> None:
    """The points outside the fast part of their region: tail, wedge test, restart.

    ``out[slow]`` holds their ``+-u x[i]``, ``layer`` their regions.
    """
    t = TABLE
    signed = out[slow]
    x = np.abs(signed)
    v = uniforms_from_words(blocks[slow, 1])
    in_tail = layer == 0
    # region 0: a fresh draw from the tail beyond r, by its inverse CDF
    x = np.where(in_tail, -ndtri(v * t.tail_probability), x)
    # regions 1..255: the point's height, under the curve or not
    height = t.bottom[layer] + v * t.rise[layer]
    under = in_tail | _below_density(height, x)
    out[slow] = np.copysign(x, signed)
    if not under.all():
        _restart(blocks, out, slow[~under], retry)


def _restart(
    blocks: np.ndarray,
    out: np.ndarray,
    restart: np.ndarray,
    retry: Callable[[np.ndarray], np.ndarray],
) -> None:
    """The points above the curve: a fresh normal each, from the retry key's block."""
    words = retry(np.ascontiguousarray(blocks[restart]))
    if not compiled.ziggurat_restarts(words, restart, out):  # the same, with the ufunc
        out[restart] = ndtri(uniforms_from_words(words))


#: exp over an array: NumPy's, which picks a SIMD implementation for the CPU at run
#: time (AVX-512 and the portable code can differ in the last bit). A module global
#: so that tests can swap in another last bit.
_exp = np.exp
#: How close (in units in the last place of f(x)) the height must come to the
#: computed f(x) before the test is decided in decimal: then any two exp that are
#: each within 2 ulps of the true value decide the other points the same way.
_CLOSE_ULPS = 4
_DECIMAL_DIGITS = 50


def _below_density(height: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``height < exp(-x^2 / 2)``, decided as in exact arithmetic.

    ``q = -0.5 (x x)`` is IEEE-exact-rounded, so the same on every machine;
    ``exp(q)`` is not (see :data:`_exp`). Where the height is within
    :data:`_CLOSE_ULPS` ulps of the computed exp (about one point in 10^15 of
    the ~1% that reach this test), the comparison is redone with a correctly
    rounded 50-digit ``decimal`` exp, so every machine decides the same way.
    """
    q = -0.5 * (x * x)
    e = _exp(q)
    below = height < e
    close = np.flatnonzero(np.abs(height - e) <= _CLOSE_ULPS * np.spacing(e))
    if close.size:
        with decimal.localcontext() as ctx:
            ctx.prec = _DECIMAL_DIGITS
            for i in close.tolist():
                below[i] = decimal.Decimal(float(height[i])) < decimal.Decimal(float(q[i])).exp()
    return below
