"""The ids already in an output file: read fast, held compactly, cached between runs.

Resuming a 650,000-row run reads every output line for its id (3.5 s here). `DIR/.index/` keeps, per
output file, the sorted keys of the complete lines read last time and where they ended. The next read
checks that the file is still the one indexed (same inode, at least as long, the same bytes at 64
sampled places and at the end of the indexed part) and reads only what was appended since. It keeps the
restart generations found too (samples.py: the (id, sample)s answered again, few). Another
file under the same name, a file cut short or edited in place all fail the check, and the whole file
is read again. The index is a cache: deleting `DIR/.index/` is always safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..records import RowId, id_key, parsed_id, peek_id
from ..samples import line_place, note_generation, place_key

INDEX_DIR = ".index"
INDEX_VERSION = 2  # 2: the restart generations
INDEX_EVERY = 60.0  # seconds between saves while a run appends
SAMPLES = 64  # blocks compared to tell an appended file from a different one
BLOCK = 4096
BUCKET_SHIFT = 48  # id keys are 64-bit
BUCKETS = 1 << 16


class KeySet:
    """A fixed set of 64-bit id keys in a sorted array: 8 bytes a key, where a set of ints takes ~60.

    650,000 done ids take 5 MB instead of ~40. The last lookup is remembered, so asking about the same
    key again (settled? skipped before?) costs nothing.
    """

    def __init__(self, keys: Iterable[int] = (), presorted: bool = False) -> None:
        # timsort: arrays of sorted runs (one per file) merge fast
        self.keys = keys if presorted and isinstance(keys, array) else array("Q", sorted(keys))
        # where each top-16-bit bucket starts: a lookup bisects ~10 keys, not 650,000 (3x faster)
        bounds = (bisect_left(self.keys, b << BUCKET_SHIFT) for b in range(BUCKETS + 1)) if self.keys else ()
        self.starts = array("Q", bounds)
        self._last = (-1, -1)

    def position(self, key: int) -> int:
        """The key's index in the sorted array, or -1."""
        if self._last[0] == key:
            return self._last[1]
        b = key >> BUCKET_SHIFT
        i = bisect_left(self.keys, key, self.starts[b], self.starts[b + 1]) if self.starts and 0 <= b < BUCKETS else -1
        pos = i if 0 <= i < len(self.keys) and self.keys[i] == key else -1
        self._last = (key, pos)
        return pos

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.position(key) >= 0

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[int]:
        return iter(self.keys)


def merge_sorted(keys: array[int], new: Iterable[int], new_sorted: bool = False) -> array[int]:
    """`keys` (sorted) with `new` merged in, without a list of every key (a 650k-key list of ints is a
    ~30 MB spike): the new keys, sorted, are copied in between slices of the old array, so pass the
    smaller array as `new`."""
    out, i = array("Q"), 0
    for k in new if new_sorted else sorted(new):
        j = bisect_left(keys, k, i)
        out += keys[i:j]
        out.append(k)
        i = j
    out += keys[i:]
    return out


def union(a: array[int], b: array[int]) -> array[int]:
    """Two sorted key arrays as one (the smaller is merged into the bigger)."""
    big, small = (a, b) if len(a) >= len(b) else (b, a)
    return merge_sorted(big, small, new_sorted=True)


def line_id(raw: bytes) -> RowId | None:
    """The id of one output line, or None when the line is not a completion.

    Our own lines start with their id and end with "}": those are read without parsing the whole line
    (2.5x faster on 650k lines). Anything else is parsed in full. Crashes and full disks damage a file's
    tail, which `store.repair_tail` cuts off first; a power loss can leave blocks of NULs, which fail
    both the cheap check and the parse.
    """
    rid = peek_id(raw) if raw.endswith(b"}\n") else None
    return rid if rid is not None else parsed_id(raw)


def line_key(raw: bytes, restarts: dict[int, int] | None = None) -> int | None:
    """The key of one output line, `(id, sample, turn, restart)` (samples.place_key), or None when it is not a
    completion; a line of a restart generation is noted in `restarts` (samples.note_generation) when given."""
    rid = line_id(raw)
    place = line_place(raw) if rid is not None else None
    if rid is None or place is None:
        return None
    row = id_key(rid)
    if place[2] and restarts is not None:
        note_generation(restarts, row, place)
    return place_key(row, *place)


@dataclass
class FileKeys:
    """The completions found in one output file."""

    path: Path
    keys: array[int]  # sorted, of every line read (an unfinished last line included)
    corrupt: list[int]  # line numbers
    size: int  # bytes of complete lines
    lines: int  # complete lines
    complete: bool  # False when an unfinished last line was read beyond `size`
    restarts: dict[int, int] = field(default_factory=dict)  # sample_key -> newest restart generation (samples.py)


def completion_keys(path: Path, save: bool = True) -> FileKeys:
    """The keys of every completion in `path` (sorted) and the numbers of its corrupt lines.

    Starts from the index when it still describes the file, and records the new end (if `save`).
    A last line without its newline (a writer is appending, or a crash) is read but never indexed.
    """
    start, lines, keys, corrupt, restarts = 0, 0, array("Q"), list[int](), dict[int, int]()
    cached = _load(path)
    if cached is not None:
        start, lines, keys, corrupt, restarts = cached
    end, appended, tail = start, array("Q"), None
    with path.open("rb") as f:
        f.seek(start)
        for raw in f:
            if not raw.endswith(b"\n"):
                tail = raw  # only the last line can lack it
                break
            lines += 1
            end += len(raw)
            key = line_key(raw, restarts)
            if key is None:
                corrupt.append(lines)
            else:
                appended.append(key)
    if appended:
        keys = merge_sorted(keys, appended)
    if save and end > start:
        _save(path, keys, corrupt, end, lines, restarts)
    found = FileKeys(path, keys, corrupt, end, lines, complete=tail is None, restarts=restarts)
    if tail is not None:
        seen = dict(restarts)  # the index keeps complete lines' only
        tail_key = line_key(tail, seen)
        if tail_key is None:
            found.corrupt = [*corrupt, lines + 1]
        else:
            found.keys = array("Q", keys)
            key = tail_key
            found.keys.insert(bisect_left(found.keys, key), key)
            found.restarts = seen
    return found


class IndexKeeper:
    """Keeps an output file's index current while the run appends to it, so that even the first resume
    after a crash reads only the last INDEX_EVERY seconds of lines. Saved on that interval and at close."""

    def __init__(self, found: FileKeys) -> None:
        self.found = found
        self.appended = array("Q")
        self.saved_at = time.monotonic()

    def add(self, key: int, nbytes: int) -> None:
        """One more complete, flushed line."""
        self.appended.append(key)
        self.found.size += nbytes
        self.found.lines += 1

    def due(self) -> bool:
        return time.monotonic() - self.saved_at >= INDEX_EVERY

    def save(self) -> None:
        f = self.found
        if self.appended:
            f.keys = merge_sorted(f.keys, self.appended)
            self.appended = array("Q")
        _save(f.path, f.keys, f.corrupt, f.size, f.lines, f.restarts)
        self.saved_at = time.monotonic()


def _index_path(path: Path) -> Path:
    return path.parent / INDEX_DIR / (path.name + ".idx")


def _fingerprint(path: Path, size: int) -> str:
    """A digest of the file's first `size` bytes at SAMPLES evenly spaced blocks (the last one ends at `size`)."""
    h = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    with path.open("rb") as f:
        for i in range(SAMPLES):
            offset = max(0, (size - BLOCK) * i // (SAMPLES - 1))
            f.seek(offset)
            h.update(f.read(min(BLOCK, size - offset)))
    return h.hexdigest()


def _load(path: Path) -> tuple[int, int, array[int], list[int], dict[int, int]] | None:
    """(indexed bytes, lines, sorted keys, corrupt line numbers, restart generations) when the index still
    fits the file."""
    try:
        raw = _index_path(path).read_bytes()
        header_end = raw.index(b"\n")
        head = orjson.loads(raw[:header_end])
        st = path.stat()
        size = int(head["size"])
        if head.get("version") != INDEX_VERSION or head.get("inode") != st.st_ino or st.st_size < size:
            return None
        if head.get("fingerprint") != _fingerprint(path, size):
            return None
        keys = array("Q")
        keys.frombytes(raw[header_end + 1 :])
        if len(keys) != head.get("count"):
            return None
        restarts = {int(k): int(g) for k, g in head.get("restarts", [])}
        return size, int(head["lines"]), keys, [int(n) for n in head.get("corrupt", [])], restarts
    except (OSError, ValueError, KeyError, TypeError):  # no index, or not one we wrote: read the file
        return None


def _save(path: Path, keys: array[int], corrupt: list[int], size: int, lines: int, restarts: dict[int, int]) -> None:
    """Record the sorted keys of the first `size` bytes (`lines` complete lines) of `path`; best effort:
    an index that cannot be written costs the next resume time, never this run."""
    index = _index_path(path)
    tmp = index.with_name(f"{index.name}.{os.getpid()}.tmp")  # workers may write the same index at once
    try:
        head = {
            "version": INDEX_VERSION,
            "file": path.name,
            "inode": path.stat().st_ino,
            "size": size,
            "lines": lines,
            "count": len(keys),
            "corrupt": corrupt,
            "restarts": sorted(restarts.items()),
            "fingerprint": _fingerprint(path, size),
        }
        index.parent.mkdir(exist_ok=True)
        tmp.write_bytes(orjson.dumps(head) + b"\n" + keys.tobytes())
        os.replace(tmp, index)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


class KeyMap:
    """A growing map of 64-bit key -> 64-bit value in ~20 bytes an entry (a dict of ints takes ~110).

    New entries go to a small dict; when it holds 1/8 of the total (at least MERGE_AT), it is merged
    into two sorted arrays, found like KeySet's keys. Holds the offset of the row that owns each id
    (repeat detection) over a 650,000-row run in ~25 MB instead of ~80, for ~3 us more a row.
    """

    MERGE_AT = 65536

    def __init__(self) -> None:
        self.recent: dict[int, int] = {}
        self.frozen = KeySet()
        self.values = array("Q")
        self.limit = self.MERGE_AT

    @classmethod
    def from_sorted(cls, keys: array[int], values: array[int]) -> KeyMap:
        """A map holding `keys` (sorted, distinct) -> `values`, taking both arrays as they are."""
        made = cls()
        made.frozen, made.values = KeySet(keys, presorted=True), values
        made.limit = max(cls.MERGE_AT, len(keys) // 8)
        return made

    def __len__(self) -> int:
        return len(self.recent) + len(self.frozen.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.recent or (bool(self.frozen.keys) and key in self.frozen)

    def get(self, key: int) -> int | None:
        value = self.recent.get(key)
        if value is None and self.frozen.keys:
            i = self.frozen.position(key)
            return self.values[i] if i >= 0 else None
        return value

    def first(self, key: int, value: int) -> int | None:
        """The key's earlier value, or None when the key is new (it then gets `value`): one lookup."""
        recent = self.recent
        old = recent.get(key)
        if old is not None:
            return old
        if self.frozen.keys:
            i = self.frozen.position(key)
            if i >= 0:
                return self.values[i]
        recent[key] = value
        if len(recent) >= self.limit:
            self._merge()
        return None

    def __setitem__(self, key: int, value: int) -> None:
        if self.frozen.keys:
            i = self.frozen.position(key)
            if i >= 0:
                self.values[i] = value
                return
        recent = self.recent
        recent[key] = value
        if len(recent) >= self.limit:
            self._merge()

    def _merge(self) -> None:
        """Merge the recent dict into the sorted arrays (linear in the total, a few times per doubling)."""
        keys, values = array("Q"), array("Q")
        old_k, old_v, i = self.frozen.keys, self.values, 0
        for k in sorted(self.recent):  # as merge_sorted, with the values alongside
            j = bisect_left(old_k, k, i)
            keys += old_k[i:j]
            values += old_v[i:j]
            keys.append(k)
            values.append(self.recent[k])
            i = j
        keys += old_k[i:]
        values += old_v[i:]
        self.frozen, self.values, self.recent = KeySet(keys, presorted=True), values, {}
        self.limit = max(self.MERGE_AT, len(keys) // 8)
