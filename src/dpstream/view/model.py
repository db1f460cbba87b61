"""What the live view knows: the last release's top items and a few items' histories.

Memory is bounded by design, whatever the number of items or releases:

* the last release: only its top ``top`` items (and how many items it has);
  the full line is parsed and dropped;
* the history of at most ``max_tracked`` items (the ones a page shows), each
  three numbers per step where it was released; an item asked for later is
  filled in by one pass over the file (:meth:`ViewModel.select`, one pass at
  a time), reading only the lines that can hold it, and of each only the
  counts asked for (:mod:`.extract`);
* the last few raw lines (to step back over a malformed last line).

Between polls only the newest complete line is parsed in full; earlier new
lines are parsed only if they may hold a tracked item (a byte search for the
item's JSON-encoded name, which every line holding it contains, as dpstream
writes them). A complete line that is not a valid release is skipped and
counted, never fatal.

Everything here comes from the published files only: the releases file and
its metadata sidecar (``dpstream.run.meta``), never the state, key or events.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import stat
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ..run.meta import read_run_meta, sidecar_path
from .extract import extract_items
from .follow import MAX_LINE_BYTES, FileFollower, iter_lines

__all__ = [
    "ParsedRelease",
    "parse_release",
    "top_items",
    "Series",
    "Snapshot",
    "ViewModel",
    "is_number",
    "MAX_MAGNITUDE",
    "MAX_T",
    "DEFAULT_TOP",
    "DEFAULT_SELECTED",
    "MAX_SELECTED",
    "MAX_TRACKED",
    "DEFAULT_POLL",
    "DEFAULT_MAX_STREAMS",
]

#: Items shown in the bar chart by default (``--top``).
DEFAULT_TOP = 20
#: Items whose history a page shows when the user has chosen none.
DEFAULT_SELECTED = 3
#: The most items one page may ask the history of.
MAX_SELECTED = 8
#: The most items whose history the server keeps (least recently asked dropped).
MAX_TRACKED = 32
#: Seconds between two looks at the releases file (:class:`~dpstream.view.server.ViewServer`).
DEFAULT_POLL = 0.25
#: Event streams open at once (one per open page); more are answered 503 (the server's).
DEFAULT_MAX_STREAMS = 32
#: Raw lines kept to step back over a malformed last line.
_KEEP_RAW = 4
#: The normal 97.5% quantile, for a 95% interval when the sidecar states no ``z95``
#: (:data:`dpstream.planning.Z95`; stated here, so that the view imports no mechanism).
Z95 = 1.959963984540054
#: The largest magnitude of a number the view takes from a file (a count, a noise std, a
#: threshold, z): sums and products of a few such numbers stay finite in a chart's scale.
MAX_MAGNITUDE = 1e100
#: The largest step t a release may have (a history keeps t as a 64-bit integer).
MAX_T = 2**63 - 1


#: The most a metadata sidecar may hold (a run's public settings: a few kilobytes).
_META_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class ParsedRelease:
    """One valid release line: its step, released counts and meta."""

    t: int
    released: dict[str, float]
    meta: dict[str, Any]


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a JSON number the page can draw: of magnitude at most
    :data:`MAX_MAGNITUDE` (not NaN, not infinite, not an integer too large for a float,
    which is compared as it is, never converted)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE
    )


def parse_release(data: bytes) -> ParsedRelease:
    """Parse one JSON Lines release (``{"t": .., "released": {..}, "meta": {..}}``).

    A release's numbers must be ones the page can draw (:func:`is_number`): a count,
    or a ``noise_std`` or ``threshold`` in its meta, beyond :data:`MAX_MAGNITUDE` (an
    integer of 300 digits, say) makes the line malformed, and so does a t beyond
    :data:`MAX_T`.

    Raises:
        ValueError: the line is not a release, saying why.
    """
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_T:
        raise ValueError('"t" is not an integer in 1..2^63-1')
    released = obj.get("released")
    if not isinstance(released, dict):
        raise ValueError('"released" is not an object')
    values = released.values()
    kinds = set(map(type, values))  # C-speed checks: a release may hold 10^6 items
    if not kinds <= {int, float}:
        raise ValueError("a released count is not a number")
    try:
        finite = all(map(math.isfinite, values))
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise ValueError("a released count is not a finite number")
    if values and max(map(abs, values)) > MAX_MAGNITUDE:
        raise ValueError(f"a released count is beyond {MAX_MAGNITUDE:g} in magnitude")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError('"meta" is not an object')
    _check_meta(meta)
    return ParsedRelease(t, released, meta)


def _check_meta(meta: dict[str, Any]) -> None:
    """Refuse a release's meta whose ``noise_std`` or ``threshold`` the page cannot draw."""
    for key in ("noise_std", "threshold"):
        value = meta.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not is_number(value):
                raise ValueError(f'"meta"."{key}" is not a finite number up to {MAX_MAGNITUDE:g}')


def _items_of(
    data: bytes, items: Sequence[str]
) -> tuple[int, dict[str, int | float], dict[str, Any]]:
    """``(t, {item: count}, meta)`` of a release line, for those of ``items`` it holds.

    A line in dpstream's own layout is read without parsing its other items
    (:func:`~dpstream.view.extract.extract_items`); any other is parsed in full.

    Raises:
        ValueError: the line is not a release (:func:`parse_release`).
    """
    got = extract_items(data, items)
    if got is None:
        rel = parse_release(data)
        return rel.t, {i: rel.released[i] for i in items if i in rel.released}, rel.meta
    _check_meta(got[2])
    return got


def top_items(released: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The ``n`` largest counts, largest first, ties by item name; O(len * log n).

    Exactly ``sorted(released.items(), key=lambda kv: (-kv[1], kv[0]))[:n]``
    (tests compare the two), without sorting every item.
    """
    if n <= 0 or not released:
        return []
    best = heapq.nlargest(n, released.items(), key=lambda kv: kv[1])
    cut = best[-1][1]
    above = sorted((kv for kv in best if kv[1] > cut), key=lambda kv: (-kv[1], kv[0]))
    ties = sorted(k for k, v in released.items() if v == cut)
    return above + [(k, cut) for k in ties[: n - len(above)]]


@dataclass
class Series:
    """An item's released counts over time: step, count and noise std, one entry per release."""

    t: array = field(default_factory=lambda: array("q"))
    value: array = field(default_factory=lambda: array("d"))
    std: array = field(default_factory=lambda: array("d"))

    def add(self, t: int, value: float, std: float) -> None:
        self.t.append(t)
        self.value.append(value)
        self.std.append(std)

    def nbytes(self) -> int:
        return sum(a.buffer_info()[1] * a.itemsize for a in (self.t, self.value, self.std))


@dataclass(frozen=True)
class Snapshot:
    """Everything a page shows, copied out of the model (safe to render without the lock)."""

    path: str
    status: str  # "missing", "waiting", "live", "complete", "error" or "stale" (not updating)
    message: str | None
    meta: dict[str, Any] | None
    meta_error: str | None
    t: int | None
    horizon: int | None
    items_released: int
    top: list[tuple[str, float]]
    top_n: int
    noise_std: float | None
    noise_std_kind: str | None  # "step": this step's; "worst": the worst step's
    z: float
    threshold: float | None
    lines_read: int
    malformed: int
    last_problem: str | None
    history: dict[str, tuple[list[int], list[float], list[float]]]
    selected: list[str]
    auto: bool
    version: int
    updated_at: float | None


def _tokens(item: str) -> tuple[bytes, ...]:
    """Byte strings one of which every dpstream-written line holding ``item`` contains."""
    forms = {json.dumps(item, ensure_ascii=False), json.dumps(item, ensure_ascii=True)}
    return tuple(f.encode("utf-8", "surrogatepass") for f in forms)


def _other_format(first: bytes) -> str | None:
    """What a releases file is when its first line says it is not JSON Lines releases: a
    CSV output, a Parquet file, or the long JSON Lines rows (None: it may be releases)."""
    if first.startswith(b"t,item,value"):
        return "a CSV file"
    if first.startswith(b"PAR1"):
        return "a Parquet file"
    if first.startswith(b"{") and b'"item"' in first and b'"released"' not in first:
        return "a file of long rows (--output-format jsonl-long)"
    return None


class ViewModel:
    """The view's bounded state of one releases file; :meth:`refresh` reads what was appended.

    Thread-safe: every method takes :attr:`changed` (a condition), which is
    notified when :attr:`version` grows (a new release, a new sidecar, a new
    status), so a server can wait for it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        top: int = DEFAULT_TOP,
        meta_path: str | os.PathLike[str] | None = None,
        max_tracked: int = MAX_TRACKED,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"--top must be an integer >= 1, got {top!r}")
        if max_tracked < MAX_SELECTED:
            raise ValueError(f"max_tracked must be >= {MAX_SELECTED}, got {max_tracked}")
        self.path = Path(path)
        self.meta_path = Path(meta_path) if meta_path is not None else sidecar_path(path)
        self.top_n = top
        self.max_tracked = max_tracked
        self.max_line_bytes = max_line_bytes
        self.changed = threading.Condition()
        self.version = 0
        self._follower = FileFollower(self.path, max_line_bytes=max_line_bytes)
        self._meta: dict[str, Any] | None = None
        self._meta_error: str | None = None
        self._meta_stamp: tuple[int, int] | None = None
        self._tracked: OrderedDict[str, Series] = OrderedDict()
        self._tokens: dict[str, tuple[bytes, ...]] = {}
        self._filling: set[str] = set()  # items whose history a pass is reading in
        self._pending: set[str] = set()  # items asked for, waiting for the next pass
        #: one pass over the file at a time (:meth:`select`)
        self._scan_lock = threading.Lock()
        #: why the last refresh failed (the page then says it is not being updated)
        self._failure: str | None = None
        self._generation = 0  # grows when the file is replaced (histories start over)
        self._reset_release()
        self._status = "waiting"
        self._message: str | None = None

    # -- reading -------------------------------------------------------------
    def _reset_release(self) -> None:
        self._release: ParsedRelease | None = None
        self._top: list[tuple[str, float]] = []
        self._items_released = 0
        self._malformed = 0
        self._last_problem: str | None = None
        self._updated_at: float | None = None
        #: the last lines read in this poll: (number, bytes, parsed release, None if
        #: malformed, or False if not parsed yet)
        self._raw: deque[tuple[int, bytes, Any]] = deque(maxlen=_KEEP_RAW)
        self._not_jsonl = False
        for item in self._tracked:
            self._tracked[item] = Series()
        self._generation += 1

    def refresh(self) -> bool:
        """Read the lines appended since the last call; True if what a page shows changed.

        An unexpected exception (a bug: a malformed line is skipped, an unreadable
        file is a status) is raised after the model has recorded it: until a refresh
        succeeds again, a snapshot's status is ``"stale"`` and its message says that
        what is shown is not being updated.
        """
        with self.changed:
            before = (self.version, self._status, self._message)
            try:
                changed = self._refresh_meta()
                try:
                    changed |= self._refresh_file()
                except OSError as exc:
                    self._status, self._message = "error", f"cannot read {self.path}: {exc}"
            except Exception as exc:
                failure = (
                    f"The view cannot read {self.path} ({type(exc).__name__}: "
                    f"{str(exc)[:200]}): what is shown is not being updated. It tries again "
                    "at every poll."
                )
                if failure != self._failure:
                    self._failure = failure
                    self.version += 1
                    self.changed.notify_all()
                raise
            if self._failure is not None:
                self._failure, changed = None, True
            if changed or (self._status, self._message) != before[1:]:
                self.version += 1
                self.changed.notify_all()
                return True
            return False

    def _refresh_meta(self) -> bool:
        try:
            st = os.stat(self.meta_path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._meta_stamp:
            return False
        self._meta_stamp = stamp
        try:
            # a pipe would wait for a writer and a device never end: read files only
            if stamp is not None and not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{self.meta_path} is not a regular file (a pipe or a device)")
            if stamp is not None and st.st_size > _META_MAX_BYTES:
                raise ValueError(f"{self.meta_path} is too large to be a run's metadata file")
            self._meta, self._meta_error = read_run_meta(self.meta_path), None
        except (OSError, ValueError) as exc:
            self._meta, self._meta_error = None, str(exc)
        return True

    def _refresh_file(self) -> bool:
        state = self._follower.check()
        if state == "missing":
            self._status = "missing"
            self._message = (
                f"{self.path} does not exist (yet): waiting for it. The view "
                "shows it as soon as a run writes it."
            )
            return False
        if state == "not-regular":  # what was shown is another file's: gone
            changed = self._release is not None or self._malformed > 0
            if changed:
                self._reset_release()
            self._status = "error"
            self._message = (
                f"{self.path} is not a regular file (a pipe or a device): the view reads "
                "a file of releases; it reads it again once a run writes one there"
            )
            return changed
        changed = state == "reset"
        if changed:
            self._reset_release()
        if self._not_jsonl:
            return changed
        tokens = [tok for toks in self._tokens.values() for tok in toks]
        for line in self._follower.read_lines():
            changed = True
            if line.data is None:
                self._problem(line.number, f"longer than {self.max_line_bytes} bytes")
                continue
            if not line.data.strip():
                continue
            kind = _other_format(line.data) if line.number == 1 else None
            if kind is not None:
                self._not_jsonl = True
                self._status = "error"
                self._message = (
                    f"{self.path} is {kind}; the view reads JSON Lines "
                    "releases (dpstream run --output-format jsonl)"
                )
                return True
            parsed: ParsedRelease | None | bool = False  # False: not parsed yet
            if tokens and any(tok in line.data for tok in tokens):
                parsed = self._parse(line.number, line.data)
                if parsed is not None:
                    self._record(parsed, self._tracked.keys())
            self._raw.append((line.number, line.data, parsed))
        if self._raw:
            self._take_newest()
        self._set_status()
        return changed

    def _take_newest(self) -> None:
        """Show the newest valid line among the last raw ones (a malformed one is skipped)."""
        for number, data, parsed in reversed(self._raw):
            rel = self._parse(number, data) if parsed is False else parsed
            if rel is not None:
                self._release = rel
                self._top = top_items(rel.released, self.top_n)
                self._items_released = len(rel.released)
                self._updated_at = time.time()
                break
        self._raw.clear()

    def _parse(self, number: int, data: bytes) -> ParsedRelease | None:
        try:
            return parse_release(data)
        except ValueError as exc:
            self._problem(number, str(exc))
            return None

    def _problem(self, number: int, why: str) -> None:
        self._malformed += 1
        self._last_problem = f"line {number}: {why} (skipped)"

    def _set_status(self) -> None:
        horizon = self._horizon()
        if self._release is None:
            self._status = "waiting"
            self._message = f"{self.path} holds no release yet: waiting for the first one."
        elif horizon is not None and self._release.t >= horizon:
            self._status, self._message = "complete", None
        else:
            self._status, self._message = "live", None

    def _horizon(self) -> int | None:
        h = (self._meta or {}).get("horizon")
        return h if isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_T else None

    def _std_of(self, meta: dict[str, Any]) -> tuple[float | None, str | None]:
        """A release's noise std from its ``meta``, else the sidecar's worst; and which."""
        std = meta.get("noise_std")
        if is_number(std) and std >= 0:
            return float(std), "step"
        worst = (self._meta or {}).get("noise_std_worst")
        if is_number(worst) and worst >= 0:
            return float(worst), "worst"
        return None, None

    def _record(self, rel: ParsedRelease, items: Iterable[str]) -> None:
        std, _ = self._std_of(rel.meta)
        for item in items:
            value = rel.released.get(item)
            if value is not None:
                self._tracked[item].add(rel.t, float(value), math.nan if std is None else std)

    # -- histories -------------------------------------------------------------
    def select(self, items: Sequence[str]) -> None:
        """Keep the histories of ``items`` (at most :data:`MAX_SELECTED`), filling in new ones.

        A new item's history is read in one pass over the part of the file
        already read, parsing only the lines that may hold it. The pass runs
        without the lock (polling and other pages go on); the lines appended
        meanwhile are read under it, and the item is then followed like the
        others. If another page is filling the same item, this returns at once
        and that page's fill announces the result (a new version).

        One pass runs at a time (each reads the whole file and holds a line, so
        that pages asking at once would multiply the memory and the reading): a
        page asking for new items while another pass runs waits for it, then
        reads in one pass up to :data:`MAX_SELECTED` items asked for meanwhile,
        its own first (a page whose items another pass read returns at once
        when its turn comes).
        """
        items = list(dict.fromkeys(items))[:MAX_SELECTED]
        with self.changed:
            for item in items:
                if item in self._tracked:
                    self._tracked.move_to_end(item)
            new = [
                i
                for i in items
                if i not in self._tracked and i not in self._filling and i not in self._pending
            ]
            self._pending.update(new)
        if not new:
            return
        with self._scan_lock:
            with self.changed:
                mine = [i for i in new if i in self._pending]
                if not mine:
                    return  # another page's pass read them
                others = [i for i in self._pending if i not in mine]
                batch = mine + others[: MAX_SELECTED - len(mine)]  # evicts no more than one page's
                self._pending.difference_update(batch)
                self._filling.update(batch)
            try:
                self._fill(batch)
            finally:
                with self.changed:
                    self._filling.difference_update(batch)

    def _fill(self, items: list[str]) -> None:
        tokens = [tok for i in items for tok in _tokens(i)]
        while True:
            with self.changed:
                generation, end = self._generation, self._follower.offset
            found = self._scan(items, tokens, 0, end)  # the long part, unlocked
            with self.changed:
                if generation != self._generation:
                    continue  # the file was replaced meanwhile: start over
                if self._follower.offset > end:  # appended during the scan: a short read
                    more = self._scan(items, tokens, end, self._follower.offset)
                    for item in items:
                        for rec in zip(more[item].t, more[item].value, more[item].std, strict=True):
                            found[item].add(*rec)
                for item in items:
                    self._tracked[item] = found[item]
                    self._tokens[item] = _tokens(item)
                while len(self._tracked) > self.max_tracked:
                    old, _ = self._tracked.popitem(last=False)
                    del self._tokens[old]
                self.version += 1  # pages waiting for this history see it
                self.changed.notify_all()
                return

    def _scan(
        self, items: list[str], tokens: list[bytes], start: int, end: int
    ) -> dict[str, Series]:
        """The releases of ``items`` in bytes ``start..end`` of the file."""
        found = {item: Series() for item in items}
        if end <= start:
            return found
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return found
        with fh:
            for line in iter_lines(fh, start, end, 1, self.max_line_bytes):
                if line.data is None or not any(tok in line.data for tok in tokens):
                    continue
                try:
                    t, values, meta = _items_of(line.data, items)
                except ValueError:
                    continue
                std, _ = self._std_of(meta)
                for item, value in values.items():
                    found[item].add(t, float(value), math.nan if std is None else std)
        return found

    def memory_bytes(self) -> int:
        """Bytes held in the histories and the last raw lines (for the benchmark)."""
        with self.changed:
            return sum(s.nbytes() for s in self._tracked.values()) + sum(
                len(d) for _, d, _ in self._raw
            )

    # -- what a page shows -----------------------------------------------------
    def snapshot(self, selected: Sequence[str] | None = None) -> Snapshot:
        """The state to render; ``selected=None`` shows the current top items' histories."""
        auto = selected is None
        with self.changed:
            chosen = (
                [i for i, _ in self._top[:DEFAULT_SELECTED]]
                if selected is None
                else list(dict.fromkeys(selected))[:MAX_SELECTED]
            )
        self.select(chosen)
        with self.changed:
            empty = Series()
            series = {i: self._tracked.get(i, empty) for i in chosen}
            history = {
                i: (s.t.tolist(), s.value.tolist(), s.std.tolist()) for i, s in series.items()
            }
            rel = self._release
            std, kind = self._std_of(rel.meta) if rel is not None else (None, None)
            meta = self._meta
            z = meta.get("z95") if meta else None
            threshold = rel.meta.get("threshold") if rel is not None else None
            if not is_number(threshold) and meta:
                threshold = meta.get("threshold")
            return Snapshot(
                path=str(self.path),
                status="stale" if self._failure else self._status,
                message=self._failure or self._message,
                meta=meta,
                meta_error=self._meta_error,
                t=rel.t if rel else None,
                horizon=self._horizon(),
                items_released=self._items_released,
                top=list(self._top),
                top_n=self.top_n,
                noise_std=std,
                noise_std_kind=kind,
                z=float(z) if is_number(z) and z > 0 else Z95,
                threshold=float(threshold) if is_number(threshold) else None,
                lines_read=self._follower.lines,
                malformed=self._malformed,
                last_problem=self._last_problem,
                history=history,
                selected=chosen,
                auto=auto,
                version=self.version,
                updated_at=self._updated_at,
            )
