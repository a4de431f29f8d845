"""One prompt row: validated, given its id and its options, or refused with the reason (`bad_input`).

What a row may hold is docs/how-to/inputs.md; the message shapes servers accept are
tokens.conversation's to judge, so that the count and the request agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import RequestShapeError
from ..records import BIG_INTEGER, ROLES, TEMPLATE_FIELDS, Messages, Prompt, RowId, content_id, template_input_error
from ..samples import row_samples
from ..tokens.conversation import content_texts
from .formats import InvalidRowError, native_row
from .shape import RowShape, shape_messages
from .template import TemplateRowError

RESERVED_SAMPLING = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "stream"})


_OPTIONS = frozenset({"id", "max_tokens", "sampling", "samples", *TEMPLATE_FIELDS})  # a row's settings, not meta
_KNOWN = _OPTIONS | {"messages", "prompt"}

# orjson reads 1024 nested levels but writes only 254. A row's fields go one level down in its output line
# (under `meta`) and a few more in an exported row, so a row must still be writable this many levels down.
WRITE_MARGIN = 4
MAX_NESTING = 254 - WRITE_MARGIN


@dataclass(frozen=True, slots=True)
class BadRow:
    """A line that cannot be sent, with a one-line explanation."""

    line: int
    detail: str
    id: RowId | None = None
    # the id whose shard the row's ledger entry goes to when the row may not stand for it (a conflicting
    # repeat of another row's id): it was placed by that id, and its entry must stay with that shard
    shard_id: RowId | None = None


class RowError(ValueError):
    """Why a row is invalid (becomes a `bad_input` ledger entry); `tag` names the kind in a word (what
    `prepare`'s report counts)."""

    def __init__(self, detail: str, tag: str = "invalid_row") -> None:
        super().__init__(detail)
        self.tag = tag


def _messages(row: dict[str, Any]) -> Messages:
    if row.get("messages") is not None and row.get("prompt") is not None:
        raise RowError("row has both messages and prompt; keep one", "messages_and_prompt")
    if row.get("prompt") is not None:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise RowError(
                "prompt must be a non-empty string", "empty_content" if isinstance(prompt, str) else "bad_content"
            )
        return [{"role": "user", "content": prompt}]
    messages = row.get("messages")
    if messages is None:
        columns = ", ".join(sorted(map(str, row))[:8]) or "none"
        raise RowError(
            f"row has neither messages nor prompt (nor ShareGPT conversations, an Alpaca instruction or text; its "
            f"columns: {columns}); --template FILE renders a prompt from columns",
            "no_messages",
        )
    if not isinstance(messages, list) or not messages:
        raise RowError("messages must be a non-empty list", "no_messages")
    for i, m in enumerate(messages):
        _check_message(i, m)
    return messages


def _check_message(i: int, m: Any) -> None:
    """A turn servers accept: string content, text parts, or an assistant's tool calls without content."""
    if not isinstance(m, dict):
        raise RowError(f"messages[{i}] is not an object", "bad_message")
    if m.get("role") not in ROLES:
        raise RowError(f"messages[{i}] has unknown role {m.get('role')!r}", "bad_role")
    calls = m.get("tool_calls")
    if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list)):
        raise RowError(f"messages[{i}] tool_calls must be a list, on an assistant turn", "bad_tool_calls")
    content = m.get("content")
    if content is None and calls:
        return  # an assistant turn that only calls tools
    if isinstance(content, list):
        try:
            content = "".join(content_texts(content))
        except RequestShapeError as exc:  # multimodal content, a part without text
            raise RowError(f"messages[{i}]: {exc}", "non_text_content") from None
    elif not isinstance(content, str):
        raise RowError(
            f"messages[{i}] content must be a string or text parts, not {type(content).__name__}", "bad_content"
        )
    if not content or content.isspace():  # isspace, unlike strip, copies nothing
        raise RowError(f"messages[{i}] content is empty", "empty_content")


def _template_inputs(row: dict[str, Any], sampling: dict[str, Any] | None) -> tuple[Any, Any, dict[str, Any] | None]:
    """The row's tools and chat_template_kwargs, top-level or in its sampling (lifted out of it: they are
    counted as well as sent), and the sampling without them."""
    inner = sampling or {}
    values = []
    for name in TEMPLATE_FIELDS:
        top, nested = row.get(name), inner.get(name)
        if top is not None and nested is not None and top != nested:
            raise RowError(f"{name} is set both at the top level and in sampling; keep one", "bad_template_inputs")
        values.append(top if top is not None else nested)
    if (error := template_input_error(*values)) is not None:
        raise RowError(error, "bad_template_inputs")
    if sampling is not None and not sampling.keys().isdisjoint(TEMPLATE_FIELDS):
        sampling = {k: v for k, v in sampling.items() if k not in TEMPLATE_FIELDS}
    return values[0], values[1], sampling


def _row_id(row: dict[str, Any], messages: Messages, extra: dict[str, Any]) -> RowId:
    if "id" not in row or row["id"] is None:
        return content_id(messages, extra)
    rid = row["id"]
    if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
        raise RowError(f"id must be a non-empty string or a 64-bit integer, not {rid!r}", "bad_id")
    return rid


def _options(row: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    max_tokens = row.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RowError(f"max_tokens must be a positive integer, not {max_tokens!r}", "bad_max_tokens")
    sampling = row.get("sampling")
    if sampling is not None:
        if not isinstance(sampling, dict):
            raise RowError("sampling must be an object", "bad_sampling")
        if RESERVED_SAMPLING & sampling.keys():
            raise RowError(f"sampling may not set {sorted(RESERVED_SAMPLING & sampling.keys())}", "bad_sampling")
    return max_tokens, sampling


def _check_writable(raw: bytes, row: dict[str, Any]) -> None:
    """RowError for a row that could be read but not written back (nested too deep for orjson's writer):
    it would stop the run at its output line instead of becoming a ledger entry."""
    if raw.count(b"[") + raw.count(b"{") < MAX_NESTING:
        return  # cannot nest that deep (brackets inside strings count too: a cheap upper bound)
    wrapped: Any = row
    for _ in range(WRITE_MARGIN):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        raise RowError(
            f"row is nested more than {MAX_NESTING} levels deep, too deep to be written ({exc})", "too_deep"
        ) from None


def parse_row(raw: bytes, line: int, shape: RowShape | None = None) -> Prompt:
    """One JSONL line as a validated Prompt, or RowError; `shape`: the run's --template and --turns (None:
    the row's messages as written, as `prepare` checks them)."""
    try:
        row = orjson.loads(raw)  # orjson checks UTF-8 itself; decoding first would copy every row
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise RowError(f"invalid UTF-8 at byte {bad.start}", "bad_utf8") from bad
        raise RowError(f"invalid JSON: {exc}", "not_json") from exc
    if not isinstance(row, dict):
        raise RowError(f"row is a JSON {type(row).__name__}, not an object", "not_json_object")
    if (twice := repeated_key(raw, row)) is not None:  # JSON keeps the last: which one was meant is unknown
        raise RowError(f"row has the key {twice!r} more than once".replace("'", '"'), "repeated_key")
    try:
        return _prompt(raw, from_batch(row) if is_batch_line(row) else row, line, shape)
    except RowError as exc:
        raise RowError(as_written(str(exc), raw), exc.tag) from None


def repeated_key(raw: bytes, row: dict[str, Any]) -> str | None:
    """A key the row's object holds more than once (the first), if any. Parsed again, slowly, only when one
    of its keys is written more than once anywhere in the line."""
    if all(raw.count(orjson.dumps(key)) < 2 for key in row):
        return None
    objects: list[list[str]] = []  # each object's keys, innermost first: the row's own come last

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        objects.append([k for k, _ in items])
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    keys = objects[-1]
    return next((k for i, k in enumerate(keys) if k in keys[:i]), None)


BATCH_KEYS = frozenset({"custom_id", "method", "url", "body"})
BATCH_URLS = frozenset({"/v1/chat/completions", "/chat/completions"})


def is_batch_line(row: dict[str, Any]) -> bool:
    """An OpenAI Batch request line: a custom_id and a body (a row of ours may carry a custom_id in its meta)."""
    return "custom_id" in row and "body" in row


def from_batch(line: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Batch request line (custom_id, method, url, body) as the row it asks for: the id is its
    custom_id; the body's messages, its max_tokens (or max_completion_tokens) and its other request fields
    as the row's sampling. The body's model and stream are the run's to set."""
    if extra := sorted(line.keys() - BATCH_KEYS):
        raise RowError(f"an OpenAI Batch line holds custom_id, method, url and body only, not {extra}")
    if missing := sorted(BATCH_KEYS - line.keys()):  # the Batch API's input format requires all four
        raise RowError(f"an OpenAI Batch line needs custom_id, method, url and body; it has no {missing}")
    custom_id, body = line["custom_id"], line.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise RowError(f"custom_id must be a non-empty string, not {custom_id!r}")
    if line["method"] != "POST" or line["url"] not in BATCH_URLS:
        raise RowError(
            f"an OpenAI Batch line must be POST /v1/chat/completions, not {line.get('method')} {line.get('url')}"
        )
    if not isinstance(body, dict):
        raise RowError("an OpenAI Batch line's body must be an object")
    if body.get("stream"):
        raise RowError("an OpenAI Batch body may not ask to stream")
    sampling = {k: v for k, v in body.items() if k not in RESERVED_SAMPLING}
    given = [body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    if len(given) == 2 and given[0] != given[1]:
        raise RowError("the body's max_tokens and max_completion_tokens differ; keep one")
    row: dict[str, Any] = {"id": custom_id, "messages": body.get("messages"), "sampling": sampling or None}
    return {**row, "max_tokens": given[0]} if given else row


def as_written(detail: str, raw: bytes) -> str:
    """`detail` with each integer the line holds beyond 64 bits shown as written, not as the float JSON
    parsing made of it ("not 158000000000000000000000000000", not "not 1.58e+29")."""
    for literal in {m.group() for m in BIG_INTEGER.finditer(raw)}:
        detail = detail.replace(repr(float(literal)), literal.decode())
    return detail


def _prompt(raw: bytes, row: dict[str, Any], line: int, shape: RowShape | None) -> Prompt:
    _check_writable(raw, row)
    template = shape.template if shape is not None else None
    if template is None and row.get("messages") is None and not isinstance(row.get("prompt"), str):
        row = _converted(row)
    messages = _messages(row) if template is None else _rendered(template.messages, row)
    max_tokens, sampling = _options(row)
    tools, template_kwargs, sampling = _template_inputs(row, sampling)
    try:
        sampling, samples = row_samples(row, sampling)
    except ValueError as exc:
        raise RowError(str(exc), "bad_samples") from None
    known = _KNOWN if template is None else _OPTIONS  # a templated row's columns are all kept, prompt included
    meta = {k: v for k, v in row.items() if k not in known}
    derived = row.get("id") is None
    extra = {k: v for k, v in zip(TEMPLATE_FIELDS, (tools, template_kwargs), strict=True) if v is not None}
    prompt = Prompt(_row_id(row, messages, extra), line, messages, max_tokens, sampling, meta, derived_id=derived)
    prompt.samples, prompt.tools, prompt.template_kwargs = samples, tools, template_kwargs
    if shape is not None and template is None:  # the id is the row's as written; what is sent may differ
        shaped = shape_messages(messages, shape.turns)
        prompt.messages, prompt.merged, prompt.dropped = shaped.messages, shaped.merged, shaped.dropped
        prompt.reference = shaped.reference
    return prompt


def _converted(row: dict[str, Any]) -> dict[str, Any]:
    """A row in one of the formats `prepare` reads (ShareGPT, Alpaca, text) as one of ours (formats.native_row)."""
    try:
        native = native_row(row)
    except InvalidRowError as exc:
        raise RowError(f"cannot read the row as a conversation: {exc.reason}", exc.reason) from None
    return row if native is None else native


def _rendered(render: Any, row: dict[str, Any]) -> Messages:
    """The messages --template renders of the row's columns; RowError naming what the row lacks."""
    try:
        return render(row)  # type: ignore[no-any-return]
    except TemplateRowError as exc:
        raise RowError(str(exc), "template") from None


def own_samples(raw: bytes) -> bool:
    """Whether a row may set its own samples count (a "samples" key, or "n" in its sampling)."""
    return b'"samples"' in raw or b'"n"' in raw


def same_content(a: bytes, b: bytes) -> bool:
    """Whether two lines with the same id are one row ("a repeat"): the same bytes, or the same JSON
    object (key order and spacing aside; the id may be written `42` in one and `"42"` in the other, which
    is one id). An id-less row's id is its normalized messages: two such rows are one when everything but
    their messages (`prompt` or `messages`) is the same too; an OpenAI Batch line's id is its custom_id.
    Only called for rows whose id came before (rare)."""
    if a == b:
        return True
    try:
        x, y = orjson.loads(a), orjson.loads(b)
    except orjson.JSONDecodeError:
        return False
    if not (isinstance(x, dict) and isinstance(y, dict)):
        return bool(x == y)
    if is_batch_line(x) or is_batch_line(y):  # the same custom_id: the same body, method and url
        return is_batch_line(x) and is_batch_line(y) and x == y
    if x.get("id") is None and y.get("id") is None:  # the same normalized messages: the same settings?
        return _besides(x, "id", "messages", "prompt") == _besides(y, "id", "messages", "prompt")
    same_id = x.keys() == y.keys() and str(x.get("id")) == str(y.get("id"))
    return same_id and all(x[k] == y[k] for k in x if k != "id")


def _besides(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in keys}


def conflict_detail(raw: bytes, rid: RowId | None) -> str:
    """Why a row whose id came before with other content is bad_input (`raw`: the later row's line)."""
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        row = None
    if isinstance(row, dict) and not is_batch_line(row) and row.get("id") is None:
        return (
            "a row without an id is known by its messages, and an earlier row has the same messages with other "
            f"fields (max_tokens, sampling, samples, tools, meta) (id {rid!r}): give each such row its own id"
        )
    return f"id {rid!r} was seen before with different content"
