"""SGLang's read-only endpoints as pure functions: /v1/models, /model_info, /server_info, /v1/loads
(the keys and values SGLang 0.5.23 answers with; tests/test_realserver_sglang.py compares them with a real one)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from .config import SimConfig


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
