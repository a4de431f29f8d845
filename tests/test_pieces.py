"""Counting a long prompt by its pieces (tokens/pieces.py) equals encoding it whole, on the real Qwen3 tokenizer
and the tiny one, for every request of the template-parity corpus under every cached template, and for texts
built to catch a wrong cut; and text many prompts share is encoded once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import QWEN3
from test_template_parity import CORPUS, STAND_INS, template_files

from gen_pipeline.tokens import TINY_TOKENIZER, encoded_lengths
from gen_pipeline.tokens import pieces as pieces_module
from gen_pipeline.tokens.conversation import server_view
from gen_pipeline.tokens.pieces import PieceLengths, marker_pattern
from gen_pipeline.tokens.render import ChatTemplate

TOKENIZERS = [p for p in (QWEN3, TINY_TOKENIZER) if (p / "tokenizer.json").exists()]
QWEN_MARKERS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|fim_pad|>"]


def backend(folder: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(autouse=True)
def cut_everything(monkeypatch):
    """Every text is cut into pieces, however short, so the short corpus exercises the cut too."""
    monkeypatch.setattr(pieces_module, "WHOLE_BELOW_CHARS", 0)
    monkeypatch.setattr(pieces_module, "MEMO_MIN_CHARS", 1)


def tricky_texts(seed: int, n: int) -> list[str]:
    """Texts with markers where a wrong cut shows: adjacent, glued to words and white space, half-written,
    doubled, nested in another marker's text, and beside NFC-sensitive and byte-level-odd characters."""
    rng = random.Random(seed)
    odd = ["<|im_sta", "rt|>", "<", "|>", " ", "  ", "\n", "\n\n", "\t", "word", "Word", "e\u0301", "é", "日本"]
    atoms = [*QWEN_MARKERS, *odd, "🎉", "\ufffd", "'s", "123", "<|im_start|><|im_start|>", "<thin", "k>", "<<think>>"]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 60))) for _ in range(n)]


@pytest.mark.parametrize("folder", TOKENIZERS, ids=lambda p: p.name)
def test_pieces_count_as_the_whole_text_on_texts_built_to_catch_a_wrong_cut(folder):
    """2,000 texts of markers, half markers, white space and odd characters: the same count both ways."""
    tok = backend(folder)
    texts = tricky_texts(7, 2000)
    assert PieceLengths(tok, encoded_lengths)(texts) == encoded_lengths(tok, texts)


@pytest.mark.skipif(not template_files(), reason="the llama.cpp chat templates are not cached")
@pytest.mark.parametrize("folder", TOKENIZERS, ids=lambda p: p.name)
def test_pieces_count_as_the_whole_text_for_every_template_and_request(folder):
    """Every request of the parity corpus, rendered by every cached template (and a long shared system
    prompt before it): the count by pieces equals the whole text's."""
    tok = backend(folder)
    system = {"role": "system", "content": "You are a careful assistant. <think> Rules: " + "be exact. " * 300}
    texts = []
    for path in template_files():
        template = ChatTemplate(path.read_text(encoding="utf-8"), STAND_INS)
        for request in CORPUS.values():
            for chat in (request, [system, *request] if isinstance(request, list) else request):
                try:
                    texts.append(template.render_view(server_view(chat, content_format=template.content_format)))
                except Exception:
                    continue  # the template refuses this request: nothing to count
    assert len(texts) > 500
    counter = PieceLengths(tok, encoded_lengths)
    assert counter(texts) == encoded_lengths(tok, texts)
    assert counter(texts) == encoded_lengths(tok, texts)  # again, from the memo


@pytest.mark.skipif(not (QWEN3 / "tokenizer.json").exists(), reason="no Qwen3 tokenizer")
def test_a_shared_system_prompt_is_encoded_once(monkeypatch):
    """500 prompts sharing a 20k-character system prompt: the encoder sees it once, and only each row's own
    text besides (it saw all of every row before)."""
    monkeypatch.setattr(pieces_module, "WHOLE_BELOW_CHARS", 2_000)
    monkeypatch.setattr(pieces_module, "MEMO_MIN_CHARS", 256)
    tok = backend(QWEN3)
    system = "Follow these rules. " * 1000
    texts = [f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nQuestion {i}?<|im_end|>\n"
             f"<|im_start|>assistant\n" for i in range(500)]  # fmt: skip
    seen: list[int] = []

    def encode(tokenizer: Any, batch: list[str]) -> list[int]:
        seen.append(sum(map(len, batch)))
        return encoded_lengths(tokenizer, batch)

    counter = PieceLengths(tok, encode)
    assert counter(texts[:250]) + counter(texts[250:]) == encoded_lengths(tok, texts)
    assert sum(seen) < len(system) + 500 * 40 < sum(map(len, texts)) // 10


def test_a_tokenizer_whose_marker_strips_white_space_is_counted_whole():
    """A raw added token with lstrip/rstrip moves the cut: no pattern, every text encoded whole."""
    from tokenizers import AddedToken

    tok = backend(TINY_TOKENIZER)
    assert marker_pattern(tok) is not None
    tok.add_special_tokens([AddedToken("<sep>", lstrip=True, normalized=False)])
    assert marker_pattern(tok) is None
    texts = ["a <sep> b", "x  <sep>"]
    assert PieceLengths(tok, encoded_lengths)(texts) == encoded_lengths(tok, texts)
