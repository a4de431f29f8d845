"""gen-pipeline: prompts in, completions out, on a fleet of SGLang servers."""

__version__ = "0.1.0"

from .api import agenerate, generate
from .config import RetryPolicy, RunConfig
from .errors import (
    ConfigError,
    FleetError,
    ManifestMismatchError,
    OutputError,
    PipelineError,
    RequestError,
)
from .pipeline import run
from .summary import Outcome

__all__ = [
    "ConfigError",
    "FleetError",
    "ManifestMismatchError",
    "Outcome",
    "OutputError",
    "PipelineError",
    "RequestError",
    "RetryPolicy",
    "RunConfig",
    "__version__",
    "agenerate",
    "generate",
    "run",
]
