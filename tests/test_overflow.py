"""Every context-length message format the servers use, parsed into numbers."""

from __future__ import annotations

import pytest

from gen_pipeline.errors import BadRequestError, ContextOverflowError
from gen_pipeline.http import status_error
from gen_pipeline.http.overflow import error_message, parse_overflow


def sglang(message: str) -> dict:
    return {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def nested(message: str, **extra) -> dict:
    return {
        "error": {
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
            **extra,
        }
    }


CASES = [
    (
        "sglang.total",
        sglang(
            "Requested token count exceeds the model's maximum context length of 8192 tokens. "
            "You requested a total of 9000 tokens: 808 tokens from the input messages and 8192 "
            "tokens for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        ),
        dict(context_length=8192, input_tokens=808, output_tokens=8192),
    ),
    (
        "sglang.input",
        sglang("The input (9000 tokens) is longer than the model's context length (8192 tokens)."),
        dict(context_length=8192, input_tokens=9000),
    ),
    (
        "sglang.sched",
        sglang(
            "Input length (8190 tokens) exceeds the maximum allowed length (8186 tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        ),
        dict(input_tokens=8190, max_input=8186),
    ),
    (
        "sglang.maxtok",
        sglang("max_completion_tokens is too large: 9000.This model supports at most 8192 completion tokens."),
        dict(context_length=8192, output_tokens=9000),
    ),
    (
        "vllm.legacy.total",
        sglang(
            "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens "
            "(200 in the messages, 4000 in the completion). Please reduce the length of the messages "
            "or completion."
        ),
        dict(context_length=4096, input_tokens=200, output_tokens=4000),
    ),
    (
        "vllm.legacy.input",
        sglang(
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "in the messages, Please reduce the length of the messages."
        ),
        dict(context_length=4096, input_tokens=5000),
    ),
    (
        "vllm.v011.input",
        nested(
            "This model's maximum context length is 4096 tokens. However, your request has 5000 "
            "input tokens. Please reduce the length of the input messages."
        ),
        dict(context_length=4096, input_tokens=5000),
    ),
    (
        "vllm.v011.total",
        nested(
            "'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum "
            "context length is 4096 tokens and your request has 200 input tokens (4000 > 4096 - 200)."
        ),
        dict(context_length=4096, input_tokens=200, output_tokens=4000),
    ),
    (
        "vllm.v016.tokens",
        nested(
            "You passed 300 input tokens and requested 4000 output tokens. However, the model's "
            "context length is only 4096 tokens, resulting in a maximum input length of 96 tokens. "
            "Please reduce the length of the input prompt."
        ),
        dict(context_length=4096, input_tokens=300, output_tokens=4000, max_input=96),
    ),
    (
        "vllm.v018.total",
        nested(
            "This model's maximum context length is 4096 tokens. However, you requested 4000 output "
            "tokens and your prompt contains at least 300 input tokens, for a total of at least 4300 "
            "tokens. Please reduce the length of the input prompt or the number of requested output "
            "tokens. (parameter=input_tokens, value=300)"
        ),
        dict(context_length=4096, input_tokens=300, output_tokens=4000, lower_bound=True),
    ),
    (
        "vllm.v033.input",
        nested(
            "This model's maximum context length is 4096 tokens. However, your prompt contains 5000 "
            "input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt. (parameter=input_tokens, value=5000)"
        ),
        dict(context_length=4096, input_tokens=5000, lower_bound=False),
    ),
    (
        "vllm.maxtok_gt_ctx",
        nested(
            "max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output "
            "tokens. (parameter=max_tokens, value=5000)"
        ),
        dict(context_length=4096, output_tokens=5000),
    ),
    (
        "vllm.engine",
        nested(
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens."
        ),
        dict(context_length=4096, input_tokens=5000),
    ),
    (
        "llamacpp.new",
        {
            "error": {
                "code": 400,
                "message": "request (3000 tokens) exceeds the available context size (2048 tokens), try increasing it",
                "type": "invalid_request_error",
            }
        },
        dict(context_length=2048, input_tokens=3000),
    ),
    (
        "llamacpp.nosplit",
        {
            "error": {
                "code": 400,
                "message": "input (3000 tokens) is larger than the max context size (2048 tokens). skipping",
                "type": "invalid_request_error",
            }
        },
        dict(context_length=2048, input_tokens=3000),
    ),
    (
        "llamacpp.fields",
        {
            "error": {
                "code": 400,
                "message": "request (3001 tokens) exceeds the available context size (2048 tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 3000,
                "n_ctx": 2048,
            }
        },
        dict(context_length=2048, input_tokens=3000),  # the JSON fields win over the text
    ),
]


@pytest.mark.parametrize(("pattern", "body", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_format_parses(pattern, body, expected):
    """Each server's context message yields its numbers, through the pattern meant for it."""
    counts = parse_overflow(body)
    assert counts is not None
    assert counts.pattern == pattern
    for field, value in expected.items():
        assert getattr(counts, field) == value, field


@pytest.mark.parametrize(
    "message",
    [
        "the request exceeds the available context size, try increasing it",
        "Context size has been exceeded.",
        "This model's maximum context length is 4096 tokens. However, your prompt contains 90000 "
        "characters (more than 40000 characters, which is the upper bound for 4096 input tokens).",
    ],
)
def test_overflow_without_counts(message):
    """Context errors that state no counts are still recognised, with no numbers."""
    counts = parse_overflow(nested(message))
    assert counts is not None and counts.pattern == "no_counts" and counts.input_tokens is None


def test_other_400_is_a_bad_request():
    """A 400 that is not about length is a bad request, not an overflow."""
    body = sglang("LoRA adapter 'x' was requested, but LoRA is not enabled.")
    assert parse_overflow(body) is None
    assert isinstance(status_error(400, body, "s"), BadRequestError)
    assert not isinstance(status_error(400, body, "s"), ContextOverflowError)


def test_patterns_are_mutually_exclusive():
    """No message of one format is matched by another format's pattern."""
    from gen_pipeline.http.overflow import CTX_ERROR_PATTERNS

    for pattern, body, _ in CASES:
        if pattern == "llamacpp.fields":
            continue
        text = error_message(body)
        matching = [name for name, rx in CTX_ERROR_PATTERNS.items() if rx.search(text)]
        assert matching == [pattern]
