"""Bytes per item of the mechanisms' state (tracemalloc): the compact layouts stay
compact.

Not a benchmark (``bench/bench_memory.py`` is): a guard against a change that
brings back a Python object per item. Bound derivation, for 20,000 items named
``"item-00000"``...: KnownBase (BLT, 4 buffers) keeps 60 bytes of NumPy state
per item (16-byte prepared id, 4 buffers and a running total, the int32 count)
and its item table ~10 bytes of text, 8 of offset and 13 of slots (32,768 slots at
most 4/5 full): ~91. SparseGumb: 16 + 8 + ~31 = ~55. A str object per item is
~59 bytes and a dict entry with its boxed position ~70 more, so the plain
layout (a list and a dict, the NumPy-only fallback) lands near 180 and 140
(measured: 184 and 144, against 95 and 56 compact): the bounds below (140 and
100) sit between, and the fallback is measured too, so the test can fail.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import dpstream as dps
from dpstream import compiled

from .conftest import fixed_key

N = 20_000


def per_item(build) -> float:
    build()  # warm-up: imports and caches of the settings (a fitted BLT) are not per item
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        mech = build()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert mech is not None
    return held / N


def known():
    m = dps.KnownDomainHistogram(
        [f"item-{i:05d}" for i in range(N)], 1000, max_items=1, key=fixed_key("mem"), rho=1.0
    )
    m.step_batch([["item-00001"]])
    return m


def topk():
    m = dps.ContinualTopK(
        [f"item-{i:05d}" for i in range(N)],
        1000,
        k=10,
        switches=5,
        eta=1.0,
        key=fixed_key("mem"),
        rho=1.0,
    )
    m.step_batch([["item-00001"]])
    return m


@pytest.mark.skipif(not compiled.enabled(), reason="no compact table without the C loops")
@pytest.mark.parametrize("build, bound", [(known, 140), (topk, 100)])
def test_known_domains_keep_no_python_object_per_item(build, bound):
    compact = per_item(build)
    with compiled.numpy_only():
        plain = per_item(build)
    assert compact < bound < plain, (compact, plain)
