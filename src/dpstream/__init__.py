"""dpstream: differentially private histograms and top-k lists under continual observation.

Implements the mechanisms of Cardoso and Rogers, "Differentially Private
Histograms under Continual Observation: Streaming Selection into the Unknown".
The layers are described in docs/architecture.md; the public names are
re-exported here.

The names are loaded when first used (PEP 562), so that ``import dpstream``
(and the command line's ``--help``) does not pay for NumPy and SciPy until a
mechanism is asked for; ``from dpstream import X``, ``dpstream.X``, ``__all__``
and ``dir(dpstream)`` work as for an eager import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

if TYPE_CHECKING:
    from . import factorization, noise, oneshot, privacy, tree
    from .errors import (
        BudgetExhaustedError,
        DPStreamError,
        HorizonExceededError,
        InvalidEventError,
        InvalidItemError,
        StateError,
    )
    from .mechanisms import (
        BLTCounter,
        ContinualTopK,
        KnownDomainHistogram,
        MetaHistogram,
        Release,
        TreeCounter,
        UnknownDomainHistogram,
    )
    from .noise import NoiseKey, NoiseSource
    from .postprocess import ReadableCounts
    from .privacy import PrivacyGuarantee

#: Each public name and the module it comes from (a module itself when the name is its own).
_WHERE = {
    "BudgetExhaustedError": ".errors",
    "DPStreamError": ".errors",
    "HorizonExceededError": ".errors",
    "InvalidEventError": ".errors",
    "InvalidItemError": ".errors",
    "StateError": ".errors",
    "BLTCounter": ".mechanisms",
    "ContinualTopK": ".mechanisms",
    "KnownDomainHistogram": ".mechanisms",
    "MetaHistogram": ".mechanisms",
    "Release": ".mechanisms",
    "TreeCounter": ".mechanisms",
    "UnknownDomainHistogram": ".mechanisms",
    "NoiseKey": ".noise",
    "NoiseSource": ".noise",
    "ReadableCounts": ".postprocess",
    "PrivacyGuarantee": ".privacy",
    "release_frame": ".frames",
    "factorization": ".factorization",
    "noise": ".noise",
    "oneshot": ".oneshot",
    "privacy": ".privacy",
    "tree": ".tree",
}

__all__ = [
    "BLTCounter",
    "BudgetExhaustedError",
    "ContinualTopK",
    "DPStreamError",
    "HorizonExceededError",
    "InvalidEventError",
    "InvalidItemError",
    "KnownDomainHistogram",
    "MetaHistogram",
    "NoiseKey",
    "NoiseSource",
    "PrivacyGuarantee",
    "ReadableCounts",
    "Release",
    "StateError",
    "TreeCounter",
    "UnknownDomainHistogram",
    "factorization",
    "noise",
    "release_frame",
    "oneshot",
    "privacy",
    "tree",
]


def __getattr__(name: str) -> Any:
    """Load a public name (or any submodule, ``dpstream.bounding``) on first use."""
    where = _WHERE.get(name)
    if where is None:
        if name.startswith("__"):  # a probe for a dunder (copy, pickle, doctest): no such module
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:  # a submodule not imported yet, as an eager package would have done
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module = importlib.import_module(where, __name__)
    value = module if where == f".{name}" else getattr(module, name)
    globals()[name] = value  # later look-ups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
