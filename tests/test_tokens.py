"""Token counting with the Hugging Face tokenizers."""

from __future__ import annotations


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
