"""gen-pipeline: prompts in, completions out, on a fleet of SGLang servers.

The package follows a row's path: inputs -> tokens -> fleet -> send (answers judged) -> rundir, run by engine
(one process) or shards (claimers and `--workers`), chosen by modes. Around a run: prepare makes its input,
preflight checks it before (`check`), views read what it wrote and export turns that into a dataset; cli is the
command line.
Each sub-package's docstring says what it may import (a test holds the code to it).
The base modules below every sub-package
import only each other: errors, _version, records, digests, samples, config, runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# Each public name and the module it lives in, imported when first asked for: `import gen_pipeline` (which
# every `gen-pipeline` command does first) stays cheap, so the command has its stop handlers in place
# before the run's heavy imports (aiohttp, the pipeline: 0.6-1 s), and a signal then exits 130 too.
_EXPORTS = {
    "CheckpointChangedError": "errors",
    "ConfigError": "errors",
    "FleetError": "errors",
    "ManifestMismatchError": "errors",
    "Outcome": "engine.summary",
    "OutputError": "errors",
    "PipelineError": "errors",
    "RequestError": "errors",
    "RetryPolicy": "config",
    "RunConfig": "config",
    "agenerate": "api",
    "generate": "api",
    "load": "export.load",
    "read_config": "api",
    "run": "modes",
}

if TYPE_CHECKING:
    from .api import agenerate, generate, read_config
    from .config import RetryPolicy, RunConfig
    from .engine.summary import Outcome
    from .errors import (
        CheckpointChangedError,
        ConfigError,
        FleetError,
        ManifestMismatchError,
        OutputError,
        PipelineError,
        RequestError,
    )
    from .export.load import load
    from .modes import run

__all__ = [
    "CheckpointChangedError",
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
    "load",
    "read_config",
    "run",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
