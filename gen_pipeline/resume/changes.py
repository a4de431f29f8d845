"""Changed inputs: an answered row whose prompt in the input is not the prompt it was answered with.

A row's id says it is answered; its output line says with which prompt (the line's `messages` and `tools`,
as sent). When a resume reads a row whose id is done, it compares the prompt it would send now (shaped:
--template, --system-prompt, conversations as they are) with the recorded one, by an 8-byte digest of each.
A row that differs is counted and named in the summary (and by `check`); with `--redo-changed` it is answered
again as the next restart generation of each of its answered samples (samples.py: the output stays
append-only, resume and export read the newer line in place of the older).

The recorded digests are read from the output files' ends backwards, as far as the lookups need (a digest per
line of a row, ~20 bytes each). A resume at the input cursor reads few answered rows (those after its mark,
answered last: their lines are near the end); one that reads the input from the top (an edited input,
`--redo-changed`, a claimer) compares every answered row it reads, and so reads the output files once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from ..digests import prompt_digest
from ..records import Prompt, id_key
from ..rundir.donekeys import KeyMap, line_id
from ..samples import Settles, current_key, line_place, place_key, sample_key

TAIL_BLOCK = 4 << 20  # bytes of an output file read backwards at a time


class RecordedPrompts:
    """The digest of the prompt each answered (id, sample, restart generation) was sent with, read from the output
    files from their ends backwards, a block at a time, as far as a lookup needs: the rows a resume at its
    cursor compares were answered last, so their lines are near the end."""

    def __init__(self, files: Iterable[Path]) -> None:
        self.tails = [_Tail(p) for p in files if p.exists()]
        self.digests = KeyMap()
        self.rows = KeyMap()  # the row digest of each key whose line has one (digests.py)

    def digest(self, key: int) -> int | None:
        """The recorded prompt's digest of the (id, sample, generation) whose turn-0 key is `key`."""
        found = self.digests.get(key)
        while found is None and (open_ := [t for t in self.tails if not t.done]):
            for tail in open_:
                tail.read_block(self.digests, self.rows)
            found = self.digests.get(key)
        return found

    def row(self, key: int) -> int | None:
        """The recorded row digest of the (id, sample, generation) whose turn-0 key is `key` (None: its line has
        none, or there is no line)."""
        return self.rows.get(key) if self.digest(key) is not None else None


class _Tail:
    """One output file read backwards a block at a time; each whole line's prompt digest goes to a KeyMap."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = path.stat().st_size
        self.carry = b""  # the start of a line whose beginning lies in the block before
        self.done = self.pos == 0

    def read_block(self, digests: KeyMap, rows: KeyMap) -> None:
        start = max(0, self.pos - TAIL_BLOCK)
        with self.path.open("rb") as f:
            f.seek(start)
            data = f.read(self.pos - start) + self.carry
        self.pos, self.done = start, start == 0
        if start > 0:
            cut = data.find(b"\n") + 1  # the block's first line may have begun before it
            if cut == 0:
                self.carry = data
                return
            self.carry, data = data[:cut], data[cut:]
        for raw in data.splitlines(keepends=True):
            _note(raw, digests, rows)


# The end of a row's line written since the digest was recorded (records.Completion.to_line): its last field,
# the top level's (a nested object would end in "}}"), read without parsing the line.
_TRAILING_DIGEST = re.compile(rb'(?:,"row_digest":"([0-9a-f]{16})")?,"prompt_digest":"([0-9a-f]{16})"\}\n\Z')
_TAIL_BYTES = 70  # the most those two fields and the line's end take


def _note(raw: bytes, digests: KeyMap, rows: KeyMap) -> None:
    """Record the prompt digest of one output line (a row's: a --turns all line is a turn of a conversation)."""
    place = line_place(raw) if raw.endswith(b"\n") else None
    rid = line_id(raw) if place is not None else None
    if rid is None or place is None:
        return
    key = place_key(id_key(rid), place[0], 0, place[2])
    if key in digests:  # read backwards: the newest line of a key comes first
        return
    tail = _TRAILING_DIGEST.search(raw, len(raw) - _TAIL_BYTES)
    if tail is not None and place[1] == 0:  # written with its digests, and never with a turn
        digests[key] = int(tail[2], 16)
        if tail[1] is not None:
            rows[key] = int(tail[1], 16)
        return
    obj = orjson.loads(raw)  # a line written before the digest was: its prompt digested here
    if isinstance(obj, dict) and "turn" not in obj and isinstance(obj.get("messages"), list):
        digests[key] = prompt_digest(obj["messages"], obj.get("tools"))


def changed_samples(
    prompt: Prompt, samples: int, state: Settles, recorded: RecordedPrompts, retry: frozenset[str]
) -> tuple[int, ...]:
    """The answered samples of `prompt` (done in their newest generation) whose recorded prompt is not the
    one it holds now (shaped as it is sent); a sample whose line cannot be read is not judged."""
    now = prompt_digest(prompt.messages, prompt.tools)
    changed = []
    for s in range(samples):
        key = current_key(state, prompt.key, s)
        if state.settled(key, retry) != "done":
            continue
        then = recorded.digest(key)
        if then is not None and then != now:
            changed.append(s)
    return tuple(changed)


def same_row(
    key: int, digest: int, samples: int, state: Settles, recorded: RecordedPrompts, retry: frozenset[str]
) -> bool:
    """Whether each of the row's `samples` is done, in its newest generation, from the very row bytes (under
    the same shaping) whose digest is `digest`: its prompt is then the one it was sent, unparsed."""
    for s in range(samples):
        current = current_key(state, key, s)
        if state.settled(current, retry) != "done" or recorded.row(current) != digest:
            return False
    return True


def next_generations(prompt: Prompt, samples: Iterable[int], state: Settles) -> dict[int, int]:
    """Each sample's next restart generation (the one its new answer is written under)."""
    return {s: state.generation(sample_key(prompt.key, s)) + 1 for s in samples}


def another_input(out: Path, before: Any, now: Any) -> str | None:
    """The warning for a run directory resumed with another --input than its last run's manifest names (None:
    the same one; a relative path given from elsewhere counts as the same when its file name is)."""
    if not isinstance(before, str) or not isinstance(now, str) or before == now:
        return None
    if Path(before).name == Path(now).name and not (Path(before).is_absolute() and Path(now).is_absolute()):
        return None
    return (
        f"{out} holds rows answered from another input ({before}); this run adds those of {now}: an id both hold "
        "is answered once (its prompt is compared with the answered one: --redo-changed answers it again)"
    )
