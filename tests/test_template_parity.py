"""Our renderer against transformers' apply_chat_template(..., tokenize=False) on every real chat template
of the llama.cpp source distribution (vendor/llama.cpp/models/templates/*.jinja, kept in the llama cache by
run/llama/build.sh), over a corpus of whole requests: equal text for every pair, or both raise.

Both sides get the same server view of each request (SGLang's, with the content format detected for the
template), so what is compared is the rendering itself; tests/test_conversation.py covers the view.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gen_pipeline.tokens import TINY_TOKENIZER, load_tokenizer
from gen_pipeline.tokens.conversation import Conversation, ServerView, server_view
from gen_pipeline.tokens.render import ChatTemplate

CACHE = Path(os.environ.get("GEN_PIPELINE_CACHE") or Path.home() / ".cache" / "gen-pipeline")
TEMPLATES = Path(os.environ.get("LLAMA_CACHE") or CACHE / "llama") / "models" / "templates"  # as build.sh
# special tokens for templates that paste them: the tiny tokenizer has eos and pad; stand-ins for the rest
STAND_INS = {"bos_token": "<|bos|>", "unk_token": "<|unk|>", "sep_token": "<|sep|>", "cls_token": "<|cls|>"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city. Returns <tool_response>-wrapped JSON; {{ not a template }}",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
COHERE_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameter_definitions": {"city": {"description": "the city", "type": "str", "required": True}},
}
MARKUP = "<think>a</think> </think> <tool_response>r</tool_response> {{ x }} {% if y %} <|im_end|> [INST]"


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


TOOL_TURNS = [
    user("Weather in Zürich?"),
    assistant(None, tool_calls=[CALL]),
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
]
CORPUS: dict[str, list[Any] | Conversation] = {
    "one turn": [user("Hello, world!")],
    "system, non-ASCII": [{"role": "system", "content": "You are terse."}, user("日本語で答えて。 café 🎉 naïve")],
    "multi-turn": [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")],
    "markup-like text": [{"role": "system", "content": MARKUP}, user(MARKUP)],
    "think in history": [user("Hi"), assistant("<think>\nthe user greets\n</think>\n\nHello!"), user("Again")],
    "reasoning history": [user("2+2?"), assistant("4", reasoning_content="simple sum"), user("And 3+3?")],
    "empty text": [user("")],
    "content parts": [user([{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}])],
    "tools": Conversation([user("What can you do?")], tools=TOOLS),
    "system and tools": Conversation([{"role": "system", "content": "Be brief."}, user("Weather?")], tools=TOOLS),
    "tool-call turn": Conversation(TOOL_TURNS, tools=TOOLS),
    "after a tool call": Conversation([*TOOL_TURNS, assistant("It is 21 °C."), user("Thanks")], tools=TOOLS),
    "thinking off": Conversation([user("Hello")], template_kwargs={"enable_thinking": False}),
    "thinking on, tools": Conversation([user("Hello")], tools=TOOLS, template_kwargs={"enable_thinking": True}),
    # the flat tools SGLang retries with when the wrapped ones fail, and kwargs that older templates read
    "flat tools": Conversation(TOOL_TURNS, tools=[t["function"] for t in TOOLS]),
    "template variables": Conversation(
        [user("Hi")], template_kwargs={"functions": json.dumps(TOOLS), "datetime": "2024-07-26", "x": [1]}
    ),
    "cohere-style tools": Conversation([user("Weather?")], tools=[COHERE_TOOL]),
}


def template_files() -> list[Path]:
    return sorted(TEMPLATES.glob("*.jinja")) if TEMPLATES.is_dir() else []


@pytest.fixture(scope="module")
def reference() -> Any:
    """The transformers tokenizer every template is applied with (its chat_template is overridden)."""
    return load_tokenizer(str(TINY_TOKENIZER)).tokenizer


def outcome(render: Any) -> tuple[str, str]:
    """("ok", text) or ("raised", the exception's type)."""
    try:
        return "ok", render()
    except Exception as exc:
        return "raised", type(exc).__name__


def transformers_render(tokenizer: Any, source: str, view: ServerView) -> str:
    out: str = tokenizer.apply_chat_template(
        view.messages,
        tools=view.tools,
        chat_template=source,
        add_generation_prompt=True,
        tokenize=False,
        **STAND_INS,
        **view.template_kwargs,
    )
    return out


@pytest.mark.skipif(not template_files(), reason=f"the llama.cpp chat templates are not cached in {TEMPLATES}")
@pytest.mark.parametrize("path", template_files(), ids=lambda p: p.stem)
def test_every_request_renders_as_transformers_renders_it(path: Path, reference: Any) -> None:
    """Our text equals transformers' for every request of the corpus, or both raise."""
    source = path.read_text(encoding="utf-8")
    ours = ChatTemplate(source, {**reference.special_tokens_map, **STAND_INS})  # no fallback: ours alone
    rendered = 0
    for name, request in CORPUS.items():
        view = server_view(request, content_format=ours.content_format)
        theirs = outcome(lambda: transformers_render(reference, source, view))  # noqa: B023
        mine = outcome(lambda: ours.render_view(view))  # noqa: B023
        assert mine[0] == theirs[0], f"{name}: ours {mine}, transformers {theirs}"
        if mine[0] == "ok":
            assert mine[1] == theirs[1], name
            rendered += 1
    assert rendered > 0, "the template raised for the whole corpus"
