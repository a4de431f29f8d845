"""generate reads what prepare reads (issue 53): ShareGPT, Alpaca and text rows, a JSON array, CSV, Parquet, Arrow,
a save_to_disk folder and a dataset by name, as a stream; resume, the input cursor and claimed shards on them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e import check_invariant, read_jsonl, run_sim

from gen_pipeline.cli import main
from gen_pipeline.errors import InputError
from gen_pipeline.inputs import tables
from gen_pipeline.inputs.kinds import check_input, input_rows
from gen_pipeline.inputs.source import PromptSource, Start
from gen_pipeline.records import Prompt, content_id
from gen_pipeline.rundir.layout import RunDir


def sharegpt(i: int) -> dict[str, Any]:
    return {
        "id": f"s{i}",
        "conversations": [
            {"from": "human", "value": f"question {i}"},
            {"from": "gpt", "value": f"OLD answer {i}"},
        ],
        "source": "dump",
    }


def rows(n: int) -> list[dict[str, Any]]:
    """`n` chat rows with ids and one extra column."""
    return [
        {"id": i, "messages": [{"role": "user", "content": f"Q{i}: tell me " * (1 + i % 5)}], "src": "p"}
        for i in range(n)
    ]


def answered(out: Path) -> dict[Any, dict[str, Any]]:
    return {r["id"]: r for p in RunDir(out).completion_files() for r in read_jsonl(p)}


def test_sharegpt_alpaca_and_text_rows_are_read_as_conversations(write_jsonl, tmp_path):
    """A ShareGPT file (from/value, and role/content under "conversations"), Alpaca rows and text rows go straight to
    generate: each is its conversation, the old answer kept as `reference`, the rest of its columns in meta; a row
    without an id gets the content id of its conversation."""
    rows_in = [
        sharegpt(0),
        {"id": "s1", "conversations": [{"role": "user", "content": "role/content turns"}]},
        {"id": "a0", "instruction": "Translate", "input": "bonjour", "output": "hello"},
        {"instruction": "Say hi"},
        {"id": "t0", "text": "a plain text row"},
    ]
    path, out = write_jsonl(rows_in), tmp_path / "out"
    outcome, _ = run_sim(path, out)
    done = answered(out)
    assert outcome.exit_code == 0 and outcome.summary["failed"] == {}
    assert done["s0"]["messages"] == [{"role": "user", "content": "question 0"}]
    assert done["s0"]["reference"] == "OLD answer 0" and done["s0"]["meta"] == {"source": "dump"}
    assert done["s1"]["messages"] == [{"role": "user", "content": "role/content turns"}]
    assert done["a0"]["messages"] == [{"role": "user", "content": "Translate\n\nbonjour"}]
    assert done["a0"]["reference"] == "hello"
    assert done[content_id([{"role": "user", "content": "Say hi"}])]["meta"] == {}
    assert done["t0"]["messages"] == [{"role": "user", "content": "a plain text row"}]
    assert outcome.summary["reshaped"] == {"answered_from_last_user_turn": 2}


def test_a_row_in_no_format_names_its_columns_and_the_template_flag(write_jsonl, tmp_path):
    """A row generate cannot read says which columns it has and what would read it."""
    path, out = write_jsonl([{"id": 1, "question": "q", "context": "c"}]), tmp_path / "out"
    run_sim(path, out)
    [entry] = read_jsonl(out / "failures.jsonl")
    assert "its columns: context, id, question" in entry["detail"] and "--template" in entry["detail"]


def _parquet(path: Path, data: list[dict[str, Any]], group: int = 50) -> Path:
    pq.write_table(pa.Table.from_pylist(data), path, row_group_size=group)
    return path


def _write_inputs(tmp_path: Path, data: list[dict[str, Any]]) -> dict[str, Path]:
    """The same rows as a JSON array (plain and gzip), Parquet, an Arrow file, CSV and a save_to_disk folder."""
    import datasets

    made = {"json": tmp_path / "rows.json", "json.gz": tmp_path / "rows.json.gz"}
    made["json"].write_text(json.dumps(data, indent=1))
    made["json.gz"].write_bytes(gzip.compress(json.dumps(data).encode()))
    made["parquet"] = _parquet(tmp_path / "rows.parquet", data, group=7)
    table = pa.Table.from_pylist(data)
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    made["arrow"] = tmp_path / "rows.arrow"
    csv_lines = ["id,prompt,src"] + [f'{r["id"]},"{r["messages"][0]["content"]}",{r["src"]}' for r in data]
    made["csv"] = tmp_path / "rows.csv"
    made["csv"].write_text("\n".join(csv_lines) + "\n")
    datasets.Dataset.from_list(data).save_to_disk(str(tmp_path / "saved"))
    made["saved"] = tmp_path / "saved"
    return made


@pytest.mark.parametrize("kind", ["json", "json.gz", "parquet", "arrow", "csv", "saved"])
def test_every_kind_of_input_is_answered_once_with_its_ids(tmp_path, kind):
    """Each kind end to end: every row answered under its own id, its other columns in meta; a rerun sends nothing
    and reads nothing before its cursor."""
    data = rows(30)
    path = _write_inputs(tmp_path, data)[kind]
    out = tmp_path / "out"
    outcome, _ = run_sim(path, out)
    done = answered(out)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 30
    assert sorted(map(str, done)) == sorted(str(r["id"]) for r in data)
    assert all(r["prompt_tokens"] == r["input_tokens"] and r["meta"] == {"src": "p"} for r in done.values())
    again, _ = run_sim(path, out)
    assert again.summary["completed"] == 0 and again.summary["skipped"] == {"done": 30}
    assert again.summary["input_cursor"]["line"] == 30  # every row was behind the cursor: none was read


def test_a_hub_style_dataset_is_loaded_by_name_config_and_split(tmp_path, monkeypatch):
    """`name:config:split` goes through datasets.load_dataset (here a local repository of Parquet files with two
    configs, offline); `name` alone is its default config's train split."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    repo = tmp_path / "repo"
    for config, n in (("easy", 4), ("hard", 6)):
        (repo / config).mkdir(parents=True)
        _parquet(
            repo / config / "train-00000-of-00001.parquet",
            [{"id": f"{config}{i}", "prompt": f"{config} {i}"} for i in range(n)],
        )
    (repo / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: easy\n  data_files:\n  - split: train\n    path: easy/*.parquet\n  default: true\n"
        "- config_name: hard\n  data_files:\n  - split: train\n    path: hard/*.parquet\n---\n"
    )
    outcome, _ = run_sim(Path(f"{repo}:hard:train"), tmp_path / "hard")
    assert sorted(answered(tmp_path / "hard")) == [f"hard{i}" for i in range(6)] and outcome.exit_code == 0
    run_sim(repo, tmp_path / "easy")
    assert sorted(answered(tmp_path / "easy")) == [f"easy{i}" for i in range(4)]


def test_a_parquet_resume_skips_row_groups_by_their_counts(tmp_path, monkeypatch):
    """A pass started at a cursor's mark reads the row groups from the one holding its row on, and converts no row
    before the mark (the groups before are skipped by the metadata's row counts)."""
    path = _parquet(tmp_path / "big.parquet", rows(1000), group=100)
    read_groups: list[int] = []
    converted: list[int] = []
    real_iter = pq.ParquetFile.iter_batches
    real_line = tables.row_line

    def spy_iter(self, *args, **kwargs):
        read_groups.extend(kwargs["row_groups"])
        return real_iter(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy_iter)
    monkeypatch.setattr(tables, "row_line", lambda row: converted.append(row["id"]) or real_line(row))
    items = list(PromptSource(path, start=Start(offset=750, line=750)))
    assert [p.id for p in items if isinstance(p, Prompt)] == list(range(750, 1000))
    assert read_groups == list(range(7, 10)) and converted == list(range(750, 1000))
    assert items[0].line == 751


def test_an_edited_parquet_file_is_read_from_the_top(tmp_path):
    """The cursor vouches for a table by its size, time and metadata: another file under the name is read whole,
    and a new row in it is answered."""
    path, out = _parquet(tmp_path / "in.parquet", rows(40), group=10), tmp_path / "out"
    run_sim(path, out)
    _parquet(path, rows(41), group=10)
    again, _ = run_sim(path, out)
    assert again.summary["input_cursor"] is None and again.summary["completed"] == 1
    assert again.summary["skipped"] == {"done": 40}


def test_a_json_array_with_a_bad_element_ledgers_only_it(tmp_path):
    """One element that is not a row is one bad_input; a byte where a comma belongs stops the read there with the
    rows before it settled (exit 1, saying where)."""
    good = [orjson.dumps(r).decode() for r in rows(3)]
    path = tmp_path / "a.json"
    path.write_text(f"[{good[0]}, 17, {good[1]},\n {good[2]}]")
    outcome, _ = run_sim(path, tmp_path / "out")
    [bad] = read_jsonl(tmp_path / "out" / "failures.jsonl")
    assert bad["line"] == 2 and "not an object" in bad["detail"] and outcome.summary["completed"] == 3
    broken = tmp_path / "b.json"
    broken.write_text(f"[{good[0]}, {good[1]} {good[2]}]")
    cut, _ = run_sim(broken, tmp_path / "out2")
    assert cut.exit_code == 1 and cut.summary["completed"] == 2
    assert "after row 2" in (cut.summary.get("warnings") or [""])[-1]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b"PAR1" + b"\x00" * 40), "as Parquet"),
        (lambda p: p.mkdir(), "holds no saved dataset"),
        (lambda p: p.write_bytes(b"ARROW1\x00\x00garbage"), "as an Arrow file"),
    ],
)
def test_input_that_cannot_be_read_is_one_clear_line(tmp_path, capsys, make, says):
    """generate refuses, before anything starts, an input it cannot read: exit 1, one line naming it and why."""
    path = tmp_path / "input"
    make(path)
    code = main(["generate", "-i", str(path), "-o", str(tmp_path / "o"), "-s", "127.0.0.1:1", "--startup-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and says in err[0] and str(path) in err[0]
    assert not (tmp_path / "o").exists()


def test_check_input_tells_the_kinds_and_status_counts_table_rows(tmp_path):
    """check_input names each kind; status's input total is a table's row count."""
    made = _write_inputs(tmp_path, rows(12))
    kinds = {name: check_input(path) for name, path in made.items()}
    assert kinds == {
        "json": "json",
        "json.gz": "json",
        "parquet": "parquet",
        "arrow": "arrow",
        "csv": "csv",
        "saved": "dataset",
    }
    assert input_rows(made["parquet"]) == (12, "rows") and input_rows(made["json"]) is None
    with pytest.raises(InputError, match="input file not found"):
        check_input(tmp_path / "missing.parquet")


def test_claimed_shards_read_a_parquet_input(tmp_path):
    """Claimers over a Parquet input: every id once, every shard settled (its fingerprint is the table's)."""
    path, out = _parquet(tmp_path / "in.parquet", rows(120), group=16), tmp_path / "out"
    outcome, _ = run_sim(path, out, shards=8)
    assert outcome.exit_code == 0
    assert check_invariant(list(range(120)), out) == {"done": 120, "ledger": 0}
    assert all(RunDir(out).shard(s).settled.exists() for s in range(8))


def test_generate_help_says_what_input_takes(capsys):
    """`generate --help` names the kinds --input reads (it said "prompts JSONL")."""
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in (
        "JSONL",
        "JSON array",
        "ShareGPT",
        "Alpaca",
        "CSV",
        "Parquet",
        "save_to_disk",
        "name[:config][:split]",
    ):
        assert kind in text, kind
