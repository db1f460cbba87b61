"""``dpstream demo``: a private running histogram on real and simulated streams.

Layer 6 of dpstream. Two streams:

* **real**: 10,000 wildlife-strike reports to the U.S. FAA (1990-2002), bundled
  as ``dpstream/data/birdstrikes.jsonl.gz`` (source and licence in
  ``dpstream/data/README.md``). One report is one event with two items, the
  species struck and the airport; a time step is one week (656 weeks). By
  default the unknown-domain mechanism (UnkBase) runs on it: the items are not
  listed in advance, and an item is shown only once its noisy count clears the
  threshold.
* **simulated**: a Zipf stream over a known domain of ``--zipf-items`` items,
  drawn from a NumPy generator seeded with ``--seed`` (simulated data, not a
  release: the noise still comes from the keyed source), run through KnownBase.

For each stream the demo prints the top items at the last step, true against
private, and writes a PNG of the private and true counts of the top items over
time into ``--out``. Private counts are published as ``dpstream run`` writes
them by default: rounded to integers (see
:meth:`dpstream.mechanisms.base.Release.rounded`), a count below 0 as 0, and
an unknown-domain item kept once shown (:class:`dpstream.ReadableCounts`,
``remember=True``; post-processing). The key is generated afresh
for each run (and never written) unless ``--key-file`` is given.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .words import plain_mechanism

if TYPE_CHECKING:  # NumPy and the noise are imported by the runs, not by `--help`
    import numpy as np

__all__ = ["add_demo_options", "run_demo", "load_birdstrikes", "zipf_stream"]

DATASET = "birdstrikes.jsonl.gz"


def add_demo_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``dpstream demo`` (each help states its default)."""
    parser.add_argument(
        "--out",
        default="dpstream-demo",
        metavar="DIR",
        help="directory for the PNG plots (default: ./dpstream-demo)",
    )
    parser.add_argument(
        "--mechanism",
        choices=("unknown", "known"),
        default="unknown",
        help="mechanism for the real stream: unknown (the unknown-domain histogram, "
        "items not listed in advance) or known (the known-domain histogram over the "
        "dataset's item list) "
        "(default: unknown)",
    )
    parser.add_argument(
        "--epsilon",
        type=float,
        default=1.0,
        help="privacy budget epsilon of each stream (default: 1.0)",
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=1e-6,
        help="privacy budget delta of each stream (default: 1e-06)",
    )
    parser.add_argument(
        "--key-file",
        default=None,
        metavar="PATH",
        help="use this key instead of a fresh one (default: a new key per run, never written)",
    )
    parser.add_argument(
        "--top", type=int, default=8, help="how many top items to show and plot (default: 8)"
    )
    parser.add_argument(
        "--zipf-items",
        type=int,
        default=1000,
        help="domain size of the simulated Zipf stream (default: 1000)",
    )
    parser.add_argument(
        "--zipf-steps",
        type=int,
        default=1000,
        help="time steps of the simulated stream (default: 1000)",
    )
    parser.add_argument(
        "--zipf-events",
        type=int,
        default=20,
        help="events per step of the simulated stream (default: 20)",
    )
    parser.add_argument(
        "--zipf-exponent",
        type=float,
        default=1.1,
        help="Zipf exponent s, item i drawn with probability ~ i^-s (default: 1.1)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=2024,
        help="seed of the NumPy generator of the simulated data only (default: 2024)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots (default: off)")
    parser.add_argument(
        "--write-events",
        default=None,
        metavar="PATH",
        help="write the bundled real stream (FAA wildlife strike reports, "
        "one JSON line per report, t = the week, horizon 656, at most 2 "
        "items per event) to PATH as sample input for `dpstream run`, "
        "and stop (default: off)",
    )


def write_sample_events(path: str) -> int:
    """Write the bundled stream as JSON Lines to ``path`` (never over an existing file)."""
    raw = gzip.decompress((resources.files("dpstream") / "data" / DATASET).read_bytes())
    with open(path, "xb") as fh:
        fh.write(raw)
    return raw.count(b"\n")


# --------------------------------------------------------------------------- data


def load_birdstrikes() -> tuple[int, list[tuple[int, list[str]]]]:
    """The bundled real stream: (horizon, [(week, items), ...]) in time order."""
    raw = (resources.files("dpstream") / "data" / DATASET).read_bytes()
    events = []
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        if line.strip():
            obj = json.loads(line)
            events.append((int(obj["t"]), [str(i) for i in obj["items"]]))
    return max(t for t, _ in events), events


def zipf_stream(
    *, items: int, steps: int, events_per_step: int, exponent: float, seed: int
) -> Iterator[list[list[str]]]:
    """Simulated steps: each event holds 1-3 distinct items drawn from a Zipf law.

    Simulation only (seeded NumPy generator); the release noise is keyed.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    p = np.arange(1, items + 1, dtype=float) ** -exponent
    p /= p.sum()
    names = [f"item-{i:04d}" for i in range(items)]
    for _ in range(steps):
        sizes = rng.integers(1, 4, size=events_per_step)
        draws = rng.choice(items, size=int(sizes.sum()), p=p)
        step, pos = [], 0
        for n in sizes:
            step.append([names[j] for j in dict.fromkeys(draws[pos : pos + n].tolist())])
            pos += n
        yield step


# --------------------------------------------------------------------------- run


@dataclass
class Trace:
    """Per-step true and private (rounded) counts of every item (NaN where not released)."""

    name: str
    horizon: int
    true: dict[str, np.ndarray]
    private: dict[str, np.ndarray]
    mech: Any
    seconds: float
    events: int


def _trace(
    name: str, mech: Any, steps: Sequence[list[list[str]]] | Iterator[list[list[str]]], horizon: int
) -> Trace:
    true_now: dict[str, int] = {}
    true: dict[str, np.ndarray] = {}
    private: dict[str, np.ndarray] = {}
    n_events = 0
    import numpy as np

    from .postprocess import ReadableCounts

    # what `dpstream run` publishes by default: rounded, clamped at 0
    publish = ReadableCounts(
        round_counts=True, clamp=True, ranked=not isinstance(getattr(mech, "domain", None), list)
    )
    start = time.perf_counter()
    for t, events in enumerate(steps, 1):
        n_events += len(events)
        for ev in events:
            for item in dict.fromkeys(ev):
                true_now[item] = true_now.get(item, 0) + 1
                if item not in true:
                    true[item] = np.zeros(horizon)
                    private[item] = np.full(horizon, np.nan)
        rel = publish(mech.step_batch(events))
        for shown, v in zip(rel.items, rel.values.tolist(), strict=True):
            if not isinstance(shown, str):  # the events hold str items: so does a release
                raise TypeError(f"the demo's releases hold str items, got {shown!r}")
            if shown not in private:
                true[shown] = np.zeros(horizon)
                private[shown] = np.full(horizon, np.nan)
            private[shown][t - 1] = v
        for item, c in true_now.items():
            true[item][t - 1] = c
    return Trace(name, horizon, true, private, mech, time.perf_counter() - start, n_events)


def _real_trace(mechanism: str, key: Any, epsilon: float, delta: float) -> Trace:
    from .noise import NOISE_VERSION

    horizon, events = load_birdstrikes()
    by_step: list[list[list[str]]] = [[] for _ in range(horizon)]
    for t, items in events:
        by_step[t - 1].append(items)
    if mechanism == "unknown":
        from .mechanisms.unknown import UnknownDomainHistogram

        mech: Any = UnknownDomainHistogram(
            horizon,
            max_items=2,
            key=key,
            epsilon=epsilon,
            delta=delta,
            stream="demo-birdstrikes",
            remember=True,
            noise_version=NOISE_VERSION,
        )
    else:
        from .mechanisms.known import KnownDomainHistogram

        domain = sorted({i for _, items in events for i in items})
        mech = KnownDomainHistogram(
            domain,
            horizon,
            max_items=2,
            key=key,
            epsilon=epsilon,
            delta=delta,
            stream="demo-birdstrikes",
            noise_version=NOISE_VERSION,
        )
    return _trace("FAA wildlife strikes, 1990-2002 (real, weekly steps)", mech, by_step, horizon)


def _zipf_trace(args: argparse.Namespace, key: Any) -> Trace:
    from .mechanisms.known import KnownDomainHistogram
    from .noise import NOISE_VERSION

    domain = [f"item-{i:04d}" for i in range(args.zipf_items)]
    mech = KnownDomainHistogram(
        domain,
        args.zipf_steps,
        max_items=3,
        key=key,
        epsilon=args.epsilon,
        delta=args.delta,
        stream="demo-zipf",
        noise_version=NOISE_VERSION,
    )
    steps = zipf_stream(
        items=args.zipf_items,
        steps=args.zipf_steps,
        events_per_step=args.zipf_events,
        exponent=args.zipf_exponent,
        seed=args.seed,
    )
    return _trace(
        f"Zipf(s={args.zipf_exponent}) over {args.zipf_items} items (simulated)",
        mech,
        steps,
        args.zipf_steps,
    )


def _top(trace: Trace, n: int) -> list[str]:
    final = {item: arr[-1] for item, arr in trace.true.items()}
    return sorted(final, key=lambda i: (-final[i], i))[:n]


def _table(trace: Trace, top: list[str]) -> Any:
    from rich.table import Table

    mech = trace.mech
    p = mech.privacy
    caption = f"{plain_mechanism(mech.mechanism_name)}: {p.plain()}"  # with rho_delta
    table = Table(title=f"{trace.name}: top {len(top)} at t = {trace.horizon}", caption=caption)
    table.add_column("item")
    table.add_column("true", justify="right")
    table.add_column("private", justify="right")
    table.add_column("private - true", justify="right")
    for item in top:
        tv = trace.true[item][-1]
        pv = trace.private[item][-1]
        if math.isnan(pv):
            table.add_row(item, f"{tv:.0f}", "not shown", "")
        else:
            table.add_row(item, f"{tv:.0f}", f"{pv:.0f}", f"{pv - tv:+.0f}")
    return table


def _plot(trace: Trace, top: list[str], path: Path) -> None:
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    x = np.arange(1, trace.horizon + 1)
    colors = plt.get_cmap("tab10")
    for n, item in enumerate(top):
        c = colors(n % 10)
        label = item if len(item) <= 40 else item[:37] + "..."
        ax.plot(x, trace.true[item], color=c, lw=1.5, label=f"{label} (true)")
        ax.plot(x, trace.private[item], color=c, lw=0.8, ls="--", alpha=0.9)
    ax.set_xlabel("time step")
    ax.set_ylabel("running count")
    extra = ""
    thr = getattr(trace.mech, "threshold", None)
    if isinstance(thr, float):
        ax.axhline(thr, color="grey", lw=0.8, ls=":")
        extra = f"; dotted: threshold {thr:.0f}"
    ax.set_title(
        f"{trace.name}\nsolid: true, dashed: private "
        f"({plain_mechanism(trace.mech.mechanism_name)}, "
        f"epsilon = {trace.mech.privacy.epsilon:.3g}){extra}",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_demo(args: argparse.Namespace) -> int:
    """Run both streams, print the tables, write the plots; returns the exit status."""
    from rich.console import Console

    from .noise import NoiseKey

    console = Console()
    if args.write_events:
        lines = write_sample_events(args.write_events)
        console.print(
            f"wrote {lines:,} events to {args.write_events} (horizon 656 weeks, at "
            "most 2 items per event); try: dpstream run -m unknown --horizon 656 "
            "--max-items 2 ..."
        )
        return 0
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    if args.key_file:
        key = NoiseKey.load(args.key_file)
        console.print(f"key: {args.key_file} (fingerprint {key.fingerprint()})")
    else:
        key = NoiseKey.generate()
        console.print(
            f"key: a fresh key for this run only (fingerprint {key.fingerprint()}), "
            "never written; pass --key-file to use yours"
        )
    out = Path(args.out)
    if not args.no_plot:
        out.mkdir(parents=True, exist_ok=True)
        ignore = out / ".gitignore"  # generated output: git leaves the folder alone
        if not ignore.exists():
            ignore.write_text("# written by `dpstream demo`\n*\n")
    start = time.perf_counter()
    for trace in (
        _real_trace(args.mechanism, key, args.epsilon, args.delta),
        _zipf_trace(args, key),
    ):
        top = _top(trace, args.top)
        console.print(_table(trace, top))
        console.print(f"{trace.events} events, {trace.horizon} steps in {trace.seconds:.1f} s")
        if not args.no_plot:
            slug = "birdstrikes" if "FAA" in trace.name else "zipf"
            path = out / f"{slug}.png"
            _plot(trace, top, path)
            console.print(f"plot: {path}")
    console.print(
        f"demo done in {time.perf_counter() - start:.1f} s. Data: FAA Wildlife Strike "
        "Database via the vega-datasets package (U.S. Government work); see "
        "dpstream/data/README.md"
    )
    sys.stdout.flush()
    return 0
