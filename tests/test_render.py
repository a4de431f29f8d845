"""The light counter (tokenizers + tokens.render) against transformers' apply_chat_template, the reference."""

from __future__ import annotations

import random
import shutil

import pytest
from conftest import QWEN3

from gen_pipeline.engine.setup import chat_template_hash
from gen_pipeline.errors import ConfigError
from gen_pipeline.tokens import (
    TINY_TOKENIZER,
    FastTokenCounter,
    FolderTemplate,
    HFTokenCounter,
    load_counter,
    template_identity,
)
from gen_pipeline.tokens.conversation import Conversation
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


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city; <tool_call> {{ not a template }}",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# whole requests: tools, template switches, content parts, tool-call history
REQUESTS = [
    Conversation([{"role": "user", "content": "Hello"}], template_kwargs={"enable_thinking": False}),
    Conversation([{"role": "user", "content": "Weather?"}], tools=TOOLS),
    Conversation(
        [
            {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "the tool said so"},
            {"role": "user", "content": "Thanks </think> {{ x }} {% if %}"},
        ],
        tools=TOOLS,
        template_kwargs={"enable_thinking": True},
    ),
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
    for chat in CHATS + random_chats(300):
        assert fast.template.render(chat) == reference(hf, chat), chat


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_counts_equal_the_transformers_counter(which, request):
    fast = request.getfixturevalue(f"{which}_fast")
    hf = request.getfixturevalue(f"{which}_counter")
    chats = [*CHATS, *REQUESTS, *random_chats(500, seed=11)]
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


def test_a_key_error_in_the_template_names_the_key_the_template_needs(tiny_fast):
    """A KeyError out of the template is said as such: the key it needs and that the input lacks it, not
    only the bare key ("chat template failed: 'messages'")."""
    counter = FastTokenCounter(tiny_fast.tokenizer, ChatTemplate("{{ '{messages}'.format(x=1) }}", {}), "t")
    [out] = counter.count([[{"role": "user", "content": "ok"}]])
    needs = "the template needs the key 'messages', which its input does not have (KeyError)"
    assert out == f"chat template failed: {needs}"


def test_loader_falls_back_to_transformers_when_the_folder_is_not_simple(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    assert isinstance(load_counter(str(folder)), FastTokenCounter)
    (folder / "special_tokens_map.json").write_text('{"eos_token": "<|im_end|>"}')
    assert isinstance(load_counter(str(folder)), HFTokenCounter)
    (folder / "special_tokens_map.json").unlink()
    assert isinstance(load_counter(str(folder), "transformers"), HFTokenCounter)


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_template_identity_is_what_the_counter_records(which):
    """The parent of --workers records the same tokenizer name and template hash as its workers' counters."""
    folder = TINY_TOKENIZER if which == "tiny" else QWEN3
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer is not at {folder}")
    for loader in ("auto", "transformers"):
        identity, counter = template_identity(str(folder), loader), load_counter(str(folder), loader)
        assert isinstance(identity, FolderTemplate) == (loader == "auto")
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


def test_the_generation_tag_renders_its_body():
    """Templates marking assistant turns with {% generation %} compile and render, as in transformers."""
    source = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    assert ChatTemplate(source, {}).render([{"role": "user", "content": "x"}]) == "[x]"


def test_what_our_render_cannot_do_goes_to_the_fallback():
    """An error in our render is the fallback's to answer; without one it is raised."""
    source = "{{ raise_exception('ours refuses') }}"
    seen = []
    template = ChatTemplate(source, {}, fallback=lambda view: seen.append(view) or "by transformers")
    assert template.render([{"role": "user", "content": "x"}], template_kwargs={"k": 1}) == "by transformers"
    assert seen[0].messages == [{"role": "user", "content": "x"}] and seen[0].template_kwargs == {"k": 1}
    with pytest.raises(Exception, match="ours refuses"):
        ChatTemplate(source, {}).render([{"role": "user", "content": "x"}])


def test_kwargs_that_apply_chat_template_consumes_are_rendered_by_transformers(tmp_path):
    """`documents` in the template kwargs reaches transformers' template as documents: the light counter
    hands such requests to transformers and counts what it renders."""
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    (folder / "chat_template.jinja").write_text("{{ documents | tojson }}{{ messages[0].content }}")
    fast, hf = load_counter(str(folder)), load_counter(str(folder), "transformers")
    assert isinstance(fast, FastTokenCounter) and isinstance(hf, HFTokenCounter)
    request = Conversation([{"role": "user", "content": "x"}], template_kwargs={"documents": [{"title": "t"}]})
    assert fast.template.render(request) == hf.render(request) == '[{"title": "t"}]x'
    assert fast.count([request]) == hf.count([request])


def test_a_template_that_refuses_wrapped_tools_is_rendered_with_flat_ones_as_sglang_does(tmp_path):
    """SGLang renders again with the bare function objects when the OpenAI-wrapped tools make the template raise."""
    source = "{% for t in tools %}{{ t.name + ':' + t.description }}{% endfor %}|{{ messages[0].content }}"
    folder = tmp_path / "tok"
    shutil.copytree(TINY_TOKENIZER, folder)
    (folder / "chat_template.jinja").write_text(source)
    request = Conversation([{"role": "user", "content": "x"}], tools=TOOLS)
    expected = "get_weather:" + TOOLS[0]["function"]["description"] + "|x"
    hf = load_counter(str(folder), "transformers")
    assert isinstance(hf, HFTokenCounter)
    assert ChatTemplate(source, {}).render(request) == hf.render(request) == expected
    with pytest.raises(Exception, match="has no attribute"):
        ChatTemplate(source, {}, server="vllm").render(request)
