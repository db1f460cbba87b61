"""The live view without a browser: following the file, the model, escaping, export, server.

The browser test is tests/test_view_browser.py. References here are brute
force: a full sort of every item, a per-line parse of the whole file.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from dpstream.cli import main
from dpstream.run.meta import FORMAT, read_run_meta, sidecar_path, write_run_meta
from dpstream.view.follow import FileFollower
from dpstream.view.model import ViewModel, parse_release, top_items
from dpstream.view.render import render_page
from dpstream.view.server import ViewServer

from .conftest import own_ledger

#: Item names an attacker might publish as hashtags (user data, never markup).
EVIL = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    '"><svg onload=alert(1)>',
    'it\'s & "quoted" \\ back\\slash',
    "</script><script>window.__pwned = 3</script>",
    "emoji 🐦 ünïcödé",
]


def _line(t: int, released: dict, **meta) -> str:
    obj = {"t": t, "released": released}
    if meta:
        obj["meta"] = meta
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _brute_top(released: dict, n: int) -> list:
    return sorted(released.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _stream(rng: np.random.Generator, steps: int, names: list[str]) -> list[dict]:
    """Simulated releases: running counts, items coming and going (as in the unknown domain)."""
    counts = np.zeros(len(names))
    out = []
    for _ in range(steps):
        counts += rng.integers(0, 4, size=len(names))
        shown = rng.random(len(names)) < 0.7
        out.append(
            {names[i]: int(counts[i] + rng.integers(-3, 4)) for i in range(len(names)) if shown[i]}
        )
    return out


# --------------------------------------------------------------------------- follow


def test_follower_hands_out_complete_lines_only(tmp_path):
    path = tmp_path / "r.jsonl"
    fol = FileFollower(path)
    assert fol.check() == "missing"
    path.write_bytes(b'{"t": 1}\n{"t": 2, "rel')  # the writer is mid-line
    assert fol.check() == "same"
    assert [ln.data for ln in fol.read_lines()] == [b'{"t": 1}\n']
    assert list(fol.read_lines()) == []  # still incomplete
    with open(path, "ab") as fh:
        fh.write(b'eased": {}}\n')
    lines = list(fol.read_lines())
    assert [ln.data for ln in lines] == [b'{"t": 2, "released": {}}\n']
    assert lines[0].number == 2 and fol.offset == path.stat().st_size


def test_follower_notices_a_rewritten_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"a\nb\n")
    fol = FileFollower(path)
    fol.check()
    assert len(list(fol.read_lines())) == 2
    with open(path, "r+b") as fh:  # same inode, same size, other content (a new run)
        fh.write(b"c\nd\ne\n")
    assert fol.check() == "reset"
    assert [ln.data for ln in fol.read_lines()] == [b"c\n", b"d\n", b"e\n"]
    path.write_bytes(b"x\n")  # truncated
    assert fol.check() == "reset"
    tmp = tmp_path / "new"
    tmp.write_bytes(b"y\n")
    os.replace(tmp, path)  # replaced by another file
    assert fol.check() == "reset"
    assert [ln.data for ln in fol.read_lines()] == [b"y\n"]


def test_follower_skips_an_overlong_line_without_holding_it(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"short\n" + b"x" * 5000 + b"\nok\n")
    fol = FileFollower(path, max_line_bytes=100)
    fol.check()
    assert [ln.data for ln in fol.read_lines()] == [b"short\n", None, b"ok\n"]


# --------------------------------------------------------------------------- model


def test_top_items_equals_a_full_sort_with_ties():
    rng = np.random.default_rng(1)
    for trial in range(200):
        size = int(rng.integers(0, 60))
        names = [f"i{j:03d}" for j in rng.permutation(size)]  # ties not in name order
        values = rng.integers(-3, 4, size=size)
        released = {name: int(v) for name, v in zip(names, values, strict=True)}
        n = int(rng.integers(1, 25))
        assert top_items(released, n) == _brute_top(released, n), trial


def test_parse_release_rejects_what_is_not_a_release():
    assert parse_release(b'{"t": 2, "released": {"a": 1.5}, "meta": {"x": 1}}').t == 2
    for bad in (
        b"[1]",
        b'{"t": 0, "released": {}}',
        b'{"t": true, "released": {}}',
        b'{"t": 1, "released": {"a": "1"}}',
        b'{"t": 1, "released": {"a": NaN}}',
        b'{"t": 1}',
        b'{"t": 1, "released": {}, "meta": 3}',
        b"{",
        b"\xff\n",
        b'{"t": 1, "released": {"a": true}}',
        b'{"t": 1, "released": {"a": null}}',
        b'{"t": 1, "released": {"a": 1.5, "b": Infinity}}',
        b'{"t": 1, "released": {"a": 1.5, "b": 1' + b"0" * 400 + b"}}",
        b'{"t": 1, "released": {"a": 1' + b"0" * 400 + b"}}",
        b"[" * 100000,
    ):
        with pytest.raises(ValueError):
            parse_release(bad)


def test_model_shows_the_last_valid_release(tmp_path):
    path = tmp_path / "r.jsonl"
    rng = np.random.default_rng(2)
    rels = _stream(rng, 30, [f"item-{i}" for i in range(50)] + EVIL)
    path.write_text("".join(_line(t, r, noise_std=2.0) for t, r in enumerate(rels[:20], 1)))
    model = ViewModel(path, top=7)
    assert model.refresh()
    snap = model.snapshot()
    assert snap.t == 20 and snap.top == _brute_top(rels[19], 7)
    assert snap.items_released == len(rels[19]) and snap.noise_std == 2.0
    assert not model.refresh()  # nothing new: no new version
    with open(path, "a") as fh:  # a writer mid-append: half a line
        fh.write(_line(21, rels[20])[:25])
    model.refresh()
    assert model.snapshot().t == 20
    with open(path, "a") as fh:
        fh.write(_line(21, rels[20])[25:])
        fh.write('{"t": 22, "released": {"a": 1}\n')  # complete but malformed
    model.refresh()
    snap = model.snapshot()
    assert snap.t == 21 and snap.top == _brute_top(rels[20], 7)
    assert snap.malformed == 1 and "line 22" in snap.last_problem


def test_model_states_a_missing_file_and_a_csv_file(tmp_path):
    model = ViewModel(tmp_path / "nope.jsonl")
    model.refresh()
    snap = model.snapshot()
    assert snap.status == "missing" and "does not exist" in snap.message
    csv = tmp_path / "r.csv"
    csv.write_text("t,item,value\n1,a,3\n")
    model = ViewModel(csv)
    model.refresh()
    assert model.snapshot().status == "error" and "CSV" in model.snapshot().message


def _brute_history(path: Path, item: str):
    ts, vs, ss = [], [], []
    for text in path.read_text(encoding="utf-8").splitlines():
        obj = json.loads(text)
        if item in obj["released"]:
            ts.append(obj["t"])
            vs.append(float(obj["released"][item]))
            ss.append(obj["meta"]["noise_std"])
    return ts, vs, ss


def test_history_of_an_item_chosen_late_equals_a_full_parse(tmp_path):
    """The history filled in by one filtered pass (and then kept up to date) is the one a
    plain parse of every line gives; names that need JSON escaping included."""
    path = tmp_path / "r.jsonl"
    names = [f"n{i}" for i in range(30)] + EVIL + ["n1\\", 'n"1', "n1é"]
    rels = _stream(np.random.default_rng(3), 120, names)
    with open(path, "w", encoding="utf-8") as fh:
        for t, r in enumerate(rels[:80], 1):
            fh.write(_line(t, r, noise_std=1.0 + t / 10))
    model = ViewModel(path)
    model.refresh()
    chosen = EVIL[:3] + ["n1\\", 'n"1', "n1é", "n1", "never-released"]
    snap = model.snapshot(chosen)
    for item in chosen:
        assert snap.history[item] == _brute_history(path, item), item
    with open(path, "a", encoding="utf-8") as fh:
        for t, r in enumerate(rels[80:], 81):
            fh.write(_line(t, r, noise_std=1.0 + t / 10))
    model.refresh()
    snap = model.snapshot(chosen)
    assert snap.t == 120
    for item in chosen:
        assert snap.history[item] == _brute_history(path, item), item


def test_history_filled_while_the_file_grows_misses_no_release(tmp_path, monkeypatch):
    """The long pass runs without the lock: releases appended (and read by a poll) during
    it are still in the history, once each; a file replaced during it starts over."""
    path = tmp_path / "r.jsonl"
    rels = _stream(np.random.default_rng(7), 60, ["a", "b", "c"])
    path.write_text("".join(_line(t, r, noise_std=1.0) for t, r in enumerate(rels[:30], 1)))
    model = ViewModel(path)
    model.refresh()
    scan = ViewModel._scan
    calls = []

    def scan_while_a_run_writes(self, items, tokens, start, end):
        calls.append((start, end))
        if len(calls) == 1:
            with open(path, "a") as fh:
                fh.write("".join(_line(t, r, noise_std=1.0) for t, r in enumerate(rels[30:45], 31)))
            assert model.refresh()  # a poll in the middle of the pass
        return scan(self, items, tokens, start, end)

    monkeypatch.setattr(ViewModel, "_scan", scan_while_a_run_writes)
    snap = model.snapshot(["a", "b"])
    assert len(calls) == 2 and calls[1][0] == calls[0][1]  # the pass, then the rest
    for item in ("a", "b"):
        assert snap.history[item] == _brute_history(path, item)
    # replaced during the pass: the fill starts over on the new file
    calls.clear()

    def scan_while_replaced(self, items, tokens, start, end):
        calls.append((start, end))
        if len(calls) == 1:
            tmp = tmp_path / "new"
            tmp.write_text("".join(_line(t, r, noise_std=2.0) for t, r in enumerate(rels[:10], 1)))
            os.replace(tmp, path)
            assert model.refresh()
        return scan(self, items, tokens, start, end)

    monkeypatch.setattr(ViewModel, "_scan", scan_while_replaced)
    snap = model.snapshot(["c"])
    assert snap.t == 10 and snap.history["c"] == _brute_history(path, "c")
    monkeypatch.setattr(ViewModel, "_scan", scan)
    assert model.snapshot(["a"]).history["a"] == _brute_history(path, "a")  # re-read after


def test_memory_does_not_grow_with_untracked_releases(tmp_path):
    path = tmp_path / "r.jsonl"
    rels = _stream(np.random.default_rng(4), 400, [f"n{i}" for i in range(200)])
    with open(path, "w") as fh:
        for t, r in enumerate(rels, 1):
            fh.write(_line(t, r, noise_std=1.0))
    model = ViewModel(path, top=5)
    model.refresh()
    assert model.memory_bytes() == 0  # only the top 5 of the last release are kept
    model.select(["n0"])
    n = len(_brute_history(path, "n0")[0])
    assert model.memory_bytes() == 24 * n  # t, value, std: 8 bytes each per release


# --------------------------------------------------------------------------- render


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _evil_file(tmp_path: Path) -> Path:
    path = tmp_path / "evil.jsonl"
    released = {name: 100 - i for i, name in enumerate(EVIL)}
    path.write_text(
        _line(1, {"x": 1}, noise_std=1.0) + _line(2, released, noise_std=1.5), encoding="utf-8"
    )
    return path


@pytest.mark.parametrize("live", [True, False])
def test_page_escapes_every_item_name(tmp_path, live):
    model = ViewModel(_evil_file(tmp_path))
    model.refresh()
    page = render_page(model.snapshot(EVIL[:4]), nonce="abc" if live else None)
    parser = _Collect()
    parser.feed(page)
    tags = [t for t, _ in parser.tags]
    assert tags.count("script") == (1 if live else 0)  # only the page's own script
    assert "img" not in tags
    for tag, attrs in parser.tags:
        assert not any(a.startswith("on") for a in attrs), (tag, attrs)
        if tag == "script":
            assert attrs == {"nonce": "abc"}
    # each name is a data-item attribute and a text node, exactly as written
    rows = [a["data-item"] for t, a in parser.tags if t == "li" and "data-value" in a]
    assert rows == [
        name
        for name, _ in _brute_top(
            json.loads((tmp_path / "evil.jsonl").read_text().splitlines()[1])["released"], 20
        )
    ]
    text = "".join(parser.text)
    for name in EVIL:
        assert name in text


def test_export_is_one_self_contained_file(tmp_path, capsys):
    path = _evil_file(tmp_path)
    write_run_meta(
        path,
        {
            "format": FORMAT,
            "horizon": 2,
            "mechanism": "unknown",
            "algorithm": "UnkBase",
            "privacy": {"epsilon": 1.0, "delta": 1e-6, "rho": 0.02},
            "unit": "event",
        },
    )
    out = tmp_path / "report.html"
    assert main(["view", str(path), "--export", str(out), "--top", "3"]) == 0
    page = out.read_text(encoding="utf-8")
    parser = _Collect()
    parser.feed(page)
    assert not {"script", "img", "link", "iframe", "object"} & {t for t, _ in parser.tags}
    assert not any({"src", "href"} & set(a) for _, a in parser.tags)  # nothing to load
    assert "http://" not in page and "https://" not in page
    assert "complete" in page and "ε = 1, δ = 1e-6" in page
    assert [a["data-item"] for t, a in parser.tags if t == "li" and "data-value" in a] == EVIL[:3]
    assert main(["view", str(tmp_path / "nope.jsonl"), "--export", str(out)]) == 1
    assert "nope.jsonl" in capsys.readouterr().err


# --------------------------------------------------------------------------- server


def _get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def sse_data(sock: socket.socket, buf: bytearray, count: int, timeout: float) -> list[bytes]:
    """Read ``count`` SSE ``data:`` lines, as sent (keep-alives skipped)."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        while b"\n\n" not in buf:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1 << 20)
            assert chunk, "the event stream closed"
            buf.extend(chunk)
        block, _, rest = bytes(buf).partition(b"\n\n")
        buf[:] = rest
        out += [line for line in block.split(b"\n") if line.startswith(b"data: ")]
    return out


def _sse_messages(sock: socket.socket, buf: bytearray, count: int, timeout: float) -> list:
    """Read ``count`` SSE data messages, parsed (keep-alives skipped)."""
    return [json.loads(line[6:]) for line in sse_data(sock, buf, count, timeout)]


def test_server_serves_read_only_and_pushes_updates(tmp_path):
    path = tmp_path / "r.jsonl"
    rels = _stream(np.random.default_rng(5), 10, [f"n{i}" for i in range(40)])
    path.write_text("".join(_line(t, r, noise_std=3.0) for t, r in enumerate(rels[:5], 1)))
    server = ViewServer(ViewModel(path, top=4), poll=0.05).start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        status, headers, body = _get(server.url)
        assert status == 200 and "script-src 'nonce-" in headers["Content-Security-Policy"]
        status, _, body = _get(server.url + "api/state?manual=1&sel=n1")
        state = json.loads(body)
        assert [[e["item"], e["value"]] for e in state["top"]] == [
            list(kv) for kv in _brute_top(rels[4], 4)
        ]
        assert state["history"]["n1"]["t"] == _brute_history(path, "n1")[0]
        assert _get(server.url + "nothing")[0] == 404
        assert _get(server.url + "api/state?manual=1" + "&sel=x" * 9)[0] == 400
        req = urllib.request.Request(server.url, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == 501  # no endpoint accepts a change
        host, port = server._httpd.server_address[:2]
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"GET /events HTTP/1.0\r\n\r\n")
            buf = bytearray()
            first = _sse_messages(sock, buf, 1, 5)[0]
            assert first["t"] == 5 and first["auto"] is True
            with open(path, "a") as fh:
                fh.write(_line(6, rels[5], noise_std=3.0))
            msg = _sse_messages(sock, buf, 1, 30)[0]  # pushed, not polled for
            assert msg["t"] == 6
            assert 'data-item="' + _brute_top(rels[5], 1)[0][0] + '"' in msg["html"]["top"]
    finally:
        server.stop()


# --------------------------------------------------------------------------- run


def _events(path: Path, steps: int) -> None:
    rng = np.random.default_rng(6)
    with open(path, "w") as fh:
        for t in range(1, steps + 1):
            for _ in range(5):
                items = sorted({f"tag{int(i)}" for i in rng.zipf(1.6, size=2) if i < 30})
                fh.write(json.dumps({"t": t, "items": items}) + "\n")


def test_run_writes_the_sidecar_plan_describes(tmp_path, capsys):
    key = tmp_path / "k.key"
    assert main(["keygen", str(key)]) == 0
    _events(tmp_path / "ev.jsonl", 50)
    opts = ["-m", "unknown", "-T", "60", "--max-items", "2", "--epsilon", "1", "--delta", "1e-6"]
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "run",
                "-q",
                *opts,
                "--key-file",
                str(key),
                "-i",
                str(tmp_path / "ev.jsonl"),
                "-o",
                str(out),
                *own_ledger(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["plan", *opts, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    meta = read_run_meta(sidecar_path(out))
    # the plan's advice on other settings (coarser steps, other --max-items, the top-k
    # candidates) is about runs not made: not part of this run's description
    advice = {"coarser_steps", "choice", "candidates", "max_items_break_even", "max_items_hint"}
    assert "coarser_steps" in plan
    assert {k: meta[k] for k in plan if k not in advice} == {
        k: v for k, v in plan.items() if k not in advice
    }
    assert meta["unit"] == "event" and meta["format"] == FORMAT and meta["rounded"] is True
    assert oct(sidecar_path(out).stat().st_mode & 0o777) == oct(out.stat().st_mode & 0o777)
    # a file that is not a sidecar is never overwritten
    other = tmp_path / "o.jsonl"
    sidecar_path(other).write_text("precious")
    assert (
        main(
            [
                "run",
                "-q",
                *opts,
                "--key-file",
                str(key),
                "-i",
                str(tmp_path / "ev.jsonl"),
                "-o",
                str(other),
                *own_ledger(other),
            ]
        )
        == 1
    )
    assert sidecar_path(other).read_text() == "precious"
    assert not other.exists()  # refused before the output was created
    assert "refusing to overwrite" in capsys.readouterr().err


def test_run_view_serves_the_run_then_stops_on_ctrl_c(tmp_path):
    key = tmp_path / "k.key"
    assert main(["keygen", str(key)]) == 0
    _events(tmp_path / "ev.jsonl", 40)
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpstream",
            "run",
            "-q",
            "-m",
            "unknown",
            "-T",
            "40",
            "--max-items",
            "2",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--key-file",
            str(key),
            "-i",
            str(tmp_path / "ev.jsonl"),
            "-o",
            str(out),
            "--view",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            if found and "finished" in line:
                url = found.group(1)
                break
        assert url is not None
        state = json.loads(_get(url + "api/state")[2])
        assert state["t"] == 40 and state["status"] == "complete"
        assert state["meta"]["horizon"] == 40
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_view_needs_a_jsonl_file(tmp_path, capsys):
    key = tmp_path / "k.key"
    assert main(["keygen", str(key)]) == 0
    _events(tmp_path / "ev.jsonl", 5)
    base = [
        "run",
        "-q",
        "-m",
        "unknown",
        "-T",
        "5",
        "--max-items",
        "2",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--key-file",
        str(key),
        "-i",
        str(tmp_path / "ev.jsonl"),
        "--view",
    ]
    assert main(base) == 1
    assert main([*base, "-o", str(tmp_path / "r.csv")]) == 1
    assert "--view needs --output FILE" in capsys.readouterr().err
