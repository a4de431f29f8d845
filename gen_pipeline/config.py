"""Run configuration: frozen value objects built once by the CLI and passed down explicitly."""

from __future__ import annotations

import functools
import random
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .errors import ConfigError
from .records import ALL_REASONS, MAX_SAMPLES, TEMPLATE_FIELDS, template_input_error, validate_spec_error

# The tokenizer loader switch, read by the CLI only.
LOADER_ENV = "GEN_PIPELINE_TOKENIZER_LOADER"
DEFAULT_SERVERS = "127.0.0.1:30000-30007"
API_KEY_ENV = "GEN_PIPELINE_API_KEY"  # read by the entry points (the command line, the Python API), nothing below
# --workers hands its claimers the credentials of --servers URLs here (JSON {server: [user, password]}), not on
# their command lines; read by the command line only
SERVER_AUTH_ENV = "GEN_PIPELINE_SERVER_AUTH"
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
SAMPLES_VIA = ("n", "requests")
TURNS = ("last", "all")  # --turns: answer the last user turn, or regenerate every turn
# A rejected answer is sent again at most this often (10% rejects: 1 row in 1000 ledgered; a hopeless row: 3 answers)
DEFAULT_MAX_RESAMPLES = 2
# A learned count offset (speculative-decoding reserve, an uncounted template prefix) is capped here.
MAX_LEARNED_OFFSET = 256
OFFSET_EVIDENCE = 3

MAX_PORT = 65535
_PORTS = re.compile(r"^(?P<lo>\d+)(?:-(?P<hi>\d+))?$")
# "user:password@" in a server URL: everything from "://" to the URL's last "@" (a password may hold "/", "?",
# "#" or "@" typed as they are), never past a space, a comma (the --servers separator) or another "://".
# Sent as HTTP Basic auth, never part of the name a server is shown and recorded under
_USERINFO = re.compile(r"(?<=://)(?:(?!://)[^\s,])*@")


def parse_ports(spec: str) -> list[int]:
    """Ports from "30000-30007", "30000,30002" or a mix."""
    ports: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _PORTS.match(part)
        if not m:
            raise ConfigError(f"bad port or port range {part!r}")
        lo, hi = int(m["lo"]), int(m["hi"] or m["lo"])
        if hi < lo:
            raise ConfigError(f"bad port range {part!r}: it runs backwards")
        if not 0 < lo <= hi <= MAX_PORT:
            raise ConfigError(f"bad port {part!r}: ports are 1-{MAX_PORT}")
        ports.extend(range(lo, hi + 1))
    return ports


def parse_servers(spec: str) -> tuple[str, ...]:
    """Base URLs from "host:30000-30007", "host:port", "http://host:port" (a range too), bare ports, or a
    comma list of them; a bad host or port is a ConfigError. A URL's `user:password@` stays on each of its
    URLs (RunConfig takes it off: `server_name`); no message shows it."""
    urls: list[str] = []
    for n, part in enumerate(filter(None, (p.strip() for p in spec.split(","))), start=1):
        try:
            urls.extend(_part_servers(part))
        except ConfigError as exc:
            if "@" in spec and "@" not in part:  # a comma in a password cut this part off its URL, maybe
                raise ConfigError(
                    f"bad server: part {n} of --servers, not shown (a comma in a password splits --servers: write "
                    f"it %2C): {str(exc).split(': ', 1)[-1] if part not in str(exc) else 'not a server'}"
                ) from None
            raise
    if not urls:
        raise ConfigError("no servers given")
    names = [server_name(u)[0] for u in urls]
    if len(set(names)) != len(urls):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConfigError(f"a server is listed twice in --servers: {twice}")
    return tuple(urls)


def _part_servers(part: str) -> list[str]:
    """The URLs of one comma-separated part of --servers (a bare port or range, host:port, or a URL)."""
    if _PORTS.match(part):
        return [f"http://127.0.0.1:{p}" for p in parse_ports(part)]
    if any(c.isspace() for c in part):  # not quoted: a space may be in its password
        raise ConfigError("bad server: a server URL holds no space (write one in a password as %20)")
    bare = not part.startswith(("http://", "https://"))
    url = f"http://{part}" if bare else part
    named = redact(url)
    shown = named.removeprefix("http://") if bare else named
    if bare and ("/" in shown or ":" not in shown):
        raise ConfigError(f"bad server {shown!r}: use host:port, host:lo-hi or a URL")
    if "?" in named or "#" in named:  # paths are appended to a server's URL: a query would swallow them
        raise ConfigError(f"bad server {re.split('[?#]', shown)[0]!r}: a server URL has no query or fragment")
    userinfo = _userinfo(url)
    return [u.replace("://", f"://{userinfo}", 1) for u in _url_servers(named, shown)]


def _userinfo(url: str) -> str:
    """The `user:password@` of a URL ("" when it has none)."""
    m = _USERINFO.search(url)
    return m[0] if m else ""


def redact(text: str) -> str:
    """`text` with every URL's `user:password@` taken out: what a message may show of a server."""
    return _USERINFO.sub("", text)


def server_name(url: str) -> tuple[str, tuple[str, str] | None]:
    """A server URL as it is shown and recorded (without `user:password@`), and those credentials, if any
    (percent-escapes decoded: they are sent as HTTP Basic auth)."""
    userinfo = _userinfo(url)
    if not userinfo:
        return url, None
    user, _, password = userinfo[:-1].partition(":")
    return redact(url), (unquote(user), unquote(password))


def _url_servers(url: str, given: str) -> list[str]:
    """One URL, or one per port when its port is a range ("http://host:30000-30007/prefix")."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, colon, ports = netloc.rpartition(":") if not netloc.endswith("]") else ("", "", "")
    host = host if colon else netloc  # "[::1]" or "host": no port
    tail = (slash + path).rstrip("/")
    if not host or (colon and not ports):
        raise ConfigError(f"bad server {given!r}: use host:port, host:lo-hi or a URL")
    if not colon:
        return [f"{scheme}://{host}{tail}"]
    try:
        numbers = parse_ports(ports)
    except ConfigError as exc:
        raise ConfigError(f"bad server {given!r}: {exc}") from None
    return [f"{scheme}://{host}:{p}{tail}" for p in numbers]


def parse_reasons(spec: str | Iterable[str] | None) -> frozenset[str]:
    """Ledger reasons named by --retry-failed ("all" or a comma list, or an iterable of names)."""
    if not spec:
        return frozenset()
    parts = spec.split(",") if isinstance(spec, str) else spec
    names = {s.strip() for s in parts if s.strip()}
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
            tokenizer_path the servers report. tokenizer_loader: "auto" (the light loader where the
            folder allows it) or "transformers" (always AutoTokenizer). context_length: None means
            discovered from the servers.
        max_tokens: the default output budget; a row's own max_tokens caps it further.
        min_tokens: below this many tokens of room a prompt is not sent (ledger: over_length).
        safety_margin: tokens kept free beyond the exact count.
        concurrency: requests in flight per server; None means what each server says (fleet/capacity.py: its
            running slots, capped by its KV token pool), else DEFAULT_CONCURRENCY.
        queue_margin: requests kept queued on a server beyond the running ones it reports, so a finished
            request is replaced without a round trip; None means the balancer's default (0 with --concurrency).
        model: the model name to send; None means the id the servers report.
        sampling: extra request fields (temperature, top_p, seed, ...); rows may override them.
        api_key: sent as a Bearer token; never written anywhere.
        server_auth: (user, password) by server, from `http://user:password@host` in `servers`: sent as
            HTTP Basic auth, never shown or written (the servers are named without it).
        retry: the retry policy. request_timeout: seconds for one request; None scales with max_tokens.
        retry_failed: ledger reasons whose rows are sent again. force: resume despite a changed manifest.
        accept_checkpoint: resume although the servers serve another checkpoint than the one that wrote
            the run's rows (the manifest keeps both; each line names its own). --force does not do this.
        progress: "auto" (a bar on a terminal, log lines otherwise), "bar", "log" or "off".
        samples: completions per prompt (a row's own `samples` overrides it), each keyed (id, sample).
        samples_via: "n" (one request with n = the samples missing, where the server honours it) or
            "requests" (one request per sample, all on one server so its prefix cache serves the prompt).
        thinking_budget: the server's thinking-token budget to send (None: none sent).
        turns: "last" (answer each row's last user turn) or "all" (replay each row's conversation, every
            user turn answered by the target with its own earlier answers as history; send/turns.py).
        limit: read only the first `limit` lines of the input (None: all of it).
        system_prompt: a system turn put first in every row that has none (counted and sent like the rest).
        redo_changed: answer again the answered rows whose prompt in the input changed since (resume/changes.py);
            without it they are counted and named, their old answers kept.
        append_input: this run adds another input's rows to an --out that holds earlier inputs' on purpose (the
            nightly job): no warning that --out was last run with another --input (engine.setup.input_warnings).
        template: the text of a Jinja2 template over a row's columns that renders its user message
            (--template FILE; inputs/template.py); None: each row's own messages.
        tools / chat_template_kwargs: the OpenAI tools list and template switches of every row that has
            none of its own (rendered into the count and sent; ../shared/reference/server-api.md §1.6).
        validate / json_schema: the answer checks run after the hygiene ones (answers/validate.py); the
            schema is also sent as `response_format` (in `sampling`). max_resamples: a rejected answer is sent
            again at most this often, then its (id, sample, turn) is ledgered `invalid` or `degenerate`.
        loop_guard: "on" streams answers past the loop guard (answers/loops.py), "off" reads them whole.
    """

    # input and output
    input: Path
    out: Path
    # fleet and model
    servers: tuple[str, ...] = field(default_factory=lambda: parse_servers(DEFAULT_SERVERS))
    tokenizer: str | None = None
    tokenizer_loader: str = "auto"
    context_length: int | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    server_auth: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    # budget
    max_tokens: int = DEFAULT_MAX_TOKENS
    min_tokens: int = DEFAULT_MIN_TOKENS
    safety_margin: int = DEFAULT_SAFETY_MARGIN
    sampling: dict[str, Any] = field(default_factory=dict)
    # samples and reasoning
    samples: int = 1
    samples_via: str = "n"
    thinking_budget: int | None = None
    turns: str = "last"
    # rows
    limit: int | None = None
    system_prompt: str | None = None
    template: str | None = None
    redo_changed: bool = False
    append_input: bool = False
    tools: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # answers (answers/, send/resample.py)
    validate: tuple[str, ...] = ()
    json_schema: dict[str, Any] | None = None
    max_resamples: int = DEFAULT_MAX_RESAMPLES
    loop_guard: str = "on"
    # parallelism and retries
    concurrency: int | None = None
    queue_margin: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout: float | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT
    tokenize_batch: int = DEFAULT_TOKENIZE_BATCH
    # resume and shutdown
    retry_failed: frozenset[str] = frozenset()
    force: bool = False
    accept_checkpoint: bool = False
    grace_period: float = DEFAULT_GRACE_PERIOD
    fsync_interval: float = DEFAULT_FSYNC_INTERVAL
    progress: str = "auto"
    # processes: `workers` > 1 starts that many claimer processes on this node (shards/workers.py)
    workers: int = 1
    # claimed shards (shards/claims.py): `shards` = V of a new run directory, `join` = claim beside other processes,
    # `share` = how many claimers of one node split each server's capacity (--workers K sets K)
    shards: int | None = None
    join: bool = False
    share: int = 1
    # observing (engine/metrics.py): /metrics on metrics_host:metrics_port, the textfile metrics_file; every series
    # carries worker=metrics_worker (set by --workers K for each claimer)
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    metrics_file: Path | None = None
    metrics_worker: str = "0"
    # cost (progress/cost.py): GPUs behind each server, for GPU-hours in summary.json
    gpus_per_server: int = 1
    # alerts (progress/alerts.py): no completion for stall_minutes is a stall; on_stall runs once per stall
    stall_minutes: float = 10.0
    on_stall: str | None = None

    def __post_init__(self) -> None:
        for name, value in vars(self).items():  # the Python API's keywords are not typed by argparse
            if not fits(value, _field_types()[name]):
                raise ConfigError(f"{name} must be {type_name(_field_types()[name])}, not {value!r}")
        # a server string ("host:30000-30007") and str paths are taken as the CLI takes them
        servers = self.servers if isinstance(self.servers, str) else ",".join(self.servers)
        named = [server_name(url) for url in parse_servers(servers)]
        object.__setattr__(self, "servers", tuple(name for name, _ in named))
        auth = {**self.server_auth, **{name: cred for name, cred in named if cred is not None}}
        object.__setattr__(self, "server_auth", auth)
        if auth and self.api_key:
            raise ConfigError("a --servers URL carries user:password@ and --api-key is set too: use one of them")
        object.__setattr__(self, "input", Path(self.input))
        object.__setattr__(self, "out", Path(self.out))
        if self.metrics_file is not None:
            object.__setattr__(self, "metrics_file", Path(self.metrics_file))
        checks = [
            (self.limit is None or self.limit >= 1, "--limit must be at least 1"),
            (self.system_prompt is None or bool(self.system_prompt.strip()), "--system-prompt is empty"),
            (self.max_tokens >= 1, "--max-tokens must be at least 1"),
            (self.min_tokens >= 1, "--min-tokens must be at least 1"),
            (self.min_tokens <= self.max_tokens, f"--min-tokens exceeds --max-tokens {self.max_tokens}: lower it"),
            (self.safety_margin >= 0, "--safety-margin must not be negative"),
            (self.concurrency is None or self.concurrency >= 1, "--concurrency must be at least 1"),
            (self.queue_margin is None or self.queue_margin >= 0, "--queue-margin must be at least 0"),
            (self.context_length is None or self.context_length > 0, "bad --context-length"),
            (self.request_timeout is None or self.request_timeout > 0, "bad --request-timeout"),
            (self.tokenize_batch >= 1, "bad tokenize batch size"),
            (self.tokenizer_loader in ("auto", "transformers"), f"{LOADER_ENV} must be auto or transformers"),
            (self.progress in ("auto", "bar", "log", "off"), "--progress: auto, bar, log or off"),
            (self.workers >= 1, "--workers must be at least 1"),
            (self.shards is None or self.shards >= 1, "--shards must be at least 1"),
            (self.share >= 1, "bad --share"),
            (self.gpus_per_server >= 1, "--gpus-per-server must be at least 1"),
            (self.stall_minutes > 0, "--stall-minutes must be positive"),
            (self.metrics_port is None or 0 <= self.metrics_port <= MAX_PORT, "bad --metrics-port"),
            (1 <= self.samples <= MAX_SAMPLES, f"--samples must be from 1 to {MAX_SAMPLES}"),
            (self.samples_via in SAMPLES_VIA, f"--samples-via: {' or '.join(SAMPLES_VIA)}"),
            (self.thinking_budget is None or self.thinking_budget >= 0, "--thinking-budget must not be negative"),
            (self.turns in TURNS, f"--turns: {' or '.join(TURNS)}"),
            (self.loop_guard in ("on", "off"), "--loop-guard: on or off"),
            ("n" not in self.sampling, '"n" in --sampling: use --samples (the run keeps every sample)'),
            (self.max_resamples >= 0, "--max-resamples must not be negative"),
            *((validate_spec_error(str(v)) is None, validate_spec_error(str(v)) or "") for v in self.validate),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if (error := template_input_error(self.tools, self.chat_template_kwargs)) is not None:
            raise ConfigError(f"--tools/--chat-template-kwargs: {error}")
        if not self.sampling.keys().isdisjoint(TEMPLATE_FIELDS):
            raise ConfigError("tools and chat_template_kwargs are settings of their own, not sampling fields")
        reserved = {"model", "messages", "max_tokens", "max_completion_tokens", "stream"}
        if reserved & self.sampling.keys():
            raise ConfigError(f"--sampling may not set {sorted(reserved & self.sampling.keys())}")

    def capacity_for(self, total: int) -> int:
        """This process's part of a server's capacity of `total` requests (fleet.capacity.server_capacity): the
        claimers of one node (--workers K) share it, each taking its part (rounded up)."""
        return -(-total // self.share)

    def timeout_for(self, max_tokens: int) -> float:
        """The timeout of one request that may generate `max_tokens` tokens."""
        if self.request_timeout is not None:
            return self.request_timeout
        return BASE_REQUEST_TIMEOUT + TIMEOUT_PER_TOKEN * max_tokens


# RunConfig fields no flag sets (the environment, --workers' claimers, tests): a config file never sets them
# and the manifest's "settings" leave them out.
INTERNAL_FIELDS = frozenset({"tokenizer_loader", "server_auth", "tokenize_batch", "share", "metrics_worker"})
# Fields a caller may give in another form, which __post_init__ turns into the declared one.
GIVEN_AS = {"input": str | Path, "out": str | Path, "metrics_file": str | Path | None, "servers": str | tuple | list}


@functools.cache
def _field_types() -> dict[str, Any]:
    return {**typing.get_type_hints(RunConfig), **GIVEN_AS}


def fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the declared type `hint` (an int for a float; never a bool for a number; a
    container by its kind only)."""
    if hint is Any:
        return True
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return any(fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, typing.get_origin(hint) or hint)


def type_name(hint: Any) -> str:
    """A declared type as a user reads it: "int or None"."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(type_name(h) for h in typing.get_args(hint))
    return "None" if hint is type(None) else str(getattr(hint, "__name__", hint))
