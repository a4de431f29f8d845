"""The Python API: `generate` and `agenerate`, with the command line's options, defaults and server syntax.

    import gen_pipeline

    summary = gen_pipeline.generate(
        input="prompts/my.jsonl", out="runs/my-run", servers="127.0.0.1:30000-30007", max_tokens=1024, limit=20
    )

Options are `generate`'s flags with `_` for `-` (`max_tokens=`, `system_prompt=`, `retry_failed="all"`,
`sampling={"top_k": 20}`); `config="run.toml"` reads them from a TOML file first (`--config FILE`; a keyword
wins over the file, as a flag does on the command line), and `read_config("run.toml")` builds the RunConfig
alone. The API key falls back to $GEN_PIPELINE_API_KEY as on the command line. Both return the run's
summary, the dict written to summary.json (`summary["exit_code"]` is the command's exit code: 3, 4, 5 and
130 leave the directory resumable; call again to resume). Bad options, an unusable fleet or a refused
resume raise a PipelineError.

Where an event loop is already running (a Jupyter notebook, an async application), `await agenerate(...)`
runs the job on that loop. `generate(...)` there runs it on a thread of its own with its own loop and blocks
until it ends, so the same call works in a script and in a notebook cell. In a notebook the default
`progress="auto"` shows tqdm's notebook bar, and both print the summary the command prints when they end.
Neither installs signal handlers: Ctrl-C (or interrupting the kernel) cancels the run, without the
command's grace period for requests in flight; what is written stays valid and resumable.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .config import API_KEY_ENV, DEFAULT_SERVERS, RunConfig
from .engine.summary import Outcome, describe
from .errors import ConfigError
from .modes import run_async
from .options import build_config
from .progress.display import in_notebook
from .settings import merged_settings


def read_config(config: str | Path | None = None, **options: Any) -> RunConfig:
    """The RunConfig of a TOML file of `generate`'s options (`--config FILE`), each keyword overriding the
    file's (no file: the keywords alone); `gen_pipeline.run(config)` runs it."""
    return api_config(None, None, None, {"config": config, **options})


def api_config(
    input: str | Path | None, out: str | Path | None, servers: str | Sequence[str] | None, options: dict[str, Any]
) -> RunConfig:
    """The RunConfig the command line would build from the same options and `config` file (one process:
    no `workers`)."""
    given = {k: v for k, v in (("input", input), ("out", out), ("servers", servers)) if v is not None}
    options = merged_settings(options.pop("config", None), {**given, **options})
    if options.get("workers", 1) != 1:
        raise ConfigError("workers: the Python API runs one process; use the command line (generate --workers K)")
    for name in ("input", "out"):
        if options.get(name) is None:
            raise ConfigError(f"{name} must be a path, not None: give {name}= or put {name} in the config file")
    options.setdefault("servers", DEFAULT_SERVERS)
    options.setdefault("api_key", os.environ.get(API_KEY_ENV) or None)
    return build_config(options.pop("input"), options.pop("out"), **options)


async def agenerate(
    input: str | Path | None = None,
    out: str | Path | None = None,
    servers: str | Sequence[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run `generate` on the running event loop and return its summary."""
    config = api_config(input, out, servers, options)
    return _shown(await run_async(config, handle_signals=False), config)


def generate(
    input: str | Path | None = None,
    out: str | Path | None = None,
    servers: str | Sequence[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run `generate` to its end and return its summary (on a thread of its own inside a running loop).

    `config="run.toml"` reads the options from a TOML file first (`--config FILE`); keywords override it."""
    config = api_config(input, out, servers, options)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _shown(asyncio.run(run_async(config, handle_signals=False)), config)
    return _shown(_on_own_thread(config), config)


def _shown(outcome: Outcome, config: RunConfig) -> dict[str, Any]:
    """The run's summary; in a notebook also printed as the command prints it (a cell shows nothing else)."""
    if in_notebook():
        print(describe(outcome, config.out))
        if outcome.error is not None:
            print(f"error: {outcome.error}")
    return outcome.summary


def _on_own_thread(config: RunConfig) -> Outcome:
    """Run the job on a new event loop in another thread; an interrupt here cancels it there."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(run_async(config, handle_signals=False))  # the loop runs it on the other thread

    def work() -> Outcome:
        try:
            return loop.run_until_complete(task)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    with ThreadPoolExecutor(1, thread_name_prefix="gen-pipeline") as pool:
        future = pool.submit(work)
        try:
            return future.result()
        except KeyboardInterrupt:
            if not future.done():
                loop.call_soon_threadsafe(task.cancel)
            future.exception()  # wait until it has stopped and let go of the run directory
            raise
