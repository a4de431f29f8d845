"""The one HTTP transport: an aiohttp session whose TCPConnector keeps sockets alive per server, and the one
place where foreign exceptions (aiohttp's, the socket's, the URL parser's, timeouts) become ours.

A request is sent once: redirects are not followed (a 3xx is an answer, and the client says what it means),
the body is read up to a cap and no further, and the whole exchange, connecting included, has a deadline
(deadlines.py: one shared timer, not an asyncio.timeout per request).
"""

from __future__ import annotations

import base64
import contextlib
import errno
from collections.abc import Iterator, Mapping

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
JSON_HEADERS = {"Content-Type": "application/json"}


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
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT)
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = aiohttp.ClientTimeout(total=None)  # each request has its own deadline
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)
        self.max_body = max_body
        self._deadlines = Deadlines()

    async def __aenter__(self) -> AiohttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> Response:
        """One request to `server + path`; RequestTimeout after `timeout` s, connecting included."""
        task = self._deadlines.enter(timeout)
        try:
            with map_errors(server, server + path):
                answer = await self._send(method, server, server + path, body)
        except BaseException as exc:  # a cancellation at our deadline is a timeout; any other goes on
            if self._deadlines.leave(task):
                raise RequestTimeout("request timed out", server=server) from exc
            raise
        self._deadlines.leave(task)
        return answer

    async def _send(self, method: str, server: str, url: str, body: bytes | None) -> Response:
        """Send once (no redirect followed) and read the whole answer."""
        headers = JSON_HEADERS if body is not None else None
        auth = self.auth.get(server)
        if auth is not None:
            headers = {**(headers or {}), "Authorization": auth}
        async with self.session.request(method, url, data=body, headers=headers, allow_redirects=False) as resp:
            return resp.status, await self._body(resp, server, url), resp.headers

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
