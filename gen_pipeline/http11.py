"""The default HTTP transport: keep-alive HTTP/1.1 connections per server on plain asyncio, each
response parsed by httptools (llhttp, the parser uvicorn and Node.js use). It does the one thing the
pipeline needs, one request and one buffered response, for about a third of aiohttp's CPU per request
(0.10 vs 0.36 ms against a canned keep-alive server; in bench/perf.py the whole client goes from 0.67-0.78
to 0.47-0.50 ms a request). aiohttp_transport.py stays available with `--http-client aiohttp`.

Framing, chunked bodies and keep-alive rules are llhttp's; this module owns only the connection pool
(most recently used first, idle sockets dropped after KEEPALIVE_TIMEOUT, before the server's own 5 s),
the request head and the mapping of every failure to our error tree, here and nowhere else.
"""

from __future__ import annotations

import asyncio
import errno
import math
import ssl
import time
import zlib
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from . import __version__
from .errors import ConnectError, ConnectionLostError, RequestError, RequestTimeout

# SGLang and vLLM (uvicorn) close idle keep-alive sockets after 5 s; drop ours first so a request never
# goes out on a socket the server is about to close.
KEEPALIVE_TIMEOUT = 4.0
USER_AGENT = f"gen-pipeline/{__version__}"
Response = tuple[int, bytes, dict[str, str]]  # status, body, headers with lower-case names


def describe(exc: BaseException) -> str:
    """The error's class and text, even for errors whose str() needs fields that are missing."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def connect_failure(code: int | None, detail: str, server: str) -> ConnectError | ConnectionLostError:
    """A socket that could not be opened: the server's fault (ConnectError, which takes it out of rotation
    at once), unless our own file table is full (EMFILE, ENFILE: `ulimit -n`), which no server can mend."""
    if code in (errno.EMFILE, errno.ENFILE):
        return ConnectionLostError(f"cannot open a socket: {detail} (ulimit -n)", server=server)
    return ConnectError(f"cannot connect: {detail}", server=server)


class Deadlines:
    """Request timeouts for many requests in flight, on one shared timer.

    asyncio.timeout arms and cancels a timer per request (a heap entry and a handle each): ~0.02 ms of CPU a
    request with 256 in flight, 6% of a request's CPU against bench/canned.py. Here a request costs a dict
    entry. The timer is set for the earliest deadline known when it was set, and set again when it fires or
    when a new deadline is earlier by more than SLACK, so a request times out at most SLACK s late.
    As asyncio.timeout does: the task is cancelled at its deadline, and `leave` tells that CancelledError
    from any other cancellation (Ctrl-C's grace period ending), which must go on.
    """

    SLACK = 0.25

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: dict[asyncio.Task[object], int] = {}  # task -> its cancelling() count before ours
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def enter(self, timeout: float) -> asyncio.Task[object]:
        """Start the current task's deadline, `timeout` s from now; returns the task, for leave()."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.enter() outside a task")
        loop = task.get_loop()
        deadline = loop.time() + timeout
        self._due[task] = deadline
        if deadline < self._timer_at - self.SLACK:
            self._set_timer(loop, deadline)
        return task

    def leave(self, task: asyncio.Task[object]) -> bool:
        """End the task's deadline; True when it expired and its CancelledError was ours alone."""
        del self._due[task]
        before = self._expired.pop(task, None)
        return before is not None and task.uncancel() <= before

    def _set_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now, soonest = loop.time(), math.inf
        for task, deadline in self._due.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired[task] = task.cancelling()
                    task.cancel()
            elif deadline < soonest:
                soonest = deadline
        if soonest < math.inf:
            self._set_timer(loop, soonest)


class _Connection(asyncio.Protocol):
    """One socket to one server: at most one request in flight, its answer delivered to `waiter`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Response] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.headers_done = False
        self.closed = False
        self.idle_since = 0.0

    # -- the request side
    def send(self, data: bytes) -> asyncio.Future[Response]:
        """Write one request; the future gets its response, or ConnectionLostError."""
        self.waiter = waiter = self.loop.create_future()
        self.headers, self.body, self.headers_done = {}, [], False
        if self.closed or self.transport is None or self.transport.is_closing():
            self._fail("connection closed before the request was sent")
        else:
            self.transport.write(data)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: the stream cannot be trusted any more
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:  # an upgrade we never asked for
            self._fail(f"malformed HTTP response: {describe(exc)}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._body_ends_at_eof():
            self._deliver()
        else:
            self._fail(f"connection lost: {describe(exc)}" if exc else "server closed the connection")

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self.waiter is None or self.waiter.done():
            self.closed = True  # a second answer to one request: the stream cannot be trusted any more

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        if 100 <= self.parser.get_status_code() < 200:  # an interim answer: the real one follows
            self.headers, self.body, self.headers_done = {}, [], False
            return
        if not self.parser.should_keep_alive():
            self.closed = True  # not reused; the transport closes after delivery
        self._deliver()

    # -- delivery
    def _body_ends_at_eof(self) -> bool:
        """An answer with neither Content-Length nor chunked framing ends when the server closes."""
        has_length = "content-length" in self.headers or "transfer-encoding" in self.headers
        return self.headers_done and not has_length and self.waiter is not None and not self.waiter.done()

    def _deliver(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            try:
                body = _decoded(b"".join(self.body), self.headers.get("content-encoding"))
            except zlib.error as exc:
                waiter.set_exception(ConnectionLostError(f"malformed HTTP response: {describe(exc)}"))
            else:
                waiter.set_result((self.parser.get_status_code(), body, self.headers))
        if self.closed and self.transport is not None:
            self.transport.close()

    def _fail(self, message: str) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionLostError(message))


def _decoded(body: bytes, encoding: str | None) -> bytes:
    """The body without its content coding: we ask for none, but a proxy may gzip anyway."""
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompress(body, wbits=47)  # 47: a gzip or a zlib header, told apart by zlib
    return body


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where one server URL points: socket address, TLS, Host header and path prefix."""

    host: str
    port: int
    tls: bool
    host_header: str
    prefix: str

    @classmethod
    def parse(cls, server: str) -> _Origin:
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectError(f"cannot connect: not an http(s) URL: {server!r}", server=server)
        tls = parts.scheme == "https"
        default = 443 if tls else 80
        port = parts.port or default
        name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        host_header = name if port == default else f"{name}:{port}"
        return cls(parts.hostname, port, tls, host_header, parts.path.rstrip("/"))


class Http11Transport:
    """Keep-alive connections per server; `request` sends one request and returns its whole answer."""

    def __init__(self, api_key: str | None = None) -> None:
        self._auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[_Origin, deque[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None
        self._deadlines = Deadlines()

    async def __aenter__(self) -> Http11Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

    async def request(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> Response:
        """One request to `server + path`; RequestTimeout after `timeout` s, connecting included."""
        origin = self._origins.get(server) or self._origins.setdefault(server, _Origin.parse(server))
        conn: _Connection | None = None
        task = self._deadlines.enter(timeout)
        try:
            conn = await self._acquire(origin, server)
            answer = await conn.send(self._head(method, origin, path, body))
        except BaseException as exc:
            timed_out = self._deadlines.leave(task)
            if conn is not None:  # cut off mid-answer (timeout, cancel, error): never reused
                conn.close()
                self._open.discard(conn)
            if timed_out:
                raise RequestTimeout("request timed out", server=server) from exc
            if isinstance(exc, RequestError):
                exc.server = server
            raise
        self._deadlines.leave(task)
        self._release(origin, conn)
        return answer

    def _head(self, method: str, origin: _Origin, path: str, body: bytes | None) -> bytes:
        length = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body is not None else ""
        head = (
            f"{method} {origin.prefix}{path} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
            f"User-Agent: {USER_AGENT}\r\nAccept: application/json\r\nAccept-Encoding: identity\r\n"
            f"{self._auth}{length}\r\n"
        ).encode("latin-1")
        return head + body if body is not None else head

    async def _acquire(self, origin: _Origin, server: str) -> _Connection:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be warm and alive
            if not conn.closed and now - conn.idle_since < KEEPALIVE_TIMEOUT:
                return conn
            conn.close()
            self._open.discard(conn)
        return await self._connect(origin, server)

    async def _connect(self, origin: _Origin, server: str) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if origin.tls else None
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(loop),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            )
        except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS handshake (SSLError)
            raise connect_failure(exc.errno, describe(exc), server) from exc
        self._open.add(conn)
        return conn

    def _release(self, origin: _Origin, conn: _Connection) -> None:
        if conn.closed:
            self._open.discard(conn)
            return
        conn.waiter = None
        conn.idle_since = time.monotonic()
        self._idle.setdefault(origin, deque()).append(conn)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
