"""SGLang's read-only endpoints as pure functions: /v1/models, /model_info, /server_info."""

from __future__ import annotations

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
    """The /model_info body: no context length here, as in SGLang (`weight_version`: the port's now)."""
    return {
        "model_path": cfg.checkpoint_path,
        "tokenizer_path": cfg.tokenizer,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version or cfg.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "served_model_name": cfg.model,
    }


def server_info(cfg: SimConfig, port: int, started: float, weight_version: str | None = None) -> dict[str, Any]:
    """The /server_info body: resolved server args plus scheduler info."""
    speculative = cfg.reserved_tokens > 0
    return {
        "model_path": cfg.checkpoint_path,
        "tokenizer_path": cfg.tokenizer,
        "tokenizer_mode": "auto",
        "served_model_name": cfg.model,
        "host": "127.0.0.1",
        "port": port,
        "context_length": cfg.context_length if cfg.explicit_context_length else None,
        "max_running_requests": cfg.max_running,
        "max_queued_requests": cfg.max_queued,
        "allow_auto_truncate": False,
        "enable_cache_report": False,
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
        "internal_states": [{"max_total_num_tokens": cfg.max_total_num_tokens}],
        "version": cfg.version,
        "startup_time": started,
    }
