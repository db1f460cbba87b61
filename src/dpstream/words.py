"""Plain words for the mechanisms, for what a user reads.

Layer 1 of dpstream (imports nothing from it).

The paper (Cardoso and Rogers) names its algorithms KnownBase, UnkBase,
SparseGumb and MetaAlgo; the code keeps those names in docstrings, in the
machine-readable fields (``"algorithm"`` of ``plan --json`` and the sidecar) and
in ``.privacy.theorem``. Help texts, ``plan``, the run summary, the live view and
error messages say what a mechanism does instead, with these phrases, so that
one mechanism has one name everywhere a user looks.
"""

from __future__ import annotations

#: The paper's name (a mechanism's ``mechanism_name``) -> what the mechanism does.
MECHANISM_WORDS: dict[str, str] = {
    "KnownBase": "known-domain histogram",
    "UnkBase": "unknown-domain histogram",
    "SparseGumb": "top-k with switches",
    "KnownBase top-k": "top-k from the known-domain histogram",
    "UnkBase top-k": "top-k from the unknown-domain histogram",
    "MetaAlgo": "per-cell one-shot (meta)",
    "BinMech": "tree counter",
    "BLTCounter": "BLT counter",
}


def plain_mechanism(algorithm: str) -> str:
    """What the mechanism the paper calls ``algorithm`` does, in a few words.

    ``"MetaAlgo[unknown-gumbel]"`` names the one-shot run in each cell after the
    words; a name not in :data:`MECHANISM_WORDS` is returned as it is.
    """
    head, _, inner = algorithm.partition("[")
    words = MECHANISM_WORDS.get(head, head)
    return f"{words}, {inner.rstrip(']')} in each cell" if inner else words
