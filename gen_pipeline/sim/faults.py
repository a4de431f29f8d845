"""Seeded fault draws for one simulated port: reproducible from (seed, port, request order)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from .config import SimConfig


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
