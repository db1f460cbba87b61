"""The post-process stage of a run: what of a mechanism's release is published.

Layer 6 of dpstream (a stage of :mod:`dpstream.run.pipeline`). A release keeps only the
meta keys that are part of the private output (the mechanism's ``public_meta`` in
:mod:`dpstream.registry`), goes through the readable-counts post-processing
(``--round``, ``--clamp``, ``--monotone``: :class:`dpstream.postprocess.ReadableCounts`,
whose state goes with the mechanism's), then ``--top`` and ``--min-value``. All of it
is post-processing: free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..mechanisms.base import Release, take_items

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["postprocess", "public_release"]


def public_release(release: Release, keys: tuple[str, ...], publish: Any, cfg: RunConfig) -> Any:
    """``release`` as it is published: its public meta, readable counts, ``--top`` and
    ``--min-value``."""
    return postprocess(publish(_public(release, keys)), cfg.top, cfg.min_value)


def _public(release: Release, keys: tuple[str, ...]) -> Release:
    meta = {k: v for k, v in release.meta.items() if k in keys}
    if meta == dict(release.meta):
        return release
    return Release(t=release.t, items=release.items, values=release.values, meta=meta)


def postprocess(release: Any, top: int | None, floor: float | None) -> Any:
    """``--top N`` and ``--min-value V``: keep part of a release (post-processing: free)."""
    import numpy as np

    if top is None and floor is None:
        return release
    values = np.asarray(release.values)
    keep = np.ones(len(values), dtype=bool) if floor is None else values >= floor
    idx = np.flatnonzero(keep)
    if top is not None and len(idx) > top:
        order = np.lexsort((idx, -values[idx]))  # largest first; ties in release order
        idx = np.sort(idx[order[:top]])
    return Release(
        t=release.t, items=take_items(release.items, idx), values=values[idx], meta=release.meta
    )
