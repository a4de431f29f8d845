"""Tests of `export`: a run directory read back as a `datasets` training dataset."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import datasets
import orjson
import pyarrow.parquet as pq
import pytest

from gen_pipeline.cli import export as cli_export
from gen_pipeline.errors import ConfigError
from gen_pipeline.export.exportconfig import DEFAULT_COLUMNS
from gen_pipeline.export.trainrow import REQUEST_COLUMNS
from gen_pipeline.records import Completion, Failure
from gen_pipeline.resume.ledger import ledger_reasons
from gen_pipeline.views import status

MANIFEST = {
    "model": "sim-model",
    "tokenizer": "tiny-tokenizer",
    "context_length": 8192,
    "sampling": {"temperature": 0.7},
    "max_tokens": 256,
    "safety_margin": 16,
}


def completion(i: int, finish: str = "stop", meta: dict[str, Any] | None = None) -> bytes:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Q{i}"}]
    c = Completion(i, messages, f"A{i}", finish, 9, 9, 3, 256, "s0", 1, 0.2, "sim-model", meta or {})
    return c.to_line()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run with a worker shard, a repeated id, a truncated row, a ledger and a torn last line."""
    run = tmp_path / "run"
    run.mkdir()
    meta = {"source_id": 100, "label": {"a": 1}}
    main = [completion(0, meta=meta), completion(1, "length")]
    (run / "completions.jsonl").write_bytes(b"".join(main) + b'{"id": 9, "messa')
    shard = [completion(2), completion(0, meta=meta)]  # id 0 again: exported once
    (run / "completions-00001.jsonl").write_bytes(b"".join(shard))
    ledger = [Failure(5, 6, "timeout", "t").to_line(), Failure(6, 7, "over_length", "o").to_line()]
    (run / "failures.jsonl").write_bytes(b"".join(ledger))
    (run / "manifest.json").write_bytes(orjson.dumps(MANIFEST))
    return run


def run_export(*argv: Any) -> int:
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    return cli_export.main(parser.parse_args([str(a) for a in argv]))


def read_parquet(out: Path, tmp_path: Path) -> datasets.Dataset:
    files = sorted(str(p) for p in (out / "data").glob("*.parquet"))
    return datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "hf-cache"))


def test_round_trip_through_parquet(run_dir, tmp_path):
    """Each completion becomes one row: prompt turns plus the assistant turn, default columns."""
    out = tmp_path / "ds"
    assert run_export(run_dir, "--out", out) == 0
    ds = read_parquet(out, tmp_path)
    assert ds.column_names == ["messages", *REQUEST_COLUMNS, *DEFAULT_COLUMNS]
    assert sorted(ds["id"]) == ["0", "1", "2"]
    row = next(r for r in ds if r["id"] == "0")
    assert [{k: v for k, v in m.items() if v is not None} for m in row["messages"]] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q0"},
        {"role": "assistant", "content": "A0"},
    ]
    assert (row["finish_reason"], row["prompt_tokens"], row["model"]) == ("stop", 9, "sim-model")


def test_drop_truncated_and_the_dataset_card(run_dir, tmp_path):
    """--drop-truncated leaves out "length" rows; the card counts them and shows the settings."""
    out = tmp_path / "ds"
    run_export(run_dir, "--out", out, "--drop-truncated")
    assert sorted(read_parquet(out, tmp_path)["id"]) == ["0", "2"]
    card = (out / "README.md").read_text()
    for line in [
        "| rows | 2 |",
        "| left out: truncated (finish_reason length) | 1 |",
        "| left out: duplicate (id, sample) | 1 |",
        "| left out: unreadable lines | 1 |",
        "| not generated: timeout (ledger) | 1 |",
        "| not generated: over_length (ledger) | 1 |",
        "| context_length | `8192` |",
        '| sampling | `{"temperature":0.7}` |',
        "    path: data/train-*.parquet",
    ]:
        assert line in card


def test_the_card_counts_the_ledger_as_status_and_report_do(run_dir, tmp_path):
    """The card's "not generated" counts are the ledger's, as `status`/`report` count it: a bad row without
    an id counts; an entry for a row that has a completion (written later, or kept out as truncated) does not."""
    extra = [
        Failure(None, 3, "bad_input", "invalid JSON").to_line(),  # no id: the card left it out
        Failure(None, 4, "bad_input", "invalid JSON").to_line(),
        Failure(1, 2, "timeout", "t", time=1.0).to_line(),  # id 1 completed later ("length", dropped below)
        Failure(2, 3, "bad_input", "id 2 was seen before with different content").to_line(),  # an old version's
    ]
    with (run_dir / "failures.jsonl").open("ab") as f:
        f.write(b"".join(extra))
    out = tmp_path / "ds"
    assert run_export(run_dir, "--out", out, "--drop-truncated") == 0
    card = (out / "README.md").read_text()
    said = {
        line.split(": ", 1)[1].split(" (ledger)")[0]: int(line.rsplit("|", 2)[1])
        for line in card.splitlines()
        if line.startswith("| not generated: ")
    }
    assert said == {"bad_input": 2, "timeout": 1, "over_length": 1}
    assert said == ledger_reasons([run_dir])
    assert f"ledger {said}" in status.file_counts(run_dir, None)


def test_save_to_disk_with_meta_columns(run_dir, tmp_path):
    """--save-to-disk writes a load_from_disk folder; --columns adds meta.KEY columns (strings) to the default
    ones (they replaced them, and the dataset lost its ids)."""
    out = tmp_path / "ds"
    run_export(run_dir, "--out", out, "--save-to-disk", "--columns", "meta.source_id,meta.label")
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == ["messages", *REQUEST_COLUMNS, *DEFAULT_COLUMNS, "meta.source_id", "meta.label"]
    row = next(r for r in ds if r["id"] == "0")
    assert (row["meta.source_id"], row["meta.label"]) == ("100", '{"a":1}')
    assert next(r for r in ds if r["id"] == "2")["meta.source_id"] is None
    assert (out / "README.md").exists()
    assert "meta.source_id, meta.label" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        ("meta.source_id", [*DEFAULT_COLUMNS, "meta.source_id"]),
        ("finish_reason,latency_s", [*DEFAULT_COLUMNS, "latency_s"]),  # a default named again: once, in place
        ("", list(DEFAULT_COLUMNS)),
    ],
)
def test_columns_add_to_the_default_columns(run_dir, tmp_path, columns, expected):
    """--columns names columns besides the default ones; every default stays, `id` first among them."""
    out = tmp_path / "ds"
    run_export(run_dir, "--out", out, "--columns", columns)
    assert read_parquet(out, tmp_path).column_names == ["messages", *REQUEST_COLUMNS, *expected]


def test_the_old_answer_a_row_ended_with_is_a_column(write_jsonl, tmp_path):
    """--columns reference: the answer a row ended with, kept on its line by generate and not sent."""
    from e2e import run_sim

    rows = [{"id": "a", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "old"}]}]
    run_sim(write_jsonl(rows), tmp_path / "run", sim={"n_ports": 1}, max_tokens=16)
    run_export(tmp_path / "run", "--out", tmp_path / "ds", "--columns", "reference")
    [row] = read_parquet(tmp_path / "ds", tmp_path).to_list()
    assert row["reference"] == "old" and [m["role"] for m in row["messages"]] == ["user", "assistant"]


def test_id_is_always_kept(run_dir, tmp_path):
    """A configuration that leaves `id` out of its columns still exports each row's id."""
    from gen_pipeline.export.export import ExportConfig, export

    export(ExportConfig(runs=(run_dir,), out=tmp_path / "ds", columns=("sample", "finish_reason")))
    ds = read_parquet(tmp_path / "ds", tmp_path)
    assert ds.column_names == ["messages", *REQUEST_COLUMNS, "id", "sample", "finish_reason"]
    assert sorted(ds["id"]) == ["0", "1", "2"]


def test_shards_hold_every_row_once(run_dir, tmp_path):
    """--shard-rows splits the Parquet output; together the shards hold each row once."""
    out = tmp_path / "ds"
    run_export(run_dir, "--out", out, "--shard-rows", "2")
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    assert sorted(read_parquet(out, tmp_path)["id"]) == ["0", "1", "2"]


def test_an_empty_run_exports_an_empty_dataset(tmp_path):
    """A run with no completions yet gives a dataset with the right columns and no rows."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "completions.jsonl").touch()
    run_export(run, "--out", tmp_path / "ds")
    # datasets cannot load a split with no rows, so read the file with pyarrow
    table = pq.read_table(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")
    assert (table.num_rows, table.column_names) == (0, ["messages", *REQUEST_COLUMNS, *DEFAULT_COLUMNS])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--columns", "id,colour"], "unknown --columns"),
        (["--shard-rows", "0"], "--shard-rows"),
    ],
)
def test_bad_flags_are_config_errors(run_dir, tmp_path, argv, message):
    """Unknown columns and bad shard sizes are refused before anything is written."""
    with pytest.raises(ConfigError, match=message):
        run_export(run_dir, "--out", tmp_path / "ds", *argv)
    assert not (tmp_path / "ds").exists()


def test_existing_output_needs_overwrite(run_dir, tmp_path):
    """An existing dataset is replaced only with --overwrite; a folder without output is refused."""
    out = tmp_path / "ds"
    run_export(run_dir, "--out", out)
    with pytest.raises(ConfigError, match="--overwrite"):
        run_export(run_dir, "--out", out, "--drop-truncated")
    run_export(run_dir, "--out", out, "--drop-truncated", "--overwrite")
    assert len(read_parquet(out, tmp_path)) == 2
    with pytest.raises(ConfigError, match="not a run directory"):
        run_export(tmp_path, "--out", tmp_path / "other")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export-")] == []


def _colliding_runs(write_jsonl: Any, tmp_path: Path, turns: str) -> tuple[Path, Path, int]:
    """Two runs of two prompt files whose ids are the same (0..N-1, c0..cN-1) and whose prompts differ."""
    from e2e import conversation_rows, prompts, run_sim

    first = prompts(8) if turns == "last" else conversation_rows(6)
    second = [{**r, "messages": [{**m, "content": f"other {m['content']}"} for m in r["messages"]]} for r in first]
    for rows, name in ((first, "a"), (second, "b")):
        run_sim(write_jsonl(rows, f"{name}.jsonl"), tmp_path / name, sim={"n_ports": 2}, turns=turns, samples=2)
    return tmp_path / "a", tmp_path / "b", 2 * len(first)


@pytest.mark.parametrize("turns", ["last", "all"])
def test_different_prompts_under_one_id_are_not_duplicates(write_jsonl, tmp_path, turns):
    """Two runs whose ids collide but whose prompts differ: export refuses and names the ids (it wrote one run's
    rows and called the other's "duplicates"); --keep-colliding-ids keeps both; the same prompts twice are
    still duplicates, exported once."""
    from gen_pipeline.errors import ExportCheckError

    a, b, n = _colliding_runs(write_jsonl, tmp_path, turns)
    with pytest.raises(ExportCheckError, match=r"different prompts.*id (0|'c0') sample 0.*--keep-colliding-ids"):
        run_export(a, b, "--out", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    assert run_export(a, b, "--out", tmp_path / "both", "--keep-colliding-ids") == 0
    both = read_parquet(tmp_path / "both", tmp_path)
    asked = {str([t["content"] for t in m if t["role"] != "assistant"]) for m in both["messages"]}
    assert len(both) == 2 * n and len(asked) == n  # every prompt of both runs, each with its 2 samples
    assert run_export(a, a, "--out", tmp_path / "same") == 0
    assert len(read_parquet(tmp_path / "same", tmp_path)) == n


def test_a_killed_export_leaves_nothing_the_next_one_keeps(run_dir, tmp_path):
    """An export killed (-9) mid-way left its .export-* folder beside --out; the next export removes it, and
    leaves one an export still running holds."""
    import subprocess
    import sys

    from gen_pipeline.export.export import staging

    code = "import sys, time; from pathlib import Path; from gen_pipeline.export.export import staging\n"
    code += "held = staging(Path(sys.argv[1])); held.__enter__(); print('ready', flush=True); time.sleep(60)"
    killed = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "ds")], stdout=subprocess.PIPE, text=True)
    assert killed.stdout is not None and killed.stdout.readline() == "ready\n"
    killed.kill()
    killed.wait(10)
    killed.stdout.close()
    [left] = tmp_path.glob(".export-*")
    with staging(tmp_path / "other") as running:
        assert run_export(run_dir, "--out", tmp_path / "ds") == 0
        assert running.exists() and not left.exists()
    assert list(tmp_path.glob(".export-*")) == []
