"""The HTTP layer: one aiohttp session, one request to one server, and the only place that turns
aiohttp exceptions and HTTP statuses into our errors. It knows nothing about retries or balancing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from .errors import (
    AuthError,
    BadRequestError,
    ConnectError,
    ConnectionLostError,
    ContextOverflowError,
    OverloadedError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from .overflow import error_message, parse_overflow

# SGLang and vLLM close idle keep-alive sockets after 5 s; drop ours first so a request never
# goes out on a socket the server is about to close.
KEEPALIVE_TIMEOUT = 4.0


@dataclass(frozen=True, slots=True)
class ChatResult:
    """What a successful chat completion returned."""

    content: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None


def _describe(exc: BaseException) -> str:
    """The error's class and text, even for aiohttp errors whose str() needs missing fields."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def map_errors(server: str) -> Iterator[None]:
    """Translate aiohttp and socket errors into ours, most specific first."""
    try:
        yield
    except RequestError:
        raise
    except aiohttp.ClientConnectorError as exc:
        raise ConnectError(f"cannot connect: {_describe(exc)}", server=server) from exc
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise RequestTimeout("request timed out", server=server) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise ConnectionLostError(f"connection lost: {_describe(exc)}", server=server) from exc
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        raise ConnectionLostError(f"connection failed: {_describe(exc)}", server=server) from exc


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP-date: fall back to our own backoff


def status_error(status: int, body: Any, server: str, headers: Any = None) -> RequestError:
    """The error for a non-200 answer: a table from status code to class."""
    message = f"HTTP {status}: {error_message(body)}"
    if status == 400:
        counts = parse_overflow(body)
        if counts is not None:
            return ContextOverflowError(message, counts=counts, server=server, status=status)
        return BadRequestError(message, server=server, status=status)
    if status in (401, 403):
        return AuthError(message, server=server, status=status)
    if status in (429, 503):
        return OverloadedError(message, server=server, status=status, retry_after=_retry_after(headers))
    if status == 408:
        return RequestTimeout(message, server=server, status=status)
    if status >= 500:
        return ServerError(message, server=server, status=status)
    return BadRequestError(message, server=server, status=status)


def parse_chat(body: Any, server: str) -> ChatResult:
    """The completion in a 200 body, or ServerError when the body is not one."""
    try:
        choice = body["choices"][0]
        usage = body.get("usage") or {}
        return ChatResult(
            content=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        detail = error_message(body) if isinstance(body, dict) and "error" in body else repr(exc)
        raise ServerError(f"malformed completion: {detail}", server=server, status=200) from exc


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw[:500].decode("utf-8", "replace")


def make_session(api_key: str | None = None) -> aiohttp.ClientSession:
    """One session for the whole run; concurrency is bounded by the balancer, not the connector."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_TIMEOUT)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return aiohttp.ClientSession(connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=None))


class Client:
    """Sends single requests to single servers and returns results or raises our errors."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def chat(self, server: str, payload: dict[str, Any], timeout: float) -> ChatResult:
        """POST one chat completion."""
        status, body, headers = await self._request(
            "POST", server, "/v1/chat/completions", timeout, orjson.dumps(payload)
        )
        if status != 200:
            raise status_error(status, body, server, headers)
        return parse_chat(body, server)

    async def get_json(self, server: str, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document (discovery and health)."""
        status, body, headers = await self._request("GET", server, path, timeout)
        if status != 200:
            raise status_error(status, body, server, headers)
        return body

    async def _request(
        self, method: str, server: str, path: str, timeout: float, data: bytes | None = None
    ) -> tuple[int, Any, Any]:
        headers = {"Content-Type": "application/json"} if data is not None else None
        with map_errors(server):
            async with (
                asyncio.timeout(timeout),
                self.session.request(method, server + path, data=data, headers=headers) as resp,
            ):
                raw = await resp.read()
                return resp.status, _decode(raw), resp.headers
