"""SGLang 0.5.23's wire format as pure functions: request parsing, the length checks, reply bodies, and its
read-only endpoints (/v1/models, /model_info, /server_info, /v1/loads: the keys and values SGLang 0.5.23
answers with; tests/test_realserver_sglang.py compares them with a real one).

Nothing here does I/O, so each rule of server-api.md §1 can be read (and tested) on its own.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from ..errors import PipelineError
from ..records import template_input_error
from .config import SimConfig

QUEUE_FULL = "The request queue is full."
WORDS = (
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island", "jade",
    "kettle", "lantern", "meadow", "nectar", "orbit", "pebble", "quartz", "river", "saffron",
    "timber", "umber", "valley", "willow", "xenon", "yarrow", "zephyr", "amber", "basil",
    "canyon", "dune", "echo", "fern",
)  # fmt: skip
WORD_OF_BYTE = [WORDS[b % len(WORDS)] for b in range(256)]  # 32 words: each byte value maps to one evenly


class Rejection(PipelineError):
    """An HTTP error reply the simulated server sends instead of a completion."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("message", status)))
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class GenRequest:
    """The parts of a chat or completions request the simulator acts on."""

    model: str
    max_new: int | None
    stop: tuple[str, ...]
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools: list[Any] | None = None  # what the chat template renders beside the messages (server-api.md §1.6)
    template_kwargs: dict[str, Any] | None = None
    tool_choice: Any = None  # which tools the template renders (tokens/conversation.chosen_tools)


@dataclass(frozen=True, slots=True)
class Generation:
    """What the simulated model produced for one request."""

    text: str
    tokens: int
    finish_reason: str
    matched_stop: int | str | None
    loop_at: int | None = None  # the loop fault: the token its loop starts at (sim/faults.py)

    @property
    def loop_tokens(self) -> int:
        """The tokens it spends in a loop."""
        return 0 if self.loop_at is None else self.tokens - self.loop_at


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    """SGLang's flat OpenAI error envelope (serving_base.create_error_response)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def bad_request(message: str, err_type: str = "BadRequestError") -> Rejection:
    """A 400 with the flat envelope."""
    return Rejection(400, error_body(message, err_type))


def queue_full() -> Rejection:
    """The 503 of --max-queued-requests (type is str(HTTPStatus) on Python >= 3.11)."""
    return Rejection(503, error_body(QUEUE_FULL, "503", 503))


def internal_error() -> Rejection:
    """An uncaught server exception: 500 InternalServerError."""
    return Rejection(500, error_body("Internal server error: simulated", "InternalServerError", 500))


def _stops(payload: dict[str, Any]) -> tuple[str, ...]:
    """The request's stop strings as a tuple."""
    stop = payload.get("stop")
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)


def _int_field(payload: dict[str, Any], key: str) -> int | None:
    """An optional integer field; anything else is a validation error."""
    value = payload.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad_request(f"{key}: Input should be a valid integer, got {value!r}", "Bad Request")
    return value


def _normalize_message(message: Any) -> dict[str, Any]:
    """The request's message as pydantic validates it; the counter applies SGLang's normalisation
    (None content -> "", text parts joined, tool-call arguments parsed: tokens/conversation.py)."""
    if not isinstance(message, dict) or "role" not in message:
        raise bad_request("messages: each message must be an object with a role", "Bad Request")
    return message


def parse_chat(payload: Any, served: str) -> GenRequest:
    """Validate a /v1/chat/completions body the way the pydantic model and _validate_request do."""
    if not isinstance(payload, dict):
        raise bad_request("Input should be a valid dictionary", "Bad Request")
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise bad_request(
            "1 validation error for ChatCompletionRequest\nmessages\n  Field required",
            "Bad Request",
        )
    if not messages:
        raise bad_request("Messages cannot be empty.")
    tools, kwargs = payload.get("tools"), payload.get("chat_template_kwargs")
    if (error := template_input_error(tools, kwargs)) is not None:
        raise bad_request(f"1 validation error for ChatCompletionRequest\n{error}", "Bad Request")
    return GenRequest(
        model=str(payload.get("model") or served),
        max_new=_int_field(payload, "max_completion_tokens") or _int_field(payload, "max_tokens"),
        stop=_stops(payload),
        messages=[_normalize_message(m) for m in messages],
        tools=tools or None,
        template_kwargs=kwargs or None,
        tool_choice=payload.get("tool_choice"),
    )


def parse_completion(payload: Any, served: str) -> GenRequest:
    """Validate a /v1/completions body: a string prompt (or token ids), max_tokens default 16."""
    if not isinstance(payload, dict):
        raise bad_request("Input should be a valid dictionary", "Bad Request")
    prompt = payload.get("prompt")
    is_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    if not (isinstance(prompt, str) or is_ids):
        raise bad_request("1 validation error for CompletionRequest\nprompt\n  Field required", "Bad Request")
    return GenRequest(
        model=str(payload.get("model") or served),
        max_new=_int_field(payload, "max_tokens") if "max_tokens" in payload else 16,
        stop=_stops(payload),
        prompt=prompt,
    )


def length_error(cfg: SimConfig, input_tokens: int, max_new: int | None, chat: bool) -> str | None:
    """The message of the first failing length check, in SGLang's order D, A, B, C; else None."""
    ctx = cfg.context_length
    counted = input_tokens + cfg.reserved_tokens  # EAGLE reserve counts in (A) and (B) only
    if chat and cfg.explicit_context_length and max_new and max_new > ctx:
        return f"max_completion_tokens is too large: {max_new}.This model supports at most {ctx} completion tokens."
    if counted >= ctx:
        return f"The input ({counted} tokens) is longer than the model's context length ({ctx} tokens)."
    if max_new is not None and _over_total(counted + max_new, ctx, cfg.legacy_offbyone):
        return (
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {max_new + counted} tokens: {counted} tokens from the input "
            f"messages and {max_new} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit."
        )
    if max_new is not None and max_new < 0:
        return f"max_new_tokens must be at least 0, got {max_new}."
    if input_tokens >= cfg.max_req_input_len:
        return (
            f"Input length ({input_tokens} tokens) exceeds the maximum allowed length "
            f"({cfg.max_req_input_len} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
    return None


def _over_total(total: int, ctx: int, legacy: bool) -> bool:
    """Check (B)'s comparison: `>=` up to 0.5.9, `>` from 0.5.16 on."""
    return total >= ctx if legacy else total > ctx


def effective_max_new(cfg: SimConfig, input_tokens: int, requested: int | None) -> int:
    """The scheduler's clamp: at most max_req_len - input - 1 (= ctx - 2 - input when omitted)."""
    room = max(0, cfg.max_req_len - input_tokens - 1)
    return room if requested is None else min(requested, room)


def generate(key: bytes, cfg: SimConfig, max_new: int, stop: tuple[str, ...], eos: int) -> Generation:
    """A prompt's deterministic completion: a hashed natural length, cut by max_new or a stop."""
    seeded = cfg.seed.to_bytes(8, "little", signed=True) + key
    digest = hashlib.blake2b(seeded, digest_size=8).digest()
    natural = 1 + int.from_bytes(digest, "little") % cfg.completion_words
    # each word is picked by one byte of a SHAKE stream: a fraction of seeding random.Random per request
    words = [WORD_OF_BYTE[b] for b in hashlib.shake_128(seeded).digest(min(natural, max_new))]
    for i, word in enumerate(words):
        if word in stop:  # the stop string's token is generated but not returned
            return Generation(" ".join(words[:i]), i + 1, "stop", word)
    if max_new < natural:
        return Generation(" ".join(words), len(words), "length", None)
    return Generation(" ".join(words), len(words), "stop", eos)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """SGLang's usage block without --enable-cache-report."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def chat_body(req: GenRequest, gen: Generation, prompt_tokens: int) -> dict[str, Any]:
    """A non-streaming chat.completion body (server-api.md §1.5)."""
    message = {"role": "assistant", "content": gen.text, "reasoning_content": None}
    choice = {"index": 0, "message": message, "logprobs": None}
    return _envelope("chat.completion", req, gen, prompt_tokens, choice)


def text_body(req: GenRequest, gen: Generation, prompt_tokens: int) -> dict[str, Any]:
    """A non-streaming text_completion body."""
    choice = {"index": 0, "text": gen.text, "logprobs": None}
    return _envelope("text_completion", req, gen, prompt_tokens, choice)


def _envelope(obj: str, req: GenRequest, gen: Generation, prompt_tokens: int, choice: dict[str, Any]) -> dict[str, Any]:
    """The fields chat and text completions share; `model` echoes the request."""
    choice.update(finish_reason=gen.finish_reason, matched_stop=gen.matched_stop)
    return {
        "id": os.urandom(16).hex(),  # the shape of SGLang's uuid4().hex, at a fraction of the cost
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, gen.tokens),
        "metadata": {"weight_version": "default"},
    }


def prompt_key(req: GenRequest) -> bytes:
    """The bytes a completion is derived from: the conversation or the prompt."""
    return orjson.dumps(req.messages if req.messages is not None else req.prompt)


# the read-only endpoints


def model_card(cfg: SimConfig, created: int) -> dict[str, Any]:
    """The /v1/models card; max_model_len is the effective context length."""
    return {
        "id": cfg.model,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.context_length,
    }


def model_not_found(name: str) -> dict[str, Any]:
    """The 404 body of /v1/models/{unknown}."""
    return {
        "error": {
            "message": f"The model '{name}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def model_info(cfg: SimConfig, weight_version: str | None = None) -> dict[str, Any]:
    """The /model_info body: no context length here, as in SGLang (its 15 keys in 0.5.23's order; `embedding`,
    a long description of the embedding path, cut to the switch that says it is off; `weight_version`: the
    port's now)."""
    return {
        "model_path": cfg.checkpoint_path,
        "served_model_name": cfg.model,
        "tokenizer_path": cfg.tokenizer,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version or cfg.weight_version,
        "load_format": "auto",
        "reasoning_parser": "qwen3" if cfg.reasoning_words else None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "embedding": {"enabled": False},
    }


def server_info(cfg: SimConfig, port: int, started: float, weight_version: str | None = None) -> dict[str, Any]:
    """The /server_info body: resolved server args plus scheduler info. max_running_requests is null unless
    the server was started with --max-running-requests (`report_max_running`); the scheduler's own figure is
    in internal_states and /v1/loads."""
    speculative = cfg.reserved_tokens > 0
    running = cfg.max_running if cfg.report_max_running else None
    state = {
        "context_length": cfg.context_length if cfg.explicit_context_length else None,
        "max_running_requests": running,
        "effective_max_running_requests_per_dp": cfg.max_running,
    }
    return {
        "model_path": cfg.checkpoint_path,
        "tokenizer_path": cfg.tokenizer,
        "tokenizer_mode": "auto",
        "served_model_name": cfg.model,
        "host": "127.0.0.1",
        "port": port,
        "context_length": cfg.context_length if cfg.explicit_context_length else None,
        "max_running_requests": running,
        "max_queued_requests": cfg.max_queued,
        "allow_auto_truncate": False,
        "enable_cache_report": cfg.cache_report,
        "speculative_algorithm": "EAGLE" if speculative else None,
        "speculative_num_draft_tokens": cfg.reserved_tokens if speculative else None,
        "random_seed": cfg.seed,
        "dtype": "auto",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "enable_deterministic_inference": cfg.deterministic,
        # constrained decoding: the simulator's JSON answers are compact, as a --constrained-json-disable-any-whitespace
        # server's are (fleet/structured.py reads these)
        "grammar_backend": "xgrammar",
        "constrained_json_disable_any_whitespace": True,
        "constrained_json_max_whitespace_cnt": None,
        "reasoning_parser": "qwen3" if cfg.reasoning_words else None,
        "weight_version": weight_version or cfg.weight_version,
        "max_total_num_tokens": cfg.max_total_num_tokens,
        "max_req_input_len": cfg.max_req_input_len,
        "internal_states": [state],
        "version": cfg.version,
        "startup_time": started,
    }


def loads(cfg: SimConfig, running: int, waiting: int, used_tokens: int = 0) -> dict[str, Any]:
    """The /v1/loads body of one DP rank: the scheduler's running slots, its pool and its queue. `used_tokens`
    stands for SGLang's num_used_tokens: the running requests' reservations (a real server counts the tokens
    its KV cache holds, which grow toward them); without kv_admission the simulator does not bound them by the
    pool, so token_usage may pass 1."""
    now = time.time()
    total = cfg.max_total_num_tokens
    return {
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat(),
        "version": cfg.version,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [
            {
                "timestamp": now,
                "dp_rank": 0,
                "num_running_reqs": running,
                "num_waiting_reqs": waiting,
                "num_used_tokens": used_tokens,
                "num_total_tokens": total,
                "token_usage": round(used_tokens / total, 4),
                "max_total_num_tokens": cfg.max_total_num_tokens,
                "max_running_requests": cfg.max_running,
            }
        ],
    }
