"""The Python API: generate / agenerate with the command line's options, the docs' example, the exports."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e import fleet_in_thread, read_jsonl

import gen_pipeline
from gen_pipeline.config import RunConfig
from gen_pipeline.errors import ConfigError
from gen_pipeline.progress.display import in_notebook
from gen_pipeline.progress.stats import format_summary
from gen_pipeline.sim import SimConfig, free_ports
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter

REPO = Path(__file__).resolve().parents[1]
DEADLINE = 60.0


def test_exports_are_sorted_and_complete() -> None:
    """__all__ is sorted, names every public object the package root offers, and each one resolves."""
    names = gen_pipeline.__all__
    assert names == sorted(names)
    public = {n for n in dir(gen_pipeline) if not n.startswith("_")}
    public -= {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    submodules = {n for n, v in vars(gen_pipeline).items() if type(v).__name__ == "module"}
    assert public - submodules == set(names) - {"__version__"}
    assert all(getattr(gen_pipeline, n) is not None for n in names)


def test_importing_the_package_imports_no_dependency() -> None:
    """`import gen_pipeline` stays cheap (its names load on first use), so the command's stop handlers
    are in place before the heavy imports; `gen_pipeline.generate` still works as before."""
    code = (
        "import sys, gen_pipeline\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'orjson', 'transformers', 'tqdm'}))\n"
        "print(gen_pipeline.generate.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "gen_pipeline.api"]


def notebook_example() -> str:
    """The first Python block of the notebook guide (docs/how-to/notebook.md), as a user would paste it."""
    page = (REPO / "docs" / "how-to" / "notebook.md").read_text()
    match = re.search(r"```python\n(.*?)```", page, re.S)
    assert match, "the notebook guide has no python block"
    return match.group(1)


def in_thread(fn: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    """Call fn on another thread (no event loop running there) and wait at most `timeout` seconds."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"no result within {timeout} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A working folder holding prompts/sample.jsonl, as in a fresh clone; yields the example's --servers."""
    (tmp_path / "prompts").mkdir()
    shutil.copy(REPO / "prompts" / "sample.jsonl", tmp_path / "prompts" / "sample.jsonl")
    monkeypatch.chdir(tmp_path)
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(2)), health_delay=0.0)) as servers:
        yield servers


def _example(servers: str, out: str) -> str:
    code = notebook_example().replace('servers="127.0.0.1:30000-30007"', f'servers="{servers}"')
    assert f'servers="{servers}"' in code
    return code.replace('out="runs/notebook"', f'out="{out}"')


def _check_example_run(namespace: dict[str, Any], out: Path) -> None:
    """20 rows read and completed; the system prompt put first where a row had none, and counted."""
    summary = namespace["summary"]
    assert summary["exit_code"] == 0 and summary["read"] == 20 and summary["completed"] == 20
    rows = read_jsonl(out / "completions.jsonl")
    assert len(rows) == 20
    counter = load_counter(str(TINY_TOKENIZER))
    added = 0
    for row in rows:
        assert row["messages"][0]["role"] == "system"
        added += row["messages"][0]["content"] == "Answer in at most three sentences."
        assert row["input_tokens"] == counter.count([row["messages"]])[0] == row["prompt_tokens"]
    assert 0 < added < 20  # the sample has rows with their own system turn: those keep theirs


def test_notebook_example_runs_as_written(notebook: str) -> None:
    """The notebook guide's example, pasted into a script, runs against a simulated fleet."""
    namespace: dict[str, Any] = {}
    in_thread(lambda: exec(_example(notebook, "runs/script"), namespace))
    _check_example_run(namespace, Path("runs/script"))


def test_notebook_example_runs_inside_a_running_event_loop(notebook: str) -> None:
    """The same example in a notebook cell (a loop is running): generate() runs the job on its own thread."""
    namespace: dict[str, Any] = {}

    async def cell() -> None:
        exec(_example(notebook, "runs/cell"), namespace)

    in_thread(lambda: asyncio.run(asyncio.wait_for(cell(), DEADLINE)))
    _check_example_run(namespace, Path("runs/cell"))


class FakeShell:
    """IPython's shell as `get_ipython()` returns it: a Jupyter kernel's config has IPKernelApp."""

    def __init__(self, kernel: bool) -> None:
        self.config = {"IPKernelApp": {"connection_file": "kernel.json"}} if kernel else {"TerminalIPythonApp": {}}


def fake_ipython(monkeypatch: pytest.MonkeyPatch, shell: FakeShell | None) -> None:
    """`sys.modules["IPython"]` as inside a kernel (or a terminal IPython, or IPython imported but no shell)."""
    module = types.ModuleType("IPython")
    module.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", module)


@pytest.mark.parametrize(
    ("shell", "expected"), [(FakeShell(kernel=True), True), (FakeShell(kernel=False), False), (None, False)]
)
def test_in_notebook_is_a_jupyter_kernel_only(monkeypatch: pytest.MonkeyPatch, shell, expected) -> None:
    """A kernel's IPython counts as a notebook; a terminal IPython, or IPython with no shell, does not."""
    assert in_notebook() is False  # a test run is no notebook
    fake_ipython(monkeypatch, shell)
    assert in_notebook() is expected


def test_a_notebook_cell_shows_a_progress_bar_and_prints_the_summary(
    notebook: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a Jupyter kernel (stderr is no terminal there) progress="auto" draws tqdm's bar instead of log
    lines nobody sees, and generate() prints the summary the command prints."""
    fake_ipython(monkeypatch, FakeShell(kernel=True))
    namespace: dict[str, Any] = {}

    async def cell() -> None:
        exec(_example(notebook, "runs/shown"), namespace)

    in_thread(lambda: asyncio.run(asyncio.wait_for(cell(), DEADLINE)))
    _check_example_run(namespace, Path("runs/shown"))
    out, err = capsys.readouterr()
    assert "20/20" in err and "100%" in err and "done 20" in err, err  # the bar's count of its total, its line
    assert format_summary(namespace["summary"]) in out, out


def test_agenerate_runs_on_the_running_loop(notebook: str) -> None:
    """`await agenerate(...)` with the example's arguments returns the same summary."""
    code = _example(notebook, "runs/await").replace("gen_pipeline.generate(", "await gen_pipeline.agenerate(")
    body = "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, Any] = {}
    exec(f"async def cell():\n{body}    return summary\n", namespace)
    summary = in_thread(lambda: asyncio.run(asyncio.wait_for(namespace["cell"](), DEADLINE)))
    _check_example_run({"summary": summary}, Path("runs/await"))


def test_a_bad_server_string_fails_at_once(tmp_path: Path) -> None:
    """A malformed CLI-style server string is a ConfigError before anything waits for servers."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="bad server"):
        gen_pipeline.generate(input=path, out=tmp_path / "out", servers="127.0.0.1:30000-3x", startup_timeout=600)
    assert not (tmp_path / "out").exists()


def test_run_config_takes_a_server_string_and_str_paths(tmp_path: Path) -> None:
    """RunConfig (gen_pipeline.run's argument) reads a CLI-style server string instead of its characters."""
    config = RunConfig(input=str(tmp_path / "p.jsonl"), out=str(tmp_path / "o"), servers="10.0.0.1:30000-30001")  # type: ignore[arg-type]
    assert config.servers == ("http://10.0.0.1:30000", "http://10.0.0.1:30001")
    assert config.input == tmp_path / "p.jsonl" and config.out == tmp_path / "o"
    with pytest.raises(ConfigError, match="bad server"):
        RunConfig(input=tmp_path, out=tmp_path, servers="not a server")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_token": 10}, r"unknown option\(s\) \['max_token'\]"),
        ({"workers": 2}, "the Python API runs one process"),
        ({"shard": (0, 2)}, r"unknown option\(s\) \['shard'\]"),  # the static shards of an older version
        ({"sampling": "{not json"}, "--sampling is not valid JSON"),
        ({"retry_failed": "timeouts"}, "unknown ledger reason"),
        ({"limit": 0}, "--limit must be at least 1"),
        # typed as argparse types the flags (a "hot" temperature was sent; "abc" raised a bare TypeError)
        ({"temperature": "hot"}, "temperature must be float, not 'hot'"),
        ({"top_p": True}, "top_p must be float, not True"),
        ({"seed": 1.5}, "seed must be int, not 1.5"),
        ({"max_attempts": "3"}, "max_attempts must be int"),
        ({"max_tokens": "abc"}, "max_tokens must be int, not 'abc'"),
        ({"concurrency": 2.5}, "concurrency must be int or None, not 2.5"),
        ({"progress": 1}, "progress must be"),
        ({"input": None}, "input must be a path"),
    ],
)
def test_bad_options_are_config_errors(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    """Options are checked as the command line checks its flags."""
    with pytest.raises(ConfigError, match=message):
        gen_pipeline.generate(**{"input": tmp_path / "p.jsonl", "out": tmp_path / "o", **options})


def test_options_build_what_the_flags_build(tmp_path: Path) -> None:
    """The API and the command line share one builder: the same options give the same RunConfig."""
    from gen_pipeline.api import api_config
    from gen_pipeline.cli import build_parser, config_from_args

    argv = ["generate", "-i", "p.jsonl", "-o", "o", "-s", "h:1-2", "--temperature", "0.5", "--sampling", '{"top_k": 3}']
    argv += ["--retry-failed", "timeout", "--limit", "7", "--max-attempts", "2", "--api-key", "k"]
    from_cli = config_from_args(build_parser("generate").parse_args(argv))
    options = {"temperature": 0.5, "sampling": {"top_k": 3}, "retry_failed": ["timeout"], "limit": 7}
    from_api = api_config("p.jsonl", "o", "h:1-2", {**options, "max_attempts": 2, "api_key": "k"})
    assert from_api == from_cli
    assert from_api.sampling == {"top_k": 3, "temperature": 0.5} and from_api.retry.max_attempts == 2
