"""An SGLang-faithful simulated fleet for `gen-pipeline simulate`, the demo and the tests.

Each port runs aiohttp's low-level web server (our route table, with FastAPI's JSON 404 and 405) that
answers like SGLang 0.5.23 (server-api.md §1): the same routes, the exact 400 messages of the length
checks A-D with their off-by-ones, the flat error envelope, queueing beyond max_running, and seeded
faults (dead, flaky, slow, dropped, hung, crashing and restarting ports).

    async with await start_fleet(SimConfig(ports=tuple(free_ports(2)), health_delay=0)) as fleet:
        ...  # talk to fleet.urls; read fleet.stats[port]

May import: the base modules, tokens.
"""

from .cli import add_arguments, main, parse_ports
from .config import SimConfig
from .fleet import SimFleet, free_ports, start_fleet
from .scheduler import PortStats

__all__ = [
    "PortStats",
    "SimConfig",
    "SimFleet",
    "add_arguments",
    "free_ports",
    "main",
    "parse_ports",
    "start_fleet",
]
