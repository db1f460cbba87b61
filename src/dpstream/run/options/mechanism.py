"""The mechanism and budget options of ``dpstream run`` and ``plan``.

Layer 6 of dpstream (the command line's options, :mod:`dpstream.run.options`).
"""

from __future__ import annotations

from ...registry import MECHANISMS
from .base import Opt, _eta, _nonneg_int, _positive_float, _positive_int

MECH_OPTS: tuple[Opt, ...] = (
    Opt(
        ("--mechanism", "-m"),
        "mechanism",
        "the mechanism: " + "; ".join(f"{s.name} = {s.summary}" for s in MECHANISMS.values()),
        "known",
        choices=tuple(MECHANISMS),
    ),
    Opt(
        ("--horizon", "-T"),
        "horizon",
        "T, the number of time steps (leave it out for a "
        "stream with no planned end: -m known and -m unknown, with --until or --follow; "
        "docs/operations.md)",
        None,
        _positive_int,
        metavar="T",
        default_text="none: no planned end (known, unknown); required otherwise",
    ),
    Opt(
        ("--domain",),
        "domain",
        "file of the known domain: one item per line, or a JSON array (known, top-k; "
        "optional for meta)",
        None,
        str,
        metavar="FILE",
    ),
    Opt(
        ("--max-items",),
        "max_items",
        "the most distinct items one event may hold: the privacy cost grows with it (known, "
        "unknown; optional for meta)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--user-field",),
        "user_field",
        "protect users, not events: the JSON field (or CSV "
        "column) holding each event's user id, compared as an exact string (normalise "
        "case, spaces and Unicode upstream); needs --max-items-per-user and "
        "--max-count-per-item (known, unknown, top-k)",
        None,
        str,
        metavar="NAME",
        default_text="none: per event",
    ),
    Opt(
        ("--max-items-per-user",),
        "max_items_per_user",
        "with --user-field: the most "
        "distinct items one user is counted for over the whole stream (later ones are "
        "dropped: first come, first kept)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--max-count-per-item",),
        "max_count_per_item",
        "with --user-field: the most times "
        "one user is counted for one item over the whole stream (1: count users, not "
        "events)",
        None,
        _positive_int,
        metavar="C",
    ),
    Opt(
        ("--k",),
        "k",
        "how many items top-k (and meta's top-k one-shots) release",
        None,
        _positive_int,
        default_text="none; required for top-k",
    ),
    Opt(
        ("--switches",),
        "switches",
        "top-k: the most re-selections of the top-k (s)",
        None,
        _nonneg_int,
        metavar="S",
        default_text="the smallest S with 8^S >= --horizon (3 for T = 379)",
    ),
    Opt(
        ("--eta",),
        "eta",
        "top-k: how far (in counts) an outside item must lead before a switch; 'auto' sizes "
        "it from the noise (a tie sets off a switch with probability 5% over the whole run)",
        "auto",
        _eta,
    ),
    Opt(
        ("--oneshot",),
        "oneshot",
        "meta: the one-shot mechanism run on every tree cell",
        None,
        str,
        choices=("gaussian", "gumbel", "unknown-gaussian", "unknown-gumbel"),
    ),
    Opt(
        ("--kbar",),
        "kbar",
        "meta, unknown-domain one-shots: how many candidates each "
        "selection may consider (at least --k)",
        None,
        _positive_int,
        metavar="N",
    ),
    Opt(
        ("--counter",),
        "counter",
        "the running counter of each item (known, unknown, top-k): tree "
        "(the paper's r-ary tree) or blt (a buffered Toeplitz factorization: same privacy, "
        "about 3x less noise per count)",
        None,
        str,
        choices=("tree", "blt"),
        default_text="the one with less noise for T: blt, or tree for T = 1 or with --base",
    ),
    Opt(
        ("--blt-buffers",),
        "blt_buffers",
        "the BLT counter's buffers per item (1-10): "
        "fewer keep 8 bytes per item less each, for more noise (the count's std grows "
        "by 2% with 2 and 18% with 1 at T = 1,000; 20% and 115% at T = 10^6)",
        None,
        _positive_int,
        metavar="K",
        default_text="4",
    ),
    Opt(
        ("--base",),
        "base",
        "the base of the tree counter (e.g. 8: a tree counter with base 8)",
        None,
        _positive_int,
        metavar="R",
        default_text="r*, the base that minimises the worst-case noise for T",
    ),
    Opt(
        ("--remember",),
        "remember",
        "unknown: keep showing an item once it was shown (no "
        "flicker; post-processing of the releases, no privacy cost)",
        True,
        kind="bool",
    ),
    Opt(
        ("--threshold-delta",),
        "threshold_delta",
        "unknown/meta: delta of the discovery threshold (required with --rho or --tau; with "
        "--epsilon/--delta the default splits delta to minimise the threshold)",
        None,
        _positive_float,
        metavar="D",
    ),
    Opt(
        ("--stream",),
        "stream",
        "a name separating this stream's noise from other streams under the same key",
        "default",
        str,
        metavar="NAME",
    ),
    Opt(
        ("--epsilon",),
        "epsilon",
        "privacy budget epsilon (with --delta)",
        None,
        _positive_float,
        metavar="E",
    ),
    Opt(
        ("--delta",),
        "delta",
        "privacy budget delta (with --epsilon)",
        None,
        _positive_float,
        metavar="D",
    ),
    Opt(
        ("--rho",),
        "rho",
        "privacy budget as rho-zCDP (instead of --epsilon/--delta)",
        None,
        _positive_float,
        metavar="R",
    ),
    Opt(
        ("--tau",),
        "tau",
        "the noise scale tau itself (instead of a budget; for experts)",
        None,
        _positive_float,
    ),
)

#: The public clock's settings, shared by ``run`` and ``plan`` (which reads --end).
