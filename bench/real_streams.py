"""Benchmark: every mechanism on real streams, as ``dpstream run`` would publish them.

Run by hand (a few minutes on one core)::

    python bench/real_streams.py                    # this checkout
    DPSTREAM_BENCH_GIT_DIR=/path/to/git.git python bench/real_streams.py \\
        --streams changelog-monthly,git --epsilons 1 --keys 3 --counters tree,blt
    python bench/real_streams.py --before 6160f2b   # also the code of that git revision

Streams (real data, nothing simulated):

* ``faa``: the bundled FAA wildlife-strike reports (``dpstream demo``'s data):
  10,000 reports, one a event with two items (species, airport), one step a
  week, T = 656, a known domain of 87 items.
* ``changelog``: the Debian changelogs installed on this machine
  (``/usr/share/doc/*/changelog.Debian.gz``): one changelog entry is one event,
  its items are the distinct lower-case words of the entry's text; one step a
  week from Monday 1995-01-02 (a public calendar, so the first weeks have no
  event) to 2026-01-05; entries dated outside are left out. The known domain
  is every word of the stream (tens of thousands).
* ``changelog-monthly``: the same entries, one step a calendar month from
  January 1995 (T = 379).
* ``git``: the file paths each commit of a real repository touched (merges
  left out), one step a week from the first commit's week; the repository is
  the git directory in ``$DPSTREAM_BENCH_GIT_DIR`` (e.g. a bare clone of
  github.com/git/git), the stream is cached in ``bench/out/git.jsonl`` (not
  committed: ~4 MB). ``--max-items 7``.

Each mechanism is built as the command line builds it (``dpstream.cli.
build_mechanism`` with the command's defaults), fed the events of each step
(events with more than ``--max-items`` items truncated by the keyed truncator,
as ``--on-invalid truncate`` does), and its releases are published as the
command publishes them (rounded; with the command's default post-processing of
counts where the checkout has one). Metrics, on the published values:

* top-10 recall at T and averaged over the steps t > T/2: the share of the
  10 largest published counts whose true count is at least the true 10th
  largest (ties at the boundary count as hits);
* median |published - true| over all published (item, step) pairs (sampled
  every ``T // 200`` steps and at T);
* the share of published counts that are negative, and of (item, step) pairs
  published at t-1 and t whose count went down;
* the first step with any published item;
* the mean |published - true| over the true top-20 items that are published
  (at the steps the median samples; the truth counts every occurrence, so truncation's
  undercount is part of it);
* ``zero-sel``: whether a top-k selection was published that was made at a step
  when every true count was 0 (``yes``/``no``; ``-`` for mechanisms that do not
  select).

``one-shot gaussian at T`` is not a dpstream mechanism: one release of the
final histogram only, computed here (:func:`oneshot_gaussian`), for the gap
between releasing at every step and releasing once. ``--counters tree,blt``
runs each mechanism with each counter (a mechanism without that counter gets
an n/a row: UnkBase with ``blt`` until it has one).

The noise key is fixed (a benchmark is a simulation of a release, never a
release); ``--keys N`` averages over N keys. ``--before REV`` exports that
revision's ``src`` with ``git archive`` and runs this script on it in a
subprocess, so "before" and "after" come from one command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import email.utils
import glob
import gzip
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TOP = 10


# --------------------------------------------------------------------------- streams


def faa_stream() -> tuple[int, list[list[list[str]]]]:
    """The bundled FAA reports: (T, events of each step)."""
    from dpstream.demo import load_birdstrikes

    horizon, events = load_birdstrikes()
    steps: list[list[list[str]]] = [[] for _ in range(horizon)]
    for t, items in events:
        steps[t - 1].append(list(dict.fromkeys(items)))
    return horizon, steps


_HEAD = re.compile(r"^\S+ \([^)]*\) [^;]*;")
_TRAIL = re.compile(r"^ -- .*?  (.*)$")
_WORD = re.compile(r"[a-z][a-z0-9+\-]{2,}")
CHANGELOG_START = dt.datetime(1995, 1, 2, tzinfo=dt.timezone.utc)  # a Monday
CHANGELOG_END = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)


def changelog_stream() -> tuple[int, list[list[list[str]]]]:
    """Debian changelog entries on this machine as a weekly word stream."""
    files = sorted({os.path.realpath(p) for p in glob.glob("/usr/share/doc/*/changelog.Debian.gz")})
    if not files:
        raise SystemExit("no /usr/share/doc/*/changelog.Debian.gz on this machine")
    horizon = (CHANGELOG_END - CHANGELOG_START).days // 7
    steps: list[list[list[str]]] = [[] for _ in range(horizon)]
    timed: list[tuple[float, str, list[str]]] = []
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
            body: list[str] = []
            inside = False
            for line in fh:
                line = line.rstrip("\n")
                if _HEAD.match(line):
                    body, inside = [], True
                    continue
                m = _TRAIL.match(line)
                if m and inside:
                    inside = False
                    try:
                        when = email.utils.parsedate_to_datetime(m.group(1).strip())
                    except (TypeError, ValueError):
                        continue
                    if when.tzinfo is None:
                        continue
                    words = sorted(set(_WORD.findall(" ".join(body).lower())))
                    timed.append((when.timestamp(), path, words))
                elif inside:
                    body.append(line)
    timed.sort(key=lambda e: (e[0], e[1]))
    for stamp, _, words in timed:
        when = dt.datetime.fromtimestamp(stamp, tz=dt.timezone.utc)
        if CHANGELOG_START <= when < CHANGELOG_END:
            steps[(when - CHANGELOG_START).days // 7].append(words)
    return horizon, steps


#: the monthly changelog stream: 379 months from 1995-01 (T = 379, as in issue #30)
CHANGELOG_MONTHS = 379


def changelog_monthly_stream() -> tuple[int, list[list[list[str]]]]:
    """The same changelog entries, one step a calendar month from January 1995."""
    _, weekly = changelog_stream()
    steps: list[list[list[str]]] = [[] for _ in range(CHANGELOG_MONTHS)]
    for week, events in enumerate(weekly):
        day = CHANGELOG_START + dt.timedelta(days=7 * week)
        month = (day.year - 1995) * 12 + day.month - 1
        if month < CHANGELOG_MONTHS:
            steps[month].extend(events)
    return CHANGELOG_MONTHS, steps


OUT = HERE / "out"  # cached streams (not committed)
GIT_DIR_ENV = "DPSTREAM_BENCH_GIT_DIR"


def git_stream() -> tuple[int, list[list[list[str]]]]:
    """The file paths each commit of a real repository touched, one step a week.

    One commit (merges left out) is one event; its items are the paths it
    changed (``git log --name-only``). Step 1 is the week of the first
    commit (weeks start on the commit date's Monday, UTC). The repository is
    the git directory in $DPSTREAM_BENCH_GIT_DIR (e.g. a bare clone of
    https://github.com/git/git); the stream is cached in bench/out/git.jsonl.
    """
    cache = OUT / "git.jsonl"
    if not cache.exists():
        git_dir = os.environ.get(GIT_DIR_ENV)
        if not git_dir:
            raise SystemExit(f"set {GIT_DIR_ENV} to a git directory (e.g. a clone of git/git)")
        log = subprocess.run(
            [
                "git",
                "--git-dir",
                git_dir,
                "log",
                "--no-merges",
                "--reverse",
                "--name-only",
                "--format=%x00%ct",
            ],
            check=True,
            capture_output=True,
        ).stdout.decode("utf-8", "replace")
        OUT.mkdir(exist_ok=True)
        with open(cache, "w") as fh:
            for block in log.split("\0")[1:]:
                head, _, rest = block.partition("\n")
                paths = sorted({p for p in rest.split("\n") if p})
                if paths:
                    fh.write(json.dumps([int(head), paths]) + "\n")
    commits = [json.loads(line) for line in cache.read_text().splitlines()]
    commits.sort(key=lambda c: c[0])
    first = dt.datetime.fromtimestamp(commits[0][0], tz=dt.timezone.utc)
    monday = dt.datetime(first.year, first.month, first.day, tzinfo=dt.timezone.utc)
    monday -= dt.timedelta(days=monday.weekday())
    weeks = [int((c[0] - monday.timestamp()) // (7 * 86400)) for c in commits]
    horizon = weeks[-1] + 1
    steps: list[list[list[str]]] = [[] for _ in range(horizon)]
    for week, (_, paths) in zip(weeks, commits, strict=True):
        steps[week].append(paths)
    return horizon, steps


#: stream name -> (loader, --max-items for the mechanisms that need it)
STREAMS = {
    "faa": (faa_stream, 2),
    "changelog": (changelog_stream, 20),
    "changelog-monthly": (changelog_monthly_stream, 20),
    "git": (git_stream, 7),
}


# --------------------------------------------------------------------------- mechanisms


def cli_defaults(cli: Any) -> dict[str, Any]:
    """The command's option defaults (this checkout's, or the one under test)."""
    return {o.dest: o.default for o in cli.MECH_OPTS + cli.RUN_OPTS}


def build(cli: Any, name: str, opts: dict[str, Any], key: Any, domain: list[str] | None) -> Any:
    """``build_mechanism`` as ``dpstream run`` calls it; drop --max-items where refused,
    and ``--counter tree`` for a mechanism whose only counter is the tree."""
    if cli.MECHANISMS[name].domain == "none":
        domain = None
    try:
        return cli.build_mechanism(name, opts, key, domain)
    except ValueError as exc:
        if "--max-items does not apply" in str(exc):
            return build(cli, name, {**opts, "max_items": None}, key, domain)
        if "--counter does not apply" in str(exc) and opts.get("counter") == "tree":
            return build(cli, name, {**opts, "counter": None}, key, domain)
        raise


MECHANISMS = {
    # row label -> (CLI mechanism, extra options, pass --max-items)
    "known": ("known", {}, True),
    "unknown": ("unknown", {}, True),
    "top-k": ("top-k", {"k": TOP}, True),
    "top-k no --max-items": ("top-k", {"k": TOP}, False),
    "top-k s=10 no --max-items": ("top-k", {"k": TOP, "switches": 10}, False),
    "meta gumbel": ("meta", {"oneshot": "gumbel", "k": TOP}, False),
    "one-shot gaussian at T": ("oneshot", {}, True),
}
#: the rows run by default (meta is slow on long streams: ask for it with --mechanisms)
DEFAULT_MECHANISMS = (
    "known",
    "unknown",
    "top-k",
    "top-k no --max-items",
    "top-k s=10 no --max-items",
    "one-shot gaussian at T",
)
#: the true top items whose published counts the error column averages over
ERR_TOP = 20


# --------------------------------------------------------------------------- metrics


class Metrics:
    """Accumulates the metrics of one run over the published releases."""

    def __init__(self, horizon: int, index: dict[str, int]) -> None:
        self.horizon = horizon
        self.index = index
        self.stride = max(1, horizon // 200)
        self.prev = np.full(len(index), np.nan)  # last published value per item
        self.recall: list[tuple[int, float]] = []
        self.errors: list[np.ndarray] = []
        self.n_values = self.n_negative = self.n_pairs = self.n_down = 0
        self.first: int | None = None
        self.zero_selection = False
        self.top_errors: list[np.ndarray] = []
        self._items_id: int | None = None
        self._pos: np.ndarray | None = None

    def positions(self, items: Sequence[str]) -> np.ndarray:
        if self._items_id == id(items) and self._pos is not None:
            return self._pos
        pos = np.fromiter((self.index[str(i)] for i in items), dtype=np.int64, count=len(items))
        if len(items) > 1000:  # a whole domain, released every step: cache
            self._items_id, self._pos = id(items), pos
        return pos

    def add(
        self,
        t: int,
        items: Sequence[str],
        values: np.ndarray,
        truth: np.ndarray,
        selected_on_zero: bool,
    ) -> None:
        n = len(values)
        if n and self.first is None:
            self.first = t
        if n and selected_on_zero:
            self.zero_selection = True
        pos = self.positions(items)
        vals = np.asarray(values, dtype=np.float64)
        self.n_values += n
        self.n_negative += int((vals < 0).sum())
        before = self.prev[pos]
        had = ~np.isnan(before)
        self.n_pairs += int(had.sum())
        self.n_down += int((vals[had] < before[had]).sum())
        self.prev[:] = np.nan
        self.prev[pos] = vals
        if t % self.stride == 0 or t == self.horizon:
            self.errors.append(np.abs(vals - truth[pos]))
            top = np.argpartition(-truth, ERR_TOP - 1)[:ERR_TOP]
            on = np.isin(pos, top)
            self.top_errors.append(np.abs(vals[on] - truth[pos[on]]))
        if t > self.horizon // 2 or t == self.horizon:
            self.recall.append((t, self._recall(pos, vals, truth)))

    @staticmethod
    def _recall(pos: np.ndarray, vals: np.ndarray, truth: np.ndarray) -> float:
        if len(vals) == 0:
            return 0.0
        k = min(TOP, len(vals))
        top = pos[np.argsort(-vals, kind="stable")[:k]]
        kth = np.partition(truth, len(truth) - TOP)[len(truth) - TOP]
        return min(TOP, int((truth[top] >= kth).sum())) / TOP

    def summary(self) -> dict[str, Any]:
        errs = np.concatenate(self.errors) if self.errors else np.zeros(0)
        top_errs = np.concatenate(self.top_errors) if self.top_errors else np.zeros(0)
        last = [r for t, r in self.recall if t == self.horizon]
        second = [r for t, r in self.recall if t > self.horizon // 2]
        return {
            "recall_T": last[0] if last else 0.0,
            "recall_half": float(np.mean(second)) if second else 0.0,
            "median_abs_error": float(np.median(errs)) if errs.size else float("nan"),
            "mean_abs_error_top20": float(top_errs.mean()) if top_errs.size else float("nan"),
            "negative": self.n_negative / self.n_values if self.n_values else 0.0,
            "decreasing": self.n_down / self.n_pairs if self.n_pairs else 0.0,
            "first_release": self.first,
            "zero_selection": self.zero_selection,
        }


def run_one(
    name: str,
    stream: str,
    epsilon: float,
    key_label: str,
    data: tuple[int, list[list[list[str]]]],
    max_items: int,
    counter: str | None = None,
) -> dict[str, Any]:
    """One mechanism on one stream at one epsilon: the metrics and a few facts."""
    from dpstream import cli
    from dpstream.io import KeyedTruncator
    from dpstream.noise import NoiseKey, NoiseSource

    horizon, steps = data
    domain = sorted({i for step in steps for ev in step for i in ev})
    index = {item: i for i, item in enumerate(domain)}
    key = NoiseKey.from_bytes(hashlib.sha256(f"bench-real-streams/{key_label}".encode()).digest())
    mech_name, extra, with_max = MECHANISMS[name]
    if mech_name == "oneshot":
        return oneshot_gaussian(name, stream, epsilon, key_label, data, max_items)
    opts = {
        **cli_defaults(cli),
        "horizon": horizon,
        "epsilon": epsilon,
        "delta": 1e-6,
        "max_items": max_items if with_max else None,
        **extra,
    }
    if counter is not None:
        opts["counter"] = counter
    mech = build(cli, mech_name, opts, key, domain)
    publish = make_publisher(cli, opts)
    limit = getattr(mech, "max_items", None)
    truncator = KeyedTruncator(NoiseSource(key, "bench/truncate"), limit or 1)
    truth = np.zeros(len(domain), dtype=np.int64)
    metrics = Metrics(horizon, index)
    selection_zero = False  # was the published selection made when all counts were 0?
    last_selection: object = None
    occurrences = dropped = ordinal = 0
    start = time.perf_counter()
    for t, events in enumerate(steps, start=1):
        batch = []
        for ev in events:
            ordinal += 1
            occurrences += len(ev)
            if limit is not None and len(ev) > limit:
                kept = truncator(ev, ordinal)
                dropped += len(ev) - len(kept)
                ev = list(kept)
            batch.append(ev)
        for ev in events:  # the truth counts every occurrence, truncated or not
            truth[[index[i] for i in ev]] += 1
        rel = mech.step_batch(batch)
        meta = getattr(rel, "meta", {}) or {}
        selection = meta.get("selection")
        if selection is not None and len(rel.items) and selection != last_selection:
            last_selection = selection
            selection_zero = not truth.any()
        elif (
            selection is None
            and len(rel.items)
            and last_selection is None
            and mech_name in ("top-k", "meta")
        ):
            last_selection = t
            selection_zero = not truth.any()
        items, values = publish(rel)
        metrics.add(t, items, values, truth, selection_zero and mech_name in ("top-k", "meta"))
    out = metrics.summary()
    out.update(
        mechanism=name,
        stream=stream,
        epsilon=epsilon,
        key=key_label,
        algorithm=getattr(mech, "mechanism_name", type(mech).__name__),
        counter=str(getattr(mech, "counter", "tree")),
        switches=getattr(mech, "switches", None),
        seconds=time.perf_counter() - start,
        dropped_share=dropped / occurrences if occurrences else 0.0,
        selects=mech_name in ("top-k", "meta"),
    )
    return out


def oneshot_gaussian(
    name: str,
    stream: str,
    epsilon: float,
    key_label: str,
    data: tuple[int, list[list[list[str]]]],
    max_items: int,
) -> dict[str, Any]:
    """A one-shot release of the final histogram only (t = T), for comparison.

    Gaussian noise calibrated to (epsilon, delta/2) by the exact curve (Balle
    and Wang) for L2 sensitivity sqrt(Delta0) (events truncated to Delta0
    items by the same keyed truncator), and an item is released only if its
    noisy count passes m = 1 + sigma Phi^-1(1 - (delta/2)/Delta0): an item that
    one event alone brings (count 1, at most Delta0 of them) passes with
    probability at most delta/2 in all. Then the top 10 of the released. A
    simulation (NumPy noise from a seeded generator), never a release path.
    """
    from scipy.special import ndtri

    from dpstream.io import KeyedTruncator
    from dpstream.noise import NoiseKey, NoiseSource
    from dpstream.privacy import mu_for_gaussian

    horizon, steps = data
    delta = 1e-6
    domain = sorted({i for step in steps for ev in step for i in ev})
    index = {item: i for i, item in enumerate(domain)}
    key = NoiseKey.from_bytes(hashlib.sha256(f"bench-real-streams/{key_label}".encode()).digest())
    truncator = KeyedTruncator(NoiseSource(key, "bench/truncate"), max_items)
    counts = np.zeros(len(domain), dtype=np.int64)
    truth = np.zeros(len(domain), dtype=np.int64)
    ordinal = 0
    for events in steps:
        for ev in events:
            ordinal += 1
            truth[[index[i] for i in ev]] += 1
            kept = truncator(ev, ordinal) if len(ev) > max_items else ev
            counts[[index[i] for i in kept]] += 1
    sigma = math.sqrt(max_items) / mu_for_gaussian(epsilon, delta / 2)
    threshold = 1 + sigma * float(-ndtri(delta / 2 / max_items))
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(f"oneshot/{key_label}".encode()).digest()[:8], "big")
    )
    noisy = np.where(counts > 0, counts + rng.normal(0.0, sigma, len(domain)), -np.inf)
    shown = np.flatnonzero(noisy > threshold)
    metrics = Metrics(horizon, index)
    items = [domain[i] for i in shown]
    metrics.add(horizon, items, np.rint(noisy[shown]), truth, False)
    out = metrics.summary()
    out.update(
        mechanism=name,
        stream=stream,
        epsilon=epsilon,
        key=key_label,
        algorithm=f"Gaussian + threshold at T (sigma {sigma:.1f}, m {threshold:.0f})",
        counter="-",
        switches=None,
        seconds=0.0,
        selects=False,
        dropped_share=float(1 - counts.sum() / truth.sum()),
    )
    out["recall_half"] = float("nan")  # one release, at T
    return out


def make_publisher(cli: Any, opts: dict[str, Any]) -> Any:
    """Release -> (items, published values), as the command writes them."""
    factory = getattr(cli, "make_postprocessor", None)
    post = factory(opts) if factory is not None else None

    def publish(rel: Any) -> tuple[Sequence[str], np.ndarray]:
        if post is not None:
            rel = post(rel)
        return rel.items, np.rint(np.asarray(rel.values, dtype=np.float64))

    return publish


# --------------------------------------------------------------------------- post-processing

PP_OPTIONS = {
    "raw": (False, False),
    "clamp": (True, False),
    "monotone": (False, True),
    "clamp+monotone": (True, True),
}
PP_MECHANISMS = ("known", "unknown", "top-k", "top-k no --max-items")


class ErrorStats:
    """Bias and error of published counts: all of them, and those of the true top 10."""

    def __init__(self, index_size: int) -> None:
        self.prev = np.full(index_size, np.nan)
        self.sum = self.n = self.sum_top = self.n_top = 0.0
        self.abs_all: list[np.ndarray] = []
        self.abs_top: list[np.ndarray] = []
        self.n_neg = self.n_pairs = self.n_down = 0

    def add(
        self,
        t: int,
        pos: np.ndarray,
        vals: np.ndarray,
        truth: np.ndarray,
        top: np.ndarray,
        sample: bool,
    ) -> None:
        err = vals - truth[pos]
        self.sum += float(err.sum())
        self.n += len(err)
        self.n_neg += int((vals < 0).sum())
        before = self.prev[pos]
        had = ~np.isnan(before)
        self.n_pairs += int(had.sum())
        self.n_down += int((vals[had] < before[had]).sum())
        self.prev[:] = np.nan
        self.prev[pos] = vals
        in_top = np.isin(pos, top)
        self.sum_top += float(err[in_top].sum())
        self.n_top += int(in_top.sum())
        if sample:
            self.abs_all.append(np.abs(err))
            self.abs_top.append(np.abs(err[in_top]))

    def summary(self) -> dict[str, float]:
        def med(parts: list[np.ndarray]) -> float:
            x = np.concatenate(parts) if parts else np.zeros(0)
            return float(np.median(x)) if x.size else float("nan")

        return {
            "bias": self.sum / self.n if self.n else float("nan"),
            "median_abs": med(self.abs_all),
            "bias_top": self.sum_top / self.n_top if self.n_top else float("nan"),
            "median_abs_top": med(self.abs_top),
            "negative": self.n_neg / self.n if self.n else 0.0,
            "decreasing": self.n_down / self.n_pairs if self.n_pairs else 0.0,
        }


def run_postprocessing(
    name: str, stream: str, epsilon: float, data: tuple[int, list[list[list[str]]]], max_items: int
) -> list[dict[str, Any]]:
    """One mechanism's releases under each post-processing option (same noise)."""
    from dpstream import cli
    from dpstream.io import KeyedTruncator
    from dpstream.noise import NoiseKey, NoiseSource
    from dpstream.postprocess import ReadableCounts

    horizon, steps = data
    domain = sorted({i for step in steps for ev in step for i in ev})
    index = {item: i for i, item in enumerate(domain)}
    key = NoiseKey.from_bytes(hashlib.sha256(b"bench-real-streams/pp").digest())
    mech_name, extra, with_max = MECHANISMS[name]
    opts = {
        **cli_defaults(cli),
        "horizon": horizon,
        "epsilon": epsilon,
        "delta": 1e-6,
        "max_items": max_items if with_max else None,
        **extra,
    }
    mech = build(cli, mech_name, opts, key, domain)
    ranked = mech_name != "known"
    pps = {
        label: ReadableCounts(clamp=c, monotone=m, round_counts=True, ranked=ranked)
        for label, (c, m) in PP_OPTIONS.items()
    }
    stats = {label: ErrorStats(len(domain)) for label in PP_OPTIONS}
    limit = getattr(mech, "max_items", None)
    truncator = KeyedTruncator(NoiseSource(key, "bench/truncate"), limit or 1)
    truth = np.zeros(len(domain), dtype=np.int64)
    stride = max(1, horizon // 200)
    cache: dict[int, np.ndarray] = {}
    ordinal = 0
    for t, events in enumerate(steps, start=1):
        batch = []
        for ev in events:
            ordinal += 1
            batch.append(list(truncator(ev, ordinal)) if limit and len(ev) > limit else ev)
            truth[[index[i] for i in ev]] += 1
        rel = mech.step_batch(batch)
        top = np.argpartition(-truth, TOP - 1)[:TOP]
        for label, pp in pps.items():
            out = pp(rel)
            key_id = id(rel.items)
            if len(out.items) > 1000 and out.items == rel.items:
                pos = cache.get(key_id)
                if pos is None:
                    pos = cache[key_id] = np.fromiter(
                        (index[str(i)] for i in rel.items), np.int64, len(rel.items)
                    )
            else:
                pos = np.fromiter((index[str(i)] for i in out.items), np.int64, len(out.items))
            stats[label].add(
                t,
                pos,
                np.asarray(out.values, dtype=np.float64),
                truth,
                top,
                t % stride == 0 or t == horizon,
            )
    return [
        {
            "stream": stream,
            "epsilon": epsilon,
            "mechanism": name,
            "algorithm": getattr(mech, "mechanism_name", type(mech).__name__),
            "option": label,
            **st.summary(),
        }
        for label, st in stats.items()
    ]


def pp_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| stream | eps | mechanism | option | bias | median abs err | bias, true top 10 "
        "| median abs err, true top 10 | negative | decreasing |",
        "|" + "---|" * 10,
    ]

    def num(x: float, fmt: str) -> str:
        return "-" if np.isnan(x) else format(x, fmt)

    for r in rows:
        lines.append(
            f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} ({r['algorithm']}) | "
            f"{r['option']} | {num(r['bias'], '+.1f')} | {num(r['median_abs'], '.0f')} | "
            f"{num(r['bias_top'], '+.1f')} | {num(r['median_abs_top'], '.0f')} | "
            f"{r['negative']:.0%} | {r['decreasing']:.0%} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- SparseGumb's gate

#: (switches, beta, start_beta) of the gate study: the default levels, a laxer
#: waiting round, and both laxer
GATE_SETTINGS = [
    (s, b, sb) for s in (None, 10) for b, sb in ((0.05, 0.05), (0.05, 0.2), (0.05, 0.5), (0.5, 0.5))
]


def gate_study(stream: str, epsilon: float, keys: int) -> list[dict[str, Any]]:
    """SparseGumb (no --max-items) with other levels of its automatic eta: beta (the
    switch tests) and start_beta (the waiting round), for the default s and s = 10.
    Aggregate mode on the true prefix counts (the same releases as event mode)."""
    from dpstream.mechanisms.topk import ContinualTopK, default_switches
    from dpstream.noise import NoiseKey

    horizon, steps = STREAMS[stream][0]()
    domain = sorted({i for step in steps for ev in step for i in ev})
    index = {item: i for i, item in enumerate(domain)}
    rows = []
    for switches, beta, start_beta in GATE_SETTINGS:
        s = default_switches(horizon) if switches is None else switches
        for k in range(keys):
            key = NoiseKey.from_bytes(hashlib.sha256(f"bench-gate/{k}".encode()).digest())
            mech = ContinualTopK(
                domain,
                horizon,
                k=TOP,
                switches=s,
                key=key,
                epsilon=epsilon,
                delta=1e-6,
                beta=beta,
                start_beta=start_beta,
            )
            truth = np.zeros(len(domain), dtype=np.int64)
            metrics = Metrics(horizon, index)
            for t, events in enumerate(steps, start=1):
                for ev in events:
                    truth[[index[i] for i in ev]] += 1
                rel = mech.release(t, truth)
                metrics.add(t, rel.items, np.rint(rel.values), truth, False)
            out = metrics.summary()
            rows.append(
                {
                    "stream": stream,
                    "switches": s,
                    "beta": beta,
                    "start_beta": start_beta,
                    "key": k,
                    "eta0": mech.start_eta_at(1),
                    "switches_used": mech.switches_used,
                    **out,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def gate_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| stream | s | beta | start_beta | eta0 | top-10 at T | top-10 2nd half "
        "| first release (median) | switches used (mean) |",
        "|" + "---|" * 9,
    ]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["stream"], r["switches"], r["beta"], r["start_beta"]), []).append(r)
    for (stream, s, beta, sb), rs in groups.items():
        firsts = [r["first_release"] for r in rs if r["first_release"] is not None]
        first = str(int(np.median(firsts))) if firsts else "never"
        lines.append(
            f"| {stream} | {s} | {beta:g} | {sb:g} | {rs[0]['eta0']:.0f} | "
            f"{np.mean([r['recall_T'] for r in rs]) * TOP:.1f}/10 | "
            f"{np.mean([r['recall_half'] for r in rs]) * TOP:.1f}/10 | {first} | "
            f"{np.mean([r['switches_used'] for r in rs]):.1f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


def run_all(
    streams: list[str],
    epsilons: list[float],
    mechanisms: list[str],
    keys: int,
    label: str,
    counters: Sequence[str | None] = (None,),
) -> list[dict[str, Any]]:
    rows = []
    for stream in streams:
        loader, max_items = STREAMS[stream]
        data = loader()
        for epsilon in epsilons:
            for name in mechanisms:
                for counter in (None,) if MECHANISMS[name][0] in ("oneshot", "meta") else counters:
                    for k in range(keys):
                        try:
                            row = run_one(name, stream, epsilon, f"{k}", data, max_items, counter)
                        except Exception as exc:  # a mechanism the checkout lacks
                            row = {
                                "mechanism": name,
                                "stream": stream,
                                "epsilon": epsilon,
                                "key": f"{k}",
                                "counter": counter or "default",
                                "error": f"{type(exc).__name__}: {exc}",
                            }
                        row["version"] = label
                        row["counter_asked"] = counter or "default"
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def average(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over keys of each (version, stream, epsilon, mechanism)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(
            (
                r["version"],
                r["stream"],
                r["epsilon"],
                r["mechanism"],
                r.get("counter_asked", "default"),
            ),
            [],
        ).append(r)
    out = []
    for (version, stream, eps, name, counter), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append({**rs[0]})
            continue
        agg: dict[str, Any] = {
            "version": version,
            "stream": stream,
            "epsilon": eps,
            "mechanism": name,
            "algorithm": ok[0]["algorithm"],
            "counter": ok[0].get("counter", counter),
            "switches": ok[0].get("switches"),
            "keys": len(ok),
            "selects": ok[0]["selects"],
        }
        for f in ("recall_T", "recall_half", "negative", "decreasing", "seconds", "dropped_share"):
            agg[f] = float(np.mean([r.get(f, float("nan")) for r in ok]))
        tops = [
            r["mean_abs_error_top20"]
            for r in ok
            if not np.isnan(r.get("mean_abs_error_top20", float("nan")))
        ]
        agg["mean_abs_error_top20"] = float(np.mean(tops)) if tops else float("nan")
        errs = [r["median_abs_error"] for r in ok if not np.isnan(r["median_abs_error"])]
        agg["median_abs_error"] = float(np.mean(errs)) if errs else float("nan")
        firsts = [r["first_release"] for r in ok if r["first_release"] is not None]
        agg["first_release"] = int(np.median(firsts)) if firsts else None
        agg["never"] = len(ok) - len(firsts)
        agg["zero_selection"] = any(r["zero_selection"] for r in ok)
        out.append(agg)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| stream | eps | mechanism | version | algorithm | counter | top-10 at T "
        "| top-10 2nd half | median abs err | mean abs err, true top 20 | negative "
        "| decreasing | first release | zero-sel |"
    )
    lines = [head, "|" + "---|" * 14]
    order = {"before": 0, "after": 1}
    for r in sorted(
        rows,
        key=lambda r: (
            -len(r["stream"]),
            r["epsilon"],
            list(MECHANISMS).index(r["mechanism"]),
            order.get(r["version"], 2),
        ),
    ):
        if "error" in r:
            lines.append(
                f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} | "
                f"{r['version']} | n/a: {r['error'][:60]} | {r.get('counter')} |" + " |" * 8
            )
            continue
        zero = ("yes" if r["zero_selection"] else "no") if r["selects"] else "-"
        first = "never" if r["first_release"] is None else str(r["first_release"])
        if r.get("never") and r["first_release"] is not None:
            first += f" ({r['never']} of {r['keys']} keys: never)"
        err = "-" if np.isnan(r["median_abs_error"]) else f"{r['median_abs_error']:.0f}"
        top = r.get("mean_abs_error_top20", float("nan"))
        top_err = "-" if np.isnan(top) else f"{top:.0f}"
        half = "-" if np.isnan(r["recall_half"]) else f"{r['recall_half'] * TOP:.1f}/10"
        algo = r["algorithm"] + (
            f", s = {r['switches']}"
            if r.get("switches") is not None and "SparseGumb" in r["algorithm"]
            else ""
        )
        lines.append(
            f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} | {r['version']} | "
            f"{algo} | {r.get('counter', '-')} | {r['recall_T'] * TOP:.1f}/10 | {half} | "
            f"{err} | {top_err} | {r['negative']:.0%} | {r['decreasing']:.0%} | "
            f"{first} | {zero} |"
        )
    return "\n".join(lines)


def export_revision(rev: str, into: str) -> Path:
    """``git archive REV src`` into a directory; returns its src path."""
    root = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--show-toplevel"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", root, "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return Path(into) / "src"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="faa,changelog")
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS))
    ap.add_argument(
        "--counters",
        default="default",
        help="comma-separated --counter values (tree, blt; 'default': the "
        "command's); a mechanism without that counter gets an n/a row",
    )
    ap.add_argument("--keys", type=int, default=1, help="average over this many keys")
    ap.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help="also run the code of git revision REV (labelled 'before')",
    )
    ap.add_argument("--label", default="after", help="version label of this checkout's rows")
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)  # for --before
    ap.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")
    ap.add_argument(
        "--gate-study",
        action="store_true",
        help="instead: SparseGumb with other levels of its automatic eta "
        "(beta, start_beta), for the default s and s = 10",
    )
    ap.add_argument(
        "--table",
        default=None,
        metavar="PATH",
        help="instead: print the table of rows written with --json",
    )
    ap.add_argument(
        "--postprocess",
        action="store_true",
        help="instead: bias and error of each readable-count option (clamp, "
        "monotone) on the same releases",
    )
    args = ap.parse_args()
    if args.gate_study:
        gate_rows = []
        for stream in args.streams.split(","):
            gate_rows += gate_study(stream, float(args.epsilons.split(",")[0]), args.keys)
        print(gate_markdown(gate_rows))
        return
    if args.table:
        print(markdown(average(json.loads(Path(args.table).read_text()))))
        return
    if args.src:
        sys.path.insert(0, args.src)
    streams = args.streams.split(",")
    epsilons = [float(e) for e in args.epsilons.split(",")]
    mechanisms = args.mechanisms.split(",")
    if args.postprocess:
        pp_rows = []
        for stream in streams:
            loader, max_items = STREAMS[stream]
            data = loader()
            for epsilon in epsilons:
                for name in PP_MECHANISMS:
                    pp_rows += run_postprocessing(name, stream, epsilon, data, max_items)
                    print(json.dumps(pp_rows[-1]), file=sys.stderr, flush=True)
        print(pp_markdown(pp_rows))
        return
    rows: list[dict[str, Any]] = []
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            src = export_revision(args.before, tmp)
            out = Path(tmp) / "before.json"
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--src",
                    str(src),
                    "--label",
                    "before",
                    "--streams",
                    args.streams,
                    "--epsilons",
                    args.epsilons,
                    "--mechanisms",
                    args.mechanisms,
                    "--keys",
                    str(args.keys),
                    "--json",
                    str(out),
                ],
                check=True,
                env=env,
            )
            rows += json.loads(out.read_text())
    counters = [None if c == "default" else c for c in args.counters.split(",")]
    rows += run_all(streams, epsilons, mechanisms, args.keys, args.label, counters)
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    if not args.src:
        print(markdown(average(rows)))


if __name__ == "__main__":
    main()
