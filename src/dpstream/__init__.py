"""dpstream: differentially private histograms and top-k lists under continual observation.

Implements the mechanisms of Cardoso and Rogers, "Differentially Private
Histograms under Continual Observation: Streaming Selection into the Unknown".
The layers are described in docs/architecture.md; the public names are
re-exported here.
"""

from . import factorization, noise, oneshot, privacy, tree
from ._version import __version__ as __version__
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


def __getattr__(name: str) -> object:
    """``release_frame`` is imported on first use (it brings the command's modules;
    importing dpstream imports neither them nor pandas or polars). It is imported by
    name: the root only re-exports, and a static import here would close a loop with the
    Spark worker check, which imports ``dpstream`` itself (tests/test_imports.py)."""
    if name == "release_frame":
        import importlib

        return importlib.import_module(f"{__name__}.frames").release_frame
    raise AttributeError(f"module 'dpstream' has no attribute {name!r}")
