"""`export` of a `--turns all` run: one row per conversation, (id, sample), the shape chat-model training reads.

    {"messages": [system, user, assistant, user, assistant, ...], "conversation": "complete", "turns": 2,
     "id": "c1", "sample": 0, ...}

`messages` is the regenerated conversation: the last answered turn's request (which holds every earlier
turn, with the target's own answers) and its answer; an assistant turn carries its `reasoning_content`
when the server sent one, and every turn its tool calls, ids and names (trainrow.py), beside the request's
tools, chat_template_kwargs and sampling. `conversation` says whether every user turn of the row was answered
("complete") or the conversation ended early (a turn that no longer fit, or one not answered yet);
`--drop-incomplete` leaves those out. The other columns are the last turn's. A conversation with a turn
that export leaves out (`--drop-truncated`) is left out whole: a conversation with a hole is no data.

Within one run, a conversation may hold several versions: after a redeploy and `--accept-checkpoint`, or
once its earlier user turns changed in the input, `generate` answers a conversation begun before again from
its first turn, as its next restart generation (samples.py). Export keeps each conversation's newest whole
version (every turn from the first, all from one checkpoint and one generation; newest: of the run's newest
generation of the conversation, then of the checkpoint recorded last in the run's manifest) and counts each
other version as left out: "answered again from the first turn since" (an older generation), "answered again
under a newer checkpoint", or, turns without a first turn of their own (written on another checkpoint's
answers, by versions before restarts), "continued on another checkpoint's answers". Runs exported side by
side keep each its own versions (an A/B of two checkpoints).

Two passes over the output: the first gathers each conversation's versions (a few numbers each), the second
counts the lines of the rows and writes each row from the line of its last turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..fleet.provenance import recorded
from ..records import id_key, key_of
from ..resume.restarts import generations
from ..samples import record_place, sample_key
from ..views.rundata import read_manifest
from .exportconfig import REQUEST_COLUMNS, ExportConfig, ExportStats, dropped
from .trainrow import turn_features

TURN_COLUMNS = {"conversation": "string", "turns": "int64"}  # the columns a conversation row adds
Lines = Any  # lines.run_lines(config, stats, run): one run's readable lines, each (id, sample, turn) once


@dataclass(slots=True)
class Version:
    """The turns one checkpoint wrote of one conversation of one run."""

    checkpoint: str | None
    rank: int  # its checkpoint's place in the run's manifest (-1: not named there)
    turns: int = 0
    last: int = -1
    first: bool = False  # holds the first turn
    dropped: bool = False  # holds a turn the --drop-* flags leave out
    complete: bool = False  # its last turn answered the conversation's last user turn
    restart: int = 0  # its restart generation (samples.py)
    superseded: bool = False  # the run holds a newer generation of the conversation

    @property
    def whole(self) -> bool:
        return self.first and self.turns == self.last + 1


@dataclass(frozen=True, slots=True)
class Planned:
    """A conversation that is a row: the checkpoint whose version it is, its last turn, and its status."""

    checkpoint: str | None
    restart: int
    last: int
    status: str


def conversation_rows(
    config: ExportConfig, stats: ExportStats, run_lines: Lines
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The line of each conversation's last turn (with --row-per-turn, of each of its turns), with the columns
    a conversation row adds, in the order those lines were written; every line and conversation counted into
    `stats`."""
    plan = _plan(_versions(config, stats, run_lines), config, stats)
    stats.seen.clear()  # the first pass's; the second keeps its own
    scratch = ExportStats()
    for i, run in enumerate(config.runs):
        for obj in run_lines(config, scratch, run):
            if dropped(config, obj):
                continue  # counted by the first pass
            planned = plan.get(_key(i, obj))
            if planned is None or (planned.checkpoint, planned.restart) != _version(obj):
                stats.turns_left_out += 1
                continue
            stats.add(obj)
            last = obj["turn"] == planned.last
            stats.conversations[planned.status] += last
            if last or config.row_per_turn:
                stats.row(obj)
                yield obj, {"conversation": planned.status, "turns": obj["turn"] + 1}


def _versions(config: ExportConfig, stats: ExportStats, run_lines: Lines) -> dict[int, list[Version]]:
    """The first pass: each conversation's versions, by conversation key; dropped lines counted."""
    found: dict[int, list[Version]] = {}
    for i, run in enumerate(config.runs):
        ranks = {c.fingerprint: n for n, c in enumerate(recorded(read_manifest(run)))}
        gens = generations(run)
        for obj in run_lines(config, stats, run):
            versions = found.setdefault(_key(i, obj), [])
            checkpoint, restart = _version(obj)
            version = next((v for v in versions if (v.checkpoint, v.restart) == (checkpoint, restart)), None)
            if version is None:
                version = Version(checkpoint, ranks.get(checkpoint or "", -1), restart=restart)
                version.superseded = gens.superseded_line(obj)
                versions.append(version)
            turn = obj["turn"]
            version.turns += 1
            version.first |= turn == 0
            if turn > version.last:
                version.last, version.complete = turn, obj.get("turns") == turn + 1
            if dropped(config, obj):
                stats.truncated += 1
                version.dropped = True
    return found


def _plan(found: dict[int, list[Version]], config: ExportConfig, stats: ExportStats) -> dict[int, Planned]:
    """The conversations that are rows; every other version counted as left out, with its reason."""
    plan: dict[int, Planned] = {}
    for key, versions in found.items():
        whole = [v for v in versions if v.whole and not v.superseded]
        chosen = max(whole, key=lambda v: (v.restart, v.rank)) if whole else None
        for v in versions:
            if v is not chosen:
                why = "restarted" if v.superseded else "superseded" if v.whole else "continued"
                stats.conversations_left_out[why] += 1
        if chosen is None:
            continue
        if chosen.dropped:
            stats.conversations_left_out["hole"] += 1
        elif config.drop_incomplete and not chosen.complete:
            stats.conversations_left_out["ended_early"] += 1
        else:
            status = "complete" if chosen.complete else "ended_early"
            plan[key] = Planned(chosen.checkpoint, chosen.restart, chosen.last, status)
    return plan


def _key(run: int, obj: dict[str, Any]) -> int:
    """The key of a line's conversation, (id, sample), in the run-th run of the export."""
    place = record_place(obj)
    assert place is not None
    key = sample_key(id_key(obj["id"]), place[0])
    return key ^ key_of(f"run {run}".encode()) if run else key


def _version(obj: dict[str, Any]) -> tuple[str | None, int]:
    """Which version of its conversation a line is: its checkpoint and its restart generation (samples.py)."""
    checkpoint, place = obj.get("checkpoint"), record_place(obj)
    assert place is not None
    return (checkpoint if isinstance(checkpoint, str) and checkpoint else None), place[2]


def conversation_features(columns: tuple[str, ...], types: dict[str, str]) -> Any:
    """The datasets schema of conversation rows: every turn as trainrow.py writes it, and the conversation columns."""
    import datasets

    return datasets.Features(
        {
            "messages": [turn_features()],
            **dict.fromkeys(REQUEST_COLUMNS, datasets.Value("string")),
            **{c: datasets.Value(t) for c, t in TURN_COLUMNS.items()},
            **{c: datasets.Value(types.get(c, "string")) for c in columns},
        }
    )
