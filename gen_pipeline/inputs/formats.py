"""Reading prompt sources, and turning the common conversation formats into `generate` input rows.

`generate` reads rows in these formats too (`native_row`, called by the validator): each as its whole
conversation, with its own id.

    messages   {"messages": [{"role", "content"}, ...]}                  OpenAI chat
    sharegpt   {"conversations": [{"from": "human"|"gpt", "value"}]}     ShareGPT, Infinity-Instruct
    alpaca     {"instruction", "input", "output"}
    prompt     {"prompt": str | messages, "response"?}
    text       {"text": str}

Each row keeps its prompt (every turn up to and including the last user turn); the old answer is
dropped, or kept as `reference` when asked. With `keep_turns` (`prepare --keep-turns`) a conversation
keeps its turns up to the last user one, for `generate --turns all` to answer every one. A row's `id`
stays its id (prepare makes repeated ones unique); another id column (conversation_id, uuid, ...)
becomes `source_id` beside a content id, and every other column is carried as is (`generate` files them
under `meta`).
Whether a converted row is valid is not judged here: `prepare` checks each row it writes with `inputs.rows.parse_row`,
the one validator `generate` reads it with.

`open_source` reads JSONL directly (orjson, one pass) and everything else through `datasets`: JSON,
Parquet, CSV, TXT, Arrow, a `save_to_disk` folder, a folder of data files, or a hub dataset name.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, PipelineError, RequestShapeError
from ..records import BIG_INTEGER, INT_MAX, INT_MIN, Messages, content_digest, id_from_digest
from .shape import merge_user_turns

# Suffixes read by `datasets` builders; .jsonl is read directly (faster, no Arrow copy).
BUILDERS = {".json": "json", ".jsonl": "json", ".ndjson": "json", ".parquet": "parquet"}
BUILDERS |= {".csv": "csv", ".txt": "text", ".arrow": "arrow"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
FORMATS = ("messages", "sharegpt", "alpaca", "prompt", "text")
# Columns that may hold the source's own row id, in order of preference.
ID_COLUMNS = ("id", "conversation_id", "uuid", "uid", "idx")
# Columns that hold the old answer of a prompt-format row.
ANSWER_COLUMNS = ("response", "completion", "output", "answer")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
# Names `generate` reads itself; a source column of that name is not carried as an extra.
_RESERVED = frozenset({"id", "messages", "prompt"})


class InvalidRowError(PipelineError):
    """A source row that cannot become a prompt; `reason` is a short tag counted in the report."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Converted:
    """One source row as an input row, with the digest that dedup compares; `own_id`: the row's id is the
    source's own `id` (else the content id)."""

    row: dict[str, Any]
    digest: bytes
    own_id: bool = False


def detect_format(raw: dict[str, Any]) -> str | None:
    """The format a row is in, judged by its columns; None when no format fits."""
    if isinstance(raw.get("messages"), list):
        return "messages"
    if isinstance(raw.get("conversations", raw.get("conversation")), list):
        return "sharegpt"
    if isinstance(raw.get("instruction"), str):
        return "alpaca"
    if isinstance(raw.get("prompt"), str | list):
        return "prompt"
    if isinstance(raw.get("text"), str):
        return "text"
    return None


def _turns(items: Any, role_key: str, text_key: str, roles: dict[str, str] | None) -> Messages:
    """Role/content messages from a list of turns, every other field of an OpenAI-style turn kept (tool
    calls, tool-call ids, names, reasoning); an empty system turn is dropped, consecutive user turns are
    one (inputs.shape.merge_user_turns, as generate merges them). Whether the turns are valid is `rows`' to
    judge (prepare checks what it writes as `generate` will read it)."""
    if not isinstance(items, list) or not items:
        raise InvalidRowError("no_messages")
    messages: Messages = []
    for item in items:
        if not isinstance(item, dict):
            raise InvalidRowError("bad_message")
        role = item.get(role_key) if roles is None else roles.get(str(item.get(role_key)))
        content = item.get(text_key)
        if role == "system" and isinstance(content, str) and not content.strip():
            continue  # many ShareGPT dumps carry an empty system turn
        turn = {k: v for k, v in item.items() if k not in (role_key, text_key)} if roles is None else {}
        messages.append({"role": role, "content": content, **turn})
    return _merged(messages)


def _merged(messages: Messages) -> Messages:
    """Consecutive user turns as one, when their contents can be joined (a bad turn is `rows`' to refuse)."""
    if any(m["role"] == "user" and not isinstance(m["content"], str | list) for m in messages):
        return messages
    try:
        return merge_user_turns(messages)[0]
    except RequestShapeError:  # a part without text: refused by the validator, as written
        return messages


# The turns that ask the model for its next answer: a user's, or a tool's result after the model's call.
ASKING_ROLES = ("user", "tool")


def split_prompt(messages: Messages) -> tuple[Messages, str | None]:
    """The turns up to the last user or tool turn (a tool call and its result after the last user turn are
    the prompt too: the model answers them), and the first assistant answer after it (if any)."""
    if not any(m["role"] == "user" for m in messages):
        raise InvalidRowError("no_user_turn")
    last = max(i for i, m in enumerate(messages) if m["role"] in ASKING_ROLES)
    answer = next((m["content"] for m in messages[last + 1 :] if m["role"] == "assistant"), None)
    return messages[: last + 1], answer


def keep_turns(messages: Messages) -> tuple[Messages, str | None]:
    """`prepare --keep-turns`: the conversation up to the last user turn (the one `generate --turns all`
    regenerates: it sends the system and user turns, never the old answers between them, which keep the
    turns apart), and the last answer; a conversation with tool turns cannot be."""
    if any(m["role"] == "tool" for m in messages):
        raise InvalidRowError("tool_turns")
    return split_prompt(messages)


def asked(messages: Messages) -> Messages:
    """The turns a conversation asks (its system and user turns): what --keep-turns deduplicates on."""
    return [m for m in messages if m["role"] != "assistant"]


def _sharegpt(raw: dict[str, Any]) -> Messages:
    items = raw.get("conversations", raw.get("conversation"))
    if isinstance(items, list) and items and isinstance(items[0], dict) and "from" not in items[0]:
        return _turns(items, "role", "content", None)  # "conversations" holding OpenAI messages
    return _turns(items, "from", "value", SHAREGPT_ROLES)


def _column(raw: dict[str, Any], name: str) -> str:
    """A text column that the format requires."""
    if name not in raw:
        raise InvalidRowError("missing_column")
    value = raw[name]
    if not isinstance(value, str):
        raise InvalidRowError("bad_content")
    return value


def _alpaca(raw: dict[str, Any]) -> tuple[Messages, str | None]:
    instruction, extra = _column(raw, "instruction"), raw.get("input")
    text = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    return _user(text), _answer(raw, ("output",))


def _prompt(raw: dict[str, Any]) -> tuple[Messages, str | None]:
    prompt = raw.get("prompt")
    if isinstance(prompt, list):  # TRL's conversational prompt column
        messages = split_prompt(_turns(prompt, "role", "content", None))[0]
    else:
        messages = _user(_column(raw, "prompt"))
    return messages, _answer(raw, ANSWER_COLUMNS)


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def _answer(raw: dict[str, Any], columns: tuple[str, ...]) -> str | None:
    return next((raw[c] for c in columns if isinstance(raw.get(c), str)), None)


def _extract(raw: dict[str, Any], fmt: str, turns: bool = False) -> tuple[Messages, str | None]:
    """The prompt messages and the old answer of a row in a known format (`turns`: a conversation's
    system and user turns, keep_turns)."""
    split = keep_turns if turns else split_prompt
    if fmt == "alpaca":
        return _alpaca(raw)
    if fmt == "prompt":
        return _prompt(raw)
    if fmt == "text":
        return _user(_column(raw, "text")), None
    if fmt == "messages":
        return split(_turns(raw.get("messages"), "role", "content", None))
    return split(_sharegpt(raw))


_CONSUMED = {
    "messages": frozenset({"messages"}),
    "sharegpt": frozenset({"conversations", "conversation"}),
    "alpaca": frozenset({"instruction", "input", "output"}),
    "prompt": frozenset({"prompt", *ANSWER_COLUMNS}),
    "text": frozenset({"text"}),
}


def native_row(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A row in another format (ShareGPT, Alpaca, text, a prompt given as turns) as `generate` reads rows:
    its whole conversation as `messages`, old answer included (inputs.shape sets it aside as `reference`), its
    other columns kept; None for a row in no format (or one `generate` reads as it is); InvalidRowError.

    Unlike `prepare`, nothing is dropped or given a new id: the row's `id` is its id, and one without gets
    the content id of the conversation."""
    fmt = detect_format(raw)
    if fmt is None or fmt == "messages" or (fmt == "prompt" and isinstance(raw.get("prompt"), str)):
        return None
    if fmt == "sharegpt":
        messages = _sharegpt(raw)
    elif fmt == "alpaca":
        messages = _alpaca(raw)[0]
        if isinstance(answer := raw.get("output"), str) and answer.strip():
            messages = [*messages, {"role": "assistant", "content": answer}]
    elif fmt == "text":
        messages = _user(_column(raw, "text"))
    else:  # TRL's conversational prompt column: the turns themselves
        messages = _turns(raw.get("prompt"), "role", "content", None)
    consumed = _CONSUMED[fmt] - set(ANSWER_COLUMNS) if fmt == "prompt" else _CONSUMED[fmt]
    return {"messages": messages, **{k: v for k, v in raw.items() if k not in consumed and k != "messages"}}


class RowConverter:
    """Turns source rows into input rows; "auto" judges each row's format by its columns."""

    def __init__(self, fmt: str = "auto", keep_reference: bool = False, keep_turns: bool = False) -> None:
        self.format = None if fmt == "auto" else fmt
        self.keep_reference, self.keep_turns = keep_reference, keep_turns
        self.seen: Counter[str] = Counter()

    def __call__(self, raw: Any) -> Converted:
        """One source row as a Converted row, or InvalidRowError."""
        if raw is NOT_JSON:
            raise InvalidRowError("not_json")
        if not isinstance(raw, dict):
            raise InvalidRowError("not_json_object")
        fmt = self.format or detect_format(raw)
        if fmt is None:
            raise InvalidRowError("unknown_format")
        messages, answer = _extract(raw, fmt, self.keep_turns)
        digest = content_digest(asked(messages) if self.keep_turns else messages)
        own = own_id(raw.get("id"))
        # the id from the digest in hand: hashing twice was half of prepare's time.
        row: dict[str, Any] = {"id": own if own is not None else id_from_digest(digest), "messages": messages}
        row.update(_extras(raw, fmt, own is not None))
        if self.keep_reference and answer is not None:
            row["reference"] = answer
        self.seen[fmt] += 1
        return Converted(row, digest, own is not None)


def own_id(value: Any) -> str | int | None:
    """A source's `id` that is an id generate takes (a non-empty string, an integer within 64 bits), else None."""
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return value if isinstance(value, str) or INT_MIN <= value <= INT_MAX else None


def _extras(raw: dict[str, Any], fmt: str, own: bool) -> dict[str, Any]:
    """The columns a row carries besides its prompt; a source id that is not the row's id becomes source_id."""
    id_column = "id" if own else next((c for c in ID_COLUMNS if raw.get(c) is not None), None)
    skip = _CONSUMED[fmt] | _RESERVED | {id_column}
    extras = {k: v for k, v in raw.items() if k not in skip}
    if id_column is not None and not own:
        extras["source_id"] = raw[id_column]
    return extras


def _looks_local(src: str) -> bool:
    return src.startswith(("/", ".", "~")) or any(src.endswith(s) for s in (*BUILDERS, *COMPRESSED))


def _builder(path: Path) -> str:
    suffixes = [s for s in path.suffixes if s not in COMPRESSED] or [""]
    if suffixes[-1] not in BUILDERS:
        raise ConfigError(f"{path}: unknown file type; use one of {', '.join(sorted(BUILDERS))}")
    return BUILDERS[suffixes[-1]]


class NotJson:
    """What `jsonl_rows` yields for a line that is not JSON (prepare counts it as `not_json`, as generate does)."""


NOT_JSON = NotJson()


def jsonl_rows(path: Path) -> Iterator[Any]:
    """The values of a JSONL file's lines, NOT_JSON for a line that is not JSON; blank lines are skipped, as
    generate skips them. An integer beyond 64 bits (orjson reads it as a float, losing digits) is kept as its
    digits, a string: how generate wants such ids written."""
    try:
        with path.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    yield NOT_JSON
                    continue
                yield json.loads(raw, parse_int=_int_or_digits) if BIG_INTEGER.search(raw) else value
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _int_or_digits(literal: str) -> int | str:
    value = int(literal)
    return value if INT_MIN <= value <= INT_MAX else literal


def _dataset_rows(src: str, split: str, subset: str | None, streaming: bool) -> Iterator[Any]:
    """Rows of anything `datasets` reads; local files and folders stream in one pass."""
    import datasets

    path = Path(src).expanduser()
    try:
        if path.is_dir() and any((path / n).exists() for n in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ConfigError(f"{src} has no split {split!r}: {sorted(ds)}")
                ds = ds[split]
        elif path.is_file():
            ds = datasets.load_dataset(_builder(path), data_files=str(path), split="train", streaming=True)
        elif path.is_dir():
            ds = datasets.load_dataset(str(path), split=split, streaming=True)
        else:
            ds = datasets.load_dataset(src, subset, split=split, streaming=streaming)
        yield from ds
    except PipelineError:
        raise
    except Exception as exc:  # datasets and the hub raise many kinds; the user sees one line
        raise ConfigError(f"cannot read {src}: {type(exc).__name__}: {exc}") from exc


def open_source(src: str, split: str, subset: str | None, streaming: bool, limit: int | None) -> Iterator[Any]:
    """The raw rows of one source (at most `limit` of them)."""
    path = Path(src).expanduser()
    if not path.exists() and _looks_local(src):
        raise ConfigError(f"--input {src}: no such file or directory")
    if path.is_file() and path.suffix in (".jsonl", ".ndjson"):
        rows = jsonl_rows(path)
    else:
        rows = _dataset_rows(src, split, subset, streaming)
    return islice(rows, limit)
