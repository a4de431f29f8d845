"""Which checkpoint wrote a row: each server's identity, its fingerprint, and the run's record of them.

What each server kind reports about itself (servers report nothing else; what one leaves out stays None):

    sglang    /model_info  model_path, weight_version, served_model_name
              /server_info version, and the settings that change outputs (OUTPUT_SETTINGS)
              every chat answer: metadata.weight_version
    vllm      /v1/models   root (the model path), id (the served name);  /version  version
    llamacpp  /props       model_path, build_info (as the version), model_ftype (as the quantization)

A server's checkpoint is its kind, model_path, weight_version and version: a resume or nightly run whose
servers serve one the manifest does not list is refused before anything is sent (CheckpointChangedError)
unless `--accept-checkpoint`. Only what both sides report is compared: a field a server leaves out cannot
be said to have changed. The fingerprint (12 hex digits of a SHA-256) covers the whole identity,
settings included; it names the checkpoint of each output line, and the manifest lists every one.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from .._version import __version__
from ..errors import CheckpointChangedError
from ..records import key_of

# SGLang server args that change what a prompt's answer is (asdict(server_args) in /server_info).
OUTPUT_SETTINGS = ("dtype", "quantization", "kv_cache_dtype", "speculative_algorithm", "enable_deterministic_inference")
DETERMINISTIC = "enable_deterministic_inference"
FINGERPRINT_HEX = 12


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _scalar(value: Any) -> Any:
    """A setting's value as it can be hashed and written (anything not a scalar as its JSON text)."""
    return value if value is None or isinstance(value, str | int | float | bool) else orjson.dumps(value).decode()


@dataclass(frozen=True)
class ServerIdentity:
    """What one server says it serves: kind, version, checkpoint, served name, output-changing settings."""

    kind: str | None
    version: str | None
    model_path: str | None
    weight_version: str | None
    served_model_name: str | None
    settings: tuple[tuple[str, Any], ...] = ()

    def record(self) -> dict[str, Any]:
        """The identity as the manifest and `check --json` write it (fingerprint first)."""
        return {"fingerprint": self.fingerprint, **self._fields()}

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the whole identity: equal identities, equal fingerprints, on any machine."""
        fields = orjson.dumps(self._fields(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(fields).hexdigest()[:FINGERPRINT_HEX]

    def _fields(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "model_path": self.model_path,
            "weight_version": self.weight_version,
            "served_model_name": self.served_model_name,
            "settings": dict(self.settings),
        }

    def changes(self, other: ServerIdentity) -> str:
        """What differs from `other`, field by field ("served_model_name 'a' -> 'b'")."""
        mine, theirs = self._fields(), other._fields()
        return "; ".join(f"{k} {mine[k]!r} -> {theirs[k]!r}" for k in mine if mine[k] != theirs[k])

    @property
    def checkpoint(self) -> tuple[str | None, ...]:
        """What must not change under a run's rows without --accept-checkpoint."""
        return (self.kind, self.model_path, self.weight_version, self.version)

    def same_checkpoint(self, other: ServerIdentity) -> bool:
        """Whether the two may be one checkpoint: no field that both report differs (a server that reports
        no model_path cannot be told to have changed it)."""
        return all(a is None or b is None or a == b for a, b in zip(self.checkpoint, other.checkpoint, strict=True))

    @property
    def deterministic(self) -> bool | None:
        """Whether the server runs deterministic inference (None: it does not say)."""
        value = dict(self.settings).get(DETERMINISTIC)
        return value if isinstance(value, bool) else None

    def label(self) -> str:
        """One readable line: the checkpoint's fields and the fingerprint."""
        server = " ".join(x for x in (self.kind, self.version) if x) or "server of unknown kind"
        return (
            f"{self.fingerprint} (model_path {self.model_path or '?'}, weight_version {self.weight_version or '?'}, "
            f"{server})"
        )

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> ServerIdentity:
        """The identity a manifest's record describes."""
        given = rec.get("settings")
        settings: dict[str, Any] = given if isinstance(given, dict) else {}
        return cls(
            kind=_text(rec.get("kind")),
            version=_text(rec.get("version")),
            model_path=_text(rec.get("model_path")),
            weight_version=_text(rec.get("weight_version")),
            served_model_name=_text(rec.get("served_model_name")),
            settings=tuple(sorted((str(k), _scalar(v)) for k, v in settings.items())),
        )


def identity_from(
    kind: str | None,
    card: dict[str, Any],
    model_info: dict[str, Any],
    server_info: dict[str, Any],
    extra: dict[str, Any],
) -> ServerIdentity:
    """The identity from what discovery read: the model card, SGLang's /model_info and /server_info, and
    `extra` (llama.cpp's /props or vLLM's /version)."""
    settings: tuple[tuple[str, Any], ...]
    if kind == "llamacpp":
        ftype = extra.get("model_ftype")
        settings = (("quantization", _scalar(ftype)),) if ftype is not None else ()
        version = _text(extra.get("build_info"))
        path = _text(extra.get("model_path"))
    else:
        settings = tuple(sorted((k, _scalar(server_info[k])) for k in OUTPUT_SETTINGS if k in server_info))
        version = _text(server_info.get("version")) or _text(extra.get("version"))
        path = _text(model_info.get("model_path")) or _text(server_info.get("model_path"))
        path = path or (_text(card.get("root")) if kind == "vllm" else None)
    return ServerIdentity(
        kind=kind,
        version=version,
        model_path=path,
        weight_version=_text(model_info.get("weight_version")) or _text(server_info.get("weight_version")),
        served_model_name=_text(model_info.get("served_model_name")) or _text(card.get("id")),
        settings=settings,
    )


Servers = Iterable[tuple[str, ServerIdentity | None]]


def by_fingerprint(servers: Servers) -> dict[str, tuple[ServerIdentity, list[str]]]:
    """The distinct identities of the servers that reported one, with their URLs."""
    groups: dict[str, tuple[ServerIdentity, list[str]]] = {}
    for url, identity in servers:
        if identity is not None:
            groups.setdefault(identity.fingerprint, (identity, []))[1].append(url)
    return groups


def identity_records(servers: Servers) -> list[dict[str, Any]]:
    """Each distinct identity with its URLs, as `check` reports them."""
    return [{**identity.record(), "servers": urls} for identity, urls in by_fingerprint(servers).values()]


def fleet_warnings(servers: Servers) -> list[str]:
    """One warning when the servers of one fleet serve different identities (each line names its own)."""
    groups = by_fingerprint(servers)
    if len(groups) < 2:
        return []
    listed = "; ".join(f"{identity.label()}: {', '.join(urls)}" for identity, urls in groups.values())
    return [f"servers serve {len(groups)} different checkpoints or settings ({listed}); each line names its own"]


def seed_warning(servers: Servers, sampling: dict[str, Any]) -> str | None:
    """A --seed repeats a sample only on servers running deterministic inference: say which do not."""
    if sampling.get("seed") is None:
        return None
    loose = [url for url, identity in servers if identity is not None and identity.deterministic is False]
    if not loose:
        return None
    return (
        f"--seed is set, but {len(loose)} server(s) do not run deterministic inference "
        f"(SGLang --enable-deterministic-inference): {', '.join(loose)}; a seeded sample may still change "
        "with the batch around it"
    )


def recorded(manifest: dict[str, Any]) -> list[ServerIdentity]:
    """Every identity whose rows a run directory's manifest lists (none for a run made before provenance)."""
    section = manifest.get("provenance")
    checkpoints = section.get("checkpoints") if isinstance(section, dict) else None
    return [ServerIdentity.from_record(r) for r in checkpoints or [] if isinstance(r, dict)]


def checkpoint_change(manifest: dict[str, Any], servers: Servers) -> str | None:
    """Why resuming this run on these servers would mix a new checkpoint into it, or None."""
    old = recorded(manifest)
    if not old:
        return None
    groups = by_fingerprint(servers).values()
    new = [identity for identity, _ in groups if not any(identity.same_checkpoint(o) for o in old)]
    if not new:
        return None
    return (
        f"the run's rows were written by checkpoint {' and '.join(i.label() for i in old)}; the servers now serve "
        f"{' and '.join(i.label() for i in new)}. Nothing was sent. Use --accept-checkpoint to add the new "
        "checkpoint's rows beside the old ones (each line names its checkpoint), or another --out"
    )


def retired(manifest: dict[str, Any], servers: Servers) -> frozenset[str]:
    """The fingerprints the manifest records whose checkpoint none of these servers serves now (after
    --accept-checkpoint); none when no server reports an identity (nothing can be told)."""
    serving = [identity for identity, _ in by_fingerprint(servers).values()]
    section = manifest.get("provenance")
    records = section.get("checkpoints") if isinstance(section, dict) else None
    if not serving or not isinstance(records, list):
        return frozenset()
    old = [r for r in records if isinstance(r, dict) and isinstance(r.get("fingerprint"), str)]
    gone = (r for r in old if not any(ServerIdentity.from_record(r).same_checkpoint(i) for i in serving))
    return frozenset(r["fingerprint"] for r in gone)


def provenance_section(manifest: dict[str, Any] | None, servers: Servers, accept: bool) -> dict[str, Any]:
    """The manifest's `provenance`: every identity that ever answered in this directory (the old ones kept),
    and the fingerprints of this run's fleet. A changed checkpoint raises CheckpointChangedError unless
    `accept`."""
    servers = list(servers)
    old = manifest or {}
    problem = checkpoint_change(old, servers)
    if problem is not None and not accept:
        raise CheckpointChangedError(problem)
    section = old.get("provenance")
    previous: dict[str, Any] = section if isinstance(section, dict) else {}
    records = {r["fingerprint"]: r for r in previous.get("checkpoints") or [] if isinstance(r, dict)}
    groups = by_fingerprint(servers)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for fingerprint, (identity, urls) in groups.items():
        since = records.get(fingerprint, {}).get("first_used", now)
        records[fingerprint] = {**identity.record(), "servers": urls, "first_used": since}
    return {"gen_pipeline_version": __version__, "fleet": sorted(groups), "checkpoints": list(records.values())}


def server_lines(records: list[dict[str, Any]]) -> list[str]:
    """`check`'s provenance section: one line per identity, with its deterministic-inference setting."""
    lines = []
    for rec in records:
        identity = ServerIdentity.from_record(rec)
        det = {True: "on", False: "off", None: "not reported"}[identity.deterministic]
        settings = ", ".join(f"{k} {v}" for k, v in identity.settings if k != DETERMINISTIC) or "none reported"
        lines.append(
            f"  checkpoint {identity.label()}: served as {identity.served_model_name or '?'}; settings {settings}; "
            f"deterministic inference {det}; servers {', '.join(rec.get('servers') or [])}"
        )
    return lines


def unnamed_checkpoints(manifests: list[dict[str, Any]], columns: tuple[str, ...]) -> str | None:
    """Why `export` refuses these runs: rows of several checkpoints, and no column to tell them apart."""
    seen = {i.fingerprint: i for manifest in manifests for i in recorded(manifest)}
    if len(seen) < 2 or "checkpoint" in columns:
        return None
    names = "; ".join(i.label() for i in seen.values())
    return (
        f"these runs hold rows of {len(seen)} checkpoints ({names}): add checkpoint to --columns to export "
        "them side by side (each row names its checkpoint), or export each checkpoint's runs alone"
    )


def checkpoint_key(key: int, line: dict[str, Any]) -> int:
    """An output line's (id, sample) key mixed with its checkpoint's, so that only the same checkpoint's lines
    with the same key are duplicates (a line naming none keeps its key: lines written before provenance)."""
    checkpoint = line.get("checkpoint")
    return key ^ key_of(checkpoint.encode()) if isinstance(checkpoint, str) and checkpoint else key
