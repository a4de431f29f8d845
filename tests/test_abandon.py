"""A request the client gives up on never keeps running: its connection is closed (never handed back to the
keep-alive pool) and, when it carries a rid, it is aborted by it; the simulated SGLang stops decoding it, as
the real one does (../shared/reference/sglang-cpu.md, last section)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from rawserver import serve

from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.errors import DegenerateAnswerError, RequestTimeout
from gen_pipeline.http import AiohttpTransport, Client, open_transport
from gen_pipeline.modes import run_async
from gen_pipeline.sim import PortStats, SimConfig, free_ports, start_fleet

LATENCY = 0.01  # seconds a token: 2000 tokens would take 20 s
ASK = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 2000}


def run(coro: Awaitable[Any], timeout: float = 30.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def settled(stats: PortStats, seconds: float = 0.4) -> tuple[int, int]:
    """(decoded tokens, running requests) once the port has had `seconds` to go on decoding if it would."""
    await asyncio.sleep(seconds)
    before = stats.decoded_tokens
    await asyncio.sleep(seconds)
    assert stats.decoded_tokens == before, "the port went on decoding a request given up on"
    return stats.decoded_tokens, stats.running


async def on_fleet(check: Callable[[Client, str, PortStats], Awaitable[Any]], stream: bool, **sim: Any) -> Any:
    cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, token_latency=LATENCY, **sim)
    async with await start_fleet(cfg) as fleet, open_transport() as transport:
        return await check(Client(transport, stream=stream), fleet.urls[0], fleet.stats[cfg.ports[0]])


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("rid", [None, "gp-test-1."], ids=["no-rid", "rid"])
def test_a_timed_out_request_stops_decoding_on_the_server(stream: bool, rid: str | None) -> None:
    """A request timed out after 0.3 s of a 20 s answer: the port stops decoding it (closed connection, and the
    abort by its rid when it has one), frees its slot, and serves the next request whole."""

    async def check(client: Client, url: str, stats: PortStats) -> tuple[int, int]:
        with pytest.raises(RequestTimeout):
            await client.chat(url, {**ASK, "rid": rid} if rid else ASK, 0.3)
        decoded, running = await settled(stats)
        after = await client.chat(url, {**ASK, "max_tokens": 5}, 5)
        assert after.completion_tokens == 5
        return decoded, running

    decoded, running = run(on_fleet(check, stream))
    assert decoded < 100 and running == 0


def test_an_abandoned_stream_is_aborted_by_its_rid_and_its_connection_closed() -> None:
    """Given up on (the watch's error), a streamed request is aborted by its rid (finish_reason "abort" on the
    port) and its connection is closed, not reused: the next request opens a fresh one."""

    seen: list[str] = []

    def watch(index: int, content: str, reasoning: str) -> None:
        seen.append(content)
        if len(seen) > 10:
            raise DegenerateAnswerError("stop", check="loop", content="".join(seen))

    async def check(client: Client, url: str, stats: PortStats) -> tuple[int, int, int]:
        with pytest.raises(DegenerateAnswerError):
            await client.chat(url, {**ASK, "rid": "gp-test-2."}, 10, watch)
        decoded, running = await settled(stats)
        return decoded, running, stats.aborts

    decoded, running, aborts = run(on_fleet(check, stream=True))
    assert decoded < 100 and running == 0 and aborts == 1


def test_every_choice_of_a_request_with_n_is_aborted() -> None:
    """SGLang runs a request with n as rid_0, rid_1, ...: the client aborts each one."""

    async def check(client: Client, url: str, stats: PortStats) -> tuple[int, int]:
        with pytest.raises(RequestTimeout):
            await client.chat(url, {**ASK, "n": 3, "rid": "gp-test-3."}, 0.3)
        await settled(stats)
        return stats.aborts, stats.running

    assert run(on_fleet(check, stream=True)) == (3, 0)


def test_a_cancelled_request_is_aborted_in_the_background_and_close_waits_for_it() -> None:
    """Cancelled (a drain, the run stopping): the abort goes out in the background, and closing the transport
    waits for it, so the server hears of it before the process ends."""

    async def scenario() -> tuple[int, int, int]:
        cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, token_latency=LATENCY)
        async with await start_fleet(cfg) as fleet:
            stats = fleet.stats[cfg.ports[0]]
            async with open_transport() as transport:
                client = Client(transport, stream=True)
                task = asyncio.ensure_future(client.chat(fleet.urls[0], {**ASK, "rid": "gp-test-4."}, 30))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            decoded, running = await settled(stats)
            return decoded, running, stats.aborts

    decoded, running, aborts = run(scenario())
    assert decoded < 100 and running == 0 and aborts == 1


def test_the_simulator_aborts_by_rid_as_sglang_does() -> None:
    """/abort_request stops a running rid (and every running rid it begins), ends its stream with finish_reason
    "abort" and the usage of what it decoded; a rid that does not run is ignored; a rid already running is
    refused (400 "Duplicate request ID")."""

    async def scenario() -> dict[str, Any]:
        cfg = SimConfig(ports=(free_ports(1)[0],), health_delay=0.0, token_latency=LATENCY)
        async with await start_fleet(cfg) as fleet, open_transport() as transport:
            url = fleet.urls[0]
            client = Client(transport, stream=True)
            first = asyncio.ensure_future(client.chat(url, {**ASK, "rid": "job-1"}, 30))
            second = asyncio.ensure_future(client.chat(url, {**ASK, "rid": "job-12"}, 30))
            other = asyncio.ensure_future(client.chat(url, {**ASK, "max_tokens": 60, "rid": "kept"}, 30))
            await asyncio.sleep(0.2)
            duplicate = await transport.request(
                "POST", url, "/v1/chat/completions", 5, orjson.dumps({**ASK, "rid": "kept"})
            )
            ignored = await transport.request("POST", url, "/abort_request", 5, b'{"rid": "job"}')
            await asyncio.sleep(0.1)
            aborted = await transport.request("POST", url, "/abort_request", 5, b'{"rid": "job-1"}')
            results = await asyncio.gather(first, second, other)
            return {"duplicate": duplicate[:2], "ignored": ignored[:2], "aborted": aborted[:2], "results": results}

    out = run(scenario())
    assert out["duplicate"][0] == 400 and b"Duplicate request ID detected: kept" in out["duplicate"][1]
    assert out["ignored"] == (200, b"") and out["aborted"] == (200, b"")
    first, second, other = out["results"]
    assert first.finish_reason == second.finish_reason == "abort"
    assert 10 < first.completion_tokens < 200 and len(first.content.split()) == first.completion_tokens
    assert other.finish_reason in ("stop", "length") and other.completion_tokens <= 60


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_connection_left_mid_answer_is_closed_and_a_finished_one_reused(stream: bool) -> None:
    """On the wire: a stream stopped by its reader, or a request cancelled mid-answer, closes its socket (the
    next request opens a new one); an answer read to its end leaves its socket in the pool."""
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'] * 3
    release = asyncio.Event()

    async def reply(n: int, writer: asyncio.StreamWriter) -> None:
        body = b"".join(events) + b"data: [DONE]\n\n"
        if n == 1:  # the first answer never ends
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(events[0]), events[0]))
            await release.wait()
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
        writer.write(head + body)

    def stop(chunk: bytes) -> None:
        raise DegenerateAnswerError("stop", check="loop")

    async def check(t: AiohttpTransport, url: str) -> None:
        if stream:
            with pytest.raises(DegenerateAnswerError):
                await t.stream(url, "/x", 5, b"{}", stop)
        else:
            task = asyncio.ensure_future(t.request("POST", url, "/x", 5, b"{}"))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        release.set()
        for _ in range(2):
            seen: list[bytes] = []
            assert (await t.stream(url, "/x", 5, b"{}", seen.append))[:2] == (200, b"")
            assert b"".join(seen).endswith(b"[DONE]\n\n")

    assert serve(reply, check).connections == 2


def test_a_run_leaves_no_attempt_it_timed_out_running(write_jsonl: Any, tmp_path: Path) -> None:
    """generate with a 0.5 s request timeout on answers that take 20 s: each timed-out attempt carried its own
    rid, was aborted by it, and stopped decoding; the rows are ledgered as timeouts with nothing left running."""
    rows = [{"id": i, "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    inp = write_jsonl(rows)

    async def scenario() -> tuple[Any, PortStats]:
        cfg = SimConfig(ports=tuple(free_ports(1)), health_delay=0.0, token_latency=LATENCY, completion_words=4000)
        async with await start_fleet(cfg) as fleet:
            config = RunConfig(
                input=inp,
                out=tmp_path / "run",
                servers=tuple(fleet.urls),
                retry=RetryPolicy.testing(max_attempts=2),
                progress="off",
                max_tokens=2000,
                request_timeout=0.5,
            )
            outcome = await run_async(config)
            await settled(fleet.stats[cfg.ports[0]])
            return outcome, fleet.stats[cfg.ports[0]]

    outcome, stats = run(scenario(), 60)
    failures = [orjson.loads(line) for line in (tmp_path / "run" / "failures.jsonl").read_bytes().splitlines()]
    assert sorted(f["reason"] for f in failures) == ["timeout"] * 3, outcome.summary
    assert stats.requests == stats.aborts == stats.stopped == 6 and stats.running == 0
    assert stats.decoded_tokens < 6 * 100
