"""Every error gen-pipeline raises, in one tree.

    PipelineError                    base of everything we raise
    ├── ConfigError                  bad flags, unreadable files, refused resume: shown as "error: ..."
    │   ├── ManifestMismatchError    resuming into a run made with other settings (use --force)
    │   │   └── CheckpointChangedError  its servers serve another checkpoint (use --accept-checkpoint)
    │   ├── InputError               the input is not (compressed) JSONL: binary, or its first rows all bad
    │   └── ExportCheckError         export refused: shards still open (--partial), or a key written twice
    ├── FleetError                   no usable server, or the servers disagree in a way we cannot fix
    │   ├── PreflightError           what `check` calls a PROBLEM, found at start (use --force)
    │   └── FleetRedeployedError     every server was redeployed mid-run (use --accept-checkpoint)
    ├── OutputError                  the output directory cannot be written (disk full, I/O error)
    ├── InvalidRowError              a source row `prepare` cannot make a prompt of: counted by its .reason in
    │                                prepare's report, never shown alone (inputs/formats.py)
    ├── Rejection                    the simulator's HTTP error reply, sent instead of a completion (sim/sglang.py)
    ├── ValidatorError               a --validate python: function raised (or returned neither None nor a
    │                                reason): its fault, never the answer's; the run stops, the row unsettled
    ├── RequestShapeError            a row the server would refuse before rendering it     -> "bad_input"
    └── RequestError                 one request to one server failed; carries .server and .status
        ├── RetryableError           transport trouble: back off and try another server
        │   ├── ConnectError         nothing listening (refused, DNS, unreachable)      -> "connection"
        │   ├── ConnectionLostError  reset, EOF or a dropped keep-alive socket          -> "connection"
        │   ├── RequestTimeout       no complete answer within the request timeout      -> "timeout"
        │   ├── OverloadedError      429, or 503 such as "The request queue is full."   -> "server_error"
        │   ├── ServerError          500, 502, 504 and any other 5xx; malformed 200     -> "server_error"
        │   │                        ("poison" when every server that answers us fails this row: send/requests.py)
        │   │   └── ResponseTooLargeError  a body over the cap (MAX_RESPONSE_BYTES, 64 MiB)  -> "server_error"
        │   ├── EmptyCompletionError a 200 with no content and no reasoning             -> "empty_completion"
        │   └── WrongModelError      a 200 whose `model` names another model            -> "wrong_model"
        │       └── CheckpointMovedError  a 200 from another weight_version than the server's at start
        ├── RejectedAnswerError      a 200 whose answer is not one to train on: kept in rejected.jsonl, resampled
        │   ├── DegenerateAnswerError  a repetition loop (stopped while it decoded)      -> "degenerate"
        │   └── InvalidAnswerError   failed a check (--validate, --json-schema, hygiene)    -> "invalid"
        ├── BudgetError              the request must change before it can succeed
        │   └── ContextOverflowError a 400 that states the context limit and counts     -> "context_overflow"
        └── FatalRequestError        resending cannot help
            ├── BadRequestError      any other 4xx                                      -> "bad_request"
            ├── AuthError            401/403: the API key is wrong; stops the whole run
            └── EndpointError        a 3xx, a 404 or a URL that cannot be sent: the --servers entry is
                                     wrong; stops the whole run (a fleet problem, never a ledger entry)

`reason` on each request error is the ledger reason a final failure of that kind is written under.
EmptyCompletionError and WrongModelError count against the server and move the row elsewhere like a 5xx;
their reasons are permanent only when every attempt of the row ended that way (send/requests.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# How `generate` ends (cli/__init__.py's docstring says what each means; 3, 4, 5 and 130 leave a resumable directory).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3
EXIT_OUTAGE = 4
EXIT_OUTPUT = 5
EXIT_INTERRUPTED = 130


class PipelineError(Exception):
    """Base class for every error gen-pipeline raises."""


class ConfigError(PipelineError):
    """The user asked for something that cannot work; the message says what to change."""


class ManifestMismatchError(ConfigError):
    """The output directory belongs to a run with different settings."""


class CheckpointChangedError(ManifestMismatchError):
    """The servers serve another checkpoint than the one that wrote the run's rows (--accept-checkpoint)."""


class ExportCheckError(ConfigError):
    """`export` refused a claimed-shard run: shards are open (without --partial), or a key is in two lines."""


class InputError(ConfigError):
    """The input cannot be read as prompts: not JSONL text, or nothing but bad rows at its start."""


class FleetError(PipelineError):
    """No server can be used, or the fleet is inconsistent."""


class PreflightError(FleetError):
    """Problems `check` would report, found when generate starts; `problems` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        if len(problems) == 1:
            text = f"{problems[0]} (`check` calls this a PROBLEM; --force starts anyway)"
        else:
            lines = "".join(f"\nPROBLEM: {p}" for p in problems)
            text = f"refusing to start on {len(problems)} problems (--force starts anyway):{lines}"
        super().__init__(text)
        self.problems = problems


class FleetRedeployedError(FleetError):
    """Every server of the run was retired mid-run: each answers as another checkpoint than the run's."""

    def __init__(self, last: str) -> None:
        super().__init__(
            f"every server was redeployed mid-run (last: {last}); nothing they answered since was written. "
            "Run again with --accept-checkpoint to go on with the new checkpoint (each line names its own)"
        )


class OutputError(PipelineError):
    """Writing the output or the ledger failed; what is on disk stays valid."""


class ValidatorError(PipelineError):
    """A user's answer check (--validate python:MODULE:FUNCTION) failed itself: the run stops (exit 1)."""


class RequestShapeError(PipelineError):
    """A row's request is not one the server renders (multimodal content, bad tool-call arguments)."""


class RequestError(PipelineError):
    """One request to one server failed."""

    reason = "server_error"

    def __init__(self, message: str, *, server: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.status = status


class RetryableError(RequestError):
    """Transport trouble: the same request may succeed later or elsewhere."""


class ConnectError(RetryableError):
    """The server could not be reached at all."""

    reason = "connection"


class ConnectionLostError(RetryableError):
    """The connection broke before a complete response arrived."""

    reason = "connection"


class RequestTimeout(RetryableError):
    """No complete response arrived within the request timeout."""

    reason = "timeout"


class OverloadedError(RetryableError):
    """The server is busy (429, 503); it may say how long to wait."""

    def __init__(
        self,
        message: str,
        *,
        server: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, server=server, status=status)
        self.retry_after = retry_after


class ServerError(RetryableError):
    """The server failed (5xx) or answered with something that is not a completion."""


class ResponseTooLargeError(ServerError):
    """The response body is larger than we read (a proxy's page, a runaway server): never buffered whole."""


class EmptyCompletionError(RetryableError):
    """A 200 whose message has no content and no reasoning: not a completion."""

    reason = "empty_completion"


class WrongModelError(RetryableError):
    """A 200 whose `model` field names a model other than the one asked for."""

    reason = "wrong_model"


class CheckpointMovedError(WrongModelError):
    """A 200 whose metadata.weight_version is not the one its server reported at start: the server was
    redeployed mid-run; it is taken out, and the row goes to another server."""


class RejectedAnswerError(RequestError):
    """A 200 that is a completion, but not one to keep: the answer checks (or the loop guard) refused it.

    `check` names the check that refused it (for example "loop", "json", "schema", "regex", "python",
    "empty", "think_marker", "unfinished_reasoning"); the answer's text and what it cost ride along, so the
    reject can be kept (rejected.jsonl) and counted.
    """

    reason = "invalid"

    def __init__(
        self,
        message: str,
        *,
        check: str,
        server: str = "",
        status: int | None = 200,
        content: str = "",
        reasoning: str | None = None,
        completion_tokens: int | None = None,
        finish_reason: str | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(message, server=server, status=status)
        self.check = check
        self.prompt_tokens = prompt_tokens  # the server's count of the prompt (usage), when it gave one
        self.content = content
        self.reasoning = reasoning
        self.completion_tokens = completion_tokens
        self.finish_reason = finish_reason


class DegenerateAnswerError(RejectedAnswerError):
    """The answer fell into a repetition loop; the loop guard stopped it while it decoded."""

    reason = "degenerate"


class InvalidAnswerError(RejectedAnswerError):
    """The answer failed a check: --validate, --json-schema, or the hygiene checks that are always on."""

    reason = "invalid"


class BudgetError(RequestError):
    """The request does not fit and must change before it is sent again."""

    reason = "context_overflow"


@dataclass(frozen=True)
class OverflowCounts:
    """What a context-length error message says, as numbers.

    `input_tokens` is the server's own count of the prompt (including any reserved draft tokens);
    `lower_bound` is true when the server only says "at least" that many.
    """

    pattern: str
    context_length: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    max_input: int | None = None
    lower_bound: bool = False


class ContextOverflowError(BudgetError):
    """The server rejected the request because prompt plus budget exceed its context."""

    def __init__(
        self,
        message: str,
        *,
        counts: OverflowCounts,
        server: str = "",
        status: int | None = 400,
    ) -> None:
        super().__init__(message, server=server, status=status)
        self.counts = counts


class FatalRequestError(RequestError):
    """Resending this request cannot help."""

    reason = "bad_request"


class BadRequestError(FatalRequestError):
    """The server refused the request for a reason other than its length."""


class AuthError(FatalRequestError):
    """The server refused our credentials; every other request will fail the same way."""


class EndpointError(FatalRequestError):
    """The URL leads nowhere we can send to (a redirect, a 404, not a valid URL); `url` is the one requested."""

    def __init__(self, message: str, *, server: str = "", status: int | None = None, url: str = "") -> None:
        super().__init__(message, server=server, status=status)
        self.url = url
