"""Benchmark: every mechanism on real streams, as ``dpstream run`` would publish them.

Run by hand (a few minutes on one core)::

    python bench/real_streams.py                    # this checkout
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
* ``zero-sel``: whether a top-k selection was published that was made at a step
  when every true count was 0 (``yes``/``no``; ``-`` for mechanisms that do not
  select).

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
    files = sorted({os.path.realpath(p)
                    for p in glob.glob("/usr/share/doc/*/changelog.Debian.gz")})
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


#: stream name -> (loader, --max-items for the mechanisms that need it)
STREAMS = {"faa": (faa_stream, 2), "changelog": (changelog_stream, 20)}


# --------------------------------------------------------------------------- mechanisms


def cli_defaults(cli: Any) -> dict[str, Any]:
    """The command's option defaults (this checkout's, or the one under test)."""
    return {o.dest: o.default for o in cli.MECH_OPTS + cli.RUN_OPTS}


def build(cli: Any, name: str, opts: dict[str, Any], key: Any,
          domain: list[str] | None) -> Any:
    """``build_mechanism`` as ``dpstream run`` calls it; drop --max-items where refused."""
    if cli.MECHANISMS[name].domain == "none":
        domain = None
    try:
        return cli.build_mechanism(name, opts, key, domain)
    except ValueError as exc:
        if "--max-items does not apply" in str(exc):
            return cli.build_mechanism(name, {**opts, "max_items": None}, key, domain)
        raise


MECHANISMS = {
    # row label -> (CLI mechanism, extra options, pass --max-items)
    "known": ("known", {}, True),
    "unknown": ("unknown", {}, True),
    "top-k": ("top-k", {"k": TOP, "switches": 3}, True),
    "top-k no --max-items": ("top-k", {"k": TOP, "switches": 3}, False),
    "meta gumbel": ("meta", {"oneshot": "gumbel", "k": TOP}, False),
}


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
        self._items_id: int | None = None
        self._pos: np.ndarray | None = None

    def positions(self, items: Sequence[str]) -> np.ndarray:
        if self._items_id == id(items) and self._pos is not None:
            return self._pos
        pos = np.fromiter((self.index[str(i)] for i in items), dtype=np.int64,
                          count=len(items))
        if len(items) > 1000:  # a whole domain, released every step: cache
            self._items_id, self._pos = id(items), pos
        return pos

    def add(self, t: int, items: Sequence[str], values: np.ndarray, truth: np.ndarray,
            selected_on_zero: bool) -> None:
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
        last = [r for t, r in self.recall if t == self.horizon]
        second = [r for t, r in self.recall if t > self.horizon // 2]
        return {
            "recall_T": last[0] if last else 0.0,
            "recall_half": float(np.mean(second)) if second else 0.0,
            "median_abs_error": float(np.median(errs)) if errs.size else float("nan"),
            "negative": self.n_negative / self.n_values if self.n_values else 0.0,
            "decreasing": self.n_down / self.n_pairs if self.n_pairs else 0.0,
            "first_release": self.first,
            "zero_selection": self.zero_selection,
        }


def run_one(name: str, stream: str, epsilon: float, key_label: str,
            data: tuple[int, list[list[list[str]]]], max_items: int) -> dict[str, Any]:
    """One mechanism on one stream at one epsilon: the metrics and a few facts."""
    from dpstream import cli
    from dpstream.io import KeyedTruncator
    from dpstream.noise import NoiseKey, NoiseSource

    horizon, steps = data
    domain = sorted({i for step in steps for ev in step for i in ev})
    index = {item: i for i, item in enumerate(domain)}
    key = NoiseKey.from_bytes(hashlib.sha256(f"bench-real-streams/{key_label}".encode()).digest())
    mech_name, extra, with_max = MECHANISMS[name]
    opts = {**cli_defaults(cli), "horizon": horizon, "epsilon": epsilon, "delta": 1e-6,
            "max_items": max_items if with_max else None, **extra}
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
        elif selection is None and len(rel.items) and last_selection is None \
                and mech_name in ("top-k", "meta"):
            last_selection = t
            selection_zero = not truth.any()
        items, values = publish(rel)
        metrics.add(t, items, values, truth,
                    selection_zero and mech_name in ("top-k", "meta"))
    out = metrics.summary()
    out.update(mechanism=name, stream=stream, epsilon=epsilon, key=key_label,
               algorithm=getattr(mech, "mechanism_name", type(mech).__name__),
               seconds=time.perf_counter() - start,
               dropped_share=dropped / occurrences if occurrences else 0.0,
               selects=mech_name in ("top-k", "meta"))
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

PP_OPTIONS = {"raw": (False, False), "clamp": (True, False), "monotone": (False, True),
              "clamp+monotone": (True, True)}
PP_MECHANISMS = ("known", "unknown", "top-k", "top-k no --max-items")


class ErrorStats:
    """Bias and error of published counts: all of them, and those of the true top 10."""

    def __init__(self, index_size: int) -> None:
        self.prev = np.full(index_size, np.nan)
        self.sum = self.n = self.sum_top = self.n_top = 0.0
        self.abs_all: list[np.ndarray] = []
        self.abs_top: list[np.ndarray] = []
        self.n_neg = self.n_pairs = self.n_down = 0

    def add(self, t: int, pos: np.ndarray, vals: np.ndarray, truth: np.ndarray,
            top: np.ndarray, sample: bool) -> None:
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

        return {"bias": self.sum / self.n if self.n else float("nan"),
                "median_abs": med(self.abs_all),
                "bias_top": self.sum_top / self.n_top if self.n_top else float("nan"),
                "median_abs_top": med(self.abs_top),
                "negative": self.n_neg / self.n if self.n else 0.0,
                "decreasing": self.n_down / self.n_pairs if self.n_pairs else 0.0}


def run_postprocessing(name: str, stream: str, epsilon: float,
                       data: tuple[int, list[list[list[str]]]], max_items: int
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
    opts = {**cli_defaults(cli), "horizon": horizon, "epsilon": epsilon, "delta": 1e-6,
            "max_items": max_items if with_max else None, **extra}
    mech = build(cli, mech_name, opts, key, domain)
    ranked = mech_name != "known"
    pps = {label: ReadableCounts(clamp=c, monotone=m, round_counts=True, ranked=ranked)
           for label, (c, m) in PP_OPTIONS.items()}
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
                    pos = cache[key_id] = np.fromiter((index[str(i)] for i in rel.items),
                                                      np.int64, len(rel.items))
            else:
                pos = np.fromiter((index[str(i)] for i in out.items), np.int64,
                                  len(out.items))
            stats[label].add(t, pos, np.asarray(out.values, dtype=np.float64), truth, top,
                             t % stride == 0 or t == horizon)
    return [{"stream": stream, "epsilon": epsilon, "mechanism": name,
             "algorithm": getattr(mech, "mechanism_name", type(mech).__name__),
             "option": label, **st.summary()} for label, st in stats.items()]


def pp_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| stream | eps | mechanism | option | bias | median abs err | bias, true top 10 "
             "| median abs err, true top 10 | negative | decreasing |", "|" + "---|" * 10]
    def num(x: float, fmt: str) -> str:
        return "-" if np.isnan(x) else format(x, fmt)

    for r in rows:
        lines.append(
            f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} ({r['algorithm']}) | "
            f"{r['option']} | {num(r['bias'], '+.1f')} | {num(r['median_abs'], '.0f')} | "
            f"{num(r['bias_top'], '+.1f')} | {num(r['median_abs_top'], '.0f')} | "
            f"{r['negative']:.0%} | {r['decreasing']:.0%} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


def run_all(streams: list[str], epsilons: list[float], mechanisms: list[str],
            keys: int, label: str) -> list[dict[str, Any]]:
    rows = []
    for stream in streams:
        loader, max_items = STREAMS[stream]
        data = loader()
        for epsilon in epsilons:
            for name in mechanisms:
                for k in range(keys):
                    try:
                        row = run_one(name, stream, epsilon, f"{k}", data, max_items)
                    except Exception as exc:  # a mechanism the checkout lacks
                        row = {"mechanism": name, "stream": stream, "epsilon": epsilon,
                               "key": f"{k}", "error": f"{type(exc).__name__}: {exc}"}
                    row["version"] = label
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def average(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over keys of each (version, stream, epsilon, mechanism)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["version"], r["stream"], r["epsilon"], r["mechanism"]), []).append(r)
    out = []
    for (version, stream, eps, name), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append({**rs[0]})
            continue
        agg: dict[str, Any] = {"version": version, "stream": stream, "epsilon": eps,
                               "mechanism": name, "algorithm": ok[0]["algorithm"],
                               "keys": len(ok), "selects": ok[0]["selects"]}
        for f in ("recall_T", "recall_half", "negative", "decreasing", "seconds",
                  "dropped_share"):
            agg[f] = float(np.mean([r[f] for r in ok]))
        errs = [r["median_abs_error"] for r in ok if not np.isnan(r["median_abs_error"])]
        agg["median_abs_error"] = float(np.mean(errs)) if errs else float("nan")
        firsts = [r["first_release"] for r in ok if r["first_release"] is not None]
        agg["first_release"] = int(np.median(firsts)) if firsts else None
        agg["never"] = len(ok) - len(firsts)
        agg["zero_selection"] = any(r["zero_selection"] for r in ok)
        out.append(agg)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| stream | eps | mechanism | version | algorithm | top-10 at T | top-10 2nd half "
            "| median abs err | negative | decreasing | first release | zero-sel |")
    lines = [head, "|" + "---|" * 12]
    order = {"before": 0, "after": 1}
    for r in sorted(rows, key=lambda r: (-len(r["stream"]), r["epsilon"],
                                         list(MECHANISMS).index(r["mechanism"]),
                                         order.get(r["version"], 2))):
        if "error" in r:
            lines.append(f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} | "
                         f"{r['version']} | n/a: {r['error'][:60]} |" + " |" * 8)
            continue
        zero = ("yes" if r["zero_selection"] else "no") if r["selects"] else "-"
        first = "never" if r["first_release"] is None else str(r["first_release"])
        if r.get("never") and r["first_release"] is not None:
            first += f" ({r['never']} of {r['keys']} keys: never)"
        err = "-" if np.isnan(r["median_abs_error"]) else f"{r['median_abs_error']:.0f}"
        lines.append(
            f"| {r['stream']} | {r['epsilon']:g} | {r['mechanism']} | {r['version']} | "
            f"{r['algorithm']} | {r['recall_T'] * TOP:.1f}/10 | {r['recall_half'] * TOP:.1f}/10 | "
            f"{err} | {r['negative']:.0%} | {r['decreasing']:.0%} | "
            f"{first} | {zero} |")
    return "\n".join(lines)


def export_revision(rev: str, into: str) -> Path:
    """``git archive REV src`` into a directory; returns its src path."""
    root = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--show-toplevel"],
                          check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", root, "archive", rev, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return Path(into) / "src"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="faa,changelog")
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS))
    ap.add_argument("--keys", type=int, default=1, help="average over this many keys")
    ap.add_argument("--before", metavar="REV", default=None,
                    help="also run the code of git revision REV (labelled 'before')")
    ap.add_argument("--label", default="after", help="version label of this checkout's rows")
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)  # for --before
    ap.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--postprocess", action="store_true",
                    help="instead: bias and error of each readable-count option (clamp, "
                         "monotone) on the same releases")
    args = ap.parse_args()
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
            subprocess.run([sys.executable, __file__, "--src", str(src), "--label", "before",
                            "--streams", args.streams, "--epsilons", args.epsilons,
                            "--mechanisms", args.mechanisms, "--keys", str(args.keys),
                            "--json", str(out)], check=True, env=env)
            rows += json.loads(out.read_text())
    rows += run_all(streams, epsilons, mechanisms, args.keys, args.label)
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    if not args.src:
        print(markdown(average(rows)))


if __name__ == "__main__":
    main()
