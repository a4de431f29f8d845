"""Streaming as SGLang 0.5.23 does it (`stream: true` on /v1/chat/completions; server-api.md §1.5), and its
stop by rid (`POST /abort_request`).

The headers go out once the request runs (its prefill done): the length checks' 400s came before as plain HTTP
errors, as from 0.5.16 on. Then for each choice a first chunk with the role, a chunk every `stream_interval`
tokens with the text decoded since (`reasoning_content` while it thinks, `content` after), a chunk with its
finish_reason and matched_stop; the usage chunk (`stream_options.include_usage`), and `data: [DONE]`. Chunks
go out as they are decoded: those decoded within MIN_TICK in one write. A client that leaves cancels the
handler, which stops the decoding. `/abort_request {"rid"}` stops a running request whose rid is exactly
that, and with it every running one whose rid it begins (SGLang's scheduler matches a prefix; a request
with n > 1 runs as rid_0, rid_1, ...): each ends with finish_reason "abort" and what it decoded. The chunk
shapes are SGLang's (its StreamDelta always carries reasoning_content, null when the delta has none).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from . import sglang
from .choices import Choice
from .httpd import SERVER_HEADER, Request
from .scheduler import Scheduler

MIN_TICK = 0.01  # tokens decoded within this many seconds go out in one write
DONE = b"data: [DONE]\n\n"
NO_REASONING = b'"reasoning_content":null'


class Rids:
    """The rids of the requests one port runs, and which of them /abort_request stopped."""

    def __init__(self) -> None:
        self._aborted: dict[str, bool] = {}

    @contextlib.contextmanager
    def running(self, rids: list[str]) -> Iterator[None]:
        """Hold `rids` while their request runs; 400 "Duplicate request ID" when one runs already."""
        for rid in rids:
            if rid in self._aborted:
                raise sglang.bad_request(f"Duplicate request ID detected: {rid}")
        self._aborted.update(dict.fromkeys(rids, False))
        try:
            yield
        finally:
            for rid in rids:
                self._aborted.pop(rid, None)

    def abort(self, rid: str, every: bool = False) -> int:
        """Stop `rid` (nothing unless it runs), and every running rid it begins; how many were stopped."""
        if not every and rid not in self._aborted:
            return 0
        hit = [r for r in self._aborted if every or r.startswith(rid)]
        self._aborted.update(dict.fromkeys(hit, True))
        return len(hit)

    def aborted(self, rid: str) -> bool:
        return self._aborted.get(rid, False)


def request_rids(payload: dict[str, Any], n: int) -> list[str]:
    """The rids a chat request runs under (none when it names none: SGLang makes up its own)."""
    rid = payload.get("rid")
    if rid is None:
        return []
    if isinstance(rid, str):
        return [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]
    if isinstance(rid, list) and len(rid) == n and all(isinstance(r, str) for r in rid):
        return list(rid)
    raise sglang.bad_request("The rid should be a string or a list of strings.")


def token_texts(choice: Choice) -> list[tuple[bool, str]]:
    """(thinking?, its text) for each token the choice decodes, in order; joined they are its texts (a stop
    string's token adds none)."""
    out: list[tuple[bool, str]] = []
    for thinking, gen in ((True, choice.thought), (False, choice.answer)):
        if gen is None:
            continue
        words = gen.text.split(" ") if gen.text else []
        out += [(thinking, w if i == 0 else " " + w) for i, w in enumerate(words)]
        out += [(thinking, "")] * (gen.tokens - len(words))
    return out


class Stream:
    """One streamed chat answer of several choices, decoded side by side and written as it is decoded."""

    def __init__(self, request: Request, model: str, made: list[Choice], rids: Rids, names: list[str]) -> None:
        self.request, self.made, self.rids, self.names = request, made, rids, names
        self.tokens = [token_texts(c) for c in made]
        self.loop_from = [len(t) - c.loop_tokens for t, c in zip(self.tokens, made, strict=True)]
        self.decoded = [0] * len(made)  # tokens decoded per choice
        self.stopped = [False] * len(made)  # by /abort_request
        self.gone = False  # the client left (a write failed)
        self.response = web.StreamResponse(headers={**SERVER_HEADER, "Cache-Control": "no-cache"})
        self.response.content_type = "text/event-stream"
        top = {"id": os.urandom(16).hex(), "object": "chat.completion.chunk", "created": int(time.time())}
        self._top = orjson.dumps({**top, "model": model})[:-1]
        self._head = self._top + b',"choices":[{"index":'

    def _chunk(self, index: int, delta: bytes, finish: Any = None, matched: Any = None) -> bytes:
        tail = b',"logprobs":null,"finish_reason":%s,"matched_stop":%s}]}\n\n' % (
            orjson.dumps(finish),
            orjson.dumps(matched),
        )
        return b"data: " + self._head + b"%d" % index + b',"delta":{' + delta + b"}" + tail

    async def _write(self, data: bytes) -> None:
        """Send `data`; a client gone (the write fails) is noted, and nothing more is sent."""
        if self.gone:
            return
        try:
            await self.response.write(data)
        except ConnectionError:
            self.gone = True

    async def open(self) -> None:
        """Send the headers and each choice's first chunk (the role)."""
        await self.response.prepare(self.request)
        first = NO_REASONING + b',"role":"assistant","content":""'
        await self._write(b"".join(self._chunk(i, first) for i in range(len(self.made))))

    async def run(self, scheduler: Scheduler, interval: int) -> None:
        """Decode every choice to its end or its abort, `interval` tokens a chunk; the port's counters count
        what was decoded (a client that leaves stops it: its handler is cancelled, or a write fails)."""
        latency = scheduler.cfg.token_latency * scheduler.slowness
        step = interval * max(1, math.ceil(MIN_TICK / latency / interval)) if latency > 0 else math.inf
        longest = max(len(t) for t in self.tokens)
        at = 0
        while at < longest and not self.gone and not all(self._done(i) for i in range(len(self.made))):
            upto = int(min(longest, at + step))
            live = [i for i in range(len(self.made)) if not self._done(i)]
            made = sum(min(upto, len(self.tokens[i])) - self.decoded[i] for i in live)
            looped = sum(max(0, min(upto, len(t)) - max(self.loop_from[i], self.decoded[i])) for i, t in self._of(live))
            await scheduler.decode(upto - at, prefill=False, produced=made, looped=looped)
            await self._write(b"".join(self._advance(i, upto, interval) for i in live))
            at = upto
        if self.gone or any(self.stopped):
            scheduler.stats.stopped += 1

    def _of(self, live: list[int]) -> list[tuple[int, list[tuple[bool, str]]]]:
        return [(i, self.tokens[i]) for i in live]

    def whole(self, i: int) -> bool:
        """Whether choice i was decoded to its end."""
        return not self.stopped[i] and self.decoded[i] >= len(self.tokens[i])

    def _done(self, i: int) -> bool:
        if not self.stopped[i] and self.names and self.rids.aborted(self.names[i]):
            self.stopped[i] = True
        return self.stopped[i] or self.decoded[i] >= len(self.tokens[i])

    def _advance(self, i: int, upto: int, interval: int) -> bytes:
        """Choice i's chunks for its tokens up to `upto` (one per `interval` tokens, the last one shorter)."""
        out = []
        tokens, start = self.tokens[i], self.decoded[i]
        end = min(upto, len(tokens))
        for lo in range(start, end, interval):
            part = tokens[lo : min(lo + interval, end)]
            thinking = [t for k, t in part if k]
            saying = [t for k, t in part if not k]
            if thinking and "".join(thinking):
                out.append(self._chunk(i, b'"reasoning_content":' + orjson.dumps("".join(thinking))))
            if saying and "".join(saying):
                out.append(self._chunk(i, NO_REASONING + b',"content":' + orjson.dumps("".join(saying))))
        self.decoded[i] = end
        return b"".join(out)

    def usage(self, whole: dict[str, Any]) -> dict[str, Any]:
        """The usage of what was decoded: `whole` (the usage of every choice decoded to its end) cut back."""
        if not any(self.stopped):
            return whole
        thinking = sum(self._thought(i) for i in range(len(self.made)))
        used = sum(self.decoded)
        cut = {**whole, "completion_tokens": used, "total_tokens": whole["prompt_tokens"] + used}
        if whole.get("completion_tokens_details"):
            cut["completion_tokens_details"] = {"reasoning_tokens": thinking}
        return cut

    def _thought(self, i: int) -> int:
        thought = self.made[i].thought
        return min(self.decoded[i], thought.tokens) if thought is not None else 0

    async def close(self, usage: dict[str, Any], include_usage: bool) -> web.StreamResponse:
        """Each choice's finish chunk ("abort" for a stopped one), the usage chunk if asked for, [DONE]."""
        out = []
        for i, c in enumerate(self.made):
            finish, matched = ("abort", None) if self.stopped[i] else (c.answer.finish_reason, c.answer.matched_stop)
            out.append(self._chunk(i, NO_REASONING, finish, matched))
        if include_usage:
            out.append(b"data: " + self._top + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n")
        await self._write(b"".join(out) + DONE)
        return self.response


def include_usage(payload: dict[str, Any]) -> bool:
    """Whether the request asked for the usage chunk (stream_options.include_usage)."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


async def error_stream(request: Request, body: dict[str, Any]) -> web.StreamResponse:
    """An error SGLang 0.5.23 sends inside a stream (its queue-full 503): 200, the error event, [DONE]."""
    response = web.StreamResponse(headers={**SERVER_HEADER, "Cache-Control": "no-cache"})
    response.content_type = "text/event-stream"
    await response.prepare(request)
    error = {**body, "type": "SERVICE_UNAVAILABLE"} if body.get("code") == 503 else body
    await response.write(b"data: " + orjson.dumps({"error": error}) + b"\n\n" + DONE)
    await response.write_eof()
    return response


async def decode(scheduler: Scheduler, made: list[Choice], stream: Stream | None, prompt: int, prefill: bool) -> None:
    """Prefill `prompt` tokens (if `prefill`), then decode the n choices side by side; a stream is written
    as it decodes."""
    if stream is None:
        longest, produced = max(c.tokens for c in made), sum(c.tokens for c in made)
        looped = sum(c.loop_tokens for c in made)
        await scheduler.decode(longest, prompt, prefill=prefill, produced=produced, looped=looped)
        return
    if prefill:
        await scheduler.decode(0, prompt, prefill=True, produced=0)
    await stream.open()
    await stream.run(scheduler, scheduler.cfg.stream_interval)
