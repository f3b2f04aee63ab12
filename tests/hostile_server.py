"""A local http server (127.0.0.1) whose routes misbehave as a stranger's server may: a body that never ends, a
Content-Length it does not keep, a connection cut mid-body. Each route stops by itself after `CAP` bytes, or
when the client goes, so a test whose bound failed still ends."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator

CAP = 64 << 20  # the most a route sends: far past every bound a test sets, and a few seconds on 127.0.0.1
CHUNK = 64 << 10
Route = Callable[[http.server.BaseHTTPRequestHandler], None]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked transfer encoding: a body with no end announced
    timeout = 20  # a write to a client that stopped reading ends by itself
    routes: dict[str, Route]
    sent: dict[str, int]

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        route = self.routes.get(self.path)
        self.close_connection = True
        if route is None:
            self.send_error(404)
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            route(self)  # the client may stop reading: what a bound does

    def count(self, size: int) -> None:
        self.sent[self.path] = self.sent.get(self.path, 0) + size


def _pieces(prefix: bytes) -> Iterator[bytes]:
    yield from (prefix[start : start + CHUNK] for start in range(0, len(prefix), CHUNK))
    for _ in range((CAP - len(prefix)) // CHUNK):
        yield bytes(CHUNK)


def endless(prefix: bytes = b"", length: int | None = None) -> Route:
    """`prefix`, then zeros that never end (up to CAP), chunked; `length`: a Content-Length it ignores."""

    def route(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        if length is not None:
            handler.send_header("Content-Length", str(length))
        handler.end_headers()
        for piece in _pieces(prefix):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            handler.count(len(piece))

    return route


def chunked(body: bytes) -> Route:
    """`body`, chunked (no Content-Length), then the chunk that ends it."""

    def route(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for piece in (body[start : start + CHUNK] for start in range(0, len(body), CHUNK)):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            handler.count(len(piece))
        handler.wfile.write(b"0\r\n\r\n")

    return route


def declares(length: int) -> Route:
    """Declares `length` bytes, then sends zeros (up to CAP) for as long as the client reads."""

    def route(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        for piece in _pieces(b""):
            handler.wfile.write(piece)
            handler.count(len(piece))

    return route


def whole(body: bytes, length: int | None = None) -> Route:
    """`body`, under a Content-Length of `length` (its own length if None)."""

    def route(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body) if length is None else length))
        handler.end_headers()
        handler.wfile.write(body)
        handler.count(len(body))

    return route


def cut(body: bytes) -> Route:
    """The first request gets half of `body` under its whole Content-Length, then the connection closes; later
    ones (a reconnect) get 404: an interrupted download."""
    calls = []

    def route(handler: Handler) -> None:
        calls.append(1)
        if len(calls) > 1:
            handler.send_error(404)
            return
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.count(len(body) // 2)

    return route


class Server:
    """`with Server() as server:` routes at `server.routes[path]`, bytes sent per path at `server.sent`."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.sent: dict[str, int] = {}
        handler = type("Routes", (Handler,), {"routes": self.routes, "sent": self.sent})
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self) -> Server:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
