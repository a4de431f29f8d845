"""The docs site (docs/, mkdocs.yml): its generated CLI reference is complete, and no page points outside the
repository. `make docs` (in CI) builds it with --strict, which checks every link and the nav."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from gen_pipeline.cli import subcommands

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def cli_reference() -> ModuleType:
    """docs/hooks/cli_reference.py, the MkDocs hook that writes reference/cli.md."""
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_names_every_flag_of_every_subcommand():
    """Each option string of each subcommand, hidden ones too, is in its subcommand's section of the page."""
    hook = cli_reference()
    page = hook.render()
    commands = subcommands()
    assert set(commands) >= {"generate", "simulate", "prepare", "export", "check", "status", "report"}
    for name, parser in commands.items():
        section = page.split(f"\n## gen-pipeline {name}\n", 1)[1].split("\n## gen-pipeline ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for flag in names:
                assert f"`{flag}" in section, f"gen-pipeline {name} {flag} is not in the CLI reference"


def test_the_cli_reference_shows_defaults_and_help():
    """A flag's row gives its default and its help text (--max-tokens: 2048 and the parser's words)."""
    from gen_pipeline.config import DEFAULT_MAX_TOKENS

    page = cli_reference().render()
    row = next(line for line in page.splitlines() if line.startswith("| `--max-tokens"))
    assert f"`{DEFAULT_MAX_TOKENS}`" in row and "output budget per prompt" in row


def test_a_hidden_flag_without_words_stops_the_build():
    """A flag hidden from --help that the reference has no words for is an error, not a silent gap."""
    hook = cli_reference()
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret-knob", help=argparse.SUPPRESS)
    with pytest.raises(KeyError, match="--secret-knob"):
        hook.render_command("x", parser, set())


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_points_outside_the_repository(path: Path):
    """Relative links stay inside the repository, and nothing names the team's ../shared folder: a user's
    clone has neither (the README once sent users to ../shared/reference/server-api.md)."""
    text = path.read_text()
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(REPO), f"{target} leaves the repository"
        generated = resolved == DOCS / cli_reference().PAGE  # written by the hook at build time
        assert resolved.exists() or generated, f"{target} does not exist"


def reference(page: str) -> str:
    return (DOCS / "reference" / page).read_text()


def test_every_ledger_reason_has_a_row_in_the_reference():
    """Each reason a ledger entry can carry (records' permanent and transient sets, and the `reason` of every
    request error in errors.py's tree) is a row of reference/ledger.md."""
    from gen_pipeline import errors
    from gen_pipeline.records import ALL_REASONS

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    reasons = set(ALL_REASONS) | {c.reason for c in subclasses(errors.RequestError)}
    rows = set(re.findall(r"^\| `(\w+)` \|", reference("ledger.md"), re.M))
    assert reasons <= rows, f"reference/ledger.md lacks {sorted(reasons - rows)}"


def test_every_exit_code_has_a_row_in_the_reference():
    """Each exit code the commands define (errors.py's EXIT_*, check's, status's, a closed pipe's) is a row of
    reference/exit-codes.md."""
    from gen_pipeline import cli, errors
    from gen_pipeline.preflight import check
    from gen_pipeline.views import status

    codes = {v for m in (errors, check, status, cli) for k, v in vars(m).items() if k.startswith("EXIT_")}
    rows = {int(c) for c in re.findall(r"^\|(?: [^|]+ \|)? (\d+) \|", reference("exit-codes.md"), re.M)}
    assert codes <= rows, f"reference/exit-codes.md lacks {sorted(codes - rows)}"


def test_every_metric_has_a_row_in_the_reference():
    """Each series engine/metrics.py writes is a row of reference/metrics.md (counters with their _total)."""
    from gen_pipeline.engine import metrics

    source = Path(metrics.__file__).read_text()
    names = set(re.findall(r'"(gen_pipeline_[a-z_]+)"', source))
    assert len(names) >= 10, names
    rows = set(re.findall(r"^\| `(gen_pipeline_[a-z_]+)", reference("metrics.md"), re.M))
    missing = [n for n in names if n not in rows and f"{n}_total" not in rows]
    assert not missing, f"reference/metrics.md lacks {missing}"


def documented_keys(doc: dict[str, object], nested: tuple[str, ...]) -> set[str]:
    """The document's keys, and those of its `nested` objects (per-server objects: their first server's)."""
    keys = set(doc)
    for name in nested:
        value = doc.get(name)
        if isinstance(value, dict):
            inner = next(iter(value.values()), {}) if name == "servers" else value
            keys |= set(inner) if isinstance(inner, dict) else set()
    return keys


@pytest.mark.slow
def test_every_field_a_run_writes_is_in_the_run_directory_reference(tmp_path: Path):
    """A run on the simulated fleet (thinking, samples with seeds, an over-length row, a carried field, a chat
    ending in an old answer, answers the checks reject) writes
    no field of completions.jsonl, failures.jsonl, rejected.jsonl, manifest.json, summary.json or status.json that
    reference/run-directory.md does not name."""
    import orjson
    from procs import run_generate, sim_fleet

    rows = [{"id": i, "prompt": f"Question {i}: why?", "topic": "t"} for i in range(6)]
    rows.append({"id": "long", "prompt": "word " * 2000})
    chat = [
        {"role": "user", "content": "Hi."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Old."},
    ]
    rows.append({"id": "chat", "messages": chat})  # merged user turns, a trailing answer: reshaped, reference
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "run"
    sim = ("--context-length", "1024", "--reasoning-words", "5", "--cache-report", "--invalid", "think_marker:0.3")
    with sim_fleet(2, *sim) as servers:
        done = run_generate(inp, out, servers, "--samples", "2", "--seed", "3", "--max-tokens", "64")
    assert done.returncode == 0, done.stderr
    page = reference("run-directory.md")
    named = set(re.findall(r"`(\w+)`", page))

    def line_keys(name: str) -> set[str]:
        return set().union(*(orjson.loads(line) for line in (out / name).read_bytes().splitlines()))

    written = {
        "completions.jsonl": line_keys("completions.jsonl"),
        "failures.jsonl": line_keys("failures.jsonl"),
        "rejected.jsonl": line_keys("rejected.jsonl"),
        "manifest.json": documented_keys(orjson.loads((out / "manifest.json").read_bytes()), ("provenance",)),
        "summary.json": documented_keys(orjson.loads((out / "summary.json").read_bytes()), ("servers",)),
        "status.json": documented_keys(
            orjson.loads((out / "status.json").read_bytes()), ("counts", "rates", "servers")
        ),
    }
    assert {"reasoning_content", "reference"} <= written["completions.jsonl"] and "reason" in written["failures.jsonl"]
    assert "reshaped" in written["summary.json"]
    for name, keys in written.items():
        assert f"## `{name}`" in page, name
        assert keys <= named, f"reference/run-directory.md does not name {sorted(keys - named)} of {name}"


def test_help_text_is_text_in_the_reference(monkeypatch: pytest.MonkeyPatch):
    """Help that holds markup characters (`<think>...</think>`, a `|`) shows as written, not as HTML or a table
    split, and the usage lines wrap the same whatever the terminal's width."""
    hook = cli_reference()
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--reasoning", help="in its content as <think>...</think> | or *left* out")
    section = "\n".join(hook.render_command("x", parser, set()))
    assert "&lt;think&gt;...&lt;/think&gt; \\| or \\*left\\* out" in section
    monkeypatch.setenv("COLUMNS", "40")
    narrow = hook.render()
    monkeypatch.setenv("COLUMNS", "300")
    assert hook.render() == narrow
