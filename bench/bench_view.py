"""Benchmark: the live view's memory as the file grows, and its cost with 10^5 items.

Run by hand: ``python bench/bench_view.py [--releases 10000] [--items 1000]
[--wide-items 100000] [--browser]``. Simulated releases (a seeded NumPy
generator: simulation data, no privacy involved). Prints figures and ratios
against baselines measured in the same process:

1. Growth: a file grows to ``--releases`` releases of ``--items`` items,
   appended in batches as a run would, the model polling after each batch and
   following the history of 3 items (what a page shows by default). Reported
   at checkpoints: the bytes the model holds (histories + raw lines) and the
   Python heap in use after the poll (tracemalloc), against the size of the
   file and of one parsed release (the baseline). Bounded means: flat apart
   from the 3 histories (24 bytes per release each), whatever the file size.
2. Wide releases: ``--wide-items`` items per release. The time for the model
   to take in one new release (parse + top N) against a bare ``json.loads`` of
   that line (baseline), the time to render what a page receives, and the
   size of one server-sent-event message against the release line.
3. ``--browser``: the time from appending a wide release to the page showing
   it, in headless Chromium (Playwright), polling every 0.25 s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from dpstream.view.model import ViewModel
from dpstream.view.render import render_fragments


def _names(n: int) -> list[str]:
    return [f"#tag-{i:06d}" for i in range(n)]


def _lines(rng: np.random.Generator, names: list[str], steps: int, start_t: int = 1):
    """Release lines of running counts over a Zipf-like popularity."""
    weights = 1.0 / np.arange(1, len(names) + 1)
    counts = np.zeros(len(names))
    for t in range(start_t, start_t + steps):
        counts += rng.poisson(weights * 3)
        values = np.rint(counts + rng.normal(0, 5, size=len(names))).astype(int).tolist()
        yield (
            json.dumps(
                {
                    "t": t,
                    "released": dict(zip(names, values, strict=True)),
                    "meta": {"noise_std": 5.0},
                }
            )
            + "\n"
        )


def bench_growth(releases: int, items: int, batch: int) -> None:
    print(
        f"\n1. growth: {releases:,} releases of {items:,} items, a poll every {batch} "
        "releases, 3 items' histories followed"
    )
    rng = np.random.default_rng(1)
    names = _names(items)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "releases.jsonl"
        path.write_bytes(b"")
        sample = next(_lines(np.random.default_rng(0), names, 1))
        tracemalloc.start()
        base0 = tracemalloc.get_traced_memory()[0]
        parsed = json.loads(sample)
        one_release = tracemalloc.get_traced_memory()[0] - base0
        del parsed
        model = ViewModel(path, top=20)
        model.select(names[:3])
        checkpoints = {c for c in (releases // 10, releases // 4, releases // 2, releases)}
        written = 0
        start = time.perf_counter()
        gen = _lines(rng, names, releases)
        print(f"   baseline: one parsed release holds {one_release / 1e6:.2f} MB of Python objects")
        print(
            f"   {'releases':>9} {'file MB':>9} {'model KB':>9} {'heap MB':>8} "
            f"{'heap / release':>15} {'poll ms':>8}"
        )
        with open(path, "a") as fh:
            while written < releases:
                for _ in range(min(batch, releases - written)):
                    fh.write(next(gen))
                    written += 1
                fh.flush()
                t0 = time.perf_counter()
                model.refresh()
                poll_ms = 1e3 * (time.perf_counter() - t0)
                if written in checkpoints:
                    heap = tracemalloc.get_traced_memory()[0] - base0
                    print(
                        f"   {written:>9,} {path.stat().st_size / 1e6:>9.1f} "
                        f"{model.memory_bytes() / 1e3:>9.1f} {heap / 1e6:>8.2f} "
                        f"{heap / one_release:>14.2f}x {poll_ms:>8.1f}"
                    )
        peak = tracemalloc.get_traced_memory()[1] - base0
        tracemalloc.stop()
        snap = model.snapshot(names[:3])
        assert snap.t == releases and all(len(snap.history[n][0]) == releases for n in names[:3])
        print(
            f"   peak heap during the run: {peak / 1e6:.2f} MB "
            f"({peak / one_release:.1f}x one parsed release); "
            f"{time.perf_counter() - start:.1f} s in all"
        )


def bench_wide(items: int, releases: int, top: int) -> dict:
    print(f"\n2. wide releases: {items:,} items per release, top {top} shown")
    rng = np.random.default_rng(2)
    names = _names(items)
    tmp = tempfile.mkdtemp()
    path = Path(tmp) / "wide.jsonl"
    gen = _lines(rng, names, releases + 100)  # one stream: later releases continue it
    path.write_text("".join(next(gen) for _ in range(releases)))
    line = next(gen).encode()
    loads = min(_timed(lambda: json.loads(line)) for _ in range(3))
    model = ViewModel(path, top=top)
    t_open = _timed(model.refresh)
    t_first = _timed(lambda: model.snapshot(None))  # fills the top 3 histories
    with open(path, "ab") as fh:
        fh.write(line)
    t_update = _timed(model.refresh)
    snap = model.snapshot(None)
    t_render = min(_timed(lambda: render_fragments(snap)) for _ in range(3))
    frags = render_fragments(snap)
    message = json.dumps({"html": frags, "selected": snap.selected, "t": snap.t})
    print(
        f"   baseline: json.loads of one release line ({len(line) / 1e6:.1f} MB): "
        f"{loads * 1e3:.0f} ms"
    )
    print(
        f"   open the file ({releases} releases, read to the end): {t_open * 1e3:.0f} ms "
        f"({t_open / loads:.1f}x)"
    )
    print(
        f"   first page: fill the 3 default histories ({releases} lines): "
        f"{t_first * 1e3:.0f} ms ({t_first / loads:.1f}x)"
    )
    print(
        f"   take in one new release (3 histories followed): {t_update * 1e3:.0f} ms "
        f"({t_update / loads:.2f}x json.loads)"
    )
    print(f"   render the page's fragments: {t_render * 1e3:.1f} ms ({t_render / loads:.3f}x)")
    print(
        f"   one event-stream message: {len(message) / 1e3:.1f} KB, "
        f"{len(message) / len(line):.4f}x the release line"
    )
    print(f"   model memory: {model.memory_bytes() / 1e3:.1f} KB")
    return {"path": path, "gen": gen, "releases": releases, "top": top}


def bench_browser(wide: dict) -> None:
    from playwright.sync_api import sync_playwright

    from dpstream.view.server import ViewServer

    print("\n3. browser: append a wide release, wait for the page to show it (Chromium)")
    path = wide["path"]
    server = ViewServer(ViewModel(path, top=wide["top"]), poll=0.25).start()
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=args)
            page = browser.new_page(bypass_csp=True)
            t0 = time.perf_counter()
            page.goto(server.url)
            page.wait_for_selector("#dp-conn.ok")
            print(f"   page load: {(time.perf_counter() - t0) * 1e3:.0f} ms")
            waits = []
            for t in range(wide["releases"] + 2, wide["releases"] + 7):
                line = next(wide["gen"])
                start = time.perf_counter()
                with open(path, "a") as fh:
                    fh.write(line)
                page.wait_for_function(
                    f"document.getElementById('dp-t').textContent.replace(/,/g, '') === '{t}'",
                    timeout=20000,
                )
                waits.append(time.perf_counter() - start)
            rows = page.locator("#dp-top li.row").count()
            print(
                f"   append -> shown: median {np.median(waits) * 1e3:.0f} ms, max "
                f"{max(waits) * 1e3:.0f} ms over {len(waits)} releases (poll 250 ms); "
                f"{rows} rows in the DOM"
            )
            browser.close()
    finally:
        server.stop()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=10_000)
    ap.add_argument("--items", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=50, help="releases appended between polls")
    ap.add_argument("--wide-items", type=int, default=100_000)
    ap.add_argument("--wide-releases", type=int, default=20)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--browser", action="store_true")
    ap.add_argument("--no-growth", action="store_true", help="skip part 1")
    args = ap.parse_args()
    if not args.no_growth:
        bench_growth(args.releases, args.items, args.batch)
    wide = bench_wide(args.wide_items, args.wide_releases, args.top)
    if args.browser:
        bench_browser(wide)


if __name__ == "__main__":
    main()
