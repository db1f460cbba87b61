"""One frozen settings value per mechanism, shared by the local and the Spark classes.

``from_params`` must build exactly what the keyword constructor builds: the same
noise purpose (so the same noise), the same guarantee, and the same releases on
the same events; the Spark twins (tests/test_spark.py) are built from the same
value.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpstream import ContinualTopK, KnownDomainHistogram, UnknownDomainHistogram
from dpstream.mechanisms.params import HistogramParams, TopKParams, UnknownParams

from .conftest import fixed_key

KEY = fixed_key("params")
DOMAIN = [f"w{i}" for i in range(20)]
STEPS = [[["w1", "w2"], ["w3"]], [], [["w1"], ["w19", "w2"]], [["w5"]]]


def _releases(mech, steps=STEPS):
    return [mech.step_batch(events) for events in steps]


def _same_release(a, b) -> None:
    assert a.t == b.t
    assert list(a.items) == list(b.items)
    assert np.array_equal(a.values, b.values)  # the same noise, bit for bit


@pytest.mark.parametrize(
    "settings",
    [
        dict(horizon=8, max_items=2, rho=0.5),
        dict(horizon=8, max_items=2, epsilon=1.0, delta=1e-6, counter="tree", stream="s"),
        dict(horizon=None, max_items=2, rho=0.3),
        dict(horizon=16, rho=1.0, max_items_per_user=2, max_count_per_item=1),
    ],
)
def test_known_from_params_is_the_keyword_constructor(settings) -> None:
    params = HistogramParams(**settings)
    a = KnownDomainHistogram.from_params(DOMAIN, params, key=KEY)
    b = KnownDomainHistogram(DOMAIN, settings.pop("horizon"), key=KEY, **settings)
    assert a.privacy == b.privacy and a.noise_purpose == b.noise_purpose
    if a.user_bounds is None:
        for ra, rb in zip(_releases(a), _releases(b), strict=True):
            _same_release(ra, rb)


@pytest.mark.parametrize(
    "settings",
    [
        dict(horizon=8, max_items=2, epsilon=1.0, delta=1e-6),
        dict(horizon=8, max_items=2, rho=0.5, threshold_delta=1e-5, remember=True),
        dict(horizon=None, max_items=2, rho=0.5, threshold_delta=1e-6, counter="blt"),
    ],
)
def test_unknown_from_params_is_the_keyword_constructor(settings) -> None:
    params = UnknownParams(**settings)
    a = UnknownDomainHistogram.from_params(params, key=KEY)
    b = UnknownDomainHistogram(settings.pop("horizon"), key=KEY, **settings)
    assert a.privacy == b.privacy and a.noise_purpose == b.noise_purpose
    for ra, rb in zip(_releases(a), _releases(b), strict=True):
        _same_release(ra, rb)


def test_top_k_from_params_is_the_keyword_constructor() -> None:
    params = TopKParams(horizon=8, k=2, switches=2, epsilon=1.0, delta=1e-6)
    a = ContinualTopK.from_params(DOMAIN, params, key=KEY)
    b = ContinualTopK(DOMAIN, 8, k=2, switches=2, epsilon=1.0, delta=1e-6, key=KEY)
    assert a.privacy == b.privacy and a.noise_scope == b.noise_scope
    for ra, rb in zip(_releases(a), _releases(b), strict=True):
        _same_release(ra, rb)


def test_params_are_frozen_and_name_the_constructor_arguments() -> None:
    import inspect

    p = UnknownParams(horizon=10, max_items=2, rho=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rho = 2.0  # type: ignore[misc]
    assert dataclasses.replace(p, rho=2.0).rho == 2.0 and p.rho == 1.0
    for cls, params in [
        (KnownDomainHistogram, HistogramParams),
        (UnknownDomainHistogram, UnknownParams),
        (ContinualTopK, TopKParams),
    ]:
        names = set(inspect.signature(cls).parameters)
        fields = {f.name for f in dataclasses.fields(params)}
        assert fields <= names, (cls.__name__, fields - names)  # every field is an argument
    assert "horizon" not in HistogramParams(horizon=4).kwargs()
    assert "horizon" not in TopKParams(horizon=4, k=1, switches=1).kwargs()
