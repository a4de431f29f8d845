"""What a row's output line says it was answered from, read back by a resume (resume/changes.py).

A row's line (not a --turns all turn's) ends with two 8-byte digests in hex: `row_digest`, of the input row's
bytes as read under the run's shaping settings (when the reader knew them), then `prompt_digest`, of the prompt
as sent (its messages and tools). A resume that reads the input from the top digests each answered row's bytes
and compares them with `row_digest`, parsing neither the row nor the line; a row whose bytes differ (or a line
without it) is parsed, shaped and compared by `prompt_digest`, so a row only rewritten (its keys reordered, its
spacing changed) is not counted changed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

_SIZE = 8
Messages = list[dict[str, Any]]  # records.Messages (records imports this module)


def prompt_digest(messages: Messages, tools: Any) -> int:
    """The digest of a prompt as sent: its messages and tools (canonical JSON)."""
    data = orjson.dumps([messages, tools], option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.blake2b(data, digest_size=_SIZE).digest(), "little")


def shaping_key(config: Any) -> bytes:
    """The key a run's row digests are taken under: its settings (a RunConfig's) that shape a row into the
    prompt sent: --template's text, --turns, --system-prompt, the run's tools and template kwargs."""
    settings = [config.template, config.turns, config.system_prompt, config.tools, config.chat_template_kwargs]
    return hashlib.blake2b(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS), digest_size=32).digest()


def row_digest(key: bytes, raw: bytes) -> int:
    """The digest of an input row's bytes as read, under a run's `shaping_key`."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=_SIZE, key=key).digest(), "little")


def digest_fields(messages: Messages, tools: Any, row: int | None) -> dict[str, str]:
    """The fields that end a row's output line: `row_digest` (when known), then `prompt_digest`."""
    fields = {"row_digest": f"{row:016x}"} if row is not None else {}
    return fields | {"prompt_digest": f"{prompt_digest(messages, tools):016x}"}
