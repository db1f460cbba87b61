"""Continual mechanisms (layer 5): each releases at every time step."""

from .base import Release
from .known import KnownDomainHistogram, TreeCounter
from .unknown import (
    PrivacySplit,
    UnknownDomainHistogram,
    calibrate_unknown_domain,
    discovery_threshold,
)

__all__ = [
    "KnownDomainHistogram",
    "PrivacySplit",
    "Release",
    "TreeCounter",
    "UnknownDomainHistogram",
    "calibrate_unknown_domain",
    "discovery_threshold",
]
