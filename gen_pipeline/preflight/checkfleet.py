"""`check`'s fleet part: each server up and healthy, its limits and the capacity `generate` will give it (with
where it came from, fleet/capacity.py), what it does with the run's response_format (fleet/structured.py), and
the fleet's disagreements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import RunConfig
from ..engine.setup import fit_open_files
from ..errors import RequestError
from ..fleet.capacity import guess_warning, server_capacity
from ..fleet.discovery import DISCOVERY_TIMEOUT, FleetInfo, ServerInfo, probe
from ..fleet.provenance import fleet_warnings, seed_warning
from ..fleet.structured import asks_for_json, enforcement
from ..http import Client
from ..runtime import open_file_limit


@dataclass
class ServerCheck:
    """One server as the preflight found it."""

    url: str
    info: ServerInfo | None = None
    healthy: bool = False
    error: str | None = None

    def view(self, config: RunConfig) -> dict[str, Any]:
        i = self.info
        capacity = server_capacity(config, i)
        return {
            "url": self.url,
            "up": i is not None,
            "healthy": self.healthy,
            "model": i.model if i else None,
            "version": i.version if i else None,
            "context_length": i.context_length if i else None,
            "max_req_input_len": i.max_req_input_len if i else None,
            "max_total_num_tokens": i.max_total_num_tokens if i else None,
            "max_running_requests": i.max_running_requests if i else None,
            "capacity": config.capacity_for(capacity.requests) if i else None,
            "capacity_source": capacity.source if i else None,
            "checkpoint": i.identity.fingerprint if i and i.identity else None,
            "error": self.error,
            **({"response_format": self.response_format()} if i and asks_for_json(config.sampling) else {}),
        }

    def response_format(self) -> dict[str, Any]:
        """What this server does with the run's response_format (fleet/structured.py)."""
        assert self.info is not None
        found = enforcement(self.info.kind, self.info.grammar)
        return {"enforced": found.enforced, "whitespace": found.whitespace, "how": found.how}


@dataclass
class Findings:
    """What the preflight concluded: problems fail the check, warnings do not."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


async def check_server(client: Client, url: str) -> ServerCheck:
    try:
        info = await probe(client, url)
    except RequestError as exc:
        return ServerCheck(url, error=str(exc))
    try:
        await client.get_json(url, "/health", DISCOVERY_TIMEOUT)
    except RequestError as exc:
        return ServerCheck(url, info, error=f"/health: {exc}")
    return ServerCheck(url, info, healthy=True)


def fleet_findings(checks: list[ServerCheck], config: RunConfig, found: Findings) -> None:
    """Servers down or unhealthy, and disagreement on model, context or capacity."""
    down = [f"{c.url} ({c.error})" for c in checks if c.info is None]
    if len(down) == len(checks):
        found.problems.append(f"no server is up: {'; '.join(down)}")
        return
    if down:
        found.problems.append(f"{len(down)} of {len(checks)} servers down: {'; '.join(down)}")
    sick = [f"{c.url} ({c.error})" for c in checks if c.info is not None and not c.healthy]
    if sick:
        found.problems.append(f"{len(sick)} server(s) answer but are not healthy: {'; '.join(sick)}")
    found.problems.extend(fleet_info(checks).problems())
    found.warnings.extend(fleet_warnings(fleet_info(checks).identities()))
    if (seeded := seed_warning(fleet_info(checks).identities(), config.sampling)) is not None:
        found.warnings.append(seeded)
    running = fleet_info(checks).spread("max_running_requests")
    if len(running) > 1:
        found.warnings.append(f"servers report different max_running_requests: {running}")
    wanted = {c.url: config.capacity_for(server_capacity(config, c.info).requests) for c in checks if c.info}
    guessed = [c.url for c in checks if c.info is not None and server_capacity(config, c.info).source == "default"]
    if (guess := guess_warning(guessed)) is not None:
        found.warnings.append(guess)
    if (warning := fit_open_files(wanted, open_file_limit())[1]) is not None:
        found.warnings.append(warning)
    problems, warnings = fleet_info(checks).response_format_findings(config.sampling)
    found.problems.extend(problems)
    found.warnings.extend(warnings)
    if config.concurrency and running and config.concurrency < min(map(int, running)):
        found.warnings.append(
            f"--concurrency {config.concurrency} is below the servers' max_running_requests "
            f"({min(map(int, running))}): they will have idle slots"
        )


def fleet_info(checks: list[ServerCheck]) -> FleetInfo:
    """The checks as the FleetInfo generate's `resolve` reads."""
    up = [c.info for c in checks if c.info is not None]
    return FleetInfo(servers=up, down=[c.url for c in checks if c.info is None])


def server_line(s: dict[str, Any]) -> str:
    """One server of the report as a line: health, model and version, limits, capacity and its source."""
    if not s["up"]:
        return f"  {s['url']}  DOWN  {s['error']}"
    health = "healthy" if s["healthy"] else f"UNHEALTHY ({s['error']})"
    limits = f"context {s['context_length']}"
    if s.get("max_req_input_len") is not None:
        limits += f" (inputs under {s['max_req_input_len']})"
    if s.get("max_total_num_tokens") is not None:
        limits += f"  KV pool {s['max_total_num_tokens']} tokens"
    version = f" {s['version']}" if s.get("version") else ""
    line = (
        f"  {s['url']}  {health}  model {s['model']}{version}  {limits}  max_running {s['max_running_requests']}  "
        f"capacity {s['capacity']} ({s.get('capacity_source')})"
    )
    if s.get("response_format"):
        line += f"\n    response_format: {s['response_format']['how']}"
    return line
