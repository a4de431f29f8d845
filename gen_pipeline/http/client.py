"""The HTTP layer: one request to one server; statuses become our errors through one table (status.py).
It knows nothing about retries or balancing.

Bytes move through a transport (transport.py: one aiohttp session), which maps its own failures to our
error tree; `Client` reads the status and the body. A chat answer is read whole, or streamed (sse.py) and
joined into the same body, so both give the same ChatResult. A chat request given up on before its answer
ended (a timeout, a cancellation, a watch's error, a broken stream) never stays running: its connection is
closed, and a request that names its `rid` (SGLang) is aborted by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from ..errors import ConnectError, ConnectionLostError, ServerError
from .overflow import error_message
from .sse import StreamBody, Watch
from .status import status_error
from .transport import Response, Sink

CHAT_PATH = "/v1/chat/completions"
# What a streamed request adds: usage still comes, in a last chunk (server-api.md §1.5)
STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}
# SGLang stops a request by the rid it carried (with n > 1, each choice's: rid_0, rid_1, ...)
ABORT_PATH = "/abort_request"
ABORT_TIMEOUT = 5.0


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

    async def stream(self, server: str, path: str, timeout: float, body: bytes, sink: Sink) -> Response: ...

    def fire(self, method: str, server: str, path: str, timeout: float, body: bytes | None = None) -> None: ...

    async def close(self) -> None: ...


class Client:
    """Sends single requests to single servers and returns results or raises our errors; `stream`: chat
    answers are streamed and read as they arrive."""

    def __init__(self, transport: Transport, stream: bool = False) -> None:
        self.transport = transport
        self.stream = stream

    async def chat(
        self, server: str, payload: dict[str, Any], timeout: float, watch: Watch | None = None
    ) -> ChatResult:
        """POST one chat completion. `watch` sees its text as it streams (a server that answers a stream
        request whole has it shown whole); the error the watch raises stops the request."""
        try:
            if self.stream:
                return await self._streamed(server, payload, timeout, watch)
            body = await self._call("POST", server, CHAT_PATH, timeout, orjson.dumps(payload))
        except ConnectError:
            raise  # it never reached the server
        except BaseException:
            self._abandon(server, payload)
            raise
        return _watched(parse_chat(body, server), watch)

    async def _streamed(self, server: str, payload: dict[str, Any], timeout: float, watch: Watch | None) -> ChatResult:
        """One streamed chat completion, joined into the body a whole answer has."""
        stream = StreamBody(server, watch)
        data = orjson.dumps({**payload, **STREAM_FIELDS})
        status, raw, headers = await self.transport.stream(server, CHAT_PATH, timeout, data, stream.feed)
        if status != 200:
            raise status_error(status, _decode(raw), server, headers, f"POST {server}{CHAT_PATH}")
        if raw:  # answered whole (a server that does not stream)
            return _watched(parse_chat(_decode(raw), server), watch)
        if not stream.done:
            raise ConnectionLostError("the stream ended before data: [DONE]", server=server)
        return parse_chat(stream.body(), server)

    def _abandon(self, server: str, payload: dict[str, Any]) -> None:
        """Abort a request given up on, on the server, by the rid it carried (if any): in the background."""
        rid = payload.get("rid")
        if not isinstance(rid, str):
            return
        n = payload.get("n") or 1
        for each in [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]:
            self.transport.fire("POST", server, ABORT_PATH, ABORT_TIMEOUT, orjson.dumps({"rid": each}))

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


def _watched(result: ChatResult, watch: Watch | None) -> ChatResult:
    """Show a whole answer's choices to the watch, as a stream would have shown them."""
    if watch is not None:
        for i, choice in enumerate(result.choices or (result,)):
            watch(i, choice.content, choice.reasoning_content or "")
    return result
