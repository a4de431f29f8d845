"""Counting a long prompt from its pieces, so that text many prompts share is encoded once.

A Hugging Face tokenizer first cuts its input at the added tokens that are matched on the raw text
(`normalized: false`: the chat template's markers, `<|im_start|>`, `<|im_end|>`, `<think>`, ...), leftmost
and longest first, then normalizes, pre-tokenizes and encodes each piece between them on its own; each
marker is one token. So a text's count is the sum of its pieces' counts plus one per marker, exactly, as long
as we cut where the tokenizer cuts: at the same tokens, matched the same way (a regex alternation tried
longest first is leftmost-longest), none of them stripping the white space beside it (`lstrip`, `rstrip`,
`single_word`), which would move the cut. A tokenizer with such a marker is counted whole, as before.

A shared system prompt, few-shot block or earlier turn is one piece (the template puts markers around each
message), so a memo of long pieces' counts makes the encoding work proportional to the distinct text.
tests/test_pieces.py holds the counts equal to whole-text encoding on the real Qwen3 tokenizer and every
template of the parity set.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# Texts shorter than this are encoded whole: cutting a short prompt costs more than it saves.
WHOLE_BELOW_CHARS = 2_000
# Pieces at least this long have their counts remembered (shorter ones are a row's own text).
MEMO_MIN_CHARS = 256
# How much remembered text at the most (characters); the memo starts afresh beyond it.
MEMO_MAX_CHARS = 64_000_000

Lengths = Callable[[Any, list[str]], list[int]]


def marker_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """The regex that cuts a text where `tokenizer` cuts it at raw-text added tokens, as one capturing group;
    None when the tokenizer has none, or has one that strips the white space beside it."""
    try:
        added = list(tokenizer.get_added_tokens_decoder().values())
    except AttributeError:
        return None
    raw = [a for a in added if not a.normalized]
    if not raw or any(a.lstrip or a.rstrip or a.single_word for a in raw):
        return None
    contents = sorted({a.content for a in raw if a.content}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")")


class PieceLengths:
    """Token counts of rendered prompts: long ones counted piece by piece, each long piece encoded once."""

    def __init__(self, tokenizer: Any, encode: Lengths) -> None:
        self.tokenizer = tokenizer
        self.encode = encode  # counter.encoded_lengths: (tokenizer, texts) -> counts, no special tokens added
        self.pattern = marker_pattern(tokenizer)
        self.memo: dict[str, int] = {}
        self.memo_chars = 0

    def __call__(self, texts: list[str]) -> list[int]:
        if self.pattern is None:
            return self.encode(self.tokenizer, texts)
        whole = [i for i, t in enumerate(texts) if len(t) < WHOLE_BELOW_CHARS]
        out = [0] * len(texts)
        for i, n in zip(whole, self.encode(self.tokenizer, [texts[i] for i in whole]), strict=True):
            out[i] = n
        cut = [i for i, t in enumerate(texts) if len(t) >= WHOLE_BELOW_CHARS]
        parts = [self.pattern.split(texts[i]) for i in cut]
        counts = self._count_pieces({p for split in parts for p in split[0::2] if p})
        for i, split in zip(cut, parts, strict=True):
            out[i] = len(split) // 2 + sum(counts[p] for p in split[0::2] if p)  # one token per marker
        return out

    def _count_pieces(self, pieces: set[str]) -> dict[str, int]:
        """Each piece's count: remembered, else encoded (and remembered when long)."""
        counts = {p: n for p in pieces if (n := self.memo.get(p)) is not None}
        new = [p for p in pieces if p not in counts]
        for piece, n in zip(new, self.encode(self.tokenizer, new), strict=True):
            counts[piece] = n
            if len(piece) >= MEMO_MIN_CHARS:
                self._remember(piece, n)
        return counts

    def _remember(self, piece: str, n: int) -> None:
        if self.memo_chars + len(piece) > MEMO_MAX_CHARS:
            self.memo.clear()
            self.memo_chars = 0
        self.memo[piece] = n
        self.memo_chars += len(piece)
