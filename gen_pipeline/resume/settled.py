"""Is this row settled? What earlier runs in a run directory settled (`scan`: the output's keys, the ledger's
newest reason per key, the bad rows ledgered, the rejected answers spent), and one pass over the input against
it (`SettledRows`). The input cursor (cursor.py) lets a pass start after rows all settled; the ledger's reasons
are read back in ledger.py.

Why a row was skipped, read here and in inputs/source.py alone:
- its id is settled (`SettledRows.owner`: "done", or a permanent ledger reason --retry-failed does not reopen),
  and the source skips it without parsing it; a later row of an id repeats it or conflicts with it (the source);
- it lies before the input cursor's mark: counted by reason, never read (cursor.py);
- it is a bad row an earlier run ledgered (`SettledRows.bad_row`);
- every sample it owes is settled (`SettledRows.owed`), or under --turns all every conversation is complete or
  ended (`SettledRows.conversations`);
- it is another claimer's (the source's `mine`: shards/feed.py holds the claims).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import PERMANENT_REASONS, REJECT_REASONS, Prompt, Spent, id_key
from ..rundir.donekeys import FileKeys, KeyMap, KeySet, completion_keys, union
from ..rundir.layout import RunDir
from ..rundir.store import iter_json_lines, repair_all
from ..samples import (
    note_generation,
    pending,
    place_key,
    record_place,
    restart_key,
    row_reason,
    sample_key,
    turn_key,
)


@dataclass
class Conversations:
    """What a row's conversations still owe (--turns all): per sample, the first turn to send, and the restart
    generation it is in (samples.py) when above 0; the conversations that ended under a permanent reason."""

    start: dict[int, int] = field(default_factory=dict)
    ended: dict[int, tuple[int, str]] = field(default_factory=dict)  # sample -> (turn, permanent reason)
    restart: dict[int, int] = field(default_factory=dict)  # sample -> its newest restart generation, if > 0


class SettledRows:
    """One pass over the input against the resume state: is this id settled, and which row owns it?

    `owner` asks, in turn, the owners of an input cursor's prefix (`prior`: the pass starts after it), the
    resume state, and the rows this pass met. `visit` answers the resume state's part with one lookup and
    remembers where the first row with a settled id stood, so a later row with that id can be compared with
    it: 8 bytes per done id, in an array beside the KeySet (a dict of offsets took ~80 bytes a row, 50 MB at
    650k rows).
    """

    def __init__(self, state: ResumeState, retry: frozenset[str], prior: KeyMap | None = None) -> None:
        self.state, self.retry, self.prior = state, retry, prior
        self.offsets = array("Q", bytes(8 * len(state.done)))  # offset + 1; 0 = not met yet
        self.other: dict[int, int] = {}  # ids settled by a permanent ledger reason (few)
        self.seen = KeyMap()  # the other ids: key -> offset of the row that owns it, ~20 bytes a row

    def owner(self, key: int, offset: int) -> tuple[int | None, str | None]:
        """(offset of the row that owns this id, or None when the row at `offset` is its first), and why that
        first row needs no request or None (inputs.source.Owners). The first row with an id becomes its owner:
        in the done keys' offsets, among the few ids a permanent ledger reason settles, or among the others."""
        if self.prior is not None and (owner := self.prior.get(key)) is not None:
            return owner, None
        i = self.state.done.position(key)
        if i >= 0:
            if before := self.offsets[i]:
                return before - 1, None
            self.offsets[i] = offset + 1
            reason = self.state.row_settled(key, self.retry)
        elif (reason := self.state.row_settled(key, self.retry)) is not None:
            if (before_other := self.other.get(key)) is not None:
                return before_other, None
            self.other[key] = offset
        if reason is None:
            return self.seen.first(key, offset), None
        return None, reason

    def conversations(self, prompt: Prompt, samples: int) -> tuple[Conversations, str]:
        """--turns all: per sample, the first turn not settled (done, or ended under a permanent ledger reason);
        and why the row needs nothing when no sample owes a turn ("done", or the first ended conversation's)."""
        turns = len(prompt.turns or ())
        found, reason = Conversations(), "done"
        for s in range(samples):
            plain = sample_key(prompt.key, s)
            if restart := self.state.generation(plain):
                found.restart[s] = restart
            conversation = restart_key(plain, restart)
            for t in range(turns):
                why = self.state.settled(turn_key(conversation, t), self.retry)
                if why == "done":
                    continue
                if why is None:
                    found.start[s] = t
                else:
                    found.ended[s] = (t, why)
                    reason = why if reason == "done" else reason
                break
        return found, reason

    def bad_row(self, source: str, line: int) -> bool:
        """Whether an earlier run ledgered the bad row at `line` of the input named `source` (not reopened by
        --retry-failed bad_input): it is skipped, never ledgered twice."""
        return (source, line) in self.state.bad_lines and "bad_input" not in self.retry

    def owed(self, key: int, samples: int) -> tuple[tuple[int, ...], str]:
        """The samples of the row with id key `key` (of `samples`) that still need a request; and, when none
        does, why the row is skipped ("done", or the first sample's permanent ledger reason)."""
        found = pending(self.state, key, samples, self.retry)
        return found, "" if found else row_reason(self.state, key, samples, self.retry) or "done"


@dataclass
class ResumeState:
    """What earlier runs in this directory already settled."""

    done: KeySet = field(default_factory=KeySet)
    last_reason: dict[int, str] = field(default_factory=dict)
    bad_lines: set[tuple[str, int]] = field(default_factory=set)
    corrupt_lines: list[str] = field(default_factory=list)
    torn_bytes: int = 0
    files: dict[str, FileKeys] = field(default_factory=dict)  # output file name -> what it holds
    samples: int = 1  # the run's --samples: a row is settled when all of them are
    later_samples_ledgered: bool = False  # a ledger entry names a sample or turn > 0 (the cursor checks key 0 only)
    turns: bool = False  # --turns all: a row's settledness needs its turns (the row parsed: engine.reader._settle)
    rejects: dict[int, Spent] = field(default_factory=dict)  # key not done -> its rejected answers (rejected.jsonl)
    restarts: dict[int, int] = field(default_factory=dict)  # sample_key -> newest restart generation (samples.py)

    def generation(self, key: int) -> int:
        """The newest restart generation of the (id, sample) whose sample_key is `key` (0: none)."""
        return self.restarts.get(key, 0) if self.restarts else 0

    def settled(self, key: int, retry: frozenset[str]) -> str | None:
        """Why this (id, sample) key needs no request now ("done", or its permanent reason), or None."""
        if key in self.done:
            return "done"
        reason = self.last_reason.get(key)
        if reason in PERMANENT_REASONS and reason not in retry:
            return reason
        return None

    def row_settled(self, key: int, retry: frozenset[str]) -> str | None:
        """Why the row with id key `key` needs no request now (each of its --samples settled), or None
        (always under --turns all: how many turns a conversation has is known only from its row)."""
        if self.turns:
            return None
        if self.samples == 1:
            return self.settled(restart_key(key, self.generation(key)), retry)
        return row_reason(self, key, self.samples, retry)

    def rows(self, retry: frozenset[str], prior: KeyMap | None = None) -> SettledRows:
        """A pass over the input (`--retry-failed` reasons count as not settled), after an input cursor's
        prefix whose owners are `prior`."""
        return SettledRows(self, retry, prior)


def scan(
    out: Path,
    repair: bool = True,
    mine: Callable[[int], bool] | None = None,
    save_index: bool = True,
    shards: Iterable[int] | None = None,
) -> ResumeState:
    """Read every output and ledger file into compact key sets.

    `repair=False` only reads (check, and worker processes whose parent repaired). `mine(key)` keeps only
    one worker's ids of the ledger; the output's keys are all kept (a sample's key does not tell its
    row's shard, and another worker's keys are never asked about). With several ledger files the newest
    entry per (id, sample) (by its `time`) decides. Output files are read from where `donekeys`' index
    says the last read ended (`save_index`: move that mark). `shards`: of the claimed shards' files, read
    only these (a claimer's keys are in its shards' files and the top-level ones, never in another shard's).
    """
    state = ResumeState()
    if repair:
        state.torn_bytes = repair_all(out)
    done = array("Q")
    for path in RunDir(out).completion_files(shards):
        found = completion_keys(path, save_index)
        state.files[str(path.relative_to(out))] = found
        state.corrupt_lines += [f"{path.relative_to(out)}:{n}" for n in found.corrupt]
        done = union(done, found.keys)
        for plain, restart in found.restarts.items():
            note_generation(state.restarts, plain, (0, 0, restart))  # (a sample_key is sample 0's own key)
    state.done = KeySet(done, presorted=True)
    del done
    newest: dict[int, float] = {}
    ledgered: dict[int, float] = {}  # key -> its newest ledger entry for rejected answers (a new round after it)
    for path in RunDir(out).failure_files(shards):
        for n, obj in iter_json_lines(path):
            if obj is None or "reason" not in obj:
                state.corrupt_lines.append(f"{path.relative_to(out)}:{n}")
            elif obj["reason"] == "bad_input" and obj.get("line") is not None:
                state.bad_lines.add((str(obj.get("source")), int(obj["line"])))
            elif obj.get("id") is not None and (place := record_place(obj)) is not None:
                row, when = id_key(obj["id"]), float(obj.get("time") or 0.0)
                key = place_key(row, *place)
                state.later_samples_ledgered |= place != (0, 0, 0)
                note_generation(state.restarts, row, place)
                if (mine is None or mine(row)) and when >= newest.get(key, float("-inf")):
                    newest[key], state.last_reason[key] = when, obj["reason"]
                if obj["reason"] in REJECT_REASONS:
                    ledgered[key] = max(when, ledgered.get(key, float("-inf")))
    state.rejects = spent(out, state.done, ledgered, mine, shards)
    return state


def spent(
    out: Path, done: KeySet, ledgered: dict[int, float], mine: Callable[[int], bool] | None, shards: Any
) -> dict[int, Spent]:
    """The rejected answers of each key not done (rejected.jsonl read back): how many, how many since the key
    was last ledgered for them (the bound's round), and the last one."""
    found: dict[int, Spent] = {}
    for path in RunDir(out).rejected_files(shards):
        for _, obj in iter_json_lines(path):
            place = record_place(obj) if obj is not None and obj.get("id") is not None else None
            if obj is None or place is None:
                continue
            row = id_key(obj["id"])
            key = place_key(row, *place)
            if key in done or (mine is not None and not mine(row)):
                continue
            total, rounds = found[key][:2] if key in found else (0, 0)
            fresh = float(obj.get("time") or 0.0) > ledgered.get(key, float("-inf"))
            reason, check = str(obj.get("reason") or "invalid"), str(obj.get("check") or "")
            found[key] = Spent(total + 1, rounds + fresh, reason, check, str(obj.get("detail") or ""))
    return found
