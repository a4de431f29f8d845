"""`gen-pipeline check`: a preflight with the same flags as `generate`, before any GPU hour is spent.

    gen-pipeline check -i prompts/my.jsonl -s 127.0.0.1:30000-30007 --max-tokens 8192 --json check.json

fleet      every server answers its model card and /health; one model and one max_model_len everywhere;
           each server's limits (SGLang: max_req_input_len, its KV pool), version, and the capacity
           generate uses unless --concurrency, with where it came from (fleet/capacity.py);
           what checkpoint each serves (kind and version, model_path, weight_version, the settings that
           change outputs, deterministic inference), with a warning when the servers disagree; when the run
           asks for JSON (--json-schema, a response_format in --sampling), how each server enforces it
           (fleet/structured.py): a problem when it refuses it, a warning when its whitespace is unbounded
           or it is not known to enforce it.
tokenizer  a few chat requests with max_tokens 1, built from the first rows of the input, to every server
           that is up: the server's usage.prompt_tokens must equal our count, or every budget is off.
plan       every row read, validated and counted exactly as generate does, nothing sent: the input-length
           distribution, rows sent with their full budget, rows clamped (and to what), rows skipped as
           over_length, bad rows, and the tokens the run may use. With --out naming an existing run,
           what it already settled is left out, as a resume would.

It does not wait for servers to come up: it reports who answers now. The flags that only shape a run
(--max-attempts, --startup-timeout, --outage-timeout, --grace-period, --fsync-interval, --progress) are
accepted, so one command line serves both, but ignored and left out of --help. --limit and
--system-prompt shape the rows as in generate. Problems: a server down or unhealthy, different models or
context lengths, tokenizer drift, a refused resume (settings or checkpoint changed), no valid row, every
prompt over_length, or more than half of the prompts over_length or clamped below a quarter of their budget.

Exit codes: 0 the run looks fine (warnings may be printed); 1 the run would fail or waste most of its
budget, with one line per problem saying why (bad flags exit 1 too, as for generate).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from typing import Any

import orjson

from ..answers.validate import unconstrained_json
from ..config import DEFAULT_SAFETY_MARGIN, RunConfig
from ..engine.reader import conversation, first_lines, shaped
from ..engine.setup import counting_kind, manifest_for, resolve
from ..errors import EXIT_ERROR, ConfigError, RequestError
from ..fleet.affinity import fleet_cache_tokens
from ..fleet.provenance import checkpoint_change, identity_records, server_lines
from ..http import Client, open_transport
from ..inputs.kinds import check_input
from ..inputs.rows import BadRow
from ..inputs.shape import RowShape
from ..inputs.source import PromptSource
from ..progress.stats import RunStats
from ..records import Prompt
from ..resume.settled import ResumeState, scan
from ..rundir.layout import MANIFEST
from ..rundir.store import MANIFEST_KEYS
from ..send.requests import request_body
from ..tokens import TokenCounter, load_counter
from ..tokens.budget import prompt_budget
from ..tokens.conversation import shapes
from ..tokens.findings import drift_problem
from ..tokens.oversize import SizeFloor
from .checkfleet import Findings, ServerCheck, check_server, fleet_findings, fleet_info, server_line
from .plan import budget_plan, plan_findings, plan_lines

log = logging.getLogger("gen_pipeline")

EXIT_PROBLEMS = EXIT_ERROR  # a PROBLEM found: generate would refuse this fleet too
PROBE_ROWS = 3  # probe prompts per server
EXAMPLE_ROWS = 100  # rows tried for check's --template example
EXAMPLE_CHARS = 2000  # of its text shown


# tokenizer agreement


def first_prompts(
    config: RunConfig, counter: TokenCounter, ctx: int, n: int = PROBE_ROWS, max_input: int | None = None
) -> list[Prompt]:
    """The first `n` valid rows that fit the context (and the servers' input cap), counted (within --limit,
    with --system-prompt)."""
    floor, fit = SizeFloor(counter), ctx - config.safety_margin - config.min_tokens
    items = first_lines(PromptSource(config.input, shape=RowShape.of(config.template, config.turns)), config.limit)
    rows = (
        p
        for p in (shaped(x, config) for x in items if isinstance(x, Prompt))
        if floor.tokens_over(conversation(p), fit) is None
    )
    picked: list[Prompt] = []
    for batch in iter(lambda: list(itertools.islice(rows, 4 * n)), []):
        for p, count in zip(batch, counter.count([conversation(p) for p in batch]), strict=True):
            if isinstance(count, int) and prompt_budget(config, ctx, count, p.max_tokens, max_input) is not None:
                p.input_tokens = count
                picked.append(p)
        if len(picked) >= n:
            break
    return picked[:n]


async def _probe_count(
    client: Client, url: str, model: str, p: Prompt, config: RunConfig
) -> tuple[int, frozenset[str]] | str:
    body = request_body(config.sampling, p, model, max_tokens=1)
    try:
        result = await client.chat(url, body, config.timeout_for(1))
    except RequestError as exc:
        return f"{url} id {p.id}: {exc}"
    if result.prompt_tokens is None:
        return f"{url} id {p.id}: the server reported no usage.prompt_tokens"
    return result.prompt_tokens - p.input_tokens, shapes(conversation(p))


async def tokenizer_agreement(
    client: Client, urls: list[str], model: str, prompts: list[Prompt], config: RunConfig
) -> dict[str, Any]:
    """Every probe prompt to every server: the server's count minus ours, or the error."""
    pairs = [(u, p) for u in urls for p in prompts]
    results = await asyncio.gather(*(_probe_count(client, u, model, p, config) for u, p in pairs))
    stats = RunStats()
    for r in results:
        if not isinstance(r, str):
            stats.note_drift(*r)
    drift = stats.drift
    worst = max(drift, default=0)
    return {
        "probes": len(pairs),
        "compared": sum(drift.values()),
        "drift": {str(k): v for k, v in sorted(drift.items())},
        "agree": set(drift) <= {0},
        "suggested_safety_margin": max(worst, 0) + DEFAULT_SAFETY_MARGIN if set(drift) - {0} else None,
        "errors": [r for r in results if isinstance(r, str)],
        "shapes": dict(stats.drift_shapes),
    }


def tokenizer_findings(view: dict[str, Any], tokenizer: str, found: Findings) -> None:
    """Drift between the servers' counts and ours is a problem; failed probes are reported."""
    errors, compared = view["errors"], view["compared"]
    if errors and not compared:
        found.problems.append(f"no tokenizer probe succeeded: {errors[0]}")
    elif errors:
        found.warnings.append(f"{len(errors)} of {view['probes']} tokenizer probes failed: {errors[0]}")
    if (problem := drift_problem(view["drift"], compared, tokenizer, shapes=view["shapes"])) is not None:
        found.problems.append(problem)


def template_example(config: RunConfig, rows: int = EXAMPLE_ROWS) -> dict[str, Any]:
    """--template: the first row of the input it renders, as sent (with --system-prompt); or, when none of the
    first `rows` renders, why the first did not."""
    source = PromptSource(config.input, shape=RowShape.of(config.template, config.turns))
    first_bad = None
    for item in itertools.islice(first_lines(source, config.limit), rows):
        if isinstance(item, Prompt):
            return {"line": item.line, "id": item.id, "messages": shaped(item, config).messages}
        if isinstance(item, BadRow) and first_bad is None:
            first_bad = f"line {item.line}: {item.detail}"
    return {"error": first_bad or "the input has no row"}


def template_lines(report: dict[str, Any]) -> list[str]:
    """check's rendered --template example as readable lines."""
    example = report.get("template")
    if example is None:
        return []
    if "error" in example:
        return [f"template: renders none of the first rows; {example['error']}"]
    lines = [f"template: line {example['line']} (id {example['id']!r}) is sent as:"]
    for m in example["messages"]:
        text = str(m.get("content"))
        lines += [f"  [{m.get('role')}] {line}" for line in text[:EXAMPLE_CHARS].splitlines() or [""]]
    return lines


# budget plan


def resume_state(out: Path | None) -> ResumeState:
    """What a resume of `out` would skip, read without repairing anything (check writes nothing)."""
    return scan(out, repair=False, save_index=False) if out is not None else ResumeState()


def manifest_findings(
    config: RunConfig, out: Path | None, ours: dict[str, Any], found: Findings, checks: list[ServerCheck]
) -> None:
    """A resume that generate would refuse (settings or checkpoint changed) is a problem."""
    path = out / MANIFEST if out else None
    if path is None or not path.exists():
        return
    old = orjson.loads(path.read_bytes())
    changed = checkpoint_change(old, fleet_info(checks).identities())
    if changed is not None and not config.accept_checkpoint:
        found.problems.append(f"{out}: {changed}; generate would refuse")
    if config.force:
        return
    diffs = [f"{k}: {old.get(k)!r} -> {ours.get(k)!r}" for k in MANIFEST_KEYS if old.get(k) != ours.get(k)]
    if diffs:
        found.problems.append(f"{out} holds a run with other settings ({'; '.join(diffs)}); generate would refuse")


# the whole check


async def _fleet_and_probes(
    config: RunConfig, counter: TokenCounter | None, report: dict[str, Any], found: Findings
) -> tuple[TokenCounter, str, int, list[ServerCheck]] | None:
    async with open_transport(config.api_key, auth=config.server_auth) as transport:
        client = Client(transport)
        checks = await asyncio.gather(*(check_server(client, u) for u in config.servers))
        report["fleet"] = [c.view(config) for c in checks]
        report["provenance"] = identity_records(fleet_info(checks).identities())
        fleet_findings(checks, config, found)
        fleet = fleet_info(checks)
        try:
            model, ctx, tokenizer = resolve(config, fleet)
            kind = counting_kind(fleet)
            loaded = (
                counter
                if counter is not None
                else await asyncio.to_thread(load_counter, tokenizer, config.tokenizer_loader, kind)
            )
        except ConfigError as exc:
            if any(c.info is not None for c in checks):
                found.problems.append(f"no budget plan: {exc}")
            else:  # the line above says why; what the servers would have told is missing, not a flag
                found.problems.append(
                    "no budget plan: no server is up to report the model, context and tokenizer (--model, "
                    "--context-length and --tokenizer plan without them)"
                )
            return None
        found.warnings.extend(fleet.warnings)
        cap = fleet.input_limit()
        report["settings"] = {"model": model, "context_length": ctx, "max_input_tokens": cap, "tokenizer": loaded.name,
                              "server_kind": kind}  # fmt: skip
        up = [c.url for c in checks if c.info is not None]
        prompts = await asyncio.to_thread(first_prompts, config, loaded, ctx, PROBE_ROWS, cap)
        if up and prompts:
            report["tokenizer"] = await tokenizer_agreement(client, up, model, prompts, config)
            tokenizer_findings(report["tokenizer"], loaded.name, found)
        return loaded, model, ctx, checks


async def run_check(config: RunConfig, counter: TokenCounter | None = None, *, resume: bool = False) -> dict[str, Any]:
    """The whole preflight as one JSON-able report; `resume` reads config.out as a run to resume."""
    check_input(config.input)
    found = Findings()
    report: dict[str, Any] = {"input": str(config.input), "servers": list(config.servers)}
    if config.template is not None:
        report["template"] = await asyncio.to_thread(template_example, config)
        if "error" in report["template"]:
            found.problems.append(f"--template renders none of the first rows: {report['template']['error']}")
    resolved = await _fleet_and_probes(config, counter, report, found)
    if resolved is not None:
        loaded, model, ctx, checks = resolved
        out = config.out if resume and config.out.is_dir() else None
        manifest = manifest_for(config, model, ctx, loaded, report["settings"]["server_kind"])
        manifest_findings(config, out, manifest, found, checks)
        cap = report["settings"]["max_input_tokens"]
        plan = await asyncio.to_thread(budget_plan, config, loaded, ctx, resume_state(out), cap)
        report["plan"] = plan.view()
        plan_findings(plan, found, fleet_cache_tokens(c.info.max_total_num_tokens for c in checks if c.info))
    report["budget"] = {k: getattr(config, k) for k in ("max_tokens", "min_tokens", "safety_margin")}
    if (unconstrained := unconstrained_json(config.validate, config.sampling)) is not None:
        found.warnings.append(unconstrained)
    report.update(ok=not found.problems, problems=found.problems, warnings=found.warnings)
    return report


# rendering and the command


def _tokenizer_lines(report: dict[str, Any]) -> list[str]:
    view = report.get("tokenizer")
    if view is None:
        return ["tokenizer: not probed (no server up or no row that fits)"]
    if view["agree"] and view["compared"]:
        return [f"tokenizer: {report['settings']['tokenizer']} agrees exactly on {view['compared']} probes"]
    return [f"tokenizer: drift {view['drift']} over {view['compared']} probes (server count - ours)"]


def render_check(report: dict[str, Any]) -> str:
    """The report as readable lines."""
    up = sum(s["up"] for s in report.get("fleet", []))
    lines = [f"fleet: {up} of {len(report.get('fleet', []))} servers up"]
    lines += [server_line(s) for s in report.get("fleet", [])]
    lines += server_lines(report.get("provenance", []))
    lines += template_lines(report) + _tokenizer_lines(report) + plan_lines(report)
    lines += [f"WARNING: {w}" for w in report["warnings"]]
    lines += [f"PROBLEM: {p}" for p in report["problems"]]
    lines.append("check: OK" if report["ok"] else f"check: FAILED ({len(report['problems'])} problem(s))")
    return "\n".join(lines)
