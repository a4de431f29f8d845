"""A conversation rendered whole: its answer as the last turn, no generation prompt. It is the text a
trainer tokenizes (SpecForge's pre-formatted rows; speculators renders each assistant turn so), rendered
by the run's own counter, so the part before the answer is the prompt the counter counted and the server
was sent (for the templates that render an earlier turn the same whether or not more follows).

`reasoning_shape` says how a template writes an answer's reasoning into its assistant turn (Qwen3:
"<think>\\n" + reasoning + "\\n</think>\\n\\n" before the answer), found by rendering a probe answer.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..errors import ConfigError
from .conversation import ChatInput, ServerView, answered_view, flat_tools, server_view
from .counter import FastTokenCounter, HFTokenCounter, TemplateIdentity, TokenCounter, hf_render

# what a template's answer looks like when it shows no reasoning of its own (Qwen3 and DeepSeek-R1's way)
DEFAULT_SHAPE = ("<think>\n", "\n</think>\n\n")
_PROBE = ("\x02reasoning\x03", "\x02answer\x03")


def chat_template_hash(counter: TemplateIdentity) -> str | None:
    """The chat template's identity as a run's manifest records it (`chat_template_sha256`)."""
    template = counter.chat_template
    return hashlib.sha256(str(template).encode()).hexdigest()[:16] if template else None


def render_whole(counter: TokenCounter, chat: ChatInput, answer: dict[str, Any]) -> str:
    """The text of `chat` (as the server shaped it) followed by `answer`, as `counter` renders."""
    content_format, server = _shaping(counter)
    whole = answered_view(
        server_view(chat, content_format=content_format, server=server), answer, content_format, server
    )
    try:
        return _render(counter, whole)
    except Exception:
        if (flat := flat_tools(whole, server)) is None:
            raise
        return _render(counter, flat)


def reasoning_shape(counter: TokenCounter) -> tuple[str, str]:
    """What the template writes before an answer's reasoning and between it and the answer; DEFAULT_SHAPE
    when it does not show reasoning (or cannot render the probe)."""
    reasoning, answer = _PROBE
    question = [{"role": "user", "content": "?"}]
    probe = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    try:
        prompt = _prompt(counter, question)
        text = render_whole(counter, question, probe)
    except Exception:
        return DEFAULT_SHAPE
    start, between = text.find(reasoning), text.find(answer)
    if not text.startswith(prompt) or not len(prompt) <= start < between:
        return DEFAULT_SHAPE
    return text[len(prompt) : start], text[start + len(reasoning) : between]


def _prompt(counter: TokenCounter, chat: ChatInput) -> str:
    """The prompt text the counter counts for `chat` (with the generation prompt)."""
    if isinstance(counter, FastTokenCounter):
        return counter.template.render(chat)
    assert isinstance(counter, HFTokenCounter)
    return counter.render(chat)


def _shaping(counter: TokenCounter) -> tuple[str, str]:
    """The content format and server kind the counter shapes requests with."""
    if isinstance(counter, FastTokenCounter):
        return counter.template.content_format, counter.template.server
    if isinstance(counter, HFTokenCounter):
        return counter.content_format, counter.server
    raise ConfigError(f"tokenizer {counter.name!r}: no chat template to render conversations with")


def _render(counter: TokenCounter, view: ServerView) -> str:
    if isinstance(counter, FastTokenCounter):
        template = counter.template
        try:
            return template.render_view(view, add_generation_prompt=False)
        except Exception:
            if template.fallback is None:
                raise
            return template.fallback(view, add_generation_prompt=False)
    assert isinstance(counter, HFTokenCounter)
    return hf_render(counter.tokenizer, view, add_generation_prompt=False)
