"""Token counting and the budget arithmetic."""

from __future__ import annotations

import pytest

from gen_pipeline.tokens import clamp_max_tokens

CTX = 8192


@pytest.mark.parametrize(
    ("requested", "input_tokens", "margin", "min_tokens", "expected"),
    [
        (256, 100, 16, 16, 256),  # fits: the request stands
        (8192, 100, 16, 16, CTX - 100 - 16),  # max_tokens = context: clamped
        (8192, 0, 0, 1, CTX),  # no margin, no input: the whole context
        (8192, 8191, 0, 1, 1),  # input + max_tokens = context exactly
        (8192, 8190, 1, 1, 1),  # input + max_tokens = context - 1, the safe client rule
        (8192, 8192, 0, 1, None),  # nothing left
        (256, 30000 - 22000 + 100, 16, 16, 76),  # clamped below the request
        (256, 8100, 16, 100, None),  # 76 of room is below min_tokens
        (256, 8100, 16, 76, 76),  # exactly min_tokens fits
    ],
)
def test_clamp_table(requested, input_tokens, margin, min_tokens, expected):
    """The budget is min(requested, context - input - margin), or None under min_tokens."""
    got = clamp_max_tokens(
        requested,
        context_length=CTX,
        input_tokens=input_tokens,
        margin=margin,
        min_tokens=min_tokens,
    )
    assert got == expected
    if got is not None:
        assert input_tokens + got + margin <= CTX


def test_chat_template_counts_are_what_the_server_counts(qwen3_counter):
    """The Qwen3 count equals the ids the real template produces (README example: 21 tokens)."""
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello, world!"},
    ]
    assert qwen3_counter.count([msgs]) == [21]
    ids = qwen3_counter.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert len(ids) == 21


def test_batch_count_equals_one_at_a_time(tiny_counter):
    """Counting a batch gives the same numbers as counting each conversation alone."""
    convs = [[{"role": "user", "content": "word " * n + "café 你好"}] for n in range(1, 40, 7)]
    batch = tiny_counter.count(convs)
    single = [tiny_counter.count([c])[0] for c in convs]
    assert batch == single
    assert all(isinstance(n, int) and n > 5 for n in batch)


def test_template_overhead_is_counted(tiny_counter):
    """The chat template's own tokens are part of the count (the 30k + 256 in 32768 trap)."""
    text = "hello there"
    bare = len(tiny_counter.tokenizer(text, add_special_tokens=False)["input_ids"])
    [templated] = tiny_counter.count([[{"role": "user", "content": text}]])
    assert templated > bare


def test_shipped_tiny_tokenizer_is_reproducible(tmp_path, tiny_counter):
    """Rebuilding the shipped tokenizer from its script gives the same ids."""
    from gen_pipeline.tiny_tokenizer import build
    from gen_pipeline.tokens import load_tokenizer

    rebuilt = load_tokenizer(str(build(tmp_path / "tok")))
    convs = [[{"role": "user", "content": "The quick brown fox, café ünïcode 你好 12345"}]]
    a = tiny_counter.tokenizer.apply_chat_template(convs[0], add_generation_prompt=True, tokenize=False)
    b = rebuilt.tokenizer.apply_chat_template(convs[0], add_generation_prompt=True, tokenize=False)
    assert a == b
    assert tiny_counter.tokenizer(a)["input_ids"] == rebuilt.tokenizer(b)["input_ids"]


def test_counts_equal_apply_chat_template_tokenize(qwen3_counter):
    """Over varied chats (multi-turn, special-token text, non-ASCII) the count equals tokenize=True."""
    chats = [
        [{"role": "user", "content": "<think>hmm</think> what is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "日本語で答えて。"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! <|im_end|> How can I help?"},
            {"role": "user", "content": "  spaces\n\nand\ttabs  "},
        ],
    ]
    tok = qwen3_counter.tokenizer
    expected = []
    for chat in chats:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        expected.append(len(ids["input_ids"] if not isinstance(ids, list) else ids))
    assert qwen3_counter.count(chats) == expected


def test_encoding_in_chunks_gives_the_same_counts(tiny_counter):
    """Long batches are encoded a few hundred thousand characters at a time; the counts do not change."""
    from gen_pipeline.tokens import encoded_lengths

    backend = tiny_counter.tokenizer.backend_tokenizer
    texts = [("café words " * n) + "你好" for n in range(1, 60)]
    whole = encoded_lengths(backend, texts, chunk_chars=10**9)
    assert encoded_lengths(backend, texts, chunk_chars=50) == whole
    assert encoded_lengths(backend, texts, chunk_chars=1) == whole
    assert whole == [len(backend.encode(t, add_special_tokens=False).ids) for t in texts]
    assert encoded_lengths(backend, []) == []
