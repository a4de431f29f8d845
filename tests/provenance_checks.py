"""The real-server tests' check of provenance: the manifest holds what each server itself reports.

    from provenance_checks import assert_manifest_matches_servers
    assert_manifest_matches_servers(out, [s.url for s in servers])

It asks each server directly (not through gen-pipeline's own discovery), reading the fields server-api.md
documents for its kind, and compares them with the manifest's `provenance.checkpoints` record that lists
the server; every output line that server answered must name that record's fingerprint.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

OUTPUT_SETTINGS = ("dtype", "quantization", "kv_cache_dtype", "speculative_algorithm", "enable_deterministic_inference")


def _get(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            body = orjson.loads(r.read())
    except urllib.error.HTTPError:
        return {}
    return body if isinstance(body, dict) else {}


def reported(url: str) -> dict[str, Any]:
    """What the server at `url` says it serves, in the manifest's record fields (kind from the card)."""
    card = (_get(f"{url}/v1/models").get("data") or [{}])[0]
    kind = card.get("owned_by")
    if kind == "llamacpp":
        props = _get(f"{url}/props")
        ftype = props.get("model_ftype")
        return {
            "kind": kind,
            "version": props.get("build_info"),
            "model_path": props.get("model_path"),
            "weight_version": None,
            "served_model_name": card.get("id"),
            "settings": {"quantization": ftype} if ftype is not None else {},
        }
    if kind == "vllm":
        return {
            "kind": kind,
            "version": _get(f"{url}/version").get("version"),
            "model_path": card.get("root"),
            "weight_version": None,
            "served_model_name": card.get("id"),
            "settings": {},
        }
    info, server = _get(f"{url}/model_info"), _get(f"{url}/server_info")
    return {
        "kind": "sglang",
        "version": server.get("version"),
        "model_path": info.get("model_path"),
        "weight_version": info.get("weight_version"),
        "served_model_name": info.get("served_model_name"),
        "settings": {k: server[k] for k in OUTPUT_SETTINGS if k in server},
    }


def assert_manifest_matches_servers(out: Path, urls: list[str]) -> None:
    """Each server's manifest record equals what it reports; its lines name that record's fingerprint."""
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    records = manifest["provenance"]["checkpoints"]
    fingerprints = {}
    for url in urls:
        [record] = [r for r in records if url in r["servers"]]
        expected = reported(url)
        assert expected["model_path"], f"{url} reports no model_path: {expected}"
        assert {k: record[k] for k in expected} == expected, (url, record, expected)
        fingerprints[url] = record["fingerprint"]
    assert manifest["provenance"]["gen_pipeline_version"] == manifest["gen_pipeline_version"]
    for path in sorted(out.glob("completions*.jsonl")):
        for raw in path.read_bytes().splitlines():
            line = orjson.loads(raw)
            if line["server"] in fingerprints:
                assert line["checkpoint"] == fingerprints[line["server"]], line
