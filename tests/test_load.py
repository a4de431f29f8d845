"""`gen_pipeline.load(run_dir)`: the run as a `datasets.Dataset`, the rows `export` writes, in three lines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
from e2e import conversation_rows, fleet_in_thread, prompts, read_jsonl, run_sim

import gen_pipeline
from gen_pipeline.cli import export as cli_export
from gen_pipeline.errors import ConfigError
from gen_pipeline.sim import SimConfig, free_ports


def run_export(*argv: Any) -> int:
    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    return cli_export.main(parser.parse_args([str(a) for a in argv]))


def parquet_rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [r for f in sorted((out / "data").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_prompts_to_a_dataset_in_three_lines(write_jsonl, tmp_path):
    """generate, then load: a Dataset holding the rows export writes for the same run, in the same order."""
    inp = write_jsonl(prompts(7))
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(2)), health_delay=0.0)) as servers:
        gen_pipeline.generate(inp, tmp_path / "run", servers=servers, max_tokens=32, progress="off")
        ds = gen_pipeline.load(tmp_path / "run")
    assert isinstance(ds, datasets.Dataset) and len(ds) == 7
    assert run_export(tmp_path / "run", "--out", tmp_path / "ds") == 0
    assert ds.to_list() == parquet_rows(tmp_path / "ds")
    assert "load" in gen_pipeline.__all__


def test_load_takes_exports_choices(write_jsonl, tmp_path):
    """columns add to the defaults (id always kept), the --drop-* choices and the trainer formats."""
    rows = [{**r, "src": f"s{r['id']}"} for r in prompts(6)]
    run_sim(write_jsonl(rows), tmp_path / "run", sim={"n_ports": 2}, max_tokens=12, min_tokens=1)
    lines = read_jsonl(tmp_path / "run" / "completions.jsonl")
    ds = gen_pipeline.load(tmp_path / "run", columns=["meta.src"], drop_truncated=True)
    assert len(ds) == sum(x["finish_reason"] != "length" for x in lines) > 0
    assert ds.column_names[-2:] == ["checkpoint", "meta.src"] and "id" in ds.column_names
    assert all(r["meta.src"] == f"s{r['id']}" for r in ds)
    as_flag = gen_pipeline.load(tmp_path / "run", columns="meta.src", drop_truncated=True)  # the flag's text
    assert as_flag.to_list() == ds.to_list()  # "unknown --columns ['m', 'e', 't', 'a', ...]" before
    conv = gen_pipeline.load(tmp_path / "run", format="conversations")
    assert conv.column_names == ["id", "conversations", "tools"] and len(conv) == 6
    with pytest.raises(ConfigError, match="format"):
        gen_pipeline.load(tmp_path / "run", format="openai-batch")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rejected": True}, "export --rejected"),  # silently gave the accepted rows before
        ({"save_to_disk": True}, "save_to_disk= is export's"),
        ({"drop_truncatd": True}, "unknown option drop_truncatd=; did you mean drop_truncated="),  # a TypeError
    ],
)
def test_load_refuses_what_it_cannot_do(tmp_path, options, message):
    """A keyword load cannot honour is a ConfigError naming it, never ignored nor a TypeError about ExportConfig."""
    with pytest.raises(ConfigError, match=message):
        gen_pipeline.load(tmp_path / "run", **options)


def test_load_of_a_turns_all_run_gives_its_conversations(write_jsonl, tmp_path):
    """A --turns all run loads as one row per conversation, as export writes it."""
    run_sim(write_jsonl(conversation_rows(3)), tmp_path / "run", sim={"n_ports": 2}, turns="all", max_tokens=32)
    ds = gen_pipeline.load(tmp_path / "run")
    assert sorted(ds["id"]) == ["c0", "c1", "c2"] and set(ds["conversation"]) == {"complete"}
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["turns"] == "all"
