"""Opening the prompts file: plain JSONL, or gzip / zstd compressed JSONL, told apart by content, not name.

Every offset the reader, the input cursor and the repeat check keep is a position in the decompressed
stream, so a compressed input resumes like a plain one. Random access (the repeat check re-reads the row
that owns an id) moves forward by reading and backward by reopening, so it costs a pass over the stream
only when a repeat's first row lies behind the one read last. Other binary input (zip, SQLite, UTF-16
text, ...) is refused in one line. (Parquet, Arrow, CSV, a JSON array and datasets are read too: kinds.py.)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from pathlib import Path
from typing import Any, BinaryIO, cast

from ..errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Formats we recognise but do not read: what to do instead goes in the message.
REFUSED = {
    b"BZh": "a bzip2 file (decompress it first: bunzip2 -k)",
    b"\xfd7zXZ\x00": "an xz file (decompress it first: xz -dk)",
    b"PK\x03\x04": "a zip archive (unzip it first)",
    b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive (extract it first)",
    b"SQLite format 3\x00": "an SQLite database",
    b"\xff\xfe": "UTF-16 text (convert it to UTF-8: iconv -f UTF-16 -t UTF-8)",
    b"\xfe\xff": "UTF-16 text (convert it to UTF-8: iconv -f UTF-16 -t UTF-8)",
}
UTF8_BOM = b"\xef\xbb\xbf"
SNIFF_BYTES = 64 << 10  # the head of the (decompressed) input looked at for NUL bytes
SNIFF_BLOCK = 4 << 10  # read1 in blocks: a truncated stream loses only the block it ends in
SKIP_BLOCK = 1 << 20
# what reading a truncated or corrupt gzip/zstd stream raises (a corrupt gzip block: zlib.error)
STREAM_ERRORS = (OSError, EOFError, ValueError, zlib.error)


def _head(path: Path, n: int = 16) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(n)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def compression(path: Path) -> str | None:
    """The compression ("gzip", "zstd") or None for a plain file; InputError for a binary format we do not read."""
    head = _head(path)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    for magic, what in REFUSED.items():
        if head.startswith(magic):
            raise InputError(f"{path} is {what}, not JSONL")
    return None


class _Buffered(io.BufferedReader):
    """A buffered zstd stream that keeps the compressed file, whose position is the progress."""

    fileobj: BinaryIO


class _Raw(io.RawIOBase):
    """A raw stream over any object with read(n) (a zstandard reader), for io.BufferedReader."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.reader.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.reader.close()
        super().close()


def _open_zstd(path: Path) -> BinaryIO:
    """A zstd stream through the zstandard package when installed, else Python's own (3.14+)."""
    try:
        import zstandard
    except ImportError:
        try:
            from compression import zstd  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise InputError(
                f"{path} is zstd-compressed; reading it needs the zstandard package (pip install zstandard) "
                f"or Python 3.14, or decompress it first: zstd -dk {path}"
            ) from None
        return zstd.open(path, "rb")  # type: ignore[no-any-return]
    source = path.open("rb")
    reader = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True, closefd=True)
    stream = _Buffered(_Raw(reader), SKIP_BLOCK)
    stream.fileobj = source
    return stream


def open_stream(path: Path, kind: str | None) -> BinaryIO:
    """The input's bytes, decompressed when `kind` says so, from the start."""
    try:
        if kind == "gzip":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if kind == "zstd":
            return _open_zstd(path)
        return path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def input_lines(path: Path) -> int | None:
    """Lines of the input as the run reads it (decompressed), for status's totals; None when it cannot be read
    (a truncated or corrupt stream: generate says why, status only leaves the total out)."""
    n = 0
    try:
        with open_stream(path, compression(path)) as f:
            while block := f.read(SKIP_BLOCK):
                n += block.count(b"\n")
    except (InputError, *STREAM_ERRORS):
        return None
    return n


def skip(f: BinaryIO, n: int) -> None:
    """Read and drop `n` bytes (a compressed stream cannot seek cheaply); InputError when it ends first."""
    while n > 0:
        block = f.read(min(SKIP_BLOCK, n))
        if not block:
            raise InputError("the input is shorter than expected")
        n -= len(block)


def check_text(path: Path) -> str | None:
    """Refuse, in one line, a text input that is not (compressed) UTF-8 text; return its compression."""
    kind = compression(path)
    head = b""
    try:
        with open_stream(path, kind) as f:
            stream = cast(io.BufferedIOBase, f)  # each of ours has read1: one read of the file per block
            while len(head) < SNIFF_BYTES and (block := stream.read1(SNIFF_BLOCK)):
                head += block
    except STREAM_ERRORS as exc:
        if b"\n" not in head:  # not one line can be read; otherwise the run reads up to the cut and says so
            raise InputError(f"cannot read {path} as {kind}: {exc}") from exc
    first = head.split(b"\n", 1)[0]
    if b"\x00" in first:
        raise InputError(f"{path} is binary (NUL bytes on its first line), not JSONL text")
    return kind


def hash_prefix(path: Path, size: int) -> Any:
    """A hashlib.sha256 of the first `size` bytes of the (decompressed) input; ValueError when it is shorter."""
    h = hashlib.sha256()
    with open_stream(path, compression(path)) as f:
        while size > 0:
            block = f.read(min(SKIP_BLOCK, size))
            if not block:
                raise ValueError(f"{path} is shorter than recorded")
            h.update(block)
            size -= len(block)
    return h


class InputFile:
    """One prompts file: streams from an offset, lines at offsets, and how far a stream has come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kind = compression(path)
        self.size = max(path.stat().st_size, 1)
        self._reader: BinaryIO | None = None  # for line_at
        self._at = 0  # the position of _reader, in the decompressed stream

    def open_at(self, offset: int) -> BinaryIO:
        """A stream positioned at decompressed byte `offset`."""
        f = open_stream(self.path, self.kind)
        if self.kind is None:
            f.seek(offset)
        else:
            skip(f, offset)
        return f

    def line_at(self, offset: int) -> bytes:
        """The line that starts at `offset`, without its line end (or a UTF-8 BOM on line 1)."""
        if self._reader is None or (self.kind is not None and offset < self._at):
            self.close()
            self._reader, self._at = open_stream(self.path, self.kind), 0
        if self.kind is None:
            self._reader.seek(offset)
        else:
            skip(self._reader, offset - self._at)
        line = self._reader.readline()
        self._at = offset + len(line)
        return strip_bom(line, offset).rstrip(b"\r\n")

    def fraction(self, stream: BinaryIO, bytes_read: int) -> float:
        """How much of the file a stream has read (for progress): by compressed bytes when compressed."""
        if self.kind is None:
            return bytes_read / self.size
        under = getattr(stream, "fileobj", None)  # gzip's and ours; Python's own zstd keeps it private
        try:
            return min(1.0, under.tell() / self.size) if under is not None else 0.0
        except (OSError, ValueError):
            return 1.0  # closed: read to the end

    def close(self) -> None:
        """Close the random-access reader, if one was opened."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def strip_bom(raw: bytes, offset: int) -> bytes:
    """A line without the UTF-8 byte order mark some editors put at the start of a file."""
    return raw[len(UTF8_BOM) :] if offset == 0 and raw.startswith(UTF8_BOM) else raw
