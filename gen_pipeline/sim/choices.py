"""Several choices per request (`n`), seeds, thinking that spends the budget, a prefix cache, and a
request log: what a test of samples per prompt needs from a simulated server.

What the simulated model answers beyond words: JSON when asked for it, and answers that are completions but
not ones to keep (the invalid-answer faults), for the answer checks to find.

A request with `response_format` (or any, with `json_answers`) is answered `{"answer": "<words>"}`, as a server
that constrains the answer would. The invalid-answer faults (`invalid` {kind: p}) turn a fraction p of choices
into one of:
- `prose`: the answer wrapped in prose and a Markdown fence (not JSON any more);
- `empty`: no answer text (only whitespace; the thinking is kept, with reasoning on);
- `think_marker`: a think marker left in the answer;
- `unfinished`: cut at max_tokens while still thinking (finish_reason length, no answer).
A choice's fault is drawn from its seed when the request carries one (a rerun of a seeded request gets the same
answer, a resample with a new seed another draw), else from the port's own random stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, Any

import orjson

from . import faults, sglang
from .config import INVALID_ANSWERS, SimConfig
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


# what the simulated model answers beyond words (the module docstring)


def wants_json(payload: dict[str, Any], cfg: SimConfig) -> bool:
    """Whether the answer is JSON: the request asks for a response_format, or the fleet answers JSON always."""
    return cfg.json_answers or isinstance(payload.get("response_format"), dict)


def draw(key: bytes, seed: Any, rng: random.Random) -> float:
    """A choice's fault draw in [0, 1): from its key when the request is seeded, else from `rng`."""
    if seed is None:
        return rng.random()
    digest = hashlib.blake2b(b"invalid" + key, digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def fault_of(cfg: SimConfig, r: float) -> str | None:
    """The invalid-answer fault a draw `r` falls on (None: a good answer)."""
    edge = 0.0
    for kind in INVALID_ANSWERS:
        edge += cfg.invalid.get(kind, 0.0)
        if r < edge:
            return kind
    return None


def shaped(choice: Choice, as_json: bool, fault: str | None) -> Choice:
    """The choice as the simulated model answers it: JSON when asked, then its fault, if any."""
    answer = choice.answer
    text = orjson.dumps({"answer": answer.text}).decode() if as_json else answer.text
    finish = answer.finish_reason
    if fault == "prose":
        text = f"Sure! Here is what you asked for:\n```json\n{text}\n```\nLet me know if you need more."
    elif fault == "empty":
        text = "" if choice.thought is not None else "\n"
    elif fault == "think_marker":  # a stray close the reasoning parser left, or an open after the answer
        text = f"</think>\n\n{text}" if choice.thought is not None else f"{text}\n<think>"
    elif fault == "unfinished":
        text, finish = ("", "length") if choice.thought is not None else (f"<think>{answer.text}", "length")
    return Choice(dataclasses.replace(answer, text=text, finish_reason=finish), choice.thought)
