"""A server's usage report, judged before it is believed: counts no answer can have are flagged.

A server once reported completion_tokens 50,046 for max_tokens 64, and the run's output tokens came out
390x too high. An answer whose usage is impossible (a negative count, more completion tokens than the
max_tokens of all its choices, more reasoning tokens than completion tokens, a prompt longer than the
context or wildly longer than our exact count) keeps its text: the completion is data. Its usage is kept
out of every figure (the run's tokens, the server's speed, the drift), its line has null counts with the
server's report under `server_usage` and the reason under `usage_invalid`, and the summary says, per
server, how many answers it flagged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..fleet.state import ServerState
from ..http import ChatResult

# Our exact count may be off by a template or a reserve the learner absorbs (tokens.budget); a prompt the
# server counts more than this much beyond twice ours is not that.
PROMPT_SLACK = 1024


def usage_problem(result: ChatResult, max_tokens: int, n: int, input_tokens: int, context: int) -> str | None:
    """Why the usage of an answer to `n` choices of at most `max_tokens` each is impossible, or None."""
    counts = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens}
    counts["reasoning_tokens"] = result.reasoning_tokens
    for name, value in counts.items():
        if value is not None and value < 0:
            return f"{name} {value} is negative"
    used, prompt, thinking = result.completion_tokens, result.prompt_tokens, result.reasoning_tokens
    if used is not None and used > max_tokens * n:
        return f"completion_tokens {used} > max_tokens {max_tokens}" + (f" x n {n}" if n > 1 else "")
    if thinking is not None and used is not None and thinking > used:
        return f"reasoning_tokens {thinking} > completion_tokens {used}"
    if prompt is not None and prompt > context:
        return f"prompt_tokens {prompt} > the context length {context}"
    if prompt is not None and input_tokens > 0 and prompt > 2 * input_tokens + PROMPT_SLACK:
        return f"prompt_tokens {prompt} against our exact count {input_tokens}"
    return None


def server_usage(result: ChatResult) -> dict[str, Any]:
    """The usage the server reported, as it reported it (kept in a flagged line)."""
    fields = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens")
    return {f: getattr(result, f) for f in fields if getattr(result, f) is not None}


def usage_warnings(servers: Iterable[ServerState]) -> list[str]:
    """One summary warning per server whose answers were flagged (how many, the first one's reason)."""
    return [
        f"{s.url}: {s.bad_usage} answer(s) reported impossible usage (first: {s.bad_usage_first}); their token "
        "counts are left out of the figures, their lines have null counts and the server's report under server_usage"
        for s in servers
        if s.bad_usage
    ]
