"""Noise version 2: the ziggurat Gaussian, against its definition and against N(0, 1).

Three kinds of check:

* the shipped table, recomputed at 60 digits (mpmath) and checked for the
  property exactness rests on (256 regions of equal area) and for the fast
  path's bound (exactly, with fractions);
* the values, block by block, against a reference written from the docstring
  of ``dpstream.ziggurat`` with Python integers and scalars (its own AES keys
  by HMAC, its own table reader), through every branch: fast path, tail,
  wedge accepted, restart; and the chunked kernel, threads and accumulation;
* the distribution, by Kolmogorov-Smirnov tests that also reject two broken
  samplers (without the wedge test; with an approximate tail), so the tests
  can fail.
"""

from __future__ import annotations

import decimal
import json
import math
import random
from fractions import Fraction
from importlib import resources

import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtr, ndtri

from dpstream import KnownDomainHistogram, NoiseSource, noise_kernel
from dpstream.noise import (
    NOISE_VERSION,
    check_noise_version,
    purpose_version,
    versioned_purpose,
)
from dpstream.ziggurat import TABLE, normals_into

from .conftest import fixed_key
from .test_noise_kernel import ReferencePRF, as_words, random_address, random_ids, same_bits

RAW = json.loads(resources.files("dpstream").joinpath("data/ziggurat256.json").read_text())
X = [float.fromhex(s) for s in RAW["x"]]
F = [float.fromhex(s) for s in RAW["f"]]
LIMIT = [float.fromhex(s) for s in RAW["fast_limit"]]
R = float.fromhex(RAW["r"])
AREA = float.fromhex(RAW["area"])
TAIL = float.fromhex(RAW["tail_probability"])


# -- the table ----------------------------------------------------------------------------


def test_table_is_the_equal_area_ziggurat():
    """Region i >= 1 is the rectangle [0, x_i] x [f(x_i), f(x_i+1)]; region 0 is
    [0, r] x [0, f(r)] plus the tail. All 256 must have the same area, to the
    rounding of the float64 table (the sampler picks a region uniformly)."""
    assert len(X) == len(F) == 257 and len(LIMIT) == 256
    assert X[1] == R and X[256] == 0.0 and F[256] == 1.0
    assert all(a > b for a, b in zip(X[1:-1], X[2:], strict=True))  # edges decrease to 0
    for i in range(257):
        # f at the edges: F was rounded from f(x) at the exact edge, x from the same
        # edge; exp(-x^2/2) moves by x^2 times x's relative rounding (<= 1.1e-16),
        # plus an ulp or so of each rounding and of libm
        assert math.isclose(F[i], math.exp(-0.5 * X[i] ** 2), rel_tol=(X[i] ** 2 + 4) * 1.2e-16), i
    base = R * math.exp(-0.5 * R * R) + math.sqrt(math.pi / 2) * math.erfc(R / math.sqrt(2))
    assert math.isclose(base, AREA, rel_tol=1e-15)
    assert math.isclose(X[0], AREA / F[1], rel_tol=1e-15)
    # each rectangle's area from the shipped floats. Exact edges give exactly v;
    # rounding x, f_i and f_i+1 to float64 (1.1e-16 relative each) and the
    # subtraction f_i+1 - f_i, which amplifies the errors of f by
    # (f_i + f_i+1) / (f_i+1 - f_i) (about 55 at the top), bound the error
    for i in range(1, 256):
        area = X[i] * (F[i + 1] - F[i])
        amplification = (F[i] + F[i + 1]) / (F[i + 1] - F[i])
        assert abs(area - AREA) / AREA < 1.2e-16 * (4 + amplification), i
    assert math.isclose(TAIL, float(ndtr(-R)), rel_tol=1e-14)


def test_table_matches_a_recomputation_at_60_digits():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    r = mpmath.mpf(R)  # the shipped r, to 60 digits from here on
    f = lambda x: mpmath.exp(-x * x / 2)  # noqa: E731
    v = r * f(r) + mpmath.sqrt(mpmath.pi / 2) * mpmath.erfc(r / mpmath.sqrt(2))
    x = [v / f(r), r]
    for _ in range(2, 256):
        x.append(mpmath.sqrt(-2 * mpmath.log(v / x[-1] + f(x[-1]))))
    # the recursion from the rounded r amplifies its rounding (r is the root of
    # a closure condition); it stays within 1e-12 relative of the shipped edges
    for i in range(256):
        assert abs(x[i] - X[i]) <= 1e-12 * X[i], i
    assert abs(x[255] * (1 - f(x[255])) - v) < 1e-12 * v  # the top region closes


def test_fast_limits_are_exact():
    """k + 1/2 < limit[i] must imply u x_i < x_i+1 exactly (else a point above the
    curve could take the fast path), and the limit must be the largest such double."""
    two53 = Fraction(2**53)
    for i in range(256):
        exact = two53 * Fraction(X[i + 1]) / Fraction(X[i])
        assert Fraction(LIMIT[i]) <= exact < Fraction(math.nextafter(LIMIT[i], math.inf)), i


# -- the values, against a reference ------------------------------------------------------


def below_density_exactly(height: float, x: float) -> bool:
    """height < exp(-x^2/2) for q = -0.5 (x x) in float64, decided with 60 digits."""
    q = -0.5 * (x * x)
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        return decimal.Decimal(height) < decimal.Decimal(q).exp()


class ReferenceV2(ReferencePRF):
    """Version 2 Gaussians from the docstring, per block, with Python scalars."""

    def __init__(self, key, purpose: str) -> None:
        super().__init__(key, purpose)
        import hashlib
        import hmac

        label = b"dpstream/noise/v1/gaussian-retry:" + purpose.encode()
        self.retry_key = hmac.new(key.to_bytes(), label, hashlib.sha256).digest()

    def retry_block(self, block: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        enc = Cipher(algorithms.AES(self.retry_key), modes.ECB()).encryptor()
        return enc.update(block) + enc.finalize()

    def normal(self, block: bytes) -> tuple[float, str]:
        """(value, branch) of one block."""
        w0 = int.from_bytes(block[:8], "little")
        w1 = int.from_bytes(block[8:], "little")
        i, negative, k = w0 & 255, (w0 >> 8) & 1, w0 >> 11
        half_k = float(k) + 0.5
        x = (half_k * 2.0**-53) * X[i]

        def signed(value: float) -> float:
            return -value if negative else value

        if half_k < LIMIT[i]:
            return signed(x), "fast"
        v = (float(w1 >> 11) + 0.5) * 2.0**-53
        if i == 0:
            return signed(-float(ndtri(v * TAIL))), "tail"
        height = F[i] + v * (F[i + 1] - F[i])
        if below_density_exactly(height, x):
            return signed(x), "wedge"
        k2 = int.from_bytes(self.retry_block(block)[:8], "little") >> 11
        return float(ndtri((float(k2) + 0.5) * 2.0**-53)), "restart"


def test_versions_in_purposes():
    assert NOISE_VERSION == 2
    assert versioned_purpose("s/tree@x", 2) == "/v2/s/tree@x"
    assert versioned_purpose("/v2/s/tree@x", 2) == "/v2/s/tree@x"
    assert versioned_purpose("s/tree@x", 1) == "s/tree@x"
    assert purpose_version("/v2/s/tree@x/svt") == 2 and purpose_version("s/tree@x") == 1
    with pytest.raises(ValueError):
        versioned_purpose("/v2/s", 1)
    for bad in (0, 3, True, "2", None):
        with pytest.raises(ValueError):
            check_noise_version(bad)
    key = fixed_key("versions")
    assert NoiseSource(key, "/v2/p").version == 2 and NoiseSource(key, "p").version == 1


def test_every_branch_matches_the_reference(tiny_chunks):
    rng = random.Random(5)
    key = fixed_key("zig-ref")
    purpose = "/v2/test/zig"
    ref, src = ReferenceV2(key, purpose), NoiseSource(key, purpose)
    ids = random_ids(rng, 30_000)
    address = random_address(rng)
    blocks = [ref.block(i, *address) for i in ids]
    want = [ref.normal(b) for b in blocks]
    branches = {
        name: sum(1 for _, b in want if b == name) for name in ("fast", "tail", "wedge", "restart")
    }
    # 30,000 draws: ~98.5% fast, ~0.15% tail (~45), ~1% wedge, restarts ~0.3%:
    # every branch is exercised
    assert all(count > 0 for count in branches.values()), branches
    values = np.array([v for v, _ in want])
    prepared = src.prepare_ids(as_words(ids))
    assert same_bits(src.gaussian(prepared, *address), values)
    assert same_bits(src.gaussian(prepared, *address, scale=0.37), values * 0.37)
    base = np.linspace(-2.0, 2.0, len(ids))
    got = src.draw_into(prepared, *address, scale=3.0, out=base.copy(), accumulate=True)
    assert same_bits(got, base + values * 3.0)
    # the whole-array definition over blocks
    assert same_bits(src.gaussian_values(src.blocks(prepared, *address)), values)


def test_kernel_threads_and_real_chunks_give_the_reference_values():
    rng = random.Random(9)
    key = fixed_key("zig-threads")
    purpose = "/v2/t"
    ref, src = ReferenceV2(key, purpose), NoiseSource(key, purpose)
    n = noise_kernel.CHUNK_ITEMS * 2 + 3
    ids = random_ids(rng, n)
    prepared = src.prepare_ids(as_words(ids))
    address = random_address(rng)
    want = np.array([ref.normal(ref.block(i, *address))[0] for i in ids])
    old = noise_kernel.set_threads(2)
    try:
        assert same_bits(src.gaussian(prepared, *address), want)
    finally:
        noise_kernel.set_threads(old)
    assert same_bits(src.gaussian(prepared, *address), want)


def test_scalar_gaussians_follow_the_version():
    key = fixed_key("zig-scalar")
    v1, v2 = NoiseSource(key, "s"), NoiseSource(key, "/v2/s")
    b1 = v1.scalar_blocks([(0, 0, 3)])
    assert v1.scalar("gaussian", 0, 0, 3, scale=2.0) == float(v1.to_gaussian(b1, 2.0)[0])
    b2 = v2.scalar_blocks([(0, 0, 3)])
    assert v2.scalar("gaussian", 0, 0, 3, scale=2.0) == float(v2.gaussian_values(b2, 2.0)[0])


@pytest.fixture
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(noise_kernel, "CHUNK_ITEMS", 8)


# -- the distribution --------------------------------------------------------------------


def _no_wedge_test(blocks: np.ndarray) -> np.ndarray:
    """A broken sampler: every point of a region accepted (no wedge test, no tail)."""
    w0 = blocks[:, 0]
    i = (w0 & np.uint64(255)).astype(np.int64)
    u = ((w0 >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    x = u * TABLE.x[i]
    return np.where((w0 >> np.uint64(8)) & np.uint64(1), -x, x)


def _independent_retry(seed: int):
    rng = np.random.default_rng(seed)
    return lambda rows: rng.integers(0, 2**64, size=len(rows), dtype=np.uint64)


def test_keyed_normals_pass_kolmogorov_smirnov():
    """2,000,000 keyed draws against N(0, 1).

    The KS statistic of n exact draws exceeds sqrt(ln(2/alpha) / (2n)) with
    probability <= alpha (Dvoretzky-Kiefer-Wolfowitz): at alpha = 1e-6 that is
    0.00190 for n = 2e6; the draws are fixed by the key, so the test either
    always passes or always fails. (The whole-distribution test has little
    power against a small defect; the region tests below have it.)
    """
    n = 2_000_000
    src = NoiseSource(fixed_key("zig-ks"), "/v2/ks")
    ids = np.zeros((n, 2), dtype="<u8")
    ids[:, 0] = np.arange(n, dtype=np.uint64)
    z = src.gaussian(src.prepare_ids(ids), 1, 1, 0)
    bound = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    assert stats.kstest(z, "norm").statistic < bound
    # mean and variance: standard errors 1/sqrt(n) and sqrt(2/n); 6 of them
    assert abs(z.mean()) < 6 / math.sqrt(n)
    assert abs(z.var() - 1) < 6 * math.sqrt(2 / n)


def region_cdf(i: int, x: np.ndarray) -> np.ndarray:
    """P(|Z| <= x) for the value of a block forced into region i >= 1, in closed form.

    The point is uniform in [0, x_i] x [f_i, f_i+1] (f_i = f(x_i)); it is accepted
    when under f, so an accepted abscissa has sub-density
    (min(f(t), f_i+1) - f_i) / (x_i (f_i+1 - f_i)) on [0, x_i]: the constant 1/x_i
    below x_i+1, and (f(t) - f_i) / (x_i df) in the wedge, whose integral uses
    int f = sqrt(pi/2) erf(t / sqrt 2). A rejected point restarts with a fresh
    N(0, 1) value, whose |.| has CDF 2 Phi(x) - 1.
    """
    from scipy.special import erf

    xi, xn, fi, df = X[i], X[i + 1], F[i], F[i + 1] - F[i]

    def accepted(t):
        t = np.minimum(t, xi)
        below = np.minimum(t, xn) / xi
        band = np.maximum(t, xn)
        wedge = (
            math.sqrt(math.pi / 2) * (erf(band / math.sqrt(2)) - erf(xn / math.sqrt(2)))
            - fi * (band - xn)
        ) / (xi * df)
        return below + wedge

    rejected = 1 - float(accepted(np.array(xi)))
    return accepted(x) + rejected * (2 * ndtr(x) - 1)


@pytest.mark.parametrize("region", [1, 60, 200, 255])
def test_a_region_gives_its_closed_form_and_a_sampler_without_the_wedge_test_does_not(region):
    """Blocks forced into one region (the low byte set): |value| against
    :func:`region_cdf`, by KS with the DKW bound at alpha = 1e-6 (n = 400,000:
    0.0043). A sampler that accepts every point of the region (no wedge test)
    gives |value| uniform on [0, x_i]; in the top region, which is all wedge
    (x_256 = 0), the same bound rejects it (in the others the wedge is a thin
    band and 400,000 draws cannot tell)."""
    rng = np.random.default_rng(100 + region)
    n = 400_000
    blocks = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    blocks[:, 0] = (blocks[:, 0] & ~np.uint64(255)) | np.uint64(region)
    z = np.empty(n)
    normals_into(blocks, z, _independent_retry(region))
    bound = math.sqrt(math.log(2 / 1e-6) / (2 * n))

    def cdf(x):
        return region_cdf(region, x)

    assert stats.kstest(np.abs(z), cdf).statistic < bound
    if region == 255:
        assert stats.kstest(np.abs(_no_wedge_test(blocks)), cdf).statistic > bound
    # the sign is bit 8: half of each
    assert abs((z < 0).mean() - 0.5) < 6 * 0.5 / math.sqrt(n)


def test_the_tail_is_the_normal_tail_and_an_approximate_one_is_rejected():
    """Blocks forced into region 0: the values beyond r must follow the normal
    tail, P(|Z| > z) / P(|Z| > r). An exponential tail (r + Exp(rate r), the
    classic approximation before its rejection step) must be rejected. The KS
    bound is the DKW one as above (alpha = 1e-6)."""
    rng = np.random.default_rng(4)
    n = 1_000_000
    blocks = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    blocks[:, 0] &= ~np.uint64(255)  # region 0
    z = np.empty(n)
    normals_into(blocks, z, _independent_retry(1))
    tail = np.abs(z[np.abs(z) > R])
    m = len(tail)
    # P(tail | region 0) = tail area / region area = 2 P(Z > r) * sqrt(pi / 2) / v
    share = TAIL * math.sqrt(2 * math.pi) / AREA
    assert abs(m / n - share) < 6 * math.sqrt(share / n)

    def cdf(x):
        return 1 - ndtr(-x) / TAIL

    bound = math.sqrt(math.log(2 / 1e-6) / (2 * m))
    assert stats.kstest(tail, cdf).statistic < bound
    approx = R + rng.exponential(1 / R, m)
    assert stats.kstest(approx, cdf).statistic > bound


def test_a_retry_that_reuses_the_block_is_detected():
    """The restart must use fresh bits. Feeding back the block's own second word
    (which decided the rejection) biases the result: checked so that the
    independence of the retry key is what the first KS test relies on."""
    rng = np.random.default_rng(8)
    n = 4_000_000
    blocks = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    z = np.empty(n)
    normals_into(blocks, z, lambda rows: rows[:, 1].copy())
    bound = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    assert stats.kstest(z, "norm").statistic > bound
    normals_into(blocks, z, _independent_retry(2))
    assert stats.kstest(z, "norm").statistic < bound


# -- mechanisms ---------------------------------------------------------------------------


def test_mechanisms_draw_version_2_unless_told_and_version_1_is_the_inverse_cdf():
    """Mechanisms draw version 2 (the ziggurat) unless told; ``noise_version=1`` (to go
    on with a stream that began with it) is the inverse-CDF noise: the t = 1 tree
    release is count + sqrt(L) tau ndtri(u) of the leaf cell (1, 1)."""
    key = fixed_key("zig-mech")
    domain = ["a", "b", "c"]
    old = KnownDomainHistogram(
        domain, 64, max_items=1, key=key, rho=1.0, counter="tree", noise_version=1
    )
    new = KnownDomainHistogram(domain, 64, max_items=1, key=key, rho=1.0, counter="tree")
    assert new.noise_version == 2 and new.tree_purpose.startswith("/v2/")
    assert old.noise_version == 1 and old.tree_purpose == new.tree_purpose[len("/v2/") :]
    counts = np.array([3, 0, 7])
    r_old, r_new = old.release(1, counts), new.release(1, counts)
    src = NoiseSource(key, old.tree_purpose)
    blocks = src.blocks(src.prepare(domain), 1, 1, 0)
    want = counts + NoiseSource.to_gaussian(blocks, old.sigma)
    assert same_bits(r_old.values, want)
    v2 = NoiseSource(key, new.tree_purpose)
    want2 = counts + v2.gaussian_values(v2.blocks(v2.prepare(domain), 1, 1, 0), new.sigma)
    assert same_bits(r_new.values, want2)
    assert not np.array_equal(r_old.values, r_new.values)


def _wedge_block(region: int, k: int, nudge: int) -> np.ndarray:
    """A block in ``region`` with 53-bit integer k whose wedge height lands within
    a few ulps of f(x): v solved from height = f(x), then moved by ``nudge`` steps
    of 2^-53."""
    x = ((k + 0.5) * 2.0**-53) * X[region]
    v = (math.exp(-0.5 * (x * x)) - F[region]) / (F[region + 1] - F[region])
    k1 = int(v * 2.0**53 - 0.5) + nudge
    return np.array([[(k << 11) | region, k1 << 11]], dtype=np.uint64)


def test_a_close_wedge_test_is_decided_the_same_whatever_the_last_bit_of_exp(monkeypatch):
    """Points whose height is within an ulp or so of f(x): the value must follow the
    exact decision, with NumPy's exp as it is and with exp moved one ulp up or down
    (what another CPU's SIMD exp may return)."""
    import dpstream.ziggurat as zig

    region = 200
    limit = LIMIT[region]
    ks = [int(limit) + d for d in (5, 1000, 123_456)]  # just past the fast path
    # one 2^-53 step of v moves the height by (f_i+1 - f_i) 2^-53, ~1/170 of an ulp
    # of f here: steps of 170 put heights about -3..+3 ulps around f(x)
    blocks = np.concatenate(
        [_wedge_block(region, k, nudge) for k in ks for nudge in range(-510, 511, 170)]
    )

    def restart(rows):
        return np.full(len(rows), 7 << 11, dtype=np.uint64)

    results = []
    for shift in (None, np.inf, -np.inf):
        if shift is not None:
            monkeypatch.setattr(zig, "_exp", lambda q, s=shift: np.nextafter(np.exp(q), s))
        z = np.empty(len(blocks))
        normals_into(blocks, z, restart)
        results.append(z)
    assert same_bits(results[0], results[1]) and same_bits(results[0], results[2])
    # and each agrees with the exact decision
    restart_value = float(ndtri(((7 << 11 >> 11) + 0.5) * 2.0**-53))
    decided = set()
    for (w0, w1), z in zip(blocks.tolist(), results[0].tolist(), strict=True):
        k = w0 >> 11
        x = ((k + 0.5) * 2.0**-53) * X[region]
        v = ((w1 >> 11) + 0.5) * 2.0**-53
        height = F[region] + v * (F[region + 1] - F[region])
        accepted = below_density_exactly(height, x)
        decided.add(accepted)
        assert z == (x if accepted else restart_value)
    assert decided == {True, False}  # both sides of the curve were tested
