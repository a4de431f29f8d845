"""A JSON array file, `[{...}, {...}]` (plain, gzip or zstd), read one element at a time.

The file is never parsed whole: a scan over its structural bytes (brackets, braces, strings) finds where
each element ends, a block at a time, and the element's bytes are the row's JSON line. A position is the
byte offset where an element starts, so a resume seeks there (or reads up to it, compressed) and goes on.
A byte between two elements that is neither a comma nor the closing bracket, or an array cut short, stops
the read there: the rows before it are settled, and the run says where it stopped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from .file import STREAM_ERRORS, UTF8_BOM, InputFile, compression, hash_prefix, open_stream
from .readers import Record, RowReader

BLOCK = 1 << 20
MAX_ELEMENT = 64 << 20  # the longest element read (as a JSONL line's limit)
HEAD_BYTES = 1 << 16  # looked at, at most, to tell an array from JSONL
HEAD_BLOCK = 512

_TOKEN = re.compile(rb'[\[\]{}"]')
_STRING_TAIL = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SPACE = re.compile(rb"[ \t\r\n]*")
_SCALAR_END = re.compile(rb"[,\] \t\r\n]")


def is_array(path: Path) -> bool:
    """Whether a text input is one JSON array (its first byte, past a byte order mark and spaces, is `[`); a
    stream that cannot be read is no array (the JSONL reader says why)."""
    head = b""
    try:
        with open_stream(path, compression(path)) as f:
            while not head.lstrip(b" \t\r\n").removeprefix(UTF8_BOM) and (block := f.read(HEAD_BLOCK)):
                head += block
                if len(head) > HEAD_BYTES:
                    break
    except STREAM_ERRORS:
        pass
    return head.removeprefix(UTF8_BOM).lstrip(b" \t\r\n")[:1] == b"["


class _Window:
    """The stream's bytes from `base` on, read a block at a time; what lies before a row already handed on is let go."""

    def __init__(self, stream: BinaryIO, base: int) -> None:
        self.stream, self.base, self.data, self.eof = stream, base, b"", False

    def more(self) -> bool:
        """Read another block; False at the end of the stream."""
        if self.eof:
            return False
        block = self.stream.read(BLOCK)
        self.eof = not block
        self.data += block
        return bool(block)

    def at(self, pos: int) -> bytes:
        """The byte at absolute position `pos` (b"" past the end)."""
        while pos - self.base >= len(self.data) and self.more():
            pass
        i = pos - self.base
        return self.data[i : i + 1]

    def space(self, pos: int) -> int:
        """The position of the first byte at or after `pos` that is not white space."""
        while True:
            i = _SPACE.match(self.data, pos - self.base).end()  # type: ignore[union-attr]
            if i < len(self.data) or not self.more():
                return self.base + i

    def drop_before(self, pos: int) -> bytes:
        """Let go of the bytes before `pos`; they are returned (the cursor hashes them)."""
        cut = pos - self.base
        gone, self.data, self.base = self.data[:cut], self.data[cut:], pos
        return gone


def value_end(data: bytes, i: int) -> int | None:
    """Where the JSON value starting at data[i] ends (exclusive); None when `data` ends first."""
    first = data[i : i + 1]
    if first == b'"':
        m = _STRING_TAIL.match(data, i + 1)
        return m.end() if m else None
    if first not in (b"{", b"["):
        m = _SCALAR_END.search(data, i)
        return m.start() if m else None
    depth, pos = 0, i
    while (m := _TOKEN.search(data, pos)) is not None:
        if data[m.start()] == 0x22:  # a string: jump to its end
            s = _STRING_TAIL.match(data, m.end())
            if s is None:
                return None
            pos = s.end()
            continue
        depth += 1 if data[m.start()] in b"{[" else -1
        pos = m.end()
        if depth == 0:
            return pos
    return None


class JsonArrayReader(RowReader):
    """A JSON array's elements as rows (module docstring)."""

    kind, by_rows = "json", False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.file = InputFile(path)
        self._stream: BinaryIO | None = None
        self.size = self.file.size

    def records(self, start: int) -> Iterator[Record]:
        with self.file.open_at(start) as f:
            self._stream = f
            win = _Window(f, start)
            pos = self._open_bracket(win) if start == 0 else win.space(start)
            n = 0
            while win.at(pos) != b"]":
                end = self._element_end(win, pos, n)
                raw = win.data[pos - win.base : end - win.base]
                after = win.space(end)
                sep = win.at(after)
                if sep == b",":
                    after = win.space(after + 1)
                n += 1
                yield Record(raw, after, win.drop_before(after))
                if sep not in (b",", b"]"):  # the row before it stands; what follows cannot be told apart
                    raise InputError(self._broken(n, sep))
                pos = after

    def _open_bracket(self, win: _Window) -> int:
        """The position of the first element (or of `]`), past the byte order mark and the `[`."""
        win.at(len(UTF8_BOM))
        pos = win.space(len(UTF8_BOM) if win.data.startswith(UTF8_BOM) else 0)
        if win.at(pos) != b"[":
            raise InputError(f"{self.path} is not a JSON array")
        return win.space(pos + 1)

    def _element_end(self, win: _Window, pos: int, n: int) -> int:
        """Where the element at `pos` ends, reading on until the window holds it whole."""
        while True:
            i = pos - win.base
            end = value_end(win.data, i)
            # a number or a literal may go on in the next block; an object, array or string is whole
            if end is not None and (end < len(win.data) or win.data[i : i + 1] in (b"{", b"[", b'"')):
                return win.base + end
            if len(win.data) - i > MAX_ELEMENT:
                raise InputError(f"row {n + 1} of {self.path} is over the {MAX_ELEMENT >> 20} MiB row limit")
            if not win.more():
                break
        if end is None:
            raise InputError(f"the JSON array in {self.path} ends inside row {n + 1} (no closing ])")
        return win.base + end

    def _broken(self, row: int, found: bytes) -> str:
        what = f"{found.decode('utf-8', 'replace')!r}" if found else "the end of the file"
        return f"after row {row}, the JSON array in {self.path} has {what} where a comma or ] belongs"

    def fraction(self, position: int) -> float:
        if self._stream is not None and self.file.kind is not None:
            return self.file.fraction(self._stream, position)
        return min(1.0, position / self.size)

    def fingerprint(self) -> dict[str, object]:
        st = self.path.stat()
        return {"name": self.path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def prefix_hash(self, position: int) -> object:
        return hash_prefix(self.path, position)
