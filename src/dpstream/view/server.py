"""The live view's HTTP server: the standard library's, with server-sent events.

Read-only by construction: only GET (and HEAD) routes exist, none changes a
file or the model beyond which histories it keeps in memory.

* ``/`` the page (``?manual=1&sel=ITEM...`` chooses the items whose history
  it shows; without, the top items when it opens, which then stay);
* ``/events`` the same query: a server-sent-event stream, one message (the
  page's three fragments as JSON) each time the file changes, and at once on
  connecting;
* ``/api/state`` the same query: the snapshot as JSON (numbers, not HTML).

A background thread polls the file every ``poll`` seconds
(:meth:`ViewModel.refresh`); each event stream waits on the model's
condition. Bound to 127.0.0.1 and a free port unless told otherwise.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .model import MAX_SELECTED, Snapshot, ViewModel
from .render import content_security_policy, render_fragments, render_page

__all__ = ["ViewServer", "DEFAULT_POLL"]

#: Seconds between two looks at the releases file.
DEFAULT_POLL = 0.25
#: Seconds between keep-alive comments on an idle event stream.
_KEEPALIVE = 15.0
#: The longest item name a query may ask for (characters).
_MAX_NAME = 1000


class _BadRequestError(ValueError):
    pass


def _selection(query: str) -> list[str] | None:
    """``None`` (follow the top items) or the items a query asks for."""
    params = parse_qs(query, keep_blank_values=True, max_num_fields=4 * MAX_SELECTED + 4)
    if params.get("manual") != ["1"]:
        return None
    items = params.get("sel", [])
    if len(items) > MAX_SELECTED:
        raise _BadRequestError(f"at most {MAX_SELECTED} items may be selected")
    if any(len(i) > _MAX_NAME for i in items):
        raise _BadRequestError(f"an item name is longer than {_MAX_NAME} characters")
    return [i for i in items if i]


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """A snapshot as JSON-ready data (the ``/api/state`` answer)."""
    out = asdict(snap)
    out["top"] = [{"item": item, "value": value,
                   "half_width": None if snap.noise_std is None else snap.z * snap.noise_std}
                  for item, value in snap.top]
    out["history"] = {item: {"t": ts, "value": vs,
                             "noise_std": [None if math.isnan(s) else s for s in ss]}
                      for item, (ts, vs, ss) in snap.history.items()}
    return out


class ViewServer:
    """Serves the view of one :class:`ViewModel` until :meth:`stop`.

    Example (a file with no releases yet)::

        server = ViewServer(ViewModel("releases.jsonl")).start()
        print(server.url)  # e.g. http://127.0.0.1:40815/
        server.stop()
    """

    def __init__(self, model: ViewModel, *, host: str = "127.0.0.1", port: int = 0,
                 poll: float = DEFAULT_POLL, selected: list[str] | None = None) -> None:
        if not poll > 0:
            raise ValueError(f"--poll must be a positive number of seconds, got {poll!r}")
        self.model = model
        self.poll = float(poll)
        #: the items a page without a choice of its own shows (None: the top items)
        self.selected = None if selected is None else list(selected)[:MAX_SELECTED]
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        if shown in ("0.0.0.0", "[::]"):
            shown = "127.0.0.1"
        return f"http://{shown}:{port}/"

    def start(self) -> ViewServer:
        """Read the file once, then serve and poll in background threads; returns self."""
        self.model.refresh()
        for target, name in ((self._httpd.serve_forever, "dpstream-view-http"),
                             (self._watch, "dpstream-view-poll")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            self.model.refresh()

    def wait(self) -> None:
        """Block until :meth:`stop` (from another thread) or Ctrl-C (KeyboardInterrupt)."""
        while not self._stop.wait(0.5):
            pass

    def stop(self) -> None:
        """Stop polling, end the event streams and close the socket."""
        self._stop.set()
        with self.model.changed:
            self.model.changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    def stop_on_error(self, exc_type: object, exc: object, tb: object) -> bool:
        """An exit callback (``ExitStack.push``): stop if the block failed; never swallows."""
        if exc_type is not None:
            self.stop()
        return False

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


def _handler(server: ViewServer) -> type[BaseHTTPRequestHandler]:
    model = server.model

    class Handler(BaseHTTPRequestHandler):
        server_version = "dpstream-view"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: a page polls; errors reach the page, not the terminal

        def _headers(self, status: int, ctype: str, length: int | None,
                     nonce: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Content-Security-Policy", content_security_policy(nonce))
            self.end_headers()

        def _send(self, status: int, ctype: str, body: bytes, nonce: str | None = None) -> None:
            self._headers(status, ctype, len(body), nonce)
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            try:
                selected = _selection(url.query)
                if selected is None:
                    selected = server.selected
            except (_BadRequestError, ValueError) as exc:
                self._send(400, "text/plain; charset=utf-8", f"{exc}\n".encode())
                return
            if url.path in ("/", "/index.html"):
                nonce = secrets.token_urlsafe(16)
                page = render_page(model.snapshot(selected), nonce=nonce)
                self._send(200, "text/html; charset=utf-8",
                           page.encode("utf-8", "replace"), nonce)
            elif url.path == "/api/state":
                body = json.dumps(snapshot_json(model.snapshot(selected)),
                                  allow_nan=False).encode()
                self._send(200, "application/json", body)
            elif url.path == "/events":
                self._events(selected)
            elif url.path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, "image/x-icon", b"")
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _events(self, selected: list[str] | None) -> None:
            self._headers(200, "text/event-stream; charset=utf-8", None)
            if self.command == "HEAD":
                return
            last = -1
            try:
                self.wfile.write(b"retry: 1000\n\n")
                while not server.stopping:
                    with model.changed:
                        model.changed.wait_for(
                            lambda seen=last: model.version != seen or server.stopping,
                            _KEEPALIVE)
                        fresh = model.version != last
                    if server.stopping:
                        break
                    if not fresh:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                        continue
                    snap = model.snapshot(selected)
                    last = snap.version
                    if selected is None and snap.selected:
                        # the page keeps the items it opened with: following whichever
                        # items are on top would re-read the file at every change of rank
                        selected = snap.selected
                    msg = {"version": snap.version, "t": snap.t, "status": snap.status,
                           "selected": snap.selected, "auto": snap.auto,
                           "html": render_fragments(snap)}
                    data = json.dumps(msg, ensure_ascii=True, allow_nan=False)
                    self.wfile.write(f"data: {data}\n\n".encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                return

    return Handler

