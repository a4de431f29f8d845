"""Several choices per request (`n`), seeds, thinking that spends the budget, a prefix cache, and a
request log: what a test of samples per prompt needs from a simulated server."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, Any

import orjson

from . import faults, sglang
from .config import SimConfig
from .sglang import Generation

MAX_N = 128


def choices_wanted(payload: dict[str, Any]) -> int:
    """The `n` of a request (default 1), or the 400 SGLang's validation gives."""
    n = payload.get("n", 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise sglang.bad_request(f"n must be an integer from 1 to {MAX_N}, got {n!r}", "Bad Request")
    return n


def choice_key(key: bytes, seed: Any, index: int) -> bytes:
    """What choice `index` of a request is derived from: the prompt alone for a plain request (as
    before), else the prompt with the request's seed and the choice's index."""
    if seed is None and index == 0:
        return key
    return key + orjson.dumps([seed, index])


@dataclass(frozen=True, slots=True)
class Choice:
    """One generated choice: its answer and, with reasoning on, its thinking."""

    answer: Generation
    thought: Generation | None

    @property
    def tokens(self) -> int:
        return self.answer.tokens + (self.thought.tokens if self.thought else 0)

    @property
    def loop_tokens(self) -> int:
        """The tokens it spends in a loop (the loop fault)."""
        return self.answer.loop_tokens + (self.thought.loop_tokens if self.thought else 0)


def generate_choice(key: bytes, cfg: SimConfig, max_new: int, stop: tuple[str, ...], eos: int, budget: Any) -> Choice:
    """One choice: up to reasoning_words of thinking (capped by a thinking budget) that spend max_new
    first, as a thinking model's do, then the answer in what is left (none: "length", empty content). A choice
    the loop fault picks loops in its answer or its thinking until max_new (sim/faults.py)."""
    loop = faults.loop_draw(key, cfg)
    if loop == "reasoning":
        natural = sglang.generate(b"think" + key, cfg, max_new, (), eos)
        return Choice(sglang.Generation("", 0, "length", None), faults.looping(b"think" + key, cfg, max_new, natural))
    if cfg.reasoning_words <= 0:
        answer = sglang.generate(key, cfg, max_new, stop, eos)
        return Choice(faults.looping(key, cfg, max_new, answer) if loop else answer, None)
    limit = cfg.reasoning_words
    if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0:
        limit = min(limit, budget)
    thought = sglang.generate(b"think" + key, cfg, min(limit, max_new), (), eos) if limit > 0 else None
    left = max_new - (thought.tokens if thought else 0)
    answer = sglang.generate(key, cfg, left, stop, eos)
    return Choice(faults.looping(key, cfg, left, answer) if loop else answer, thought)


def chat_choices(req: sglang.GenRequest, choices: list[Choice], prompt_tokens: int) -> dict[str, Any]:
    """A chat.completion body with one choice per generation; usage sums them, and with reasoning on
    reports the thinking as completion_tokens_details.reasoning_tokens."""
    body = sglang.chat_body(req, choices[0].answer, prompt_tokens)
    first = body["choices"][0]
    body["choices"] = [
        {**first, "index": i, "message": {**first["message"], "content": c.answer.text}}
        | {"finish_reason": c.answer.finish_reason, "matched_stop": c.answer.matched_stop}
        for i, c in enumerate(choices)
    ]
    total = sum(c.tokens for c in choices)
    body["usage"] = sglang.usage(prompt_tokens, total)
    if any(c.thought for c in choices):
        thinking = sum(c.thought.tokens for c in choices if c.thought)
        body["usage"]["completion_tokens_details"] = {"reasoning_tokens": thinking}
        for out, c in zip(body["choices"], choices, strict=True):
            out["message"]["reasoning_content"] = c.thought.text if c.thought else None
    return body


class PrefixCache:
    """The conversation prefixes whose KV a port holds (SGLang's radix cache, by whole messages): an LRU of
    `size` entries, each a prefix of a request's messages (or of its messages and the answer it got) with
    its token count. A request is served the longest prefix held: a repeated prompt in full, the next
    turn of a conversation up to the answer this port gave to the turn before."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._tokens: OrderedDict[bytes, int] = OrderedDict()

    def lookup(self, messages: list[Any], prompt_tokens: int) -> int:
        """The prompt tokens of `messages` the cache holds; the whole prompt is held afterwards."""
        if self.size <= 0:
            return 0
        chain = _chain(messages)
        found = 0
        for digest in reversed(chain):
            if digest in self._tokens:
                self._tokens.move_to_end(digest)
                found = self._tokens[digest]
                break
        self._put(chain[-1], prompt_tokens)
        return min(found, prompt_tokens)

    def answered(self, messages: list[Any], answer: dict[str, Any], tokens: int) -> None:
        """The port generated `answer` to `messages`: that prefix (of `tokens`, prompt and answer) is held."""
        if self.size > 0:
            self._put(_chain([*messages, answer])[-1], tokens)

    def _put(self, digest: bytes, tokens: int) -> None:
        self._tokens[digest] = tokens
        self._tokens.move_to_end(digest)
        if len(self._tokens) > self.size:
            self._tokens.popitem(last=False)


def _chain(messages: list[Any]) -> list[bytes]:
    """A digest of each prefix of `messages` (role, content and reasoning_content: what a turn renders)."""
    chain, h = [], b""
    for m in messages:
        turn = {k: m.get(k) for k in ("role", "content", "reasoning_content") if m.get(k) is not None}
        h = hashlib.blake2b(h + orjson.dumps(turn, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
        chain.append(h)
    return chain


def answer_message(choice: Choice) -> dict[str, Any]:
    """The assistant turn a client puts in its next request for this choice."""
    turn: dict[str, Any] = {"role": "assistant", "content": choice.answer.text}
    if choice.thought is not None:
        turn["reasoning_content"] = choice.thought.text
    return turn


class RequestLog:
    """One JSON line per answered generation request: port, prompt digest, n, seed, cached, texts, messages."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[bytes] | None = open(path, "ab", buffering=0) if path else None  # noqa: SIM115

    def write(self, port: int, key: bytes, payload: dict[str, Any], cached: bool, choices: list[Choice]) -> None:
        """Record one request (a single write, so ports sharing the file never interleave lines)."""
        if self._file is None:
            return
        entry = {
            "port": port,
            "prompt": hashlib.blake2b(key, digest_size=8).hexdigest(),
            "n": len(choices),
            "seed": payload.get("seed"),
            "cached": cached,
            "texts": [c.answer.text for c in choices],
            "messages": payload.get("messages"),  # what was asked: tests compare a turn's history with the output
        }
        self._file.write(orjson.dumps(entry) + b"\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
