"""Input that is not plain JSONL: a BOM, gzip and zstd by content, binary files, all-bad files, huge lines."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import random
from pathlib import Path

import orjson
import pytest
from e2e import check_invariant, prompts, read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.config import RunConfig
from gen_pipeline.engine.reader import BatchReader
from gen_pipeline.errors import InputError
from gen_pipeline.inputs import source
from gen_pipeline.inputs.rows import BadRow
from gen_pipeline.inputs.source import PromptSource
from gen_pipeline.progress.stats import RunStats
from gen_pipeline.records import Prompt
from gen_pipeline.resume import cursor
from gen_pipeline.resume.settled import ResumeState
from gen_pipeline.rundir.layout import RunDir
from gen_pipeline.tokens import TINY_TOKENIZER, load_counter
from gen_pipeline.tokens.budget import prompt_budget

# read where used, so that each test (not the whole file) fails on code without them
ALL_BAD_LIMIT = getattr(source, "ALL_BAD_LIMIT", 1000)
HAVE_ZSTD = importlib.util.find_spec("zstandard") is not None or importlib.util.find_spec("compression") is not None


def lines_of(rows: list[object]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in rows)


def test_a_utf8_bom_on_line_1_is_accepted(tmp_path):
    """An editor's byte order mark does not make the first row bad; a later repeat of it is still a repeat."""
    path = tmp_path / "bom.jsonl"
    first = orjson.dumps({"id": "a", "prompt": "hi"})
    path.write_bytes(
        b"\xef\xbb\xbf" + first + b"\n" + lines_of([{"id": "b", "prompt": "yo"}, {"prompt": "hi", "id": "a"}])
    )
    src = PromptSource(path)
    items = list(src)
    assert [(type(x).__name__, x.id) for x in items] == [("Prompt", "a"), ("Prompt", "b")]
    assert src.repeats == 1 and src.bytes_read == path.stat().st_size


@pytest.mark.parametrize("name", ["prompts.jsonl.gz", "prompts.jsonl"])  # told by content, not by name
def test_gzip_input_is_read_transparently(tmp_path, name):
    """A gzip file (even one named .jsonl) yields the rows of the text inside; offsets are decompressed."""
    rows = [*prompts(30), b"{broken", prompts(1)[0]]
    path = tmp_path / name
    path.write_bytes(gzip.compress(lines_of(rows)))
    src = PromptSource(path)
    items = list(src)
    assert sum(isinstance(x, Prompt) for x in items) == 30 and sum(isinstance(x, BadRow) for x in items) == 1
    assert src.repeats == 1 and src.bytes_read == len(lines_of(rows))
    assert src.hasher.hexdigest() == hashlib.sha256(lines_of(rows)).hexdigest()


def test_plain_text_named_gz_is_read_as_text(tmp_path):
    """The name does not decide: a plain JSONL file called .gz is read as it is."""
    from gen_pipeline.inputs.file import check_text as check_input

    path = tmp_path / "odd.jsonl.gz"
    path.write_bytes(lines_of(prompts(3)))
    assert check_input(path) is None and len(list(PromptSource(path))) == 3


def test_repeats_in_gzip_input_are_checked_against_their_first_row(tmp_path):
    """Repeats and conflicts whose first row lies behind (a backward reopen) or ahead are told apart."""
    rng = random.Random(3)
    rows: list[object] = [{"id": f"r{i}", "prompt": f"text {i}"} for i in range(40)]
    for i in rng.sample(range(40), 40):
        rows.append({"id": f"r{i}", "prompt": f"text {i}"} if i % 3 else {"id": f"r{i}", "prompt": "changed"})
    plain, packed = tmp_path / "p.jsonl", tmp_path / "p.jsonl.gz"
    plain.write_bytes(lines_of(rows))
    packed.write_bytes(gzip.compress(lines_of(rows)))
    a, b = PromptSource(plain), PromptSource(packed)
    assert [(type(x).__name__, x.line) for x in a] == [(type(x).__name__, x.line) for x in b]
    assert a.repeats == b.repeats > 0


def test_compressed_input_resumes_from_its_cursor(write_jsonl, tmp_path):
    """A gzip input: a finished run leaves a cursor in the decompressed stream; rows appended as a second
    gzip member are all that the next run reads, and a repeat of an early row is still dropped."""
    rows = prompts(60)
    path, out = tmp_path / "prompts.jsonl.gz", tmp_path / "out"
    path.write_bytes(gzip.compress(lines_of(rows)))
    first, _ = run_sim(path, out)
    assert first.exit_code == 0 and first.summary["completed"] == 60
    assert cursor.cursor_path(out, path).exists()
    more = [*prompts(10, start=60), rows[3]]
    with path.open("ab") as f:
        f.write(gzip.compress(lines_of(more)))
    second, fleet = run_sim(path, out)
    assert second.summary["input_cursor"]["line"] == 60
    assert second.summary["completed"] == 10 and second.summary["skipped"] == {"done": 60}
    assert second.summary["repeats_dropped"] == 1
    assert sum(s.requests for s in fleet.stats.values()) == 10
    check_invariant([r["id"] for r in [*rows, *more]], out)
    assert len(read_jsonl(out / "completions.jsonl")) == 70


@pytest.mark.skipif(not HAVE_ZSTD, reason="neither the zstandard package nor Python 3.14's compression.zstd")
def test_zstd_input_is_read_transparently(tmp_path):
    """A zstd file yields the rows of the text inside."""
    from gen_pipeline.inputs.file import check_text as check_input

    try:
        import zstandard

        packed = zstandard.ZstdCompressor().compress(lines_of(prompts(5)))
    except ImportError:
        from compression import zstd  # type: ignore[import-not-found]

        packed = zstd.compress(lines_of(prompts(5)))
    path = tmp_path / "p.jsonl.zst"
    path.write_bytes(packed)
    assert check_input(path) == "zstd" and len(list(PromptSource(path))) == 5


@pytest.mark.skipif(HAVE_ZSTD, reason="a zstd reader is installed")
def test_zstd_input_without_a_reader_is_one_clear_error(tmp_path):
    """Without a zstd reader the message says how to get one, or to decompress first."""
    from gen_pipeline.inputs.file import check_text as check_input

    path = tmp_path / "p.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    with pytest.raises(InputError, match="zstandard package"):
        check_input(path)


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (b"PK\x03\x04\x14\x00", "zip archive"),
        (b"PAR1\x15\x04", "Parquet"),
        (b"BZh91AY&SY", "bzip2"),
        (b'\xff\xfe{\x00"\x00', "UTF-16"),
        (b"\x00\x01\x02binary\n{}", "binary"),
    ],
)
def test_other_binary_input_is_refused_in_one_line(tmp_path, capsys, head, says):
    """generate refuses a binary file before anything starts: exit 1 and one line naming what it is."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(head + b"\x00" * 64)
    code = main(["generate", "-i", str(path), "-o", str(tmp_path / "o"), "-s", "127.0.0.1:1", "--startup-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and says in err[0] and str(path) in err[0]
    assert not (tmp_path / "o").exists()


def test_an_input_whose_first_rows_are_all_bad_stops_the_run(tmp_path):
    """ALL_BAD_LIMIT bad rows and no good one: an error, and nothing ledgered (not a million bad_input)."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"".join(b"col_a,col_b,%d\n" % i for i in range(ALL_BAD_LIMIT * 3)))
    with pytest.raises(InputError, match=f"first {ALL_BAD_LIMIT} rows .* are all invalid"):
        run_sim(path, tmp_path / "out", {"n_ports": 1})
    assert read_jsonl(tmp_path / "out" / "failures.jsonl") == []


def test_bad_rows_after_a_good_one_are_ledgered_as_before(tmp_path):
    """One valid row first: every bad row after it is a ledger entry, however many there are."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(lines_of([prompts(1)[0], *[b"nope"] * (ALL_BAD_LIMIT + 5)]))
    items = list(PromptSource(path))
    assert sum(isinstance(x, BadRow) for x in items) == ALL_BAD_LIMIT + 5


def test_a_line_over_the_size_limit_is_bad_input_read_in_blocks(tmp_path, monkeypatch):
    """A line longer than MAX_LINE_BYTES is one bad row; the rows after it, the offsets and the hash are
    as if it had been read whole."""
    monkeypatch.setattr(source, "MAX_LINE_BYTES", 1000)
    huge = orjson.dumps({"id": "big", "prompt": "x" * 5000})
    data = lines_of([prompts(1)[0], huge, prompts(2)[1]])
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    src = PromptSource(path)
    items = list(src)
    assert [type(x).__name__ for x in items] == ["Prompt", "BadRow", "Prompt"]
    assert items[1].line == 2 and f"{len(huge) + 1} bytes" in items[1].detail and items[2].line == 3
    assert src.bytes_read == len(data) and src.hasher.hexdigest() == hashlib.sha256(data).hexdigest()


class Recording:
    """The real tiny-tokenizer counter, remembering the longest prompt it was asked to count."""

    def __init__(self) -> None:
        self.inner = load_counter(str(TINY_TOKENIZER))
        self.tokenizer, self.template = self.inner.tokenizer, self.inner.template  # type: ignore[attr-defined]
        self.name, self.chat_template = self.inner.name, self.inner.chat_template
        self.longest = 0

    def count(self, conversations):
        self.longest = max([self.longest, *(len(c[0]["content"]) for c in conversations)])
        return self.inner.count(conversations)


def test_a_row_too_long_for_any_count_is_over_length_without_tokenizing(tmp_path):
    """A 2 MB row against an 8k context: its size proves it over_length; the tokenizer never sees it."""
    big = {"id": "big", "prompt": "lorem ipsum " * 200_000}
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(lines_of([prompts(1)[0], big]))
    counter = Recording()
    config = RunConfig(input=path, out=tmp_path / "o")
    batch, _ = BatchReader(config, counter, ResumeState(), RunStats(), context_length=8192).next_batch()
    row = next(x for x in batch if isinstance(x, Prompt) and x.id == "big")
    assert row.at_least and row.input_tokens > 8192 and prompt_budget(config, 8192, row.input_tokens, None) is None
    assert counter.longest < 1000  # only the short row was counted


def test_the_over_length_row_is_ledgered_with_its_floor(tmp_path):
    """End to end: the long row is in the ledger as over_length, "at least N tokens", and never sent."""
    big = {"id": "big", "prompt": "lorem ipsum " * 100_000}
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(lines_of([*prompts(5), big]))
    outcome, fleet = run_sim(path, tmp_path / "out", {"n_ports": 1, "context_length": 4096})
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {"over_length": 1}
    [entry] = read_jsonl(tmp_path / "out" / "failures.jsonl")
    assert entry["id"] == "big" and "at least" in entry["detail"] and "not counted" in entry["detail"]
    assert sum(s.requests for s in fleet.stats.values()) == 5


TEXTS = ["a", " ", "  ", "\n", "-" * 50, " " * 200, "é", "e\u0301", "\u1100\u1161\u11a8", "你好", "<|im_start|>", "😀"]


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_the_size_floor_never_exceeds_the_count(which, qwen3_counter):
    """ceil(bytes / longest token) is at most the real count, on texts made to be hard for it (runs of
    spaces and dashes, decomposed accents and Hangul jamo that NFC shortens, special-token text)."""
    from gen_pipeline.tokens.oversize import SizeFloor

    counter = load_counter(str(TINY_TOKENIZER)) if which == "tiny" else load_counter(str(Path(qwen3_counter.name)))
    floor = SizeFloor(counter)
    assert floor.longest is not None
    rng = random.Random(7)
    for _ in range(30):
        messages = [{"role": "user", "content": "".join(rng.choice(TEXTS) for _ in range(rng.randint(500, 4000)))}]
        bound = floor.tokens_over(messages, 0)
        assert bound is not None and bound <= counter.count([messages])[0]


def test_status_counts_a_compressed_inputs_rows_not_its_bytes_newlines(tmp_path):
    """`status` and the claimers' ETA total read the input's lines decompressed (a gzip stream's own bytes
    hold newlines too); a truncated stream leaves the total out instead of failing status."""
    from gen_pipeline.inputs.file import input_lines
    from gen_pipeline.views.status import file_counts

    text = lines_of(prompts(500))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(text, mtime=0))
    assert gzip.compress(text, mtime=0).count(b"\n") != 500  # the miscount this guards against is possible
    assert input_lines(path) == 500
    run = tmp_path / "run"
    run.mkdir()
    assert file_counts(run, {"input": str(path)}).endswith("; the input has 500 lines")
    path.write_bytes(gzip.compress(text)[:-40])
    assert input_lines(path) is None and "input has" not in file_counts(run, {"input": str(path)})


def test_a_corrupt_gzip_input_is_refused_in_one_line(tmp_path, capsys):
    """A gzip file whose blocks are corrupt (zlib's error, not an EOF or an OSError) is one clear error from
    generate, not a traceback; status leaves its total out."""
    from gen_pipeline.inputs.file import input_lines

    data = bytearray(gzip.compress(lines_of(prompts(200)), mtime=0))
    for i in range(30, len(data) - 30):
        data[i] ^= 0x55
    path = tmp_path / "prompts.jsonl.gz"
    path.write_bytes(bytes(data))
    code = main(["generate", "-i", str(path), "-o", str(tmp_path / "o"), "-s", "127.0.0.1:1", "--startup-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "cannot read" in err[0] and str(path) in err[0], err
    assert input_lines(path) is None


@pytest.mark.parametrize("run", [{}, {"shards": 4}], ids=["one process", "claimed shards"])
@pytest.mark.parametrize(("n", "words"), [(40, 5), (300, 100)], ids=["cut in the first 64 KiB", "cut further on"])
def test_a_truncated_gzip_input_settles_every_readable_row_then_stops(tmp_path, n, words, run):
    """A gzip input cut mid-stream: every row before the cut is settled, then the run stops with the reason
    (exit 1); a rerun sends nothing again and stops the same way (it made no progress before: 201 rows lost)."""
    rows = prompts(n, words=words)
    packed = gzip.compress(lines_of(rows), mtime=0)
    path, out = tmp_path / "prompts.jsonl.gz", tmp_path / "out"
    path.write_bytes(packed[: len(packed) * 2 // 3])
    readable: list[int] = []
    with contextlib.suppress(EOFError), gzip.open(path) as f:
        for line in f:  # the lines gzip itself can read before the cut
            readable.append(orjson.loads(line)["id"])
    assert 0 < len(readable) < n
    for again in (False, True):
        outcome, fleet = run_sim(path, out, **run)
        assert outcome.exit_code == 1 and "cannot read" in (outcome.error or ""), outcome.summary
        assert any("cannot read" in w for w in outcome.summary["warnings"])
        assert outcome.summary["completed"] == (0 if again else len(readable))
        assert sum(s.requests for s in fleet.stats.values()) == (0 if again else len(readable))
    written = [r["id"] for p in RunDir(out).completion_files() for r in read_jsonl(p)]
    assert sorted(written) == readable


def test_an_unfinished_last_line_is_left_for_the_next_run(tmp_path):
    """A last line without its newline that is not whole JSON yet (a producer still writing) is neither
    yielded nor counted as read; one that is whole JSON is yielded, but not counted as read either."""
    rows = lines_of(prompts(3))
    path = tmp_path / "p.jsonl"
    path.write_bytes(rows + b'{"id": 3, "prompt": "half')
    src = PromptSource(path)
    assert [p.id for p in src] == [0, 1, 2]
    assert (src.unfinished, src.lines, src.bytes_read) == (4, 3, len(rows))
    path.write_bytes(rows + b'{"id": 3, "prompt": "whole"}')
    src = PromptSource(path)
    assert [(p.id, p.line) for p in src] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert (src.unfinished, src.lines, src.bytes_read) == (None, 3, len(rows))


def test_rows_appended_in_pieces_all_end_in_the_output(tmp_path):
    """Rows appended in writes that end mid-line, a run after each: nothing is ledgered (a half line was
    bad_input for good, and its second half bad_input again on a line number off by one: rows lost), each
    run with a half line left says so and exits 3, and every row ends in the output once."""
    rows = prompts(90)
    data = lines_of(rows)
    path, out = tmp_path / "p.jsonl", tmp_path / "out"
    cuts = [len(data) // 3 + 7, 2 * len(data) // 3 + 11, len(data)]
    path.write_bytes(data[: cuts[0]])
    for cut in cuts[1:]:
        outcome, _ = run_sim(path, out)
        assert outcome.exit_code == 3 and "no newline" in " ".join(outcome.summary["warnings"])
        with path.open("ab") as f:
            f.write(data[path.stat().st_size : cut])
    last, _ = run_sim(path, out)
    assert last.exit_code == 0 and not read_jsonl(out / "failures.jsonl")
    assert check_invariant([r["id"] for r in rows], out) == {"done": 90, "ledger": 0}
    assert len(read_jsonl(out / "completions.jsonl")) == 90


def test_a_whole_last_row_without_newline_is_done_once(tmp_path):
    """A last row that is whole JSON but has no newline yet is sent; once its newline comes, the next run
    reads it again as done (the cursor stayed before it) and the line numbers after it stay right."""
    path, out = tmp_path / "p.jsonl", tmp_path / "out"
    path.write_bytes(lines_of(prompts(5)).rstrip(b"\n"))
    first, _ = run_sim(path, out)
    assert first.exit_code == 0 and first.summary["completed"] == 5
    with path.open("ab") as f:
        f.write(b"\n" + lines_of([*prompts(2, start=5), b"{broken"]))
    second, fleet = run_sim(path, out)
    assert second.summary["completed"] == 2 and sum(s.requests for s in fleet.stats.values()) == 2
    assert [(e["line"], e["reason"]) for e in read_jsonl(out / "failures.jsonl")] == [(8, "bad_input")]
    assert check_invariant(list(range(7)), out) == {"done": 7, "ledger": 0}
