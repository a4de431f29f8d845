"""What a chat template is given: a request's messages, tools and template kwargs, shaped as the server
shapes them before it calls `apply_chat_template(messages, tools=..., add_generation_prompt=True,
**chat_template_kwargs)` (../shared/reference/server-api.md §1.6).

A conversation is a plain message list or a `Conversation` (messages, tools, template kwargs); counters
and the renderer take either. `server_view` applies what the server does to the messages first:
- content None or absent becomes "";
- content given as a list of parts: the text parts (`text`, `input_text`) are joined into one string for a
  "string"-format template, with one space on SGLang and a newline on vLLM and llama.cpp; an
  "openai"-format template (it loops over `message['content']`, or names image/audio/video/vision) gets
  the list back as `{"type": "text", "text": ...}` parts. Any other part is an RequestShapeError
  ("multimodal content is not supported"): this client counts text only;
- SGLang and vLLM join a tool turn's text parts into one string for every template;
- vLLM and llama.cpp keep only the fields they know of a message (`_vllm_fields`, `_llamacpp_fields`)
  and of each tool (`server_tools`); content None becomes "" (vLLM: [] for an "openai"-format template);
- SGLang 0.5.23 hands the template its pydantic dump of each tool (`"defer_loading": null` added), renders
  no tool for `tool_choice` "none" and only the named one for a named tool_choice (`chosen_tools`);
- an assistant turn's `tool_calls[].function.arguments` given as a JSON string is parsed into the object
  the templates expect (SGLang and vLLM); arguments that are not a JSON object are an RequestShapeError;
- SGLang turns a final assistant turn with text content into a user turn (no continue_final_message here);
- when the template raises with OpenAI-wrapped tools, SGLang renders again with the bare function objects
  (`flat_tools`; Mistral-style templates want those).
Other fields (`name`, `tool_call_id`, `reasoning_content`, ...) pass through as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestShapeError

SERVER_KINDS = ("sglang", "vllm", "llamacpp")
TEXT_PARTS = ("text", "input_text")
PART_JOINER = {"sglang": " ", "vllm": "\n", "llamacpp": "\n"}
MEDIA_WORDS = ("image", "audio", "video", "vision")  # SGLang: such a template gets content as parts
CONTENT_LOOP_NAMES = ("message", "msg", "m")


@dataclass(frozen=True)
class Conversation:
    """One request as the template sees it: messages, plus the request's tools and chat_template_kwargs."""

    messages: Sequence[Any]
    tools: Sequence[Any] | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_choice: Any = None  # the request's tool_choice: which tools SGLang renders (None: "auto")


ChatInput = Sequence[Any] | Conversation


@dataclass(frozen=True)
class ServerView:
    """A request after the server's own normalisation: what reaches apply_chat_template."""

    messages: list[Any]
    tools: list[Any] | None
    template_kwargs: dict[str, Any]


def server_view(
    chat: ChatInput,
    tools: Any = None,
    template_kwargs: Mapping[str, Any] | None = None,
    content_format: str = "string",
    server: str = "sglang",
) -> ServerView:
    """The request `server` would render for `chat` (a Conversation's own tools and kwargs win)."""
    tool_choice = None
    if isinstance(chat, Conversation):
        tools = chat.tools if chat.tools is not None else tools
        template_kwargs = {**(template_kwargs or {}), **chat.template_kwargs}
        tool_choice = chat.tool_choice
        chat = chat.messages
    messages = [_message(m, content_format, server) for m in chat]
    if server == "sglang" and messages and _is_text_assistant(messages[-1]):
        messages[-1] = {"role": "user", "content": messages[-1]["content"]}
    if server == "sglang" and tools is not None:
        tools = chosen_tools(tools, tool_choice)
    return ServerView(messages, None if tools is None else server_tools(tools, server), dict(template_kwargs or {}))


def answered_view(view: ServerView, answer: dict[str, Any], content_format: str, server: str) -> ServerView:
    """`view` (a request as the server shaped it) with its answer as the last turn, as the server shapes an
    assistant turn of the history: the whole conversation, for a trainer's render."""
    return ServerView([*view.messages, _message(answer, content_format, server)], view.tools, view.template_kwargs)


def chosen_tools(tools: list[Any], tool_choice: Any) -> list[Any] | None:
    """The tools SGLang renders for a tool_choice (serving_chat: none for "none", the named one alone for
    {"type": "function", "function": {"name": ...}}, all of them otherwise)."""
    if tool_choice == "none":
        return None
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not isinstance(function, dict):
        return tools
    named = [t for t in tools if isinstance(t, dict) and _function(t).get("name") == function.get("name")]
    return named or None


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    return function if isinstance(function, dict) else {}


def flat_tools(view: ServerView, server: str) -> ServerView | None:
    """The view SGLang renders when the first render raised: tools without their OpenAI wrapper."""
    if server != "sglang" or not view.tools:
        return None
    tools = [t["function"] if isinstance(t, dict) and "function" in t else t for t in view.tools]
    return ServerView(view.messages, tools, view.template_kwargs)


def _message(m: Any, content_format: str, server: str) -> Any:
    """One message as the server hands it to the template."""
    if not isinstance(m, dict):
        return m  # the template input check refuses it, as transformers does
    m = _vllm_fields(m) if server == "vllm" else _llamacpp_fields(m) if server == "llamacpp" else dict(m)
    content = m.get("content")
    if content is None:
        m["content"] = [] if content_format == "openai" and server == "vllm" else ""
    elif isinstance(content, list):
        texts = _texts(content)
        if content_format == "openai" and not (server in ("sglang", "vllm") and m.get("role") == "tool"):
            m["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            m["content"] = join_texts(texts, server)
    if isinstance(m.get("tool_calls"), list) and server in ("sglang", "vllm"):
        m["tool_calls"] = [_tool_call(c) for c in m["tool_calls"]]
    return {k: v for k, v in m.items() if v is not None}


def _vllm_fields(m: dict[str, Any]) -> dict[str, Any]:
    """The fields vLLM (0.32: chat_completion/protocol.py, renderers/chat_utils.py) keeps of a message:
    role, content, an assistant's non-empty tool_calls and `reasoning` (a `reasoning_content` is renamed
    so where there is no `reasoning`; the template gets it under both names), a tool turn's tool_call_id,
    and a string name."""
    role = m.get("role")
    out: dict[str, Any] = {"role": role, "content": m.get("content")}
    reasoning = m.get("reasoning") if m.get("reasoning") is not None else m.get("reasoning_content")
    if role == "assistant":
        if m.get("tool_calls"):
            out["tool_calls"] = list(m["tool_calls"])
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    if role == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _llamacpp_fields(m: dict[str, Any]) -> dict[str, Any]:
    """The fields llama.cpp (common/chat.cpp) parses a message into and gives the template: role, content,
    non-empty tool_calls, reasoning_content (not `reasoning`), tool_call_id and a string name."""
    out: dict[str, Any] = {k: m[k] for k in ("role", "content", "reasoning_content", "tool_call_id") if k in m}
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def server_tools(tools: list[Any], server: str) -> list[Any]:
    """The tools as the server hands them to the template: vLLM dumps its pydantic model of each, so the
    template sees {"type", "function": {"name", "description", "parameters"[, "strict"]}} in that order,
    absent fields as null and other fields dropped; llama.cpp rebuilds the same shape with an absent
    description as "" and no other field; SGLang dumps its own model (`_sglang_tool`)."""
    if server == "sglang":
        return [_sglang_tool(t) for t in tools]
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            out.append(tool)
            continue
        dumped = {k: function.get(k) for k in ("name", "description", "parameters")}
        if server == "llamacpp" and dumped["description"] is None:
            dumped["description"] = ""
        if function.get("strict") is not None and server == "vllm":
            dumped["strict"] = function["strict"]
        out.append({"type": tool.get("type", "function"), "function": dumped})
    return out


SGLANG_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def _sglang_tool(tool: Any) -> Any:
    """One tool as SGLang 0.5.23's `Tool.model_dump()` gives it to the template (entrypoints/openai/protocol.py):
    {"type", "function", "defer_loading"} with defer_loading null unless given (5 Qwen3 tokens a tool). The
    function keeps the client's key order, its known fields only; an absent description or parameters follows
    as null, an absent strict or defer_loading is left out, and the tool's defer_loading is copied into it."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return tool
    dumped = {k: function.get(k) for k in SGLANG_FUNCTION_FIELDS}
    if dumped["defer_loading"] is None:
        dumped["defer_loading"] = tool.get("defer_loading")
    kept = [k for k in dumped if k in ("description", "name", "parameters") or dumped[k] is not None]
    order = [k for k in function if k in kept] + [k for k in kept if k not in function]
    return {
        "type": tool.get("type", "function"),
        "function": {k: dumped[k] for k in order},
        "defer_loading": tool.get("defer_loading"),
    }


def content_texts(parts: list[Any]) -> list[str]:
    """The text of each content part; an image, audio or other part is an RequestShapeError."""
    return _texts(parts)


def _texts(parts: list[Any]) -> list[str]:
    """The text of each part; an image, audio or other part is refused."""
    texts: list[str] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in TEXT_PARTS:
            raise RequestShapeError(f"a {kind} content part needs a string 'text'")
        else:
            raise RequestShapeError(f"multimodal content is not supported (a content part of type {kind!r})")
    return texts


def join_texts(texts: list[str], server: str) -> str:
    """Text parts as one string, the way `server` joins them."""
    if server != "llamacpp":
        return PART_JOINER[server].join(texts)
    out = ""
    for text in texts:  # llama.cpp adds the newline only after text it already has
        out += ("\n" if out else "") + text
    return out


def _tool_call(call: Any) -> Any:
    """A tool call with its JSON-string arguments parsed, as SGLang and vLLM hand templates."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        raise RequestShapeError("an assistant tool call's function.arguments is not valid JSON") from None
    if not isinstance(arguments, dict):
        raise RequestShapeError("an assistant tool call's function.arguments must be a JSON object")
    return {**call, "function": {**function, "arguments": arguments}}


def _is_text_assistant(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str)


# What a request can carry beyond plain string turns, by the name drift messages give it.
SHAPES = ("tools", "chat_template_kwargs", "content parts", "tool calls", "tool turns", "reasoning_content", "name")


def shapes(chat: ChatInput) -> frozenset[str]:
    """The SHAPES one request has (none for plain string turns): what a drift message can blame."""
    found: set[str] = set()
    if isinstance(chat, Conversation):
        found.update(n for n, v in (("tools", chat.tools), ("chat_template_kwargs", chat.template_kwargs)) if v)
        chat = chat.messages
    for m in chat:
        if not isinstance(m, dict):
            continue
        if isinstance(m.get("content"), list):
            found.add("content parts")
        if m.get("tool_calls"):
            found.add("tool calls")
        if m.get("role") == "tool":
            found.add("tool turns")
        found.update(k for k in ("reasoning_content", "name") if m.get(k) is not None)
    return frozenset(found)


def content_format(env: Any, source: str) -> str:
    """ "openai" when the template wants content as a list of parts, else "string" (SGLang's detection)."""
    if any(word in source for word in MEDIA_WORDS):
        return "openai"
    import jinja2.nodes

    try:
        tree = env.parse(source)
    except Exception:
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        if any(_reads_content(loop.iter, name) for name in CONTENT_LOOP_NAMES):
            return "openai"
    return "string"


def _reads_content(node: Any, name: str) -> bool:
    """`name['content']` or `name.content`, possibly filtered, tested or sliced."""
    import jinja2.nodes as n

    if isinstance(node, (n.Filter, n.Test)):
        return node.node is not None and _reads_content(node.node, name)
    if isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
        return _reads_content(node.node, name)
    if isinstance(node, n.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, n.Const) and node.arg.value == "content"
    if isinstance(node, n.Getattr):
        return _is_name(node.node, name) and node.attr == "content"
    return False


def _is_name(node: Any, name: str) -> bool:
    import jinja2.nodes as n

    return isinstance(node, n.Name) and node.ctx == "load" and node.name == name
