"""How many requests to keep in flight on a server, and where that figure came from.

Never a silent guess: the figure is --concurrency, or what the server says (discovery.py: its reported
max_running_requests, else SGLang's /v1/loads or scheduler state), capped by its KV token pool, and only
when it says nothing at all DEFAULT_CONCURRENCY, named "default" in `check` and the summary.

The pool cap: SGLang admits a request only when its prompt plus its max_tokens (clipped at
SGLANG_CLIP_MAX_NEW_TOKENS) fit in the `max_total_num_tokens` pool beside the running ones, so with long
outputs the pool, not the running slots, decides how many run at once (../shared/reference/sglang-cpu.md,
measured on 0.5.23: 2048 slots, a pool of 8192 tokens, 8 requests of max_tokens 1000 ran at once). The cap
counts the run's max_tokens alone (prompts are unknown at start-up), at most the server's context (a request
holds no more), so it is an upper bound: what does not fit waits in the server's queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..config import DEFAULT_CONCURRENCY, RunConfig
from .discovery import ServerInfo

# SGLang's estimate of an admitted request's output (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default).
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
# A server whose capacity is the default guess but whose load is watched (fleet/loads.py: vLLM's /metrics) may be
# raised to this many times the guess while all it is sent runs: vLLM's own default is 256 running requests on
# most GPUs (1024 on the largest; --concurrency sets any figure, unwatched).
GUESS_GROWTH = 4
# Where a server's capacity came from, as `check` and the summary name it.
SOURCES = ("--concurrency", "reported", "loads endpoint", "scheduler state", "token pool", "default")


@dataclass(frozen=True)
class Capacity:
    """Requests in flight on one server (before worker processes share it), and the figure's source."""

    requests: int
    source: str
    reported: int | None = None  # the server's own running slots (None: it gives none)


def server_capacity(config: RunConfig, info: ServerInfo | None) -> Capacity:
    """The capacity of one server (None: it did not answer discovery)."""
    if config.concurrency:
        return Capacity(config.concurrency, "--concurrency", info.max_running_requests if info else None)
    if info is None:
        return Capacity(DEFAULT_CONCURRENCY, "default")
    slots = info.max_running_requests
    pool = pool_requests(info.max_total_num_tokens, config.max_tokens, info.context_length)
    if pool is not None and (slots is None or pool < slots):
        return Capacity(pool, "token pool", slots)
    if slots is not None:
        return Capacity(slots, info.running_source or "reported", slots)
    return Capacity(DEFAULT_CONCURRENCY, "default")


def guess_warning(guessed: list[str], ceilings: Mapping[str, int] | None = None) -> str | None:
    """The warning naming the servers whose capacity is the default (None: there are none); of them, those with
    a ceiling (their load is watched) start from the guess and follow what they run, up to it."""
    if not guessed:
        return None
    follow = [ceilings[url] for url in guessed if ceilings and url in ceilings]
    then = f"; {len(follow)} of them report their load and follow what they run, up to {max(follow)}" if follow else ""
    return (
        f"{len(guessed)} server(s) report no running slots and no KV pool: {DEFAULT_CONCURRENCY} requests in flight "
        f"each is a guess (--concurrency sets it){then}: {', '.join(guessed)}"
    )


def pool_requests(pool_tokens: int | None, max_tokens: int, context_length: int | None = None) -> int | None:
    """How many requests of `max_tokens` a KV pool of `pool_tokens` admits at once (None: unknown pool). A
    request never holds more than the context (its max_tokens is clamped to what the context leaves): a
    --max-tokens over a small context counted whole held a 512-token server to a quarter of what it ran."""
    if pool_tokens is None:
        return None
    held = min(max_tokens, SGLANG_CLIP_MAX_NEW_TOKENS, context_length or max_tokens)
    return max(1, pool_tokens // held)
