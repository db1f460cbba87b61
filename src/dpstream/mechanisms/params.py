"""A mechanism's settings as one frozen value, shared by the local and the Spark classes.

Layer 5 of dpstream (docs/architecture.md). The local classes
(:class:`~dpstream.KnownDomainHistogram`, :class:`~dpstream.UnknownDomainHistogram`,
:class:`~dpstream.ContinualTopK`) and their Spark twins
(:mod:`dpstream.spark`) take the same settings: the horizon, the budget, the
counter, the bounds, the stream name and the noise version. Each set is one
value here, so that the Spark command builds it once and both engines are
built from it (``from_params``): the same value gives the same noise purpose,
the same guarantee and, on the same data, the same releases. The domain and the
key are not settings: the domain is data (a Spark job fingerprints it where it
lies) and the key is a secret, so both are passed beside the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..factorization import BLTStrategy
from ..noise import DEFAULT_NOISE_VERSION

__all__ = ["HistogramParams", "TopKParams", "UnknownParams"]


@dataclass(frozen=True, kw_only=True)
class _Params:
    """What every mechanism's settings hold: the counter, the budget (one of ``rho``,
    ``epsilon`` with ``delta``, or ``tau``), the stream name and the noise version."""

    counter: str | BLTStrategy | None = None
    base: int | None = None
    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    tau: float | None = None
    stream: str = "default"
    noise_version: int = DEFAULT_NOISE_VERSION

    def kwargs(self) -> dict[str, Any]:
        """The settings as the classes' keyword arguments (all but the horizon)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "horizon"}


@dataclass(frozen=True, kw_only=True)
class HistogramParams(_Params):
    """The settings of a known-domain histogram (KnownBase, paper Algorithm 2).

    Every field means what the class's argument of the same name means
    (:class:`dpstream.KnownDomainHistogram`); ``horizon=None`` is a stream with
    no planned end.
    """

    horizon: int | None
    max_items: int | None = None
    max_items_per_user: int | None = None
    max_count_per_item: int | None = None


@dataclass(frozen=True, kw_only=True)
class UnknownParams(HistogramParams):
    """The settings of an unknown-domain histogram (UnkBase, paper Algorithm 3): those of
    :class:`HistogramParams` and the threshold's (:class:`dpstream.UnknownDomainHistogram`)."""

    remember: bool = False
    threshold_delta: float | None = None


@dataclass(frozen=True, kw_only=True)
class TopKParams(_Params):
    """The settings of top-k with switches (SparseGumb, paper Algorithm 4), as
    :class:`dpstream.ContinualTopK` takes them."""

    horizon: int
    k: int
    switches: int
    eta: float | Callable[[int], float] | str = "auto"
    wait: bool = True
