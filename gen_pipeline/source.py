"""Streaming the prompts JSONL: validate each row, give it an id, drop exact repeats.

Every line yields a `Prompt` or a `BadRow`; nothing is silently lost. Memory holds one 8-byte digest of the
exact messages per distinct id (for repeat and conflict detection), never the rows themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from .donekeys import KeyMap
from .records import ROLES, Messages, Prompt, RowId, content_id, id_key, parsed_id, peek_key

RESERVED_SAMPLING = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "stream"})
_KNOWN = frozenset({"id", "messages", "prompt", "max_tokens", "sampling"})


@dataclass(frozen=True, slots=True)
class BadRow:
    """A line that cannot be sent, with a one-line explanation."""

    line: int
    detail: str
    id: RowId | None = None


class RowError(ValueError):
    """Why a row is invalid (becomes a `bad_input` ledger entry)."""


def _messages(row: dict[str, Any]) -> Messages:
    if "messages" in row and "prompt" in row:
        raise RowError("row has both messages and prompt; keep one")
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError("prompt must be a non-empty string")
        return [{"role": "user", "content": prompt}]
    messages = row.get("messages")
    if messages is None:
        raise RowError("row has neither messages nor prompt")
    if not isinstance(messages, list) or not messages:
        raise RowError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        _check_message(i, m)
    return messages


def _check_message(i: int, m: Any) -> None:
    if not isinstance(m, dict):
        raise RowError(f"messages[{i}] is not an object")
    if m.get("role") not in ROLES:
        raise RowError(f"messages[{i}] has unknown role {m.get('role')!r}")
    content = m.get("content")
    if not isinstance(content, str):
        raise RowError(f"messages[{i}] content must be a string, not {type(content).__name__}")
    if not content or content.isspace():  # isspace, unlike strip, copies nothing
        raise RowError(f"messages[{i}] content is empty")


def _row_id(row: dict[str, Any], messages: Messages) -> RowId:
    if "id" not in row or row["id"] is None:
        return content_id(messages)
    rid = row["id"]
    if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
        raise RowError(f"id must be a non-empty string or an integer, not {rid!r}")
    return rid


def _options(row: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RowError(f"max_tokens must be a positive integer, not {max_tokens!r}")
    sampling = row.get("sampling")
    if sampling is not None:
        if not isinstance(sampling, dict):
            raise RowError("sampling must be an object")
        if RESERVED_SAMPLING & sampling.keys():
            raise RowError(f"sampling may not set {sorted(RESERVED_SAMPLING & sampling.keys())}")
    return max_tokens, sampling


def parse_row(raw: bytes, line: int) -> Prompt:
    """One JSONL line as a validated Prompt, or RowError."""
    try:
        row = orjson.loads(raw)  # orjson checks UTF-8 itself; decoding first would copy every row
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise RowError(f"invalid UTF-8 at byte {bad.start}") from bad
        raise RowError(f"invalid JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise RowError(f"row is a JSON {type(row).__name__}, not an object")
    messages = _messages(row)
    max_tokens, sampling = _options(row)
    meta = {k: v for k, v in row.items() if k not in _KNOWN}
    derived = row.get("id") is None
    return Prompt(_row_id(row, messages), line, messages, max_tokens, sampling, meta, derived_id=derived)


def _exact_digest(prompt: Prompt) -> int:
    """What "the same content" means for a repeated id: the exact messages.

    A derived id already is the hash of the normalized messages, so its repeats always match.
    """
    if prompt.derived_id:
        return 0
    return int.from_bytes(hashlib.blake2b(orjson.dumps(prompt.messages), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class Skipped:
    """Rows earlier runs already settled ("done", or its permanent ledger reason): one, or `count`."""

    reason: str
    count: int = 1


_SKIPPED: dict[str, Skipped] = {}


def skipped(reason: str) -> Skipped:
    """The one Skipped item per reason (resuming 650k settled rows allocates nothing per row)."""
    item = _SKIPPED.get(reason)
    if item is None:
        item = _SKIPPED[reason] = Skipped(reason)
    return item


class Settled(Protocol):
    """What the resume state says about ids during one pass (store.SettledRows, or DictSettled)."""

    def visit(self, key: int, offset: int) -> tuple[str | None, int | None]: ...

    def skipped_at(self, key: int) -> int | None: ...


class DictSettled:
    """`Settled` from a plain function of the key, remembering offsets in a dict (tests, small inputs)."""

    def __init__(self, settled: Callable[[int], str | None]) -> None:
        self.settled = settled
        self.offsets: dict[int, int] = {}

    def visit(self, key: int, offset: int) -> tuple[str | None, int | None]:
        before = self.offsets.get(key)
        if before is not None:
            return "settled", before
        reason = self.settled(key)
        if reason is not None:
            self.offsets[key] = offset
        return reason, None

    def skipped_at(self, key: int) -> int | None:
        return self.offsets.get(key)


class PromptSource:
    """Iterates a prompts file as Prompt and BadRow items; repeats of an id are handled here.

    `settled(key)` (the resume state) names rows earlier runs finished; those whose id can be read off
    the start of the line are skipped without being parsed, which makes resuming a 650k-row file fast.
    A later row with such an id is a repeat when its line is byte-identical, else a conflict.
    """

    def __init__(
        self,
        path: Path,
        settled: Settled | Callable[[int], str | None] | None = None,
        mine: Callable[[int], bool] | None = None,
    ) -> None:
        self.path = path
        self.settled: Settled | None = DictSettled(settled) if callable(settled) else settled
        self.mine = mine  # a worker's filter: called with the id key, or the line number of a row without id
        self.seen = KeyMap()  # id key -> digest of the exact messages, ~17 bytes a row
        self.repeats = 0
        self.bytes_read = 0

    def __iter__(self) -> Iterator[Prompt | BadRow | Skipped]:
        with self.path.open("rb") as f:
            for line, raw in enumerate(f, start=1):
                offset = self.bytes_read
                self.bytes_read += len(raw)
                raw = raw.rstrip(b"\r\n")
                if not raw or raw.isspace():
                    continue  # blank lines are not rows
                item = self._item(raw, line, offset)
                if item is not None:
                    yield item

    def _item(self, raw: bytes, line: int, offset: int) -> Prompt | BadRow | Skipped | None:
        peeked = peek_key(raw) if self.settled is not None or self.mine is not None else None
        if peeked is not None:
            rid, key = peeked
            if self.mine is not None and not self.mine(key):
                return None  # another worker's row
            if self.settled is not None and key not in self.seen:
                reason, before = self.settled.visit(key, offset)
                if before is not None:
                    return self._again(self._line_at(before) == raw, rid, line)
                if reason is not None:
                    return skipped(reason)
        try:
            prompt = parse_row(raw, line)
        except RowError as exc:
            bad_id = parsed_id(raw)  # the id of an invalid row, when it can still be read, for the ledger
            mine = self.mine is None or self.mine(line if bad_id is None else id_key(bad_id))
            return BadRow(line, str(exc), bad_id) if mine else None
        key = prompt.key
        if self.mine is not None and not self.mine(key):
            return None
        before = self.settled.skipped_at(key) if self.settled is not None else None
        if before is not None:
            return self._again(self._line_at(before) == raw, prompt.id, line)
        digest = _exact_digest(prompt)
        first = self.seen.first(key, digest)
        if first is None:
            return prompt
        return self._again(first == digest, prompt.id, line)

    def _line_at(self, offset: int) -> bytes:
        """The line at `offset` again (only for the rare repeat of a row skipped unparsed)."""
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.readline().rstrip(b"\r\n")

    def _again(self, same: bool, rid: RowId, line: int) -> BadRow | None:
        """A row whose id came before: a repeat (processed once) or a conflict (bad_input)."""
        if same:
            self.repeats += 1
            return None
        return BadRow(line, f"id {rid!r} was seen before with different content", rid)
