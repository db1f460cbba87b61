"""One-shot mechanisms (layer 4): the paper's Table 1, applied to one histogram.

MetaHistogram applies them to every cell of the tree; they are also useful on
their own, e.g. for a single private top-k over a day's counts.
"""

from .common import OneShotRelease
from .known import (
    gaussian_histogram,
    gaussian_histogram_privacy,
    gumbel_top_k,
    gumbel_top_k_privacy,
)
from .unknown import (
    UnknownDomainResult,
    unknown_domain_gaussian,
    unknown_domain_gaussian_privacy,
    unknown_domain_gumbel,
    unknown_domain_gumbel_privacy,
)

__all__ = [
    "OneShotRelease",
    "gaussian_histogram",
    "gaussian_histogram_privacy",
    "gumbel_top_k",
    "gumbel_top_k_privacy",
    "UnknownDomainResult",
    "unknown_domain_gaussian",
    "unknown_domain_gaussian_privacy",
    "unknown_domain_gumbel",
    "unknown_domain_gumbel_privacy",
]
