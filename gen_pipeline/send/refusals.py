"""Telling a misconfigured fleet from bad rows: the same 400, row after row, from every server.

A 400 that no budget fixes is the row's fault (`bad_request`, permanent) as long as the servers serve
other rows. A server whose chat template fails (jinja2 missing, a template error) answers every request
400 with one message, and ledgering each row `bad_request` for good would settle the whole input as bad
data. So a prompt whose every sample came back `bad_request` is held back until a completion shows that the
fleet serves rows; then it is written. When REFUSAL_STREAK held prompts in a row carry one message, from at
least two servers (or the only one), with no completion between them, the run stops (exit 4, fix the fleet):
the held prompts stay unsettled, and a rerun sends them again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..records import Completion, Failure, Prompt
from ..runtime import say
from .dispatch import Sent

# Held prompts with one 400 message and no completion between them that make it the fleet's, not theirs.
REFUSAL_STREAK = 24
# A run that ends with no completion at all: this many held prompts with one message are the fleet's too.
END_EVIDENCE = 3


def refused(sent: Sent) -> str | None:
    """The 400 message when every outcome of a prompt is `bad_request` with that one message, else None."""
    details = {o.detail for o in sent.outcomes if isinstance(o, Failure) and o.reason == "bad_request"}
    if len(details) != 1 or any(isinstance(o, Completion) or o.reason != "bad_request" for o in sent.outcomes):
        return None
    return details.pop()


@dataclass
class RefusalJudge:
    """Holds back prompts the fleet refused (400) until it is clear whose fault it is.

    `release(prompt, sent)` writes a held prompt's outcomes (the rows' fault); `stop(reason)` ends the run
    (the fleet's fault). `fleet`: how many servers the run has."""

    fleet: int
    release: Callable[[Prompt, Sent], None]
    stop: Callable[[str], None]
    held: list[tuple[Prompt, Sent]] = field(default_factory=list)
    message: str | None = None  # the held prompts' one message
    servers: set[str] = field(default_factory=set)  # the servers that gave it
    served: bool = False  # a completion came back in this run
    verdict: str | None = None  # why the run was stopped as the fleet's fault

    def hold(self, prompt: Prompt, sent: Sent) -> bool:
        """Keep a refused prompt back (True), or leave it to be written now (False)."""
        message = refused(sent)
        if message is None:
            if any(isinstance(o, Completion) for o in sent.outcomes):
                self.served = True
                self.flush()
            return False
        if self.verdict is not None:
            return True  # the run stops: nothing refused is settled
        if message != self.message:
            self.flush()
            self.message = message
        self.held.append((prompt, sent))
        self.servers.update(o.server or "" for o in sent.outcomes if isinstance(o, Failure))
        if len(self.held) >= REFUSAL_STREAK and self._everywhere():
            self._fleet_fault()
        return True

    def finish(self) -> None:
        """At the end of the run: what is still held is the fleet's fault when nothing was served at all."""
        if self.verdict is None and not self.served and len(self.held) >= END_EVIDENCE and self._everywhere():
            self._fleet_fault()
        if self.verdict is None:
            self.flush()

    def flush(self) -> None:
        """Write every held prompt: the fleet serves rows, so these were the rows' fault."""
        held, self.held, self.message, self.servers = self.held, [], None, set()
        for prompt, sent in held:
            self.release(prompt, sent)

    def _everywhere(self) -> bool:
        return len(self.servers) >= min(2, self.fleet)

    def _fleet_fault(self) -> None:
        servers = "the only server" if self.fleet == 1 else f"{len(self.servers)} servers"
        self.verdict = (
            f"{servers} answered {len(self.held)} rows in a row with the same 400 and served none: "
            f"{self.message} (the servers are misconfigured, e.g. their chat template fails; nothing was "
            "ledgered for it: fix the servers and run again)"
        )
        self.held.clear()
        say(f"PROBLEM: {self.verdict}")
        self.stop(self.verdict)
