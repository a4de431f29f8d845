"""The HTTP layer: one request to one server, and the only place that turns HTTP statuses into our
errors. It knows nothing about retries or balancing.

Bytes move through a transport (transport.py: one aiohttp session), which maps its own failures to our
error tree; `Client` reads the status and the body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from ..errors import (
    AuthError,
    BadRequestError,
    ContextOverflowError,
    EndpointError,
    OverloadedError,
    RequestError,
    RequestTimeout,
    ServerError,
)
from .overflow import error_message, parse_overflow
from .transport import Response


@dataclass(frozen=True, slots=True)
class ChatResult:
    """What a successful chat completion returned."""

    content: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_content: str | None = None  # a server's reasoning parser puts the thinking here, not in content
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, where reported
    logprobs: Any = None  # the choice's logprobs, when the request asked for them
    # every choice (this one first) when the body had more than one (a request with n): their own
    # content, finish_reason and logprobs; usage is the request's, on this result only
    choices: tuple[ChatResult, ...] = ()
    model: str | None = None  # the model the body says answered (SGLang and vLLM echo the request's)
    weight_version: str | None = None  # SGLang's metadata.weight_version: the weights that answered
    usage_problem: str | None = None  # why its usage is impossible (set by the request path: send/usage.py)
    tool_calls: list[Any] | None = None  # the answer's own tool calls (the message's tool_calls), when it made any
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (SGLang --enable-cache-report)


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP-date: fall back to our own backoff


def status_error(status: int, body: Any, server: str, headers: Any = None, request: str = "") -> RequestError:
    """The error for a non-200 answer to `request` ("POST url"): a table from status code to class."""
    message = f"HTTP {status}: {error_message(body)}"
    if 300 <= status < 400 or status == 404:
        return _endpoint_error(status, server, headers, request)
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


def _endpoint_error(status: int, server: str, headers: Any, request: str) -> EndpointError:
    """A redirect or a 404: this URL does not lead to the server's API (a wrong path, a proxy in between)."""
    location = headers.get("location") if headers is not None else None
    went = f" to {location}" if location else ""
    message = f"{request or server} answered HTTP {status}{went}: --servers must name each server's base URL"
    return EndpointError(message, server=server, status=status, url=request.partition(" ")[2])


def parse_chat(body: Any, server: str) -> ChatResult:
    """The completion in a 200 body (every choice of it), or ServerError when the body is not one (a field
    of the wrong type included: it would otherwise reach the output, or the run's token totals)."""
    try:
        usage = body.get("usage") or {}
        choices = sorted(body["choices"], key=lambda c: c.get("index") or 0)
        results = [_choice(c) for c in choices]
        first = results[0]
        details = usage.get("completion_tokens_details") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")  # a figure only: never refused
        cached = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
        result = ChatResult(
            content=first.content,
            finish_reason=first.finish_reason,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            reasoning_content=first.reasoning_content,
            tool_calls=first.tool_calls,
            reasoning_tokens=details.get("reasoning_tokens"),
            logprobs=first.logprobs,
            choices=tuple(results) if len(results) > 1 else (),
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            weight_version=_weight_version(body),
            cached_tokens=cached,
        )
        for count in (result.prompt_tokens, result.completion_tokens, result.reasoning_tokens):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
                raise TypeError(f"usage count {count!r:.80}")
        return result
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        detail = error_message(body) if isinstance(body, dict) and "error" in body else repr(exc)
        raise ServerError(f"malformed completion: {detail}", server=server, status=200) from exc


def _weight_version(body: dict[str, Any]) -> str | None:
    """SGLang's `metadata.weight_version` (None where a server sends no such field)."""
    metadata = body.get("metadata")
    version = metadata.get("weight_version") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) else None


def _choice(choice: dict[str, Any]) -> ChatResult:
    """One choice of a chat body (no usage), or TypeError/KeyError when it is not one."""
    message = choice["message"]
    result = ChatResult(
        content=message.get("content") or "",
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=None,
        completion_tokens=None,
        reasoning_content=message.get("reasoning_content"),
        logprobs=choice.get("logprobs"),
        tool_calls=message.get("tool_calls") or None,  # SGLang sends [] or null when there are none
    )
    if result.tool_calls is not None and not all(isinstance(c, dict) for c in result.tool_calls):
        raise TypeError(f"tool_calls {result.tool_calls!r:.80}")
    if not isinstance(result.content, str):
        raise TypeError(f"content {result.content!r:.80}")
    for text in (result.finish_reason, result.reasoning_content):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"finish_reason or reasoning_content {text!r:.80}")
    for nested in (result.tool_calls, result.logprobs):
        if nested is not None:
            _check_writable(nested)
    return result


# The output line (and an exported row) holds an answer's tool calls and logprobs a few levels down; orjson
# reads 1024 levels but writes only 254, so what a server sent deeper than this could never be written.
WRITE_DEPTH_MARGIN = 4


def _check_writable(value: Any) -> None:
    """TypeError when `value` cannot be written `WRITE_DEPTH_MARGIN` levels down a JSON line."""
    wrapped = value
    for _ in range(WRITE_DEPTH_MARGIN):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"an answer that cannot be written ({exc})") from exc


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw[:500].decode("utf-8", "replace")


class Transport(Protocol):
    """Moves one request to one server and back; failures are already our RequestErrors."""

    async def request(
        self, method: str, server: str, path: str, timeout: float, body: bytes | None = None
    ) -> Response: ...

    async def close(self) -> None: ...


class Client:
    """Sends single requests to single servers and returns results or raises our errors."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def chat(self, server: str, payload: dict[str, Any], timeout: float) -> ChatResult:
        """POST one chat completion."""
        body = await self._call("POST", server, "/v1/chat/completions", timeout, orjson.dumps(payload))
        return parse_chat(body, server)

    async def get_json(self, server: str, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document (discovery and health)."""
        return await self._call("GET", server, path, timeout)

    async def get_text(self, server: str, path: str, timeout: float = 10.0) -> str:
        """GET a text document whole (a Prometheus exposition); a status other than 200 raises its error."""
        return (await self._raw("GET", server, path, timeout)).decode("utf-8", "replace")

    async def _call(self, method: str, server: str, path: str, timeout: float, payload: bytes | None = None) -> Any:
        """One request; the decoded body of a 200, or the status's error."""
        return _decode(await self._raw(method, server, path, timeout, payload))

    async def _raw(self, method: str, server: str, path: str, timeout: float, payload: bytes | None = None) -> bytes:
        """One request; the body of a 200 as sent, or the status's error (its body decoded for the message)."""
        status, raw, headers = await self.transport.request(method, server, path, timeout, payload)
        if status != 200:
            raise status_error(status, _decode(raw), server, headers, f"{method} {server}{path}")
        return raw
