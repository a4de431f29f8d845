"""What an exported row says the model saw: every turn with its tool calls, tool-call ids, names and
reasoning, the answer's own, and the request fields beside the messages (tools, chat_template_kwargs,
sampling). One schema for `export`'s row shapes (per sample, grouped, per conversation).

A turn keeps every field the servers give the template: `role`, `content`, `reasoning_content`, `name`,
`tool_call_id` and `tool_calls` (each `{id, type, function: {name, arguments}}`, the arguments as a JSON
string, as OpenAI sends them). Content given as text parts is one string, joined as the run's server kind
joins them for a string-format template. `tools`, `chat_template_kwargs` and `sampling` are JSON strings
(their schemas are the user's), null when the request had none.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..tokens.conversation import SERVER_KINDS, content_texts, join_texts
from ..views.rundata import read_manifest
from .exportconfig import REQUEST_COLUMNS, ExportConfig, column_value

TURN_FIELDS = ("role", "content", "reasoning_content", "name", "tool_call_id")


def _text(value: Any) -> str | None:
    """A JSON value as the string column that holds it (null stays null)."""
    return value if value is None or isinstance(value, str) else orjson.dumps(value).decode()


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    return {
        "id": _text(call.get("id")) if isinstance(call, dict) else None,
        "type": _text(call.get("type")) if isinstance(call, dict) else None,
        "function": {"name": _text(function.get("name")), "arguments": _text(function.get("arguments"))},
    }


def export_turn(m: dict[str, Any], kind: str) -> dict[str, Any]:
    """One turn with every field of the schema (null where the turn has none)."""
    turn = {f: m.get(f) for f in TURN_FIELDS}
    if isinstance(turn["content"], list):
        turn["content"] = join_texts(content_texts(turn["content"]), kind)
    turn = {f: _text(v) for f, v in turn.items()}
    calls = m.get("tool_calls")
    turn["tool_calls"] = [_tool_call(c) for c in calls] if isinstance(calls, list) and calls else None
    return turn


def answer_turn(obj: dict[str, Any]) -> dict[str, Any]:
    """The assistant turn of a completion line: its text, thinking and tool calls."""
    fields = ("reasoning_content", "tool_calls")
    return {"role": "assistant", "content": obj["completion"], **{f: obj.get(f) for f in fields}}


def export_messages(obj: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """A completion line's prompt turns and its answer, in the schema."""
    return [export_turn(m, kind) for m in [*obj["messages"], answer_turn(obj)]]


def server_kind(config: ExportConfig) -> str:
    """The server kind whose joining of text parts the exported turns follow (the first run's)."""
    kind = read_manifest(config.runs[0]).get("server_kind") if config.runs else None
    return kind if kind in SERVER_KINDS else "sglang"


def training_row(obj: dict[str, Any], columns: tuple[str, ...], kind: str = "sglang") -> dict[str, Any]:
    """A completion line as a training row: every prompt turn and the new assistant turn as the model saw
    and made them, the request fields beside them, and the chosen columns."""
    row = {"messages": export_messages(obj, kind), **request_columns(obj)}
    row.update((c, column_value(obj, c)) for c in columns if c not in row)
    return row


def request_columns(obj: dict[str, Any]) -> dict[str, Any]:
    """The request fields beside the messages, as JSON-string columns (null when the request had none)."""
    return {c: _text(obj.get(c)) for c in REQUEST_COLUMNS}


def turn_features() -> Any:
    """The datasets schema of one turn."""
    import datasets

    text = datasets.Value("string")
    call = {"id": text, "type": text, "function": {"name": text, "arguments": text}}
    return {**dict.fromkeys(TURN_FIELDS, text), "tool_calls": [call]}
