"""Provenance: every line names the checkpoint that wrote it, and a redeployed model never mixes into a run.

Simulated SGLang servers report model_path, weight_version and version as 0.5.23 does (/model_info,
/server_info, metadata.weight_version); a fleet is redeployed between two nights, or mid-run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from e2e import check_invariant, fleet_in_thread, prompts, read_jsonl
from procs import wait_for_lines

from gen_pipeline.cli import main as cli_main
from gen_pipeline.config import RetryPolicy, RunConfig
from gen_pipeline.errors import CheckpointChangedError, FleetError
from gen_pipeline.fleet.provenance import ServerIdentity, identity_from
from gen_pipeline.modes import run_async
from gen_pipeline.sim import SimConfig, free_ports, start_fleet

NIGHT1 = {"model_path": "/ckpt/step-1000", "weight_version": "v1"}
NIGHT2 = {"model_path": "/ckpt/step-2000", "weight_version": "v2"}


def _sim(n: int = 2, **kw: Any) -> SimConfig:
    return SimConfig(ports=tuple(free_ports(n)), health_delay=0.0, **kw)


async def _night(sim: SimConfig, inp: Path, out: Path, **run: Any) -> tuple[Any, dict[int, int]]:
    """One generate run on a fresh fleet; the outcome and the requests each port received."""
    async with await start_fleet(sim) as fleet:
        settings = {"retry": RetryPolicy.testing(), "progress": "off", "max_tokens": 32, **run}
        outcome = await run_async(RunConfig(input=inp, out=out, servers=tuple(fleet.urls), **settings))
        return outcome, {port: stats.requests for port, stats in fleet.stats.items()}


def night(sim: SimConfig, inp: Path, out: Path, **run: Any) -> tuple[Any, dict[int, int]]:
    return asyncio.run(asyncio.wait_for(_night(sim, inp, out, **run), 60))


def manifest(out: Path) -> dict[str, Any]:
    return orjson.loads((out / "manifest.json").read_bytes())


def checkpoints(out: Path) -> dict[str, dict[str, Any]]:
    """The manifest's recorded identities, by model_path."""
    return {c["model_path"]: c for c in manifest(out)["provenance"]["checkpoints"]}


def test_the_manifest_records_what_each_server_reports(write_jsonl, tmp_path):
    """One identity per distinct server: kind, version, model_path, weight_version, served name, the settings
    that change outputs, and gen-pipeline's version; every line names it and the weight_version it got."""
    out = tmp_path / "run"
    outcome, _ = night(_sim(deterministic=True, **NIGHT1), write_jsonl(prompts(12)), out)
    assert outcome.exit_code == 0
    section = manifest(out)["provenance"]
    [record] = section["checkpoints"]
    assert {k: record[k] for k in ("kind", "version", "model_path", "weight_version", "served_model_name")} == {
        "kind": "sglang",
        "version": "0.5.23",
        "model_path": "/ckpt/step-1000",
        "weight_version": "v1",
        "served_model_name": "sim-model",
    }
    assert record["settings"] == {
        "dtype": "auto",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "speculative_algorithm": None,
        "enable_deterministic_inference": True,
    }
    assert len(record["servers"]) == 2 and section["fleet"] == [record["fingerprint"]]
    assert section["gen_pipeline_version"] == manifest(out)["gen_pipeline_version"]
    lines = read_jsonl(out / "completions.jsonl")
    assert len(lines) == 12
    assert {(r["checkpoint"], r["weight_version"]) for r in lines} == {(record["fingerprint"], "v1")}


def test_a_redeployed_fleet_is_refused_before_anything_is_sent(write_jsonl, tmp_path, capsys):
    """Night 2 on /ckpt/step-2000 resuming night 1's directory: exit 1, one line naming both, no request."""
    out = tmp_path / "run"
    night(_sim(**NIGHT1), write_jsonl(prompts(10)), out)
    before = (out / "completions.jsonl").read_bytes()
    sim = _sim(**NIGHT2)
    inp = write_jsonl(prompts(20), "night2.jsonl")
    with fleet_in_thread(sim) as servers:
        argv = ["generate", "-i", inp, "-o", out, "-s", servers, "--max-tokens", "32", "--progress", "off"]
        code = cli_main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 1
    [line] = [x for x in err.splitlines() if "checkpoint" in x]
    assert "/ckpt/step-1000" in line and "/ckpt/step-2000" in line and "--accept-checkpoint" in line
    assert "weight_version v1" in line and "weight_version v2" in line
    assert (out / "completions.jsonl").read_bytes() == before
    assert list(checkpoints(out)) == ["/ckpt/step-1000"]


def test_the_refusal_sends_nothing_and_force_does_not_lift_it(write_jsonl, tmp_path):
    """The same refusal from the API, with --force too (it is for settings, not checkpoints): 0 requests."""
    out = tmp_path / "run"
    night(_sim(**NIGHT1), write_jsonl(prompts(5)), out)
    for force in (False, True):
        with pytest.raises(CheckpointChangedError, match=r"step-1000.*step-2000"):
            night(_sim(**NIGHT2), write_jsonl(prompts(10), "n2.jsonl"), out, force=force)


def test_a_server_version_change_is_a_new_checkpoint_too(write_jsonl, tmp_path):
    """Same weights under another SGLang version: refused, and the message names both versions."""
    out = tmp_path / "run"
    night(_sim(**NIGHT1), write_jsonl(prompts(5)), out)
    with pytest.raises(CheckpointChangedError, match=r"sglang 0\.5\.23.*sglang 0\.5\.24"):
        night(_sim(server_version="0.5.24", **NIGHT1), write_jsonl(prompts(10), "n2.jsonl"), out)


def test_accepting_the_new_checkpoint_keeps_both_and_each_line_its_own(write_jsonl, tmp_path):
    """--accept-checkpoint: night 2 runs; the manifest lists both checkpoints; night 1's lines keep theirs."""
    out = tmp_path / "run"
    night(_sim(**NIGHT1), write_jsonl(prompts(10)), out)
    outcome, _ = night(_sim(**NIGHT2), write_jsonl(prompts(25), "n2.jsonl"), out, accept_checkpoint=True)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 15
    recorded = checkpoints(out)
    assert list(recorded) == ["/ckpt/step-1000", "/ckpt/step-2000"]
    assert manifest(out)["provenance"]["fleet"] == [recorded["/ckpt/step-2000"]["fingerprint"]]
    by_id = {r["id"]: r for r in read_jsonl(out / "completions.jsonl")}
    assert len(by_id) == 25
    for i, row in by_id.items():
        name = "/ckpt/step-1000" if i < 10 else "/ckpt/step-2000"
        assert row["checkpoint"] == recorded[name]["fingerprint"]
        assert row["weight_version"] == recorded[name]["weight_version"]
    # a third night on the accepted checkpoint needs no flag
    outcome, _ = night(_sim(**NIGHT2), write_jsonl(prompts(30), "n3.jsonl"), out)
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 5


GUARD = pytest.mark.parametrize("guard", ["on", "off"], ids=["streamed", "whole"])


@GUARD
def test_a_server_redeployed_mid_run_is_taken_out_and_its_rows_go_elsewhere(write_jsonl, tmp_path, guard):
    """One of two servers switches to v2 after 6 requests: it is out for the rest of the run, every row is
    written once, and no line carries v2 or claims the old checkpoint for a v2 answer. Streamed answers name no
    weights (SGLang's chunks carry none): the server's own report after each answer stands for them."""
    sim = _sim(**NIGHT1)
    sim = SimConfig(**{**sim.__dict__, "redeploy": {sim.ports[0]: (6, "v2")}, "max_running": 2})
    out = tmp_path / "run"
    rows = prompts(60)
    outcome, requests = night(sim, write_jsonl(rows), out, concurrency=2, loop_guard=guard)
    assert outcome.exit_code == 0, outcome.summary
    assert check_invariant([r["id"] for r in rows], out) == {"done": 60, "ledger": 0}
    lines = read_jsonl(out / "completions.jsonl")
    [fingerprint] = {c["fingerprint"] for c in checkpoints(out).values()}
    assert {(r["checkpoint"], r["weight_version"]) for r in lines} == {(fingerprint, "v1")}
    moved = f"http://127.0.0.1:{sim.ports[0]}"
    assert outcome.summary["servers"][moved]["failures"].get("wrong_model", 0) >= 1
    assert requests[sim.ports[0]] <= 6 + 2  # the six, and those in flight when it switched
    assert requests[sim.ports[1]] >= 60 - 6


@GUARD
def test_a_whole_fleet_redeployed_mid_run_stops_the_run(write_jsonl, tmp_path, guard):
    """Every server switched: the run stops with one message (no outage wait), nothing of v2 is written, and
    the rerun is refused until --accept-checkpoint."""
    sim = _sim(n=1, **NIGHT1)
    sim = SimConfig(**{**sim.__dict__, "redeploy": {sim.ports[0]: (4, "v2")}})
    out = tmp_path / "run"
    inp = write_jsonl(prompts(40))
    with pytest.raises(FleetError, match=r"redeployed mid-run.*'v2'.*--accept-checkpoint"):
        night(sim, inp, out, concurrency=1, loop_guard=guard)
    lines = read_jsonl(out / "completions.jsonl")
    assert 1 <= len(lines) <= 4 and {r["weight_version"] for r in lines} == {"v1"}


def test_identity_from_each_server_kind():
    """What vLLM and llama.cpp report (server-api.md) becomes their identity; SGLang's settings are kept."""
    vllm = identity_from(
        "vllm", {"id": "tiny", "root": "/models/tiny", "owned_by": "vllm"}, {}, {}, {"version": "0.11.0"}
    )
    assert (vllm.kind, vllm.version, vllm.model_path, vllm.weight_version, vllm.served_model_name) == (
        "vllm",
        "0.11.0",
        "/models/tiny",
        None,
        "tiny",
    )
    props = {"model_path": "/m/tiny.gguf", "build_info": "b7000-abc", "model_ftype": "BF16", "model_alias": "tiny"}
    llama = identity_from("llamacpp", {"id": "tiny.gguf", "owned_by": "llamacpp"}, {}, {}, props)
    assert (llama.version, llama.model_path, dict(llama.settings)) == (
        "b7000-abc",
        "/m/tiny.gguf",
        {"quantization": "BF16"},
    )
    assert llama.fingerprint != vllm.fingerprint and len(llama.fingerprint) == 12
    assert ServerIdentity.from_record(llama.record()) == llama


def _export(runs: list[Path], out: Path, **kw: Any) -> Any:
    import datasets

    from gen_pipeline.export.export import ExportConfig, export

    stats = export(ExportConfig(runs=tuple(runs), out=out, **kw))
    files = sorted(str(p) for p in (out / "data").glob("*.parquet"))
    return stats, datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(out.parent / "c"))


def test_export_keeps_every_answer_of_two_checkpoints_over_the_same_ids(write_jsonl, tmp_path):
    """runA (step-1000) and runB (step-2000) over the same 10 ids, 2 samples each: 40 rows side by side, the
    checkpoint column naming each; --group-samples groups within a checkpoint; the card names both."""
    from gen_pipeline.errors import ExportCheckError
    from gen_pipeline.export.export import ExportConfig

    inp = write_jsonl(prompts(10))
    night(_sim(**NIGHT1), inp, tmp_path / "runA", samples=2)
    night(_sim(**NIGHT2), inp, tmp_path / "runB", samples=2)
    runs = [tmp_path / "runA", tmp_path / "runB"]
    fp = {name: c["fingerprint"] for run in runs for name, c in checkpoints(run).items()}
    stats, ds = _export(runs, tmp_path / "ds")
    assert len(ds) == 40 and stats.duplicates == 0
    assert sorted(Counter(ds["checkpoint"]).items()) == sorted(
        {fp["/ckpt/step-1000"]: 20, fp["/ckpt/step-2000"]: 20}.items()
    )
    assert len({(i, s, c) for i, s, c in zip(ds["id"], ds["sample"], ds["checkpoint"], strict=True)}) == 40
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "## Checkpoints" in card and "/ckpt/step-1000" in card and "/ckpt/step-2000" in card
    _, grouped = _export(runs, tmp_path / "grouped", group_samples=True)
    assert len(grouped) == 20 and all(len(set(row["checkpoint"])) == 1 and row["sample"] == [0, 1] for row in grouped)
    with pytest.raises(ExportCheckError, match=r"2 checkpoints.*add checkpoint to --columns"):
        from gen_pipeline.export.export import export

        export(ExportConfig(runs=tuple(runs), out=tmp_path / "refused", columns=("id", "sample")))


def test_export_drops_only_the_same_checkpoints_repeats(write_jsonl, tmp_path):
    """Two runs of one checkpoint over the same ids: each (id, sample) once (the second run's are duplicates)."""
    inp = write_jsonl(prompts(6))
    night(_sim(**NIGHT1), inp, tmp_path / "a")
    night(_sim(**NIGHT1), inp, tmp_path / "b")
    stats, ds = _export([tmp_path / "a", tmp_path / "b"], tmp_path / "ds")
    assert len(ds) == 6 and stats.duplicates == 6


async def _check(sims: list[SimConfig], inp: Path, out: Path, resume: bool, **run: Any) -> dict[str, Any]:
    from gen_pipeline.preflight.check import run_check

    fleets = [await start_fleet(s) for s in sims]
    try:
        urls = tuple(u for f in fleets for u in f.urls)
        config = RunConfig(input=inp, out=out, servers=urls, max_tokens=32, **run)
        return await run_check(config, resume=resume)
    finally:
        for f in fleets:
            await f.aclose()


def check(sims: list[SimConfig], inp: Path, out: Path, **run: Any) -> dict[str, Any]:
    return asyncio.run(asyncio.wait_for(_check(sims, inp, out, out.is_dir(), **run), 30))


def test_check_prints_each_checkpoint_and_warns_when_servers_disagree(write_jsonl, tmp_path):
    """Two identities in one fleet: both listed (deterministic on / off), one warning; --seed on a server
    without deterministic inference is warned about; nothing of it is a problem."""
    from gen_pipeline.preflight.check import render_check

    sims = [_sim(1, deterministic=True, **NIGHT1), _sim(1, **NIGHT2)]
    report = check(sims, write_jsonl(prompts(4)), tmp_path / "none", sampling={"seed": 7})
    assert report["ok"], report["problems"]
    by_path = {p["model_path"]: p for p in report["provenance"]}
    assert by_path["/ckpt/step-1000"]["settings"]["enable_deterministic_inference"] is True
    assert by_path["/ckpt/step-2000"]["weight_version"] == "v2"
    assert {s["checkpoint"] for s in report["fleet"]} == {p["fingerprint"] for p in report["provenance"]}
    text = render_check(report)
    assert "deterministic inference on" in text and "deterministic inference off" in text
    [disagree] = [w for w in report["warnings"] if "different checkpoints" in w]
    assert "step-1000" in disagree and "step-2000" in disagree
    [seeded] = [w for w in report["warnings"] if "--seed" in w]
    assert f"127.0.0.1:{sims[1].ports[0]}" in seeded and f"127.0.0.1:{sims[0].ports[0]}" not in seeded


def test_check_calls_a_changed_checkpoint_a_problem(write_jsonl, tmp_path):
    """check --out on a run written by step-1000, against step-2000: the PROBLEM generate would refuse."""
    out = tmp_path / "run"
    inp = write_jsonl(prompts(4))
    night(_sim(**NIGHT1), inp, out)
    report = check([_sim(**NIGHT2)], inp, out)
    [problem] = report["problems"]
    assert "step-1000" in problem and "step-2000" in problem and "generate would refuse" in problem
    assert check([_sim(**NIGHT2)], inp, out, accept_checkpoint=True)["ok"]


def _get(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return orjson.loads(r.read())


def _chat(url: str) -> Any:
    import urllib.request

    body = orjson.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return orjson.loads(r.read())


def test_the_simulator_reports_its_checkpoint_and_redeploys_on_cue():
    """--model-path, --weight-version, --server-version, --deterministic and --redeploy-after as SGLang reports
    them: /model_info, /server_info and each answer's metadata.weight_version (v2 from request 3 on)."""
    import argparse

    from gen_pipeline.sim import add_arguments
    from gen_pipeline.sim.cli import config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    port = free_ports(1)[0]
    argv = ["--ports", str(port), "--model-path", "/ckpt/a", "--weight-version", "v1", "--server-version", "0.5.16"]
    args = parser.parse_args([*argv, "--deterministic", "--redeploy-after", "2:v2", "--health-delay", "0"])
    with fleet_in_thread(config_from_args(args)) as url:
        info, server = _get(f"{url}/get_model_info"), _get(f"{url}/get_server_info")
        assert (info["model_path"], info["weight_version"], server["version"]) == ("/ckpt/a", "v1", "0.5.16")
        assert server["enable_deterministic_inference"] is True and server["weight_version"] == "v1"
        versions = [_chat(url)["metadata"]["weight_version"] for _ in range(4)]
        assert versions == ["v1", "v1", "v2", "v2"]
        assert _get(f"{url}/model_info")["weight_version"] == "v2"


@pytest.mark.slow
def test_a_nightly_run_on_a_redeployed_fleet_stops_until_accepted(tmp_path):
    """run/nightly.sh: night 2 on a fleet redeployed from step-1000 to step-2000 exits 1 with the error naming
    both and generates nothing; run again with -- --accept-checkpoint it finishes the night on the new one."""
    from procs import sim_fleet
    from test_nightly import clean_env, nightly, source_rows
    from test_nightly import write_jsonl as write_rows

    ds, src = tmp_path / "ds", tmp_path / "source.jsonl"
    write_rows(src, source_rows([f"Question {i} about topic {i}" for i in range(4)]))
    gen = ["--", "--max-tokens", "16", "--progress", "off"]
    with sim_fleet(2, "--model-path", "/ckpt/step-1000", "--weight-version", "v1") as servers:
        env = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers)
        one = nightly("--dataset-dir", ds, "--date", "2026-01-01", *gen, env=env)
        assert one.returncode == 0, one.stdout + one.stderr
    before = (ds / "completions.jsonl").read_bytes()
    write_rows(src, source_rows([f"Question {i} about topic {i}" for i in range(7)]))
    with sim_fleet(2, "--model-path", "/ckpt/step-2000", "--weight-version", "v2") as servers:
        env = clean_env(NIGHTLY_SOURCE=str(src), NIGHTLY_SERVERS=servers)
        night2 = ["--dataset-dir", ds, "--date", "2026-01-02"]
        two = nightly(*night2, *gen, env=env)
        assert two.returncode == 1, two.stdout + two.stderr
        log = (ds / "logs" / "nightly-2026-01-02.log").read_text()
        [error] = [x for x in log.splitlines() if x.startswith("error:")]
        assert "/ckpt/step-1000" in error and "/ckpt/step-2000" in error and "--accept-checkpoint" in error
        assert (ds / "completions.jsonl").read_bytes() == before
        three = nightly(*night2, *gen, "--accept-checkpoint", env=env)
        assert three.returncode == 0, three.stdout + three.stderr
    lines = read_jsonl(ds / "completions.jsonl")
    assert sorted(r["weight_version"] for r in lines) == ["v1"] * 4 + ["v2"] * 3
    assert [c["model_path"] for c in manifest(ds)["provenance"]["checkpoints"]] == [
        "/ckpt/step-1000",
        "/ckpt/step-2000",
    ]


def test_only_what_both_servers_report_is_compared():
    """A field one side leaves out cannot have changed; one both report and that differs is a new checkpoint."""
    known = ServerIdentity("sglang", "0.5.23", "/ckpt/a", "v1", "m")
    assert known.same_checkpoint(ServerIdentity("sglang", None, None, None, "m"))
    assert known.same_checkpoint(ServerIdentity("sglang", "0.5.23", "/ckpt/a", "v1", "other-name"))
    assert not known.same_checkpoint(ServerIdentity("sglang", "0.5.23", "/ckpt/a", "v2", "m"))
    assert not known.same_checkpoint(ServerIdentity("vllm", "0.11.0", "/ckpt/a", None, "m"))


@pytest.mark.slow  # an end-to-end run of several seconds; make test-fast leaves it out
@pytest.mark.parametrize("late", [NIGHT1, NIGHT2], ids=["same-checkpoint", "other-checkpoint"])
def test_a_server_down_at_start_comes_in_only_with_the_runs_checkpoint(write_jsonl, tmp_path, late):
    """A server that answers only after the run started is asked what it serves: the same identity joins the
    run (its lines name it); another checkpoint is retired before it gets a single row."""
    a = _sim(1, max_running=1, prefill_latency=0.01, **NIGHT1)
    port = free_ports(1)[0]
    out = tmp_path / "run"

    async def scenario() -> tuple[Any, int]:
        async with await start_fleet(a) as first:
            urls = (*first.urls, f"http://127.0.0.1:{port}")
            config = RunConfig(input=write_jsonl(prompts(400)), out=out, servers=urls, max_tokens=16, progress="off",
                               retry=RetryPolicy.testing())  # fmt: skip
            run = asyncio.create_task(run_async(config))
            await asyncio.to_thread(wait_for_lines, out / "completions.jsonl", 5, 60)
            async with await start_fleet(SimConfig(ports=(port,), health_delay=0.0, **late)) as second:
                outcome = await run
                return outcome, second.stats[port].requests

    outcome, served = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 400
    [fingerprint] = {c["fingerprint"] for c in checkpoints(out).values()}
    lines = read_jsonl(out / "completions.jsonl")
    assert {(r["checkpoint"], r["weight_version"]) for r in lines} == {(fingerprint, "v1")}
    view = outcome.summary["servers"][f"http://127.0.0.1:{port}"]
    if late is NIGHT1:
        assert served > 0 and "retired" not in view
    else:
        assert served == 0 and view["retired"]


@pytest.mark.slow  # an end-to-end run of several seconds; make test-fast leaves it out
@pytest.mark.parametrize(
    "change", [{"model_path": "/ckpt/step-2000"}, {"model": "other-model"}, {"deterministic": True}]
)
def test_a_server_restarted_on_another_checkpoint_while_out_is_retired(write_jsonl, tmp_path, change, caplog):
    """A server goes down mid-run and comes back as another identity: another model_path with the same
    weight_version (SGLang says "default" unless told), another served name, deterministic inference turned
    on. It is asked again when it answers, and retired; it wrote rows under the identity it had before (51
    of them in the reproduction; 59 and 63 for the setting and the name, compared by checkpoint only)."""
    same = {"weight_version": "default", "max_running": 4, "token_latency": 0.005}  # 400 rows take ~8 s
    a, b = _sim(1, model_path="/ckpt/step-1000", **same), free_ports(1)[0]
    before = SimConfig(ports=(b,), health_delay=0.0, model_path="/ckpt/step-1000", **same)
    after = SimConfig(**{**vars(before), **change})
    out = tmp_path / "run"

    async def scenario() -> tuple[Any, int]:
        async with await start_fleet(a) as first:
            second = await start_fleet(before)
            urls = (*first.urls, f"http://127.0.0.1:{b}")
            config = RunConfig(input=write_jsonl(prompts(400)), out=out, servers=urls, max_tokens=16, progress="off",
                               retry=RetryPolicy.testing())  # fmt: skip
            run = asyncio.create_task(run_async(config))
            await asyncio.to_thread(wait_for_lines, out / "completions.jsonl", 20, 60)
            await second.__aexit__(None, None, None)
            async with await start_fleet(after) as redeployed:
                outcome = await run
                return outcome, redeployed.stats[b].requests

    outcome, served = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert outcome.exit_code == 0 and outcome.summary["completed"] == 400
    assert served == 0, "the redeployed server got rows"
    [fingerprint] = {c["fingerprint"] for c in checkpoints(out).values()}
    assert {r["checkpoint"] for r in read_jsonl(out / "completions.jsonl")} == {fingerprint}
    url = f"http://127.0.0.1:{b}"
    assert outcome.summary["servers"][url]["retired"]
    [said] = [r.getMessage() for r in caplog.records if "came back serving" in r.getMessage()]
    field = {"model_path": "model_path '/ckpt/step-1000' -> '/ckpt/step-2000'", "model": "served_model_name "
             "'sim-model' -> 'other-model'", "deterministic": "settings "}[next(iter(change))]  # fmt: skip
    assert field in said, said  # what changed is named (two labels that read the same said nothing)
    # said where users look: the printed summary and status (not only summary.json); never an under-use alert
    from gen_pipeline.progress.stats import format_summary
    from gen_pipeline.views.statustext import render_status

    [line] = [x for x in format_summary(outcome.summary).splitlines() if x.strip().startswith(url)]
    assert "RETIRED: its checkpoint is not the run's" in line
    status = orjson.loads((out / "status.json").read_bytes())
    assert status["servers"][url]["retired"] and not [a for a in status.get("alerts") or [] if url in a]
    assert "RETIRED (another checkpoint)" in render_status(status, status["updated"])


def test_export_of_two_checkpoints_conversations_keeps_both(write_jsonl, tmp_path):
    """--turns all runs of two checkpoints over the same conversations: each conversation once per checkpoint,
    complete, its turns all from that checkpoint."""
    from e2e import conversation_rows

    inp = write_jsonl(conversation_rows(3))
    night(_sim(**NIGHT1), inp, tmp_path / "a", turns="all")
    night(_sim(**NIGHT2), inp, tmp_path / "b", turns="all")
    stats, ds = _export([tmp_path / "a", tmp_path / "b"], tmp_path / "ds")
    assert len(ds) == 6 and stats.conversations == {"complete": 6}
    assert sorted(Counter(ds["checkpoint"]).values()) == [3, 3]


def test_every_server_restarted_as_another_checkpoint_while_out_stops_the_run(write_jsonl, tmp_path):
    """The whole fleet goes down mid-run and comes back on another weight_version: every server is retired
    as it answers, and the run stops at once, exit 1, saying to run again with --accept-checkpoint. It
    waited as in an outage (ALL SERVERS DOWN, with both up) and exited 4 after --outage-timeout."""
    same = {"max_running": 4, "token_latency": 0.005, "health_delay": 0.0}
    ports = tuple(free_ports(2))
    out = tmp_path / "run"

    async def scenario() -> Any:
        fleet = await start_fleet(SimConfig(ports=ports, weight_version="v1", **same))
        config = RunConfig(input=write_jsonl(prompts(400)), out=out, servers=tuple(fleet.urls), max_tokens=16,
                           progress="off", retry=RetryPolicy.testing(), outage_timeout=600)  # fmt: skip
        run = asyncio.create_task(run_async(config))
        await asyncio.to_thread(wait_for_lines, out / "completions.jsonl", 20, 60)
        await fleet.aclose()
        async with await start_fleet(SimConfig(ports=ports, weight_version="v2", **same)):
            return await run

    outcome = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert outcome.exit_code == 1
    assert "every server was redeployed mid-run" in outcome.summary["stop_reason"]
    assert {r["weight_version"] for r in read_jsonl(out / "completions.jsonl")} == {"v1"}
    assert all(view["retired"] for view in outcome.summary["servers"].values())
