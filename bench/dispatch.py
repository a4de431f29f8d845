"""Dispatch CPU: what choosing a server costs the client per request, as the fleet's slots (and so the queue of
waiting prompts) grow.

    python bench/dispatch.py [--capacities 16,64,256] [--requests-per-slot 10] [--groups 20]

No HTTP and no server: 8 in-process servers of --capacities running slots each (and the queue margin of an eighth),
as many prompt workers as the pipeline starts (ServerPool.worker_count: twice the slots, so about as many leases
wait as run), each lease held 20-40 ms of simulated work. Printed per capacity, in client CPU ms per request:
  - semaphore: an asyncio.Semaphore of the same slots, the floor of any client that queues at all;
  - plain / prefix groups: prompts with no shared prefix, and prompts spread over --groups long system prompts
    (affinity steers them to the servers holding theirs);
  - each while input remains and in the tail (the input exhausted: the longest waiting request first, the tail
    rule judging each choice), which is where every run ends.
A real fleet whose KV pools run 256 requests a server has ~2,000 slots and as many prompts waiting; a dispatch
cost that grows with the queue is the client setting the pace there (1 ms a request caps it at 1,000 a second).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gen_pipeline.fleet import affinity  # noqa: E402
from gen_pipeline.fleet.balancer import ServerPool  # noqa: E402
from gen_pipeline.fleet.pacing import queue_margin  # noqa: E402
from gen_pipeline.fleet.state import ServerState  # noqa: E402

SERVERS = 8
HOLD_S = (0.02, 0.04)  # a lease's simulated work: short, so the run is the dispatch's, not the sleeps'


def fleet(capacity: int) -> ServerPool:
    return ServerPool(
        ServerState(url=f"http://s{i}", capacity=capacity, margin=queue_margin(capacity)) for i in range(SERVERS)
    )


async def pool_run(capacity: int, requests: int, groups: int, tail: bool) -> float:
    """Client CPU ms per request through the pool."""
    pool = fleet(capacity)
    rng = random.Random(1)
    prompts = [
        affinity.chain([{"role": "system", "content": f"system prompt {g} " * 80}, {"role": "user", "content": "q"}])
        for g in range(groups)
    ] or [()]
    left = requests
    if tail:
        pool.begin_tail(lambda: left)

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with pool.lease(size=64.0, links=prompts[rng.randrange(len(prompts))]) as server:
                held = rng.uniform(*HOLD_S)
                await asyncio.sleep(held)
                pool.record_success(server, held, 64)

    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(pool.worker_count())))
    return (time.process_time() - start) * 1e3 / requests


async def semaphore_run(capacity: int, requests: int) -> float:
    """The same work behind a plain semaphore of the same slots."""
    slots = SERVERS * (capacity + queue_margin(capacity))
    gate, rng, left = asyncio.Semaphore(slots), random.Random(1), requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with gate:
                await asyncio.sleep(rng.uniform(*HOLD_S))

    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(2 * slots)))
    return (time.process_time() - start) * 1e3 / requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacities", default="16,64,256")
    ap.add_argument("--requests-per-slot", type=int, default=10)
    ap.add_argument("--groups", type=int, default=20)
    args = ap.parse_args()
    print(f"{SERVERS} servers, leases held {HOLD_S[0] * 1e3:.0f}-{HOLD_S[1] * 1e3:.0f} ms; client CPU ms per request")
    head = ["semaphore", "plain", "plain, tail", "prefix groups", "groups, tail"]
    print(f"{'slots/server':>12} {'requests':>9} " + " ".join(f"{h:>14}" for h in head))
    for capacity in (int(c) for c in args.capacities.split(",")):
        requests = args.requests_per_slot * SERVERS * capacity
        row = [asyncio.run(semaphore_run(capacity, requests))]
        for groups in (0, args.groups):
            for tail in (False, True):
                row.append(asyncio.run(pool_run(capacity, requests, groups, tail)))
        print(f"{capacity:>12} {requests:>9,} " + " ".join(f"{v:>14.3f}" for v in row), flush=True)


if __name__ == "__main__":
    main()
