"""Continual mechanisms (layer 5): each releases at every time step."""

from .base import Release
from .known import KnownDomainHistogram, TreeCounter

__all__ = ["KnownDomainHistogram", "Release", "TreeCounter"]
