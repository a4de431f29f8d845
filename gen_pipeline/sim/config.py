"""The simulated fleet's settings: one frozen value, validated once, shared by every port."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import ConfigError
from ..tokens import TINY_TOKENIZER

SGLANG_VERSION = "0.5.23"
LEGACY_SGLANG_VERSION = "0.5.9"  # the last release whose check (B) rejects input + max_new == ctx
QWEN_EOS_ID = 151645  # matched_stop when the tokenizer has no eos id
KV_POOL_PER_CONTEXT = 8  # default max_total_num_tokens is this many full contexts
SGLANG_CLIP_MAX_NEW_TOKENS = 4096  # what SGLang reserves for an admitted request's output at most
INVALID_ANSWERS = ("prose", "empty", "think_marker", "unfinished")  # the invalid-answer faults (answers.py)


def _frozen_map(value: Any) -> Mapping[Any, Any]:
    """A read-only copy of a dict (or of (key, value) pairs)."""
    return MappingProxyType(dict(value))


def _check_probability(name: str, value: float) -> None:
    """Reject a probability outside [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"simulator: {name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class SimConfig:
    """Settings for a fleet of simulated SGLang servers on 127.0.0.1.

    Fleet: `ports` (one server each), `context_length`, `tokenizer` (its chat template counts
    prompts; its path is reported as tokenizer_path), `model` (served_model_name). Chat prompts are
    rendered with transformers' apply_chat_template, as SGLang does; `light_template` renders them with
    gen_pipeline's own ChatTemplate instead (the same text, ~0.1 ms less CPU a request), for benchmarks
    where the simulator shares the machine's cores with the client it serves.
    `authorization`: the Authorization header every request must carry (401 {"error": "Unauthorized"}
    otherwise, as SGLang's --api-key or a proxy with Basic auth answers).
    Scheduler: `max_running` requests run at once per port; the rest queue, unbounded unless
    `max_queued` is set (then 503 "The request queue is full."). As in SGLang 0.5.23, /server_info says
    max_running_requests null unless `report_max_running` (--max-running-requests given); /v1/loads and
    internal_states give the figure. `max_total_tokens` is the KV
    pool (`max_total_num_tokens`, default 8 contexts); it can make check (C) stricter. With `kv_admission` it
    also decides concurrency, as on a real SGLang: a request runs only when its prompt tokens plus its
    max_tokens (clipped at SGLANG_CLIP_MAX_NEW_TOKENS, times n) fit in the pool beside the running ones'
    reservations; the rest wait in the queue (scheduler.KvPool). Off, only `max_running` bounds it.
    Timing: a completion sleeps `prefill_latency + prompt_tokens * prompt_token_latency + n * token_latency`
    holding a running slot;
    `/health` sleeps `health_delay` (SGLang takes >= 1 s).
    SGLang quirks: `template_extra_tokens` are added to every chat prompt count (a server-side
    template the client does not know); `reserved_tokens` (EAGLE) are added to the input of
    checks (A) and (B) and their messages only; `legacy_offbyone` makes (B) reject
    `input + max_new >= ctx` (<= 0.5.9); `explicit_context_length` models `--context-length`
    (check (D), and a non-null context_length in /server_info); `cache_report` models
    --enable-cache-report (usage.prompt_tokens_details.cached_tokens: the prompt less one token on a
    prefix-cache hit, else 0).
    Content: a natural length in [1, `completion_words`] hashed from the prompt and `seed`; with
    `reasoning_words` > 0 a chat reply also carries up to that many words of `reasoning_content`, as SGLang does
    with `--reasoning-parser` (the thinking split out of `content`); the thinking spends max_tokens first
    (capped by a request's `thinking_budget` only with `thinking_budget_enforced`: SGLang 0.5.23's chat API
    accepts the field and ignores it), so a small budget ends "length" with empty content.
    Samples: a request's `n` and `seed` are honoured (each choice derived from the prompt, seed and its
    index; `ignore_sampling`: not, every choice is the prompt's one answer, as a server ignoring seed and
    sampling gives); a port's prefix cache holds `prefix_cache` conversation prefixes (a repeated prompt,
    or a conversation up to the answer the port gave it: choices.PrefixCache), whose tokens skip the
    prefill and are reported as usage.prompt_tokens_details.cached_tokens; `prefix_cache_tokens` instead
    keeps SGLang's radix cache of that many tokens per port (radix.RadixCache, by token id: a prompt pays
    prefill only for the ids past its longest cached prefix, one prefill at a time per port as SGLang's
    prefill batches, and its answers are cached after it, so a conversation's next turn finds those this
    port gave); `request_log` is a file that
    gets one JSON line per answered chat request (port, prompt digest, n, seed, cached, texts, messages).
    Faults, drawn per port from `random.Random(seed + port)`: `dead` ports never listen;
    `flaky` {port: p} fails a fraction p of generation requests with 500 or 502; `bad_gateway`
    {port: p} answers a fraction p with an instant 502 (before any work, as a proxy in front would); `slow`
    {port: factor} multiplies latencies; `p500`, `p503` (queue full), `p_drop` (connection
    reset, no reply) and `p_hang` (no reply until the client gives up) apply to every port;
    `crash_after` {port: n}: the port serves n generation requests and the next one crashes it
    (listener closed, in-flight connections reset); with `restart_after` seconds it comes back,
    `/health` answering 503 for `warmup` seconds while /v1/* is already served.
    Provenance: `model_path` (default: the tokenizer folder) and `weight_version` are what /model_info,
    /server_info and every chat answer's metadata.weight_version report; `server_version` replaces the
    version reported; `deterministic` is `enable_deterministic_inference`; `redeploy` {port: (n, version)}:
    after n generation requests, that port's weights become `version` (as SGLang's weight update would).
    Loops (sim/faults.py): a fraction `p_loop` of chat answers repeat a unit of 1 to `loop_period` words from a
    drawn point until max_tokens, in the content or (with reasoning on, half of them) in the thinking.
    Streaming (`stream: true`, sim/streaming.py): a chunk every `stream_interval` tokens, as SGLang's
    --stream-interval (default 1: a chunk per token); a client that leaves stops its request's decoding, and
    /abort_request stops one by its rid (finish_reason "abort"), as SGLang does.
    `template_error`: every chat request is answered 400 with this message, as a server whose chat template
    fails (jinja2 missing, a template error) answers; `poison`: a request whose prompt contains this text is
    answered `poison_status` (500: a row that breaks the server's request handling; 400: a row the server
    refuses) by every port, with a message naming the text; other rows are served.
    Answers (answers.py): `json_answers` answers every chat request with JSON (else only those with a
    response_format); `invalid` {kind: p} turns a fraction p of the choices into an invalid answer of that kind
    (INVALID_ANSWERS), drawn from the choice's seed when the request has one.
    """

    # fleet
    ports: tuple[int, ...]
    context_length: int = 8192
    tokenizer: str = str(TINY_TOKENIZER)
    model: str = "sim-model"
    light_template: bool = False
    authorization: str | None = None
    # scheduler
    max_running: int = 64
    report_max_running: bool = False
    max_queued: int | None = None
    max_total_tokens: int | None = None
    kv_admission: bool = False
    # timing
    token_latency: float = 0.0
    prefill_latency: float = 0.0
    prompt_token_latency: float = 0.0
    health_delay: float = 1.0
    # SGLang quirks
    template_extra_tokens: int = 0
    reserved_tokens: int = 0
    legacy_offbyone: bool = False
    explicit_context_length: bool = False
    cache_report: bool = False
    # content
    completion_words: int = 48
    reasoning_words: int = 0
    seed: int = 0
    # samples
    prefix_cache: int = 0
    prefix_cache_tokens: int = 0
    request_log: str | None = None
    ignore_sampling: bool = False
    thinking_budget_enforced: bool = False
    # faults
    dead: tuple[int, ...] = ()
    flaky: Mapping[int, float] = field(default_factory=dict)
    bad_gateway: Mapping[int, float] = field(default_factory=dict)
    slow: Mapping[int, float] = field(default_factory=dict)
    p500: float = 0.0
    p503: float = 0.0
    p_drop: float = 0.0
    p_hang: float = 0.0
    crash_after: Mapping[int, int] = field(default_factory=dict)
    restart_after: float | None = None
    warmup: float = 2.0
    # provenance
    model_path: str | None = None
    weight_version: str = "default"
    server_version: str | None = None
    deterministic: bool = False
    redeploy: Mapping[int, tuple[int, str]] = field(default_factory=dict)
    template_error: str | None = None
    poison: str | None = None
    poison_status: int = 500
    # loops and streaming
    p_loop: float = 0.0
    loop_period: int = 48
    stream_interval: int = 1
    # answers
    json_answers: bool = False
    invalid: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ports", tuple(self.ports))
        object.__setattr__(self, "dead", tuple(self.dead))
        for name in ("flaky", "bad_gateway", "slow", "crash_after", "redeploy", "invalid"):
            object.__setattr__(self, name, _frozen_map(getattr(self, name)))
        self._validate_shape()
        self._validate_faults()

    def _validate_shape(self) -> None:
        """Reject impossible fleet, scheduler and content settings."""
        if not self.ports or len(set(self.ports)) != len(self.ports):
            raise ConfigError(f"simulator: need distinct ports, got {list(self.ports)}")
        if self.context_length < 8:
            raise ConfigError(f"simulator: context_length must be >= 8, got {self.context_length}")
        if self.max_running < 1 or (self.max_queued is not None and self.max_queued < 0):
            raise ConfigError("simulator: max_running must be >= 1 and max_queued >= 0")
        if self.completion_words < 1 or self.reasoning_words < 0:
            raise ConfigError("simulator: completion_words must be >= 1 and reasoning_words >= 0")
        if self.loop_period < 1 or self.stream_interval < 1:
            raise ConfigError("simulator: loop_period and stream_interval must be >= 1")
        if min(self.token_latency, self.prefill_latency, self.prompt_token_latency, self.health_delay, self.warmup) < 0:
            raise ConfigError("simulator: latencies must be >= 0")

    def _validate_faults(self) -> None:
        """Reject fault settings that name unknown ports or impossible rates."""
        for name in ("p500", "p503", "p_drop", "p_hang", "p_loop"):
            _check_probability(name, getattr(self, name))
        if self.p500 + self.p503 + self.p_drop + self.p_hang > 1.0:
            raise ConfigError("simulator: p500 + p503 + p_drop + p_hang must be <= 1")
        for port, p in [*self.flaky.items(), *self.bad_gateway.items()]:
            _check_probability(f"flaky rate of port {port}", p)
        if any(f <= 0 for f in self.slow.values()) or any(n < 0 for n in self.crash_after.values()):
            raise ConfigError("simulator: slow factors must be > 0 and crash_after counts >= 0")
        named = set(self.dead) | set(self.flaky) | set(self.bad_gateway) | set(self.slow) | set(self.crash_after)
        named |= set(self.redeploy)
        if any(n < 0 for n, _ in self.redeploy.values()):
            raise ConfigError("simulator: redeploy counts must be >= 0")
        if not named <= set(self.ports):
            raise ConfigError(f"simulator: faults name ports outside --ports: {sorted(named - set(self.ports))}")
        if self.restart_after is not None and self.restart_after < 0:
            raise ConfigError("simulator: restart_after must be >= 0")
        if not set(self.invalid) <= set(INVALID_ANSWERS):
            kinds = ", ".join(INVALID_ANSWERS)
            raise ConfigError(f"simulator: invalid-answer kinds are {kinds}, got {sorted(self.invalid)}")
        for kind, p in self.invalid.items():
            _check_probability(f"invalid {kind}", p)
        if sum(self.invalid.values()) > 1.0:
            raise ConfigError("simulator: the invalid-answer rates add up to more than 1")
        if not 400 <= self.poison_status <= 599:
            raise ConfigError(f"simulator: poison_status must be a 4xx or 5xx status, got {self.poison_status}")

    @property
    def live_ports(self) -> tuple[int, ...]:
        """The ports that listen (all but the dead ones)."""
        return tuple(p for p in self.ports if p not in self.dead)

    @property
    def max_total_num_tokens(self) -> int:
        """The KV pool size the scheduler reports."""
        return self.max_total_tokens or self.context_length * KV_POOL_PER_CONTEXT

    def reservation(self, prompt_tokens: int, max_new: int, n: int = 1) -> int:
        """The KV pool tokens an admitted request reserves: its prompt and its n outputs' clipped max_tokens."""
        return prompt_tokens + n * min(max_new, SGLANG_CLIP_MAX_NEW_TOKENS)

    @property
    def max_req_len(self) -> int:
        """SGLang's per-request length cap: min(ctx - 1, pool - 1)."""
        return min(self.context_length - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """The scheduler's input cap of check (C): max_req_len - 5."""
        return self.max_req_len - 5

    @property
    def version(self) -> str:
        """The SGLang version this configuration imitates (or reports, with server_version)."""
        return self.server_version or (LEGACY_SGLANG_VERSION if self.legacy_offbyone else SGLANG_VERSION)

    @property
    def checkpoint_path(self) -> str:
        """The model_path reported."""
        return self.model_path or self.tokenizer

    def weights_of(self, port: int, generated: int) -> str:
        """The weight_version `port` serves after `generated` generation requests."""
        redeploy = self.redeploy.get(port)
        return redeploy[1] if redeploy is not None and generated > redeploy[0] else self.weight_version
