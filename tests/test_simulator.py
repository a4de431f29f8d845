"""The simulated SGLang fleet on real 127.0.0.1 sockets: wire format, checks, faults, CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gen_pipeline.errors import ConfigError
from gen_pipeline.sim import SimConfig, SimFleet, add_arguments, free_ports, start_fleet
from gen_pipeline.sim.faults import Fault, FaultPlan
from gen_pipeline.tokens import TINY_TOKENIZER, FastTokenCounter, HFTokenCounter, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
QWEN3 = ROOT.parent / "shared" / "tokenizers" / "qwen3"
PROMPT = [{"role": "user", "content": "hello there, simulator"}]
TINY_EOS = 2  # <|im_end|> in the tiny tokenizer

# The message templates, copied from server-api.md §1.2 and §1.4 (not from the simulator).
MSG_A = "The input ({input} tokens) is longer than the model's context length ({ctx} tokens)."
MSG_B = (
    "Requested token count exceeds the model's maximum context length of {ctx} tokens. "
    "You requested a total of {total} tokens: {input} tokens from the input messages and "
    "{max_new} tokens for the completion. Please reduce the number of tokens in the input "
    "messages or the completion to fit within the limit."
)
MSG_C = (
    "Input length ({n} tokens) exceeds the maximum allowed length ({max_req_input_len} tokens). "
    "Use a shorter input or enable --allow-auto-truncate."
)
MSG_D = "max_completion_tokens is too large: {max_tokens}.This model supports at most {ctx} completion tokens."
QUEUE_FULL = {
    "object": "error",
    "message": "The request queue is full.",
    "type": "503",
    "param": None,
    "code": 503,
}
INTERNAL = {
    "object": "error",
    "message": "Internal server error: simulated",
    "type": "InternalServerError",
    "param": None,
    "code": 500,
}


def run(coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
    """Run one async test body with its own deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def sim(n: int = 1, **fields: Any) -> SimConfig:
    """A config on `n` free ports with an instant /health."""
    fields.setdefault("health_delay", 0.0)
    return SimConfig(ports=tuple(free_ports(n)), **fields)


def bad(message: str) -> dict[str, Any]:
    """The flat 400 envelope SGLang sends for the length checks."""
    return {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


@contextlib.asynccontextmanager
async def serving(cfg: SimConfig) -> AsyncIterator[tuple[SimFleet, aiohttp.ClientSession]]:
    """A running fleet and a client session, both closed afterwards."""
    async with await start_fleet(cfg) as fleet, aiohttp.ClientSession() as session:
        yield fleet, session


async def post(session: aiohttp.ClientSession, url: str, path: str, body: Any) -> tuple[int, Any]:
    """POST JSON and return (status, parsed body)."""
    async with session.post(url + path, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def chat(session: aiohttp.ClientSession, url: str, **fields: Any) -> tuple[int, Any]:
    """One chat completion request (PROMPT unless messages are given)."""
    body = {"model": "sim-model", "messages": PROMPT, **fields}
    return await post(session, url, "/v1/chat/completions", body)


def ask(cfg: SimConfig, **fields: Any) -> tuple[int, Any]:
    """Start a fleet, send one chat request to its first port, return (status, body)."""

    async def scenario() -> tuple[int, Any]:
        async with serving(cfg) as (fleet, session):
            return await chat(session, fleet.urls[0], **fields)

    result: tuple[int, Any] = run(scenario())
    return result


@pytest.fixture(scope="module")
def n_prompt(tiny_counter: HFTokenCounter) -> int:
    """The tiny tokenizer's chat count of PROMPT."""
    count = tiny_counter.count([PROMPT])[0]
    assert isinstance(count, int)
    return count


# read-only endpoints


def test_models_card_and_unknown_model() -> None:
    """/v1/models has the max_model_len card; an unknown /v1/models/{m} gives the 404 envelope."""

    async def scenario() -> None:
        async with serving(sim(context_length=4096, model="m1")) as (fleet, s):
            async with s.get(fleet.urls[0] + "/v1/models") as resp:
                listing = await resp.json()
            async with s.get(fleet.urls[0] + "/v1/models/m1") as resp:
                assert await resp.json() == listing["data"][0]
            async with s.get(fleet.urls[0] + "/v1/models/nope") as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "model_not_found"
        card = listing["data"][0]
        assert listing["object"] == "list" and len(listing["data"]) == 1
        assert card["id"] == "m1" and card["max_model_len"] == 4096
        assert card["owned_by"] == "sglang" and card["parent"] is None

    run(scenario())


@pytest.mark.parametrize("explicit", [False, True])
def test_server_and_model_info(explicit: bool) -> None:
    """server_info reports null context_length and max_running_requests unless given on the command line
    (0.5.23), max_req_input_len = ctx - 6, and the scheduler's running slots in internal_states and /v1/loads."""

    async def scenario() -> tuple[Any, Any, Any]:
        cfg = sim(context_length=1000, explicit_context_length=explicit, report_max_running=explicit)
        async with serving(cfg) as (f, s):
            async with s.get(f.urls[0] + "/get_server_info") as resp:
                server = await resp.json()
            async with s.get(f.urls[0] + "/v1/loads") as resp:
                loads = await resp.json()
            async with s.get(f.urls[0] + "/model_info") as resp:
                return server, loads, await resp.json()

    server, loads, model = run(scenario())
    assert server["context_length"] == server["internal_states"][0]["context_length"] == (1000 if explicit else None)
    assert server["max_running_requests"] == (64 if explicit else None)
    assert server["internal_states"][0]["effective_max_running_requests_per_dp"] == 64
    assert loads["loads"][0]["max_running_requests"] == 64 and loads["loads"][0]["num_waiting_reqs"] == 0
    assert server["max_req_input_len"] == 994 and server["max_total_num_tokens"] == 8000
    assert server["tokenizer_path"] == model["tokenizer_path"] and server["version"] == "0.5.23"
    assert model["served_model_name"] == "sim-model" and model["is_generation"] is True
    assert "context_length" not in model


def test_health_waits_and_has_empty_body() -> None:
    """/health and /health_generate take health_delay and answer 200 with an empty body."""

    async def scenario() -> None:
        async with serving(sim(health_delay=0.15)) as (fleet, s):
            for path in ("/health", "/health_generate"):
                began = time.monotonic()
                async with s.get(fleet.urls[0] + path) as resp:
                    assert resp.status == 200 and await resp.read() == b""
                assert time.monotonic() - began >= 0.15

    run(scenario())


# request validation


def test_content_type_must_be_json() -> None:
    """A non-JSON content type gets SGLang's exact 400 Unsupported Media Type."""

    async def scenario() -> None:
        async with serving(sim()) as (fleet, s):
            url = fleet.urls[0] + "/v1/chat/completions"
            async with s.post(url, data=b"{}", headers={"Content-Type": "text/plain"}) as resp:
                assert resp.status == 400
                body = await resp.json()
        assert body["message"] == "Unsupported Media Type: Only 'application/json' is allowed"
        assert body["type"] == "Bad Request"

    run(scenario())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", None),
        (b'{"model": "x"}', None),
        (b'{"messages": []}', "Messages cannot be empty."),
    ],
)
def test_malformed_bodies_are_400(raw: bytes, message: str | None) -> None:
    """Invalid JSON or missing messages: 400 "Bad Request"; empty messages: SGLang's own text."""

    async def scenario() -> Any:
        async with serving(sim()) as (fleet, s):
            url = fleet.urls[0] + "/v1/chat/completions"
            async with s.post(url, data=raw, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400
                return await resp.json()

    body = run(scenario())
    assert body["object"] == "error" and body["code"] == 400
    if message is None:
        assert body["type"] == "Bad Request"
    else:
        assert body == bad(message)


# length checks A-D


def test_check_a_input_reaches_context(n_prompt: int) -> None:
    """(A): input >= ctx is rejected with the exact message."""
    status, body = ask(sim(context_length=n_prompt))
    assert status == 400
    assert body == bad(MSG_A.format(input=n_prompt, ctx=n_prompt))


@pytest.mark.parametrize("room", [1, 2, 3, 4, 5, 6, 7])
def test_check_c_scheduler_cap(n_prompt: int, room: int) -> None:
    """(C): inputs of ctx-6 .. ctx-1 pass (A) but fail the scheduler; ctx-7 is served."""
    ctx = n_prompt + room
    status, body = ask(sim(context_length=ctx))
    if room == 7:
        assert status == 200
        assert body["usage"]["completion_tokens"] <= ctx - 2 - n_prompt
    else:
        assert status == 400
        assert body == bad(MSG_C.format(n=n_prompt, max_req_input_len=ctx - 6))


def test_check_c_bound_by_kv_pool(n_prompt: int) -> None:
    """A small KV pool (max_total_num_tokens) makes (C) stricter than the context."""
    pool = n_prompt + 6  # max_req_input_len = pool - 1 - 5 = n_prompt
    status, body = ask(sim(context_length=4096, max_total_tokens=pool))
    assert status == 400
    assert body == bad(MSG_C.format(n=n_prompt, max_req_input_len=n_prompt))


@pytest.mark.parametrize(
    ("legacy", "over", "expected"),
    [(False, 0, 200), (False, 1, 400), (True, -1, 200), (True, 0, 400)],
)
def test_check_b_off_by_one(n_prompt: int, legacy: bool, over: int, expected: int) -> None:
    """(B): input + max_tokens == ctx passes on 0.5.23 and fails on <= 0.5.9."""
    ctx = 64
    max_new = ctx - n_prompt + over
    status, body = ask(sim(context_length=ctx, legacy_offbyone=legacy), max_tokens=max_new)
    assert status == expected
    if expected == 400:
        total = n_prompt + max_new
        assert body == bad(MSG_B.format(ctx=ctx, total=total, input=n_prompt, max_new=max_new))


def test_check_b_reads_max_completion_tokens_first(n_prompt: int) -> None:
    """max_new_tokens = max_completion_tokens or max_tokens."""
    status, body = ask(sim(context_length=64), max_completion_tokens=100, max_tokens=1)
    assert status == 400
    total = n_prompt + 100
    assert body == bad(MSG_B.format(ctx=64, total=total, input=n_prompt, max_new=100))


@pytest.mark.parametrize("explicit", [True, False])
def test_check_d_only_with_explicit_context(n_prompt: int, explicit: bool) -> None:
    """(D) fires for max_tokens > ctx only with --context-length; otherwise (B) answers."""
    cfg = sim(context_length=64, explicit_context_length=explicit)
    status, body = ask(cfg, max_tokens=65)
    assert status == 400
    if explicit:
        assert body == bad(MSG_D.format(max_tokens=65, ctx=64))
    else:
        assert body == bad(MSG_B.format(ctx=64, total=n_prompt + 65, input=n_prompt, max_new=65))


def test_reserved_tokens_in_messages_not_usage(n_prompt: int) -> None:
    """EAGLE reserved tokens count in (A)/(B) and their messages, never in usage."""
    reserved = 5
    status, body = ask(sim(context_length=n_prompt + reserved, reserved_tokens=reserved))
    assert body == bad(MSG_A.format(input=n_prompt + reserved, ctx=n_prompt + reserved))
    cfg = sim(context_length=64, reserved_tokens=reserved)
    status, body = ask(cfg, max_tokens=64 - n_prompt)
    counted = n_prompt + reserved
    assert body == bad(MSG_B.format(ctx=64, total=64 + reserved, input=counted, max_new=64 - n_prompt))
    status, body = ask(cfg, max_tokens=10)
    assert status == 200 and body["usage"]["prompt_tokens"] == n_prompt


# completions and usage


def test_chat_body_shape_and_usage(n_prompt: int) -> None:
    """A chat completion has SGLang's body and usage.prompt_tokens = the chat-template count."""
    status, body = ask(sim(), model="whatever-the-client-says")
    assert status == 200
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    assert body["object"] == "chat.completion" and body["model"] == "whatever-the-client-says"
    assert len(body["id"]) == 32 and int(body["id"], 16) >= 0
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["reasoning_content"] is None
    assert choice["logprobs"] is None and choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == TINY_EOS
    usage = body["usage"]
    n_out = len(choice["message"]["content"].split())
    assert usage["prompt_tokens"] == n_prompt and usage["completion_tokens"] == n_out
    assert usage["total_tokens"] == n_prompt + n_out
    assert usage["prompt_tokens_details"] is None and usage["reasoning_tokens"] == 0


def test_template_extra_tokens_raise_the_count(n_prompt: int) -> None:
    """A server template with hidden tokens reports input + extra in usage and in (A)."""
    status, body = ask(sim(template_extra_tokens=3))
    assert status == 200 and body["usage"]["prompt_tokens"] == n_prompt + 3
    status, body = ask(sim(context_length=n_prompt + 3, template_extra_tokens=3))
    assert status == 400 and body == bad(MSG_A.format(input=n_prompt + 3, ctx=n_prompt + 3))


def test_finish_reason_length_versus_stop() -> None:
    """Below the natural length finish_reason is "length" (matched_stop null), else "stop"."""
    cfg = sim(completion_words=40)
    _, natural = ask(cfg)
    words = natural["usage"]["completion_tokens"]
    assert words >= 2, "pick another PROMPT: this one's natural length is 1"
    _, short = ask(cfg, max_tokens=words - 1)
    _, exact = ask(cfg, max_tokens=words)
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["choices"][0]["matched_stop"] is None
    assert short["usage"]["completion_tokens"] == words - 1
    assert exact["choices"][0]["finish_reason"] == "stop"
    assert exact["choices"][0]["message"]["content"] == natural["choices"][0]["message"]["content"]


def test_omitted_max_tokens_fills_the_context(n_prompt: int) -> None:
    """Without max_tokens, generation runs to ctx - 2 - input and ends with "length"."""
    status, body = ask(sim(context_length=64, completion_words=10_000))
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 64 - 2 - n_prompt


def test_stop_string_cuts_the_text() -> None:
    """A stop word ends the text before it, with matched_stop = that string."""
    cfg = sim(completion_words=40)
    _, natural = ask(cfg)
    words = natural["choices"][0]["message"]["content"].split()
    stop_at = words.index(words[1])
    _, cut = ask(cfg, stop=[words[1]])
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["matched_stop"] == words[1]
    assert cut["choices"][0]["message"]["content"] == " ".join(words[:stop_at])


def test_completions_endpoint(tiny_counter: HFTokenCounter) -> None:
    """/v1/completions counts the prompt with special tokens and defaults max_tokens to 16."""
    prompt = "Once upon a time"
    expected = len(tiny_counter.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    async def scenario() -> Any:
        async with serving(sim(completion_words=10_000)) as (fleet, s):
            return await post(s, fleet.urls[0], "/v1/completions", {"model": "x", "prompt": prompt})

    status, body = run(scenario())
    assert status == 200 and body["object"] == "text_completion"
    assert body["usage"]["prompt_tokens"] == expected
    assert body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"].split()) == 16


def test_tokenize_matches_usage(n_prompt: int) -> None:
    """/v1/tokenize with messages counts what usage.prompt_tokens reports."""

    async def scenario() -> Any:
        async with serving(sim(template_extra_tokens=2)) as (fleet, s):
            return await post(s, fleet.urls[0], "/v1/tokenize", {"messages": PROMPT})

    status, body = run(scenario())
    assert status == 200 and body["count"] == n_prompt + 2 == len(body["tokens"])


def test_long_prompt_is_counted(tiny_counter: HFTokenCounter) -> None:
    """A prompt long enough to be counted in a thread gets the same exact count."""
    messages = [{"role": "user", "content": "lorem ipsum " * 3000}]
    expected = tiny_counter.count([messages])[0]
    status, body = ask(sim(context_length=100_000), messages=messages, max_tokens=1)
    assert status == 200 and body["usage"]["prompt_tokens"] == expected


CONVERSATIONS = [
    PROMPT,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Dis-moi: où est l'été? 夏はどこ"}],
    [
        {"role": "user", "content": "two plus two"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "times ten\n\nthen halve it"},
    ],
]


@pytest.mark.parametrize("folder", [str(TINY_TOKENIZER), str(QWEN3)], ids=["tiny", "qwen3"])
def test_light_template_counts_what_transformers_counts(folder: str) -> None:
    """light_template changes the simulator's CPU, not its usage.prompt_tokens (checked against transformers)."""
    if not Path(folder, "tokenizer.json").exists():
        pytest.skip(f"no tokenizer at {folder}")
    expected = load_tokenizer(folder).count(CONVERSATIONS)

    async def counts(light: bool) -> list[Any]:
        async with serving(sim(tokenizer=folder, light_template=light, template_extra_tokens=1)) as (fleet, s):
            counter = fleet.servers[fleet.config.ports[0]].counter.chat_counter
            assert isinstance(counter, FastTokenCounter) is light
            replies = [await chat(s, fleet.urls[0], messages=m, max_tokens=1) for m in CONVERSATIONS]
        return [body["usage"]["prompt_tokens"] - 1 if status == 200 else body for status, body in replies]

    assert run(counts(True)) == run(counts(False)) == expected


def test_light_template_needs_a_light_folder(tmp_path: Path) -> None:
    """A folder ChatTemplate cannot stand in for is refused at start, not counted some other way."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((TINY_TOKENIZER / name).read_bytes())
    (tmp_path / "special_tokens_map.json").write_text("{}")
    with pytest.raises(ConfigError, match="--light-template needs"):
        run(start_fleet(sim(tokenizer=str(tmp_path), light_template=True)))


def test_completions_are_deterministic() -> None:
    """The same prompt and seed give the same text on every port; another seed changes it."""

    async def texts(cfg: SimConfig) -> list[str]:
        async with serving(cfg) as (fleet, s):
            bodies = [await chat(s, url) for url in fleet.urls]
        return [b["choices"][0]["message"]["content"] for _, b in bodies]

    first, second = run(texts(sim(2, seed=1))), run(texts(sim(1, seed=2)))
    assert first[0] == first[1] and first[0] != second[0]


# scheduling


def test_max_running_queues_the_rest() -> None:
    """Beyond max_running requests wait; the running count never exceeds it and all succeed."""

    async def scenario() -> tuple[list[int], Any]:
        async with serving(sim(max_running=2, prefill_latency=0.1)) as (fleet, s):
            replies = await asyncio.gather(*(chat(s, fleet.urls[0]) for _ in range(6)))
            return [status for status, _ in replies], fleet.stats[fleet.config.ports[0]]

    statuses, stats = run(scenario())
    assert statuses == [200] * 6
    assert stats.max_running == 2 and stats.max_in_flight == 6 and stats.completions == 6


def test_max_queued_rejects_with_503() -> None:
    """With max_queued, a request that would wait past the bound gets SGLang's exact 503."""

    async def scenario() -> list[tuple[int, Any]]:
        async with serving(sim(max_running=1, max_queued=1, prefill_latency=0.15)) as (fleet, s):
            return await asyncio.gather(*(chat(s, fleet.urls[0]) for _ in range(4)))

    replies = run(scenario())
    assert sorted(status for status, _ in replies) == [200, 200, 503, 503]
    assert all(body == QUEUE_FULL for status, body in replies if status == 503)


# faults


def test_dead_port_refuses_connections() -> None:
    """A dead port is in urls but never listens."""

    async def scenario() -> None:
        cfg = sim(2)
        cfg = SimConfig(ports=cfg.ports, health_delay=0.0, dead=(cfg.ports[1],))
        async with serving(cfg) as (fleet, s):
            assert len(fleet.urls) == 2
            assert (await chat(s, fleet.urls[0]))[0] == 200
            with pytest.raises(aiohttp.ClientConnectorError):
                await chat(s, fleet.urls[1])

    run(scenario())


def test_flaky_rate_is_roughly_p() -> None:
    """A flaky port fails about a fraction P of requests, with 500 (SGLang's envelope) or 502."""

    async def scenario() -> list[tuple[int, Any]]:
        ports = tuple(free_ports(1))
        cfg = SimConfig(ports=ports, health_delay=0.0, flaky={ports[0]: 0.3})
        async with serving(cfg) as (fleet, s):
            return await asyncio.gather(*(chat(s, fleet.urls[0]) for _ in range(200)))

    replies = run(scenario())
    assert all(body == INTERNAL for status, body in replies if status == 500)
    failures = [status for status, _ in replies if status != 200]
    assert set(failures) == {500, 502} and 0.18 <= len(failures) / 200 <= 0.42


def test_fault_draws_are_reproducible() -> None:
    """The same seed and port draw the same faults; another port draws others."""
    cfg = SimConfig(ports=(31000, 31001), p_drop=0.1, p_hang=0.1, flaky={31000: 0.3})

    def draws(port: int) -> list[Fault]:
        plan = FaultPlan.for_port(cfg, port)
        return [plan.draw() for _ in range(500)]

    assert draws(31000) == draws(31000) != draws(31001)
    assert {Fault.ERROR_500, Fault.ERROR_502, Fault.DROP, Fault.HANG} <= set(draws(31000))


@pytest.mark.parametrize(("field", "status", "body"), [("p500", 500, INTERNAL), ("p503", 503, QUEUE_FULL)])
def test_fleet_wide_error_rates(field: str, status: int, body: dict[str, Any]) -> None:
    """p500 and p503 answer with SGLang's 500 and queue-full envelopes."""
    rates: dict[str, Any] = {field: 1.0}
    assert ask(sim(**rates)) == (status, body)


def test_slow_port_multiplies_latency() -> None:
    """A slow port's requests take FACTOR times longer."""

    async def elapsed(cfg: SimConfig) -> float:
        async with serving(cfg) as (fleet, s):
            began = time.monotonic()
            await chat(s, fleet.urls[0])
            return time.monotonic() - began

    ports = tuple(free_ports(1))
    slow = run(elapsed(SimConfig(ports=ports, health_delay=0.0, prefill_latency=0.05, slow={ports[0]: 4})))
    assert slow >= 0.2


def test_p_drop_disconnects_the_client() -> None:
    """p_drop resets the connection: the client sees a disconnect, not an HTTP status."""

    async def scenario() -> Any:
        async with serving(sim(p_drop=1.0)) as (fleet, s):
            with pytest.raises(aiohttp.ClientConnectionError) as caught:
                await chat(s, fleet.urls[0])
            assert not isinstance(caught.value, aiohttp.ClientConnectorError)
            return fleet.stats[fleet.config.ports[0]]

    assert run(scenario()).dropped == 1


def test_p_hang_times_out_on_the_client() -> None:
    """p_hang never answers; the client's timeout fires and the server forgets the request."""

    async def scenario() -> tuple[int, int]:
        async with serving(sim(p_hang=1.0)) as (fleet, s):
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(
                    fleet.urls[0] + "/v1/chat/completions",
                    json={"messages": PROMPT},
                    timeout=aiohttp.ClientTimeout(total=0.3),
                ):
                    pass
            stats = fleet.stats[fleet.config.ports[0]]
            for _ in range(50):  # the handler is cancelled once the client hangs up
                if stats.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            return stats.hung, stats.in_flight  # read while serving: closing the fleet cancels every handler

    assert run(scenario()) == (1, 0)


def test_crash_after_drops_in_flight_then_refuses() -> None:
    """Request N+1 crashes the port: in-flight requests are reset and new connects refused."""

    async def scenario() -> Any:
        ports = tuple(free_ports(1))
        cfg = SimConfig(ports=ports, health_delay=0.0, prefill_latency=1.0, crash_after={ports[0]: 1})
        async with serving(cfg) as (fleet, s):
            in_flight = asyncio.ensure_future(chat(s, fleet.urls[0]))
            await asyncio.sleep(0.2)
            results = await asyncio.gather(in_flight, chat(s, fleet.urls[0]), return_exceptions=True)
            for result in results:
                assert isinstance(result, aiohttp.ClientConnectionError), result
                assert not isinstance(result, aiohttp.ClientConnectorError)
            await asyncio.sleep(0.05)
            with pytest.raises(aiohttp.ClientConnectorError):
                await chat(s, fleet.urls[0])
            return fleet.stats[ports[0]]

    stats = run(scenario())
    assert stats.crashes == 1 and stats.dropped == 2 and stats.completions == 0


def test_restart_after_comes_back_warming_then_healthy() -> None:
    """A crashed port refuses, then listens with /health 503 (chat already served), then 200."""

    async def health(s: aiohttp.ClientSession, url: str) -> int | None:
        try:
            async with s.get(url + "/health") as resp:
                return resp.status
        except aiohttp.ClientConnectorError:
            return None

    async def scenario() -> list[int | None]:
        ports = tuple(free_ports(1))
        cfg = SimConfig(ports=ports, health_delay=0.0, crash_after={ports[0]: 0}, restart_after=0.2, warmup=0.25)
        async with serving(cfg) as (fleet, s):
            url = fleet.urls[0]
            with pytest.raises(aiohttp.ClientConnectionError):
                await chat(s, url)
            seen: list[int | None] = []
            while not seen or seen[-1] != 200:
                seen.append(await health(s, url))
                if seen[-1] == 503:
                    assert (await chat(s, url))[0] == 200
                await asyncio.sleep(0.05)
            assert fleet.stats[ports[0]].restarts == 1
            return seen

    seen = run(scenario())
    assert seen[0] is None and 503 in seen and seen[-1] == 200
    assert seen.index(503) > seen.index(None)


# configuration and CLI


@pytest.mark.parametrize(
    "fields",
    [{"p500": 1.5}, {"p500": 0.6, "p_drop": 0.6}, {"max_running": 0}, {"flaky": {1: 0.1}}],
)
def test_config_rejects_nonsense(fields: dict[str, Any]) -> None:
    """Impossible rates, sizes, or faults on unknown ports raise ConfigError."""
    with pytest.raises(ConfigError):
        SimConfig(ports=(30000,), **fields)


def test_cli_flags_build_the_config() -> None:
    """Port ranges, PORT:VALUE faults and a bare --crash-after N (first live port) parse."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    from gen_pipeline.sim.cli import config_from_args

    argv = "--ports 31000-31002,31005 --dead 31000 --flaky 31001:0.2 --slow 31002:3"
    args = parser.parse_args([*argv.split(), "--crash-after", "5", "--p-drop", "0.1"])
    cfg = config_from_args(args)
    assert cfg.ports == (31000, 31001, 31002, 31005) and cfg.dead == (31000,)
    assert dict(cfg.flaky) == {31001: 0.2} and dict(cfg.slow) == {31002: 3.0}
    assert dict(cfg.crash_after) == {31001: 5} and cfg.p_drop == 0.1
    with pytest.raises(SystemExit):
        parser.parse_args(["--ports", "30000-x"])


@pytest.fixture(scope="module", autouse=True)
def simulator_process(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The simulator as a subprocess, started with the module so its imports overlap the tests."""
    port = free_ports(1)[0]
    cmd = [
        sys.executable,
        "-m",
        "gen_pipeline.simulator",
        "--ports",
        str(port),
        "--health-delay",
        "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        request.getfixturevalue("tiny_counter")  # import transformers here, outside any deadline
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_module_subprocess_serves_and_exits_on_sigterm(
    simulator_process: tuple[subprocess.Popen[str], int],
) -> None:
    """`python -m gen_pipeline.simulator` prints its ready line, serves, and exits 0 on SIGTERM."""
    proc, port = simulator_process
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith("simulator ready"):
        line = proc.stdout.readline()
        assert line, f"simulator exited early: {lines}"
        lines.append(line.strip())
    assert lines[-1] == "simulator ready: 1 ports"
    assert lines[0] == f"port {port}: listening on http://127.0.0.1:{port}"

    async def one() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s:
            return await chat(s, f"http://127.0.0.1:{port}")

    assert run(one())[0] == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert "requests=1 completions=1" in proc.stdout.read()
