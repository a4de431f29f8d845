"""Request deadlines for many requests in flight, on one shared timer.

asyncio.timeout arms and cancels a timer per request (a heap entry and a handle each): 0.05 ms of CPU a
request with 256 in flight against bench/canned.py, a sixth of what the whole aiohttp request costs. Here
a request costs a dict entry. The timer is set for the earliest deadline known when it was set, and set again
when it fires or when a new deadline is earlier by more than SLACK, so a request times out at most SLACK s late.
"""

from __future__ import annotations

import asyncio
import math


class Deadlines:
    """As asyncio.timeout does, the task is cancelled at its deadline; `leave` tells that CancelledError
    from any other cancellation (Ctrl-C's grace period ending), which must go on."""

    SLACK = 0.25

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: dict[asyncio.Task[object], int] = {}  # task -> its cancelling() count before ours
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def enter(self, timeout: float) -> asyncio.Task[object]:
        """Start the current task's deadline, `timeout` s from now; returns the task, for leave()."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.enter() outside a task")
        loop = task.get_loop()
        deadline = loop.time() + timeout
        self._due[task] = deadline
        if deadline < self._timer_at - self.SLACK:
            self._set_timer(loop, deadline)
        return task

    def leave(self, task: asyncio.Task[object]) -> bool:
        """End the task's deadline; True when it expired and its CancelledError was ours alone."""
        del self._due[task]
        before = self._expired.pop(task, None)
        return before is not None and task.uncancel() <= before

    def _set_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel every task past its deadline; set the timer for the soonest one left."""
        self._timer, self._timer_at = None, math.inf
        now, soonest = loop.time(), math.inf
        for task, deadline in self._due.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired[task] = task.cancelling()
                    task.cancel()
            elif deadline < soonest:
                soonest = deadline
        if soonest < math.inf:
            self._set_timer(loop, soonest)
