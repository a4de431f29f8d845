"""Rendering chat templates exactly as transformers' `apply_chat_template(tokenize=False)` does, but fast.

`ChatTemplate` compiles the model's template once in the same sandboxed Jinja environment transformers
builds (trim_blocks, lstrip_blocks, loopcontrols, its tojson/raise_exception/strftime_now/dict/namespace)
and renders with the same inputs (messages with None values dropped and reasoning fields aliased, the
tokenizer's named special tokens, tools=None, documents=None, add_generation_prompt=True).

Rendering the Qwen3 template costs ~90 us per short prompt, more than encoding it. Most training
prompts share a few shapes (the role sequence: "user", "system,user", ...), and most templates only
paste a message's text into the output and ask yes/no questions of it ("does it start with
<tool_response>?"). So for each shape `ShapeCache` renders once with *probe* texts that record every
question the template asks of them. A later conversation of that shape is rendered by asking its
texts the same questions: when every answer matches, the template took the same path, and the
output is the recorded skeleton with the texts pasted in. Any other use of a text (slicing, length,
upper(), JSON or HTML escaping, formatting) makes the shape uncacheable, and it is rendered in full.
Every shape's first fast render, and one in VERIFY_EVERY after it, is checked against a full render;
a mismatch disables the fast path for that shape. Templates that read the clock render in full.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

VERIFY_EVERY = 1000  # fast renders per shape between two checks against a full render
MAX_SHAPES = 4096
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# str methods whose answer is a bool or an int: recorded, and asked again of the real text
_QUESTIONS = frozenset(
    [
        "startswith",
        "endswith",
        "find",
        "rfind",
        "count",
        "isspace",
        "isalpha",
        "isdigit",
        "isalnum",
        "isupper",
        "islower",
        "istitle",
        "isnumeric",
        "isdecimal",
        "isidentifier",
        "isascii",
        "isprintable",
    ]
)
_STRIPS = frozenset(("strip", "lstrip", "rstrip"))  # allowed when they leave the text unchanged
_SPLITS = frozenset(("split", "rsplit"))  # allowed when the separator is absent


class Uncacheable(Exception):
    """The template uses a message's text in a way a skeleton cannot reproduce."""


def compile_template(source: str) -> Any:
    """The template compiled in an environment equivalent to transformers' (jinja2 >= 3.1.6 sandbox)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


def normalize(messages: Sequence[Any]) -> list[Any]:
    """What transformers hands the template: None values dropped, reasoning copied under its names."""
    out: list[Any] = []
    for m in messages:
        if isinstance(m, dict):
            m = {k: v for k, v in m.items() if v is not None}
            reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
            if reasoning is not None:
                m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class Probe(str):
    """A stand-in message text that records what the template asks of it."""

    trace: list[tuple[int, str, tuple[Any, ...], Any]]
    slot: int  # which message's text

    def __new__(cls, text: str, slot: int, trace: list[tuple[int, str, tuple[Any, ...], Any]]) -> Probe:
        obj = super().__new__(cls, text)
        obj.slot, obj.trace = slot, trace
        return obj

    def _plain(self) -> str:
        return str.__str__(self)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in ("slot", "trace"):
            return object.__getattribute__(self, name)
        plain = str.__str__(self)
        if name in _QUESTIONS:
            method = getattr(str, name)

            def ask(*args: Any) -> Any:
                answer = method(plain, *args)
                self.trace.append((self.slot, name, args, answer))
                return answer

            return ask
        if name in _STRIPS:

            def strip(*args: Any) -> Probe:
                if getattr(str, name)(plain, *args) != plain:
                    raise Uncacheable(name)
                self.trace.append((self.slot, name, args, None))
                return self

            return strip
        if name in _SPLITS:

            def split(sep: Any = None, maxsplit: int = -1) -> list[Any]:
                if sep is None or sep in plain:
                    raise Uncacheable(name)
                self.trace.append((self.slot, "__contains__", (sep,), False))
                return [self]

            return split
        raise Uncacheable(name)

    def __contains__(self, item: object) -> bool:
        answer = str.__contains__(self._plain(), item)  # type: ignore[operator]
        self.trace.append((self.slot, "__contains__", (item,), answer))
        return answer

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Probe):
            raise Uncacheable("==")
        answer = str.__eq__(self._plain(), other)
        self.trace.append((self.slot, "__eq__", (other,), answer))
        return answer is True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __bool__(self) -> bool:
        self.trace.append((self.slot, "__bool__", (), True))
        return True

    def __str__(self) -> str:
        return self._plain()

    def __add__(self, other: str) -> str:
        return self._plain() + other

    def __radd__(self, other: str) -> str:
        return other + self._plain()

    def __format__(self, spec: str) -> str:
        if spec:
            raise Uncacheable("format spec")
        return self._plain()

    def __hash__(self) -> int:
        raise Uncacheable("hash")

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise Uncacheable("text operation")

    __len__ = __getitem__ = __iter__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __mul__ = __rmul__ = __mod__ = __rmod__ = __repr__ = __reversed__ = _refuse


def _answer(text: str, op: str, args: tuple[Any, ...]) -> Any:
    if op in _STRIPS:
        return None if getattr(str, op)(text, *args) == text else "changed"
    if op == "__bool__":
        return bool(text)
    return getattr(str, op)(text, *args)


class Shape:
    """A recorded render: the questions asked of each text, and the output around the texts."""

    def __init__(self, trace: list[tuple[int, str, tuple[Any, ...], Any]], parts: list[str | int]) -> None:
        self.trace = trace
        self.parts = parts
        self.fast = 0  # fast renders since the last check

    def matches(self, texts: Sequence[str]) -> bool:
        return all(_answer(texts[i], op, args) == answer for i, op, args, answer in self.trace)

    def fill(self, texts: Sequence[str]) -> str:
        return "".join(texts[p] if isinstance(p, int) else p for p in self.parts)


class ChatTemplate:
    """Renders conversations as transformers would; shapes it has seen are rendered from a skeleton."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        self.source = source
        self.template = compile_template(source)
        self.kwargs = dict(special_tokens)
        self.cacheable = "strftime_now" not in source
        self.shapes: dict[tuple[str, ...], Shape | None] = {}
        self.stats = {"fast": 0, "full": 0, "mismatch": 0}

    def render_full(self, messages: Sequence[Any]) -> str:
        out: str = self.template.render(
            messages=normalize(messages), tools=None, documents=None, add_generation_prompt=True, **self.kwargs
        )
        return out

    def render(self, messages: Sequence[Any]) -> str:
        key = self._key(messages)
        if key is None:
            return self._full(messages)
        if key not in self.shapes:
            if len(self.shapes) >= MAX_SHAPES:
                return self._full(messages)
            self.shapes[key] = self._learn(key)
            verify = True
        else:
            verify = False
        shape = self.shapes[key]
        texts = [m["content"] for m in messages]
        if shape is None or not shape.matches(texts):
            return self._full(messages)
        shape.fast += 1
        if verify or shape.fast >= VERIFY_EVERY:
            shape.fast = 0
            return self._checked(key, shape, messages, texts)
        self.stats["fast"] += 1
        return shape.fill(texts)

    def _full(self, messages: Sequence[Any]) -> str:
        self.stats["full"] += 1
        return self.render_full(messages)

    def _checked(self, key: tuple[str, ...], shape: Shape, messages: Sequence[Any], texts: list[str]) -> str:
        full = self._full(messages)
        if shape.fill(texts) != full:
            self.stats["mismatch"] += 1
            self.shapes[key] = None
            log.warning("chat template shape %s rendered differently from its skeleton; rendering it in full", key)
        return full

    def _key(self, messages: Sequence[Any]) -> tuple[str, ...] | None:
        """The role sequence, when every message is exactly {"role": str, "content": str}."""
        if not self.cacheable:
            return None
        roles = []
        for m in messages:
            if not isinstance(m, dict) or len(m) != 2:
                return None
            role, content = m.get("role"), m.get("content")
            if type(role) is not str or type(content) is not str:
                return None
            roles.append(role)
        return tuple(roles)

    def _learn(self, roles: tuple[str, ...]) -> Shape | None:
        nonce = secrets.token_hex(8)
        marks = [f"\x00<&{nonce}:{i}&>\x00" for i in range(len(roles))]
        trace: list[tuple[int, str, tuple[Any, ...], Any]] = []
        probes = [
            {"role": r, "content": Probe(mark, i, trace)} for i, (r, mark) in enumerate(zip(roles, marks, strict=True))
        ]
        try:
            out = self.template.render(
                messages=probes, tools=None, documents=None, add_generation_prompt=True, **self.kwargs
            )
        except Exception:  # Uncacheable, or the template refused this shape: render such rows in full
            return None
        parts: list[str | int] = []
        pattern = re.compile("|".join(re.escape(m) for m in marks))
        pos = 0
        for match in pattern.finditer(out):
            parts.append(out[pos : match.start()])
            parts.append(marks.index(match.group()))
            pos = match.end()
        parts.append(out[pos:])
        if any(isinstance(p, str) and nonce in p for p in parts):
            return None  # a text came out escaped or cut: not a verbatim paste
        return Shape(trace, [p for p in parts if p != ""])
