"""A streamed chat completion read as it arrives (server-sent events, `stream: true`).

Each `data:` line is one chunk (`chat.completion.chunk`): a choice's delta of content, reasoning_content,
tool calls or logprobs, then a chunk with its finish_reason; with `stream_options.include_usage` a last
chunk with no choices carries the usage; `data: [DONE]` ends the stream. The chunks of every choice are
joined into the body a non-streamed answer has (`StreamBody.body`), so `parse_chat` reads both the same
way and checks them alike. An error inside the stream (`data: {"error": {...}}`: SGLang up to 0.5.9, and
its queue-full 503) goes through the one status table, as an HTTP status would.

A `Watch` sees each choice's new text as it arrives; the error it raises stops the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import RequestError, ServerError
from .status import status_error

DATA = b"data:"
DONE = b"[DONE]"


class Watch(Protocol):
    """Looks at an answer while it streams: the new text of choice `index` (either part may be "").
    A RequestError it raises stops the answer, on the server too (Client.chat)."""

    def __call__(self, index: int, content: str, reasoning: str) -> None: ...


@dataclass
class _Choice:
    """One choice's parts so far."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[Any] | None = None
    finish_reason: Any = None
    matched_stop: Any = None

    def message(self) -> dict[str, Any]:
        """The choice as a non-streamed body has it (empty parts as the servers send them: null)."""
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)] or None
        return {
            "role": "assistant",
            "content": "".join(self.content) or None,
            "reasoning_content": "".join(self.reasoning) or None,
            "tool_calls": calls,
        }


class StreamBody:
    """The chunks of one streamed answer, fed as bytes arrive; `done` once `data: [DONE]` came."""

    def __init__(self, server: str, watch: Watch | None = None) -> None:
        self.server = server
        self.watch = watch
        self.done = False
        self.chunks = 0  # chunks that carried text: one a token at SGLang's default --stream-interval
        self._rest = b""
        self._choices: dict[int, _Choice] = {}
        self._top: dict[str, Any] = {}  # model, usage, metadata: the last of each sent

    def feed(self, data: bytes) -> None:
        """Read what arrived: every complete line (a line cut between two pieces waits for its end)."""
        if self._rest:
            data, self._rest = self._rest + data, b""
        lines = data.split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if line.startswith(DATA) and not self.done:
                self._event(line[len(DATA) :].strip())

    def _event(self, payload: bytes) -> None:
        if payload == DONE:
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ServerError(f"malformed stream chunk: {payload[:200]!r}", server=self.server, status=200) from exc
        if not isinstance(chunk, dict):
            raise ServerError(f"malformed stream chunk: {payload[:200]!r}", server=self.server, status=200)
        if "error" in chunk:
            raise _stream_error(chunk, self.server)
        try:
            self._chunk(chunk)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ServerError(f"malformed stream chunk: {exc!r}", server=self.server, status=200) from exc

    def _chunk(self, chunk: dict[str, Any]) -> None:
        for key in ("model", "usage", "metadata"):
            if chunk.get(key) is not None:
                self._top[key] = chunk[key]
        for choice in chunk.get("choices") or ():
            index = choice.get("index") or 0
            into = self._choices.get(index)
            if into is None:
                into = self._choices[index] = _Choice()
            if choice.get("finish_reason") is not None:
                into.finish_reason = choice["finish_reason"]
                into.matched_stop = choice.get("matched_stop")
            if choice.get("logprobs") is not None:
                into.logprobs = (into.logprobs or []) + list(choice["logprobs"].get("content") or ())
            delta = choice.get("delta") or {}
            text, thought = delta.get("content"), delta.get("reasoning_content")
            if delta.get("tool_calls"):
                _add_calls(into.tool_calls, delta["tool_calls"])
            if text:
                into.content.append(_text(text))
            if thought:
                into.reasoning.append(_text(thought))
            if text or thought:
                self.chunks += 1
                if self.watch is not None:
                    self.watch(index, text or "", thought or "")

    def body(self) -> dict[str, Any]:
        """The answer as a non-streamed body: its choices in order, the usage and model the stream sent."""
        choices = [
            {
                "index": i,
                "message": c.message(),
                "logprobs": None if c.logprobs is None else {"content": c.logprobs},
                "finish_reason": c.finish_reason,
                "matched_stop": c.matched_stop,
            }
            for i, c in sorted(self._choices.items())
        ]
        return {**self._top, "choices": choices}


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"delta text {value!r:.80}")
    return value


def _add_calls(calls: dict[int, dict[str, Any]], deltas: Any) -> None:
    """Join tool-call deltas by their index: the first names the call, the later ones add to its arguments."""
    for delta in deltas:
        at = delta.get("index") or 0
        fn = delta.get("function") or {}
        call = calls.get(at)
        if call is None:
            calls[at] = {
                "id": delta.get("id"),
                "index": at,
                "type": delta.get("type") or "function",
                "function": {"name": fn.get("name"), "arguments": fn.get("arguments") or ""},
            }
            continue
        call["id"] = call["id"] or delta.get("id")
        call["function"]["name"] = call["function"]["name"] or fn.get("name")
        call["function"]["arguments"] += _text(fn.get("arguments") or "")


def _stream_error(chunk: dict[str, Any], server: str) -> RequestError:
    """The error a `data: {"error": ...}` chunk stands for, by its code, through the one status table."""
    inner = chunk.get("error")
    code = inner.get("code") if isinstance(inner, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599 else 500
    return status_error(status, chunk, server)
