"""Streamed chat answers (SSE): joined into the same ChatResult a whole answer gives, errors inside a stream
through the one status table, and a watch that sees the text as it arrives."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gen_pipeline.errors import (
    ConnectionLostError,
    ContextOverflowError,
    OverloadedError,
    RequestError,
    ServerError,
)
from gen_pipeline.http import Client, StreamBody, open_transport, parse_chat
from gen_pipeline.sim import SimConfig, free_ports, start_fleet

USAGE = {
    "prompt_tokens": 31,
    "total_tokens": 45,
    "completion_tokens": 14,
    "prompt_tokens_details": {"cached_tokens": 30},
    "reasoning_tokens": 5,
    "completion_tokens_details": {"reasoning_tokens": 5},
}
CALL = {"id": "call_1", "index": 0, "type": "function", "function": {"name": "get", "arguments": '{"city": "Oslo"}'}}
TOKENS = [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}, {"token": "c", "logprob": -0.3}]


def message(content: str | None, reasoning: str | None = None, calls: list[Any] | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def whole(*choices: dict[str, Any], usage: dict[str, Any] = USAGE) -> dict[str, Any]:
    """A non-streamed SGLang body with these choices."""
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": list(choices),
        "usage": usage,
    }


def choice(index: int, msg: dict[str, Any], finish: str = "stop", logprobs: Any = None) -> dict[str, Any]:
    return {"index": index, "message": msg, "logprobs": logprobs, "finish_reason": finish, "matched_stop": 151645}


BODIES = {
    "plain": whole(choice(0, message("Hello there, world."))),
    "reasoning": whole(choice(0, message("4", "two and two make four"), "length")),
    "tools": whole(choice(0, message(None, None, [CALL]), "tool_calls")),
    "logprobs": whole(choice(0, message("abc"), logprobs={"content": TOKENS})),
    "n=3": whole(*(choice(i, message(f"answer number {i}", f"thought {i}")) for i in range(3))),
    "no usage": {k: v for k, v in whole(choice(0, message("hi"))).items() if k != "usage"},
}


def pieces(text: str | None, size: int = 3) -> list[str]:
    """A text cut as a server streams it, a few characters a chunk."""
    return [text[i : i + size] for i in range(0, len(text or ""), size)]


def stream_of(body: dict[str, Any]) -> list[bytes]:
    """The SSE events SGLang 0.5.23 sends for `body`: per choice the role, the reasoning and content deltas
    (tool calls: name first, arguments in parts), the finish chunk; the usage chunk; [DONE]."""
    top = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}

    def chunk(index: int, delta: dict[str, Any], **more: Any) -> bytes:
        c = {"index": index, "delta": {"reasoning_content": None, **delta}, "logprobs": None, "finish_reason": None}
        return b"data: " + orjson.dumps({**top, "choices": [{**c, **more}]}) + b"\n\n"

    out = []
    for c in body["choices"]:
        i, m = c["index"], c["message"]
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        out += [chunk(i, {"reasoning_content": p}) for p in pieces(m["reasoning_content"])]
        logprobs = (c["logprobs"] or {}).get("content") or []
        for k, p in enumerate(pieces(m["content"], 1 if logprobs else 3)):
            out.append(chunk(i, {"content": p}, logprobs={"content": [logprobs[k]]} if logprobs else None))
        for call in m["tool_calls"] or []:
            head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            out.append(chunk(i, {"tool_calls": [head]}))
            for p in pieces(call["function"]["arguments"], 5):
                out.append(chunk(i, {"tool_calls": [{"index": call["index"], "function": {"arguments": p}}]}))
        out.append(chunk(i, {}, finish_reason=c["finish_reason"], matched_stop=c["matched_stop"]))
    if "usage" in body:
        out.append(b"data: " + orjson.dumps({**top, "choices": [], "usage": body["usage"]}) + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def sse(request: web.Request, events: list[bytes], split: int = 0) -> web.StreamResponse:
    """Send `events` as an event stream; with `split`, every write cut in two (a line across two reads)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        for part in (event[:split], event[split:]) if split else (event,):
            await response.write(part)
    return response


async def against(handler: Handler, check: Callable[[Client, str], Awaitable[Any]], stream: bool = True) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server, open_transport() as transport:
        return await check(Client(transport, stream=stream), str(server.make_url("")).rstrip("/"))


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


@pytest.mark.parametrize("name", BODIES)
@pytest.mark.parametrize("split", [0, 7])
def test_a_streamed_answer_gives_the_result_its_whole_body_gives(name: str, split: int) -> None:
    """Content, reasoning, tool calls, logprobs, finish_reason, n choices, usage with cached and reasoning
    tokens, and the model: the same ChatResult as the non-streamed body, however the bytes are cut."""
    body = BODIES[name]
    seen: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["body"] = await request.json()
        return await sse(request, stream_of(body), split)

    result = run(against(handler, lambda client, url: client.chat(url, {"model": "m", "messages": []}, 5)))
    assert result == parse_chat(body, "s") and result.choices == parse_chat(body, "s").choices
    assert seen["body"]["stream"] is True and seen["body"]["stream_options"] == {"include_usage": True}


def test_the_watch_sees_each_choices_text_as_it_arrives() -> None:
    """The watch gets each delta of content and reasoning, by choice; joined, they are the answer."""
    body = BODIES["n=3"]
    seen: list[tuple[int, str, str]] = []
    stream = StreamBody("s", lambda i, c, r: seen.append((i, c, r)))
    for event in stream_of(body):
        stream.feed(event)
    assert stream.done and stream.chunks == len(seen)
    for i in range(3):
        assert "".join(c for j, c, _ in seen if j == i) == f"answer number {i}"
        assert "".join(r for j, _, r in seen if j == i) == f"thought {i}"


def test_a_server_that_answers_whole_is_read_whole_and_shown_to_the_watch() -> None:
    """A server that ignores `stream` answers JSON: read as a whole answer, its text shown once."""
    seen: list[tuple[int, str, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(BODIES["reasoning"])

    async def check(client: Client, url: str) -> Any:
        return await client.chat(url, {}, 5, watch=lambda i, c, r: seen.append((i, c, r)))

    assert run(against(handler, check)) == parse_chat(BODIES["reasoning"], "s")
    assert seen == [(0, "4", "two and two make four")]


OVERFLOW = (
    "Requested token count exceeds the model's maximum context length of 2048 tokens. You requested a total of "
    "2100 tokens: 100 tokens from the input messages and 2000 tokens for the completion."
)


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        ({"message": "The request queue is full.", "type": "SERVICE_UNAVAILABLE", "code": 503}, OverloadedError),
        ({"message": OVERFLOW, "type": "BadRequestError", "code": 400}, ContextOverflowError),
        ({"message": "boom", "type": "InternalServerError", "code": 500}, ServerError),
        ({"message": "no code"}, ServerError),
    ],
)
def test_an_error_inside_the_stream_maps_through_the_status_table(error: dict[str, Any], cls: type) -> None:
    """`data: {"error": ...}` (SGLang <= 0.5.9's 400s, 0.5.23's queue-full 503) is the error its code stands
    for, as that HTTP status would be (a context overflow keeps its counts)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await sse(request, [b"data: " + orjson.dumps({"error": error}) + b"\n\n", b"data: [DONE]\n\n"])

    async def check(client: Client, url: str) -> RequestError:
        with pytest.raises(RequestError) as caught:
            await client.chat(url, {}, 5)
        return caught.value

    caught = run(against(handler, check))
    assert type(caught) is cls and caught.server.startswith("http://127.0.0.1")
    if cls is ContextOverflowError:
        assert caught.counts.context_length == 2048 and caught.counts.input_tokens == 100


@pytest.mark.parametrize(
    ("events", "cls", "match"),
    [
        (stream_of(BODIES["plain"])[:-1], ConnectionLostError, r"ended before data: \[DONE\]"),
        ([b"data: {not json\n\n"], ServerError, "malformed stream chunk"),
        ([b'data: {"choices": [{"delta": {"content": 5}}]}\n\n'], ServerError, "malformed stream chunk"),
        ([b"data: [1, 2]\n\n"], ServerError, "malformed stream chunk"),
    ],
    ids=["no-done", "not-json", "content-not-text", "not-an-object"],
)
def test_a_broken_stream_is_a_retryable_error(events: list[bytes], cls: type, match: str) -> None:
    """A stream cut before [DONE] or carrying a chunk that is not one is retried elsewhere, never written."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await sse(request, events)

    async def check(client: Client, url: str) -> None:
        with pytest.raises(cls, match=match):
            await client.chat(url, {}, 5)

    run(against(handler, check))


def test_comments_event_names_and_crlf_lines_are_read() -> None:
    """SSE comments and `event:` lines are skipped; lines may end with CRLF."""
    events = [
        b": keep-alive\r\n\r\n",
        b"event: message\r\n",
        *(e.replace(b"\n", b"\r\n") for e in stream_of(BODIES["plain"])),
    ]
    stream = StreamBody("s")
    for event in events:
        stream.feed(event)
    assert stream.done and parse_chat(stream.body(), "s") == parse_chat(BODIES["plain"], "s")


def test_the_simulator_streams_what_it_answers_whole() -> None:
    """Against the simulator (reasoning, n=2, cache report): the streamed result is the whole one's, but for
    the weights, which SGLang's chunks do not name."""

    async def scenario() -> tuple[Any, Any]:
        cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0, reasoning_words=12, cache_report=True)
        async with await start_fleet(cfg) as fleet, open_transport() as transport:
            payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "n": 2}
            plain = await Client(transport).chat(fleet.urls[0], payload, 10)
            streamed = await Client(transport, stream=True).chat(fleet.urls[0], payload, 10)
            return plain, streamed

    plain, streamed = run(scenario())
    assert plain.weight_version == "default" and streamed.weight_version is None
    assert streamed == dataclasses.replace(plain, weight_version=None)
    assert len(plain.choices) == 2 and plain.reasoning_tokens and plain.cached_tokens is not None
