"""Counting prompt tokens the way the server does, and the budget arithmetic built on the count.

SGLang and vLLM render `apply_chat_template(messages, add_generation_prompt=True)` with the model's own
Hugging Face template and encode the text without adding special tokens again, so rendering then
batch-encoding here gives exactly the server's `usage.prompt_tokens`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError
from .records import Messages

log = logging.getLogger(__name__)

TINY_TOKENIZER = Path(__file__).parent / "data" / "tiny-tokenizer"


class TokenCounter(Protocol):
    """Counts the chat prompt tokens of each conversation; an entry is an error text when it cannot."""

    name: str

    def count(self, conversations: Sequence[Messages]) -> list[int | str]: ...


class HFTokenCounter:
    """A Hugging Face tokenizer with its chat template, counting a batch at a time."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"tokenizer {name!r} has no chat template; the server would need one too")
        self.tokenizer = tokenizer
        self.name = name

    def count(self, conversations: Sequence[Messages]) -> list[int | str]:
        """Render every conversation, then encode all of them in one call."""
        try:
            texts: list[str] = self._render(list(conversations))
        except Exception:
            # One bad row must not sink its batch: find it by rendering one at a time.
            return [self._count_one(c) for c in conversations]
        return self._lengths(texts)

    def _lengths(self, texts: list[str]) -> list[int | str]:
        """Token counts of rendered prompts, without adding special tokens again."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: half the cost of the Python wrapper
            return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]
        ids = self.tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        return [len(x) for x in ids["input_ids"]]

    def _render(self, conversations: list[Messages]) -> list[str]:
        out = self.tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True)
        return [out] if isinstance(out, str) else list(out)

    def _count_one(self, messages: Messages) -> int | str:
        try:
            text = self._render([messages])[0]
        except Exception as exc:  # jinja raise_exception(), type errors in the template
            return f"chat template failed: {exc}"
        return self._lengths([text])[0]


def load_tokenizer(name_or_path: str) -> HFTokenCounter:
    """Load a tokenizer from a local folder or a hub name (the hub is tried only for non-paths)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc
    return HFTokenCounter(tok, name_or_path)


def clamp_max_tokens(
    requested: int,
    *,
    context_length: int,
    input_tokens: int,
    margin: int,
    min_tokens: int,
) -> int | None:
    """The max_tokens to send, or None when fewer than `min_tokens` fit.

    The margin absorbs the servers' off-by-ones: SGLang <= 0.5.9 rejects input + max_tokens >= context,
    and its scheduler rejects inputs of context - 6 or more.
    """
    room = context_length - input_tokens - margin
    budget = min(requested, room)
    return budget if budget >= min_tokens else None
