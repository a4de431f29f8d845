"""A redirect or a 404 is a fleet problem: `generate` stops at once with one line naming the server and the
URL (exit 1), and writes nothing to the ledger. End to end, against a tiny aiohttp.web server that answers
discovery as SGLang does and 404 or 302 to the chat endpoint (a wrong base URL, a login proxy)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from e2e import prompts, read_jsonl
from procs import run_generate

from gen_pipeline.tokens import TINY_TOKENIZER

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}


def _app(chat_status: int, models_status: int) -> web.Application:
    async def models(request: web.Request) -> web.StreamResponse:
        if models_status == 200:
            return web.json_response(MODELS)
        return web.Response(status=models_status, text="Not Found")

    async def chat(request: web.Request) -> web.StreamResponse:
        if chat_status == 302:
            raise web.HTTPFound("https://login.example/sso")
        return web.json_response({"detail": "Not Found"}, status=chat_status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app  # /model_info, /server_info: 404, as on a server that lacks them (not a fleet problem)


@contextlib.contextmanager
def served(app: web.Application) -> Iterator[str]:
    """The app on a free 127.0.0.1 port, in a thread with its own event loop; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    ("chat_status", "says"),
    [(404, "answered HTTP 404:"), (302, "answered HTTP 302 to https://login.example/sso:")],
)
@pytest.mark.parametrize("workers", ["1", pytest.param("2", marks=pytest.mark.slow)])  # 2: seconds of start-up
def test_a_404_or_a_redirect_on_chat_stops_the_run_with_one_line(write_jsonl, tmp_path, chat_status, says, workers):
    """Exit 1, one error line with the server and the full URL (the same line from each worker), and no row
    in the ledger."""
    out = tmp_path / "out"
    with served(_app(chat_status, 200)) as url:
        done = run_generate(write_jsonl(prompts(20)), out, url, "--tokenizer", str(TINY_TOKENIZER),
                            "--workers", workers, timeout=120)  # fmt: skip
    errors = _errors(done.stderr)
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(set(errors)) == 1 and len(errors) <= int(workers), done.stderr[-2000:]
    assert f"POST {url}/v1/chat/completions {says}" in errors[0]
    assert not any(read_jsonl(path) for path in out.glob("failures*.jsonl"))
    assert not any(read_jsonl(path) for path in out.glob("completions*.jsonl"))


def test_a_404_on_the_model_list_stops_the_run_at_discovery(write_jsonl, tmp_path):
    """A base URL with a path in it (…/v1) 404s on /v1/models: stopped at once, not waited out as "down"."""
    with served(_app(404, 404)) as url:
        done = run_generate(write_jsonl(prompts(3)), tmp_path / "out", url, "--tokenizer", str(TINY_TOKENIZER),
                            "--startup-timeout", "600", timeout=60)  # fmt: skip
    errors = _errors(done.stderr)
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    assert f"GET {url}/v1/models answered HTTP 404" in errors[0]


def test_a_url_that_cannot_be_encoded_stops_the_run_with_one_line(write_jsonl, tmp_path):
    """A host label over 63 characters (IDNA's UnicodeError) is not a crash, and not a server "down"."""
    url = "http://" + "a" * 64 + ".example:8000"
    done = run_generate(write_jsonl(prompts(3)), tmp_path / "out", url, "--tokenizer", str(TINY_TOKENIZER),
                        "--startup-timeout", "600", timeout=60)  # fmt: skip
    errors = _errors(done.stderr)
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    assert f"cannot send to {url}/v1/models: UnicodeError" in errors[0] and "Traceback" not in done.stderr
