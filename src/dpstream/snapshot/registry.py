"""The classes a snapshot may hold, by a stable name.

Layer 6 of dpstream (an edge; :mod:`dpstream.snapshot`). Loading a snapshot builds
only these classes (and the plain types of :mod:`.format`), so a snapshot is data,
never code.
"""

from __future__ import annotations

from ..bounding import BoundingStats, ContributionBounder, UnitBound, UserBounds, UserHasher
from ..factorization import BLTStrategy
from ..mechanisms.base import EventLimit, TruncationStats
from ..mechanisms.blt_noise import BLTNoise
from ..mechanisms.histogram_topk import HistogramTopK
from ..mechanisms.item_table import ItemTable, TableItems
from ..mechanisms.known import BLTCounter, KnownDomainHistogram, TreeCounter
from ..mechanisms.meta import MetaHistogram
from ..mechanisms.topk import ContinualTopK
from ..mechanisms.tree_noise import TreeNoise, _Segment
from ..mechanisms.unknown import PrivacySplit, UnknownDomainHistogram
from ..mechanisms.user_bounder import ColumnBounder
from ..mechanisms.users import UserLevel
from ..noise import PreparedItems
from ..postprocess import ReadableCounts
from ..privacy import Budget, PrivacyGuarantee

__all__ = ["REGISTRY"]

#: The classes a snapshot may hold, by a stable name (the name is what the header
#: says; a class may move or be renamed without changing it). Every type that
#: ``dpstream run --state`` saves: the mechanisms of ``--mechanism`` with their
#: noise, item tables, user-level bounds, and the readable-counts publisher.
REGISTRY: dict[str, type[object]] = {
    "KnownDomainHistogram": KnownDomainHistogram,
    "UnknownDomainHistogram": UnknownDomainHistogram,
    "ContinualTopK": ContinualTopK,
    "HistogramTopK": HistogramTopK,
    "MetaHistogram": MetaHistogram,
    "TreeCounter": TreeCounter,
    "BLTCounter": BLTCounter,
    "TreeNoise": TreeNoise,
    "TreeNoise.Segment": _Segment,
    "BLTNoise": BLTNoise,
    "BLTStrategy": BLTStrategy,
    "PreparedItems": PreparedItems,
    "ItemTable": ItemTable,
    "TableItems": TableItems,
    "EventLimit": EventLimit,
    "TruncationStats": TruncationStats,
    "PrivacySplit": PrivacySplit,
    "UserLevel": UserLevel,
    "UserBounds": UserBounds,
    "UnitBound": UnitBound,
    "UserHasher": UserHasher,
    "ContributionBounder": ContributionBounder,
    "ColumnBounder": ColumnBounder,
    "BoundingStats": BoundingStats,
    "ReadableCounts": ReadableCounts,
    "Budget": Budget,
    "PrivacyGuarantee": PrivacyGuarantee,
}
_NAMES = {cls: name for name, cls in REGISTRY.items()}
