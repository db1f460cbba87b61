"""The mechanism stage of a run: the mechanism built from the run's config, the noise
scope it draws under, and the validator that bounds its input.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). The mechanism comes from
the registry (:mod:`dpstream.registry`) under the run's scoped stream name
(:func:`~dpstream.run.settings.scoped_stream`); the pipeline reads it through the
:class:`~dpstream.mechanisms.protocol.ContinualMechanism` protocol. A value the
mechanism's constructor refuses is a problem of the settings (exit status 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..registry import MECHANISMS, build_mechanism
from .checks import mechanism_settings
from .report import RunStats
from .settings import scoped_stream
from .validate import Validator

if TYPE_CHECKING:
    from ..mechanisms.protocol import ContinualMechanism
    from ..noise import NoiseKey
    from .config import RunConfig

__all__ = ["build_run_mechanism", "make_validator"]


def build_run_mechanism(
    cfg: RunConfig, key: NoiseKey, domain: list[str] | None
) -> tuple[ContinualMechanism, str]:
    """The run's mechanism and the stream name its noise is drawn under."""
    stream = scoped_stream(cfg.options())
    with mechanism_settings():
        mech = build_mechanism(cfg.mechanism, {**cfg.options(), "stream": stream}, key, domain)
    return cast("ContinualMechanism", mech), stream


def make_validator(
    cfg: RunConfig,
    mech: ContinualMechanism,
    domain: list[str] | None,
    key: NoiseKey,
    stream: str,
    stats: RunStats,
) -> Validator:
    """The validate-and-bound stage for ``mech``: ``--on-invalid`` against ``--domain``
    (the mechanism's own item table) and the mechanism's ``--max-items``, truncating by
    the keyed rule under the run's stream."""
    from ..io import KeyedTruncator
    from ..mechanisms.truncation import truncation_source

    spec = MECHANISMS[cfg.mechanism]
    max_items = getattr(mech, "max_items", None) if spec.max_items != "none" else None
    truncator = KeyedTruncator(truncation_source(key, stream), max_items or 1)
    return Validator(
        policy=cfg.on_invalid,
        domain=domain,
        max_items=max_items,
        truncator=truncator,
        stats=stats,
        verbose=cfg.verbose_errors,
        users=cfg.user_field is not None,
        domain_index=getattr(mech, "domain_index", None),
    )
