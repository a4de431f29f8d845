"""`generate`'s options as its flags and the Python API write them, turned into one RunConfig.

The command line (cli/generate.py) and `gen_pipeline.generate` both call `build_config`, so a flag and a keyword
mean the same thing: server strings, JSON text or objects, "@FILE" system prompts, tools files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from .answers.validate import Validator
from .config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_TOKENS,
    DEFAULT_SERVERS,
    RetryPolicy,
    RunConfig,
    fits,
    parse_reasons,
    parse_servers,
)
from .errors import ConfigError
from .inputs.rows import as_written
from .inputs.template import PromptTemplate
from .records import TEMPLATE_FIELDS
from .samples import run_samples

# The options `generate` takes (its flags, `-` written `_`) that are not RunConfig fields as they stand, and
# the types each is given as (`--config FILE`'s values are checked against them).
BUILT_TYPES: dict[str, Any] = {
    "sampling": str | Mapping,
    "temperature": float,
    "top_p": float,
    "seed": int,
    "max_attempts": int,
    "retry_failed": str | Sequence,
    "system_prompt": str,
    "tools": str | Sequence,
    "chat_template_kwargs": str | Mapping,
    "template": str,  # the template file's path; RunConfig.template holds its text
    "validate": str | Sequence,
    "json_schema": str | Path | Mapping,
}
BUILT_OPTIONS = frozenset(BUILT_TYPES)
OPTIONS = BUILT_OPTIONS | {f.name for f in fields(RunConfig) if f.name != "retry"}


def build_config(
    input: str | Path,
    out: str | Path,
    *,
    servers: str | Sequence[str] = DEFAULT_SERVERS,
    sampling: str | Mapping[str, Any] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    retry_failed: str | Iterable[str] | None = None,
    system_prompt: str | None = None,
    tools: str | Path | Sequence[Any] | None = None,
    chat_template_kwargs: str | Mapping[str, Any] | None = None,
    template: str | Path | None = None,
    validate: str | Sequence[str] | None = None,
    json_schema: str | Path | Mapping[str, Any] | None = None,
    **options: Any,
) -> RunConfig:
    """A RunConfig from `generate`'s options, written as its flags are (the CLI and the Python API share it).

    `servers` "host:lo-hi" or URLs; `sampling` a JSON object or its text; `retry_failed` "all" or a comma
    list; `system_prompt` the text, or "@FILE" to read it from FILE; `tools` a JSON file's path or the
    list; `chat_template_kwargs` a JSON object or its text (both may come inside `sampling` instead);
    `template` the path of a Jinja2 template file (--template); `validate` one --validate value or several;
    `json_schema` a JSON Schema file's path or the schema (sent as `response_format`). Other options are
    RunConfig fields.
    """
    unknown = options.keys() - OPTIONS
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
    for name, value, kind in (("temperature", temperature, float), ("top_p", top_p, float), ("seed", seed, int)):
        if value is not None and not fits(value, kind):  # the Python API's keywords are not typed by argparse
            raise ConfigError(f"{name} must be {kind.__name__}, not {value!r}")
    if not fits(max_attempts, int):
        raise ConfigError(f"max_attempts must be int, not {max_attempts!r}")
    for name, path in (("input", input), ("out", out)):
        if not isinstance(path, str | Path):
            raise ConfigError(f"{name} must be a path (str or Path), not {path!r}")
    if options.get("min_tokens") is None:  # not given: never above the --max-tokens the user chose
        max_tokens = options.get("max_tokens", DEFAULT_MAX_TOKENS)
        options["min_tokens"] = min(DEFAULT_MIN_TOKENS, max_tokens) if fits(max_tokens, int) else DEFAULT_MIN_TOKENS
    extra = {"temperature": temperature, "top_p": top_p, "seed": seed}
    fields = {**parse_sampling(sampling), **{k: v for k, v in extra.items() if v is not None}}
    try:
        options["sampling"], options["samples"] = run_samples(fields, options.get("samples"))  # n becomes samples
    except ConfigError as exc:  # an "n" beyond 64 bits is quoted as the flag wrote it, not as a float
        raise ConfigError(as_written(str(exc), sampling.encode() if isinstance(sampling, str) else b"")) from None
    kwargs = parse_json_object(chat_template_kwargs, "--chat-template-kwargs")
    given = {"tools": read_tools(tools), "chat_template_kwargs": kwargs}
    options.update(lift_template_inputs(options["sampling"], given))
    options["json_schema"] = read_schema(json_schema)
    if options["json_schema"] is not None:
        options["sampling"] = with_response_format(options["sampling"], options["json_schema"], json_schema)
    options["validate"] = (validate,) if isinstance(validate, str) else tuple(validate or ())
    if options["validate"] or options["json_schema"] is not None:  # a bad schema or function: said before the run
        Validator.build([str(v) for v in options["validate"]], options["json_schema"])
    return RunConfig(
        input=Path(input),
        out=Path(out),
        servers=parse_servers(servers) if isinstance(servers, str) else tuple(servers),
        retry=RetryPolicy(max_attempts=max_attempts),
        retry_failed=parse_reasons(retry_failed),
        system_prompt=read_system_prompt(system_prompt),
        template=read_template(template),
        **options,
    )


def parse_sampling(spec: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """--sampling: a JSON object (or its text) of other request fields."""
    return parse_json_object(spec, "--sampling") or {}


def read_tools(spec: str | Path | Sequence[Any] | None) -> list[Any] | None:
    """--tools: a JSON file holding an OpenAI tools list (or the list itself)."""
    if spec is None or not isinstance(spec, (str, Path)):
        return None if spec is None else list(spec)
    try:
        value = orjson.loads(Path(spec).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"--tools {spec}: cannot read a JSON tools list: {exc}") from exc
    if not isinstance(value, list):
        raise ConfigError(f"--tools {spec}: the file must hold a JSON list of tools")
    return value


def parse_json_object(spec: str | Mapping[str, Any] | None, flag: str) -> dict[str, Any] | None:
    """A flag's JSON object (or its text); None when not given."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, str):
        try:
            spec = orjson.loads(spec)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{flag} is not valid JSON: {exc}") from exc
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{flag} must be a JSON object")
    return dict(spec)


def lift_template_inputs(sampling: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """tools and chat_template_kwargs from their flags or from --sampling (taken out of it, so they are
    counted as well as sent); the sampling left, under "sampling"."""
    out: dict[str, Any] = {"sampling": {k: v for k, v in sampling.items() if k not in TEMPLATE_FIELDS}}
    for name in TEMPLATE_FIELDS:
        if given[name] is not None and sampling.get(name) is not None and given[name] != sampling[name]:
            raise ConfigError(f"{name} is given both in --sampling and as its own flag; keep one")
        out[name] = given[name] if given[name] is not None else sampling.get(name)
    return out


def read_template(path: str | Path | None) -> str | None:
    """--template FILE: the template's text, refused here (ConfigError) when it does not parse."""
    if path is None:
        return None
    if not isinstance(path, str | Path):
        raise ConfigError(f"template must be a path (str or Path), not {path!r}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--template {path}: cannot read it: {exc}") from exc
    PromptTemplate(text, f"--template {path}")  # a template that does not parse stops the run before it starts
    return text


def read_schema(spec: str | Path | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """--json-schema: a file holding a JSON Schema (a JSON object), or the schema itself."""
    if spec is None or isinstance(spec, Mapping):
        return None if spec is None else dict(spec)
    try:
        value = orjson.loads(Path(spec).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"--json-schema {spec}: cannot read a JSON Schema: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"--json-schema {spec}: the file must hold a JSON object (a JSON Schema)")
    return value


def with_response_format(sampling: dict[str, Any], schema: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The sampling with the schema as `response_format`, as SGLang and vLLM take it (they constrain the
    answer to it); refused beside a response_format of --sampling's own."""
    if "response_format" in sampling:
        raise ConfigError("--json-schema and a response_format in --sampling: keep one")
    name = re.sub(r"[^A-Za-z0-9_-]", "_", Path(spec).stem if isinstance(spec, str | Path) else "answer")[:64]
    return {**sampling, "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}


def read_system_prompt(spec: str | None) -> str | None:
    """--system-prompt: the text itself, or "@FILE" for a file's text (its trailing newlines dropped)."""
    if spec is None or not spec.startswith("@"):
        return spec
    path = Path(spec[1:])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--system-prompt {spec}: cannot read {path}: {exc}") from exc
    return text.rstrip("\r\n")
