"""`--config FILE`: `generate`'s options kept in a TOML file, and the settings a run records.

    # run.toml
    input = "prompts/my.jsonl"
    out = "runs/my-run"
    servers = "gpu-node:30000-30007"
    max-tokens = 4096
    temperature = 0.7
    sampling = { top_k = 20 }

Keys are generate's long flags without their `--` (`max-tokens` and `max_tokens` alike); a flag given on the
command line, or a keyword of the Python API, wins over the file. A value has the type its flag takes (an
integer for --max-tokens, `true` for --force); --sampling and --chat-template-kwargs also take a table,
--servers, --retry-failed and --tools a list. The file is read with the standard library's `tomllib`.
"""

from __future__ import annotations

import difflib
import functools
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import GIVEN_AS, INTERNAL_FIELDS, RunConfig, fits, type_name
from .errors import ConfigError
from .options import BUILT_TYPES, OPTIONS

FILE_OPTIONS = OPTIONS - INTERNAL_FIELDS


@functools.cache
def option_types() -> dict[str, Any]:
    """Each option a file may set -> the types its value may have."""
    hints = {**typing.get_type_hints(RunConfig), **GIVEN_AS, **BUILT_TYPES}
    return {name: hints[name] for name in FILE_OPTIONS}


def read_settings(path: str | Path) -> dict[str, Any]:
    """The options of TOML file `path`, named as the Python API names them (`max_tokens`), each checked
    against its flag's type; a key that is no option is an error naming it (and the option it is close to)."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}") from exc
    settings: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in FILE_OPTIONS and isinstance(value, Mapping):
            raise ConfigError(f"--config {path}: unknown table [{key}]: the flags are keys at the top of the file")
        if name not in FILE_OPTIONS:
            raise ConfigError(f"--config {path}: unknown key {key!r}{_close_to(name)}")
        if name in settings:
            raise ConfigError(f"--config {path}: {key!r} is given twice (as - and as _)")
        settings[name] = _checked(path, key, value)
    return settings


def _close_to(name: str) -> str:
    """ "; did you mean 'max-tokens'?" for a misspelt option, else nothing."""
    close = difflib.get_close_matches(name, sorted(FILE_OPTIONS), n=1)
    return f"; did you mean {close[0].replace('_', '-')!r}?" if close else ""


def _checked(path: Path, key: str, value: Any) -> Any:
    """A file's value for option `key`, when it is of the type the option takes."""
    hint = option_types()[key.replace("-", "_")]
    parts = value if isinstance(value, list) else []
    if not fits(value, hint) or not all(isinstance(p, str | dict) for p in parts):
        raise ConfigError(f"--config {path}: {key} must be {_wanted(hint)}, not {value!r}")
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _wanted(hint: Any) -> str:
    """The TOML kinds of value an option takes, as a user reads them: "str or list" (TOML has no None)."""
    kinds = {"Mapping": "table", "dict": "table", "Path": "path", "Sequence": "list", "tuple": "list"}
    names = [kinds.get(n, n) for n in type_name(hint).split(" or ") if n != "None"]
    return " or ".join(dict.fromkeys(names))


def merged_settings(config_file: str | Path | None, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options of `config_file` (when one is given) overridden by those `given` (keywords, flags)."""
    settings = read_settings(config_file) if config_file is not None else {}
    return {**settings, **given}
