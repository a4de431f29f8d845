"""Seeded faults: the draws for one simulated port, reproducible from (seed, port, request order); and the
loop fault of a chat answer, drawn from its choice's key.

The loop fault: a fraction `p_loop` of answers degenerate into a repetition loop, as reasoning models such as
Qwen3 do at low temperature, and run to max_tokens unless stopped. A looping choice starts as its ordinary answer
would (a drawn number of its words, none to `completion_words`), then repeats a unit of 1 to `loop_period` words
until max_tokens ("length"). With reasoning on, half of the loops are in the thinking, which then spends the
whole budget (empty content). Everything is drawn from the choice's key and the seed, so a rerun loops on the
same choices and a resample with another seed is a new draw.
"""

from __future__ import annotations

import enum
import hashlib
import random
from dataclasses import dataclass, field

from . import sglang
from .config import SimConfig
from .sglang import WORD_OF_BYTE, Generation


class Fault(enum.Enum):
    """What goes wrong with one generation request, if anything."""

    NONE = "none"
    ERROR_500 = "500"
    ERROR_502 = "502"
    QUEUE_FULL = "503"
    DROP = "drop"
    HANG = "hang"


@dataclass
class FaultPlan:
    """The fault rates of one port and the random stream they are drawn from."""

    rng: random.Random
    cuts: list[tuple[float, Fault]] = field(default_factory=list)
    flaky: float = 0.0
    bad_gateway: float = 0.0

    @classmethod
    def for_port(cls, cfg: SimConfig, port: int) -> FaultPlan:
        """The plan of `port`: fleet-wide rates first, then the port's own flaky and bad-gateway rates."""
        edge, cuts = 0.0, []
        for p, fault in (
            (cfg.p500, Fault.ERROR_500),
            (cfg.p503, Fault.QUEUE_FULL),
            (cfg.p_drop, Fault.DROP),
            (cfg.p_hang, Fault.HANG),
        ):
            edge += p
            cuts.append((edge, fault))
        rng = random.Random(cfg.seed + port)
        return cls(rng, cuts, cfg.flaky.get(port, 0.0), cfg.bad_gateway.get(port, 0.0))

    def draw(self) -> Fault:
        """The fault for the next request (a fixed number of draws per rate, so the stream stays reproducible)."""
        r = self.rng.random()
        for edge, fault in self.cuts:
            if r < edge:
                return fault
        if self.flaky and self.rng.random() < self.flaky:
            return Fault.ERROR_500 if self.rng.random() < 0.5 else Fault.ERROR_502
        if self.bad_gateway and self.rng.random() < self.bad_gateway:
            return Fault.ERROR_502
        return Fault.NONE


def raise_fault(fault: Fault) -> None:
    """Turn an injected error fault into its reply."""
    if fault is Fault.ERROR_500:
        raise sglang.internal_error()
    if fault is Fault.ERROR_502:
        raise sglang.Rejection(502, {"message": "Bad Gateway", "code": 502})
    if fault is Fault.QUEUE_FULL:
        raise sglang.queue_full()


# the loop fault

LOOP_PERSON = b"gp-sim-loop"


def loop_draw(key: bytes, cfg: SimConfig) -> str | None:
    """Where the choice derived from `key` loops: "content", "reasoning", or None (it does not)."""
    if cfg.p_loop <= 0:
        return None
    seeded = cfg.seed.to_bytes(8, "little", signed=True) + key
    digest = hashlib.blake2b(seeded, digest_size=9, person=LOOP_PERSON).digest()
    if int.from_bytes(digest[:8], "little") / 2**64 >= cfg.p_loop:
        return None
    return "reasoning" if cfg.reasoning_words > 0 and digest[8] & 1 else "content"


def looping(key: bytes, cfg: SimConfig, max_new: int, natural: Generation) -> Generation:
    """The looping generation of `max_new` tokens: a head of `natural`'s words, then one unit repeated."""
    seeded = cfg.seed.to_bytes(8, "little", signed=True) + key
    digest = hashlib.blake2b(seeded, digest_size=16, person=LOOP_PERSON + b"u").digest()
    head_words = natural.text.split(" ") if natural.text else []
    head = head_words[: int.from_bytes(digest[:4], "little") % (len(head_words) + 1)]
    unit_size = 1 + int.from_bytes(digest[4:8], "little") % cfg.loop_period
    unit = [WORD_OF_BYTE[b] for b in hashlib.shake_128(seeded + b"unit").digest(unit_size)]
    head = head[:max_new]
    loop = (unit * (1 + (max_new - len(head)) // unit_size))[: max_new - len(head)]
    return Generation(" ".join(head + loop), max_new, "length", None, loop_at=len(head))
