"""The live view in a real browser: Playwright driving the system's Chromium.

Opens the page on a releases file and checks, in the DOM, that the top items
and their numbers are the file's last release (compared with a full sort of
that line), that two appended releases show up within 2 s without a reload,
that clicking an item shows its history (compared with a parse of every
line), and that planted ``<script>``/``<img onerror>`` names are shown as text
and run nothing.

Skips: these tests need Playwright (the ``dev`` extra) and a Chromium binary
(Debian's ``chromium``; browser downloads are not used). CI installs both and
sets ``DPSTREAM_REQUIRE_BROWSER=1``, which turns any skip here into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from dpstream.run.meta import FORMAT, write_run_meta
from dpstream.view.model import ViewModel
from dpstream.view.server import ViewServer

pytestmark = pytest.mark.browser

_REQUIRED = os.environ.get("DPSTREAM_REQUIRE_BROWSER") == "1"

#: Flags for a headless Chromium that never talks to the network on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str | None:
    for name in (
        os.environ.get("DPSTREAM_CHROMIUM"),
        "/usr/bin/chromium",
        "chromium",
        "chromium-browser",
    ):
        if name and (found := shutil.which(name)):
            return found
    return None


try:
    from playwright.sync_api import sync_playwright
except ImportError:
    if _REQUIRED:
        raise
    pytest.skip("Playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

CHROMIUM = _chromium()
if CHROMIUM is None:
    if _REQUIRED:
        raise RuntimeError(
            "DPSTREAM_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)"
        )
    pytest.skip("no Chromium (apt-get install chromium)", allow_module_level=True)

EVIL_SCRIPT = "<script>window.__pwned = 1</script>"
EVIL_IMG = '<img src=x onerror="window.__pwned = 2">'


def _line(t: int, released: dict, std: float) -> str:
    return (
        json.dumps({"t": t, "released": released, "meta": {"noise_std": std}}, ensure_ascii=False)
        + "\n"
    )


def _release(t: int) -> dict:
    """Step t of a made-up stream: running counts with ties, and the two planted names."""
    rel = {f"tag{i:02d}": (i * 7 + t * (i % 5)) % 97 + t for i in range(40)}
    rel[EVIL_SCRIPT] = 60 + 2 * t
    rel[EVIL_IMG] = 50 + 2 * t
    return rel


def _expected_top(released: dict, n: int) -> list[tuple[str, float]]:
    return sorted(released.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _rows(page) -> list[tuple[str, float, str]]:
    """(name as shown, data-value, shown number) of every bar row."""
    return page.eval_on_selector_all(
        "#dp-top li.row",
        "els => els.map(e => [e.querySelector('.name').textContent, "
        "Number(e.dataset.value), e.querySelector('.value').textContent])",
    )


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_page_follows_the_file_and_shows_names_as_text(browser, tmp_path):
    path = tmp_path / "releases.jsonl"
    path.write_text(
        "".join(_line(t, _release(t), 1.5 + t / 100) for t in range(1, 31)), encoding="utf-8"
    )
    write_run_meta(
        path,
        {
            "format": FORMAT,
            "horizon": 100,
            "mechanism": "known",
            "algorithm": "KnownBase",
            "base": 4,
            "unit": "event",
            "privacy": {"rho": 0.02, "epsilon": 1.0, "delta": 1e-6},
        },
    )
    server = ViewServer(ViewModel(path, top=10), poll=0.1).start()
    # bypass_csp: the page's Content-Security-Policy would block a planted script even if
    # a name were not escaped; without it, this test checks the escaping itself (and lets
    # Playwright evaluate its own checks).
    page = browser.new_page(bypass_csp=True)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(5000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)

        # the top items and their numbers are the file's last release
        want = _expected_top(_release(30), 10)
        got = _rows(page)
        assert [(name, value) for name, value, _ in got] == want
        assert [shown.replace(",", "") for _, _, shown in got] == [str(v) for _, v in want]
        assert page.inner_text("#dp-t") == "30"
        assert "ε = 1, δ = 1e-6" in page.inner_text("#dp-header")

        # planted names are text, not markup, and ran nothing
        names = [name for name, _, _ in got]
        assert EVIL_SCRIPT in names and EVIL_IMG in names
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#dp-top img").count() == 0
        assert page.locator("#dp-view script").count() == 0

        # two appended releases show up without a reload (no bound on the time it
        # takes: the machine's pace is not what is tested)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(_line(31, _release(31), 1.81))
            fh.write(_line(32, _release(32), 1.82))
        page.wait_for_function(
            "document.getElementById('dp-t').textContent === '32'", timeout=30_000
        )
        assert [(n, v) for n, v, _ in _rows(page)] == _expected_top(_release(32), 10)

        # clicking an item shows its history (every step, from a parse of the whole file)
        top = [name for name, _ in _expected_top(_release(32), 10)]
        item = next(n for n in top[3:] if n.startswith("tag"))  # not shown by default
        assert page.locator(f'#dp-history g.series[data-item="{item}"]').count() == 0
        page.locator("#dp-top li.row", has_text=item).first.click()
        legend = page.locator("#dp-history ul.legend li", has_text=item)
        legend.wait_for(timeout=2000)
        assert page.locator("#dp-top li.row.selected", has_text=item).count() == 1
        line = page.locator(f'#dp-history g.series[data-item="{item}"] polyline')
        points = line.get_attribute("points").split()
        assert len(points) == 32  # one point per release that holds the item
        assert legend.inner_text().startswith(item)
        assert f"t = 32: {_release(32)[item]}" in legend.inner_text()

        # the planted names can be chosen too, and still run nothing
        page.locator("#dp-top li.row", has_text=EVIL_IMG).first.click()
        page.locator("#dp-history ul.legend li", has_text=EVIL_IMG).wait_for(timeout=2000)
        assert page.locator("#dp-history img").count() == 0
        assert page.evaluate("window.__pwned") is None
        assert "manual=1" in page.url and item in page.url
        assert errors == []
    finally:
        page.close()
        server.stop()


def test_page_says_the_file_is_missing(browser, tmp_path):
    server = ViewServer(ViewModel(tmp_path / "later.jsonl"), poll=0.1).start()
    page = browser.new_page(bypass_csp=True)
    try:
        page.goto(server.url)
        assert "does not exist" in page.inner_text("#dp-header")
        Path(tmp_path / "later.jsonl").write_text(_line(1, {"a": 3}, 1.0))
        page.wait_for_function("document.querySelector('#dp-top li.row') !== null", timeout=2000)
        assert _rows(page) == [["a", 3, "3"]]
    finally:
        page.close()
        server.stop()


def test_a_clocked_run_shows_dates_on_the_axis(browser, tmp_path):
    """A real run with a monthly clock (1990 to 2002), half released, then the rest: the
    page's time axis has round dates, each on the release of the step that ends then
    (12 (Y - 1990) for 1 January of year Y, worked out here), readable (no two labels
    overlap), and the step's window follows the file."""
    from playwright.sync_api import expect

    from dpstream.cli import main

    from .conftest import fixed_key, own_ledger

    key = tmp_path / "k.key"
    fixed_key("browser-dates").save(key)
    burst = [json.dumps({"date": "1990-01-02", "items": ["a"]})] * 100  # "a" shown from step 1
    events = burst + [
        json.dumps({"date": f"{1990 + i // 12}-{i % 12 + 1:02d}-{3 + i % 20:02d}", "items": ["a"]})
        for i in range(156)
    ]
    out, state = tmp_path / "out.jsonl", tmp_path / "s.sqlite"

    def run(lines: list[str], *extra: str) -> None:
        src = tmp_path / "ev.jsonl"
        src.write_text("".join(x + "\n" for x in lines))
        argv = ["run", "-q", "-m", "unknown", "--max-items", "1", "--rho", "1"]
        argv += ["--threshold-delta", "1e-3", "--key-file", str(key), "-i", str(src)]
        argv += ["-o", str(out), *own_ledger(out), "--state", str(state)]
        argv += ["--time-field", "date", "--start", "1990-01-01", "--step", "1mo"]
        assert main([*argv, "--end", "2003-01-01", *extra]) == 0

    run(events[:160], "--until", "60")
    server = ViewServer(ViewModel(out, top=5), poll=0.1).start()
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(5000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        assert page.inner_text("#dp-t") == "60"
        assert page.inner_text("#dp-window") == "1994-12-01 – 1995-01-01"

        def axis():
            ticks = page.eval_on_selector_all(
                "#dp-history svg text.tick.date",
                "els => els.map(e => { const b = e.getBBox(); return [e.textContent, "
                "e.dataset.date, Number(e.getAttribute('x')), b.x, b.width]; })",
            )
            points = page.get_attribute('#dp-history g.series[data-item="a"] polyline', "points")
            return ticks, [float(p.split(",")[0]) for p in points.split()]

        ticks, xs = axis()
        assert [label for label, *_ in ticks] == ["1992", "1994", "1996", "1998", "2000", "2002"]
        assert len(xs) == 60  # steps 1..60 released so far, drawn on the axis of T = 156
        for label, iso, x, _, width in ticks:
            assert iso == f"{label}-01-01T00:00:00+00:00" and width > 0
            t = 12 * (int(label) - 1990)
            if t <= 60:
                assert x == pytest.approx(xs[t - 1], abs=0.11)
        for a, b in zip(ticks, ticks[1:], strict=False):
            assert a[3] + a[4] < b[3]  # the labels do not overlap
        assert "end of each step (UTC+00:00)" in page.inner_text("#dp-history")
        assert "time step t" not in page.inner_text("#dp-history")

        run(events[160:])  # the rest of the stream
        # (the page keeps its Content-Security-Policy here: Playwright's own expect, no eval)
        expect(page.locator("#dp-t")).to_have_text("156", timeout=30_000)
        assert page.inner_text("#dp-window") == "2002-12-01 – 2003-01-01"
        assert "t = 156, as of 2003-01-01: " in page.inner_text("#dp-history ul.legend")
        ticks, xs = axis()
        assert len(xs) == 156
        for label, _, x, _, _ in ticks:
            assert x == pytest.approx(xs[12 * (int(label) - 1990) - 1], abs=0.11)
        assert errors == []
    finally:
        page.close()
        server.stop()


def _serve_names(tmp_path, released: dict) -> ViewServer:
    path = tmp_path / "names.jsonl"
    path.write_text(_line(1, released, 1.0) + _line(2, released, 1.0), encoding="utf-8")
    return ViewServer(ViewModel(path, top=10), poll=0.1).start()


def _new_page(browser) -> tuple[Any, list[tuple[int, str]]]:
    """A page, and the list its failed responses go to."""
    page = browser.new_page()
    failed: list[tuple[int, str]] = []
    page.on("response", lambda r: r.status >= 400 and failed.append((r.status, r.url[:80])))
    page.set_default_timeout(5000)
    return page, failed


def test_a_long_name_in_the_top_3_can_be_followed(browser, tmp_path):
    """A 3,000-character item among the top 3 the page opens with: clicking another item
    asks for all four, and the server answers (it answered 400 to a name over 1,000
    characters, and the page looped "disconnected: retrying")."""
    from playwright.sync_api import expect

    long = "x" * 3000
    server = _serve_names(tmp_path, {long: 100, "a": 90, "b": 80, "c": 70})
    page, failed = _new_page(browser)
    try:
        page.goto(server.url)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        legend = "#dp-history ul.legend li"
        assert page.eval_on_selector_all(legend, "els => els.map(e => e.dataset.item)") == [
            long,
            "a",
            "b",
        ]
        page.locator('#dp-top li.row[data-item="c"]').click()
        expect(page.locator(legend)).to_have_count(4, timeout=30_000)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        assert page.eval_on_selector_all(legend, "els => els.map(e => e.dataset.item)") == [
            long,
            "a",
            "b",
            "c",
        ]
        assert "manual=1" in page.url and long in page.url
        assert page.locator("#dp-too-long").is_hidden()
        assert failed == []
    finally:
        page.close()
        server.stop()


def test_names_too_long_for_one_request_are_left_out_and_said(browser, tmp_path):
    """Three 25,000-character names and one more item exceed what one request may carry
    (64 KiB): the page leaves out a longest name, says so, and stays connected."""
    from playwright.sync_api import expect

    names = [c * 25_000 for c in "xyz"]
    server = _serve_names(tmp_path, {names[0]: 100, names[1]: 90, names[2]: 80, "c": 70})
    page, failed = _new_page(browser)
    try:
        page.goto(server.url)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        page.locator('#dp-top li.row[data-item="c"]').click()
        note = page.locator("#dp-too-long")
        note.wait_for(state="visible", timeout=5000)
        assert "1 item name(s) too long" in note.inner_text()
        legend = "#dp-history ul.legend li"
        expect(page.locator(legend + '[data-item="c"]')).to_have_count(1, timeout=30_000)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        shown = page.eval_on_selector_all(legend, "els => els.map(e => e.dataset.item)")
        assert shown == [names[1], names[2], "c"]  # the first of the longest is left out
        assert failed == []
    finally:
        page.close()
        server.stop()


def test_a_failing_poll_shows_not_updating(browser, tmp_path):
    """While the server cannot read the file (here a planted failure), the page says it is
    not being updated, not "live"; once it can, the page is live again."""
    path = tmp_path / "r.jsonl"
    path.write_text(_line(1, {"a": 3}, 1.0))
    model = ViewModel(path)
    broken = []
    real = model._refresh_file

    def refresh_file() -> bool:
        if broken:
            raise RuntimeError("planted failure")
        return real()

    model._refresh_file = refresh_file  # type: ignore[method-assign]
    server = ViewServer(model, poll=0.1).start()
    page = browser.new_page()
    page.set_default_timeout(5000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        assert page.get_attribute("#dp-status", "class") == "pill live"
        broken.append(True)
        page.wait_for_selector("#dp-status.stale", timeout=30_000)
        assert page.inner_text("#dp-conn") == "connected: not updating"
        assert "not being updated" in page.inner_text("#dp-header")
        broken.clear()
        path.write_text(_line(1, {"a": 3}, 1.0) + _line(2, {"a": 5}, 1.0))
        page.wait_for_selector("#dp-status.live", timeout=30_000)
        page.wait_for_selector("#dp-conn.ok", timeout=5000)
        assert page.inner_text("#dp-conn") == "live: connected"
    finally:
        page.close()
        server.stop()
