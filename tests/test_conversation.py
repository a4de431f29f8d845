"""The server's view of a request: message shapes normalised as SGLang, vLLM and llama.cpp do it."""

from __future__ import annotations

import pytest

from gen_pipeline.errors import RequestShapeError
from gen_pipeline.tokens.conversation import Conversation, content_format, server_view
from gen_pipeline.tokens.render import compile_template

PARTS = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}


def user(content):
    return {"role": "user", "content": content}


@pytest.mark.parametrize(
    ("server", "fmt", "message", "expected"),
    [
        ("sglang", "string", user(PARTS), user("a b")),  # SGLang joins text parts with one space
        ("vllm", "string", user(PARTS), user("a\nb")),  # vLLM with a newline
        ("llamacpp", "string", user(PARTS), user("a\nb")),
        ("llamacpp", "string", user([{"type": "text", "text": ""}, *PARTS]), user("a\nb")),  # no newline after ""
        ("sglang", "openai", user(PARTS), user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
        ("sglang", "openai", {"role": "tool", "content": PARTS}, {"role": "tool", "content": "a b"}),
        ("vllm", "openai", {"role": "tool", "content": PARTS[:1]}, {"role": "tool", "content": "a"}),  # vLLM 0.32 joins
        ("sglang", "string", {"role": "user", "content": None, "name": None}, user("")),  # None content is ""
        ("sglang", "string", {"role": "user"}, user("")),
        ("vllm", "string", {"role": "user", "content": None}, {"role": "user", "content": ""}),
        (
            "sglang",
            "string",
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"x": 1}}}],
            },
        ),
        (
            "sglang",
            "string",
            {"role": "tool", "tool_call_id": "c1", "content": "42", "name": "f"},
            {"role": "tool", "tool_call_id": "c1", "content": "42", "name": "f"},
        ),
    ],
)
def test_message_shapes_table(server, fmt, message, expected):
    """Each shape a server accepts comes out the way that server hands it to the template."""
    view = server_view([message, user("next")], content_format=fmt, server=server)
    assert view.messages[0] == expected


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (user([{"type": "image_url", "image_url": {"url": "x"}}]), "multimodal content is not supported"),
        (user([{"type": "input_audio", "input_audio": {}}]), "multimodal content is not supported"),
        (user(["bare string"]), "multimodal content is not supported"),
        (user([{"type": "text"}]), "needs a string 'text'"),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}]},
            "not valid JSON",
        ),
        ({"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]}, "JSON object"),
    ],
)
def test_shapes_the_server_refuses_are_input_errors(message, error):
    """Non-text parts and unusable tool-call arguments are refused with a reason, never sent uncounted."""
    with pytest.raises(RequestShapeError, match=error):
        server_view([message, user("next")])


def test_a_final_assistant_turn_becomes_a_user_turn_on_sglang():
    """SGLang renders a trailing assistant text turn as a user turn (no continue_final_message)."""
    chat = [user("q"), {"role": "assistant", "content": "partial", "reasoning_content": "r"}]
    assert server_view(chat, server="sglang").messages[-1] == user("partial")
    assert server_view(chat, server="vllm").messages[-1]["role"] == "assistant"


def test_a_conversation_carries_its_own_tools_and_kwargs():
    """A Conversation's tools and kwargs win over the ones given beside it; kwargs merge."""
    tools = [{"type": "function", "function": {"name": "f"}}]
    conv = Conversation([user("q")], tools=tools, template_kwargs={"enable_thinking": False})
    view = server_view(conv, tools=[{"other": 1}], template_kwargs={"enable_thinking": True, "x": 1})
    assert [t["function"]["name"] for t in view.tools] == ["f"]
    assert view.template_kwargs == {"enable_thinking": False, "x": 1}
    plain = server_view([user("q")], tools=tools, template_kwargs={"x": 1})
    assert [t["function"]["name"] for t in plain.tools] == ["f"] and plain.template_kwargs == {"x": 1}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
        (
            "{% for message in messages %}{% for c in message['content'] %}{{ c.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        ("{% for message in messages %}{% for c in message.content | list %}{{ c }}{% endfor %}{% endfor %}", "openai"),
        ("{{ 'image' }}{{ messages[0].content }}", "openai"),  # SGLang's shortcut for multimodal templates
    ],
)
def test_content_format_detection(source, expected):
    """A template that loops over message content (or names media) gets parts; the rest get strings."""
    assert content_format(compile_template(source).environment, source) == expected


def test_vllm_keeps_the_message_and_tool_fields_it_knows():
    """vLLM 0.32 passes `reasoning` (else `reasoning_content`) under both names, drops unknown fields, and
    hands the template its pydantic dump of each tool (absent fields null, fixed key order)."""
    turn = {"role": "assistant", "content": None, "reasoning": "r", "reasoning_content": "x", "extra": 1}
    alone = {"role": "assistant", "content": "a", "reasoning_content": "x"}
    assert server_view([alone], server="vllm").messages[0]["reasoning"] == "x"
    tool = {"function": {"parameters": {}, "name": "f", "more": 2}}
    view = server_view([user("q"), turn], tools=[tool], server="vllm")
    assert view.messages[1] == {"role": "assistant", "content": "", "reasoning": "r", "reasoning_content": "r"}
    assert view.tools == [{"type": "function", "function": {"name": "f", "description": None, "parameters": {}}}]
    assert list(view.tools[0]["function"]) == ["name", "description", "parameters"]


def test_sglang_renders_its_pydantic_dump_of_each_tool():
    """SGLang 0.5.23 hands the template Tool.model_dump(): "defer_loading": null on every tool, the function's
    own key order with an absent description/parameters as null, unknown fields dropped, strict kept only
    when set, and the tool's defer_loading copied into its function."""
    tool = {"function": {"parameters": {}, "name": "f", "more": 2}}
    [dumped] = server_view([user("q")], tools=[tool], server="sglang").tools
    assert dumped == {"type": "function", "function": {"parameters": {}, "name": "f", "description": None},
                      "defer_loading": None}  # fmt: skip
    assert list(dumped) == ["type", "function", "defer_loading"]
    assert list(dumped["function"]) == ["parameters", "name", "description"]
    strict = {"type": "function", "defer_loading": True, "function": {"name": "g", "strict": True, "description": "d"}}
    [dumped] = server_view([user("q")], tools=[strict], server="sglang").tools
    assert dumped["function"] == {"name": "g", "strict": True, "description": "d", "parameters": None,
                                  "defer_loading": True}  # fmt: skip
    assert dumped["defer_loading"] is True


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [
        (None, ["f", "g"]),
        ("auto", ["f", "g"]),
        ("required", ["f", "g"]),
        ("none", None),
        ({"type": "function", "function": {"name": "g"}}, ["g"]),
        ({"type": "function", "function": {"name": "nope"}}, None),
    ],
)
def test_sglang_renders_the_tools_its_tool_choice_leaves(tool_choice, names):
    """tool_choice "none" renders no tool on SGLang, a named choice only that tool; vLLM renders them all."""
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    chat = Conversation([user("q")], tools, {}, tool_choice)
    view = server_view(chat, server="sglang")
    assert (None if view.tools is None else [t["function"]["name"] for t in view.tools]) == names
    assert len(server_view(chat, server="vllm").tools or []) == 2
