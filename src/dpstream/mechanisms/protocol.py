"""What a continual mechanism offers to the command line, ``plan``, the view and Spark.

Layer 5 of dpstream. :class:`ContinualMechanism` names the attributes the edges
read from every mechanism the command line builds, so they read them directly
instead of probing with ``getattr``/``hasattr``: a class that has no use for one
sets a class-level default (e.g. ``accepts_columns = False``, ``counter = None``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..bounding import UserBounds
    from ..factorization import BLTStrategy
    from ..privacy import PrivacyGuarantee
    from .base import Release

__all__ = ["ContinualMechanism"]


@runtime_checkable
class ContinualMechanism(Protocol):
    """A mechanism that releases at every step t = 1..horizon.

    Attributes:
        horizon: T, the number of steps (the step limit when ``unbounded``).
        tau: the noise scale.
        base: the tree counter's base (``None`` where the mechanism has no tree).
        t: the last step released (0 before the first).
        privacy: the guarantee of the whole stream.
        accepts_columns: ``step_batch`` takes :class:`~dpstream.mechanisms.columns.EventColumns`
            (otherwise the edges hand it lists of events).
        counter: ``"tree"`` or ``"blt"`` where the mechanism offers a choice of
            counter, ``None`` where it does not (the edges then show ``"tree"``).
        strategy: the BLT strategy of a BLT counter, else ``None``.
        unbounded: the stream has no planned end.
        user_bounds: the per-user bounds (user-level privacy), else ``None``.
        noise_std_worst: the largest std of a released count over t <= T.
        noise_version: the version of :mod:`dpstream.noise` that draws the noise
            (recorded, so that a stream never changes version).

    Optional capabilities, probed by the edges because only some mechanisms
    have them: ``noise_std_at(t)`` (the std at step t; absent where only the
    worst step's is known), ``threshold_at``/``threshold_for_cells`` (UnkBase's
    per-step threshold), ``max_items`` (absent where events have no size
    bound, e.g. SparseGumb), ``domain``/``domain_index`` (a known domain).
    """

    horizon: int
    tau: float
    base: int | None
    privacy: PrivacyGuarantee
    accepts_columns: bool
    counter: str | None
    strategy: BLTStrategy | None
    unbounded: bool
    user_bounds: UserBounds | None

    @property
    def t(self) -> int: ...

    @property
    def noise_std_worst(self) -> float: ...

    @property
    def noise_version(self) -> int: ...

    def step(self, event: Iterable[Any]) -> Release: ...

    def step_batch(self, events: Any) -> Release: ...
