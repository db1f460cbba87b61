"""Which mechanisms the command line runs, and how one is built from its options.

Layer 6 of dpstream (the command line's mechanism registry): each mechanism
module is imported only when asked for. ``run``, ``plan``, the settings check
and Spark build mechanisms through here, never through :mod:`dpstream.cli`, so
the command line's modules import one way (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import DPStreamError


@dataclass(frozen=True)
class MechanismSpec:
    """How the command builds one mechanism.

    Attributes:
        name: the ``--mechanism`` value.
        module, cls: where the class lives (imported lazily).
        domain: ``"required"``, ``"optional"`` or ``"none"`` (``--domain``).
        domain_positional: the constructor takes the domain as first argument.
        max_items: ``"required"``, ``"optional"`` or ``"none"`` (``--max-items``).
        public_meta: the ``Release.meta`` keys that are part of the private
            output (others, e.g. a true number of distinct items, are not
            written).
        summary: one line for ``--help``.
    """

    name: str
    module: str
    cls: str
    domain: str
    domain_positional: bool
    max_items: str
    public_meta: tuple[str, ...]
    summary: str


MECHANISMS: dict[str, MechanismSpec] = {
    "known": MechanismSpec(
        "known",
        "dpstream.mechanisms.known",
        "KnownDomainHistogram",
        "required",
        True,
        "required",
        (),
        "known-domain histogram: a running count of every item of a listed domain, "
        "<= max-items per event",
    ),
    "unknown": MechanismSpec(
        "unknown",
        "dpstream.mechanisms.unknown",
        "UnknownDomainHistogram",
        "none",
        False,
        "required",
        ("threshold", "remember"),
        "unknown-domain histogram: running counts of items never listed in advance, "
        "<= max-items per event",
    ),
    "top-k": MechanismSpec(
        "top-k",
        "dpstream.mechanisms.topk",
        "ContinualTopK",
        "required",
        True,
        "optional",
        ("status", "switches_left", "switched", "selection"),
        "top-k with switches: a continual top-k of a known domain, any number of items "
        "per event (with --max-items: top-k with switches or top-k from the known- or "
        "unknown-domain histogram, whichever lists items soonest)",
    ),
    "meta": MechanismSpec(
        "meta",
        "dpstream.mechanisms.meta",
        "MetaHistogram",
        "optional",
        False,
        "optional",
        ("status",),
        "per-cell one-shot (meta): a one-shot mechanism on every cell of the tree (event mode)",
    ),
}

#: Options passed to the mechanism's constructor when set (CLI dest = keyword).
_MECH_KWARGS = (
    "max_items",
    "k",
    "switches",
    "eta",
    "oneshot",
    "kbar",
    "counter",
    "base",
    "remember",
    "threshold_delta",
    "stream",
    "rho",
    "epsilon",
    "delta",
    "tau",
    "max_items_per_user",
    "max_count_per_item",
    "noise_version",
)


def mechanism_class(name: str) -> type:
    """Import the class of mechanism ``name`` (lazily: only the one asked for)."""
    spec = MECHANISMS[name]
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        if exc.name == spec.module:
            raise DPStreamError(
                f"mechanism {name!r} is not available in this version of dpstream "
                f"(module {spec.module} is missing)"
            ) from None
        raise
    return getattr(module, spec.cls)


def build_mechanism(
    name: str, options: Mapping[str, Any], key: Any, domain: Sequence[str] | None
) -> Any:
    """Build mechanism ``name`` from command-line options (``dest -> value``).

    Options that are ``None`` are left to the constructor's defaults; an
    option the mechanism does not take is an error naming the option. For
    top-k, ``eta = "auto"`` (or unset) is the noise-sized default of
    ``ContinualTopK`` (``eta="auto"``) and an absent ``--switches`` is
    ``default_switches(T)``; with ``--max-items`` top-k is the best of SparseGumb,
    KnownBase's and UnkBase's top-k (:func:`top_k_choice`).
    """
    choice = top_k_choice(name, options, key, domain)
    if choice is not None:
        return choice.mechanism
    if name not in MECHANISMS:
        raise ValueError(f"--mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    spec = MECHANISMS[name]
    cls = mechanism_class(name)
    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    for dest in _MECH_KWARGS:
        value = options.get(dest)
        if value is None or (dest == "remember" and (value is False or "remember" not in params)):
            continue  # --remember (on by default) applies to the mechanisms that remember
        if dest == "eta" and value == "auto":
            continue
        if dest not in params:
            raise ValueError(f"--{dest.replace('_', '-')} does not apply to --mechanism {name}")
        kwargs[dest] = value
    _counter_from_buffers(name, options, kwargs, "counter" in params)
    check_user_options(options)
    if (
        spec.max_items == "required"
        and "max_items" not in kwargs
        and "max_items_per_user" not in kwargs
    ):
        raise ValueError(f"--mechanism {name} needs --max-items (the most items an event holds)")
    args: list[Any] = []
    if spec.domain == "required" and domain is None:
        raise ValueError(f"--mechanism {name} needs --domain FILE (the known items)")
    if domain is not None:
        if spec.domain == "none":
            raise ValueError(f"--domain does not apply to --mechanism {name}")
        if spec.domain_positional:
            args.append(list(domain))
        else:
            kwargs["domain"] = list(domain)
    horizon = options.get("horizon")  # None: no planned end (-m known, -m unknown)
    if horizon is None and name == "top-k":
        raise ValueError(
            "--mechanism top-k without --horizon needs --max-items: with any number of "
            "items per event top-k runs with switches, which spreads them over T "
            "(--horizon); with at most --max-items items per event it is read off the "
            "known- or unknown-domain histogram, whose noise holds for every t"
        )
    if horizon is None and name not in ("known", "unknown"):
        raise ValueError(
            f"--mechanism {name} needs --horizon (T, the number of time steps): its "
            "tree is sized for T; only known, unknown and top-k with --max-items run "
            "with no planned end"
        )
    if name == "top-k":
        if "k" not in kwargs:
            raise ValueError("--mechanism top-k needs --k")
        if "switches" not in kwargs:  # SparseGumb's default s for T (smallest s, 8^s >= T)
            from .mechanisms.topk import default_switches

            assert horizon is not None  # checked above: top-k needs --horizon
            kwargs["switches"] = default_switches(int(horizon))
    if name == "meta" and "oneshot" not in kwargs:
        raise ValueError("--mechanism meta needs --oneshot")
    return cls(*args, horizon, key=key, **kwargs)


def _counter_from_buffers(
    name: str, options: Mapping[str, Any], kwargs: dict[str, Any], takes_counter: bool
) -> None:
    """``--blt-buffers K``: ``kwargs["counter"]`` becomes the K-buffer BLT for --horizon."""
    buffers = options.get("blt_buffers")
    if buffers is None:
        return
    if not takes_counter:
        raise ValueError(f"--blt-buffers does not apply to --mechanism {name}")
    from .mechanisms.counters import counter_with_buffers

    horizon = options.get("horizon")
    if horizon is None:
        raise ValueError("--horizon is required (T, the number of time steps)")
    kwargs["counter"] = counter_with_buffers(
        options.get("counter"), options.get("base"), buffers, int(horizon)
    )


def check_user_options(options: Mapping[str, Any]) -> None:
    """User level needs both bounds; one alone is an error (the command line's ``plan``
    and ``run`` also need --user-field with them: :mod:`dpstream.run.checks`)."""
    per_user, per_item = options.get("max_items_per_user"), options.get("max_count_per_item")
    if (per_user is None) != (per_item is None):
        missing = "--max-count-per-item" if per_item is None else "--max-items-per-user"
        raise ValueError(
            f"user-level privacy needs --max-items-per-user and "
            f"--max-count-per-item together (missing {missing})"
        )
    if options.get("user_field") is not None and options.get("mechanism") == "meta":
        raise ValueError(
            "--user-field does not apply to --mechanism meta (known, unknown and "
            "top-k protect users)"
        )


def top_k_choice(
    name: str, options: Mapping[str, Any], key: Any, domain: Sequence[str] | None
) -> Any:
    """For ``-m top-k --max-items N``: SparseGumb, KnownBase's or UnkBase's top-k, the
    one an item needs the smallest count to be listed by, from public parameters
    (``dpstream.mechanisms.histogram_topk.choose_top_k``); ``None`` otherwise. Without
    --switches, SparseGumb is compared with its default s (``default_switches``)."""
    if name != "top-k" or options.get("max_items") is None:
        return None
    from .mechanisms.histogram_topk import choose_top_k

    if options.get("horizon") is None:  # no planned end: the histograms' top-k only
        return _top_k_unbounded(options, key, domain)
    probe = build_mechanism(name, {**options, "max_items": None}, key, domain)  # checks
    kwargs = {
        d: options[d]
        for d in _MECH_KWARGS
        if options.get(d) is not None
        and d not in ("max_items", "k", "switches", "eta")
        and d != "remember"
    }
    if options.get("eta") not in (None, "auto"):
        kwargs["eta"] = options["eta"]
    _counter_from_buffers(name, options, kwargs, True)
    return choose_top_k(
        probe.domain,
        probe.horizon,
        k=probe.k,
        switches=probe.switches,
        max_items=options["max_items"],
        key=key,
        **kwargs,
    )


def _top_k_unbounded(
    options: Mapping[str, Any], key: Any, domain: Sequence[str] | None
) -> Any:
    """:func:`top_k_choice` with no --horizon: KnownBase's or UnkBase's top-k on the BLT
    for every t (``choose_top_k(horizon=None)``, which refuses SparseGumb's settings)."""
    from .mechanisms.histogram_topk import choose_top_k

    if domain is None:
        raise ValueError("--mechanism top-k needs --domain FILE (the known items)")
    if options.get("k") is None:
        raise ValueError("--mechanism top-k needs --k")
    check_user_options(options)
    kwargs = {
        d: options[d]
        for d in _MECH_KWARGS
        if options.get(d) is not None and d not in ("max_items", "k", "switches", "remember")
    }
    if options.get("blt_buffers") is not None:
        raise ValueError("--blt-buffers needs --horizon (T, the number of time steps)")
    return choose_top_k(
        list(domain),
        None,
        k=options["k"],
        switches=options.get("switches"),
        max_items=options["max_items"],
        key=key,
        **kwargs,
    )


# --------------------------------------------------------------------------- options

#: Defaults of the readable-count post-processing, chosen by the measurements
#: in docs/utility.md (bias and error on real streams).
CLAMP_DEFAULT = True
MONOTONE_DEFAULT = False


def make_postprocessor(opts: Mapping[str, Any]) -> Any:
    """The post-processing ``run`` applies to each release before writing it.

    ``dpstream.postprocess.ReadableCounts`` with --clamp/--monotone/--round;
    lists (top-k, unknown, meta's selections) stay ordered by published value.
    """
    from .postprocess import ReadableCounts

    name = opts.get("mechanism", "known")
    ranked = name in ("unknown", "top-k") or (name == "meta" and opts.get("oneshot") != "gaussian")
    return ReadableCounts(
        clamp=bool(opts.get("clamp", CLAMP_DEFAULT)),
        monotone=bool(opts.get("monotone", MONOTONE_DEFAULT)),
        round_counts=bool(opts.get("round", True)),
        ranked=ranked,
    )
