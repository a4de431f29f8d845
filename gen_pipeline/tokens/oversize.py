"""Rows too long to be worth tokenizing: over_length from their size alone.

One token of a byte-level BPE tokenizer (Qwen, Llama 3, GPT-2 and their kin) covers at most L bytes of the
normalized text, L being its longest vocabulary entry, so a prompt whose rendered, normalized text has B
bytes has at least ceil(B / L) tokens, whatever they are. When that floor already leaves no room for
--min-tokens, the row is over_length and the tokenizer never sees it (a 20 MB row took 49 s and 4.3 GB).

The floor holds only where every byte of the text is covered by tokens: a byte-level pre-tokenizer that
drops nothing, and no added token that swallows the whitespace around it (lstrip/rstrip). Other
tokenizers, and counters that are not a Hugging Face tokenizer, get no floor: every row is counted.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from .conversation import ChatInput, Conversation

UTF8_MAX = 4  # bytes of the longest UTF-8 character: a text of n characters has at most 4n bytes
UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def _backend(counter: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a counter, or None."""
    tok = getattr(counter, "tokenizer", None)
    backend = getattr(tok, "backend_tokenizer", tok)
    return backend if hasattr(backend, "get_added_tokens_decoder") else None


def longest_token_bytes(backend: Any) -> int | None:
    """The most text bytes one token covers, when the tokenizer is byte-level and loses no byte; else None."""
    try:
        pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    except (AttributeError, TypeError, ValueError):
        return None
    text = json.dumps(pre)
    if '"ByteLevel"' not in text or '"Removed"' in text or '"Whitespace' in text:
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(a.lstrip or a.rstrip for a in added):
        return None
    # a byte-level vocabulary entry spells one byte per character; an added token is matched as its text
    regular = max(map(len, backend.get_vocab(with_added_tokens=False)), default=0)
    return max([regular, *(len(a.content.encode("utf-8")) for a in added)]) or None


def text_chars(chat: ChatInput) -> int:
    """The characters of a conversation's message text (string content and text parts)."""
    messages = chat.messages if isinstance(chat, Conversation) else chat
    chars = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return chars


class SizeFloor:
    """A lower bound on a prompt's token count from its size, for rows far too long to count."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.backend = _backend(counter)
        self._longest: int | None = 0  # 0: not read yet (reading a 150k vocabulary takes 0.5 s)

    @property
    def longest(self) -> int | None:
        """longest_token_bytes of the counter's tokenizer (None: no floor), read when first needed."""
        if self._longest == 0:
            self._longest = longest_token_bytes(self.backend) if self.backend is not None else None
        return self._longest

    def tokens_over(self, messages: ChatInput, fit: int) -> int | None:
        """A floor above `fit` on the prompt's tokens, or None when its size cannot prove one (count it)."""
        if self.backend is None:
            return None
        chars = text_chars(messages)
        if UTF8_MAX * chars <= fit or self.longest is None or UTF8_MAX * chars <= self.longest * fit:
            return None  # the usual row: too short for its size alone to say anything
        text = self._render(messages)
        if text is None:
            return None
        text = self._normalized(text)
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        floor = -(-size // self.longest)
        return floor if floor > fit else None

    def _normalized(self, text: str) -> str:
        """The text as the tokenizer's normalizer leaves it (NFC and the like may shorten it)."""
        normalizer = self.backend.normalizer
        if normalizer is None:
            return text
        form = json.loads(normalizer.__getstate__()).get("type")
        if form in UNICODE_FORMS:  # Python's own: instant on ASCII, where the Rust one takes 3.5 s and 750 MB on 20 MB
            return unicodedata.normalize(form, text)
        return str(normalizer.normalize_str(text))

    def _render(self, messages: ChatInput) -> str | None:
        """The chat prompt text, rendered as the counter does; None when it cannot be."""
        try:
            template = getattr(self.counter, "template", None)
            if template is not None:
                return str(template.render(messages))
            return str(self.counter.render(messages))  # HFTokenCounter: the server's view, then transformers
        except Exception:  # the counter reports a template failure itself, as bad_input
            return None
