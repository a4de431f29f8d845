"""Whole conversations regenerated (`generate --turns all`) on a simulated fleet with a prefix cache.

    python bench/turns.py [--conversations 2000] [--ports 4] [--max-running 16] [--quick]

Workload: conversations of 2-6 user turns (10-60 words each) after a short system turn, regenerated
turn by turn, each turn asked with the answers given before it.
Fleet: a simulator process; a port holds the KV of the conversation prefixes it served (its prompt, and
its prompt with the answer it gave) and charges a request's prefill only for the tokens past the longest
prefix it holds (--prefix-cache 100000 entries a port, so nothing is evicted), reported as
usage.prompt_tokens_details.cached_tokens. A request holds one of a port's --max-running slots for
--prompt-token-latency per prefilled token + --token-latency per generated token.
Figures (the simulator's own counters, the same for every client):
  prefill paid   prompt tokens the ports prefilled (prompt tokens - cached tokens);
  best           each turn's new tokens only: per conversation, turn 0's prompt, then each turn's prompt
                 less the previous turn's prompt and answer (what a port holding the conversation skips);
  tokens/s       completion tokens / (last reply - first request over the fleet);
  ideal          the same tokens over every slot busy from start to end with the best prefill only:
                 sum(new prompt tokens x prompt latency + answer tokens x token latency) / slots.
Clients (a fresh simulator for each):
  gen-pipeline              `generate --turns all` (a next turn on the server that answered the last while
                            it has a free slot, else elsewhere);
  gen-pipeline no affinity  the same with that preference off (a next turn goes anywhere);
  pinned round-robin        a SpecForge-style script (scripts/regenerate_train_data.py's shape): each
                            conversation pinned to one server, servers in turn, a fixed max_tokens, one
                            conversation per slot of a global semaphore.
Goal (issue 33): gen-pipeline's prefill at most 1.1x the best, and at least 95% of the ideal.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simfleet import sim_run  # noqa: E402

from gen_pipeline.config import RetryPolicy, RunConfig  # noqa: E402
from gen_pipeline.engine import converse  # noqa: E402
from gen_pipeline.modes import run_async  # noqa: E402
from gen_pipeline.sim import free_ports  # noqa: E402

WORDS = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "oscar", "sierra", "tango", "river", "stone")
CLIENTS = ("gen-pipeline", "gen-pipeline no affinity", "pinned round-robin")


@dataclass
class Turn:
    """One answered turn as the client recorded it."""

    conversation: str
    turn: int
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Result:
    client: str
    turns: int
    twice: int
    prefill: int
    best: int
    tokens_per_s: float
    ideal: float
    wall_s: float
    slot_use: float  # busy slot-seconds / (span x slots)
    late: float  # how much longer the simulator's slots were held than its latency model asked (a busy CPU)


def write_conversations(path: Path, n: int, seed: int = 33) -> list[dict[str, Any]]:
    """`n` conversations of 2-6 user turns (with stand-in assistant turns, never sent)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant. Be concise."}]
        for t in range(rng.randint(2, 6)):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
            messages.append({"role": "user", "content": f"conversation {i} turn {t}: {words}"})
            messages.append({"role": "assistant", "content": "an answer from another model"})
        rows.append({"id": f"c{i}", "messages": messages})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def sim_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--max-running", str(args.max_running), "--token-latency", str(args.token_latency),
        "--prompt-token-latency", str(args.prompt_token_latency), "--prefix-cache", "100000",
        "--completion-words", str(args.answer_words), "--context-length", "8192", "--seed", "5",
    ]  # fmt: skip


def run_generate(inp: Path, out: Path, urls: list[str], args: argparse.Namespace, affinity: bool) -> list[Turn]:
    converse.AFFINITY = affinity
    cfg = RunConfig(input=inp, out=out, servers=tuple(urls), turns="all", max_tokens=args.max_tokens,
                    retry=RetryPolicy.testing(), progress="off", queue_margin=args.queue_margin)  # fmt: skip
    outcome = asyncio.run(run_async(cfg))
    converse.AFFINITY = True
    if outcome.exit_code != 0:
        raise SystemExit(f"generate failed: {outcome.summary.get('failed')} {outcome.error}")
    lines = [orjson.loads(raw) for raw in (out / "completions.jsonl").read_bytes().splitlines()]
    return [Turn(r["id"], r["turn"], r["prompt_tokens"], r["completion_tokens"]) for r in lines]


async def pinned_round_robin(
    rows: list[dict[str, Any]], urls: list[str], concurrency: int, max_tokens: int
) -> list[Turn]:
    """The SpecForge-style script: each conversation on one server (in turn), its user turns in order with the
    server's answers in the history, a fixed max_tokens; `concurrency` conversations at once."""
    sem, servers, turns = asyncio.Semaphore(concurrency), itertools.cycle(urls), list[Turn]()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def conversation(row: dict[str, Any], url: str) -> None:
            history: list[dict[str, Any]] = []
            async with sem:
                for t, m in enumerate(m for m in row["messages"] if m["role"] != "assistant"):
                    history.append(m)
                    if m["role"] != "user":
                        continue
                    body = {"model": "sim-model", "messages": history, "max_tokens": max_tokens}
                    async with session.post(url + "/v1/chat/completions", json=body) as r:
                        answer = orjson.loads(await r.read())
                    usage = answer["usage"]
                    turns.append(Turn(row["id"], t, usage["prompt_tokens"], usage["completion_tokens"]))
                    history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})

        await asyncio.gather(*(conversation(row, next(servers)) for row in rows))
    return turns


def best_prefill(turns: list[Turn]) -> int:
    """Each turn's new tokens only: turn 0's prompt, then each prompt less the previous prompt and answer."""
    by: dict[str, list[Turn]] = {}
    for t in turns:
        by.setdefault(t.conversation, []).append(t)
    best = 0
    for conv in by.values():
        conv.sort(key=lambda t: t.turn)
        best += conv[0].prompt_tokens
        best += sum(b.prompt_tokens - a.prompt_tokens - a.completion_tokens for a, b in itertools.pairwise(conv))
    return best


def measure(client: str, rows: list[dict[str, Any]], inp: Path, args: argparse.Namespace, work: Path) -> Result:
    ports = free_ports(args.ports)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    started = time.monotonic()
    with sim_run(ports, *sim_flags(args)) as sim:
        if client == "pinned round-robin":
            slots = args.ports * args.max_running
            turns = asyncio.run(pinned_round_robin(rows, urls, slots, args.max_tokens))
        else:
            turns = run_generate(inp, work / client.replace(" ", "-"), urls, args, client == "gen-pipeline")
    wall = time.monotonic() - started
    stats = sim.port_stats().values()
    prompt = sum(int(s["prompt_tokens"] or 0) for s in stats)
    cached = sum(int(s["cached_tokens"] or 0) for s in stats)
    output = sum(int(s["output_tokens"] or 0) for s in stats)
    first = min(s["first_request_at"] for s in stats if s["first_request_at"] is not None)
    last = max(s["last_reply_at"] for s in stats if s["last_reply_at"] is not None)
    best = best_prefill(turns)
    slots = args.ports * args.max_running
    ideal_s = (best * args.prompt_token_latency + output * args.token_latency) / slots
    twice = sum(n - 1 for n in Counter((t.conversation, t.turn) for t in turns).values() if n > 1)
    busy, model = sum(s["busy_s"] or 0.0 for s in stats), sum(s["model_s"] or 0.0 for s in stats)
    use, late = busy / ((last - first) * slots), busy / model - 1 if model else 0.0
    speed = output / (last - first)
    return Result(client, len(turns), twice, prompt - cached, best, speed, output / ideal_s, wall, use, late)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=2000)
    p.add_argument("--ports", type=int, default=4)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--token-latency", type=float, default=0.04)
    p.add_argument("--prompt-token-latency", type=float, default=0.0004)
    p.add_argument("--answer-words", type=int, default=24, help="the simulator's answers: 1 to this many words")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--queue-margin", type=int, help="generate's --queue-margin (default: its own)")
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--quick", action="store_true", help="300 conversations (about a minute a client)")
    args = p.parse_args()
    n = 300 if args.quick else args.conversations
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = write_conversations(work / "conversations.jsonl", n)
        turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in rows)
        print(f"{n} conversations, {turns} turns; {args.ports} ports x {args.max_running} slots; "
              f"{args.token_latency * 1000:g} ms per answer token, {args.prompt_token_latency * 1000:g} ms "
              "per prefilled prompt token")  # fmt: skip
        print(f"{'client':<26}{'turns':>7}{'twice':>6}{'prefill paid':>14}{'best':>10}{'x best':>8}"
              f"{'tokens/s':>10}{'ideal':>8}{'of ideal':>9}{'slot use':>9}{'sim late':>9}{'wall s':>8}")  # fmt: skip
        results = []
        for client in args.clients.split(","):
            r = measure(client.strip(), rows, work / "conversations.jsonl", args, work)
            results.append(r)
            print(f"{r.client:<26}{r.turns:>7}{r.twice:>6}{r.prefill:>14,}{r.best:>10,}{r.prefill / r.best:>8.2f}"
                  f"{r.tokens_per_s:>10,.0f}{r.ideal:>8,.0f}{r.tokens_per_s / r.ideal:>9.1%}{r.slot_use:>9.1%}"
                  f"{r.late:>9.1%}{r.wall_s:>8.1f}",
                  flush=True)  # fmt: skip
        ours = next((r for r in results if r.client == "gen-pipeline"), None)
        if ours is not None:
            ratio, share = ours.prefill / ours.best, ours.tokens_per_s / ours.ideal
            print(
                f"goal: prefill <= 1.1x best: {ratio:.2f}x ({'met' if ratio <= 1.1 else 'NOT met'}); "
                f">= 95% of ideal: {share:.1%} ({'met' if share >= 0.95 else 'NOT met'})"
            )


if __name__ == "__main__":
    main()
