"""The rows that flow through a run: an input prompt, a finished completion, a ledger entry.

Each is a small dataclass with one orjson line as its on-disk form. Ids are the user's (a string or an
integer) or, when a row has none, derived from a hash of the normalized messages so that the same prompt
gets the same id in every run and on every machine.
"""

from __future__ import annotations

import hashlib
import re
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from .digests import digest_fields

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

Messages = list[dict[str, Any]]
RowId = str | int


def normalize_text(text: str) -> str:
    """Unicode NFC with trimmed, collapsed whitespace: the form dedup and content ids compare."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def content_digest(messages: Messages, extra: dict[str, Any] | None = None) -> bytes:
    """A 16-byte digest of the normalized conversation (roles included): a turn's other fields (tool
    calls, name, ...) and the row's `extra` (its tools, template kwargs) count only when present, so a
    plain row's digest stays what it always was."""
    norm: list[Any] = [_turn(m) for m in messages]
    if extra:
        norm.append(extra)
    return hashlib.blake2b(orjson.dumps(norm, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def _turn(m: dict[str, Any]) -> list[Any]:
    """One turn as the digest sees it: role, normalized text, then its other fields when it has any."""
    turn: list[Any] = [m.get("role", ""), normalize_text(str(m.get("content", "")))]
    rest = {k: v for k, v in m.items() if k not in ("role", "content") and v is not None}
    return [*turn, rest] if rest else turn


def content_id(messages: Messages, extra: dict[str, Any] | None = None) -> str:
    """The stable id of a row that has none: a hex hash of its normalized messages (and `extra`)."""
    return id_from_digest(content_digest(messages, extra))


def group_digest(messages: Any, tools: Any) -> bytes:
    """What rows that begin alike share (`prepare --group-prefixes` writes them together): the tools and the
    messages up to the first user turn, as every row of a conversation cut at each of its turns has."""
    first_user = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), 0)
    head = orjson.dumps([tools, messages[: first_user + 1]], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(head, digest_size=16).digest()


def id_from_digest(digest: bytes) -> str:
    """The content id for a `content_digest` already computed (saves hashing a row twice)."""
    return "h" + digest.hex()[:24]


def id_key(row_id: RowId) -> int:
    """A compact 64-bit key for an id, for done-sets that must hold 650,000 ids in little memory.

    Integer ids and their string forms share a key on purpose: `1` and `"1"` are the same id.
    """
    return key_of(str(row_id).encode("utf-8", "surrogatepass"))


def key_of(id_bytes: bytes) -> int:
    """id_key of an id given as its UTF-8 bytes (decimal digits for an integer)."""
    return int.from_bytes(hashlib.blake2b(id_bytes, digest_size=8).digest(), "little")


# `{"id": "abc",` or `{"id": 12,` at the start of a line: how prepare and our own output write rows.
_LEADING_ID = re.compile(rb'\{"id":\s*(?:"([^"\\]*)"|(-?[1-9]\d*|0))\s*,')


# The integers orjson reads as integers (and can write back); past them it reads a float.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# An integer literal too long for 64 bits, which orjson reads as a float (1.58e+29).
BIG_INTEGER = re.compile(rb"-?\d{19,}(?![\d.eE])")


def _leading_id(raw: bytes) -> tuple[RowId, bytes] | None:
    """The id a line starts with, and its bytes as they stand in the line (a string id without escapes is
    its own UTF-8; the regex only takes canonical integers, and only those the parser reads as integers)."""
    m = _LEADING_ID.match(raw)
    if m is None:
        return None
    if m[2] is not None:
        number = int(m[2])
        return (number, m[2]) if INT_MIN <= number <= INT_MAX else None
    try:
        return m[1].decode("utf-8"), m[1]
    except UnicodeDecodeError:
        return None


def peek_key(raw: bytes) -> tuple[RowId, int] | None:
    """peek_id and its id_key at once, hashing the id's bytes as they stand in the line."""
    lead = _leading_id(raw)
    return (lead[0], key_of(lead[1])) if lead is not None else None


def parsed_id(raw: bytes) -> RowId | None:
    """The id of a JSON-object line, parsing it in full; None when the line is not one or has no usable id."""
    try:
        row = orjson.loads(raw)
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(row, dict) and "custom_id" in row and "body" in row:  # OpenAI Batch line (inputs.rows.is_batch_line)
        row = {"id": row["custom_id"]}
    rid = row.get("id") if isinstance(row, dict) else None
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


def peek_id(raw: bytes) -> RowId | None:
    """The id of a row whose first key is a plain "id", without parsing the row; None otherwise."""
    lead = _leading_id(raw)
    return lead[0] if lead is not None else None


@dataclass(slots=True)
class Prompt:
    """One validated input row, ready to be counted and sent."""

    id: RowId
    line: int
    messages: Messages
    max_tokens: int | None = None
    sampling: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    input_tokens: int = 0
    derived_id: bool = False  # the row had no id: it is content_id(messages)
    samples: int | None = None  # the row's own samples count (None: the run's --samples)
    pending: tuple[int, ...] = ()  # the samples still owed, set by the reader (see samples.pending)
    at_least: bool = False  # input_tokens is a lower bound from the row's size: too long to be worth counting
    tools: list[Any] | None = None  # the OpenAI tools the template gets: the row's own, else the run's
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs, likewise
    tool_choice: Any = None  # the tool_choice it is sent with (its sampling's, else the run's): SGLang renders by it
    turns: list[Messages] | None = None  # --turns all: the segments, one per user turn (send.turns.split_turns)
    resume: dict[int, tuple[int, Messages]] = field(default_factory=dict)  # sample -> (first turn, history)
    # inputs.shape: user turns merged into the one before, assistant turns dropped from the end (--turns last),
    # and the first dropped one's content: the output line keeps it as `reference`
    merged: int = 0
    dropped: int = 0
    reference: Any = None
    spent: dict[int, Spent] = field(default_factory=dict)  # place key -> its answers rejected by earlier runs
    restart: dict[int, int] = field(default_factory=dict)  # sample -> its restart generation (samples.py), if > 0
    row_digest: int | None = None  # of its input row's bytes, under the run's shaping (digests.py)
    key: int = field(init=False)  # id_key(id), hashed once, in the reader's thread

    def __post_init__(self) -> None:
        self.key = id_key(self.id)


@dataclass(slots=True)
class Completion:
    """One finished prompt: the line written to completions.jsonl."""

    id: RowId
    messages: Messages
    completion: str
    finish_reason: str | None
    input_tokens: int
    prompt_tokens: int | None
    completion_tokens: int | None
    max_tokens: int
    server: str
    attempts: int
    latency_s: float
    model: str
    meta: dict[str, Any]
    key: int = -1  # id_key(id): carried from the Prompt (hashed once), else hashed here
    reasoning_content: str | None = None  # the server's separated thinking; written only when there is one
    tool_calls: list[Any] | None = None  # the answer's own tool calls; written only when it made some
    # what the request carried beside its messages that shapes the answer: tools, chat_template_kwargs,
    # sampling (send.requests.shaping_fields); written right after the messages, each only when present
    request: dict[str, Any] = field(default_factory=dict)
    sample: int = 0  # which of the row's samples (its key is samples.sample_key(id_key(id), sample))
    turn: int | None = None  # --turns all: which user turn this answers (its key is samples.place_key)
    restart: int = 0  # its (id, sample)'s restart generation (samples.py: the newest stands); written when > 0
    row_digest: int | None = None  # its row's (digests.py): written last but one
    extra: dict[str, Any] = field(default_factory=dict)  # optional fields: truncated_in, reasoning_tokens, logprobs
    # what produced it: the fingerprint of the server's identity (the manifest lists it under provenance),
    # and the weight_version the answer reported; each written only when known
    checkpoint: str | None = None
    weight_version: str | None = None
    # when the answer came back (epoch s, as the ledger's `time`): the report's time axis
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.key < 0:
            self.key = id_key(self.id)

    def to_line(self) -> bytes:
        # reasoning_content only when the server sent one (a reasoning parser), so other lines stay as they were
        thinking = {"reasoning_content": self.reasoning_content} if self.reasoning_content is not None else {}
        made_by = {k: v for k, v in (("checkpoint", self.checkpoint), ("weight_version", self.weight_version)) if v}
        calls = {"tool_calls": self.tool_calls} if self.tool_calls else {}
        # a row's line (not a turn's) ends with what it was answered from (digests.py)
        digest = digest_fields(self.messages, self.request.get("tools"), self.row_digest) if self.turn is None else {}
        return (
            orjson.dumps(
                {
                    "id": self.id,
                    "sample": self.sample,  # right after the id: samples.line_place reads it without parsing
                    **({"turn": self.turn} if self.turn is not None else {}),  # and the turn right after it
                    **({"restart": self.restart} if self.restart else {}),  # then the restart generation
                    "messages": self.messages,
                    **self.request,
                    "completion": self.completion,
                    **thinking,
                    **calls,
                    "finish_reason": self.finish_reason,
                    "input_tokens": self.input_tokens,
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "max_tokens": self.max_tokens,
                    "server": self.server,
                    "attempts": self.attempts,
                    "latency_s": round(self.latency_s, 4),
                    "time": round(self.time, 3),
                    "model": self.model,
                    **made_by,
                    "meta": self.meta,
                    **self.extra,
                    **digest,  # last: resume.changes reads it from the line's end
                }
            )
            + b"\n"
        )


@dataclass(slots=True)
class Failure:
    """One ledger entry in failures.jsonl: why a row is not in the output (yet)."""

    id: RowId | None
    line: int | None
    reason: str
    detail: str
    status: int | None = None
    attempts: int = 0
    input_tokens: int | None = None
    source: str | None = None
    server: str | None = None
    max_tokens: int | None = None
    sample: int = 0  # which sample of the row failed
    turn: int | None = None  # --turns all: the turn that failed (the conversation ends or waits there)
    restart: int = 0  # its (id, sample)'s restart generation (samples.py); written when > 0
    # when it was written (epoch s): with several ledger shards, "newest entry per id" compares this
    time: float = field(default_factory=time.time)
    # not written: the id that placed an entry without `id` in its claimed shard (inputs.rows.BadRow)
    shard_id: RowId | None = None

    def to_line(self) -> bytes:
        return (
            orjson.dumps(
                {
                    "id": self.id,
                    "sample": self.sample,
                    **({"turn": self.turn} if self.turn is not None else {}),
                    **({"restart": self.restart} if self.restart else {}),
                    "line": self.line,
                    "reason": self.reason,
                    "status": self.status,
                    "detail": self.detail,
                    "attempts": self.attempts,
                    "input_tokens": self.input_tokens,
                    "max_tokens": self.max_tokens,
                    "server": self.server,
                    "source": self.source,
                    "time": round(self.time, 3),
                }
            )
            + b"\n"
        )


class Spent(NamedTuple):
    """What earlier runs spent on one (id, sample, turn) (rejected.jsonl read back): `total` rejected answers,
    `round` of them since the key was last ledgered for them (a --retry-failed round starts at 0), the last
    one's reason (degenerate, invalid), check and detail."""

    total: int
    round: int
    reason: str
    check: str
    detail: str


@dataclass(slots=True)
class Rejected:
    """One rejected answer: a line of rejected.jsonl, written before the answer is resampled.

    `attempt` counts the key's answers from 0 across runs (its seed derives from it: samples.answer_seed);
    `completion_tokens` is what the answer cost (a loop stopped while decoding: the tokens until then)."""

    id: RowId
    sample: int
    turn: int | None
    attempt: int
    reason: str
    check: str
    detail: str
    completion_tokens: int | None
    finish_reason: str | None
    server: str
    seed: int | None
    content: str
    reasoning_content: str | None = None
    messages: Messages = field(default_factory=list)
    time: float = field(default_factory=time.time)
    restart: int = 0  # its (id, sample)'s restart generation (samples.py); written when > 0
    # our count of its prompt and the server's (usage; None when it gave none): the prefill the reject cost
    input_tokens: int | None = None
    prompt_tokens: int | None = None

    def to_line(self) -> bytes:
        line = {
            "id": self.id,
            "sample": self.sample,
            **({"turn": self.turn} if self.turn is not None else {}),
            **({"restart": self.restart} if self.restart else {}),
            "attempt": self.attempt,
            "reason": self.reason,
            "check": self.check,
            "detail": self.detail,
            "input_tokens": self.input_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "server": self.server,
            "seed": self.seed,
            "messages": self.messages,
            "completion": self.content,
            **({"reasoning_content": self.reasoning_content} if self.reasoning_content is not None else {}),
            "time": round(self.time, 3),
        }
        return orjson.dumps(line) + b"\n"


# Ledger reasons that resending the same row cannot fix; a rerun skips them unless --retry-failed names them.
# empty_completion: every attempt got a 200 with no content and no reasoning (docs/reference/ledger.md).
# poison: every server answered the row 5xx while it served other rows (the row breaks them, resending it
# cannot help; --retry-failed poison sends it again once the servers are fixed).
# invalid, degenerate: every answer the run allowed the key (1 + --max-resamples) was rejected (rejected.jsonl
# keeps each); --retry-failed invalid gives it that many more.
PERMANENT_REASONS = frozenset(
    {"bad_input", "over_length", "context_overflow", "bad_request", "empty_completion", "poison"}
    | {"invalid", "degenerate"}
)
# The reasons of answers the checks or the loop guard rejected (errors.RejectedAnswerError).
REJECT_REASONS = frozenset({"invalid", "degenerate"})
# Ledger reasons from transport or fleet trouble; a plain rerun retries them. wrong_model: every attempt was
# answered by a server naming another model (fix the fleet, then rerun).
TRANSIENT_REASONS = frozenset({"server_error", "timeout", "connection", "wrong_model"})
ALL_REASONS = PERMANENT_REASONS | TRANSIENT_REASONS
# The most samples one prompt may ask for (--samples, a row's "samples", n in sampling).
MAX_SAMPLES = 4096
# The most user turns one conversation may have under --turns all (a line's `turn` is below it).
MAX_TURNS = 4096


TEMPLATE_FIELDS = ("tools", "chat_template_kwargs")  # request fields the template sees beside the messages


def template_input_error(tools: Any, template_kwargs: Any) -> str | None:
    """Why a request's tools or chat_template_kwargs cannot be rendered (as a server would refuse them)."""
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        return "tools must be a list of objects (OpenAI tools)"
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        return "chat_template_kwargs must be an object"
    return None


def validate_spec_error(spec: str) -> str | None:
    """Why a --validate value is not json, regex:PATTERN (compiling) or python:MODULE:FUNCTION; None if it is."""
    kind, _, rest = spec.partition(":")
    module, _, function = rest.rpartition(":")
    if spec == "json" or (kind == "python" and module and function.isidentifier()):
        return None
    if kind == "regex" and rest:
        try:
            re.compile(rest)
        except re.error as exc:
            return f"--validate {spec}: not a regular expression ({exc})"
        return None
    return f"--validate {spec!r}: json, regex:PATTERN or python:MODULE:FUNCTION (MODULE: a module name or a .py file)"
