"""The run's validator, built once from its flags: the hygiene checks, then `--json-schema`, then each
`--validate` in the order given. The first check that refuses an answer names the reject.

`--validate python:MODULE:FUNCTION` calls FUNCTION(answer) with an `Answer` (checks.py says what it holds);
it returns None for an answer to keep, or a reason (a str) for one to reject. MODULE is a module name
(imported as Python imports it) or a path to a .py file. A function that raises, or returns anything else,
is a fault of the function, never taken for a bad answer: ValidatorError, which stops the run (exit 1)
with the row left unsettled for the next run.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ValidatorError
from ..records import validate_spec_error
from .checks import HYGIENE, Answer, Check, RegexCheck, SchemaCheck, Verdict, json_answer


@dataclass(frozen=True)
class PythonCheck:
    """--validate python:MODULE:FUNCTION: the user's function, held to its contract (None or a str)."""

    spec: str
    function: Callable[[Answer], Any]

    def __call__(self, answer: Answer) -> Verdict | None:
        try:
            reason = self.function(answer)
        except Exception as exc:
            raise ValidatorError(
                f"--validate {self.spec} raised {type(exc).__name__}: {exc} (on id {answer.id!r} sample "
                f"{answer.sample}); fix the function and run again: the row was not settled"
            ) from exc
        if reason is None:
            return None
        if not isinstance(reason, str):
            raise ValidatorError(
                f"--validate {self.spec} returned {reason!r:.80} (on id {answer.id!r}): it must return None for "
                "an answer to keep, or a reason (a str) for one to reject"
            )
        return Verdict("python", reason or f"refused by {self.spec}")


def load_function(spec: str) -> Callable[[Answer], Any]:
    """The FUNCTION of python:MODULE:FUNCTION; ConfigError when it cannot be found."""
    module_name, _, name = spec.removeprefix("python:").rpartition(":")
    try:
        if module_name.endswith(".py"):
            _on_path(Path(module_name).resolve().parent)  # its sibling modules, as `python FILE` has them
            module = _module_from_file(Path(module_name))
        else:
            _on_path(Path.cwd())  # the working directory, as `python -m` has it (a console script has not)
            module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module failed to import: say so before anything is sent
        raise ConfigError(f"--validate {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"--validate {spec}: {module_name} has no function {name}")
    return function  # type: ignore[no-any-return]


def _on_path(folder: Path) -> None:
    """Put `folder` on the import path, after every other entry (it shadows nothing), for the user's module and
    the modules it imports, now or when its function runs."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def _module_from_file(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    name = f"gen_pipeline_validator_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path.resolve()):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def schema_validator(schema: dict[str, Any]) -> Any:
    """A jsonschema validator of the schema's own draft; ConfigError when the schema is not a valid one."""
    import jsonschema  # only runs that give a schema need it

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"--json-schema: not a valid JSON Schema: {exc.message}") from exc
    return cls(schema)


def build_checks(specs: Sequence[str], schema: dict[str, Any] | None) -> tuple[Check, ...]:
    """The run's checks, in the order they run (ConfigError for a spec or schema that cannot work)."""
    checks: list[Check] = list(HYGIENE)
    if schema is not None:
        checks.append(SchemaCheck(schema_validator(schema)))
    for spec in specs:
        if (error := validate_spec_error(spec)) is not None:
            raise ConfigError(error)
        kind, _, rest = spec.partition(":")
        if kind == "json":
            checks.append(json_answer)
        elif kind == "regex":
            checks.append(RegexCheck(re.compile(rest)))
        else:
            checks.append(PythonCheck(spec, load_function(spec)))
    return tuple(checks)


def unconstrained_json(validate: Sequence[str], sampling: dict[str, Any]) -> str | None:
    """What `check` says of --validate json with nothing that constrains the answers to JSON."""
    if "json" not in validate or "response_format" in sampling:
        return None
    return (
        "--validate json with no response_format (--json-schema FILE, or a response_format in --sampling): nothing "
        "constrains the answers to JSON, so each one the model writes in prose is rejected and resampled"
    )


class Validator:
    """The run's checks in order: `verdict(answer)` is the first refusal, or None for an answer to keep."""

    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = tuple(checks)

    @classmethod
    def build(cls, specs: Sequence[str] = (), schema: dict[str, Any] | None = None) -> Validator:
        return cls(build_checks(specs, schema))

    def verdict(self, answer: Answer) -> Verdict | None:
        for check in self.checks:
            found = check(answer)
            if found is not None:
                return found
        return None
