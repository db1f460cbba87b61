"""What every continual mechanism shares: the Release value and input checks.

Layer 5 of dpstream. Checks run before any state changes, so a rejected event
or step leaves the mechanism exactly as it was (validate before mutating).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import compiled, privacy
from .._checks import check_int, series_items
from ..errors import HorizonExceededError, InvalidEventError, InvalidItemError
from ..noise import NoiseKey, canonical_item
from ..tree import optimal_base
from .columns import (
    MAX_COUNT,
    check_count_range,
    check_grows,
    domain_aggregate,
    is_frame,
    not_integers,
    too_large,
)
from .truncation import keep_ranked, keyed_subset, truncation_source

if TYPE_CHECKING:
    from .item_table import ItemTable

__all__ = [
    "Release",
    "check_horizon",
    "check_base",
    "normalise_event",
    "check_stream_name",
    "config_tag",
    "check_key",
    "check_count_value",
    "check_top_k",
    "check_count_array",
    "check_count_range",
    "MAX_COUNT",
    "mapping_counts",
    "domain_counts",
    "check_domain",
    "check_in_domain",
    "resolve_privacy",
    "keyed_subset",
    "EventLimit",
    "TruncationStats",
]


def take_items(items: Sequence[Hashable], positions: Sequence[int] | np.ndarray) -> list[Hashable]:
    """``[items[i] for i in positions]``, in one call when ``items`` can (a known
    domain's release items are a view that decodes them from bytes)."""
    take = getattr(items, "take", None)
    if take is not None:
        return take(np.asarray(positions, dtype=np.int64))
    return [items[i] for i in np.asarray(positions, dtype=np.int64).tolist()]


@dataclass(frozen=True, eq=False)
class Release:
    """The private output of a mechanism at one time step.

    Attributes:
        t: the time step (1-based).
        items: the released items, in the mechanism's order.
        values: their noisy counts, aligned with ``items`` (float64).
        meta: mechanism-specific extras (e.g. the threshold, switches left).

    ``counts`` gives the same as a dict ``item -> noisy count`` (built on first
    use: for a domain of 10^6 items keep to ``items``/``values``). Publish
    :meth:`rounded` rather than the raw floats (see there why).
    """

    t: int
    items: Sequence[Hashable]
    values: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def counts(self) -> dict[Hashable, float]:
        return dict(zip(self.items, self.values.tolist(), strict=False))

    def __len__(self) -> int:
        return len(self.values)

    def rounded(self) -> Release:
        """This release with every count rounded to the nearest integer (int64).

        Publish this rather than the raw floats. The noise is a float computed
        from a 53-bit uniform, so its possible values form a known grid, and a
        count that used few tree cells can be recovered exactly from the low-order
        bits of ``count + noise`` (Mironov, CCS 2012). Rounding removes those bits;
        it is post-processing, so the guarantee is unchanged (up to the
        negligible distance between the grid and a true Gaussian).
        """
        return Release(
            t=self.t,
            items=self.items,
            values=np.rint(self.values).astype(np.int64),
            meta=self.meta,
        )

    def to_pandas(self) -> Any:
        """This release as a pandas DataFrame in the long format (t, item, value).

        Needs pandas (an optional import). Publish ``rounded().to_pandas()``.
        """
        import pandas as pd

        return pd.DataFrame(
            {
                "t": np.full(len(self.values), int(self.t), dtype=np.int64),
                "item": list(self.items),
                "value": np.asarray(self.values),
            }
        )

    def to_arrow(self) -> Any:
        """This release as a pyarrow Table in the long format (t, item, value).

        Needs pyarrow (an optional import). Publish ``rounded().to_arrow()``.
        """
        import pyarrow as pa

        as_arrow = getattr(self.items, "to_arrow", None)  # a known domain's view
        if as_arrow is not None:
            items = as_arrow()
        else:
            try:
                items = pa.array(list(self.items))
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # str and int items: as text
                text = [str(i) for i in self.items]
                if len(set(text)) < len(text):  # review 112: 1 and "1" (or b"a" and
                    # "b'a'") became one label with two values
                    raise ValueError(
                        "to_arrow: items of several types share a text (such as 1 and "
                        "'1'): their rows could not be told apart; use one type of item"
                    ) from None
                items = pa.array(text)
        return pa.table(
            {
                "t": pa.array(np.full(len(self.values), int(self.t), dtype=np.int64)),
                "item": items,
                "value": pa.array(np.asarray(self.values)),
            }
        )

    def top(self, k: int) -> list[tuple[Hashable, float]]:
        """The k released items with the largest noisy counts, largest first."""
        if k <= 0 or len(self.values) == 0:
            return []
        k = min(k, len(self.values))
        idx = compiled.top_k(np.asarray(self.values, dtype=np.float64), k)
        values = self.values[idx].astype(np.float64).tolist()
        return list(zip(take_items(self.items, idx), values, strict=True))

    def __repr__(self) -> str:
        preview = ", ".join(f"{it!r}: {v:.2f}" for it, v in self.top(3))
        more = "" if len(self) <= 3 else f", ... ({len(self)} items)"
        return f"Release(t={self.t}, counts={{{preview}{more}}})"


#: The largest horizon: a tree cell index is a 64-bit field of a noise address.
MAX_HORIZON = 2**63


def check_horizon(horizon: object) -> int:
    """T must be an int in [1, 2^63]."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)):
        raise TypeError(f"horizon must be an int, got {type(horizon).__name__}")
    if not 1 <= horizon <= MAX_HORIZON:
        raise ValueError(f"horizon must be in [1, 2**63], got {horizon}")
    return int(horizon)


def check_base(base: object, horizon: int) -> int:
    """The tree base: None -> the noise-optimal r* for T, else an int in {2..max(T, 2)}.

    The paper takes r in {2..T}: a larger base gives the same one-level tree as
    r = T but a worse discovery threshold (which grows with sqrt(r - 1)).
    """
    if base is None:
        return optimal_base(horizon)
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)):
        raise TypeError(f"base must be an int or None, got {type(base).__name__}")
    if not 2 <= base <= max(horizon, 2):
        raise ValueError(
            f"base must be in [2, max(horizon, 2)] = [2, {max(horizon, 2)}], got {base}"
        )
    return int(base)


def check_max_items(max_items: object) -> int:
    """Delta0, the most items one event may hold."""
    return check_int("max_items", max_items, 1)


def check_top_k(k: object, domain_size: int) -> int:
    """k of a top-k over a domain of ``domain_size`` items: an int in 1..d."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= domain_size:
        raise ValueError(f"k must be in 1..{domain_size} (the domain size), got {k}")
    return int(k)


def check_key(key: object) -> NoiseKey:
    """The secret key must be a :class:`~dpstream.NoiseKey` (never raw bytes or a seed)."""
    if not isinstance(key, NoiseKey):
        raise TypeError(f"key must be a dpstream.NoiseKey, got {type(key).__name__}")
    return key


def check_domain(
    domain: object, key: NoiseKey | None = None
) -> tuple[list[Hashable], dict[Hashable, int]]:
    """A known domain as a list of distinct items and its item -> position index (with
    ``key``: refused when it names the key, see :func:`domain_items`)."""
    items = domain_items(domain, key)
    index = {item: i for i, item in enumerate(items)}
    if len(index) != len(items):
        raise ValueError("domain items must be distinct")
    return items, index


#: The item types that :func:`~dpstream.noise.canonical_item` returns unchanged.
_CANONICAL_TYPES = frozenset({str, int, bytes})


def domain_items(domain: object, key: NoiseKey | None = None) -> list[Hashable]:
    """A known domain's items, canonical, in order (not checked for distinctness:
    :func:`check_domain` or :func:`~dpstream.mechanisms.item_table.domain_table` does).

    With ``key`` (the mechanism's noise key), a domain that holds the key as an item
    (its hex text, as a key file holds it, or its bytes) is refused: every release
    names every item of a known domain, so it would publish the key, and with it the
    noise of every stream under that key (a key file given as ``--domain``)."""
    if isinstance(domain, (str, bytes)):
        raise TypeError("domain must be a collection of items, not a single string")
    if not isinstance(domain, Iterable):
        raise TypeError(f"domain must be an iterable of items, got {type(domain).__name__}")
    # exact str, int and bytes items are their own canonical form (canonical_item
    # returns the same object): one pass over their types instead of a call per item
    try:
        items: list[Hashable] = list(domain)
        if not set(map(type, items)) <= _CANONICAL_TYPES:
            items = [canonical_item(item) for item in items]
    except TypeError as exc:
        raise TypeError(f"domain: {exc}") from None
    if not items:
        raise ValueError("domain must hold at least one item")
    if key is not None:
        _refuse_key_item(items, key)
    return items


def _refuse_key_item(items: list[Hashable], key: NoiseKey) -> None:
    """Refuse a domain that names the noise key (see :func:`domain_items`)."""
    secret = key.to_bytes()
    text = secret.hex()
    # the key's hex and every run of 16 or more of its digits (a key file written on
    # two lines, xxd -p's way, gives two items: review 104), in either case, and its
    # bytes: one pass in C over the items (a domain of 10^6 items, ~20 ms)
    parts = {text[i:j] for i in range(len(text)) for j in range(i + 16, len(text) + 1)}
    forms = {*parts, *(p.upper() for p in parts), secret}
    if not forms.isdisjoint(items):
        raise ValueError(
            "the domain holds the noise key itself as an item (is --domain the key "
            "file?): every release names each item of a known domain, so it would "
            "publish the key; give the file of the items to release"
        )


def check_in_domain(items: Iterable[Hashable], index: Container[Hashable]) -> None:
    """Raise :class:`InvalidEventError` for the first item outside a known domain."""
    for item in items:
        if item not in index:
            raise InvalidEventError(f"item {item!r} is not in the domain")


def config_tag(**params: object) -> str:
    """A short fingerprint of the settings that shape a mechanism's noise.

    Noise purposes carry it, so two runs under one key and stream name with
    different settings (another tau, base, horizon, k, ...) draw independent
    noise: otherwise the same standard draws, scaled differently or added to
    cells of other spans, would let the two releases be solved for the true
    counts. Identical settings replay identical noise (a restart, another
    engine). Floats are fingerprinted exactly (``float.hex``). A callable
    cannot be fingerprinted (two functions would look alike) and is refused:
    evaluate it first (e.g. ContinualTopK turns an eta schedule into values).
    """

    def canon(value: object) -> object:
        if isinstance(value, (bool, np.bool_)) or value is None:
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            return float(value).hex()
        if callable(value):
            raise TypeError("a noise scope cannot fingerprint a function: give its values")
        return str(value)

    text = json.dumps({k: canon(v) for k, v in params.items()}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_stream_name(stream: object) -> str:
    """The name that separates the noise of different streams under one key."""
    if not isinstance(stream, str) or not stream or "/" in stream:
        raise ValueError(f"stream must be a non-empty string without '/', got {stream!r}")
    return stream


def check_count_value(name: str, value: object) -> int:
    """One true count of aggregate mode: an int from 0 to :data:`MAX_COUNT` (not a bool,
    float or string)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > MAX_COUNT:
        raise too_large(name)
    return int(value)


def check_count_array(
    name: str, arr: object, length: int | None = None, at_least: np.ndarray | None = None
) -> np.ndarray:
    """Aggregate-mode counts as an int64 array (a copy): integer dtype, >= 0, right length.

    ``at_least``: counts it must not fall below (the last prefix histogram, itself
    >= 0); checking that covers ">= 0" too, in one pass fewer.
    """
    if isinstance(arr, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in arr):
        # NumPy makes [True, 2, 3] an int64 array: a bool among ints would count as 1
        # (review 112), where an array of bools and the Mapping form refuse it
        raise TypeError(f"{name} must hold integers, got a bool")
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu":
        raise not_integers(name, arr)
    if arr.ndim != 1 or (length is not None and arr.shape[0] != length):
        raise ValueError(
            f"{name} must have one entry per domain item ({length}), got shape {arr.shape}"
        )
    if (
        arr.dtype.kind == "u"
        and arr.dtype.itemsize == 8
        and arr.size
        and arr.max() > np.iinfo(np.int64).max
    ):
        raise ValueError(f"{name} must fit in int64")
    out = check_count_range(name, arr.astype(np.int64))
    if at_least is not None and not np.less(out, at_least).any():
        return out  # >= at_least >= 0
    if out.size and out.min() < 0:
        raise ValueError(f"{name} must be >= 0")
    if at_least is not None:
        check_grows(out, at_least)
    return out


def mapping_counts(counts: object) -> tuple[list[Hashable], np.ndarray]:
    """The canonical items and int64 counts of an aggregate-mode ``item -> count`` Mapping
    (or a pandas Series indexed by item: :func:`series_items`).

    Every count must be an int >= 0: a float would be truncated and a bool or a
    string coerced, silently releasing something other than the true histogram.
    """
    counts = series_items(counts)
    if not isinstance(counts, Mapping):
        raise TypeError(f"counts must be a Mapping item -> count, got {type(counts).__name__}")
    try:
        items: list[Hashable] = [canonical_item(item) for item in counts]
    except TypeError as exc:
        raise TypeError(f"counts: {exc}") from None
    raw = list(counts.values())
    for item, value in zip(items, raw, strict=True):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"counts must be integers, got {value!r} for item {item!r}")
    try:
        values = np.array(raw, dtype=np.int64) if raw else np.zeros(0, dtype=np.int64)
    except OverflowError:
        raise ValueError("counts must fit in int64") from None
    if values.size and values.min() < 0:
        raise ValueError("counts must be >= 0")
    return items, check_count_range("counts", values)


def domain_counts(
    counts: object,
    index: Mapping[Hashable, int] | ItemTable,
    previous: np.ndarray,
    values: object = None,
) -> np.ndarray:
    """Aggregate-mode counts over a known domain, as an int64 array aligned with it.

    ``counts`` is a Mapping (missing items count 0), a pandas Series indexed by
    item (read as that Mapping, never by position: :func:`series_items`) or an
    integer array aligned with the domain; or the items, with their counts in
    ``values``, or a pandas/polars/Arrow frame with columns ``item`` and ``count``
    (:func:`~dpstream.mechanisms.columns.domain_aggregate`). ``previous`` is the
    last prefix histogram, which may not shrink.
    """
    if values is not None or is_frame(counts):
        return domain_aggregate(counts, values, index, previous)
    counts = series_items(counts)
    n = len(previous)
    if isinstance(counts, Mapping):
        from .columns import lookup_all

        items, values = mapping_counts(counts)
        pos = lookup_all(items, index)
        if pos.size and pos.min() < 0:
            raise InvalidEventError(f"item {items[int(np.argmax(pos < 0))]!r} is not in the domain")
        arr = np.zeros(n, dtype=np.int64)
        arr[pos] = values
    else:
        return check_count_array("counts", counts, n, at_least=previous)
    check_grows(arr, previous)
    return arr


def check_next_step(t: int, last_t: int, horizon: int) -> None:
    """Releases go forward in time and stop at the horizon."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"t must be an int, got {type(t).__name__}")
    if t > horizon:
        raise HorizonExceededError(f"time step {t} is past the horizon T={horizon}")
    if t <= last_t:
        raise ValueError(
            f"t must be greater than the last released step {last_t}, got {t} "
            "(a step is released once: releasing it again would spend budget twice)"
        )


def normalise_event(event: object, max_items: int | None) -> tuple[Hashable, ...]:
    """An event as a tuple of distinct items (an event is a set, paper Section 2).

    Items are made canonical (NumPy integers become ``int``), and only str, int
    and bytes are items: ``True`` or ``2.0`` would otherwise count for the equal
    items ``1`` and ``2``.

    Raises:
        TypeError: the event is a string/bytes (a common slip: it would be read
            as its characters) or not iterable.
        InvalidEventError: more than ``max_items`` distinct items, or an item
            that is not a str, int or bytes.
    """
    if isinstance(event, (str, bytes, bytearray)):
        raise TypeError(
            f"an event is a collection of items, got a {type(event).__name__} {event!r}; "
            f"wrap a single item as [{event!r}]"
        )
    if not isinstance(event, Iterable):
        raise TypeError(f"an event must be an iterable of items, got {type(event).__name__}")
    try:
        items = tuple(dict.fromkeys(canonical_item(item) for item in event))
    except TypeError as exc:
        # a bool, float or other non-item would otherwise match an equal int item
        raise InvalidItemError(f"event holds an invalid item: {exc}") from None
    if max_items is not None and len(items) > max_items:
        raise InvalidEventError(
            f"event has {len(items)} distinct items, more than max_items={max_items}"
        )
    return items


def resolve_privacy(
    *,
    rho: float | None,
    epsilon: float | None,
    delta: float | None,
    tau: float | None,
    coefficient: float,
    gaussian_exact: bool,
    mechanism: str,
    theorem: str,
    rho_delta: float = 0.0,
) -> tuple[privacy.Budget, float, privacy.PrivacyGuarantee]:
    """Check the budget arguments, find tau, and state the guarantee at that tau.

    ``coefficient`` is a in rho = a / tau^2, the mechanism's zCDP cost.
    ``gaussian_exact`` says the mechanism is exactly a Gaussian mechanism with
    sensitivity/noise ratio sqrt(2a)/tau, so the exact Balle–Wang curve may be
    used; otherwise the zCDP conversion of Canonne, Kamath and Steinke.
    """
    budget = privacy.resolve_budget(rho=rho, epsilon=epsilon, delta=delta, tau=tau)
    tau_value = budget.calibrate(coefficient, gaussian_exact=gaussian_exact)
    guarantee = privacy.guarantee_for_tau(
        tau=tau_value,
        a=coefficient,
        delta=budget.reporting_delta,
        mechanism=mechanism,
        theorem=theorem,
        gaussian_exact=gaussian_exact,
        rho_delta=rho_delta,
        target_epsilon=budget.epsilon,
    )
    return budget, tau_value, guarantee


# --------------------------------------------------------------------------- truncation


@dataclass
class TruncationStats:
    """What ``on_invalid="truncate"`` did so far (operator-facing; NOT private).

    These are true facts about the data (like ``mechanism.counts``): show them
    to whoever runs the release, never publish them.

    Attributes:
        events: events seen.
        truncated_events: events cut to ``max_items`` items or stripped of
            items outside the domain.
        occurrences: item occurrences (distinct items per event) before any cut.
        dropped: item occurrences removed.
    """

    events: int = 0
    truncated_events: int = 0
    occurrences: int = 0
    dropped: int = 0

    @property
    def dropped_share(self) -> float:
        """dropped / occurrences (0 when nothing was seen): the undercount truncation causes."""
        return self.dropped / self.occurrences if self.occurrences else 0.0


class EventLimit:
    """How a mechanism treats an event over ``max_items`` (its ``on_invalid`` argument).

    * ``"error"`` (default): :class:`~dpstream.InvalidEventError`, nothing changes.
    * ``"truncate"``: keep ``max_items`` of the event's distinct items, chosen
      by :func:`~dpstream.mechanisms.truncation.keep_ranked` (a keyed PRF of
      the event's step and items, purpose ``f"{stream}/truncate/v2"``), and,
      for a known domain, drop the items outside it. Truncation is a function
      of the event alone (its step, its items and the key), never of its place
      among the other events: removing an event changes no other event's kept
      items, so one event still changes at most ``max_items`` counts by at
      most 1 and the mechanism's guarantee holds as stated (the truncation
      noise is independent of the release noise). Truncation biases the
      counts of items that often share events with many others downwards:
      :attr:`stats` counts the item occurrences it dropped.

    ``"truncate"`` is refused for a user-level mechanism (``user_level``): it checks
    each (user, items) event whole (the user bounds then limit what a user adds), so
    an event over ``max_items`` or outside the domain would raise, not be truncated
    as asked; truncate the events before (``dpstream run --on-invalid truncate``
    does, at user level too).
    """

    POLICIES = ("error", "truncate")

    def __init__(
        self,
        policy: object,
        *,
        key: NoiseKey,
        stream: str,
        max_items: int | None,
        user_level: bool = False,
    ) -> None:
        if policy not in self.POLICIES:
            raise ValueError(f"on_invalid must be one of {self.POLICIES}, got {policy!r}")
        if policy == "truncate" and user_level:
            raise ValueError(
                "on_invalid='truncate' works at event level only: with max_items_per_user "
                "and max_count_per_item each (user, items) event is checked whole; truncate "
                "events before step_batch, or leave on_invalid at 'error'"
            )
        self.policy = str(policy)
        self.max_items = max_items
        self._source = truncation_source(key, stream) if self.policy == "truncate" else None
        self.stats = TruncationStats()

    @property
    def truncating(self) -> bool:
        return self._source is not None

    def events(
        self, events: Iterable[object], index: Container[Hashable] | None = None, *, t: int
    ) -> tuple[list[tuple[Hashable, ...]], TruncationStats]:
        """The events of step ``t``, checked and (if truncating) cut; the step's stats delta.

        Nothing is recorded here: the caller adds the delta to :attr:`stats`
        with :meth:`commit` once the whole step has been accepted.
        """
        out: list[tuple[Hashable, ...]] = []
        delta = TruncationStats()
        over: list[int] = []  # the events to cut, all at once
        for event in events:
            delta.events += 1
            if not self.truncating:
                out.append(normalise_event(event, self.max_items))
                continue
            items = normalise_event(event, None)
            kept = items
            if index is not None:
                kept = tuple(i for i in kept if i in index)
            final = len(kept)
            if self.max_items is not None and final > self.max_items:
                over.append(len(out))
                final = self.max_items
            delta.occurrences += len(items)
            if final < len(items):
                delta.truncated_events += 1
                delta.dropped += len(items) - final
            out.append(kept)
        if over:
            assert self._source is not None and self.max_items is not None
            table: dict[Hashable, int] = {}
            codes = [table.setdefault(i, len(table)) for e in over for i in out[e]]
            offsets = np.cumsum([0] + [len(out[e]) for e in over])
            keep = keep_ranked(
                self._source, t, list(table), np.asarray(codes, np.int64), offsets, self.max_items
            ).tolist()
            for j, e in enumerate(over):
                lo = int(offsets[j])
                out[e] = tuple(
                    i for i, k in zip(out[e], keep[lo : lo + len(out[e])], strict=True) if k
                )
        return out, delta

    def commit(self, delta: TruncationStats) -> None:
        s = self.stats
        s.events += delta.events
        s.truncated_events += delta.truncated_events
        s.occurrences += delta.occurrences
        s.dropped += delta.dropped
