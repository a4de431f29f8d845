"""All token arithmetic: the max_tokens a prompt is sent with, the smaller one after a context 400, and
the learned gap between the server's count and ours. Pure functions (and one small learner), tested as
tables in tests/test_budget.py.

The margin absorbs the servers' off-by-ones: SGLang <= 0.5.9 rejects input + max_tokens >= context, and
its scheduler rejects inputs of context - 6 or more (../shared/reference/server-api.md §1.2 C).
"""

from __future__ import annotations

from collections import Counter

from ..config import MAX_LEARNED_OFFSET, OFFSET_EVIDENCE, RunConfig
from ..errors import OverflowCounts

# SGLang's scheduler refuses inputs of context - 6 tokens or more (server-api.md §1.2 C).
SGLANG_INPUT_HEADROOM = 7
# ... and quietly trims max_tokens to max_req_len - 1 - input (§1.3), where its input cap max_req_input_len
# is max_req_len - 5: at most cap + 4 - input tokens are made, whatever the context leaves.
SGLANG_TRIM_OVER_CAP = 4


def clamp_max_tokens(
    requested: int,
    *,
    context_length: int,
    input_tokens: int,
    margin: int,
    min_tokens: int,
    max_input: int | None = None,
) -> int | None:
    """The max_tokens to send, or None when fewer than `min_tokens` fit or the servers refuse a prompt of
    `input_tokens` (SGLang's `max_req_input_len`: inputs of that many tokens or more)."""
    if max_input is not None and input_tokens >= max_input:
        return None
    budget = min(requested, room_for(context_length, input_tokens, margin, max_input))
    return budget if budget >= min_tokens else None


def room_for(context_length: int, input_tokens: int, margin: int, max_input: int | None) -> int:
    """The most tokens a prompt of `input_tokens` may be sent with: what the context leaves less the margin,
    and never more than SGLang's scheduler would make of it (it trims the rest without a word, so a budget
    over that recorded a max_tokens no answer could reach: seen with --safety-margin 0)."""
    room = context_length - input_tokens - margin
    return room if max_input is None else min(room, max_input + SGLANG_TRIM_OVER_CAP - input_tokens)


def prompt_budget(
    config: RunConfig, context_length: int, input_tokens: int, row_max_tokens: int | None, max_input: int | None = None
) -> int | None:
    """The max_tokens generate sends for a prompt of `input_tokens`, or None when it is over length
    (`max_input`: the fleet's input cap, FleetInfo.input_limit)."""
    return clamp_max_tokens(
        row_max_tokens or config.max_tokens,
        context_length=context_length,
        input_tokens=input_tokens,
        margin=config.safety_margin,
        min_tokens=room_needed(config, row_max_tokens),
        max_input=max_input,
    )


def room_needed(config: RunConfig, row_max_tokens: int | None) -> int:
    """The least room a prompt is sent with: --min-tokens, or what a row asks for when that is less
    (a 5-token label row is sent, never over_length)."""
    return min(config.min_tokens, row_max_tokens or config.min_tokens)


def dispatch_budget(
    config: RunConfig,
    context_length: int,
    input_tokens: int,
    row_max_tokens: int | None,
    offset: int,
    at_least: bool = False,
    max_input: int | None = None,
) -> int | str:
    """The budget at dispatch (our count plus the learned offset), or why the prompt is over length
    (`at_least`: the count is a lower bound from the row's size, not a count)."""
    counted = input_tokens + offset
    budget = prompt_budget(config, context_length, counted, row_max_tokens, max_input)
    if budget is not None:
        return budget
    room = room_for(context_length, counted, config.safety_margin, max_input)
    size = f"prompt has {f'at least {input_tokens} (from its size, not counted)' if at_least else input_tokens} "
    if max_input is not None and counted >= max_input:
        return f"{size}tokens (+{offset} learned offset); the servers refuse inputs of {max_input} tokens or more"
    return (
        f"{size}tokens (+{offset} learned offset); "
        f"context {context_length} - margin {config.safety_margin} leaves {room}, "
        f"below --min-tokens {room_needed(config, row_max_tokens)}"
        if room == context_length - counted - config.safety_margin
        else f"{size}tokens (+{offset} learned offset); the servers make at most {room} tokens after it (their "
        f"input cap {max_input} + {SGLANG_TRIM_OVER_CAP}), below --min-tokens {room_needed(config, row_max_tokens)}"
    )


def rebudget(
    counts: OverflowCounts,
    *,
    sent_max_tokens: int,
    context_length: int,
    margin: int,
    min_tokens: int,
    counted: int | None = None,
) -> int | None:
    """A smaller max_tokens that the server's own numbers say will fit, or None when none will.

    None means the prompt itself is too long for the server (or the error gave no usable counts),
    so resending cannot help. An error that names the context but not the input (max_tokens alone over it:
    SGLang's "max_completion_tokens is too large", vLLM's "cannot be greater than max_model_len") is fitted
    with our own exact count, `counted`.
    """
    given = counts.input_tokens
    if given is None and counts.context_length is not None:
        given = counted
    if given is None or counts.lower_bound or counts.max_input is not None:
        return None
    ctx = min(context_length, counts.context_length or context_length)
    if given > ctx - SGLANG_INPUT_HEADROOM:
        return None
    # -1: SGLang <= 0.5.9 refuses input + max_tokens == context; the margin covers the rest.
    room = ctx - given - max(margin, 1)
    budget = min(room, sent_max_tokens - 1)
    return budget if budget >= min_tokens else None


class OffsetLearner:
    """Learns a constant gap between the server's input count and ours.

    SGLang with speculative decoding adds its reserved draft tokens to the count in its 400 messages,
    so every near-limit row would 400 once. When the same positive gap is seen OFFSET_EVIDENCE times,
    budgets include it from then on.
    """

    def __init__(self) -> None:
        self.seen: Counter[int] = Counter()
        self.offset = 0

    def observe(self, ours: int, counts: OverflowCounts) -> None:
        """Note one overflow where both counts are known exactly."""
        if counts.input_tokens is None or counts.lower_bound:
            return
        gap = counts.input_tokens - ours
        if 0 < gap <= MAX_LEARNED_OFFSET:
            self.seen[gap] += 1
            if self.seen[gap] >= OFFSET_EVIDENCE and gap > self.offset:
                self.offset = gap
