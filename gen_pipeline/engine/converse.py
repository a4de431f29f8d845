"""Sending one row's conversations under `--turns all`: each sample's turns in order, each on the
server that answered the turn before when it is in service and has a free slot (its prefix cache holds
the history), each answer written before the next turn is asked (send/turns.py has the shapes and keys).

Every turn is counted exactly (a long conversation in a thread of its own; the reader's thread counts the
first turns) and budgeted like any prompt. A turn with too little room is ledgered `over_length` with its
turn number and the conversation ends there; a context 400 no budget fixes ends it as `context_overflow`, and
a turn whose every answer the checks rejected (send/resample.py) as `invalid` or `degenerate`: a turn is checked
before the next one builds on it.
A transient failure leaves the conversation where it is: the next run goes on at that turn.

A conversation's last failure is not written here: `run` hands the prompt's failures back to the Runner, which
puts them before the refusal judge as it does a `--turns last` prompt's (send/refusals.py: the same 400 from
the whole fleet is the fleet's fault, never the rows'). Each answer is shown to the judge too: it is the
completion that tells a fleet serving rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from ..fleet.balancer import ServerPool
from ..records import TRANSIENT_REASONS, Completion, Failure, Messages, Prompt
from ..samples import place_key
from ..send.dispatch import SampleDispatch, Sent
from ..send.refusals import RefusalJudge
from ..send.requests import Track
from ..send.resample import Attempts
from ..send.turns import answer_turn, turn_request
from ..tokens import TokenCounter
from .reader import conversation
from .recorder import Recorder

# A conversation shorter than this is counted on the event loop: the server keeps its place between two
# turns, so the time to count is slot time lost, and a thread's turn at the GIL takes longer than the count.
INLINE_CHARS = 20_000
AFFINITY = True  # a next turn prefers the server that answered the last (bench/turns.py measures it off)

End = Literal["complete", "ended", "waiting", "stopped"]  # ended: a permanent failure; waiting: a transient one
ENDS: tuple[End, ...] = ("stopped", "waiting", "ended", "complete")  # the least settled first


class TurnDispatch:
    """Runs the conversations one prompt still owes; the Runner's worker awaits one prompt at a time."""

    def __init__(
        self,
        dispatch: SampleDispatch,
        counter: TokenCounter,
        recorder: Recorder,
        stopping: asyncio.Event,
        judge: RefusalJudge,
    ) -> None:
        self.dispatch, self.path = dispatch, dispatch.path
        self.counter, self.recorder, self.stopping, self.judge = counter, recorder, stopping, judge
        self.stats = recorder.stats
        self._count_thread = ThreadPoolExecutor(1, thread_name_prefix="turns-count")
        self._firsts: dict[int, list[Completion]] = {}  # by id() of a prompt being run: its turn 0 answers
        self.owed = 0  # turns still to send of the conversations read: the run's backlog
        self._tail, self._tail_at = asyncio.Event(), -1  # set once the backlog fits the fleet (until_tail)

    def owe(self, prompt: Prompt) -> None:
        """A prompt was read: its conversations' turns still to send join the backlog."""
        turns = len(prompt.turns or ())
        self.owed += sum(turns - prompt.resume.get(s, (0, []))[0] for s in prompt.pending)

    async def until_tail(self, pool: ServerPool) -> None:
        """Once the input is read, wait until the turns left fit the fleet at once, then begin the tail (the
        balancer then keeps requests off busy servers: ServerPool.begin_tail)."""
        self._tail_at = pool.serving_slots()
        self._pay(0)
        await self._tail.wait()
        pool.begin_tail(lambda: self.owed)

    def _pay(self, turns: int) -> None:
        """`turns` of the backlog were sent or will not be."""
        self.owed -= turns
        if self.owed <= self._tail_at:
            self._tail.set()

    def close(self) -> None:
        self._count_thread.shutdown(wait=False, cancel_futures=True)

    async def run(self, prompt: Prompt) -> tuple[End, Sent]:
        """Every owed conversation of the prompt, side by side: the least settled outcome of them, and the
        failures they stopped at, not written yet (the Runner judges and writes them)."""
        firsts = self._firsts[id(prompt)] = []
        try:
            outs = await asyncio.gather(*(self._conversation(prompt, s) for s in prompt.pending))
        finally:
            del self._firsts[id(prompt)]
        self.recorder.judge_samples(prompt, firsts)  # its samples' first answers, as --turns last compares them
        failures = [o for o in outs if isinstance(o, Failure)]
        ends = {o if isinstance(o, str) else _end(o) for o in outs}
        return next(e for e in ENDS if e in ends or e == "complete"), Sent(list(failures))

    async def _conversation(self, prompt: Prompt, sample: int) -> End | Failure:
        assert prompt.turns is not None
        start, history = prompt.resume.get(sample, (0, []))
        left = len(prompt.turns) - start
        home: str | None = None  # the server keeping room for the next turn (it answered the last)
        try:
            for turn in range(start, len(prompt.turns)):
                if self.stopping.is_set():
                    return "stopped"  # not sent: the next run goes on here
                request = await self._counted(prompt, turn_request(history, prompt.turns[turn]), turn)
                keep = AFFINITY and turn + 1 < len(prompt.turns)
                answer = await self._ask(request, prompt, sample, turn, (home, keep))
                home = None  # used by this turn, or given back (_ask)
                self._pay(1)
                left -= 1
                if not isinstance(answer, tuple):
                    self.stats.work.dropped += left  # settled for this run's progress: never sent
                    return answer
                history, home = answer
            self.stats.conversations["complete"] += 1
            return "complete"
        finally:
            self._pay(left)  # the turns it will not send
            self.path.pool.unhome(home)

    async def _counted(self, prompt: Prompt, messages: Messages, turn: int) -> Prompt | str:
        """Turn `turn`'s request as a prompt with its exact count (turn 0's the reader made), or why it
        cannot be counted (the template refuses it)."""
        if turn == 0:
            return prompt
        request = dataclasses.replace(prompt, messages=messages, at_least=False)
        chat = [conversation(request)]
        if sum(len(str(m.get("content"))) for m in messages) < INLINE_CHARS:
            count = self.counter.count(chat)[0]  # a millisecond: less than the hop to a thread and back
        else:
            count = (await asyncio.get_running_loop().run_in_executor(self._count_thread, self.counter.count, chat))[0]
        if isinstance(count, str):
            return count
        request.input_tokens = count
        return request

    async def _ask(
        self, request: Prompt | str, prompt: Prompt, sample: int, turn: int, place: tuple[str | None, bool]
    ) -> tuple[Messages, str | None] | Failure:
        """Send one turn and write its answer: the history with it and the server that keeps room for the next
        turn, if any; or the failure the conversation stops at (not written). `place`: the server that
        keeps room for this turn (its home, given back here when not used), and whether to keep room for the
        next on the server that answers."""
        home, keep = place
        if isinstance(request, str):
            self.path.pool.unhome(home)
            detail = f"turn {turn} cannot be rendered: {request}"
            return _placed(Failure(prompt.id, prompt.line, "bad_input", detail), prompt, sample, turn)
        path = self.path
        budget = path.budget(request)  # the turn's request: the conversation's row with this turn's messages
        if isinstance(budget, str):
            self.path.pool.unhome(home)
            ends = f"after turn {turn - 1}" if turn else "before its first answer"  # (not "after turn -1")
            detail = f"turn {turn}: {budget}; the conversation ends {ends}"
            over = Failure(prompt.id, prompt.line, "over_length", detail, input_tokens=request.input_tokens)
            return _placed(over, prompt, sample, turn)
        track = Track(prefer=home, home=home is not None, keep=keep)
        tries = Attempts.of(prompt, sample, turn)
        answer, track = await self.dispatch.answers.answer(request, budget, sample, turn, track, tries)
        if track.home:  # never given a slot
            self.path.pool.unhome(track.prefer)
        if isinstance(answer, Failure):
            return _placed(answer, prompt, sample, turn)
        result = answer.result
        done = self.dispatch.completion(request, result, answer.budget, track, sample, result)
        done.turn, done.restart = turn, prompt.restart.get(sample, 0)
        done.key = place_key(prompt.key, sample, turn, done.restart)
        done.extra["turns"] = len(prompt.turns or ())  # export tells a complete conversation by it
        if answer.rejected:
            done.extra["rejected"] = answer.rejected
        outcome = Sent([done])
        outcome.count(result)
        self.judge.hold(request, outcome)  # never held (an answer): the fleet serves rows
        self.recorder.sent(request, outcome)
        if turn == 0:
            self._firsts[id(prompt)].append(done)
        return [
            *request.messages,
            answer_turn(result.content, result.reasoning_content),
        ], track.server if keep else None


def _placed(failure: Failure, prompt: Prompt, sample: int, turn: int) -> Failure:
    """A failure of one turn of one conversation, in its restart generation."""
    return dataclasses.replace(failure, sample=sample, turn=turn, restart=prompt.restart.get(sample, 0))


def _end(failure: Failure) -> End:
    """How a conversation stopped at `failure` stands: waiting (transient) or ended (permanent)."""
    return "waiting" if failure.reason in TRANSIENT_REASONS else "ended"
