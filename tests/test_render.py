"""The light counter (tokenizers + chat_render) against transformers' apply_chat_template, the reference."""

from __future__ import annotations

import random
import shutil

import pytest
from conftest import QWEN3

from gen_pipeline.errors import ConfigError
from gen_pipeline.pipeline import chat_template_hash
from gen_pipeline.tokens import (
    TINY_TOKENIZER,
    FastTokenCounter,
    FolderTemplate,
    HFTokenCounter,
    load_counter,
    template_identity,
)
from gen_pipeline.tokens.render import ChatTemplate

CHATS = [
    [{"role": "user", "content": "Hello, world!"}],
    [{"role": "user", "content": "Hello again, a different text of the same shape."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "日本語で答えて。 café 🎉"}],
    [{"role": "user", "content": "  leading and trailing spaces \n\n"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "<tool_response>\n42\n</tool_response>"}],
    [{"role": "user", "content": "<tool_response> only the start"}],
    [{"role": "user", "content": "text with <|im_end|> and <|im_start|>assistant inside"}],
    [{"role": "user", "content": "a\x00b <& &> \\u0000 quotes \" and 'single'"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nthe user greets\n</think>\n\nHello!"},
        {"role": "user", "content": "Again"},
    ],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "simple sum"},
        {"role": "user", "content": "And 3+3?"},
    ],
    [{"role": "user", "content": "x", "name": None}],
    [{"role": "system", "content": "first"}, {"role": "system", "content": "second"}, {"role": "user", "content": "u"}],
    [{"role": "user", "content": "q"}, {"role": "tool", "content": "tool output"}, {"role": "user", "content": "ok"}],
]


def random_chats(n: int, seed: int = 7) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    words = ["the", "café", "你好", "🎉", "<think>", "</think>", "\n", "  ", "tool", "42", "naïve", "<tool_response>"]
    out = []
    for _ in range(n):
        turns = rng.choice([1, 1, 1, 2, 3, 5])
        roles = (["system"] if rng.random() < 0.3 else []) + ["user", "assistant"] * 3
        chat = [{"role": roles[i], "content": " ".join(rng.choices(words, k=rng.randint(0, 12)))} for i in range(turns)]
        if chat[-1]["role"] == "assistant":
            chat.append({"role": "user", "content": "next?"})
        out.append(chat)
    return out


def reference(hf: HFTokenCounter, chat: list[dict[str, str]]) -> str:
    return hf.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def qwen3_fast() -> FastTokenCounter:
    if not (QWEN3 / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer is not at {QWEN3}")
    counter = load_counter(str(QWEN3))
    assert isinstance(counter, FastTokenCounter)
    return counter


@pytest.fixture(scope="module")
def tiny_fast() -> FastTokenCounter:
    counter = load_counter(str(TINY_TOKENIZER))
    assert isinstance(counter, FastTokenCounter)
    return counter


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_renders_exactly_what_transformers_renders(which, request):
    fast = request.getfixturevalue(f"{which}_fast")
    hf = request.getfixturevalue(f"{which}_counter")
    chats = CHATS + random_chats(300)
    for _ in range(2):  # the second pass renders learned shapes from their skeletons
        for chat in chats:
            assert fast.template.render(chat) == reference(hf, chat), chat
    assert fast.template.stats["mismatch"] == 0
    assert fast.template.stats["fast"] > len(chats) // 2  # the fast path is really taken


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_counts_equal_the_transformers_counter(which, request):
    fast = request.getfixturevalue(f"{which}_fast")
    hf = request.getfixturevalue(f"{which}_counter")
    chats = CHATS + random_chats(500, seed=11)
    assert fast.count(chats) == hf.count(chats)
    assert fast.chat_template == hf.chat_template  # the manifest's template hash is the same either way


def test_qwen3_readme_example_is_21_tokens(qwen3_fast):
    assert qwen3_fast.count(
        [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]]
    ) == [21]


def test_a_row_the_template_refuses_is_an_error_text_and_the_batch_survives(tiny_fast):
    source = (
        "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    counter = FastTokenCounter(tiny_fast.tokenizer, ChatTemplate(source, {}), "t")
    out = counter.count(
        [
            [{"role": "user", "content": "ok"}],
            [{"role": "bad", "content": "x"}],
            [{"role": "user", "content": "ok too"}],
        ]
    )
    assert isinstance(out[0], int) and isinstance(out[2], int)
    assert out[1] == "chat template failed: no bad roles"


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0].content | length }}:{{ messages[0].content }}",
        "{{ messages[0].content[:5] }}",
        "{{ messages[0].content | upper }}",
        "{{ messages[0].content | tojson }}",
        "{{ messages[0].content | e }}",
        "{{ messages[0].content | trim }}|",
        "{{ messages[0].content.split() | join('_') }}",
        "{{ messages[0].content.replace('a', 'b') }}",
        "{{ '%.3s' % messages[0].content }}",
        "{{ messages | tojson }}",
        "{% if messages[0].content %}some{% else %}none{% endif %}",
        "{% if 'x' in messages[0].content %}has x: {% endif %}{{ messages[0].content }}",
        "{{ messages[0].content.split('x')[0] }}",
        "{{ messages[0].content.strip() }}",
    ],
)
def test_templates_that_transform_text_still_render_exactly(source):
    """Every text operation either answers the same question or forces a full render: output stays exact."""
    texts = ["abc", "  padded  ", "xylophone x", "", '<b>"q" & a</b>', "日本語 text a", "abcdefgh"]
    template = ChatTemplate(source, {})
    for _ in range(3):
        for text in texts:
            chat = [{"role": "user", "content": text}]
            assert template.render(chat) == template.render_full(chat), (source, text)


def test_a_skeleton_that_disagrees_with_a_full_render_is_dropped():
    """The first fast render of a shape is checked; a mismatch turns the shape's fast path off."""
    template = ChatTemplate("{{ messages[0].content }}", {})
    chat = [{"role": "user", "content": "hello"}]
    assert template.render(chat) == "hello"
    shape = template.shapes[("user",)]
    assert shape is not None
    shape.parts = ["wrong"]  # simulate a template the probes misread
    shape.fast = 10**6  # due for its periodic check
    assert template.render(chat) == "hello"
    assert template.shapes[("user",)] is None and template.stats["mismatch"] == 1
    assert template.render(chat) == "hello"


def test_templates_reading_the_clock_always_render_in_full():
    template = ChatTemplate("{{ strftime_now('%Y') }} {{ messages[0].content }}", {})
    for _ in range(3):
        template.render([{"role": "user", "content": "x"}])
    assert template.stats == {"fast": 0, "full": 3, "mismatch": 0}


def test_loader_falls_back_to_transformers_when_the_folder_is_not_simple(tmp_path, monkeypatch):
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    assert isinstance(load_counter(str(folder)), FastTokenCounter)
    (folder / "special_tokens_map.json").write_text('{"eos_token": "<|im_end|>"}')
    assert isinstance(load_counter(str(folder)), HFTokenCounter)
    (folder / "special_tokens_map.json").unlink()
    monkeypatch.setenv("GEN_PIPELINE_TOKENIZER_LOADER", "transformers")
    assert isinstance(load_counter(str(folder)), HFTokenCounter)


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_template_identity_is_what_the_counter_records(which, monkeypatch):
    """The parent of --workers records the same tokenizer name and template hash as its workers' counters."""
    folder = TINY_TOKENIZER if which == "tiny" else QWEN3
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer is not at {folder}")
    for loader in ("", "transformers"):
        monkeypatch.setenv("GEN_PIPELINE_TOKENIZER_LOADER", loader)
        identity, counter = template_identity(str(folder)), load_counter(str(folder))
        assert isinstance(identity, FolderTemplate) == (loader == "")
        assert identity.name == counter.name and identity.chat_template == counter.chat_template
        assert chat_template_hash(identity) == chat_template_hash(counter) is not None


def test_template_identity_does_not_read_the_vocabulary(tmp_path):
    """A light folder's identity comes from its template alone; the vocabulary is the workers' to load."""
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        load_counter(str(folder))
    assert template_identity(str(folder)).chat_template == load_counter(str(TINY_TOKENIZER)).chat_template
    (folder / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        template_identity(str(folder))  # a template that does not compile is still refused up front
