"""The page: HTML fragments and server-side SVG, from a :class:`~dpstream.view.model.Snapshot`.

Every piece of text that comes from the files (item names above all: they are
user data, a hashtag may be ``<img src=x onerror=...>``; but also anything in
the metadata) goes through :func:`esc` before it is put into HTML, SVG or an
attribute; numbers are formatted here. The live page and the static export
are the same HTML: the export leaves out the script.

A name may be of any length (megabytes): the page shows its first
:data:`SHORT_NAME` characters and its length (:func:`shown_name`), and its
elements name it by a short index, ``data-i``, into the list of names the page
is sent once (:func:`item_refs`); ``data-item`` (the name itself) is there only
for a name of at most :data:`ATTR_NAME` characters (one a request could carry).
"""

from __future__ import annotations

import html
import json
import math
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ..words import plain_mechanism
from .dates import clock_of, date_ticks, end_text, window_text
from .export import EXPORT_MARKER
from .model import MAX_SELECTED, Snapshot, is_number

__all__ = [
    "esc",
    "render_fragments",
    "render_page",
    "PALETTE",
    "content_security_policy",
    "SHORT_NAME",
    "ATTR_NAME",
    "shown_name",
    "item_refs",
]

#: Series colours (Okabe-Ito, readable by colour-blind readers), by position in the selection.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C564B")

#: The most points drawn per history line (longer series are thinned evenly).
MAX_POINTS = 800

#: The most characters of an item's name the page shows (a longer one is cut, with its
#: length said).
SHORT_NAME = 200
#: The longest name an element carries in ``data-item``: what a request line (64 KiB) can
#: carry at most, so a name the page could ask for; a longer one is named by its index.
ATTR_NAME = 64 * 1024


def esc(text: object) -> str:
    """``text`` as HTML text or attribute value: ``& < > " '`` escaped."""
    return html.escape(str(text), quote=True)


def shown_name(item: str) -> str:
    """An item's name as escaped HTML text: whole up to :data:`SHORT_NAME` characters,
    else its first ones, an ellipsis and its length (cut before escaping, so no
    entity is broken)."""
    if len(item) <= SHORT_NAME:
        return esc(item)
    return f"{esc(item[:SHORT_NAME])}… ({len(item):,} characters)"


def item_refs(snap: Snapshot) -> list[str]:
    """The names the page's elements refer to by index (``data-i``): the selected items,
    then the top items not selected. The page is sent this list once (its
    ``selected`` and ``others``), not each name in every element that names it."""
    chosen = set(snap.selected)
    return list(snap.selected) + [item for item, _ in snap.top if item not in chosen]


def _item_attrs(item: str, ref: int, *, clickable: bool = True) -> str:
    """An element's attributes naming ``item``: the name (``data-item``) if a request
    could carry it, and its index (``data-i``, what the page's script reads) on an
    element that is clicked; the index only for a longer name."""
    if len(item) > ATTR_NAME:
        return f'data-i="{ref}"'
    return f'data-item="{esc(item)}" data-i="{ref}"' if clickable else f'data-item="{esc(item)}"'


def content_security_policy(nonce: str | None) -> str:
    """The page's CSP: nothing external, and only the page's own script (if any) runs."""
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    return (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src {script}; connect-src 'self'; base-uri 'none'; form-action 'none'"
    )


# --------------------------------------------------------------------------- numbers


def fmt_count(value: float) -> str:
    """A count: an integer with thousands separators, else one decimal."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.1f}"


def fmt_num(value: float, digits: int = 3) -> str:
    """A parameter with ``digits`` significant digits (``1e-6`` rather than ``1e-06``)."""
    text = f"{value:.{digits}g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def fmt_pm(half_width: float) -> str:
    return f"{half_width:,.0f}" if half_width >= 10 else f"{half_width:,.1f}"


def _meta_num(meta: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = meta or {}
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    if is_number(cur):  # an integer of 400 digits is no number here (nor an error)
        return float(cur)
    return None


def _meta_str(meta: dict[str, Any] | None, key: str) -> str | None:
    value = (meta or {}).get(key)
    return value if isinstance(value, str) else None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi]."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    return ticks


# --------------------------------------------------------------------------- header


_STATUS_TEXT = {
    "missing": "file missing",
    "waiting": "waiting",
    "live": "live",
    "complete": "complete",
    "error": "error",
    "stale": "not updating",
}


def render_header(snap: Snapshot, *, static: bool) -> str:
    meta = snap.meta
    status = _STATUS_TEXT.get(snap.status, snap.status)
    pill = f'<span class="pill {esc(snap.status)}" id="dp-status">{esc(status)}</span>'
    title = (
        f'<div class="title"><h1>dpstream <span class="thin">'
        f"{'report' if static else 'live view'}</span></h1>"
        f'<span class="file" title="{esc(snap.path)}">{esc(Path(snap.path).name)}</span>'
        f"{pill}</div>"
    )
    tiles = []

    # mechanism
    algorithm = _meta_str(meta, "algorithm")
    name = _meta_str(meta, "mechanism")
    base = _meta_num(meta, "base")
    if meta is not None:
        words = plain_mechanism(algorithm) if algorithm else name
        domain = _DOMAIN_WORDS.get(name or "", name or "")
        # the domain in words, unless the mechanism's words say it ("unknown-domain ...")
        parts = [] if domain.replace(" ", "-") in (words or "") else [esc(domain)]
        if base is not None:
            parts.append(f"tree counter (base {base:.0f})")
        elif _meta_str(meta, "counter") == "blt":
            k = _meta_num(meta, "buffers")
            parts.append("BLT counter" + (f" ({k:.0f} buffers)" if k is not None else ""))
        tiles.append(_tile("mechanism", esc(words or "?"), " · ".join(parts), wrap=True))
    else:
        tiles.append(_tile("mechanism", "unknown", "no metadata file"))

    # progress
    no_end = (meta or {}).get("unbounded") is True  # a stream with no planned end
    if snap.t is not None and snap.horizon:
        pct = min(100.0, 100.0 * snap.t / snap.horizon)
        bar = (
            f'<div class="progress" role="progressbar" aria-valuenow="{snap.t}" '
            f'aria-valuemax="{snap.horizon}"><span style="width:{pct:.2f}%"></span></div>'
        )
        tiles.append(
            _tile(
                "time step",
                f'<span id="dp-t">{snap.t:,}</span><span class="of"> / {snap.horizon:,}</span>',
                f"{bar}{_dates(snap)}horizon T = {snap.horizon:,} ({pct:.0f}%)",
            )
        )
    elif snap.t is not None:
        # (review 115: a stream with no planned end said "horizon unknown")
        end = "no planned end" if no_end else "horizon unknown"
        step = f'<span id="dp-t">{snap.t:,}</span>'
        tiles.append(_tile("time step", step, f"{_dates(snap)}{end}"))
    else:
        tiles.append(
            _tile(
                "time step",
                "–",
                f"horizon T = {snap.horizon:,}"
                if snap.horizon
                else ("no planned end · no release yet" if no_end else "no release yet"),
            )
        )

    # privacy
    eps = _meta_num(meta, "privacy", "epsilon")
    delta = _meta_num(meta, "privacy", "delta")
    rho = _meta_num(meta, "privacy", "rho")
    unit = _meta_str(meta, "unit") or "event"
    if eps is not None and delta is not None:
        main = f"ε = {fmt_num(eps)}, δ = {fmt_num(delta)}"
        sub = (f"ρ = {fmt_num(rho)} zCDP · " if rho is not None else "") + f"per {esc(unit)}"
        claim = (meta or {}).get("privacy")
        if isinstance(claim, dict) and claim.get("for_all_t") is True:
            sub += " · for every t"  # (a stream with no planned end: at any step)
        tiles.append(_tile("privacy guarantee", main, sub))
    else:
        tiles.append(_tile("privacy guarantee", "unknown", "no metadata file"))
    budget = _budget_tile(meta)
    if budget is not None:
        tiles.append(budget)

    # items
    if snap.t is not None:
        shown = min(snap.top_n, snap.items_released)
        main = f"{shown:,} <span class='of'>of {snap.items_released:,}</span>"
        sub = "items released at this step"
        if snap.threshold is not None:
            sub += f" · discovery threshold {fmt_num(snap.threshold)}"
        tiles.append(_tile("items shown", main, sub))
    elif snap.threshold is not None:
        tiles.append(_tile("items shown", "–", f"discovery threshold {fmt_num(snap.threshold)}"))

    # noise
    if snap.noise_std is not None:
        hw = snap.z * snap.noise_std
        where = "at this step" if snap.noise_std_kind == "step" else "at the worst step"
        worst = _meta_num(meta, "ci95_half_width")
        sub = f"95% interval of a count {where} (noise std {fmt_num(snap.noise_std)})"
        if worst is not None and snap.noise_std_kind == "step" and not no_end:
            # (no planned end: its "worst step" is the step limit's, 2^40: review 115)
            sub += f" · worst step ± {fmt_pm(worst)}"
        tiles.append(_tile("uncertainty", f"± {fmt_pm(hw)}", sub))
    else:
        tiles.append(_tile("uncertainty", "unknown", "the releases carry no noise level"))

    notes = []
    if snap.message:
        notes.append(f'<p class="note {esc(snap.status)}">{esc(snap.message)}</p>')
    if snap.meta_error:
        notes.append(f'<p class="note warn">{esc(snap.meta_error)}</p>')
    elif meta is None and snap.status != "missing":
        notes.append(
            '<p class="note warn">No metadata file next to the releases '
            "(<code>FILE.meta.json</code>, written by <code>dpstream run</code>): "
            "the guarantee and horizon are unknown.</p>"
        )
    if snap.malformed:
        notes.append(
            f'<p class="note warn">{snap.malformed:,} malformed line(s) skipped; last: '
            f"{esc(snap.last_problem or '')}</p>"
        )
    return title + f'<div class="tiles">{"".join(tiles)}</div>' + "".join(notes)


def _dates(snap: Snapshot) -> str:
    """The window of the step shown, for a run with a clock (escaped HTML), else empty."""
    clock = clock_of(snap.meta)
    text = None if clock is None or snap.t is None else window_text(clock, snap.t)
    return "" if text is None else f'<span id="dp-window">{esc(text)}</span><br>'


def _when_shown(snap: Snapshot) -> str:
    """`` · 2002-12-01 – 2003-01-01``: the window of the step shown, with a clock."""
    clock = clock_of(snap.meta)
    text = None if clock is None or snap.t is None else window_text(clock, snap.t)
    return "" if text is None else f'<span class="when"> · {esc(text)}</span>'


_DOMAIN_WORDS = {
    "known": "known domain",
    "unknown": "unknown domain",
    "top-k": "continual top-k",
    "meta": "one-shot per tree cell",
}


def _budget_tile(meta: dict[str, Any] | None) -> str | None:
    """The dataset's budget, as the run's sidecar states it (all its runs, this one in)."""
    eps = _meta_num(meta, "budget", "epsilon")
    delta = _meta_num(meta, "budget", "delta")
    releases = _meta_num(meta, "budget", "releases")
    budget = (meta or {}).get("budget")
    if not isinstance(budget, dict) or delta is None or releases is None:
        return None
    name = budget.get("dataset")
    main = f"ε = {fmt_num(eps)}, δ = {fmt_num(delta)}" if eps is not None else "unbounded"
    sub = f"dataset {esc(str(name))} · {releases:,.0f} release{'s' * (releases != 1)} in all"
    cap = _meta_num(meta, "budget", "cap_epsilon")
    if cap is not None:
        sub += f" · cap ε = {fmt_num(cap)}"
    return _tile("dataset budget spent", main, sub)


def _tile(label: str, main: str, sub: str, *, wrap: bool = False) -> str:
    """A header tile; ``main`` and ``sub`` must already be escaped HTML. ``wrap``: ``main``
    is words (a mechanism's name), set smaller and wrapped rather than cut short."""
    return (
        f'<div class="tile{" words" if wrap else ""}"><div class="label">{esc(label)}</div>'
        f'<div class="main">{main}</div><div class="sub">{sub}</div></div>'
    )


# --------------------------------------------------------------------------- top items


def render_top(snap: Snapshot) -> str:
    if snap.t is None:
        return '<p class="empty">No release yet.</p>'
    head = (
        f"<h2>Top {min(snap.top_n, snap.items_released):,} at "
        f't = <span class="tnum">{snap.t:,}</span>{_when_shown(snap)}</h2>'
        '<p class="hint">Bar: the released (noisy) count; whisker: its 95% interval. '
        "Click an item to show its history.</p>"
    )
    if not snap.top:
        return head + '<p class="empty">This release holds no item.</p>'
    hw = snap.z * snap.noise_std if snap.noise_std is not None else 0.0
    lows = [v - hw for _, v in snap.top]
    highs = [v + hw for _, v in snap.top]
    lo, hi = min(0.0, min(lows)), max(0.0, max(highs))
    if hi <= lo:
        hi = lo + 1.0

    def pos(v: float) -> float:
        return 100.0 * (v - lo) / (hi - lo)

    zero = pos(0.0)
    colour = {item: PALETTE[i % len(PALETTE)] for i, item in enumerate(snap.selected)}
    refs = {item: i for i, item in enumerate(item_refs(snap))}
    rows = []
    for rank, (item, value) in enumerate(snap.top, 1):
        left, right = sorted((zero, pos(value)))
        ci_l, ci_r = pos(value - hw), pos(value + hw)
        sel = item in colour
        swatch = (
            f'<span class="swatch" style="background:{colour[item]}"></span>'
            if sel
            else '<span class="swatch"></span>'
        )
        pm = f'<span class="pm">± {fmt_pm(hw)}</span>' if snap.noise_std is not None else ""
        name = shown_name(item)
        # the hover shows the whole name up to ATTR_NAME (review 108: two long URLs alike
        # in their first characters and length looked the same)
        title = esc(item) if len(item) <= ATTR_NAME else name
        rows.append(
            f'<li class="row{" selected" if sel else ""}" {_item_attrs(item, refs[item])} '
            f'data-value="{esc(json.dumps(value))}" tabindex="0" role="button" '
            f'aria-pressed="{"true" if sel else "false"}">'
            f'<span class="rank">{rank}</span>{swatch}'
            f'<span class="name" title="{title}">{name}</span>'
            f'<span class="track"><span class="bar" style="left:{left:.3f}%;'
            f'width:{right - left:.3f}%"></span>'
            f'<span class="ci" style="left:{ci_l:.3f}%;width:{ci_r - ci_l:.3f}%"></span>'
            + (f'<span class="zero" style="left:{zero:.3f}%"></span>' if lo < 0 else "")
            + f'</span><span class="num"><span class="value">{fmt_count(value)}</span>{pm}'
            f"</span></li>"
        )
    return head + f'<ol class="bars">{"".join(rows)}</ol>'


# --------------------------------------------------------------------------- history


def _thin(n: int, limit: int = MAX_POINTS) -> list[int]:
    """Indices of at most ``limit`` evenly spread points of ``n`` (first and last kept)."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _segments(ts: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive steps (an item of the unknown domain is not released every step)."""
    runs, start = [], 0
    for i in range(1, len(ts) + 1):
        if i == len(ts) or ts[i] != ts[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def render_history(snap: Snapshot) -> str:
    head = (
        '<h2>History</h2><p class="hint">Released counts over time with their 95% '
        f"interval band. Click an item to add or remove it (up to {MAX_SELECTED}).</p>"
    )
    if not snap.selected:
        return head + '<p class="empty">No item selected: click an item on the left.</p>'
    W, H, ML, MR, MT, MB = 760, 330, 62, 16, 14, 38
    series = []
    z = snap.z
    t_max = snap.horizon or snap.t or 1
    lo, hi = 0.0, 1.0
    for n, item in enumerate(snap.selected):
        ts, vs, ss = snap.history.get(item, ([], [], []))
        keep = _thin(len(ts))
        ts = [ts[i] for i in keep]
        vs = [vs[i] for i in keep]
        hw = [z * ss[i] if math.isfinite(ss[i]) else 0.0 for i in keep]
        if ts:
            lo = min(lo, min(v - h for v, h in zip(vs, hw, strict=True)))
            hi = max(hi, max(v + h for v, h in zip(vs, hw, strict=True)))
            t_max = max(t_max, ts[-1])
        series.append((item, PALETTE[n % len(PALETTE)], ts, vs, hw))
    if snap.threshold is not None:
        hi = max(hi, snap.threshold)
    ticks_y = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks_y[0]), max(hi, ticks_y[-1])
    t_lo = 1
    t_hi = max(t_max, 2)

    def x(t: float) -> float:
        return ML + (W - ML - MR) * (t - t_lo) / (t_hi - t_lo)

    def y(v: float) -> float:
        return MT + (H - MT - MB) * (1 - (v - lo) / (hi - lo))

    parts = [
        f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
        'aria-label="released counts of the selected items over time">'
    ]
    for v in ticks_y:
        parts.append(
            f'<line class="grid" x1="{ML}" x2="{W - MR}" y1="{y(v):.1f}" '
            f'y2="{y(v):.1f}"/><text class="tick" x="{ML - 6}" y="{y(v) + 4:.1f}" '
            f'text-anchor="end">{fmt_count(v)}</text>'
        )
    clock = clock_of(snap.meta)
    dated = date_ticks(clock, t_lo, t_hi) if clock is not None else []
    if dated and clock is not None:  # a run with a clock: dates on the time axis
        for u, label, iso in dated:
            parts.append(
                f'<text class="tick date" x="{x(u):.1f}" y="{H - MB + 16}" '
                f'data-date="{esc(iso)}" text-anchor="middle">{esc(label)}</text>'
            )
        zone = clock.zone_text()
        axis_label = f"end of each step ({zone if clock.named_zone else 'UTC' + zone})"
    else:
        for t in nice_ticks(t_lo, t_hi):
            if t_lo <= t <= t_hi and float(t).is_integer():
                parts.append(
                    f'<text class="tick" x="{x(t):.1f}" y="{H - MB + 16}" '
                    f'text-anchor="middle">{int(t):,}</text>'
                )
        axis_label = "time step t"
    parts.append(f'<line class="axis" x1="{ML}" x2="{W - MR}" y1="{y(lo):.1f}" y2="{y(lo):.1f}"/>')
    parts.append(
        f'<text class="axis-label" x="{(ML + W - MR) / 2:.0f}" y="{H - 4}" '
        f'text-anchor="middle">{esc(axis_label)}</text>'
    )
    if snap.threshold is not None:
        # the current step's threshold (UnkBase's varies with t: an earlier step's may
        # be lower, so a count under this line may have passed its own step's; review 115)
        ty = y(snap.threshold)
        at = f" at step {snap.t:,}" if snap.t is not None else ""
        parts.append(
            f'<line class="threshold" x1="{ML}" x2="{W - MR}" y1="{ty:.1f}" '
            f'y2="{ty:.1f}"/><text class="threshold-label" x="{W - MR - 4}" '
            f'y="{ty - 5:.1f}" text-anchor="end">discovery threshold{at} (it varies '
            "with t)</text>"
        )
    if snap.t is not None and snap.horizon and snap.t < snap.horizon:
        parts.append(
            f'<line class="now" x1="{x(snap.t):.1f}" x2="{x(snap.t):.1f}" y1="{MT}" y2="{H - MB}"/>'
        )
    for ref, (item, colour, ts, vs, hw) in enumerate(series):  # selected: refs 0, 1, ...
        parts.append(f'<g class="series" {_item_attrs(item, ref, clickable=False)}>')
        for a, b in _segments(ts):
            upper = " ".join(f"{x(ts[i]):.1f},{y(vs[i] + hw[i]):.1f}" for i in range(a, b))
            lower = " ".join(
                f"{x(ts[i]):.1f},{y(vs[i] - hw[i]):.1f}" for i in reversed(range(a, b))
            )
            line = " ".join(f"{x(ts[i]):.1f},{y(vs[i]):.1f}" for i in range(a, b))
            if b - a == 1:
                parts.append(
                    f'<circle cx="{x(ts[a]):.1f}" cy="{y(vs[a]):.1f}" r="2" fill="{colour}"/>'
                )
            else:
                parts.append(
                    f'<polygon class="band" points="{upper} {lower}" '
                    f'fill="{colour}"/><polyline class="line" points="{line}" '
                    f'stroke="{colour}"/>'
                )
        parts.append("</g>")
    parts.append("</svg>")

    legend = []
    for ref, (item, colour, ts, vs, hw) in enumerate(series):
        if ts:
            until = None if clock is None else end_text(clock, ts[-1])
            as_of = "" if until is None else f", as of {esc(until)}"
            last = (
                f'<span class="last">t = {ts[-1]:,}{as_of}: {fmt_count(vs[-1])}'
                + (f" ± {fmt_pm(hw[-1])}" if hw[-1] else "")
                + "</span>"
            )
        else:
            last = '<span class="last">not released yet</span>'
        legend.append(
            f'<li {_item_attrs(item, ref)} role="button" tabindex="0" '
            f'title="click to remove"><span class="swatch" '
            f'style="background:{colour}"></span><span class="name">{shown_name(item)}'
            f'</span>{last}<span class="x" aria-hidden="true">×</span></li>'
        )
    return head + "".join(parts) + f'<ul class="legend">{"".join(legend)}</ul>'


# --------------------------------------------------------------------------- page


def render_fragments(snap: Snapshot, *, static: bool = False) -> dict[str, str]:
    """The three parts of the page that change: header, top items, history."""
    return {
        "header": render_header(snap, static=static),
        "top": render_top(snap),
        "history": render_history(snap),
    }


def _asset(name: str) -> str:
    return (resources.files("dpstream.view") / "assets" / name).read_text("utf-8")


def render_page(snap: Snapshot, *, nonce: str | None) -> str:
    """The whole page; ``nonce=None`` gives the static export (no script, no live updates)."""
    static = nonce is None
    frag = render_fragments(snap, static=static)
    state = json.dumps(
        {
            "selected": snap.selected,
            "others": item_refs(snap)[len(snap.selected) :],
            "auto": snap.auto,
            "version": snap.version,
            "status": snap.status,
        },
        ensure_ascii=True,
    )
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    version = _meta_str(snap.meta, "dpstream_version")
    footer = ("Static report of " if static else "Live view of ") + f"{esc(snap.path)}"
    footer += f" · {snap.lines_read:,} lines read"
    footer += f" · {'exported' if static else 'opened'} {esc(when)}"
    if version:
        footer += f" · written by dpstream {esc(version)}"
    add_form = (
        ""
        if static
        else (
            '<form id="dp-add" class="add" autocomplete="off"><input id="dp-add-name" '
            'name="item" placeholder="show an item by name">'
            '<button type="submit">add</button><button type="button" id="dp-auto">show the '
            "current top 3</button></form>"
            '<p id="dp-too-long" class="note warn" hidden></p>'
        )
    )
    script = "" if static else f'<script nonce="{esc(nonce)}">{_asset("view.js")}</script>'
    conn = "" if static else '<span id="dp-conn" class="conn">connecting…</span>'
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        + (EXPORT_MARKER if static else "")
        + '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" '
        f'content="{esc(content_security_policy(nonce))}">'
        f"<title>dpstream · {esc(Path(snap.path).name)}</title>"
        f"<style>{_asset('view.css')}</style></head>"
        f'<body><main id="dp-view" data-state="{esc(state)}" '
        f'data-static="{"1" if static else "0"}">'
        f'<header id="dp-header">{frag["header"]}</header>'
        '<div class="panels">'
        f'<section class="panel" id="dp-top">{frag["top"]}</section>'
        f'<section class="panel"><div id="dp-history">{frag["history"]}</div>{add_form}'
        "</section></div>"
        f"<footer>{footer} {conn}<br>Every number here is read from the published releases "
        "and their metadata file; the page never sees the events, the state or the key."
        "</footer></main>"
        f"{script}</body></html>\n"
    )
