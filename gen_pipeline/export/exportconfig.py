"""What one `export` reads and writes (ExportConfig), what it counted (ExportStats), and its columns:
the fields a dataset may carry, their Arrow types, and how a column reads a completion line."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError
from ..views.rundata import completion_files, read_manifest

DEFAULT_COLUMNS = ("id", "sample", "finish_reason", "prompt_tokens", "completion_tokens", "model", "checkpoint")
DEFAULT_SHARD_ROWS = 100_000
# The completion fields a dataset may carry, with their Arrow types; "meta.KEY" columns are strings.
_STRINGS: tuple[str, ...] = ("id", "completion", "reasoning_content", "finish_reason", "server", "model", "meta")
# What the request carried beside its messages (always exported, as JSON strings: trainrow.py)
REQUEST_COLUMNS = ("tools", "chat_template_kwargs", "sampling")
_STRINGS += ("truncated_in", "logprobs", "usage_invalid", "server_usage", "tool_calls", *REQUEST_COLUMNS)
_STRINGS += ("checkpoint", "weight_version")  # what wrote the row (fleet/provenance.py)
_STRINGS += ("reference",)  # the answer a row ended with, not sent (--turns last: inputs/shape.py)
_INTS = ("input_tokens", "prompt_tokens", "completion_tokens", "max_tokens", "attempts", "sample", "reasoning_tokens")
COLUMN_TYPES = dict.fromkeys(_STRINGS, "string") | dict.fromkeys(_INTS, "int64")
COLUMN_TYPES["latency_s"] = COLUMN_TYPES["time"] = "float64"

EXPORT_FORMATS = ("dataset", "openai-batch", "conversations", "text")
TRAINER_FORMATS = ("conversations", "text")  # JSON lines for draft-model trainers (trainerrows.py)
REASONING = ("separate", "inline", "drop")  # where --format conversations puts an answer's reasoning


def with_default_columns(columns: tuple[str, ...]) -> tuple[str, ...]:
    """--columns: the default columns, then the ones named (each once, in the order first named)."""
    return tuple(dict.fromkeys((*DEFAULT_COLUMNS, *columns)))


@dataclass(frozen=True)
class ExportConfig:
    """What one `export` reads and writes.

    Attributes:
        runs: run directories (completions*.jsonl, failures.jsonl, manifest.json), read in order.
        out: the dataset folder to create. overwrite: replace it if it exists.
        columns: columns besides `messages`: completion fields or "meta.KEY"; `id` is always one (first
            when not named).
        drop_truncated: leave out completions that stopped at max_tokens (finish_reason "length").
        drop_truncated_reasoning: leave out only those cut while still reasoning (truncated_in "reasoning").
        group_samples: one row per prompt with the list of its samples' completions.
        save_to_disk: a `datasets` folder instead of Parquet shards. shard_rows: rows per shard.
        push_to_hub: also push to this hub dataset repo (private if `private`).
    """

    runs: tuple[Path, ...]
    out: Path
    columns: tuple[str, ...] = DEFAULT_COLUMNS
    drop_truncated: bool = False
    drop_truncated_reasoning: bool = False
    group_samples: bool = False
    save_to_disk: bool = False
    shard_rows: int = DEFAULT_SHARD_ROWS
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    partial: bool = False  # export a claimed-shard run with open shards
    drop_incomplete: bool = False  # a --turns all run: leave out conversations that ended early
    format: str = "dataset"  # or "openai-batch": the OpenAI Batch API's output and error files (batchexport.py)
    # or "conversations" / "text": JSON lines for draft-model trainers (trainerrows.py)
    reasoning: str = "separate"  # --format conversations: reasoning_content, <think> in the content, or none
    row_per_turn: bool = False  # --turns all, --format conversations/text: a row per assistant turn
    tokenizer: str | None = None  # --format text: the run's tokenizer where the manifest's path no longer is
    keep_colliding_ids: bool = False  # keep every prompt found under one (id, sample) key, not refuse them
    rejected: bool = False  # also the rejected answers, as preference data in OUT/rejected/ (rejects.py)

    def __post_init__(self) -> None:
        if "id" not in self.columns:  # a row without its id cannot be told apart from the others
            object.__setattr__(self, "columns", ("id", *self.columns))
        unknown = [c for c in self.columns if c not in COLUMN_TYPES and not c.startswith("meta.")]
        if unknown:
            known = ", ".join(COLUMN_TYPES)
            raise ConfigError(f"unknown --columns {unknown}; use {known} or meta.KEY")
        if self.shard_rows < 1:
            raise ConfigError("--shard-rows must be at least 1")
        if self.format not in EXPORT_FORMATS:
            raise ConfigError(f"--format: {' or '.join(EXPORT_FORMATS)}")
        if self.reasoning not in REASONING:
            raise ConfigError(f"--reasoning: {' or '.join(REASONING)}")
        if self.reasoning != "separate" and self.format != "conversations":
            raise ConfigError("--reasoning is for --format conversations (text shows reasoning as the template does)")
        dataset_only = {"--group-samples": self.group_samples, "--save-to-disk": self.save_to_disk}
        dataset_only["--push-to-hub"] = self.push_to_hub is not None
        dataset_only["--rejected"] = self.rejected
        if self.format != "dataset" and (flags := [f for f, on in dataset_only.items() if on]):
            raise ConfigError(f"{', '.join(flags)} shape a dataset: not with --format {self.format}")
        for run in self.runs:
            if not completion_files(run):
                raise ConfigError(f"{run} is not a run directory (no completions*.jsonl)")
        if self.out.exists() and any(self.out.iterdir()) and not self.overwrite:
            raise ConfigError(f"{self.out} exists and is not empty; use --overwrite to replace it")
        if self.turns and self.group_samples:
            raise ConfigError("--group-samples: a --turns all run exports one row per conversation")
        if self.turns and self.format == "openai-batch":
            raise ConfigError(
                "--format openai-batch holds one answer per request: a --turns all run answered every turn of "
                "its conversations; export it as a dataset (one row per conversation)"
            )
        if self.rejected and self.push_to_hub is not None:
            raise ConfigError("--rejected with --push-to-hub: push the folder, rejected/ with it, once it is written")
        if self.drop_incomplete and not self.turns:
            raise ConfigError("--drop-incomplete is for runs made with --turns all")
        if self.row_per_turn and not (self.turns and self.format in TRAINER_FORMATS):
            raise ConfigError("--row-per-turn is for --format conversations or text of a run made with --turns all")

    @property
    def turns(self) -> bool:
        """Whether the runs were made with --turns all (one row per conversation: turnexport.py)."""
        return turns_runs(self.runs)


@dataclass
class ExportStats:
    """What went into the dataset and what was left out. Every readable line is in a row (`lines`), left out
    by a flag (`truncated`), a duplicate, or (of a --turns all run) a turn of a conversation left out whole."""

    written: int = 0  # rows of the dataset (one per prompt with --group-samples, per conversation of turns)
    lines: int = 0  # completion lines in those rows (of a --turns all run: their turns)
    truncated: int = 0  # lines left out by --drop-truncated / --drop-truncated-reasoning
    truncated_in_reasoning: int = 0  # of the lines in rows
    duplicates: int = 0
    unreadable: int = 0
    superseded: int = 0  # lines of an (id, sample) answered again since (samples.py: restart generations)
    finish_reasons: Counter[str] = field(default_factory=Counter)  # of the lines in rows
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # (id, sample, turn) keys read, each mixed with its checkpoint's -> the first line's lines.prompt_digest
    seen: dict[int, int] = field(default_factory=dict)
    checkpoints: Counter[str] = field(default_factory=Counter)  # rows per checkpoint ("" not named)
    twice: list[str] = field(default_factory=list)  # keys a claimed-shard run holds more than once
    collided: list[str] = field(default_factory=list)  # keys found again with another prompt (lines.prompt_digest)
    conversations: Counter[str] = field(default_factory=Counter)  # --turns all, of the rows: "complete", "ended_early"
    conversations_left_out: Counter[str] = field(default_factory=Counter)  # --turns all: why (LEFT_OUT)
    turns_left_out: int = 0  # --turns all: lines of the conversations left out (besides `truncated` ones)
    ledgered: int = 0  # --format openai-batch: lines of errors.jsonl
    rejected: int = 0  # --rejected: rows of OUT/rejected/ (one per rejected answer)
    rejected_with_chosen: int = 0  # ...of them with the answer that passed for the same key

    def add(self, obj: dict[str, Any]) -> None:
        """A completion line that is in a row."""
        self.lines += 1
        self.truncated_in_reasoning += obj.get("truncated_in") == "reasoning"
        self.finish_reasons[str(obj.get("finish_reason"))] += 1
        self.prompt_tokens += obj.get("prompt_tokens") or 0
        self.completion_tokens += obj.get("completion_tokens") or 0

    def row(self, obj: dict[str, Any]) -> None:
        """A row written, named by the checkpoint of the line it was made from."""
        self.written += 1
        self.checkpoints[str(obj.get("checkpoint") or "")] += 1


# Why a --turns all export leaves a conversation out (ExportStats.conversations_left_out), as the card says it.
LEFT_OUT = {
    "hole": "with a turn left out",
    "ended_early": "ended early (--drop-incomplete)",
    "superseded": "answered again under a newer checkpoint",
    "continued": "continued on another checkpoint's answers",
    "restarted": "answered again from the first turn since (restart)",
}


def column_value(obj: dict[str, Any], column: str) -> Any:
    """One column of a training row; a string column's ids, meta values and JSON (logprobs, tool calls, the
    request fields) become strings for a stable schema."""
    value = (obj.get("meta") or {}).get(column[5:]) if column.startswith("meta.") else obj.get(column)
    if COLUMN_TYPES.get(column, "string") != "string":
        return value
    return value if value is None or isinstance(value, str) else orjson.dumps(value).decode()


def dropped(config: ExportConfig, obj: dict[str, Any]) -> bool:
    """Whether --drop-truncated (any cut) or --drop-truncated-reasoning (a cut while thinking) leaves it out."""
    if config.drop_truncated and obj.get("finish_reason") == "length":
        return True
    return config.drop_truncated_reasoning and obj.get("truncated_in") == "reasoning"


def is_completion(obj: Any) -> bool:
    """Whether a line is a completion export can use: an id, the prompt turns and a completion text."""
    return (
        isinstance(obj, dict)
        and obj.get("id") is not None
        and isinstance(obj.get("messages"), list)
        and isinstance(obj.get("completion"), str)
    )


def turns_runs(runs: tuple[Any, ...]) -> bool:
    """Whether these runs were made with --turns all; ConfigError when some were and some were not."""
    kinds = {read_manifest(run).get("turns") == "all" for run in runs}
    if len(kinds) > 1:
        raise ConfigError("some of these runs were made with --turns all and some without; export them apart")
    return kinds == {True}
