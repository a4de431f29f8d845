"""`export --format conversations|text`: the rows as JSON lines in OUT/train.jsonl, the shapes draft-model
trainers read, with the dataset card beside them.

    {"id": "q1", "conversations": [{"role": "user", "content": "..."},
                                   {"role": "assistant", "content": "...", "reasoning_content": "..."}]}
    {"id": "q1", "text": "<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n<think>\\n...</think>..."}

The first is SpecForge's "Conversation Format" and what vllm-project/speculators' prepare_data reads; the
second SpecForge's "Pre-formatted Text Format" (sgl-project/SpecForge docs/basic_usage/data_preparation.md).
One line per row `export` writes: per (id, sample), of a --turns all run per conversation. The id is the
row's as a string, `#sample{n}` after it for a sample after the first.

A turn keeps `role` and `content`, and where it has them `reasoning_content`, `tool_calls`, `name` and
`tool_call_id`; a line has `tools` (a JSON string, which both readers take) when its request had tools, and
nothing else: SpecForge hands any other column to the chat template as a keyword.

`--reasoning`: `separate` puts an answer's reasoning in `reasoning_content`, `inline` in its content as the
run's chat template writes it (tokens/whole.py: Qwen3 `<think>\\n...\\n</think>\\n\\n` first), `drop` leaves it
out. An answer from a server without a reasoning parser holds its thinking in the text, `<think>...</think>`
(or an unclosed `<think>` when it was cut while thinking): `separate` moves it to `reasoning_content`, `drop`
leaves it out, so neither leaves a marker in a content (the check SpecForge's recipe makes).

`--row-per-turn` (a --turns all run) writes a row per assistant turn instead of one per conversation, id
`...#turn{k}`, as SpecForge's scripts/expand_reasoning_conversations.py expands conversations: the turn's
history and its answer, the history's answers without their reasoning (`text`: the request as it was sent,
rendered whole, so the template shows the history as the target saw it).

`text` is the conversation rendered whole (tokens/whole.py) by the run's tokenizer and chat template, the
ones recorded in its manifest, with its tools and chat_template_kwargs: the tokens the target was sent and
answered, so the draft model learns exactly the sequence the target serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError
from ..tokens.conversation import Conversation
from ..views.rundata import read_manifest
from .exportconfig import ExportConfig, ExportStats
from .lines import answered_rows
from .trainrow import answer_turn, export_messages, server_kind, turn_features

TRAIN_FILE = "train.jsonl"
OPEN, CLOSE = "<think>", "</think>"
Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a completion line -> one trainer row


def row_id(obj: dict[str, Any], per_turn: bool = False) -> str:
    """A line's id as a trainer row's: a string, with the sample after the first (and its turn, for a row
    per turn)."""
    sample = obj.get("sample") or 0
    rid = f"{obj['id']}#sample{sample}" if sample else str(obj["id"])
    return f"{rid}#turn{obj['turn']}" if per_turn else rid


def split_thinking(content: str) -> tuple[str | None, str]:
    """(the thinking a content holds as <think>...</think>, the content without it); (None, content) when
    it holds none. An unclosed <think> (cut while thinking) makes all that follows it thinking."""
    before, opened, after = content.partition(OPEN)
    if CLOSE in content:
        head, _, rest = content.partition(CLOSE)
        thinking = head.partition(OPEN)[2] if OPEN in head else head
        return thinking.strip("\n"), _unmarked(head.partition(OPEN)[0] + rest).lstrip("\n")
    if opened:
        return after.strip("\n"), _unmarked(before)
    return None, content


def _unmarked(text: str) -> str:
    return text.replace(OPEN, "").replace(CLOSE, "")


def conversation_turn(turn: dict[str, Any], reasoning: str, shape: tuple[str, str]) -> dict[str, Any]:
    """One exported turn (trainrow.py's schema) as a trainer reads it: its fields that have a value, the
    reasoning where `reasoning` says."""
    out = {k: v for k, v in turn.items() if v is not None}
    if out.get("role") != "assistant":
        return out
    thinking = out.pop("reasoning_content", None)
    if isinstance(out.get("content"), str):
        found, out["content"] = split_thinking(out["content"])
        thinking = thinking if thinking is not None else found
    if thinking and reasoning == "separate":
        out["reasoning_content"] = thinking
    elif thinking and reasoning == "inline":
        out["content"] = f"{shape[0]}{thinking}{shape[1]}{out.get('content') or ''}"
    return out


def conversations_shape(config: ExportConfig) -> Shape:
    """--format conversations: a completion line as {"id", "conversations"[, "tools"]}."""
    kind = server_kind(config)
    shape = reasoning_shape(config) if config.reasoning == "inline" else ("", "")

    def row(obj: dict[str, Any]) -> dict[str, Any]:
        turns = [conversation_turn(t, config.reasoning, shape) for t in export_messages(obj, kind)]
        if config.row_per_turn:  # the history as it shows: its answers' reasoning left out
            turns[:-1] = [conversation_turn(t, "drop", shape) for t in turns[:-1]]
        return {"id": row_id(obj, config.row_per_turn), "conversations": turns, **_tools(obj)}

    return row


def text_shape(config: ExportConfig) -> Shape:
    """--format text: a completion line as {"id", "text"}, rendered whole with the run's chat template."""
    from ..tokens.whole import render_whole

    counter = run_counter(config)

    def row(obj: dict[str, Any]) -> dict[str, Any]:
        chat = Conversation(obj["messages"], obj.get("tools"), obj.get("chat_template_kwargs") or {}, _choice(obj))
        return {"id": row_id(obj, config.row_per_turn), "text": render_whole(counter, chat, answer_turn(obj))}

    return row


def _tools(obj: dict[str, Any]) -> dict[str, str]:
    tools = obj.get("tools")
    return {} if tools is None else {"tools": orjson.dumps(tools).decode()}


def _choice(obj: dict[str, Any]) -> Any:
    sampling = obj.get("sampling")
    return sampling.get("tool_choice") if isinstance(sampling, dict) else None


def reasoning_shape(config: ExportConfig) -> tuple[str, str]:
    """How the run's template writes reasoning into an answer (tokens/whole.py); its default without one."""
    from ..tokens.whole import DEFAULT_SHAPE, reasoning_shape

    try:
        counter = run_counter(config)
    except ConfigError:
        return DEFAULT_SHAPE
    return reasoning_shape(counter)


def run_counter(config: ExportConfig) -> Any:
    """The token counter of the runs: the tokenizer and chat template their manifests record (one for all)."""
    from ..tokens import load_counter
    from ..tokens.whole import chat_template_hash

    manifests = [read_manifest(run) for run in config.runs]
    names = {(m.get("tokenizer"), m.get("chat_template_sha256")) for m in manifests}
    if len(names) != 1 or None in next(iter(names)):
        raise ConfigError(
            "--format text renders with the run's tokenizer and chat template, recorded in its manifest: "
            + ("these runs record several" if len(names) > 1 else f"{config.runs[0]} records none")
        )
    name, sha = next(iter(names))
    name = config.tokenizer or name
    try:
        counter = load_counter(str(name), server=str(manifests[0].get("server_kind") or "sglang"))
    except ConfigError as exc:
        raise ConfigError(f"{exc}; give the run's tokenizer folder with --tokenizer") from exc
    if chat_template_hash(counter) != sha:
        raise ConfigError(f"the chat template of tokenizer {name!r} is not the one the run used (sha256 {sha})")
    return counter


def write_lines(rows: Iterator[dict[str, Any]], path: Path) -> None:
    """The rows as JSON lines."""
    with path.open("wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")


def trainer_rows(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """The export's rows in the --format's shape."""
    shape = text_shape(config) if config.format == "text" else conversations_shape(config)
    for obj, _ in answered_rows(config, stats):
        yield shape(obj)


def trainer_features(config: ExportConfig) -> Any:
    """The rows' schema as a `datasets.Dataset` holds them (gen_pipeline.load): a field a row lacks is null."""
    import datasets

    text = datasets.Value("string")
    if config.format == "text":
        return datasets.Features({"id": text, "text": text})
    return datasets.Features({"id": text, "conversations": [turn_features()], "tools": text})
