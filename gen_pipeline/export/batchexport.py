"""`export --format openai-batch`: a run as the OpenAI Batch API's result files, so that a pipeline moving
from the hosted batch API reads them unchanged.

OUT/output.jsonl has one line per prompt: {"id", "custom_id", "response": {"status_code": 200, "request_id",
"body": <a chat.completion>}, "error": null}; the samples of a prompt (of one checkpoint) are the choices of
one line, by their sample number, however they were written. OUT/errors.jsonl has one line per ledger entry that
stands for a missing row (resume/ledger.py): {"id", "custom_id", "response": {"status_code", "request_id", "body":
{"error": ...}} or null when no server answered, "error": {"code": <ledger reason>, "message": <detail>}}.
Ids are derived from (custom_id, sample), so an export is the same each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ..records import id_key
from ..resume.ledger import standing
from .exportconfig import ExportConfig

OUTPUT, ERRORS = "output.jsonl", "errors.jsonl"


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(orjson.dumps(parts), digest_size=12).hexdigest()


def _choice(obj: dict[str, Any]) -> dict[str, Any]:
    calls = obj.get("tool_calls")
    # an answer of tool calls alone has null content, as the API writes it
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if calls and not obj["completion"] else obj["completion"],
    }
    if obj.get("reasoning_content") is not None:
        message["reasoning_content"] = obj["reasoning_content"]
    if calls:
        message["tool_calls"] = calls
    return {
        "index": int(obj.get("sample") or 0),
        "message": message,
        "logprobs": obj.get("logprobs"),
        "finish_reason": obj.get("finish_reason"),
    }


def result_line(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One prompt's completion lines (its samples written together) as one Batch output line."""
    first = group[0]
    key = _digest(first["id"], [o.get("sample") or 0 for o in group])
    prompt = first.get("prompt_tokens") or first.get("input_tokens") or 0
    # the samples of one request with `n` have null completion_tokens (the server counts them together): null
    # here too, never a false sum
    counts: list[int | None] = [o.get("completion_tokens") for o in group]
    completion = None if None in counts else sum(c or 0 for c in counts)
    body = {
        "id": f"chatcmpl-{key}",
        "object": "chat.completion",
        "created": int(first.get("time") or 0),
        "model": first.get("model"),
        "choices": [_choice(o) for o in group],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": None if completion is None else prompt + completion,
        },
    }
    response = {"status_code": 200, "request_id": f"req_{key}", "body": body}
    return {"id": f"batch_req_{key}", "custom_id": _custom_id(first["id"]), "response": response, "error": None}


def error_line(entry: dict[str, Any]) -> dict[str, Any]:
    """One standing ledger entry as a Batch error line."""
    key = _digest(entry.get("id"), entry.get("sample") or 0, "error")
    error = {"code": entry["reason"], "message": entry.get("detail") or entry["reason"]}
    status = entry.get("status")
    response = None
    if isinstance(status, int):
        failure = {**error, "type": entry["reason"], "param": None}
        response = {"status_code": status, "request_id": f"req_{key}", "body": {"error": failure}}
    return {"id": f"batch_req_{key}", "custom_id": _custom_id(entry.get("id")), "response": response, "error": error}


def _custom_id(row_id: Any) -> str | None:
    """The Batch API's custom_id is a string: an integer id is written as its digits."""
    return None if row_id is None else str(row_id)


def prompt_groups(lines: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Each prompt's lines (of one checkpoint), samples in order, in the order each prompt was first met:
    a sample retried in a later run, or sent on its own (--samples-via requests), joins its prompt's line, so
    a custom_id has one output line. Gathered in memory, as `--group-samples` gathers its rows."""
    groups: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for obj in lines:
        groups.setdefault((obj.get("checkpoint"), id_key(obj["id"])), []).append(obj)
    for group in groups.values():
        yield sorted(group, key=lambda o: int(o.get("sample") or 0))


def write_batch(config: ExportConfig, out: Path, lines: Iterator[dict[str, Any]]) -> tuple[int, int]:
    """Write OUT/output.jsonl from the kept completion `lines` and OUT/errors.jsonl from the ledger;
    returns the number of output lines and of error lines."""
    out.mkdir(parents=True)
    written = 0
    with (out / OUTPUT).open("wb") as f:
        for group in prompt_groups(lines):
            f.write(orjson.dumps(result_line(group)) + b"\n")
            written += 1
    entries = standing(config.runs, None, lambda obj: obj)
    with (out / ERRORS).open("wb") as f:
        for entry in entries:
            f.write(orjson.dumps(error_line(entry)) + b"\n")
    return written, len(entries)
