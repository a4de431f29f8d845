"""Shared fixtures: a fake token counter, the tokenizers, and prompt files written on demand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from gen_pipeline.tokens import TINY_TOKENIZER, HFTokenCounter, load_tokenizer
from gen_pipeline.tokens.conversation import Conversation

QWEN3 = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen3"


class FakeCounter:
    """Counts one token per whitespace-separated word plus a fixed template overhead."""

    name = "fake"
    chat_template = None

    def __init__(self, overhead: int = 5) -> None:
        self.overhead = overhead
        self.calls = 0

    def count(self, conversations: Sequence[Any]) -> list[int | str]:
        self.calls += 1
        return [self.overhead + sum(len(str(m.get("content") or "").split()) for m in _turns(c)) for c in conversations]


def _turns(chat: Any) -> Any:
    """The messages of a plain message list or a Conversation."""
    return chat.messages if isinstance(chat, Conversation) else chat


@pytest.fixture
def fake_counter() -> FakeCounter:
    return FakeCounter()


@pytest.fixture(scope="session")
def tiny_counter() -> HFTokenCounter:
    return load_tokenizer(str(TINY_TOKENIZER))


@pytest.fixture(scope="session")
def qwen3_counter() -> HFTokenCounter:
    if not (QWEN3 / "tokenizer.json").exists():
        pytest.skip(f"the real Qwen3 tokenizer is not at {QWEN3}")
    return load_tokenizer(str(QWEN3))


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write rows (dicts, or raw bytes/str lines) to a JSONL file and return its path."""

    def write(rows: Sequence[Any], name: str = "prompts.jsonl") -> Path:
        path = tmp_path / name
        with path.open("wb") as f:
            for row in rows:
                if isinstance(row, bytes):
                    f.write(row + b"\n")
                elif isinstance(row, str):
                    f.write(row.encode() + b"\n")
                else:
                    f.write(orjson.dumps(row) + b"\n")
        return path

    return write
