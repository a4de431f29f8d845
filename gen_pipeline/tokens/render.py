"""Rendering a chat template exactly as transformers' `apply_chat_template(..., tokenize=False)` does.

`compile_template` builds the environment transformers 5 builds (`utils/chat_template_utils.py`,
`_cached_compile_jinja_template`): an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
`{% generation %}` tag and loopcontrols extensions, its tojson filter, and its raise_exception,
strftime_now, dict and namespace globals. `ChatTemplate.render` hands the template what
apply_chat_template hands it: the server's view of the request (tokens/conversation.py), top-level None
values dropped, every value rebuilt from plain JSON types, reasoning copied under its three names, the
tokenizer's named special tokens overridden by the template kwargs, documents=None and
add_generation_prompt=True. tests/test_template_parity.py holds the two equal over the ~70 chat templates
of the llama.cpp source.

Whatever this renderer does not do itself goes to `fallback`, transformers' own apply_chat_template, when
one is set (tokens/counter.py sets it): any exception from our render (so a template's raise_exception
text is transformers' too), and template kwargs named like one of apply_chat_template's own parameters,
which transformers consumes instead of passing them to the template.

Every conversation is rendered in full: ~0.1 ms for a short prompt, and no cache to be wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from .conversation import ChatInput, ServerView, flat_tools, server_view

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# apply_chat_template's own parameters: template kwargs of these names never reach the template there
APPLY_PARAMETERS = frozenset(
    [
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    ]
)

Fallback = Callable[..., str]  # (view, add_generation_prompt=True) -> text


class NotRendered(Exception):
    """Our renderer leaves this request to transformers (raised out of render only without a fallback)."""


def compile_template(source: str) -> Any:
    """The template compiled in the environment transformers compiles it in (jinja2 >= 3.1.6 sandbox)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_tag(), jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _namespace_class()
    return env.from_string(source)


def _generation_tag() -> type:
    """transformers' AssistantTracker without the tracking: `{% generation %}` renders its body."""
    import jinja2
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja reads the class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context: Any, caller: Any) -> str:
            return str(caller())

    return GenerationTag


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' does not
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates, without attribute access to the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _namespace_class() -> type:
    """jinja's Namespace refusing underscore-prefixed names, as transformers' TemplateNamespace does."""
    import jinja2

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return TemplateNamespace


def plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types, as transformers' _plain_template_data does."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if kind is dict or isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if kind is list:
        return [plain(v) for v in value]
    if kind is tuple:
        return tuple(plain(v) for v in value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return f"<{kind.__name__}>"


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the template sees them: None values dropped, plain types, reasoning aliased."""
    if isinstance(messages, (list, tuple)) and not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict):
            raise TypeError(f"Chat messages should be dicts, dataclasses or pydantic models, but got {m!r}.")
        m = plain({k: v for k, v in m.items() if v is not None})
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def template_tools(tools: Any) -> list[Any] | None:
    """The tools as the template sees them (JSON schemas; transformers' callables do not come from JSON)."""
    if tools is None:
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError(
                "Tools should either be a JSON schema, or a callable function with type hints "
                "and a docstring suitable for auto-conversion to a schema."
            )
    return list(plain(list(tools)))


class ChatTemplate:
    """A chat template that renders requests as transformers would; see the module docstring."""

    def __init__(
        self, source: str, special_tokens: dict[str, str], *, server: str = "sglang", fallback: Fallback | None = None
    ) -> None:
        from .conversation import content_format

        self.source = source
        self.template = compile_template(source)
        self.special_tokens = dict(special_tokens)
        self.server = server
        self.content_format = content_format(self.template.environment, source)
        self.fallback = fallback

    def render(self, messages: ChatInput, tools: Any = None, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text the server renders for this request (add_generation_prompt=True)."""
        view = server_view(messages, tools, template_kwargs, self.content_format, self.server)
        try:
            return self._render_or_fallback(view)
        except Exception:
            if (flat := flat_tools(view, self.server)) is None:
                raise
            return self._render_or_fallback(flat)

    def _render_or_fallback(self, view: ServerView) -> str:
        try:
            return self.render_view(view)
        except Exception:
            if self.fallback is None:
                raise
            return self.fallback(view)

    def render_view(self, view: ServerView, add_generation_prompt: bool = True) -> str:
        """Our own render of a request the server has already shaped (without the generation prompt: a
        conversation that ends with its answer, as a trainer renders it)."""
        if APPLY_PARAMETERS.intersection(view.template_kwargs):
            raise NotRendered("a template kwarg is one of apply_chat_template's own parameters")
        kwargs = plain({**self.special_tokens, **view.template_kwargs})
        out: str = self.template.render(
            messages=template_messages(view.messages),
            tools=template_tools(view.tools),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return out
