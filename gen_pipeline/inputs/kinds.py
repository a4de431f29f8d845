"""What `--input` names, told apart once: a JSONL file, another file `generate` reads (readers.py's table),
a dataset folder or a hub dataset name; and the one check that refuses, in one line, what it cannot read.

A file is told by its first bytes (Parquet's and Arrow's magic numbers, a JSON array's `[`) or, for CSV, its
suffix. A folder is a dataset: one `datasets` saved (`save_to_disk`), or a folder of data files. A name that is
no local path is a hub dataset, `name[:config][:split]`; a missing file that looks like one (a path, a file
suffix) is said to be missing, never looked up on the hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .file import check_text, input_lines
from .hubdata import DATASET_MARKERS, DatasetReader, hub_parts
from .jsonarray import JsonArrayReader, is_array
from .readers import RowReader
from .tables import ArrowReader, CsvReader, ParquetReader

TABLE_MAGIC = {b"PAR1": "parquet", b"ARROW1": "arrow", b"\xff\xff\xff\xff": "arrow"}
CSV_SUFFIXES = (".csv",)
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
# A missing --input with one of these suffixes is a missing file, never a hub name.
LOCAL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".parquet", ".arrow", ".gz", ".zst", ".txt", ".tsv")
# Files `datasets` builds a dataset of, in a folder given as --input
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".arrow", ".jsonl.gz", ".json.gz", ".csv.gz")
READERS: dict[str, type[RowReader]] = {
    "parquet": ParquetReader,
    "arrow": ArrowReader,
    "csv": CsvReader,
    "dataset": DatasetReader,
}
WHAT_IT_READS = (
    "--input takes a prompts file (JSONL, a JSON array, CSV or Parquet, plain or gzip/zstd compressed), a "
    "folder saved by datasets (save_to_disk) or of data files, or a hub dataset name[:config][:split]"
)


def looks_local(spec: str) -> bool:
    """Whether --input names a local path: an absolute or relative path, or a name with a file suffix."""
    return spec.startswith(("/", ".", "~")) or spec.lower().endswith(LOCAL_SUFFIXES)


def input_kind(path: Path) -> str:
    """The kind of input: text (JSONL or a JSON array), csv, parquet, arrow or dataset; InputError for a missing
    file or a folder that holds no dataset."""
    spec = str(path)
    folder = path if path.is_dir() else Path(hub_parts(spec)[0])
    if folder.is_dir():
        if not holds_dataset(folder):
            raise InputError(
                f"{path} is a directory: {WHAT_IT_READS}; this one holds no saved dataset (state.json or "
                "dataset_dict.json) and no data files (at its top or a folder down)"
            )
        return "dataset"
    if not path.exists():
        if looks_local(spec):
            raise InputError(f"input file not found: {path}")
        return "dataset"  # a hub dataset name
    if not path.is_file():
        raise InputError(f"{path} is not a file: {WHAT_IT_READS}")
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    for magic, kind in TABLE_MAGIC.items():
        if head.startswith(magic):
            return kind
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in COMPRESSED_SUFFIXES]
    if suffixes and suffixes[-1] == ".arrow":
        return "arrow"
    if suffixes and suffixes[-1] in CSV_SUFFIXES:
        return "csv"
    return "text"


def holds_dataset(folder: Path) -> bool:
    """Whether a folder is one `datasets` reads: saved by save_to_disk, or a repository of data files (a README.md
    that may name its configs, or data files at its top or a folder down, as hub repositories hold them)."""
    if any((folder / m).exists() for m in DATASET_MARKERS) or _dataset_card(folder / "README.md"):
        return True
    files = (*folder.glob("*"), *folder.glob("*/*"))
    return any(f.name.lower().endswith(DATA_SUFFIXES) and f.is_file() for f in files)


def _dataset_card(readme: Path) -> bool:
    """Whether a README.md is a dataset card (it opens with a YAML header, where a repository names its configs)."""
    try:
        with readme.open("rb") as f:
            return f.read(4).rstrip() == b"---"
    except OSError:
        return False


def open_reader(path: Path) -> RowReader | None:
    """The reader of a non-JSONL input; None for JSONL (source.py reads it line by line)."""
    kind = input_kind(path)
    if kind == "text":
        return JsonArrayReader(path) if is_array(path) else None
    return READERS[kind](path)


def check_input(path: Path) -> str:
    """Refuse, in one line, an input `generate` cannot read (before anything is sent or made); its kind."""
    kind = input_kind(path)
    if kind == "text":
        check_text(path)
        return "json" if is_array(path) else "jsonl"
    reader = READERS[kind](path)
    try:
        reader.check()
    finally:
        reader.close()
    return kind


def input_identity(path: Path) -> tuple[int | None, int | None]:
    """The input's device and inode ((None, None) for a hub dataset name): the input cursor's guard against
    another file under the same name."""
    try:
        st = path.stat()
    except OSError:
        return None, None
    return st.st_dev, st.st_ino


def input_fingerprint(path: Path) -> dict[str, Any]:
    """What says the input is the one a claimed shard was settled for (a grown or edited input reopens it)."""
    reader = open_reader(path)
    if reader is None:
        st = path.stat()
        return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        return reader.fingerprint()
    finally:
        reader.close()


def input_rows(path: Path) -> tuple[int, str] | None:
    """How many rows the input holds, for status's totals: JSONL's lines, a table's rows; None when that takes
    reading it (a JSON array, CSV, a dataset) or it cannot be read."""
    try:
        kind = input_kind(path)
        if kind == "text" and not is_array(path):
            lines = input_lines(path)
            return (lines, "lines") if lines is not None else None
        if kind in ("parquet", "arrow"):
            reader = READERS[kind](path)
            try:
                rows = reader.rows()
            finally:
                reader.close()
            return (rows, "rows") if rows is not None else None
    except (InputError, OSError):
        return None
    return None
