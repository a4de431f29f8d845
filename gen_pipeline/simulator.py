"""`python -m gen_pipeline.simulator ...`: the simulated SGLang fleet on its own (the code is in `gen_pipeline.sim`).

Example: `python -m gen_pipeline.simulator --ports 31000-31007 --health-delay 0`.
"""

import sys

from .sim.cli import run_module

if __name__ == "__main__":
    sys.exit(run_module())
