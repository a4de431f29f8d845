"""The one HTTP transport: an aiohttp session whose TCPConnector keeps sockets alive per server, and the one
place where foreign exceptions (aiohttp's, the socket's, the URL parser's, timeouts) become ours.

A request is sent once: redirects are not followed (a 3xx is an answer, and the client says what it means),
the body is read up to a cap and no further, and the whole exchange, connecting included, has a deadline
(deadlines.py: one shared timer, not an asyncio.timeout per request). A streamed answer (`stream`) is handed
on piece by piece as it arrives. A connection whose answer was not read to its end (a deadline, a
cancellation, a stream stopped by its reader) is closed, never handed back to the keep-alive pool, so a server
sees the client leave (SGLang then stops decoding). A request whose pooled connection the server had closed
cleanly without answering it (llama.cpp closes a connection when a third request comes after two streamed
answers) is sent again on another one, and so is one that could not be written to it: the server never
served it. `fire` sends a request in the background
(an abort), and `close` waits for those a moment before it closes the session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import errno
import logging
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import aiohttp

from .._version import __version__
from ..config import MAX_RESPONSE_BYTES
from ..errors import (
    ConnectError,
    ConnectionLostError,
    EndpointError,
    RequestError,
    RequestTimeout,
    ResponseTooLargeError,
)
from .deadlines import Deadlines

# SGLang and vLLM (uvicorn) close idle keep-alive sockets after 5 s; drop ours first so a request never
# goes out on a socket the server is about to close.
KEEPALIVE_TIMEOUT = 4.0
USER_AGENT = f"gen-pipeline/{__version__}"
Response = tuple[int, bytes, Mapping[str, str]]  # status, body, headers (names case-insensitive)
Sink = Callable[[bytes], None]  # takes a streamed answer's bytes as they arrive; its error stops the stream
JSON_HEADERS = {"Content-Type": "application/json"}
EVENT_STREAM = "text/event-stream"
BACKGROUND_GRACE = 2.0  # how long close() waits for requests still in the background (aborts)
STALE_RESENDS = 8  # pooled connections found closed, one after another, before the request's failure is raised

log = logging.getLogger("gen_pipeline")


# Whether the connection the running request got had served an earlier request (set by PoolConnector.connect in
# the request's own task: a context variable, so concurrent requests each see their own).
_REUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("gen_pipeline_reused", default=False)


class PoolConnector(aiohttp.TCPConnector):
    """aiohttp's connector, noting for each request whether its connection comes back from the keep-alive pool."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._served: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        _REUSED.set(conn.protocol in self._served)
        self._served.add(conn.protocol)
        return conn


def unserved(exc: BaseException) -> bool:
    """Whether a request's failure shows the server never took it: the connection was closed cleanly before
    any answer (a reset, ECONNRESET, may come after the server read it), or the request could not be written
    (aiohttp's write error: errno None for a closing transport, or EPIPE)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    if not isinstance(exc, aiohttp.ClientOSError) or isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return exc.errno in (None, errno.EPIPE)


class _SinkFailed(Exception):
    """The sink's own error, carried past map_errors (which must not take it for the connection's)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


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


@contextlib.contextmanager
def map_errors(server: str, url: str = "") -> Iterator[None]:
    """Translate every foreign exception a request can raise into ours, most specific first."""
    try:
        yield
    except RequestError:
        raise
    except aiohttp.ClientConnectorError as exc:  # refused, DNS, unreachable, TLS handshake, full file table
        raise connect_failure(exc.errno, describe(exc), server) from exc  # errno: its os_error's
    except TimeoutError as exc:  # asyncio's, and aiohttp.ServerTimeoutError (a TimeoutError too)
        raise RequestTimeout("request timed out", server=server) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise ConnectionLostError(f"connection lost: {describe(exc)}", server=server) from exc
    except aiohttp.ClientResponseError as exc:  # the answer's head could not be parsed
        raise ConnectionLostError(f"malformed HTTP response: {describe(exc)}", server=server) from exc
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError, ValueError) as exc:
        # ValueError: UnicodeError from IDNA (a host label over 63 characters), a port out of range
        raise EndpointError(f"cannot send to {url or server}: {describe(exc)}", server=server, url=url) from exc
    except (aiohttp.ClientError, OSError) as exc:  # reset, broken pipe, and the rest of aiohttp's tree
        raise ConnectionLostError(f"connection failed: {describe(exc)}", server=server) from exc


async def read_capped(content: aiohttp.StreamReader, cap: int) -> bytes | None:
    """The whole body, or None as soon as it is over `cap` bytes (never more than one chunk past it)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.readany():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class AiohttpTransport:
    """Keep-alive connections per server over one aiohttp session; `request` returns one whole answer."""

    def __init__(
        self,
        api_key: str | None = None,
        max_body: int = MAX_RESPONSE_BYTES,
        auth: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        # Basic auth by server (from user:password@ in --servers, kept out of the server's name), as a header:
        # aiohttp 3.14 deprecates its BasicAuth helper and `auth=` parameter
        self.auth = {url: basic_auth(*cred) for url, cred in (auth or {}).items()}
        connector = PoolConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT)
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = aiohttp.ClientTimeout(total=None)  # each request has its own deadline
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)
        self.max_body = max_body
        self._deadlines = Deadlines()
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AiohttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=BACKGROUND_GRACE)
        await self.session.close()

    async def request(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> Response:
        """One request to `server + path`; RequestTimeout after `timeout` s, connecting included."""
        return await self._exchange(method, server, path, timeout, body, None)

    async def stream(self, server: str, path: str, timeout: float, body: bytes, sink: Sink) -> Response:
        """POST `body`; a 200 event stream goes to `sink` as it arrives (the body returned is then empty), any
        other answer is read whole. The deadline covers the whole stream; the sink's error stops it."""
        try:
            return await self._exchange("POST", server, path, timeout, body, sink)
        except _SinkFailed as exc:
            raise exc.error from None

    def fire(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> None:
        """Send a request in the background, its answer ignored (a failure is logged at debug level)."""
        task = asyncio.get_running_loop().create_task(self._quietly(method, server, path, timeout, body))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quietly(self, method: str, server: str, path: str, timeout: float, body: bytes | None) -> None:
        try:
            status, _, _ = await self.request(method, server, path, timeout, body)
        except RequestError as exc:
            log.debug("%s %s%s failed: %s", method, server, path, exc)
            return
        if status != 200:
            log.debug("%s %s%s answered %d", method, server, path, status)

    async def _exchange(
        self, method: str, server: str, path: str, timeout: float, body: bytes | None, sink: Sink | None
    ) -> Response:
        task = self._deadlines.enter(timeout)
        try:
            with map_errors(server, server + path):
                answer = await self._send(method, server, server + path, body, sink)
        except BaseException as exc:  # a cancellation at our deadline is a timeout; any other goes on
            if self._deadlines.leave(task):
                raise RequestTimeout("request timed out", server=server) from exc
            raise
        self._deadlines.leave(task)
        return answer

    async def _send(self, method: str, server: str, url: str, body: bytes | None, sink: Sink | None) -> Response:
        """Send once (no redirect followed) and read the whole answer, or stream it to `sink`; an answer left
        unread (an error, a cancellation) closes its connection."""
        headers = JSON_HEADERS if body is not None else None
        auth = self.auth.get(server)
        if auth is not None:
            headers = {**(headers or {}), "Authorization": auth}
        async with await self._start(method, url, body, headers) as resp:
            try:
                if sink is not None and resp.status == 200 and resp.content_type == EVENT_STREAM:
                    await self._pipe(resp, sink, server, url)
                    return resp.status, b"", resp.headers
                return resp.status, await self._body(resp, server, url), resp.headers
            except BaseException:
                resp.close()  # never back to the pool with an answer still coming
                raise

    async def _start(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> aiohttp.ClientResponse:
        """Send once and read the answer's head. A pooled connection the server had closed cleanly before it
        answered (it never served the request) is dropped and the request goes out again, on the next pooled
        connection or a new one; the same on a new connection is the server's failure, raised."""
        for _ in range(STALE_RESENDS):
            _REUSED.set(False)
            try:
                return await self.session.request(method, url, data=body, headers=headers, allow_redirects=False)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not _REUSED.get() or not unserved(exc):
                    raise
        return await self.session.request(method, url, data=body, headers=headers, allow_redirects=False)

    async def _pipe(self, resp: aiohttp.ClientResponse, sink: Sink, server: str, url: str) -> None:
        """Hand the stream to `sink` piece by piece, to its end; over max_body bytes it is an error."""
        size = 0
        while piece := await resp.content.readany():
            size += len(piece)
            if size > self.max_body:
                raise ResponseTooLargeError(
                    f"stream over {self.max_body:,} bytes from {resp.method} {url}; not read further",
                    server=server,
                    status=resp.status,
                )
            try:
                sink(piece)
            except Exception as exc:
                raise _SinkFailed(exc) from exc

    async def _body(self, resp: aiohttp.ClientResponse, server: str, url: str) -> bytes:
        """The answer's body, read up to max_body bytes; a larger one is an error and its socket is closed."""
        length = resp.content_length
        raw = await read_capped(resp.content, self.max_body) if length is None or length <= self.max_body else None
        if raw is None:
            resp.close()  # the rest stays unread: the socket cannot be reused
            raise ResponseTooLargeError(
                f"response body over {self.max_body:,} bytes from {resp.method} {url}; not read further",
                server=server,
                status=resp.status,
            )
        return raw


def basic_auth(login: str, password: str) -> str:
    """The Authorization header value of HTTP Basic auth (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode("ascii")


def open_transport(
    api_key: str | None = None,
    max_body: int = MAX_RESPONSE_BYTES,
    auth: Mapping[str, tuple[str, str]] | None = None,
) -> AiohttpTransport:
    """The run's transport, used as `async with open_transport(...) as transport`."""
    return AiohttpTransport(api_key, max_body, auth)
