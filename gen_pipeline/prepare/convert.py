"""`gen-pipeline prepare`: datasets in, one deduplicated prompts JSONL out.

    gen-pipeline prepare --input data.parquet --input more.jsonl --out prompts/all.jsonl \\
        --exclude runs/previous --exclude prompts/older.jsonl --report prepare.json

Sources are JSONL (read directly), JSON, Parquet, CSV, TXT, a dataset folder (a `save_to_disk`
folder or data files), or a Hugging Face hub name. Each row is normalized by `formats` and written
unless its normalized content was seen before (a duplicate) or is already in an --exclude file or run
directory (excluded). A row keeps its own `id`; one another row already has (written here, or in an
--exclude path: the nightly job's dataset) becomes `<id>-<8 hex digits of its content digest>`, its
`source_id` the id it had, so a dataset keeps the users' scheme and every id stays unique. A row without
an id gets its content id, as generate gives one. Memory holds one 8-byte key per distinct prompt;
rows are written as they are accepted into `<out>.tmp`, which replaces `<out>` only when complete.

With --group-prefixes, rows that begin alike (the same messages up to the first user turn, the same tools:
the turns of one conversation, cut at each turn) are written next to each other, the one with the most
messages first, groups in the order their first row was read. `generate` then sends a conversation's rows
together, where the longest one's prefix is still in the server's prefix cache for the shorter ones: in a
shuffled file they are spread over the whole run, and a cache holds a conversation only for a while. Only
the order changes: every row and its line are the same. It costs one pass over `<out>.tmp` and, in memory,
a sort key per row and one entry per group.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from ..errors import ConfigError, OutputError
from ..inputs.formats import FORMATS, InvalidRowError, RowConverter, jsonl_rows, open_source
from ..inputs.rows import RowError, parse_row
from ..records import PERMANENT_REASONS, group_digest, id_from_digest, id_key
from ..rundir.layout import RunDir

log = logging.getLogger(__name__)

PROGRESS_EVERY = 200_000
_DUMP = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True)
class PrepareConfig:
    """What one `prepare` run reads and writes.

    Attributes:
        inputs: files, dataset folders or hub names, read in order.
        out: the prompts JSONL to write (replaced atomically).
        exclude: prompt files, run directories or folders of JSONL whose prompts are dropped.
        format: "auto" (judged per row from its columns) or one of `formats.FORMATS`.
        split / subset: the split, and the hub config name, of dataset sources.
        limit: read at most this many rows from each source.
        streaming: stream a hub dataset instead of downloading it (local files always stream).
        keep_reference: store the dropped answer as `reference` (`meta.reference` after generate).
        keep_turns: keep a conversation's system and user turns (for `generate --turns all`), deduplicated
            on them; the assistant turns are dropped.
        group_prefixes: write rows that begin alike together, the longest first (module docstring).
        report: also write the counts to this JSON file.
    """

    inputs: tuple[str, ...]
    out: Path
    exclude: tuple[Path, ...] = ()
    format: str = "auto"
    split: str = "train"
    subset: str | None = None
    limit: int | None = None
    streaming: bool = False
    keep_reference: bool = False
    keep_turns: bool = False
    report: Path | None = None
    group_prefixes: bool = False

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError("give at least one --input")
        if self.format != "auto" and self.format not in FORMATS:
            raise ConfigError(f"--format must be auto or one of {', '.join(FORMATS)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("--limit must be at least 1")


@dataclass
class PrepareReport:
    """The counts of one run: each row read is invalid, a duplicate, excluded or written.

    `known` is how many distinct prompts (and settled ledger ids) the --exclude paths held.
    """

    read: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    excluded: int = 0
    written: int = 0
    known: int = 0
    ids_made_unique: int = 0  # rows whose own id another row had (unique_id)
    formats: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self, out: Path) -> str:
        """The one-line summary printed at the end."""
        why = ", ".join(f"{k} {v}" for k, v in self.invalid.most_common())
        invalid = f"{self.invalid.total()}" + (f" ({why})" if why else "")
        unique = f" ({self.ids_made_unique} with an id made unique)" if self.ids_made_unique else ""
        return (
            f"prepare: read {self.read}, invalid {invalid}, duplicates {self.duplicates}, "
            f"excluded {self.excluded}, written {self.written}{unique} -> {out} ({self.seconds:.1f}s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "invalid": self.invalid.total(),
            "invalid_reasons": dict(self.invalid.most_common()),
            "duplicates": self.duplicates,
            "excluded": self.excluded,
            "written": self.written,
            "ids_made_unique": self.ids_made_unique,
            "exclude_known": self.known,
            "formats": self.formats,
            "seconds": round(self.seconds, 3),
        }


def digest_key(digest: bytes) -> int:
    """The 8-byte set key of a content digest (collisions: ~3e-6 at ten million prompts)."""
    return int.from_bytes(digest[:8], "little")


class PrefixGroups:
    """The order --group-prefixes writes rows in: by group (first seen first), then most messages first, then
    as read. One int per row (its sort key), its line's offset and length, and a rank per group."""

    def __init__(self) -> None:
        self.ranks: dict[bytes, int] = {}
        self.keys: list[int] = []
        self.offsets = array("Q")
        self.lengths = array("Q")

    def note(self, row: dict[str, Any], offset: int, length: int) -> None:
        """One written row, at `offset` of the unordered file."""
        messages = row.get("messages") or []
        rank = self.ranks.setdefault(group_digest(messages, row.get("tools")), len(self.ranks))
        fewer = MAX_GROUP_MESSAGES - min(len(messages), MAX_GROUP_MESSAGES)  # more messages: earlier
        self.keys.append(((rank * (MAX_GROUP_MESSAGES + 1) + fewer) << 32) | len(self.offsets))
        self.offsets.append(offset)
        self.lengths.append(length)

    def copy(self, src: IO[bytes], dst: IO[bytes]) -> None:
        """Write the lines of `src` (the file the rows were noted from) to `dst` in group order."""
        for key in sorted(self.keys):
            i = key & 0xFFFFFFFF
            src.seek(self.offsets[i])
            dst.write(src.read(self.lengths[i]))


MAX_GROUP_MESSAGES = (1 << 20) - 1  # rows with more messages than this are ordered as if they had this many


class AtomicJsonl:
    """Writes rows to `<path>.tmp` and moves it over `path` only when the block ends cleanly; with `groups`, in
    their order (a second file, `<path>.grouped.tmp`, written from the first)."""

    def __init__(self, path: Path, groups: PrefixGroups | None = None) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.file: IO[bytes] | None = None
        self.groups = groups
        self.size = 0

    def __enter__(self) -> AtomicJsonl:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.tmp.open("wb")
        except OSError as exc:
            raise OutputError(f"cannot write {self.tmp}: {exc}") from exc
        return self

    def write(self, line: bytes, row: dict[str, Any] | None = None) -> None:
        """Write one row's line (newline included); `row`: what the line holds, for the group order."""
        assert self.file is not None
        try:
            self.file.write(line)
        except OSError as exc:
            raise OutputError(f"cannot write {self.tmp}: {exc}") from exc
        if self.groups is not None and row is not None:
            self.groups.note(row, self.size, len(line))
        self.size += len(line)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.file is not None
        grouped = self.tmp.with_name(self.path.name + ".grouped.tmp")
        try:
            if exc_type is None:
                self.file.flush()
                done = self.tmp
                if self.groups is not None:
                    with self.tmp.open("rb") as src, grouped.open("wb") as dst:
                        self.groups.copy(src, dst)
                        dst.flush()
                        os.fsync(dst.fileno())
                    done = grouped
                else:
                    os.fsync(self.file.fileno())
                self.file.close()
                os.replace(done, self.path)
        except OSError as err:
            raise OutputError(f"cannot write {self.path}: {err}") from err
        finally:
            self.file.close()
            self.tmp.unlink(missing_ok=True)
            grouped.unlink(missing_ok=True)


@dataclass
class KnownPrompts:
    """What earlier prompt files and runs hold: content keys, settled ledger ids (and --turns all runs'
    answered ids), and every id they use (`taken`: a new row may not reuse one for other content)."""

    keys: set[int] = field(default_factory=set)
    ids: set[int] = field(default_factory=set)
    taken: set[int] = field(default_factory=set)

    def holds(self, key: int, content_id: str) -> bool:
        """Whether a row with content key `key` (and that content id) is there already: by its content, or by a
        settled content id. A row's own id says nothing of its content (another row may have had it): a
        ledger entry under it does not exclude the row; the prompts file that held it does, by content."""
        return key in self.keys or (bool(self.ids) and id_key(content_id) in self.ids)


def unique_id(row_id: str | int, digest: bytes, taken: set[int]) -> str | int:
    """`row_id` when no other row took it, else `<id>-<8 hex digits of the row's content digest>` (longer in the
    rare case that is taken too): the user's scheme, unique, and the same on every run for the same row."""
    if id_key(row_id) not in taken:
        return row_id
    for width in range(8, 2 * len(digest) + 1, 4):
        candidate = f"{row_id}-{digest.hex()[:width]}"
        if id_key(candidate) not in taken:
            return candidate
    raise InvalidRowError("id_taken")


def exclusion_files(path: Path) -> list[Path]:
    """The JSONL files an --exclude path stands for: a run's output and ledger, or every *.jsonl."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"--exclude {path}: no such file or directory")
    rundir = RunDir(path)
    run = rundir.completion_files()
    if run or rundir.failure_files() or rundir.manifest.exists():
        return [*run, *RunDir(path).failure_files()]
    return sorted(path.glob("*.jsonl"))


def load_known(paths: tuple[Path, ...], keep_turns: bool = False) -> KnownPrompts:
    """Read every --exclude path; a ledger id counts only if its newest entry is permanent; the id of a
    --turns all run's answer counts (its `messages` are one turn's request, not the row's turns)."""
    known, ledger, answered = KnownPrompts(), {}, set()
    newest: dict[int, float] = {}
    for f in (f for p in paths for f in exclusion_files(p)):
        convert = RowConverter(keep_turns=keep_turns)
        for obj in jsonl_rows(f):
            if isinstance(obj, dict) and obj.get("id") is not None:
                known.taken.add(id_key(obj["id"]))
            if isinstance(obj, dict) and "turn" in obj and obj.get("id") is not None:
                answered.add(id_key(obj["id"]))
                continue
            if isinstance(obj, dict) and "messages" not in obj and "reason" in obj:
                if obj.get("id") is not None:
                    key, when = id_key(obj["id"]), float(obj.get("time") or 0.0)
                    if when >= newest.get(key, float("-inf")):
                        newest[key], ledger[key] = when, obj["reason"] in PERMANENT_REASONS
                continue
            try:
                known.keys.add(digest_key(convert(obj).digest))
            except InvalidRowError:
                continue  # a torn line, or a row that was never a prompt
    known.ids = {k for k, permanent in ledger.items() if permanent} | answered
    return known


def _accept(
    convert: RowConverter, raw: Any, known: KnownPrompts, seen: set[int], report: PrepareReport
) -> tuple[bytes, dict[str, Any]] | None:
    """The line to write for one source row and the row, or None (counted as invalid, excluded or dup). A row's
    own id is kept unless another row (written, or in --exclude) has it: then it is made unique (unique_id)."""
    try:
        row = convert(raw)
        line = valid_line(row.row)
        key = digest_key(row.digest)
        if known.holds(key, id_from_digest(row.digest)):
            report.excluded += 1
            return None
        if key in seen:
            report.duplicates += 1
            return None
        final = unique_id(row.row["id"], row.digest, known.taken)
    except InvalidRowError as exc:
        report.invalid[exc.reason] += 1
        return None
    seen.add(key)
    known.taken.add(id_key(final))
    if final == row.row["id"]:
        return line, row.row
    report.ids_made_unique += 1
    renamed = {**row.row, "id": final, "source_id": row.row["id"]}
    return orjson.dumps(renamed, default=str, option=_DUMP) + b"\n", renamed


def valid_line(row: dict[str, Any]) -> bytes:
    """The row as the line `generate` will read, checked by the validator that reads it (inputs.rows.parse_row):
    a row prepare writes is a row generate takes; InvalidRowError (the RowError's tag) otherwise."""
    try:
        line = orjson.dumps(row, default=str, option=_DUMP)
        parse_row(line, 0)
    except orjson.JSONEncodeError:
        raise InvalidRowError("too_deep") from None  # nested beyond what orjson writes
    except RowError as exc:
        raise InvalidRowError(exc.tag) from None
    return line + b"\n"


def prepare(config: PrepareConfig) -> PrepareReport:
    """Read every source, normalize, dedup and exclude, and write the prompts file."""
    start = time.monotonic()
    known = load_known(config.exclude, config.keep_turns)
    report = PrepareReport(known=len(known.keys) + len(known.ids))
    seen: set[int] = set()
    with AtomicJsonl(config.out, PrefixGroups() if config.group_prefixes else None) as out:
        for src in config.inputs:
            convert = RowConverter(config.format, config.keep_reference, config.keep_turns)
            rows = open_source(src, config.split, config.subset, config.streaming, config.limit)
            for raw in rows:
                report.read += 1
                accepted = _accept(convert, raw, known, seen, report)
                if accepted is not None:
                    out.write(*accepted)
                    report.written += 1
                if report.read % PROGRESS_EVERY == 0:
                    log.info("prepare: %d rows read, %d written", report.read, report.written)
            report.formats[src] = dict(convert.seen)
    report.seconds = time.monotonic() - start
    return report
