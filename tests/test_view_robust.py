"""The live view against odd files and clients: the export never overwrites another file,
a bad line or a failing poll never takes the server down nor shows stale data as live,
concurrent pages start one pass over the file at a time, long names can be followed, and
the server listens on IPv6.

Browser tests of the same (a long name in the top 3) are in tests/test_view_browser.py.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dpstream.cli import main
from dpstream.run.meta import FORMAT, read_run_meta, sidecar_path, write_run_meta
from dpstream.view.export import EXPORT_MARKER
from dpstream.view.follow import FileFollower
from dpstream.view.model import ViewModel, parse_release
from dpstream.view.render import ATTR_NAME, SHORT_NAME, esc, render_page
from dpstream.view.server import ViewServer

#: Seconds any one wait may take before the test fails (only a failing run waits this long).
DEADLINE = 30.0
HUGE = 10**400  # an integer too large for a float (math.isfinite raises OverflowError)


def _line(t: int, released: dict, **meta: object) -> str:
    return json.dumps({"t": t, "released": released, "meta": meta}) + "\n"


def _releases(tmp_path: Path, steps: int = 3) -> Path:
    path = tmp_path / "rel.jsonl"
    path.write_text(
        "".join(_line(t, {"a": 10 * t, "b": t}, noise_std=1.0) for t in range(1, steps + 1))
    )
    write_run_meta(path, {"format": FORMAT, "horizon": 10, "mechanism": "known"})
    return path


def _get(server: ViewServer, path: str, host: str | None = None) -> tuple[int, bytes]:
    addr, port = server._httpd.server_address[:2]
    conn = http.client.HTTPConnection(addr, port, timeout=DEADLINE)
    try:
        headers = {} if host is None else {"Host": host}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _state(server: ViewServer, query: str = "") -> dict:
    status, body = _get(server, "/api/state" + query)
    assert status == 200, body
    return json.loads(body)


def _wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < deadline, f"still not {what} after {DEADLINE} s"
        time.sleep(0.02)


def _first_event(server: ViewServer, query: str = "") -> dict:
    """The first message of an event stream (sent at once on connecting)."""
    addr, port = server._httpd.server_address[:2]
    with socket.create_connection((addr, port), timeout=DEADLINE) as sock:
        sock.sendall(f"GET /events{query} HTTP/1.0\r\n\r\n".encode())
        buf = b""
        while b"\ndata: " not in buf or not buf.endswith(b"\n\n"):
            chunk = sock.recv(65536)
            assert chunk, f"the event stream closed: {buf[:200]!r}"
            buf += chunk
    line = next(ln for ln in buf.split(b"\n") if ln.startswith(b"data: "))
    return json.loads(line[6:])


# --------------------------------------------------------------------------- 1. export


def test_export_refuses_a_file_it_did_not_write(tmp_path, capsys):
    """A key (any file of other content), the releases file and its sidecar, by their name
    or through a symbolic link, are never overwritten; each stays byte for byte."""
    rel = _releases(tmp_path)
    key = tmp_path / "k.key"
    key.write_bytes(b"secret key bytes\n")
    (tmp_path / "to-sidecar.html").symlink_to(sidecar_path(rel).name)
    (tmp_path / "to-key.html").symlink_to("k.key")
    (tmp_path / "to-releases.html").symlink_to("rel.jsonl")
    before = {p: p.read_bytes() for p in (key, rel, sidecar_path(rel))}
    for out, why in [
        (key, "not a page dpstream view exported"),
        (tmp_path / "to-key.html", "not a page dpstream view exported"),
        (tmp_path / "to-sidecar.html", "its metadata file"),
        (sidecar_path(rel), "its metadata file"),
        (tmp_path / "to-releases.html", "the releases file"),
        (tmp_path, "not a regular file"),
    ]:
        assert main(["view", str(rel), "--export", str(out)]) == 1
        assert why in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    # a sidecar that does not exist yet is refused too (a run would find HTML there)
    (tmp_path / "new.jsonl").write_text(_line(1, {"a": 1}))
    assert (
        main(
            ["view", str(tmp_path / "new.jsonl"), "--export", str(tmp_path / "new.jsonl.meta.json")]
        )
        == 1
    )
    assert not (tmp_path / "new.jsonl.meta.json").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_export_replaces_an_earlier_export(tmp_path):
    """Exporting again updates the report (through a link, the file it leads to); a page
    exported before the marker existed is recognised as an export too."""
    rel = _releases(tmp_path, 2)
    out = tmp_path / "report.html"
    assert main(["view", str(rel), "--export", str(out)]) == 0
    first = out.read_text(encoding="utf-8")
    assert EXPORT_MARKER in first[:300]
    with open(rel, "a") as fh:
        fh.write(_line(3, {"a": 30, "b": 3}, noise_std=1.0))
    link = tmp_path / "latest.html"
    link.symlink_to("report.html")
    assert main(["view", str(rel), "--export", str(link)]) == 0
    assert link.is_symlink() and 't = <span class="tnum">3</span>' in out.read_text("utf-8")
    # an export of an earlier version (no marker) is replaced as well
    out.write_text(first.replace(EXPORT_MARKER, ""), encoding="utf-8")
    assert main(["view", str(rel), "--export", str(out)]) == 0
    assert EXPORT_MARKER in out.read_text("utf-8")
    # but not a live page saved from the browser, nor an HTML file of other content
    other = tmp_path / "other.html"
    other.write_text("<!doctype html>\n<p>mine</p>")
    assert main(["view", str(rel), "--export", str(other)]) == 1
    assert other.read_text() == "<!doctype html>\n<p>mine</p>"


def test_a_failed_export_leaves_the_earlier_one(tmp_path):
    """A write that fails part way (here: a file size limit, as a full disk would) leaves
    the earlier export whole: the page goes to a temporary file, then one rename."""
    rel = _releases(tmp_path)
    out = tmp_path / "report.html"
    assert main(["view", str(rel), "--export", str(out)]) == 0
    before = out.read_bytes()
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))\n"
        "from dpstream.cli import main\n"
        f"sys.exit(main(['view', {str(rel)!r}, '--export', {str(out)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stderr.decode()
    assert out.read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


# --------------------------------------------------------------------------- 2. bad lines


@pytest.mark.parametrize(
    "line",
    [
        _line(4, {"a": 1}, noise_std=HUGE),
        _line(4, {"a": 1}, noise_std=1.0, threshold=-HUGE),
        _line(4, {"a": 1}, noise_std=1e300),
        _line(2**63, {"a": 1}, noise_std=1.0),
        _line(4, {"a": 1e300, "b": -1e300}, noise_std=1.0),
    ],
)
def test_a_line_of_numbers_the_page_cannot_draw_is_malformed(tmp_path, line):
    """Such a line is skipped and counted like any malformed line: the page shows the last
    good release, and renders (before, the snapshot or the poll raised OverflowError, or the
    chart's scale became infinite)."""
    with pytest.raises(ValueError):
        parse_release(line.encode())
    path = _releases(tmp_path)
    model = ViewModel(path)
    model.refresh()
    model.select(["a"])  # followed: the poll parses every line holding it
    with open(path, "a") as fh:
        fh.write(line)
    model.refresh()
    snap = model.snapshot(["a"])
    assert snap.t == 3 and snap.malformed == 1 and "line 4" in (snap.last_problem or "")
    assert snap.history["a"][0] == [1, 2, 3]
    render_page(snap, nonce=None)
    render_page(model.snapshot(None), nonce="n")


def test_a_bad_newest_line_keeps_every_endpoint_answering(tmp_path):
    path = _releases(tmp_path)
    server = ViewServer(ViewModel(path), poll=0.05).start()
    try:
        assert _state(server, "?manual=1&sel=a")["t"] == 3
        with open(path, "a") as fh:
            fh.write(_line(4, {"a": 7}, noise_std=HUGE, threshold=HUGE))
        _wait_for(lambda: _state(server)["malformed"] == 1, "skipping the bad line")
        assert _get(server, "/")[0] == 200
        assert _state(server, "?manual=1&sel=a")["history"]["a"]["t"] == [1, 2, 3]
        event = _first_event(server)
        assert event["status"] == "live" and event["t"] == 3
        with open(path, "a") as fh:  # the poll goes on
            fh.write(_line(5, {"a": 50, "b": 5}, noise_std=1.0))
        _wait_for(lambda: _state(server)["t"] == 5, "reading the next line")
    finally:
        server.stop()


def test_a_nested_sidecar_is_refused_in_words(tmp_path, capsys):
    """A sidecar nested 100,000 deep is no sidecar: reading it says so (it raised
    RecursionError), the run will not overwrite it, the view shows the rest."""
    rel = _releases(tmp_path)
    side = sidecar_path(rel)
    side.write_text(f'{{"format": "{FORMAT}", "x": {"[" * 100_000}1{"]" * 100_000}}}')
    with pytest.raises(ValueError, match="nested too deeply"):
        read_run_meta(side)
    with pytest.raises(ValueError, match="not a dpstream metadata file"):
        write_run_meta(rel, {"format": FORMAT})
    out = tmp_path / "report.html"
    assert main(["view", str(rel), "--export", str(out)]) == 0
    assert "nested too deeply" in out.read_text("utf-8")
    model = ViewModel(rel)
    model.refresh()
    snap = model.snapshot(None)
    assert snap.t == 3 and snap.meta is None and "nested too deeply" in (snap.meta_error or "")


def test_a_sidecar_with_nan_is_refused_and_the_state_answers(tmp_path):
    """``NaN`` is no JSON number and a sidecar never holds one: it is refused, so that
    /api/state (JSON without NaN) still answers (it dropped the connection)."""
    rel = _releases(tmp_path)
    sidecar_path(rel).write_text(f'{{"format": "{FORMAT}", "horizon": 10, "tau": NaN}}')
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        read_run_meta(sidecar_path(rel))
    server = ViewServer(ViewModel(rel), poll=0.05).start()
    try:
        state = _state(server)
        assert state["t"] == 3 and state["meta"] is None and "NaN" in state["meta_error"]
    finally:
        server.stop()


def test_run_force_over_a_nested_sidecar_says_why(tmp_path, capsys):
    """``dpstream run --force`` over an output whose sidecar is nested too deeply ends with a
    sentence (it ended in a RecursionError traceback)."""
    from .conftest import UNKNOWN_CLI, fixed_key, own_ledger

    key = tmp_path / "k.key"
    fixed_key("view-nested").save(key)
    events = tmp_path / "ev.jsonl"
    events.write_text("".join(json.dumps({"t": t, "items": ["a"]}) + "\n" for t in (1, 2)))
    out = _releases(tmp_path)
    sidecar_path(out).write_text(f'{{"format": "{FORMAT}", "x": {"[" * 100_000}{"]" * 100_000}}}')
    argv = ["run", "-q", *UNKNOWN_CLI, "-T", "2", "--key-file", str(key), "-i", str(events)]
    assert main([*argv, "-o", str(out), *own_ledger(out), "--force"]) == 1
    err = capsys.readouterr().err
    assert "no metadata sidecar says which noise version" in err and "Traceback" not in err
    assert main([*argv, "-o", str(out), *own_ledger(out), "--force", "--noise-version", "2"]) == 1
    assert "not a dpstream metadata file" in capsys.readouterr().err


def test_the_poll_survives_any_failure_and_the_page_says_it_is_not_updating(
    tmp_path, monkeypatch, caplog
):
    """A refresh that raises (a bug) is logged once; the server keeps serving, and the page's
    status is "stale" (not live) with a message until a refresh succeeds again."""
    path = _releases(tmp_path)
    model = ViewModel(path)
    broken = threading.Event()
    real = model._refresh_file

    def refresh_file() -> bool:
        if broken.is_set():
            raise RuntimeError("planted failure")
        return real()

    monkeypatch.setattr(model, "_refresh_file", refresh_file)
    server = ViewServer(model, poll=0.05).start()
    try:
        assert _state(server)["status"] == "live"
        with caplog.at_level(logging.ERROR, logger="dpstream.view"):
            broken.set()
            _wait_for(lambda: _state(server)["status"] == "stale", "saying it is stale")
            state = _state(server)
            assert "not being updated" in state["message"] and "planted failure" in state["message"]
            page = _get(server, "/")[1].decode()
            assert "not updating" in page and "not being updated" in page
            assert _first_event(server)["status"] == "stale"
            time.sleep(0.3)  # several polls fail: one log record
        records = [r for r in caplog.records if r.name == "dpstream.view"]
        assert len(records) == 1 and "planted failure" in records[0].getMessage()
        assert records[0].exc_info is not None
        broken.clear()
        with open(path, "a") as fh:
            fh.write(_line(4, {"a": 40, "b": 4}, noise_std=1.0))
        _wait_for(lambda: _state(server)["status"] == "live", "live again")
        assert _state(server)["t"] == 4 and server._threads[1].is_alive()
    finally:
        server.stop()


def test_a_page_that_cannot_be_rendered_is_answered_500(tmp_path, monkeypatch, caplog):
    """A failure while rendering (a bug) is answered 500 and logged; it dropped the
    connection without an answer."""
    import dpstream.view.server as server_module

    path = _releases(tmp_path)
    server = ViewServer(ViewModel(path), poll=0.05).start()

    def broken(*args, **kwargs):
        raise RuntimeError("planted render failure")

    try:
        monkeypatch.setattr(server_module, "render_page", broken)
        monkeypatch.setattr(server_module, "snapshot_json", broken)
        with caplog.at_level(logging.ERROR, logger="dpstream.view"):
            assert _get(server, "/")[0] == 500
            assert _get(server, "/api/state")[0] == 500
        records = [r for r in caplog.records if r.name == "dpstream.view"]
        assert len(records) == 2 and all(r.exc_info is not None for r in records)
        monkeypatch.undo()
        assert _get(server, "/")[0] == 200
    finally:
        server.stop()


# --------------------------------------------------------------------------- 3. one pass


def test_concurrent_pages_start_one_pass_at_a_time(tmp_path, monkeypatch):
    """Eight pages asking at once for eight new items: at most one pass over the file runs
    at any time (each holds a line and its parse), the pages waiting share the next pass,
    and every history equals a parse of the whole file."""
    names = [f"item{i}" for i in range(8)]
    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(
            _line(t, {n: t * (i + 1) for i, n in enumerate(names) if (t + i) % 3}, noise_std=1.0)
            for t in range(1, 40)
        )
    )
    model = ViewModel(path)
    model.refresh()
    real = ViewModel._scan
    lock = threading.Lock()
    active = [0]
    most = [0]
    passes = []

    def scan(self, items, tokens, start, end):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            passes.append((tuple(items), start))
        try:
            if start == 0:  # give the other pages time to start a pass of their own, if they can
                deadline = time.monotonic() + 1.0
                while active[0] < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
            return real(self, items, tokens, start, end)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(ViewModel, "_scan", scan)
    threads = [threading.Thread(target=model.select, args=([n],)) for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join(DEADLINE)
    assert most[0] == 1
    assert len([p for p in passes if p[1] == 0]) <= 2  # the first page's, then all the others
    snap = model.snapshot(names)
    for i, n in enumerate(names):
        ts = [t for t in range(1, 40) if (t + i) % 3]
        assert snap.history[n][0] == ts
        assert snap.history[n][1] == [float(t * (i + 1)) for t in ts]


# --------------------------------------------------------------------------- 4. long names


def test_a_long_item_name_can_be_asked_for(tmp_path):
    """An item of 3,000 characters (in the top 3) has a history like any other: the server
    used to answer 400 to any name over 1,000 characters."""
    long = "x" * 3000
    path = tmp_path / "r.jsonl"
    path.write_text("".join(_line(t, {long: 10 * t, "a": t}, noise_std=1.0) for t in (1, 2)))
    server = ViewServer(ViewModel(path), poll=0.05).start()
    try:
        state = _state(server, f"?manual=1&sel={long}&sel=a")
        assert state["history"][long]["t"] == [1, 2] and state["history"]["a"]["t"] == [1, 2]
        assert _get(server, f"/?manual=1&sel={long}")[0] == 200
        assert _first_event(server, f"?manual=1&sel={long}")["selected"] == [long]
        # the request line still bounds a request (http.server: 64 KiB)
        assert _get(server, "/api/state?manual=1&sel=" + "y" * 70_000)[0] == 414
    finally:
        server.stop()


def _events_socket(server: ViewServer) -> socket.socket:
    addr, port = server._httpd.server_address[:2]
    sock = socket.create_connection((addr, port), timeout=DEADLINE)
    sock.sendall(b"GET /events HTTP/1.0\r\n\r\n")
    return sock


def _next_data(sock: socket.socket, buf: bytearray) -> bytes:
    """The next ``data:`` line of an event stream, as sent (keep-alives skipped)."""
    from .test_view import sse_data

    return sse_data(sock, buf, 1, timeout=60.0)[0]


def test_an_update_with_a_long_name_is_small_and_rendered_once(tmp_path, monkeypatch):
    """Review 107: a 20 MB item name and 10 open pages took the server from 480 MB to
    4.2 GB: each stream rendered each change itself, and the name was in it five times
    (data-item, title, text, legend). The page now shows a long name cut short, names
    it by an index, and the streams share one rendering per change."""
    import dpstream.view.server as view_server

    renders = []
    real = view_server.render_fragments

    def counted(snap, **kw):
        renders.append((snap.version, hash(tuple(snap.selected)), snap.auto))
        return real(snap, **kw)

    monkeypatch.setattr(view_server, "render_fragments", counted)
    big = "<b>&" + "N" * (1 << 20)  # 1 MB, beginning with what must stay escaped
    path = tmp_path / "r.jsonl"
    path.write_text(
        "".join(_line(t, {big: 1000 + t, "a": 5, "b": 4}, noise_std=1.0) for t in (1, 2))
    )
    model = ViewModel(path)
    server = ViewServer(model, poll=0.05).start()
    try:
        model.snapshot(None)  # the top items' histories read: the version settles
        socks = [_events_socket(server) for _ in range(2)]
        bufs = [bytearray() for _ in socks]
        try:
            first = [_next_data(s, b) for s, b in zip(socks, bufs, strict=True)]
            assert first[0] == first[1]
            with open(path, "a") as fh:
                fh.write(_line(3, {big: 2000, "a": 6, "b": 4}, noise_std=1.0))
            update = [_next_data(s, b) for s, b in zip(socks, bufs, strict=True)]
        finally:
            for sock in socks:
                sock.close()
        assert update[0] == update[1]  # the same bytes ...
        msg = json.loads(update[0][6:])
        assert msg["t"] == 3 and msg["selected"] == [big, "a", "b"]
        # ... once per (version, selection): the two streams shared each rendering
        assert len(renders) == len(set(renders)), renders
        assert sum(1 for r in renders if r[0] == msg["version"]) == 1
        # the name is sent once (for the page to ask for it), not in five places
        assert len(update[0]) < 1.1 * len(big), len(update[0])
        html_text = "".join(msg["html"].values())
        assert len(html_text) < 50_000 and big not in html_text
        assert f"{len(big):,} characters" in html_text
        assert "&lt;b&gt;&amp;NNN" in html_text and "<b>" not in html_text
        assert 'data-i="0"' in msg["html"]["top"] and 'data-i="0"' in msg["html"]["history"]
        # the page opened anew: the same (data-state holds the names once)
        status, body = _get(server, "/")
        assert status == 200 and len(body) < 1.1 * len(big), len(body)
    finally:
        server.stop()


def test_a_long_name_is_shown_cut_and_escaped_on_the_page(tmp_path):
    """A name longer than SHORT_NAME is shown as its first characters (cut before
    escaping: no entity or tag is broken into), an ellipsis and its length; a
    name a request could carry is still each element's data-item."""
    evil = '<img src=x onerror="alert(1)">' * 40  # 1,200 characters
    path = tmp_path / "r.jsonl"
    path.write_text(_line(1, {evil: 9, "a": 5}, noise_std=1.0))
    model = ViewModel(path)
    model.refresh()
    page = render_page(model.snapshot(None), nonce=None)
    assert "<img" not in page
    assert f"{esc(evil[:SHORT_NAME])}… ({len(evil):,} characters)" in page
    assert SHORT_NAME < len(evil) <= ATTR_NAME
    assert page.count(f'data-item="{esc(evil)}"') == 3  # row, series, legend
    assert page.count(f'title="{esc(evil)}"') == 1  # review 108: the row's hover shows it all


# --------------------------------------------------------------------------- 5. IPv6


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
@pytest.mark.parametrize("host", ["::1", "::", "[::1]"])
def test_the_server_listens_on_ipv6(tmp_path, host):
    path = _releases(tmp_path)
    server = ViewServer(ViewModel(path), host=host, poll=0.05).start()
    try:
        port = server._httpd.server_address[1]
        assert server.url == f"http://[::1]:{port}/"
        conn = http.client.HTTPConnection("::1", port, timeout=DEADLINE)
        try:  # http.client sends "Host: [::1]:PORT"
            conn.request("GET", "/api/state")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["t"] == 3
            conn.request("GET", "/api/state", headers={"Host": "evil.example", "Origin": "x"})
            assert conn.getresponse().status == 403
        finally:
            conn.close()
        conn = http.client.HTTPConnection("::1", port, timeout=DEADLINE)
        try:
            conn.request("GET", "/", headers={"Origin": f"http://[::1]:{port}"})
            resp = conn.getresponse()
            assert resp.status == 200 and b"dp-view" in resp.read()
        finally:
            conn.close()
    finally:
        server.stop()


def _reference(data: bytes, items: list[str]):
    """What a full parse gives: (t, {item: count}, meta), or None for a malformed line."""
    try:
        rel = parse_release(data)
    except ValueError:
        return None
    return rel.t, {i: rel.released[i] for i in items if i in rel.released}, rel.meta


def test_items_read_without_a_full_parse_equal_a_full_parse():
    """The items of a line read with the layout's expression (no dict of the line) equal a
    parse of the whole line, for dpstream's lines and for every odd one: names with
    escapes or that look like pairs, repeated names, numbers at and past the limits,
    other spacing, extra keys, bad meta. dpstream's own lines take the quick way."""
    import random

    from dpstream.view.extract import extract_items
    from dpstream.view.model import _items_of

    rng = random.Random(61)
    names = [
        "a",
        "b",
        "",
        " ",
        "a b",
        'a": 5, "b',
        "x, ",
        ": 5, ",
        '"a"',
        "a\\",
        "é🐦",
        "\n",
        "\u2028",
        "<script>",
        'a": ',
        "\\u0061",
        "1",
    ]
    numbers = [
        0,
        -0.0,
        1,
        -3,
        2.5,
        1e-300,
        1e16,
        1.5e89,
        9.9e99,
        1e100,
        1e101,
        1e300,
        10**99 - 1,
        10**99,
        10**120,
        HUGE,
        float("nan"),
        float("inf"),
        7.0,
        -2e-5,
    ]
    quick = 0
    for _ in range(3000):
        released = {rng.choice(names): rng.choice(numbers) for _ in range(rng.randint(0, 6))}
        meta = rng.choice(
            [
                None,
                {},
                {"noise_std": 1.5},
                {"noise_std": HUGE},
                {"threshold": 1e300},
                {"noise_std": 2, "x": [1, {"y": "}"}]},
                {"threshold": float("nan")},
            ]
        )
        obj = {"t": rng.choice([1, 7, 2**63 - 1, 2**63, 0, -1, True]), "released": released}
        if meta is not None:
            obj["meta"] = meta
        text = json.dumps(obj, ensure_ascii=rng.random() < 0.2)
        mutation = rng.randrange(8)
        if mutation == 0:  # a repeated name (json.loads keeps the last)
            text = text.replace('"released": {', '"released": {"a": 99, ', 1)
        elif mutation == 1:
            text = text.replace(": ", ":", 2)
        elif mutation == 2:
            text = text[:-1] + ', "extra": {}}'
        elif mutation == 3:
            text = text.replace('"meta": {', '"meta": {"noise_std": 1, ', 1)
        elif mutation == 4:
            text = text[: rng.randrange(len(text))]  # cut short
        data = (text + rng.choice(["\n", "\r\n", " \n", "\x0b\n", ""])).encode()
        items = rng.sample(names, 4)
        want = _reference(data, items)
        if want is None:
            with pytest.raises(ValueError):
                _items_of(data, items)
        else:
            got = _items_of(data, items)
            assert got[0] == want[0] and got[1] == want[1], (data, items)
            assert type(got[1].get("a")) is type(want[1].get("a"))
            assert json.dumps(got[2]) == json.dumps(want[2])
            quick += extract_items(data, items) is not None
    assert quick > 30  # the layout dpstream writes takes the quick way
    line = _line(3, {f"n{i}": i * 1.5 for i in range(1000)}, noise_std=2.0).encode()
    assert extract_items(line, ["n7", "zz"]) == (3, {"n7": 10.5}, {"noise_std": 2.0})


def test_a_pass_does_not_hold_a_parse_of_the_line(tmp_path):
    """Filling a history from lines of 10^5 items allocates less than half of what a full
    parse of one such line does (it parsed every line in full: more than all of it)."""
    import tracemalloc

    path = tmp_path / "wide.jsonl"
    released = {f"item{i:06d}": i * 3 for i in range(100_000)}
    path.write_text("".join(_line(t, released, noise_std=1.0) for t in (1, 2, 3)))
    data = path.read_bytes().split(b"\n")[0]
    tracemalloc.start()
    parse_release(data)
    full = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    model = ViewModel(path)
    model.refresh()
    tracemalloc.start()
    model.select(["item000042", "item099999"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # what is left is the reading of the lines (a block, the line, its pieces)
    assert peak < full / 2, (peak, full)
    snap = model.snapshot(["item000042", "item099999"])
    assert snap.history["item000042"][:2] == ([1, 2, 3], [126.0] * 3)
    assert snap.history["item099999"][:2] == ([1, 2, 3], [299997.0] * 3)


def test_a_file_rewritten_in_place_with_the_same_tail_is_read_again(tmp_path):
    """Review 94: a new run writing the same file in place (run --force, cp) kept the
    inode, grew past the offset within a poll, and ended its last line read with the
    same bytes (the meta depends on t only), so the page kept the old run's history.
    The file's first bytes tell the rewrite now."""
    path = _releases(tmp_path)
    model = ViewModel(path)
    model.refresh()
    model.select(["a"])
    assert model.snapshot(["a"]).history["a"][1] == [10.0, 20.0, 30.0]
    # another run's file: its first release differs (c for a), the rest is the same
    # bytes, so the bytes before the old offset are too, and it is longer
    other = _line(1, {"c": 10, "b": 1}, noise_std=1.0)
    other += "".join(_line(t, {"a": 10 * t, "b": t}, noise_std=1.0) for t in range(2, 5))
    with open(path, "r+") as fh:  # in place: the same inode
        fh.write(other)
    model.refresh()
    snap = model.snapshot(["a"])
    assert snap.t == 4 and snap.history["a"][0] == [2, 3, 4]  # not 1 of the old run


def _rewrite_in_place(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` in place (same inode), its time stamps changed as a
    later writer's would be (a filesystem's clock may tick only every few ms)."""
    before = path.stat()
    time.sleep(0.02)
    with open(path, "r+") as fh:
        fh.write(text)
    after = path.stat()
    assert after.st_ino == before.st_ino
    if (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns):
        os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns + 1_000_000))


def test_a_file_rewritten_in_place_with_the_same_length_is_read_again(tmp_path):
    """Review 107: a corrected run over the same output (run --force, cp; the same key and
    settings) wrote lines of the same lengths: the same size, the same first 256 bytes,
    the same 64 bytes before the offset (the meta's tail), so the page kept the old
    numbers, "complete", for ever. A change of the file's time stamps without growth
    has the bytes read checked again."""

    def releases(shift: int) -> str:
        return "".join(
            _line(
                t,
                {"a": 100 + t + (shift if t >= 10 else 0), "b": 500 + t},
                noise_std=1.0,
                note="x" * 70,
            )
            for t in range(1, 41)
        )

    path = tmp_path / "rel.jsonl"
    old, new = releases(0), releases(1)
    assert len(old) == len(new) and old[:256] == new[:256] and old[-64:] == new[-64:]
    path.write_text(old)
    write_run_meta(path, {"format": FORMAT, "horizon": 40, "mechanism": "known"})
    model = ViewModel(path)
    model.refresh()
    snap = model.snapshot(["a"])
    assert snap.status == "complete" and dict(snap.top)["a"] == 140
    _rewrite_in_place(path, new)
    model.refresh()
    snap = model.snapshot(["a"])
    assert snap.status == "complete" and snap.t == 40
    assert dict(snap.top)["a"] == 141  # the corrected release, not the superseded one
    assert snap.history["a"][1] == [float(100 + t + (t >= 10)) for t in range(1, 41)]


def test_a_growing_or_touched_file_is_not_read_again(tmp_path, monkeypatch):
    """The check of a rewrite of the same length reads the file again only when its time
    stamps changed and it did not grow: never while a run appends, and a touched file
    that still holds the bytes read is not read again from the start."""
    path = tmp_path / "rel.jsonl"
    path.write_text(_line(1, {"a": 1}, noise_std=1.0))
    fol = FileFollower(path)
    checks = []
    real = FileFollower._same_as_read
    monkeypatch.setattr(FileFollower, "_same_as_read", lambda self: checks.append(1) or real(self))
    assert fol.check() == "same" and len(list(fol.read_lines())) == 1
    for t in range(2, 30):
        time.sleep(0.002)
        with open(path, "a") as fh:
            fh.write(_line(t, {"a": t}, noise_std=1.0))
        assert fol.check() == "same"
        assert [ln.number for ln in fol.read_lines()] == [t]
    assert fol.check() == "same" and checks == []  # appends: never read again
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))  # touched
    assert fol.check() == "same" and checks == [1]  # checked once: the same bytes
    assert fol.check() == "same" and checks == [1] and list(fol.read_lines()) == []
    text = path.read_text()
    _rewrite_in_place(path, text.replace('"a": 7}', '"a": 8}'))
    assert fol.check() == "reset" and checks == [1, 1]
    assert len(list(fol.read_lines())) == 29


def test_a_pipe_in_the_files_place_or_as_the_sidecar_never_blocks_the_view(tmp_path):
    """Review 94: a FIFO swapped in for the releases (or given as the sidecar) was opened
    under the model's lock and waited for a writer: every page and Ctrl-C hung. Neither
    is opened now; the page says what the path is."""
    path = _releases(tmp_path)
    model = ViewModel(path)
    model.refresh()
    assert model.snapshot(None).t == 3
    os.replace(path, tmp_path / "kept.jsonl")
    os.mkfifo(path, 0o600)
    done = threading.Event()

    def poll() -> None:
        model.refresh()
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(DEADLINE), "the poll blocked on the pipe"
    snap = model.snapshot(None)
    assert snap.status == "error" and "not a regular file" in snap.message and snap.t is None
    meta = sidecar_path(tmp_path / "kept.jsonl")
    os.replace(tmp_path / "kept.jsonl", tmp_path / "rel2.jsonl")
    os.mkfifo(meta, 0o600)  # the sidecar of a file of releases: a pipe
    (tmp_path / "kept.jsonl").write_text(_line(1, {"a": 1}, noise_std=1.0))
    side = ViewModel(tmp_path / "kept.jsonl")
    done.clear()
    threading.Thread(target=lambda: (side.refresh(), done.set()), daemon=True).start()
    assert done.wait(DEADLINE), "the poll blocked on the sidecar pipe"
    assert side.snapshot(None).t == 1


def test_a_client_that_goes_away_prints_no_traceback(tmp_path, capsys):
    """Review 94: a client that reset its connection made the server print a traceback
    on stderr (any local process could flood it, or break --log-format json)."""
    server = ViewServer(ViewModel(_releases(tmp_path)), poll=0.05).start()
    try:
        httpd = server._httpd
        for exc in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe")):
            try:
                raise exc
            except ConnectionError:
                httpd.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
    finally:
        server.stop()
