"""What a server does with a `response_format` (the JSON Schema of `--json-schema`, or a JSON object asked for
in `--sampling`): whether it constrains the answer to it, and how much whitespace its grammar lets through.

Measured on the real servers (tests/test_realserver_answers.py), each taking the OpenAI shape gen-pipeline
sends, `{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}`, and constraining the answer:
- SGLang (0.5.23) with its grammar backend (xgrammar unless `--grammar-backend`); `/server_info` reports the
  backend and its whitespace settings. By default any run of whitespace may stand between the JSON's tokens, and
  a model can spend max_tokens on it, leaving the JSON unfinished (a random model did on every request; real
  ones do now and then); `--constrained-json-disable-any-whitespace` (compact JSON) or
  `--constrained-json-max-whitespace-cnt N` bound it. With `--grammar-backend none` it refuses every such
  request with a 400. With `--reasoning-parser`, the grammar starts where the thinking ends.
- vLLM: its structured outputs (xgrammar, or guidance), with the same unbounded whitespace unless started
  with `--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`; it does not
  report which.
- llama.cpp: a grammar built from the schema, whose whitespace is bounded (a space, or one or two newlines
  and at most 20 spaces or tabs); the thinking comes before it.
Any other server is not known to constrain anything: its answers are only checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# response_format types that ask the server for JSON (a "text" one asks for nothing)
JSON_FORMATS = frozenset({"json_schema", "json_object"})


@dataclass(frozen=True)
class Grammar:
    """SGLang's constrained-decoding settings, as /server_info reports them."""

    backend: str
    disable_any_whitespace: bool = False
    max_whitespace_cnt: int | None = None
    whitespace_pattern: str | None = None
    reasoning_parser: str | None = None

    @classmethod
    def from_server_info(cls, server: dict[str, Any]) -> Grammar | None:
        """The settings of an SGLang /server_info body (None: it reports no grammar backend)."""
        backend = server.get("grammar_backend")
        if not isinstance(backend, str):
            return None
        count = server.get("constrained_json_max_whitespace_cnt")
        pattern, parser = server.get("constrained_json_whitespace_pattern"), server.get("reasoning_parser")
        return cls(
            backend=backend,
            disable_any_whitespace=server.get("constrained_json_disable_any_whitespace") is True,
            max_whitespace_cnt=count if isinstance(count, int) and not isinstance(count, bool) else None,
            whitespace_pattern=pattern if isinstance(pattern, str) else None,
            reasoning_parser=parser if isinstance(parser, str) else None,
        )

    def bounded(self) -> bool | None:
        """Whether the backend bounds the whitespace between the JSON's tokens (None: its pattern decides)."""
        if self.disable_any_whitespace or (self.backend == "xgrammar" and self.max_whitespace_cnt is not None):
            return True
        if self.backend in ("outlines", "llguidance") and self.whitespace_pattern is not None:
            return None
        if self.backend == "outlines":
            return True  # its own default: a single optional space
        return False if self.backend in ("xgrammar", "llguidance") else None


@dataclass(frozen=True)
class Enforcement:
    """What one server does with the run's response_format: `enforced` (None: not known), `whitespace` between
    the JSON's tokens ("bounded", "unbounded" or "unknown"), and how, in words."""

    enforced: bool | None
    whitespace: str
    how: str


def asks_for_json(sampling: dict[str, Any]) -> bool:
    """Whether the run's requests carry a response_format that asks for JSON."""
    response_format = sampling.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") in JSON_FORMATS


def enforcement(kind: str | None, grammar: Grammar | None) -> Enforcement:
    """What a server of `kind` (with SGLang's grammar settings) does with a response_format."""
    if kind == "sglang":
        return _sglang(grammar)
    if kind == "vllm":
        return Enforcement(
            True,
            "unknown",
            "enforced by its structured outputs; whitespace unbounded unless it was started with "
            '--structured-outputs-config \'{"backend": "xgrammar", "disable_any_whitespace": true}\' '
            "(vLLM does not report it)",
        )
    if kind == "llamacpp":
        return Enforcement(True, "bounded", "enforced by a grammar built from the schema (whitespace bounded)")
    return Enforcement(None, "unknown", f"{kind or 'an unknown server'}: not known to enforce it")


def _sglang(grammar: Grammar | None) -> Enforcement:
    if grammar is None:
        return Enforcement(True, "unknown", "enforced by its grammar backend (not reported)")
    if grammar.backend == "none":
        return Enforcement(False, "unknown", "refused: SGLang --grammar-backend none answers a response_format 400")
    bounded = grammar.bounded()
    whitespace = "unknown" if bounded is None else "bounded" if bounded else "unbounded"
    how = f"enforced by {grammar.backend} (whitespace {whitespace})"
    if grammar.reasoning_parser:
        how += ", after the thinking"
    return Enforcement(True, whitespace, how)


def findings(url: str, kind: str | None, grammar: Grammar | None) -> tuple[str | None, str | None]:
    """`check`'s problem and warning (None: none) for a run whose requests ask one server for JSON."""
    found = enforcement(kind, grammar)
    if found.enforced is False:
        return (
            f"{url} runs SGLang with --grammar-backend none: it refuses every request with a response_format "
            "(400), so each row would be ledgered bad_request; start it with a grammar backend (xgrammar, the "
            "default) or leave out --json-schema",
            None,
        )
    if found.enforced is None:
        return None, (
            f"{url} ({kind or 'server kind unknown'}) is not known to constrain answers to a response_format: "
            "an answer that breaks the schema is rejected and resampled, then ledgered invalid"
        )
    if found.whitespace == "unbounded":
        return None, (
            f"{url} (SGLang, {grammar.backend if grammar else '?'}) lets any run of whitespace stand between the "
            "JSON's tokens: a model can spend max_tokens on whitespace and leave the JSON unfinished (rejected, "
            "resampled, then ledgered invalid); start it with --constrained-json-disable-any-whitespace or "
            "--constrained-json-max-whitespace-cnt N"
        )
    return None, None
