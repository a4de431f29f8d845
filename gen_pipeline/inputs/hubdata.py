"""Datasets as rows: a folder `datasets` saved (`save_to_disk`), a folder of data files, or a hub dataset.

    --input data/saved                        a Dataset, or a DatasetDict's "train" split
    --input data/saved::test                  a DatasetDict's "test" split
    --input HuggingFaceH4/ultrachat_200k::train_sft
    --input org/name:config:split             a hub dataset's config and split

`name[:config][:split]` is loaded by `datasets` as it loads any dataset (load_from_disk for a saved folder,
load_dataset otherwise: a hub dataset is downloaded once into its cache, as Arrow files). Its rows are then
read from those files memory-mapped, a batch at a time; a row's position is its number, so a resume starts
at its first row not settled at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError, PipelineError
from .readers import one_line
from .tables import TableRows

DATASET_MARKERS = ("state.json", "dataset_dict.json")  # what save_to_disk writes beside the Arrow files
DEFAULT_SPLIT = "train"


def hub_parts(spec: str) -> tuple[str, str | None, str | None]:
    """`name[:config][:split]` as (name, config or None, split or None)."""
    name, _, rest = spec.partition(":")
    config, _, split = rest.partition(":")
    return name, config or None, split or None


def load(spec: str) -> Any:
    """The datasets.Dataset that `spec` names (module docstring); InputError saying why it cannot be loaded."""
    import datasets

    name, config, split = hub_parts(spec)
    folder = Path(name).expanduser()
    try:
        if folder.is_dir() and any((folder / m).exists() for m in DATASET_MARKERS):
            ds = datasets.load_from_disk(str(folder))
            if isinstance(ds, datasets.DatasetDict):
                ds = _split(ds, split, spec)
        else:
            ds = datasets.load_dataset(name, config, split=split or DEFAULT_SPLIT)
    except PipelineError:
        raise
    except Exception as exc:  # datasets and the hub raise many kinds; the user sees one line
        raise InputError(f"cannot read {spec} as a dataset: {type(exc).__name__}: {one_line(exc)}") from exc
    if not isinstance(ds, datasets.Dataset):
        raise InputError(f"{spec} is not one split of a dataset: name it as name[:config][:split]")
    return ds


def _split(ds: Any, split: str | None, spec: str) -> Any:
    """One split of a saved DatasetDict: the one named, else "train", else its only one."""
    if split is None and DEFAULT_SPLIT not in ds and len(ds) == 1:
        return next(iter(ds.values()))
    wanted = split or DEFAULT_SPLIT
    if wanted not in ds:
        raise InputError(f"{spec} has no split {wanted!r}; its splits: {sorted(ds)} (name one: dir::split)")
    return ds[wanted]


class DatasetReader(TableRows):
    """The rows of one split of a dataset (module docstring)."""

    kind = "dataset"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._dataset: Any = None

    def dataset(self) -> Any:
        """The datasets.Dataset (loaded once)."""
        if self._dataset is None:
            self._dataset = load(str(self.path))
        return self._dataset

    def table(self) -> Any:
        ds = self.dataset()
        if getattr(ds, "_indices", None) is not None:  # a selection on top of its files: made plain once
            ds = self._dataset = ds.flatten_indices()
        return ds.data.table

    def fingerprint(self) -> dict[str, Any]:
        files = []
        for entry in self.dataset().cache_files:
            path = Path(entry["filename"])
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
        return {"name": str(self.path), "rows": self.rows(), "files": files}
