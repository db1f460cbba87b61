"""Every mechanism the command line builds is a ContinualMechanism, with each declared
attribute present and of the declared type (the edges read them without probing)."""

from __future__ import annotations

import json
import math

import pytest

from dpstream.bounding import UserBounds
from dpstream.factorization import BLTStrategy
from dpstream.mechanisms import ContinualMechanism
from dpstream.mechanisms.histogram_topk import HistogramTopK, UnknownTopK
from dpstream.privacy import PrivacyGuarantee
from dpstream.registry import MECHANISMS, build_mechanism
from dpstream.tree import worst_case_variance_factor

from .conftest import fixed_key

KEY = fixed_key("protocol")
WORDS = [f"w{i}" for i in range(12)]
_BASE = {"horizon": 16, "stream": "s", "rho": 1.0}
_UNK = {"threshold_delta": 1e-6}

#: (--mechanism, options, with the domain): every class and counter the command line builds.
CONFIGS = {
    "known-tree": ("known", {"max_items": 2, "counter": "tree"}, True),
    "known-blt": ("known", {"max_items": 2, "counter": "blt"}, True),
    "known-unbounded": ("known", {"max_items": 2, "horizon": None}, True),
    "known-users": ("known", {"max_items_per_user": 2, "max_count_per_item": 2}, True),
    "unknown-tree": ("unknown", {"max_items": 2, "counter": "tree", **_UNK}, False),
    "unknown-blt": ("unknown", {"max_items": 2, "counter": "blt", **_UNK}, False),
    "unknown-unbounded": ("unknown", {"max_items": 2, "horizon": None, **_UNK}, False),
    "top-k": ("top-k", {"k": 2}, True),
    "top-k-blt": ("top-k", {"k": 2, "counter": "blt"}, True),
    "top-k-max-items": ("top-k", {"k": 2, "max_items": 1}, True),
    "meta-gaussian": ("meta", {"oneshot": "gaussian", "max_items": 2}, True),
    "meta-gumbel": ("meta", {"oneshot": "gumbel", "k": 2}, True),
}

#: The attributes of ContinualMechanism and the types their values have at run time.
TYPES = {
    "horizon": (int,),
    "t": (int,),
    "privacy": (PrivacyGuarantee,),
    "accepts_columns": (bool,),
    "counter": (str, type(None)),
    "strategy": (BLTStrategy, type(None)),
    "unbounded": (bool,),
    "user_bounds": (UserBounds, type(None)),
    "noise_std_worst": (float,),
    "noise_version": (int,),
}


def _built(name):
    mech, opts, with_domain = CONFIGS[name]
    return build_mechanism(mech, {**_BASE, **opts}, KEY, WORDS if with_domain else None)


def _instances():
    yield from ((name, _built(name)) for name in CONFIGS)
    # top-k with --max-items builds one of three classes: each one directly as well
    yield "KnownBase top-k", HistogramTopK(WORDS, 16, k=2, max_items=1, key=KEY, rho=1.0)
    yield (
        "UnkBase top-k",
        UnknownTopK(WORDS, 16, k=2, max_items=1, key=KEY, rho=1.0, threshold_delta=1e-6),
    )


def test_configs_cover_every_registered_mechanism():
    assert {mech for mech, _, _ in CONFIGS.values()} == set(MECHANISMS)


@pytest.mark.parametrize(("name", "mech"), list(_instances()))
def test_every_built_mechanism_meets_the_protocol(name, mech):
    assert isinstance(mech, ContinualMechanism), name
    for attr, types in TYPES.items():
        value = getattr(mech, attr)
        assert isinstance(value, types), (name, attr, type(value))
    assert callable(mech.step) and callable(mech.step_batch)
    assert mech.counter in (None, "tree", "blt")
    assert (mech.strategy is not None) == (mech.counter == "blt") or mech.counter is None
    assert math.isfinite(mech.noise_std_worst) and mech.noise_std_worst > 0
    # the declared values are the ones a step uses: t advances, the run goes on
    mech.step_batch([("u1", ["w1"])] if mech.user_bounds is not None else [["w1"], ["w2"]])
    assert mech.t == 1


def test_meta_noise_std_worst_is_the_tree_closed_form():
    """MetaAlgo's worst-step std: tau sqrt(worst-case variance factor of its tree), the
    number ``plan`` and the sidecar stated before it was an attribute."""
    mech = _built("meta-gaussian")
    expected = float(mech.tau) * math.sqrt(worst_case_variance_factor(mech.horizon, mech.base))
    assert mech.noise_std_worst == expected


def test_an_object_missing_a_declared_attribute_is_not_a_continual_mechanism():
    mech = _built("meta-gumbel")

    class Partial:
        horizon, t, privacy, counter, strategy = mech.horizon, 0, mech.privacy, None, None
        unbounded, user_bounds, noise_std_worst = False, None, 1.0
        step = step_batch = mech.step  # no accepts_columns

    assert not isinstance(Partial(), ContinualMechanism)


def test_run_over_a_histogram_top_k_output_keeps_its_noise_version(tmp_path):
    """``-m top-k --max-items`` picking KnownBase's top-k records the noise version that
    drew it; a ``--force`` run over that output reads it back and so draws the same
    noise, rather than publishing the same steps again with independent noise (the
    sidecar used to say version 1 for a version-2 stream)."""
    from dpstream.cli import main
    from dpstream.run.meta import read_run_meta, sidecar_path

    key_path = tmp_path / "k.key"
    KEY.save(key_path)
    domain = tmp_path / "domain.txt"
    domain.write_text("\n".join(WORDS[:6]) + "\n")
    events = tmp_path / "ev.jsonl"
    events.write_text(
        "".join(
            json.dumps({"t": t, "items": [WORDS[t % 6], WORDS[(t + 1) % 6]]}) + "\n"
            for t in range(1, 31)
            for _ in range(3)
        )
    )
    out = tmp_path / "out.jsonl"
    args = ["run", "--quiet", "-m", "top-k", "-T", "40", "--domain", str(domain), "--k", "2"]
    args += ["--max-items", "2", "--rho", "1", "--key-file", str(key_path), "-i", str(events)]
    assert main([*args, "-o", str(out)]) == 0
    meta = read_run_meta(sidecar_path(out))
    assert meta["algorithm"] == "KnownBase top-k"
    assert meta["noise_version"] == 2
    first = out.read_text()
    assert main([*args, "-o", str(out), "--force"]) == 0
    assert out.read_text() == first
