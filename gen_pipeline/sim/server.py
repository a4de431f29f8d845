"""One simulated SGLang server: its routes, the generation path with faults, crash and restart."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from . import choices, httpd, radix, sglang, streaming
from .config import SimConfig
from .counting import ServerCounter
from .faults import Fault, FaultPlan, raise_fault
from .httpd import Handler, Request, empty_response, json_response
from .scheduler import PortStats, Scheduler
from .sglang import GenRequest, Rejection

RESTART_RETRY_SECONDS = 0.5  # how often a restarting port retries a port someone else holds
MODEL_PREFIX = "/v1/models/"
NOT_FOUND = {"detail": "Not Found"}  # FastAPI's replies for an unknown path and for another method
METHOD_NOT_ALLOWED = {"detail": "Method Not Allowed"}


class PortServer:
    """A simulated SGLang server on one 127.0.0.1 port."""

    def __init__(self, cfg: SimConfig, port: int, counter: ServerCounter, eos: int) -> None:
        self.cfg, self.port, self.counter, self.eos = cfg, port, counter, eos
        self.stats = PortStats()
        self.faults = FaultPlan.for_port(cfg, port)
        self.answer_rng = random.Random(cfg.seed + port + 7919)  # unseeded choices' invalid-answer draws (its own)
        self.scheduler = Scheduler(cfg, self.stats, cfg.slow.get(port, 1.0))
        self.cache = choices.PrefixCache(cfg.prefix_cache)
        self.radix = radix.RadixCache(cfg.prefix_cache_tokens)
        self.log = choices.RequestLog(cfg.request_log)
        self.rids = streaming.Rids()
        self.state = "down"  # down: refuses connections; warming: /health 503; up
        self.started = time.time()
        self.has_crashed = False
        self._runner: web.ServerRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._routes: dict[str, dict[str, Handler]] = {
            "GET": {
                "/health": self._health,
                "/health_generate": self._health,
                "/ready": self._ready,
                "/v1/models": self._models,
                "/model_info": self._model_info,
                "/get_model_info": self._model_info,
                "/server_info": self._server_info,
                "/get_server_info": self._server_info,
                "/v1/loads": self._loads,
            },
            "POST": {
                "/v1/chat/completions": self._chat,
                "/v1/completions": self._completions,
                "/v1/tokenize": self._tokenize,
                "/tokenize": self._tokenize,
                "/abort_request": self._abort,
            },
        }

    # lifecycle

    async def start(self, warmup: float = 0.0) -> None:
        """Listen; with a warmup, /health answers 503 for that long while /v1/* is served."""
        self._runner = await httpd.listen(self._route, "127.0.0.1", self.port)
        self.started = time.time()
        self.state = "warming" if warmup > 0 else "up"
        if warmup > 0:
            self._spawn(self._finish_warmup(warmup))

    async def aclose(self) -> None:
        """Stop for good: a pending restart is cancelled and open connections are reset."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._kill()
        self.log.close()

    async def _finish_warmup(self, seconds: float) -> None:
        """Leave the warming state after `seconds`."""
        await asyncio.sleep(seconds)
        self.state = "up"

    async def _kill(self) -> None:
        """Close the listener, then reset every open connection, as a killed process would."""
        runner = self._runner
        self.state = "down"
        if runner is None:
            return
        try:
            await httpd.kill(runner)
        finally:  # kept until killed, so that aclose() can finish a cancelled kill
            if self._runner is runner:
                self._runner = None

    async def _crash(self) -> None:
        """Die mid-run, then come back after restart_after seconds if configured."""
        self.stats.crashes += 1
        self.stats.dropped += self.stats.in_flight
        await self._kill()
        if self.cfg.restart_after is None:
            return
        await asyncio.sleep(self.cfg.restart_after)
        while True:
            try:
                await self.start(warmup=self.cfg.warmup)
                break
            except OSError:  # someone took the port meanwhile: keep trying, as a supervisor would
                await asyncio.sleep(RESTART_RETRY_SECONDS)
        self.stats.restarts += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a background task that aclose() can cancel."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # routes

    async def _route(self, request: Request) -> web.StreamResponse:
        """The handler of the request's method and path; FastAPI's 404 and 405 otherwise."""
        if self.cfg.authorization is not None and request.headers.get("Authorization") != self.cfg.authorization:
            return json_response({"error": "Unauthorized"}, 401)
        path = request.path
        handler = self._routes.get(request.method, {}).get(path)
        if handler is not None:
            return await handler(request)
        is_model = path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX)
        if is_model and request.method == "GET":
            return self._model(path[len(MODEL_PREFIX) :])
        if is_model or any(path in routes for routes in self._routes.values()):
            return json_response(METHOD_NOT_ALLOWED, 405)
        return json_response(NOT_FOUND, 404)

    async def _health(self, request: Request) -> web.Response:
        """503 while warming up; otherwise 200 after the probe generation (>= 1 s in SGLang)."""
        if self.state != "up":
            return empty_response(503)
        if self.cfg.health_delay > 0:
            await asyncio.sleep(self.cfg.health_delay)
        return empty_response(200)

    async def _ready(self, request: Request) -> web.Response:
        """200 when up, else 503, with no probe."""
        return empty_response(200 if self.state == "up" else 503)

    async def _models(self, request: Request) -> web.Response:
        """The model list with one card."""
        card = sglang.model_card(self.cfg, int(self.started))
        return json_response({"object": "list", "data": [card]})

    def _model(self, name: str) -> web.Response:
        """One card, or the 404 envelope for another name."""
        if name != self.cfg.model:
            return json_response(sglang.model_not_found(name), 404)
        return json_response(sglang.model_card(self.cfg, int(self.started)))

    @property
    def weight_version(self) -> str:
        """The weights this port serves now (SimConfig.redeploy changes them mid-run)."""
        return self.cfg.weights_of(self.port, self.stats.requests)

    async def _model_info(self, request: Request) -> web.Response:
        """The model info (no context length, as in SGLang)."""
        return json_response(sglang.model_info(self.cfg, self.weight_version))

    async def _server_info(self, request: Request) -> web.Response:
        """The server args plus scheduler info."""
        return json_response(sglang.server_info(self.cfg, self.port, self.started, self.weight_version))

    async def _loads(self, request: Request) -> web.Response:
        """The scheduler's load: running and waiting requests, its running slots and its KV pool's use."""
        stats = self.stats
        return json_response(sglang.loads(self.cfg, stats.running, stats.queued, stats.reserved_tokens))

    async def _tokenize(self, request: Request) -> web.Response:
        """/v1/tokenize of a prompt or of chat messages; max_model_len is the tokenizer's."""
        try:
            payload = await httpd.read_json(request)
            if isinstance(payload, dict) and "messages" in payload:
                ids = await self.counter.chat_ids(sglang.parse_chat(payload, self.cfg.model))
            else:
                ids = self.counter.prompt_ids(sglang.parse_completion(payload, self.cfg.model))
        except Rejection as rej:
            return json_response(rej.body, rej.status)
        limit = self.counter.tokenizer.model_max_length
        return json_response({"tokens": ids, "count": len(ids), "max_model_len": limit})

    async def _chat(self, request: Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        return await self._generate(request, chat=True)

    async def _completions(self, request: Request) -> web.StreamResponse:
        """POST /v1/completions."""
        return await self._generate(request, chat=False)

    async def _abort(self, request: Request) -> web.Response:
        """POST /abort_request {"rid"} (or {"abort_all": true}): stop running requests; 200 with no body."""
        try:
            payload = await httpd.read_json(request)
        except Rejection as rej:
            return json_response(rej.body, rej.status)
        self.stats.aborts += 1
        if isinstance(payload, dict):
            self.rids.abort(str(payload.get("rid") or ""), payload.get("abort_all") is True)
        return empty_response(200)

    # the generation path

    async def _generate(self, request: Request, chat: bool) -> web.StreamResponse:
        """Crash, drop or hang if the dice say so; otherwise answer (a completion or an error)."""
        self.stats.requests += 1
        with self.scheduler.in_flight():
            if self._should_crash():
                self._spawn(self._crash())
                return await httpd.hang()  # reset with every other connection by the crash
            fault = self.faults.draw()
            if fault is Fault.DROP:
                return self._drop(request)
            if fault is Fault.HANG:
                self.stats.hung += 1
                return await httpd.hang()
            try:
                body = await self._complete(request, chat, fault)
            except Rejection as rej:
                self.stats.errors += 1
                return json_response(rej.body, rej.status)
            self.stats.completions += 1
            if isinstance(body, web.StreamResponse):
                return body  # a stream carries no metadata (SGLang 0.5.23's chunks have none)
            body["metadata"] = {"weight_version": self.weight_version}  # the weights at the end, as SGLang's
            return json_response(body)

    async def _complete(self, request: Request, chat: bool, fault: Fault) -> dict[str, Any] | web.StreamResponse:
        """The completion body (or its stream, already sent), or a Rejection for a failed check or an injected
        error."""
        raise_fault(fault)
        payload = await httpd.read_json(request)
        req = (sglang.parse_chat if chat else sglang.parse_completion)(payload, self.cfg.model)
        self._misconfigured(payload, chat)
        if payload.get("stream") and not chat:
            raise sglang.bad_request("the simulator streams chat completions only: send stream=false")
        ids = await self.counter.chat_prompt_ids(req) if chat and self.radix.capacity else None
        prompt_tokens = len(ids) if ids is not None else await self.counter.count(req)
        message = sglang.length_error(self.cfg, prompt_tokens, req.max_new, chat)
        if message is not None:
            self.stats.length_errors += 1
            raise sglang.bad_request(message)
        self.stats.max_prompt_tokens = max(self.stats.max_prompt_tokens, prompt_tokens)
        max_new = sglang.effective_max_new(self.cfg, prompt_tokens, req.max_new)
        key = sglang.prompt_key(req)
        if not chat:
            gen = sglang.generate(key, self.cfg, max_new, req.stop, self.eos)
            async with self.scheduler.slot(self.cfg.reservation(prompt_tokens, max_new)):
                await self.scheduler.decode(gen.tokens, prompt_tokens)
            return sglang.text_body(req, gen, prompt_tokens)
        n, seed = choices.choices_wanted(payload), payload.get("seed")
        budget = payload.get("thinking_budget") if self.cfg.thinking_budget_enforced else None
        made = [self._choice(key, seed, i, max_new, req, budget, payload) for i in range(n)]
        names = streaming.request_rids(payload, n)
        stream = streaming.Stream(request, req.model, made, self.rids, names) if payload.get("stream") else None
        reserve = self.cfg.reservation(prompt_tokens, max_new, n)
        with self.rids.running(names):
            try:
                if ids is not None:
                    body = await self._cached_chat(req, ids, made, payload, key, reserve, stream)
                else:
                    body = await self._plain_chat(req, prompt_tokens, made, payload, key, reserve, stream)
            except Rejection as rej:  # SGLang 0.5.23 streams its queue-full 503 (server-api.md §1.4)
                if stream is None or rej.status != 503:
                    raise
                return await streaming.error_stream(request, rej.body)
        if stream is None:
            return body
        return await stream.close(stream.usage(body["usage"]), streaming.include_usage(payload))

    async def _plain_chat(
        self,
        req: GenRequest,
        prompt_tokens: int,
        made: list[choices.Choice],
        payload: dict[str, Any],
        key: bytes,
        reserve: int,
        stream: streaming.Stream | None,
    ) -> dict[str, Any]:
        """Run a chat request against the prefix cache of whole messages (or none)."""
        held = self.cache.lookup(req.messages or [], prompt_tokens)
        cached = held >= prompt_tokens
        self.stats.prefills += not cached
        self._count_prompt(prompt_tokens, held)
        async with self.scheduler.slot(reserve):  # the n choices decode side by side, after one prefill
            await streaming.decode(self.scheduler, made, stream, prompt_tokens - held, not cached)
        for i, c in enumerate(made):
            if stream is None or stream.whole(i):
                self.cache.answered(req.messages or [], choices.answer_message(c), prompt_tokens + c.tokens)
        self.log.write(self.port, key, payload, cached, made)
        body = choices.chat_choices(req, made, prompt_tokens)
        if self.cfg.cache_report or self.cfg.prefix_cache:  # as SGLang with --enable-cache-report: all but
            # the last token of a cached prompt come from the cache
            body["usage"]["prompt_tokens_details"] = {"cached_tokens": min(held, prompt_tokens - 1)}
        return body

    async def _cached_chat(
        self,
        req: GenRequest,
        ids: list[int],
        made: list[choices.Choice],
        payload: dict[str, Any],
        key: bytes,
        reserve: int,
        stream: streaming.Stream | None,
    ) -> dict[str, Any]:
        """Run a chat request against the radix cache. Prefill is the GPU's compute: a port prefills one request
        at a time (as SGLang's prefill batches run one after another), and a request's longest cached prefix is
        found when its turn comes (never the last token: SGLang computes it), so one arriving with another that
        shares its prefix finds what that one inserted; then the n choices decode side by side in its slot, and
        each answer is inserted after the prompt; `reserve`: its KV pool reservation (kv_admission)."""
        async with self.scheduler.slot(reserve):
            async with self.scheduler.prefilling:
                held = min(self.radix.match(ids), len(ids) - 1)
                self._count_prompt(len(ids), held)
                await self.scheduler.decode(0, len(ids) - held, prefill=True, produced=0)
                self.radix.insert(ids)
            await streaming.decode(self.scheduler, made, stream, 0, False)
        for i, c in enumerate(made):
            if stream is None or stream.whole(i):
                self.radix.insert(ids + self.counter.text_ids(c.answer.text) + [self.eos])
        self.log.write(self.port, key, payload, held > 0, made)
        body = choices.chat_choices(req, made, len(ids))
        # SGLang prefills a prompt once for n > 1 and forks: the choices report all but its last token cached
        reported = len(ids) - 1 if len(made) > 1 else held
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": reported}
        return body

    def _count_prompt(self, prompt_tokens: int, cached: int) -> None:
        """Count a chat prompt run, `cached` of its tokens found in the prefix cache."""
        stats = self.stats
        stats.prompt_tokens += prompt_tokens
        stats.cached_tokens += cached
        stats.prefill_tokens += prompt_tokens - cached

    def _misconfigured(self, payload: dict[str, Any], chat: bool) -> None:
        """The configured failures that depend on the request: a broken chat template, a poison row."""
        if chat and self.cfg.template_error is not None:
            raise sglang.bad_request(self.cfg.template_error)
        poison = self.cfg.poison
        if poison is not None and poison in str(payload.get("messages" if chat else "prompt")):
            if self.cfg.poison_status == 400:
                raise sglang.bad_request(f"this request cannot be served: it contains {poison!r}")
            status = self.cfg.poison_status
            raise Rejection(
                status, sglang.error_body(f"Internal server error on {poison!r}", "InternalServerError", status)
            )

    def _choice(
        self, key: bytes, seed: Any, index: int, max_new: int, req: GenRequest, budget: Any, payload: dict[str, Any]
    ) -> choices.Choice:
        """Choice `index` of a chat request: its words, as JSON when asked for, with its invalid-answer fault."""
        choice_key = self._choice_key(key, seed, index)
        made = choices.generate_choice(choice_key, self.cfg, max_new, req.stop, self.eos, budget)
        as_json = choices.wants_json(payload, self.cfg)
        if made.loop_tokens or (not self.cfg.invalid and not as_json):
            return made  # a loop (the loop fault) stays as it is
        drawn = choices.draw(choice_key, seed, self.answer_rng) if self.cfg.invalid else 1.0
        fault = choices.fault_of(self.cfg, drawn)
        return choices.shaped(made, as_json, fault)

    def _choice_key(self, key: bytes, seed: Any, index: int) -> bytes:
        """What one choice is derived from; the prompt alone when this server ignores seed and sampling."""
        return key if self.cfg.ignore_sampling else choices.choice_key(key, seed, index)

    def _should_crash(self) -> bool:
        """True for the first request past crash_after (a port crashes at most once)."""
        limit = self.cfg.crash_after.get(self.port)
        if limit is None or self.has_crashed or self.stats.requests <= limit:
            return False
        self.has_crashed = True
        return True

    def _drop(self, request: Request) -> web.Response:
        """Reset the connection: the client sees a disconnect and no reply."""
        self.stats.dropped += 1
        httpd.reset(request)
        return empty_response(500)  # never sent: the connection is gone
