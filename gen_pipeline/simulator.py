"""The simulated SGLang fleet's public face; the code lives in `gen_pipeline.sim`.

Run it alone with `python -m gen_pipeline.simulator --ports 31000-31007 --health-delay 0`.
"""

from .sim import (
    PortStats,
    SimConfig,
    SimFleet,
    add_arguments,
    free_ports,
    main,
    parse_ports,
    start_fleet,
)

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

if __name__ == "__main__":
    import sys

    from .sim.cli import run_module

    sys.exit(run_module())
