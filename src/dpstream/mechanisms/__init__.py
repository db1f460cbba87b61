"""Continual mechanisms (layer 5): each releases at every time step."""

from .base import Release
from .known import BLTCounter, KnownDomainHistogram, TreeCounter
from .meta import ONESHOTS, MetaHistogram
from .protocol import ContinualMechanism
from .topk import ContinualTopK, utility_eta
from .unknown import (
    PrivacySplit,
    UnknownDomainHistogram,
    calibrate_unknown_domain,
    discovery_threshold,
)

__all__ = [
    "ONESHOTS",
    "BLTCounter",
    "ContinualMechanism",
    "ContinualTopK",
    "MetaHistogram",
    "utility_eta",
    "KnownDomainHistogram",
    "PrivacySplit",
    "Release",
    "TreeCounter",
    "UnknownDomainHistogram",
    "calibrate_unknown_domain",
    "discovery_threshold",
]
