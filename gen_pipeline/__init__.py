"""gen-pipeline: prompts in, completions out, on a fleet of SGLang servers."""

from ._version import __version__
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
from .modes import run
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
