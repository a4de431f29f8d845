"""The server side of token counting: what SGLang would count for a chat or a completions prompt."""

from __future__ import annotations

import asyncio

from ..tokens import FastTokenCounter, HFTokenCounter
from ..tokens.conversation import Conversation
from ..tokens.counter import failure_text
from . import sglang
from .sglang import GenRequest

LONG_TEXT_CHARS = 20_000  # count longer prompts in a thread so one does not stall every port


def conversation(req: GenRequest) -> Conversation:
    """A chat request as its template renders it: messages, tools and chat_template_kwargs."""
    return Conversation(req.messages or [], req.tools, req.template_kwargs or {}, req.tool_choice)


class ServerCounter:
    """Counts prompts with the served tokenizer, plus the template tokens the client cannot see.

    Chat prompts are counted by `light` when given (the same tokenizer, rendered by ChatTemplate), else by
    `counter` (transformers' apply_chat_template).
    """

    def __init__(
        self, counter: HFTokenCounter, template_extra_tokens: int, light: FastTokenCounter | None = None
    ) -> None:
        self.counter = counter
        self.chat_counter: HFTokenCounter | FastTokenCounter = light or counter
        self.tokenizer = counter.tokenizer
        self.extra = template_extra_tokens

    async def count(self, req: GenRequest) -> int:
        """usage.prompt_tokens: the chat template count (+ extra), or the raw prompt's ids."""
        if req.messages is None:
            if isinstance(req.prompt, str) and len(req.prompt) > LONG_TEXT_CHARS:
                return len(await asyncio.to_thread(self.prompt_ids, req))
            return len(self.prompt_ids(req))
        size = sum(len(str(m.get("content", ""))) for m in req.messages)
        chat = [conversation(req)]
        if size > LONG_TEXT_CHARS:
            counted = await asyncio.to_thread(self.chat_counter.count, chat)
        else:
            counted = self.chat_counter.count(chat)
        if isinstance(counted[0], str):
            raise sglang.bad_request(counted[0], "BadRequest")
        return counted[0] + self.extra

    async def chat_ids(self, req: GenRequest) -> list[int]:
        """The ids a chat request is encoded to (the extra template tokens appear as id 0)."""
        try:
            text = self.counter.render(conversation(req))
        except Exception as exc:  # jinja raise_exception() and type errors in the template
            raise sglang.bad_request(failure_text(exc), "BadRequest") from exc
        encoded = await asyncio.to_thread(self.tokenizer, text, add_special_tokens=False)
        ids: list[int] = encoded["input_ids"]
        return ids + [0] * self.extra

    async def chat_prompt_ids(self, req: GenRequest) -> list[int]:
        """The ids `count` counts for a chat request (rendered by the same renderer; the extra template tokens
        appear as id 0 at the end), for the prefix cache; a template failure is the same 400."""
        chat, counter = conversation(req), self.chat_counter
        render = counter.template.render if isinstance(counter, FastTokenCounter) else counter.render
        try:
            text = render(chat)
        except Exception as exc:
            raise sglang.bad_request(failure_text(exc), "BadRequest") from exc
        if len(text) > LONG_TEXT_CHARS:
            return await asyncio.to_thread(self._ids, text)
        return self._ids(text)

    def text_ids(self, text: str) -> list[int]:
        """The ids of generated text (what a port caches of an answer)."""
        return self._ids(text, extra=0)

    def _ids(self, text: str, extra: int | None = None) -> list[int]:
        """`text` encoded without special tokens added, plus the extra template tokens."""
        tokenizer = self.chat_counter.tokenizer
        if isinstance(self.chat_counter, FastTokenCounter):
            ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids + [0] * (self.extra if extra is None else extra)

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """A completions prompt's ids: encoded with add_special_tokens=True, or given as ids."""
        if isinstance(req.prompt, list):
            return req.prompt
        ids: list[int] = self.tokenizer(req.prompt, add_special_tokens=True)["input_ids"]
        return ids
