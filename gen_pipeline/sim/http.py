"""The simulator's HTTP/1.1 server: asyncio and httptools, behaving as uvicorn does in front of SGLang.

aiohttp's web server took about 40% of the simulator's CPU (routing, request and response objects, the stream
writer), and on a 2-core machine that CPU is taken from the client being measured. This one parses with
httptools (llhttp, as uvicorn does) and writes each reply in one call. What it keeps from uvicorn:

- keep-alive, idle connections closed after `keepalive_timeout` seconds (uvicorn's timeout_keep_alive);
- one request at a time per connection, pipelined requests answered in order;
- a handler is cancelled when its connection is lost (SGLang aborts the request of a client that went away);
- `Connection: close` and HTTP/1.0 without keep-alive are honoured; `Expect: 100-continue` is answered;
- a request it cannot parse gets 400 "Invalid HTTP request received." and the connection is closed;
- a handler's unexpected exception is printed and answered with 500 "Internal Server Error".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

import httptools

TEXT = "text/plain; charset=utf-8"


@dataclass
class Request:
    """One parsed request: method, percent-decoded path (no query), lower-case header names, the body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: Connection
    keep_alive: bool = True

    @property
    def content_type(self) -> str:
        """The media type without its parameters, in lower case; '' when none was sent."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()


@dataclass
class Reply:
    """A complete response; `content_type` None sends no Content-Type (as Starlette's bare Response)."""

    status: int = 200
    body: bytes = b""
    content_type: str | None = "application/json"


Handler = Callable[[Request], Awaitable[Reply]]


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class HttpServer:
    """Serves `handler` on one address; close() stops listening and resets every open connection."""

    def __init__(self, handler: Handler, keepalive_timeout: float) -> None:
        self.handler = handler
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._date_second = -1
        self._date = b""

    async def listen(self, host: str, port: int) -> None:
        """Start listening (OSError when the address is taken)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port)

    def date(self) -> bytes:
        """The Date header's value, formatted once a second."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second, self._date = now, email.utils.formatdate(now, usegmt=True).encode()
        return self._date

    async def close(self) -> None:
        """Stop listening, then reset every connection as a killed process would (their handlers are cancelled)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)  # connection_lost runs: the handlers in flight are cancelled
        if server is not None:
            with contextlib.suppress(TimeoutError):  # 3.12+ waits for the connections, which are gone by now
                await asyncio.wait_for(server.wait_closed(), 1.0)


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler for one at a time, writes the replies."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.idle: asyncio.TimerHandle | None = None
        self.lost = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
        self.pending.clear()
        if self.idle is not None:
            self.idle.cancel()
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:  # malformed, or an Upgrade this server does not speak
            self._refuse()

    def abort(self) -> None:
        """Reset the connection (no reply); its handler is cancelled."""
        if self.transport is not None:
            self.transport.abort()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        try:
            path = unquote(httptools.parse_url(self._url).path.decode("latin-1"))
        except httptools.HttpParserInvalidURLError:
            self._refuse()
            return
        method = self.parser.get_method().decode("latin-1")
        body = b"".join(self._body)
        self.pending.append(Request(method, path, self._headers, body, self, self.parser.should_keep_alive()))
        if self.task is None:
            self._start_next()

    # serving

    def _start_next(self) -> None:
        request = self.pending.popleft()
        self.task = asyncio.get_running_loop().create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            reply = await self.server.handler(request)
        except Exception:
            traceback.print_exc()
            reply = Reply(500, b"Internal Server Error", TEXT)
        self.task = None
        if self.lost or self.transport is None or self.transport.is_closing():
            return  # reset by the handler (a drop) or by the client meanwhile
        self._send(reply, request.keep_alive)
        if not request.keep_alive:
            return
        if self.pending:
            self._start_next()
        else:
            self.idle = asyncio.get_running_loop().call_later(self.server.keepalive_timeout, self._idle_timeout)

    def _send(self, reply: Reply, keep_alive: bool) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\ncontent-length: %d\r\n" % (
            reply.status,
            _reason(reply.status),
            self.server.date(),
            len(reply.body),
        )
        if reply.content_type is not None:
            head += b"content-type: %s\r\n" % reply.content_type.encode("latin-1")
        if not keep_alive:
            head += b"connection: close\r\n"
        self.transport.write(head + b"\r\n" + reply.body)
        if not keep_alive:
            self.transport.close()

    def _idle_timeout(self) -> None:
        self.idle = None
        if self.transport is not None and self.task is None and not self.pending:
            self.transport.close()

    def _refuse(self) -> None:
        """400 for a request that cannot be parsed, then close (just reset if a reply is still owed)."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.task is not None or self.pending:
            self.abort()
            return
        self._send(Reply(400, b"Invalid HTTP request received.", TEXT), keep_alive=False)
