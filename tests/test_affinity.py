"""Prefix-aware dispatch: a prompt goes to the server likely to hold its leading messages, while it has room."""

from __future__ import annotations

import asyncio

import pytest

from gen_pipeline.fleet import affinity
from gen_pipeline.fleet.affinity import PrefixModel, chain
from gen_pipeline.fleet.balancer import ServerPool, ServerState

SYSTEM_A = {"role": "system", "content": "You answer questions about rivers. " * 20}
SYSTEM_B = {"role": "system", "content": "You answer questions about mountains. " * 20}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ask(system: dict[str, str], question: str) -> tuple[affinity.Link, ...]:
    return chain([system, {"role": "user", "content": question}])


def pool(*caps: int, clock: Clock | None = None) -> ServerPool:
    return ServerPool((ServerState(f"s{i}", c) for i, c in enumerate(caps)), clock or Clock())


def test_a_chain_has_a_link_per_message_boundary_past_a_short_header():
    links = ask(SYSTEM_A, "How long is the Nile?")
    assert len(links) == 2 and links[0].chars < links[1].chars
    assert ask(SYSTEM_A, "Other?")[0] == links[0] and ask(SYSTEM_B, "How long is the Nile?")[0] != links[0]
    assert chain([{"role": "user", "content": "hi " * 200}]) == ()  # one message: only an identical prompt shares it
    assert chain(None) == ()


def test_the_model_matches_the_longest_link_held_and_forgets_longest_prefixes_first():
    model = PrefixModel(pool_tokens=230)  # 920 characters: room for one system prompt and its question
    a1 = ask(SYSTEM_A, "First question about the rivers of the world?")
    model.note(a1)
    assert model.match(ask(SYSTEM_A, "Another one?")) == a1[0].chars
    assert model.match(a1) == a1[1].chars
    model.note(ask(SYSTEM_B, "Peaks?"))  # over capacity: the oldest entries leave
    assert model.match(a1) == 0


def test_a_prompt_follows_its_prefix_while_that_server_has_a_free_slot():
    p = pool(2, 2)
    links = ask(SYSTEM_A, "q1")
    first = p.pick(links=links)
    assert first is not None
    first.prefixes.note(links)
    first.in_flight = 1
    assert p.pick(links=ask(SYSTEM_A, "q2")) is first  # without links the emptier server would be chosen
    assert p.pick() is not first
    first.in_flight = 2  # full: a new prompt waits a little for it, then takes a free server, never piles on
    assert p.pick(links=ask(SYSTEM_A, "q3"), patient=True) is None
    assert p.pick(links=ask(SYSTEM_A, "q3")) is not first


def busy_pair(clock: Clock) -> tuple[ServerPool, tuple[affinity.Link, ...], tuple[affinity.Link, ...]]:
    """Two busy servers of one slot, the first holding prompt a's prefix; a and b."""
    p = pool(1, 1, clock=clock)
    a, b = ask(SYSTEM_A, "qa"), ask(SYSTEM_B, "qb")
    p.servers[0].prefixes.note(a)
    p.servers[0].in_flight = p.servers[1].in_flight = 1
    return p, a, b


def test_a_freed_slot_goes_to_a_waiting_prompt_its_cache_holds_and_never_starves_the_others():
    async def scenario() -> None:
        p, a, b = busy_pair(Clock())
        s0, s1 = p.servers
        s1.prefixes.note(b)
        waiting_b = asyncio.ensure_future(p.lease(links=b).__aenter__())
        waiting_a = asyncio.ensure_future(p.lease(links=a).__aenter__())
        await asyncio.sleep(0)
        s0.in_flight = 0  # s0 frees a slot: the later prompt, whose prefix s0 holds, takes it
        p.queue.hand_out()
        await asyncio.sleep(0)
        assert waiting_a.done() and waiting_a.result() is s0 and not waiting_b.done()
        # s0 frees again: nothing waiting matches it, the other prompt goes there rather than wait for s1
        s0.in_flight -= 1
        p.queue.hand_out()
        await asyncio.sleep(0)
        assert waiting_b.done() and waiting_b.result() is s0

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_a_prompt_kept_waiting_past_the_patience_goes_first():
    async def scenario() -> None:
        clock = Clock()
        p, a, b = busy_pair(clock)
        s0 = p.servers[0]
        waiting_b = asyncio.ensure_future(p.lease(links=b).__aenter__())
        await asyncio.sleep(0)
        clock.now += 2 * p.queue.patience() + 0.1  # past AFFINITY_PATIENCE times a lease's wait in turn, a queued too
        waiting_a = asyncio.ensure_future(p.lease(links=a).__aenter__())
        await asyncio.sleep(0)
        s0.in_flight = 0
        p.queue.hand_out()
        await asyncio.sleep(0)
        assert waiting_b.done() and waiting_b.result() is s0 and not waiting_a.done()
        waiting_a.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 5))


@pytest.mark.parametrize("tail", [False, True])
def test_a_free_server_holding_no_waiting_prefix_takes_the_group_most_in_need_and_keeps_it(tail):
    """Spreading a prefix costs its prefill once more: the group with the most prompts waiting per server that
    holds it spreads (not the oldest prompt's), and the server it spread to then takes that group's others;
    the same once the input is exhausted."""

    async def scenario() -> None:
        p = pool(1, 1, 2)
        if tail:
            p.begin_tail(lambda: 0)
        s0, s1, s2 = p.servers
        a, b = ask(SYSTEM_A, "qa"), ask(SYSTEM_B, "qb")
        s0.prefixes.note(a)
        s1.prefixes.note(b)
        s0.in_flight = s1.in_flight = 1
        s2.in_flight = 2
        waiting_b = asyncio.ensure_future(p.lease(links=b).__aenter__())  # the oldest
        waiting_a = [asyncio.ensure_future(p.lease(links=ask(SYSTEM_A, f"q{i}")).__aenter__()) for i in range(3)]
        await asyncio.sleep(0)
        s2.in_flight = 0  # two slots free on a server that holds neither prefix
        p.queue.hand_out()
        await asyncio.sleep(0)
        assert not waiting_b.done()
        assert [w.done() and w.result() is s2 for w in waiting_a] == [True, True, False]
        for w in [waiting_b, *waiting_a]:
            w.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_with_every_running_slot_taken_a_prompt_queues_at_its_holder_or_waits_for_it():
    """The queue margins are where the free places are on a busy fleet: a prompt queues at the server holding
    its prefix, and while that one's margin is full too it waits rather than queue at a server that would
    prefill the prefix again."""
    p = pool(2, 2)
    holder, other = p.servers
    holder.margin = other.margin = 1
    a = ask(SYSTEM_A, "qa")
    holder.prefixes.note(a)
    holder.in_flight = other.in_flight = 2  # every running slot taken, one queue place each
    assert p.pick(links=ask(SYSTEM_A, "q1"), patient=True) is holder
    holder.in_flight = 3
    assert p.pick(links=ask(SYSTEM_A, "q2"), patient=True) is None
    assert p.pick(links=ask(SYSTEM_A, "q2")) is other  # not patient (it waited long enough): no place idles


def test_in_the_tail_a_holder_a_little_slower_than_the_rest_keeps_its_prefix():
    """The tail rule keeps a request off a server far slower than the rest; a holder's measured latency
    includes its prefills and queue, so it is spared up to HOLDER_SLACK times more: elsewhere the prefix is
    paid again. A holder far slower still loses the request."""
    p = pool(4, 4, 4)
    holder = p.servers[0]
    a = ask(SYSTEM_A, "qa")
    holder.prefixes.note(a)
    p.begin_tail(lambda: 0)
    for s in p.servers:
        s.mean_latency = 1.0
    holder.mean_latency = 1.5  # too late by the plain rule, within HOLDER_SLACK
    assert p._too_late(holder, p.latencies(), p.clock(), False, 0)
    assert p.pick(links=ask(SYSTEM_A, "q1")) is holder
    holder.mean_latency = 5.0  # far slower: the request goes elsewhere
    assert p.pick(links=ask(SYSTEM_A, "q1")) is not holder


def test_the_model_follows_what_the_server_reports_its_cache_held():
    """A server whose reports say it no longer held a prefix the model credits it with keeps less than the
    model thought (its cache is smaller than its KV pool suggests): the model shrinks and forgets the oldest
    prefixes; one that held more than the model kept makes it grow again."""
    model = PrefixModel(pool_tokens=100_000)
    chains = [ask({"role": "system", "content": f"{k} " + "rules " * 200}, "q") for k in range(6)]
    for links in chains:
        model.note(links)
    assert all(model.match(links) for links in chains)
    last = chains[-1]
    expected = model.match(last)
    prompt_tokens = 300
    model.observed(last, expected, cached_tokens=200, prompt_tokens=prompt_tokens)  # held: two thirds
    assert model.capacity_chars == 400_000  # not under half of what was expected: nothing learned
    model.observed(last, expected, cached_tokens=10, prompt_tokens=prompt_tokens)  # it had let it go
    assert model.capacity_chars < 400_000
    assert model.match(chains[0]) == 0 and model.match(last) > 0  # the oldest leave first
    small = model.capacity_chars
    model.observed(chains[0], 0, cached_tokens=prompt_tokens - 1, prompt_tokens=prompt_tokens)  # held after all
    assert model.capacity_chars > small
