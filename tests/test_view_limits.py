"""The view server's limits and Host check, on loopback: stalled and trickling clients are
dropped after the request timeout, event streams and connections are capped (503 beyond),
and a request that names another host (DNS rebinding) gets 403 and no data.

Nothing here depends on the machine's speed: every wait polls for its condition
with a generous deadline; the short timeouts only make the passing runs quick.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest

from dpstream.view.model import ViewModel
from dpstream.view.server import RETRY_AFTER, ViewServer, host_allowed

#: Seconds any one wait may take before the test fails (only a failing run waits this long).
DEADLINE = 30.0
SECRET = "secret-item"


def _server(tmp_path, **kwargs) -> ViewServer:
    path = tmp_path / "r.jsonl"
    path.write_text(
        json.dumps({"t": 1, "released": {SECRET: 7, "other": 3}, "meta": {"noise_std": 1.0}}) + "\n"
    )
    return ViewServer(ViewModel(path), poll=0.05, **kwargs).start()


def _address(server: ViewServer) -> tuple[str, int]:
    host, port = server._httpd.server_address[:2]
    return host, port


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < deadline, f"still not {what} after {DEADLINE} s"
        time.sleep(0.02)


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The threads alive now that were not before (the server's, for the clients since)."""
    return [t for t in threading.enumerate() if t not in before]


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed the connection without answering (no wait)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        data = sock.recv(4096)
    except ConnectionResetError:
        return True
    assert data == b"", f"the server answered a request never sent: {data[:80]!r}"
    return True


def _wait_all_closed(socks: list[socket.socket]) -> None:
    pending = list(socks)

    def done() -> bool:
        pending[:] = [s for s in pending if not _closed_by_server(s)]
        return not pending

    _wait_for(done, "dropped every stalled client")


def _head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The response head of a raw request (status line and headers) and what follows."""
    buf = b""
    deadline = time.monotonic() + DEADLINE
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, f"closed before the end of the head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _rest(sock: socket.socket, first: bytes) -> bytes:
    """Everything until the server closes the connection."""
    out = first
    deadline = time.monotonic() + DEADLINE
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def _open_stream(server: ViewServer) -> tuple[socket.socket, bytes, bytes]:
    host, port = _address(server)
    sock = socket.create_connection((host, port), timeout=DEADLINE)
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head, rest = _head(sock)
    return sock, head, rest


def _first_message(sock: socket.socket, rest: bytes) -> dict:
    buf = rest
    deadline = time.monotonic() + DEADLINE
    while b"\ndata: " not in b"\n" + buf or not buf.endswith(b"\n\n"):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, "the event stream closed"
        buf += chunk
    line = next(ln for ln in buf.split(b"\n") if ln.startswith(b"data: "))
    return json.loads(line[6:])


def _get(server: ViewServer, path: str, **headers: str) -> tuple[int, dict, bytes]:
    host, port = _address(server)
    conn = http.client.HTTPConnection(host, port, timeout=DEADLINE)
    try:
        conn.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _status(server: ViewServer, path: str) -> int | None:
    """The status of a GET, or None if the server closed the connection before answering."""
    try:
        return _get(server, path)[0]
    except (ConnectionError, http.client.HTTPException):
        return None


# --------------------------------------------------------------------------- timeouts


def test_stalled_and_trickling_clients_are_dropped_and_their_threads_end(tmp_path):
    server = _server(tmp_path, request_timeout=0.5)
    before = set(threading.enumerate())
    socks: list[socket.socket] = []
    try:
        for i in range(50):  # nothing, half a request line, a head that never ends
            sock = socket.create_connection(_address(server), timeout=DEADLINE)
            sock.sendall([b"", b"GET /api/st", b"GET /api/state HTTP/1.1\r\nHost: x\r\n"][i % 3])
            socks.append(sock)
        _wait_all_closed(socks)
        _wait_for(
            lambda: not _new_threads(before), "back to the threads before the stalled clients"
        )
        # one byte every 50 ms never times out a single read: the deadline is on the whole
        trickle = socket.create_connection(_address(server), timeout=DEADLINE)
        socks.append(trickle)
        trickle.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")
        deadline = time.monotonic() + DEADLINE
        while not _closed_by_server(trickle):
            assert time.monotonic() < deadline, "a trickling client is still served"
            try:
                trickle.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        _wait_for(lambda: not _new_threads(before), "the trickle's thread gone")
        assert _get(server, "/api/state")[0] == 200  # and the server still serves
    finally:
        for sock in socks:
            sock.close()
        server.stop()


# --------------------------------------------------------------------------- caps


def test_event_streams_beyond_the_cap_get_503_until_one_closes(tmp_path):
    server = _server(tmp_path, max_streams=3)
    before = set(threading.enumerate())
    socks: list[socket.socket] = []
    try:
        for _ in range(3):
            sock, head, rest = _open_stream(server)
            socks.append(sock)
            assert head.startswith(b"HTTP/1.0 200 ")
            assert SECRET in json.dumps(_first_message(sock, rest))
        for _ in range(2):  # the cap's worth are served; more are refused, and told when
            sock, head, rest = _open_stream(server)
            socks.append(sock)
            assert head.startswith(b"HTTP/1.0 503 ")
            assert f"Retry-After: {RETRY_AFTER}".encode() in head.split(b"\r\n")
            assert b"data:" not in _rest(sock, rest)  # and closed, with no stream
        # the page and the API still load while the streams are full
        assert _get(server, "/")[0] == 200 and _get(server, "/api/state")[0] == 200
        for sock in socks[:2]:  # two pages go away: their slots come free without a write
            sock.close()

        def reopened() -> bool:
            sock, head, rest = _open_stream(server)
            socks.append(sock)
            if head.startswith(b"HTTP/1.0 503 "):
                return False
            assert head.startswith(b"HTTP/1.0 200 ")
            assert SECRET in json.dumps(_first_message(sock, rest))
            return True

        _wait_for(reopened, "a stream slot freed")
        _wait_for(reopened, "a second stream slot freed")
        sock, head, _ = _open_stream(server)  # 3 open again: the cap holds
        socks.append(sock)
        assert head.startswith(b"HTTP/1.0 503 ")
        for sock in socks:
            sock.close()
        _wait_for(lambda: not _new_threads(before), "every stream's thread gone")
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_connections_beyond_the_cap_get_503_and_threads_stay_bounded(tmp_path):
    server = _server(tmp_path, request_timeout=DEADLINE * 2, max_streams=1, max_connections=4)
    before = set(threading.enumerate())
    socks: list[socket.socket] = []
    try:
        for _ in range(4):  # four clients that send nothing hold every slot
            socks.append(socket.create_connection(_address(server), timeout=DEADLINE))
        _wait_for(lambda: len(_new_threads(before)) >= 4, "serving the four")
        for _ in range(3):  # more are answered at once, and cost no thread
            extra = socket.create_connection(_address(server), timeout=DEADLINE)
            socks.append(extra)
            answer = _rest(extra, b"")
            assert (
                answer.startswith(b"HTTP/1.0 503 ")
                and f"Retry-After: {RETRY_AFTER}".encode() in answer
            )
            assert len(_new_threads(before)) <= 4
        socks[0].close()  # one leaves: a request is served again
        _wait_for(lambda: _status(server, "/api/state") == 200, "a connection slot freed")
    finally:
        for sock in socks:
            sock.close()
        server.stop()


# --------------------------------------------------------------------------- Host check


def test_a_foreign_host_or_origin_gets_403_and_no_data(tmp_path):
    server = _server(tmp_path, allow_hosts=["box.lan"])
    before = set(threading.enumerate())
    host, port = _address(server)
    try:
        for path in ("/api/state", "/", "/events"):  # a DNS-rebinding page's requests
            for name in (
                "evil.example",
                f"evil.example:{port}",
                f"127.0.0.1.evil.example:{port}",
                f"localhost.evil.example:{port}",
                "box.lan.evil",
            ):
                status, _, body = _get(server, path, Host=name)
                assert status == 403, (path, name)
                assert SECRET.encode() not in body and b"released" not in body
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null"):
            status, _, body = _get(server, "/api/state", Host=f"{host}:{port}", Origin=origin)
            assert status == 403 and SECRET.encode() not in body, origin
        assert _get(server, "/api/state", Host=f"{host}:{port}")[0] == 200
        for name in (
            f"localhost:{port}",
            f"127.0.0.1:{port}",
            "localhost",
            "LOCALHOST:1234",
            f"[::1]:{port}",
            f"box.lan:{port}",
        ):
            status, _, body = _get(server, "/api/state", Host=name)
            assert status == 200, name
            assert [e["item"] for e in json.loads(body)["top"]] == [SECRET, "other"]
        status, _, _ = _get(
            server, "/api/state", Host=f"localhost:{port}", Origin=f"http://localhost:{port}"
        )
        assert status == 200
        # no stream was opened for a refused /events: none is left holding a thread
        _wait_for(lambda: not _new_threads(before), "every request's thread gone")
    finally:
        server.stop()


def test_two_host_headers_are_a_bad_request(tmp_path):
    server = _server(tmp_path)
    try:
        with socket.create_connection(_address(server), timeout=DEADLINE) as sock:
            sock.sendall(
                b"GET /api/state HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n"
            )
            head, rest = _head(sock)
            assert head.startswith(b"HTTP/1.0 400 ")
            assert SECRET.encode() not in _rest(sock, rest)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("value", "bound", "ok"),
    [
        ("localhost", "127.0.0.1", True),
        ("localhost:8000", "127.0.0.1", True),
        ("127.0.0.1:8000", "127.0.0.1", True),
        ("[::1]:8000", "::1", True),
        ("127.0.0.1", "0.0.0.0", True),
        ("192.0.2.7:8000", "0.0.0.0", True),
        ("192.0.2.7:8000", "192.0.2.7", True),
        ("192.0.2.8:8000", "192.0.2.7", False),
        ("192.0.2.7:8000", "127.0.0.1", False),
        ("[2001:db8::1]:80", "::", True),
        ("evil.example", "0.0.0.0", False),
        ("localhost.", "127.0.0.1", False),
        ("localhost:80:80", "127.0.0.1", False),
        ("localhost:", "127.0.0.1", False),
        ("[::1", "127.0.0.1", False),
        ("::1", "127.0.0.1", False),
        ("", "127.0.0.1", False),
        ("localhost:８０", "127.0.0.1", False),
        ("localhost evil.example", "127.0.0.1", False),
    ],
)
def test_host_allowed_accepts_this_machine_only(value, bound, ok):
    assert host_allowed(value, bound) is ok


def test_limits_that_cannot_work_are_refused(tmp_path):
    model = ViewModel(tmp_path / "r.jsonl")
    with pytest.raises(ValueError, match="not a host name"):
        ViewServer(model, allow_hosts=["a:b:c"])
    with pytest.raises(ValueError, match="must exceed max_streams"):
        ViewServer(model, max_streams=4, max_connections=4)
    with pytest.raises(ValueError, match="at least 1"):
        ViewServer(model, max_streams=0)
