"""Reading the numbers out of the servers' context-length errors (SGLang, vLLM and llama.cpp).

The pre-flight count makes these rare; they still happen when the server counts differently
(speculative-decoding reserve, a different chat template). Patterns follow
shared/reference/server-api.md §4; they are mutually exclusive, so the first match is the only one.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import OverflowCounts

CTX_ERROR_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern)
    for name, pattern in {
        # SGLang (the input count includes EAGLE reserved tokens when speculative decoding is on)
        "sglang.total": r"Requested token count exceeds the model's maximum context length of "
        r"(?P<ctx>\d+) tokens\. You requested a total of (?P<total>\d+) tokens: (?P<input>\d+) "
        r"tokens from the input messages and (?P<output>\d+) tokens for the completion",
        "sglang.input": r"The input \((?P<input>\d+) tokens\) is longer than the model's context "
        r"length \((?P<ctx>\d+) tokens\)",
        "sglang.sched": r"Input length \((?P<input>\d+) tokens\) exceeds the maximum allowed length "
        r"\((?P<max_input>\d+) tokens\)",
        "sglang.maxtok": r"max_completion_tokens is too large: (?P<output>\d+)\.\s*This model "
        r"supports at most (?P<ctx>\d+) completion tokens",
        # vLLM, every release line
        "vllm.legacy.total": r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested "
        r"(?P<total>\d+) tokens \((?P<input>\d+) in the messages, (?P<output>\d+) in the completion\)",
        "vllm.legacy.input": r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested "
        r"(?P<input>\d+) tokens in the (?:messages|input)",
        "vllm.v011.input": r"maximum context length is (?P<ctx>\d+) tokens\. However, your request "
        r"has (?P<input>\d+) input tokens",
        "vllm.v011.total": r"is too large: (?P<output>\d+)\. This model's maximum context length is "
        r"(?P<ctx>\d+) tokens and your request has (?P<input>\d+) input tokens",
        "vllm.v016.tokens": r"You passed (?P<input>\d+) input tokens and requested (?P<output>\d+) "
        r"output tokens\. However, the model's context length is only (?P<ctx>\d+) tokens, "
        r"resulting in a maximum input length of (?P<max_input>\d+) tokens",
        "vllm.v018.total": r"maximum context length is (?P<ctx>\d+) tokens\. However, you requested "
        r"(?P<output>\d+) output tokens and your prompt contains (?P<lb>at least )?(?P<input>\d+) "
        r"input tokens",
        "vllm.v033.input": r"maximum context length is (?P<ctx>\d+) tokens\. However, your prompt "
        r"contains (?P<lb>at least )?(?P<input>\d+) input tokens",
        "vllm.maxtok_gt_ctx": r"(?P<param>max_tokens|max_completion_tokens)=(?P<output>\d+) cannot "
        r"be greater than max_model_len=(?P<ctx>\d+)",
        "vllm.engine": r"The decoder prompt \(length (?P<input>\d+)\) (?:plus the number of "
        r"requested output tokens \(at least 1\) )?is longer than the maximum model length of "
        r"(?P<ctx>\d+)",
        # llama.cpp (its JSON fields n_prompt_tokens / n_ctx are preferred when present)
        "llamacpp.new": r"request \((?P<input>\d+) tokens\) exceeds the available context size "
        r"\((?P<ctx>\d+) tokens\)",
        "llamacpp.nosplit": r"input \((?P<input>\d+) tokens\) is larger than the max context size "
        r"\((?P<ctx>\d+) tokens\)",
    }.items()
}
# Context errors that carry no counts: old llama.cpp wording, vLLM's character check, mid-decode.
NO_COUNT_OVERFLOW = re.compile(
    r"exceeds the available context size|Context size has been exceeded|"
    r"prompt contains \d+ characters|input characters"
)


def error_message(body: Any) -> str:
    """The message of an error body in any server's envelope (flat SGLang, nested vLLM/llama.cpp)."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(message := inner.get("message"), str):
            return message
        if isinstance(inner, str):
            return inner
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return "" if body is None else str(body)[:500]


def _int(value: Any) -> int | None:
    return int(value) if value is not None else None


def parse_overflow(body: Any) -> OverflowCounts | None:
    """The counts a context-length error states, or None when the body is not such an error."""
    inner = body.get("error") if isinstance(body, dict) else None
    if (
        isinstance(inner, dict)
        and inner.get("type") == "exceed_context_size_error"
        and "n_prompt_tokens" in inner
        and "n_ctx" in inner
    ):
        return OverflowCounts(
            pattern="llamacpp.fields",
            context_length=_int(inner["n_ctx"]),
            input_tokens=_int(inner["n_prompt_tokens"]),
        )
    message = error_message(body)
    for name, pattern in CTX_ERROR_PATTERNS.items():
        m = pattern.search(message)
        if m:
            groups = m.groupdict()
            return OverflowCounts(
                pattern=name,
                context_length=_int(groups.get("ctx")),
                input_tokens=_int(groups.get("input")),
                output_tokens=_int(groups.get("output")),
                max_input=_int(groups.get("max_input")),
                lower_bound=bool(groups.get("lb")),
            )
    if NO_COUNT_OVERFLOW.search(message):
        return OverflowCounts(pattern="no_counts")
    return None
