"""`gen_pipeline.load`: a run as a `datasets.Dataset`, the rows `export` writes, in a notebook or script.

    import gen_pipeline

    gen_pipeline.generate("prompts/my.jsonl", "runs/my-run", servers="127.0.0.1:30000-30007")
    ds = gen_pipeline.load("runs/my-run")

Options are export's flags with `_` for `-` (`columns=["meta.src"]`, `drop_truncated=True`,
`format="conversations"`, `reasoning="inline"`, ...), with the same defaults; several run directories go into
one dataset as with `export runA runB`. It reads the run and never changes it. The dataset is built in a
temporary folder and read into memory; `cache_dir=` keeps its Arrow files in that folder instead, read from
there (for a run bigger than memory). Refusals are export's (ConfigError, ExportCheckError).
"""

from __future__ import annotations

import dataclasses
import difflib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .export import build_dataset, checked, refuse_unsure
from .exportconfig import TRAINER_FORMATS, ExportConfig, ExportStats, with_default_columns


def load(
    *runs: str | Path,
    columns: Sequence[str] = (),
    format: str = "dataset",
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Any:
    """The rows `export RUNS...` would write with these options, as a `datasets.Dataset`."""
    if not runs:
        raise ConfigError("load: name at least one run directory")
    _refuse_unknown(options)
    if isinstance(columns, str):  # "meta.src,reasoning_content", as the flag takes them
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    if format not in ("dataset", *TRAINER_FORMATS):
        raise ConfigError(f"load: format is dataset, {' or '.join(TRAINER_FORMATS)} (openai-batch is files)")
    folder = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="gen-pipeline-load-"))
    config = ExportConfig(
        runs=tuple(Path(r) for r in runs),
        out=folder / "out",  # never written
        columns=with_default_columns(tuple(columns)),
        format=format,
        **options,
    )
    checked(config)
    stats = ExportStats()
    try:
        dataset = build_dataset(config, stats, folder / "cache", in_memory=cache_dir is None)
        refuse_unsure(stats, config)  # as export refuses
        return dataset
    finally:
        if cache_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


# export's options for the files it writes: load writes none, so it refuses them rather than return other rows
WRITING = {"out", "overwrite", "save_to_disk", "shard_rows", "push_to_hub", "private", "rejected"}


def _refuse_unknown(options: dict[str, Any]) -> None:
    """A keyword that is none of export's row options is a ConfigError naming it (and the one it is close to)."""
    known = {f.name for f in dataclasses.fields(ExportConfig)} - WRITING - {"runs", "columns", "format"}
    for name in options:
        if name == "rejected":
            raise ConfigError(
                "load: rejected= is not load's: it returns the accepted rows; `export --rejected` writes "
                "the rejected answers (OUT/rejected/)"
            )
        if name in WRITING:
            raise ConfigError(f"load: {name}= is export's, for the files it writes; load writes none")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise ConfigError(f"load: unknown option {name}=" + (f"; did you mean {close[0]}=?" if close else ""))
