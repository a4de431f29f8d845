"""`--template FILE`: a Jinja2 template over a row's columns renders its user message.

    Answer the question below in one paragraph.

    Question: {{ question }}
    {% if context %}Context: {{ context }}{% endif %}

Each column of the row is a variable of the template (and the whole row is `row`, for a column whose name
is not a Jinja name: `{{ row["my column"] }}`). The template runs in Jinja2's immutable sandbox: it can
read the row, never change it or reach outside it. A column the template reads and the row has not is an
error of that row (`bad_input`, the reason names the column), as is a printed null, an error the
template raises, or a prompt that renders empty; the run goes on. A template that does not parse is an
error of the run, before anything is read.
"""

from __future__ import annotations

import hashlib
from typing import Any

from jinja2 import StrictUndefined, TemplateError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import missing

from ..errors import ConfigError
from ..records import Messages


class TemplateRowError(ValueError):
    """Why a row cannot be rendered (inputs.rows makes it a bad_input RowError)."""


class _Missing(StrictUndefined):
    """StrictUndefined whose message says which column (or which field of a column's value) the row lacks."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        name, owner = self._undefined_name, self._undefined_obj
        if self._undefined_hint:
            return self._undefined_hint
        if owner is missing:
            return f"--template reads column {name!r}, which this row does not have"
        return f"--template reads {name!r} of a {type(owner).__name__} value that has no such field"


def _finalize(value: Any) -> Any:
    """What a printed expression shows: a null is an error (a template would print the word "None")."""
    if value is None:
        raise TemplateRowError("--template printed a null value (a column that is null in this row)")
    return value


class PromptTemplate:
    """A compiled --template: `render(row)` is the user message's text, `messages(row)` the row's messages."""

    def __init__(self, text: str, name: str = "--template") -> None:
        self.text, self.name = text, name
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        env = ImmutableSandboxedEnvironment(undefined=_Missing, autoescape=False, finalize=_finalize)
        try:
            self._template = env.from_string(text)
        except TemplateError as exc:
            lineno = getattr(exc, "lineno", None)  # a TemplateSyntaxError's
            where = f" line {lineno}" if lineno else ""
            raise ConfigError(f"{name}{where}: the template does not parse: {exc.message or exc}") from None

    def render(self, row: dict[str, Any]) -> str:
        """The user message for one row; TemplateRowError when the row cannot be rendered."""
        names = {k: v for k, v in row.items() if isinstance(k, str)}
        try:
            text = self._template.render({"row": row, **names})
        except TemplateRowError:
            raise
        except UndefinedError as exc:  # _Missing's message: the column the row lacks
            raise TemplateRowError(str(exc)) from None
        except Exception as exc:  # anything the template raises on this row's values (a SecurityError too)
            raise TemplateRowError(f"--template failed on this row: {type(exc).__name__}: {exc}") from None
        if not text.strip():
            raise TemplateRowError("--template rendered an empty prompt for this row")
        return text

    def messages(self, row: dict[str, Any]) -> Messages:
        """The row's messages: one user turn, the rendered template."""
        return [{"role": "user", "content": self.render(row)}]
