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
condition. A message is rendered once per model version and selection and
shared by the streams that show it (:class:`_Messages`): ten pages open cost
one rendering, and one copy of it, per change. A poll that fails is logged
and the thread goes on; the pages then say that what they show is not being
updated, until a poll succeeds.
Bound to 127.0.0.1 and a free port unless told otherwise; an IPv6 address
(``::1``, ``::``) listens on IPv6.

Limits, so that a page left open or a hostile client costs a bounded number
of threads: a client has ``request_timeout`` seconds to send its request (a
stalled or trickling one is dropped); at most ``max_streams`` event streams
are open at once (more get 503 with ``Retry-After``); at most
``max_connections`` connections are served at once (more get 503 and are
closed at once). Against DNS rebinding, a request whose ``Host`` (or
``Origin``) names something other than this machine gets 403 (see
:func:`host_allowed`).
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import math
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .model import DEFAULT_MAX_STREAMS, DEFAULT_POLL, MAX_SELECTED, Snapshot, ViewModel
from .render import content_security_policy, item_refs, render_fragments, render_page

__all__ = [
    "ViewServer",
    "DEFAULT_POLL",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_REQUEST_TIMEOUT",
    "RETRY_AFTER",
    "host_allowed",
]

#: Seconds a client has to send its whole request (line and headers).
DEFAULT_REQUEST_TIMEOUT = 10.0
#: Connections served at once beyond the event streams (pages, /api/state).
_EXTRA_CONNECTIONS = 32
#: Seconds a refused client is asked to wait (``Retry-After``).
RETRY_AFTER = 5
#: Seconds between keep-alive comments on an idle event stream.
_KEEPALIVE = 15.0
#: Seconds between two checks that an idle event stream's client is still there.
_GONE_CHECK = 1.0
#: Event-stream messages kept, of the model's newest version (one per selection shown).
_MESSAGES_KEPT = 16

_log = logging.getLogger("dpstream.view")


class _BadRequestError(ValueError):
    pass


def _selection(query: str) -> list[str] | None:
    """``None`` (follow the top items) or the items a query asks for.

    A name may be as long as any item written: the request line, at most 64 KiB
    (:mod:`http.server` answers 414 beyond), bounds what a request asks; the page
    never sends more (it says which names it cannot ask for).
    """
    params = parse_qs(query, keep_blank_values=True, max_num_fields=4 * MAX_SELECTED + 4)
    if params.get("manual") != ["1"]:
        return None
    items = params.get("sel", [])
    if len(items) > MAX_SELECTED:
        raise _BadRequestError(f"at most {MAX_SELECTED} items may be selected")
    return [i for i in items if i]


def _host_name(value: str) -> str | None:
    """The name part of a ``Host`` value (``name``, ``name:port``, ``[v6]:port``), lower case.

    ``None`` if the value is not of that form.
    """
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    port = rest[1:]
    if rest and not (rest[0] == ":" and port.isascii() and port.isdigit() and len(port) <= 5):
        return None
    return name or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    literal = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        return ipaddress.ip_address(literal)
    except ValueError:
        return None


def host_allowed(value: str, bound: str, names: frozenset[str] = frozenset()) -> bool:
    """Whether a request's ``Host`` value may be answered by a server bound to ``bound``.

    Accepted: ``localhost``, any loopback address (``127.0.0.1``, ``[::1]``), the
    bound address, any IP address if bound to all of them (``0.0.0.0``, ``::``),
    and ``names`` (lower case), each with or without a port; nothing else. A DNS
    rebinding page reaches the server under a name its author controls, so its
    requests carry that name and are refused. The port is not checked: an SSH
    tunnel or a proxy may change it, and the name is what the attack needs.
    """
    name = _host_name(value)
    if name is None:
        return False
    if name == "localhost" or name in names:
        return True
    ip = _ip(name)
    if ip is None:
        return False
    if ip.is_loopback:
        return True
    here = _ip(bound)
    return here is not None and (here.is_unspecified or here == ip)


def _origin_allowed(value: str, bound: str, names: frozenset[str]) -> bool:
    """Whether an ``Origin`` header names a page of this server (``null`` does not)."""
    url = urlsplit(value.strip())
    return (
        url.scheme in ("http", "https") and not url.path and host_allowed(url.netloc, bound, names)
    )


class _RequestReader(io.RawIOBase):
    """Reads a socket until a deadline: the client has that long for its whole request.

    A per-read timeout alone keeps a thread for a client that sends one byte at
    a time; this bounds the total.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not received in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


def _client_gone(sock: socket.socket) -> bool:
    """Whether the peer of an idle event stream has closed its end (checked without blocking).

    A client that only half-closes (shuts down its sending side) counts as gone:
    a browser's event stream never does.
    """
    timeout = sock.gettimeout()
    try:
        sock.settimeout(0)
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        try:
            sock.settimeout(timeout)
        except OSError:
            pass


_BUSY_TEXT = b"too many connections, retry later\n"
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: %d\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s"
) % (RETRY_AFTER, len(_BUSY_TEXT), _BUSY_TEXT)


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``max_connections`` connections at once.

    One more is answered 503 from the accepting thread (without blocking: the
    answer fits in the socket's buffer, or is dropped) and closed.
    """

    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        ip = _ip(address[0])
        if ip is not None and ip.version == 6:  # ::1, :: (an IPv4 socket cannot bind them)
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a reset, a closed pipe) is no error of the server's:
        nothing is printed (the standard library prints a traceback on stderr, which
        any local process could flood); anything else as the standard library does."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        threading.current_thread().name = "dpstream-view-conn"
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """A snapshot as JSON-ready data (the ``/api/state`` answer)."""
    out = asdict(snap)
    out["top"] = [
        {
            "item": item,
            "value": value,
            "half_width": None if snap.noise_std is None else snap.z * snap.noise_std,
        }
        for item, value in snap.top
    ]
    out["history"] = {
        item: {"t": ts, "value": vs, "noise_std": [None if math.isnan(s) else s for s in ss]}
        for item, (ts, vs, ss) in snap.history.items()
    }
    return out


class _Messages:
    """The event streams' messages, rendered once per model version and selection.

    A stream asks for the message of the model's current version and its
    selection; the first to ask renders it (the others asking for the same wait
    for it) and every stream writes the same bytes. Only messages of the newest
    version asked for are kept, at most :data:`_MESSAGES_KEPT`.
    """

    def __init__(self, model: ViewModel, kept: int = _MESSAGES_KEPT) -> None:
        self._model = model
        self._kept = kept
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple[int, tuple[str, ...] | None], _Message] = OrderedDict()
        self._busy: dict[tuple[int, tuple[str, ...] | None], threading.Lock] = {}

    def get(self, selected: Sequence[str] | None) -> _Message:
        """The message for ``selected`` (None: the top items) at the model's version now."""
        chosen = None if selected is None else tuple(selected)
        key = (self._model.version, chosen)
        with self._lock:
            done = self._done.get(key)
            if done is not None:
                return done
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:  # one rendering per key: the others wait for it
            with self._lock:
                done = self._done.get(key)
                if done is not None:
                    return done
            try:
                done = _render_message(self._model.snapshot(selected))
            finally:
                with self._lock:
                    if self._busy.get(key) is busy:
                        del self._busy[key]
            with self._lock:
                for old in [k for k in self._done if k[0] < key[0]]:
                    del self._done[old]  # superseded: no stream asks for it again
                # (the snapshot may be newer than asked: a history filled meanwhile)
                for k in {key, (done.version, chosen)}:
                    self._done[k] = done
                    self._done.move_to_end(k)
                while len(self._done) > self._kept:
                    self._done.popitem(last=False)
        return done


class _Message:
    """One event-stream message (its ``data:`` line, encoded) and what the stream keeps."""

    __slots__ = ("version", "selected", "data")

    def __init__(self, version: int, selected: list[str], data: bytes) -> None:
        self.version = version
        self.selected = selected
        self.data = data


def _render_message(snap: Snapshot) -> _Message:
    """A snapshot as an event-stream message: the page's three fragments and the names
    they refer to (``selected`` then ``others``: each name once)."""
    msg = {
        "version": snap.version,
        "t": snap.t,
        "status": snap.status,
        "selected": snap.selected,
        "others": item_refs(snap)[len(snap.selected) :],
        "auto": snap.auto,
        "html": render_fragments(snap),
    }
    data = json.dumps(msg, ensure_ascii=True, allow_nan=False)
    return _Message(snap.version, list(snap.selected), f"data: {data}\n\n".encode())


class ViewServer:
    """Serves the view of one :class:`ViewModel` until :meth:`stop`.

    Example (a file with no releases yet)::

        server = ViewServer(ViewModel("releases.jsonl")).start()
        print(server.url)  # e.g. http://127.0.0.1:40815/
        server.stop()
    """

    def __init__(
        self,
        model: ViewModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        poll: float = DEFAULT_POLL,
        selected: list[str] | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_connections: int | None = None,
        allow_hosts: list[str] | tuple[str, ...] = (),
    ) -> None:
        """``request_timeout``: seconds a client has to send its request; ``max_streams``:
        event streams open at once; ``max_connections``: connections served at once
        (default ``max_streams + 32``, so that pages load while the streams are full);
        ``allow_hosts``: names besides this machine's that ``Host`` may carry.
        """
        if not poll > 0:
            raise ValueError(f"--poll must be a positive number of seconds, got {poll!r}")
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive, got {request_timeout!r}")
        if max_streams < 1:
            raise ValueError(f"--max-streams must be at least 1, got {max_streams!r}")
        if max_connections is None:
            max_connections = max_streams + _EXTRA_CONNECTIONS
        if max_connections <= max_streams:
            raise ValueError(
                f"max_connections ({max_connections}) must exceed max_streams "
                f"({max_streams}): pages must load while the streams are full"
            )
        self.model = model
        self.poll = float(poll)
        #: the items a page without a choice of its own shows (None: the top items)
        self.selected = None if selected is None else list(selected)[:MAX_SELECTED]
        self.request_timeout = float(request_timeout)
        self.max_streams = int(max_streams)
        self.max_connections = int(max_connections)
        names = set()
        for given in allow_hosts:
            name = _host_name(given)
            if name is None:
                raise ValueError(f"--allow-host: not a host name: {given!r}")
            names.add(name)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # --host [::1], as in a URL
        if _ip(host.lower()) is None:
            names.add(host.lower())  # the name it was told to listen on
        self.allowed_names = frozenset(names)
        self._streams = threading.BoundedSemaphore(self.max_streams)
        self.messages = _Messages(model)
        self._stop = threading.Event()
        self._httpd = _BoundedHTTPServer((host, port), _handler(self), self.max_connections)
        self._threads: list[threading.Thread] = []
        self._logged: str | None = None  # the failure last logged (each is logged once)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        name = str(host)
        shown = f"[{name}]" if ":" in name else name
        if shown == "0.0.0.0":
            shown = "127.0.0.1"
        elif shown == "[::]":
            shown = "[::1]"
        return f"http://{shown}:{port}/"

    def start(self) -> ViewServer:
        """Read the file once, then serve and poll in background threads; returns self."""
        self.refresh()
        for target, name in (
            (self._httpd.serve_forever, "dpstream-view-http"),
            (self._watch, "dpstream-view-poll"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            self.refresh()

    def refresh(self) -> None:
        """Read what was appended to the file now; never raises.

        A failure (a bug: malformed lines are skipped, an unreadable file is a
        status) is logged once, with its traceback, and the model marks what the
        pages show as not being updated until a refresh succeeds; the server goes on.
        """
        try:
            self.model.refresh()
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if text != self._logged:
                self._logged = text
                _log.error(
                    "dpstream view: cannot read %s (%s); the page says it is not being "
                    "updated, and the view tries again at every poll",
                    self.model.path,
                    text[:200],
                    exc_info=True,
                )
        else:
            self._logged = None

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

    def allows(self, host: str | None, origin: str | None) -> bool:
        """Whether a request with these ``Host`` and ``Origin`` headers may be answered.

        No ``Host`` (an HTTP/1.0 client; browsers always send one) is allowed;
        an ``Origin``, when present, must name this server too.
        """
        bound = str(self._httpd.server_address[0])
        if host is not None and not host_allowed(host, bound, self.allowed_names):
            return False
        return origin is None or _origin_allowed(origin, bound, self.allowed_names)


def _handler(server: ViewServer) -> type[BaseHTTPRequestHandler]:
    model = server.model

    class Handler(BaseHTTPRequestHandler):
        server_version = "dpstream-view"
        sys_version = ""

        timeout = server.request_timeout  # also bounds each write to a client

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: a page polls; errors reach the page, not the terminal

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # read the request through a reader with a deadline instead
            deadline = time.monotonic() + server.request_timeout
            self.rfile = io.BufferedReader(_RequestReader(self.connection, deadline))

        def _headers(
            self, status: int, ctype: str, length: int | None, nonce: str | None = None
        ) -> None:
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

        def _refuse(self, status: int, text: str, retry_after: int | None = None) -> None:
            body = f"{text}\n".encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if retry_after is not None:
                self.send_header("Retry-After", str(retry_after))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            self.connection.settimeout(server.request_timeout)  # the request is read
            hosts = self.headers.get_all("Host") or []
            origins = self.headers.get_all("Origin") or []
            if len(hosts) > 1 or len(origins) > 1:
                self._refuse(400, "more than one Host or Origin header")
                return
            if not server.allows(hosts[0] if hosts else None, origins[0] if origins else None):
                self._refuse(
                    403,
                    "forbidden: this server answers only to this machine's "
                    "names (dpstream view --allow-host NAME adds one)",
                )
                return
            url = urlsplit(self.path)
            try:
                selected = _selection(url.query)
                if selected is None:
                    selected = server.selected
            except (_BadRequestError, ValueError) as exc:
                self._send(400, "text/plain; charset=utf-8", f"{exc}\n".encode())
                return
            if url.path in ("/", "/index.html", "/api/state"):
                try:
                    snap = model.snapshot(selected)
                    if url.path == "/api/state":
                        ctype, nonce = "application/json", None
                        body = json.dumps(snapshot_json(snap), allow_nan=False).encode()
                    else:
                        ctype, nonce = "text/html; charset=utf-8", secrets.token_urlsafe(16)
                        body = render_page(snap, nonce=nonce).encode("utf-8", "replace")
                except Exception:  # a bug: answer it, rather than drop the connection
                    _log.error("dpstream view: cannot answer %s", url.path, exc_info=True)
                    self._refuse(500, "the view cannot show this now (see its log); retry later")
                    return
                self._send(200, ctype, body, nonce)
            elif url.path == "/events":
                self._events(selected)
            elif url.path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, "image/x-icon", b"")
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _events(self, selected: list[str] | None) -> None:
            if self.command == "HEAD":
                self._headers(200, "text/event-stream; charset=utf-8", None)
                return
            if not server._streams.acquire(blocking=False):
                self._refuse(
                    503, f"too many open event streams (at most {server.max_streams})", RETRY_AFTER
                )
                return
            try:
                self._headers(200, "text/event-stream; charset=utf-8", None)
                self._stream(selected)
            finally:
                server._streams.release()

        def _stream(self, selected: list[str] | None) -> None:
            last = -1
            try:
                self.wfile.write(b"retry: 1000\n\n")
                written = time.monotonic()
                while not server.stopping:

                    def moved(seen: int = last) -> bool:
                        return model.version != seen or server.stopping

                    with model.changed:
                        model.changed.wait_for(moved, _GONE_CHECK)
                        fresh = model.version != last
                    if server.stopping:
                        break
                    if not fresh:
                        if _client_gone(self.connection):
                            return  # frees the stream's slot now, not at the next write
                        if time.monotonic() - written >= _KEEPALIVE:
                            self.wfile.write(b": keep-alive\n\n")
                            self.wfile.flush()
                            written = time.monotonic()
                        continue
                    msg = server.messages.get(selected)  # shared by the streams
                    last = msg.version
                    if selected is None and msg.selected:
                        # the page keeps the items it opened with: following whichever
                        # items are on top would re-read the file at every change of rank
                        selected = msg.selected
                    self.wfile.write(msg.data)
                    self.wfile.flush()
                    written = time.monotonic()
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                return

    return Handler
