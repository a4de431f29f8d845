"""Run configuration: frozen value objects built once by the CLI and passed down explicitly."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .records import ALL_REASONS
from .tokens import clamp_max_tokens

DEFAULT_SERVERS = "127.0.0.1:30000-30007"
DEFAULT_CONCURRENCY = 64
DEFAULT_MAX_TOKENS = 2048
DEFAULT_MIN_TOKENS = 16
# The count is exact; the margin only absorbs the servers' off-by-ones (SGLang's scheduler refuses
# inputs of context - 6 or more, and <= 0.5.9 refuses input + max_tokens == context).
DEFAULT_SAFETY_MARGIN = 16
DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_BUDGET_ATTEMPTS = 3
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
# Honour a server's Retry-After, but never park a request for longer than this.
MAX_RETRY_AFTER = 60.0
# A request's default timeout: a fixed part plus a part per token it may generate.
BASE_REQUEST_TIMEOUT = 120.0
TIMEOUT_PER_TOKEN = 0.1
# A response body larger than this is an error (ResponseTooLargeError), never read further into memory.
MAX_RESPONSE_BYTES = 64 * 2**20
DEFAULT_STARTUP_TIMEOUT = 120.0
DEFAULT_GRACE_PERIOD = 10.0
DEFAULT_FSYNC_INTERVAL = 1.0
DEFAULT_OUTAGE_TIMEOUT = 1800.0
DEFAULT_TOKENIZE_BATCH = 256
# A learned count offset (speculative-decoding reserve, an uncounted template prefix) is capped here.
MAX_LEARNED_OFFSET = 256
OFFSET_EVIDENCE = 3

_RANGE = re.compile(r"^(?P<host>.+?):(?P<lo>\d+)-(?P<hi>\d+)$")
_PORTS = re.compile(r"^(?P<lo>\d+)(?:-(?P<hi>\d+))?$")


def parse_ports(spec: str) -> list[int]:
    """Ports from "30000-30007", "30000,30002" or a mix."""
    ports: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _PORTS.match(part)
        if not m:
            raise ConfigError(f"bad port or port range {part!r}")
        lo, hi = int(m["lo"]), int(m["hi"] or m["lo"])
        if hi < lo or not 0 < lo <= hi <= 65535:
            raise ConfigError(f"bad port range {part!r}")
        ports.extend(range(lo, hi + 1))
    return ports


def parse_servers(spec: str) -> tuple[str, ...]:
    """Base URLs from "host:30000-30007", "host:port", "http://host:port" or a comma list of them."""
    urls: list[str] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        if part.startswith(("http://", "https://")):
            urls.append(part.rstrip("/"))
            continue
        m = _RANGE.match(part)
        if m:
            urls.extend(f"http://{m['host']}:{p}" for p in parse_ports(f"{m['lo']}-{m['hi']}"))
        elif re.match(r"^[^:/]+:\d+$", part):
            urls.append(f"http://{part}")
        elif _PORTS.match(part):
            urls.extend(f"http://127.0.0.1:{p}" for p in parse_ports(part))
        else:
            raise ConfigError(f"bad server {part!r}: use host:port, host:lo-hi or a URL")
    if not urls:
        raise ConfigError("no servers given")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"a server is listed twice in {spec!r}")
    return tuple(urls)


def parse_reasons(spec: str | None) -> frozenset[str]:
    """Ledger reasons named by --retry-failed ("all" or a comma list)."""
    if not spec:
        return frozenset()
    names = {s.strip() for s in spec.split(",") if s.strip()}
    if "all" in names:
        return ALL_REASONS
    unknown = names - ALL_REASONS
    if unknown:
        raise ConfigError(f"unknown ledger reason(s) {sorted(unknown)}; known: {sorted(ALL_REASONS)} or all")
    return frozenset(names)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one prompt.

    Attributes:
        max_attempts: transport attempts per prompt (connection, timeout, 5xx, 429, 503), each on
            another server when one is healthy.
        budget_attempts: requests a prompt may make with a re-computed budget after a context 400.
        initial_delay / max_delay: exponential backoff bounds between transport attempts (with jitter).
        max_retry_after: the longest Retry-After we honour.
        jitter: the random generator for backoff jitter; tests pass a seeded one.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    budget_attempts: int = DEFAULT_BUDGET_ATTEMPTS
    initial_delay: float = INITIAL_RETRY_DELAY
    max_delay: float = MAX_RETRY_DELAY
    max_retry_after: float = MAX_RETRY_AFTER
    jitter: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.budget_attempts < 1:
            raise ConfigError("--max-attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ConfigError("retry delays must satisfy 0 <= initial <= max")

    @classmethod
    def testing(cls, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> RetryPolicy:
        """No waiting between attempts: for tests and rehearsals."""
        return cls(max_attempts=max_attempts, initial_delay=0.0, max_delay=0.0, max_retry_after=0.0)


@dataclass(frozen=True)
class RunConfig:
    """Everything one `generate` run needs.

    Attributes:
        input: the prompts JSONL. out: the run directory (output, ledger, manifest, summary).
        servers: base URLs of the fleet. tokenizer: local folder or hub name; None means the
            tokenizer_path the servers report. context_length: None means discovered from the servers.
        max_tokens: the default output budget; a row's own max_tokens caps it further.
        min_tokens: below this many tokens of room a prompt is not sent (ledger: over_length).
        safety_margin: tokens kept free beyond the exact count.
        concurrency: requests in flight per server; None means each server's own
            max_running_requests (from /server_info) where it reports one, else DEFAULT_CONCURRENCY.
        model: the model name to send; None means the id the servers report.
        sampling: extra request fields (temperature, top_p, seed, ...); rows may override them.
        api_key: sent as a Bearer token; never written anywhere.
        retry: the retry policy. request_timeout: seconds for one request; None scales with max_tokens.
        retry_failed: ledger reasons whose rows are sent again. force: resume despite a changed manifest.
        progress: "auto" (a bar on a terminal, log lines otherwise), "bar", "log" or "off".
    """

    # input and output
    input: Path
    out: Path
    # fleet and model
    servers: tuple[str, ...] = field(default_factory=lambda: parse_servers(DEFAULT_SERVERS))
    tokenizer: str | None = None
    context_length: int | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # budget
    max_tokens: int = DEFAULT_MAX_TOKENS
    min_tokens: int = DEFAULT_MIN_TOKENS
    safety_margin: int = DEFAULT_SAFETY_MARGIN
    sampling: dict[str, Any] = field(default_factory=dict)
    # parallelism and retries
    concurrency: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout: float | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT
    tokenize_batch: int = DEFAULT_TOKENIZE_BATCH
    # resume and shutdown
    retry_failed: frozenset[str] = frozenset()
    force: bool = False
    grace_period: float = DEFAULT_GRACE_PERIOD
    fsync_interval: float = DEFAULT_FSYNC_INTERVAL
    progress: str = "auto"
    # processes: `workers` > 1 splits the input by a stable hash of the ids; `shard` = (index, count) is
    # set by that parent for each worker process it starts
    workers: int = 1
    shard: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "--max-tokens must be at least 1"),
            (self.min_tokens >= 1, "--min-tokens must be at least 1"),
            (self.min_tokens <= self.max_tokens, "--min-tokens must not exceed --max-tokens"),
            (self.safety_margin >= 0, "--safety-margin must not be negative"),
            (self.concurrency is None or self.concurrency >= 1, "--concurrency must be at least 1"),
            (self.context_length is None or self.context_length > 0, "bad --context-length"),
            (self.request_timeout is None or self.request_timeout > 0, "bad --request-timeout"),
            (self.tokenize_batch >= 1, "bad tokenize batch size"),
            (self.progress in ("auto", "bar", "log", "off"), "--progress: auto, bar, log or off"),
            (self.workers >= 1, "--workers must be at least 1"),
            (self.shard is None or 0 <= self.shard[0] < self.shard[1], "bad --shard"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        reserved = {"model", "messages", "max_tokens", "max_completion_tokens", "stream"}
        if reserved & self.sampling.keys():
            raise ConfigError(f"--sampling may not set {sorted(reserved & self.sampling.keys())}")

    def budget(self, context_length: int, input_tokens: int, row_max_tokens: int | None) -> int | None:
        """The max_tokens generate sends for a prompt, or None when it is over length."""
        return clamp_max_tokens(
            row_max_tokens or self.max_tokens,
            context_length=context_length,
            input_tokens=input_tokens,
            margin=self.safety_margin,
            min_tokens=self.min_tokens,
        )

    def capacity_for(self, reported: int | None) -> int:
        """Requests this process keeps in flight on a server that reports `reported` running slots.

        Worker processes share a server's capacity, each taking its part (rounded up).
        """
        total = self.concurrency or reported or DEFAULT_CONCURRENCY
        return -(-total // self.shard[1]) if self.shard else total

    @property
    def file_suffix(self) -> str:
        """The suffix of this process's own output, ledger, status and summary files."""
        return f"-{self.shard[0]:05d}" if self.shard else ""

    def mine(self, key: int) -> bool:
        """Whether the row with this id key belongs to this process."""
        return self.shard is None or key % self.shard[1] == self.shard[0]

    def timeout_for(self, max_tokens: int) -> float:
        """The timeout of one request that may generate `max_tokens` tokens."""
        if self.request_timeout is not None:
            return self.request_timeout
        return BASE_REQUEST_TIMEOUT + TIMEOUT_PER_TOKEN * max_tokens
