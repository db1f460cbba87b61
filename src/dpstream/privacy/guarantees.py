"""Privacy guarantees: the values a mechanism reports as ``mechanism.privacy``.

Layer 1 of dpstream (docs/architecture.md): immutable values, checked when
built. :class:`ZCDP` is a rho-zCDP guarantee, :class:`ApproxDP` an
(epsilon, delta)-DP one, and :class:`PrivacyGuarantee` what a mechanism states:
its zCDP cost, the (epsilon, delta) claim derived from it, the analysis that
gave the claim, the paper's theorem and the privacy unit. Keeping them apart
from the formulas lets every other module (and the snapshot) depend on the
values alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ._checks import (
    _check_half_open_unit,
    _check_nonnegative,
    _check_open_unit,
    _check_positive,
    _check_str,
)

DEFAULT_DELTA: float = 1e-6
"""The delta at which a mechanism reports its (epsilon, delta) claim when the user
gave ``rho=`` or ``tau=`` rather than ``epsilon=`` and ``delta=``.

The mechanism is then calibrated in zCDP and its guarantee is exactly
``rho``-zCDP; the (epsilon, delta) pair is only a translation for readers who
think in approximate DP, and ``1e-6`` is a conventional, conservative choice for
it. It does not influence the noise.
"""

CONVERSIONS: tuple[str, ...] = ("gaussian-exact", "cks2020", "bun-steinke")
"""Names of the analyses that turn a zCDP parameter into an (epsilon, delta) claim."""


@dataclass(frozen=True)
class ZCDP:
    """A rho-zCDP guarantee (Bun & Steinke 2016).

    Attributes:
        rho: The zCDP parameter, positive and finite. Guarantees compose by adding
            ``rho`` (paper, lem:zCDP_Comp).
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_positive("rho", self.rho))

    def __str__(self) -> str:
        return f"rho-zCDP with rho={self.rho:.6g}"


@dataclass(frozen=True)
class ApproxDP:
    """An (epsilon, delta)-DP guarantee.

    Attributes:
        epsilon: Non-negative and finite.
        delta: In [0, 1); 0 means pure epsilon-DP.
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_nonnegative("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _check_half_open_unit("delta", self.delta))

    def __str__(self) -> str:
        return f"(epsilon={self.epsilon:.6g}, delta={self.delta:.3g})-DP"


#: The privacy units, and the neighbour relation each guarantee is for.
UNITS = {
    "event": "two streams are neighbours when one event's items are replaced by none, at "
    "the same time step (the release clock, and so which steps are released, is "
    "public and the same for both)",
    "user": "two streams are neighbours when all events of one user (within the "
    "contribution bounds) are replaced by empty ones, at the same time steps",
}


#: How a guarantee for a stream with no planned end says so.
_FOR_ALL_T = ", for all t (no planned end)"


def outside_zcdp_words(rho_delta: float) -> str:
    """The words for the delta paid outside zCDP (empty when none): a sum of rho over
    releases must add it (``PrivacyGuarantee.plain`` and ``dpstream plan`` say it)."""
    if rho_delta > 0.0:
        return f", plus {rho_delta:.3g} of delta for what the noise cannot hide"
    return ""


@dataclass(frozen=True, kw_only=True)
class PrivacyGuarantee:
    """What a mechanism reports as ``mechanism.privacy``: its zCDP cost and the
    (epsilon, delta)-DP claim derived from it.

    A mechanism is ``rho_delta``-approximate ``rho``-zCDP (paper, defn:zCDP); for
    the pure zCDP mechanisms ``rho_delta`` is 0. The (epsilon, delta) claim
    includes ``rho_delta`` in ``delta``: epsilon was computed from ``rho`` at
    ``delta - rho_delta`` (paper, lem after eq:epsilon: delta-approximate rho-zCDP
    gives (epsilon(rho, delta'), delta + delta')-DP).

    All fields are keyword-only, so that two floats cannot be swapped by position.

    Attributes:
        rho: zCDP parameter of the mechanism's Gaussian / exponential part.
        rho_delta: The delta paid outside the zCDP analysis (e.g. ``Delta0 *
            delta`` for UnkBase's unknown-domain threshold); 0 for pure zCDP.
        epsilon: The epsilon of the claimed (epsilon, delta)-DP guarantee.
        delta: The total delta of that claim, ``rho_delta`` included.
        conversion: The analysis that gave epsilon from rho: one of
            ``"gaussian-exact"``, ``"cks2020"``, ``"bun-steinke"``.
        mechanism: The mechanism's name, e.g. ``"KnownBase"``.
        theorem: The paper's label of the privacy theorem, e.g.
            ``"lem: KnownBase (Delta0/(2 tau^2)-zCDP)"``.
        unit: What the guarantee hides: ``"event"`` (two streams are neighbours
            when one event's items are replaced by none, at the same time
            step, so the release clock is unchanged) or ``"user"`` (all of one
            user's bounded contributions). See :attr:`neighbours`.
        for_all_t: The guarantee holds for a stream of any length, released at
            every step t with no planned end (a mechanism built with
            ``horizon=None``); ``False``: for the T steps of its horizon.
    """

    rho: float
    rho_delta: float = 0.0
    epsilon: float
    delta: float
    conversion: str
    mechanism: str
    theorem: str
    unit: str = "event"
    for_all_t: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _check_positive("rho", self.rho))
        object.__setattr__(self, "rho_delta", _check_half_open_unit("rho_delta", self.rho_delta))
        object.__setattr__(self, "epsilon", _check_nonnegative("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _check_open_unit("delta", self.delta))
        if self.rho_delta >= self.delta:
            raise ValueError(
                f"delta must exceed rho_delta (the total delta includes it), got "
                f"delta={self.delta!r} and rho_delta={self.rho_delta!r}"
            )
        _check_str("conversion", self.conversion)
        if self.conversion not in CONVERSIONS:
            raise ValueError(
                f"conversion must be one of {CONVERSIONS}, got conversion={self.conversion!r}"
            )
        _check_str("mechanism", self.mechanism)
        _check_str("theorem", self.theorem)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {tuple(UNITS)}, got unit={self.unit!r}")
        if not isinstance(self.for_all_t, bool):
            raise TypeError(f"for_all_t must be a bool, got {self.for_all_t!r}")

    def plain(self) -> str:
        """The guarantee in plain words, for people (no paper labels): e.g.
        ``"epsilon = 1, delta = 1e-06 per event (rho-zCDP with rho = 0.028)"``."""
        text = (
            f"epsilon = {self.epsilon:.6g}, delta = {self.delta:.3g} per {self.unit} "
            f"(rho-zCDP with rho = {self.rho:.6g}"
        )
        text += outside_zcdp_words(self.rho_delta) + ")"
        return text + _FOR_ALL_T if self.for_all_t else text

    @property
    def neighbours(self) -> str:
        """The neighbour relation the guarantee is for, in words."""
        return UNITS[self.unit]

    @property
    def zcdp(self) -> ZCDP:
        """The zCDP part of the guarantee (without ``rho_delta``)."""
        return ZCDP(self.rho)

    @property
    def approx_dp(self) -> ApproxDP:
        """The claimed (epsilon, delta)-DP guarantee."""
        return ApproxDP(self.epsilon, self.delta)

    def to_dict(self) -> dict[str, float | str | bool]:
        """Return the guarantee as a JSON-serialisable dict (field name -> value;
        ``for_all_t`` only when it is true)."""
        d: dict[str, float | str | bool] = asdict(self)
        if not self.for_all_t:
            del d["for_all_t"]
        return d

    def __str__(self) -> str:
        if self.rho_delta > 0.0:
            zcdp = (
                f"rho_delta-approximate rho-zCDP with rho={self.rho:.6g}, "
                f"rho_delta={self.rho_delta:.3g}"
            )
        else:
            zcdp = f"rho-zCDP with rho={self.rho:.6g}"
        text = (
            f"{zcdp}; (epsilon={self.epsilon:.6g}, delta={self.delta:.3g})-DP via "
            f"{self.conversion}, per {self.unit} [{self.mechanism}, {self.theorem}]"
        )
        return text + _FOR_ALL_T if self.for_all_t else text
