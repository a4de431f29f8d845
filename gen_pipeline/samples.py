"""K completions per prompt: the identity of each sample, its seed, and what a resume still owes.

Each completion is keyed `(id, sample)`, `sample` in 0..K-1. Its 64-bit key is `id_key(id)` for
sample 0 and a hash of (that key, sample) otherwise, so a line written before samples existed (no
`sample` field: sample 0) keeps the key it always had, and the done-key index, the input cursor and
the ledger keep one int per line. A row is settled when each of its K sample keys is done (or under a
permanent ledger reason); a resume sends only the samples that are not.

Restarts. An (id, sample) may be answered again from scratch: under `--turns all`, a conversation whose
earlier user turns changed in the input since it was begun, or whose answers another checkpoint than the
one now serving gave (engine.reader); under `--turns last`, a row answered again on purpose. The new answers
are restart generation g >= 1 of that (id, sample): each of their lines, output and ledger alike, carries
`"restart": g` right after `sample` (and `turn`), and their keys are generation g's (`restart_key`, under
`place_key`). In one run directory the lines of an (id, sample)'s highest generation stand; those of a lower
one are superseded: resume (which turn comes next, what is settled), `status`, the ledger's reasons and
`export` read them as if they were not there, and the output stays append-only. Generation 0 writes no
field, so every line written before restarts existed keeps its key. The generations found are kept per
(id, sample) key, sample_key's (rundir.donekeys.FileKeys.restarts, resume.settled.ResumeState.generation);
with one line per (id, sample) the same holds, turn 0's key being the (id, sample, generation) key.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

import orjson

from .errors import ConfigError
from .records import MAX_SAMPLES, MAX_TURNS, RowId

SEED_MODULUS = 2**31  # servers take 32-bit signed seeds

# `{"id": X, "sample": N,` (and `"turn": T,` after it, under --turns all, then `"restart": G,` for a restart
# generation) at the start of a line: how our own output writes a completion.
_LEADING_SAMPLE = re.compile(
    rb'\{"id":\s*(?:"[^"\\]*"|-?[1-9]\d*|0)\s*,\s*"sample":\s*(0|[1-9]\d{0,8})\s*'
    rb'(?:,\s*"turn":\s*(0|[1-9]\d{0,8})\s*)?(?:,\s*"restart":\s*(0|[1-9]\d{0,8})\s*)?(?:\}|,(?!\s*"(?:turn|restart)"))'
)
# The most restart generations of one (id, sample).
MAX_RESTARTS = 1 << 30

Place = tuple[int, int, int]  # (sample, turn, restart generation) of a line


def sample_key(key: int, sample: int) -> int:
    """The key of one sample of the row whose id key is `key` (sample 0: the id key itself)."""
    if sample == 0:
        return key
    data = key.to_bytes(8, "little") + sample.to_bytes(4, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"gp-sample").digest(), "little")


def turn_key(key: int, turn: int) -> int:
    """The key of one turn of a conversation whose (id, sample) key is `key` (turn 0: that key itself, so a
    --turns all run's first answers have the keys a --turns last run's answers have)."""
    if turn == 0:
        return key
    data = key.to_bytes(8, "little") + turn.to_bytes(4, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"gp-turn").digest(), "little")


def restart_key(key: int, restart: int) -> int:
    """The key of restart generation `restart` of the (id, sample) whose key is `key` (generation 0: that key
    itself, so the lines written before restarts keep theirs)."""
    if restart == 0:
        return key
    data = key.to_bytes(8, "little") + restart.to_bytes(4, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"gp-restart").digest(), "little")


def note_generation(found: dict[int, int], key: int, place: Place) -> None:
    """Record in `found` (sample_key -> newest generation) the restart generation of a line of the row whose
    id key is `key`, when it has one."""
    sample, _, restart = place
    if restart and restart > found.get(plain := sample_key(key, sample), 0):
        found[plain] = restart


def valid_sample(value: Any) -> bool:
    """Whether a line's `sample` value is one we could have written."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SAMPLES


def line_sample(raw: bytes) -> int | None:
    """The `sample` of one output line (0 when it has none, an older line); None when it is not valid."""
    place = line_place(raw)
    return place[0] if place is not None else None


def line_place(raw: bytes) -> Place | None:
    """(`sample`, `turn`, `restart`) of one output line (0 for each it has not); None when one is not valid.

    Our own lines carry them right after the id and are read without parsing; any other line that
    mentions "sample", "turn" or "restart" is parsed in full."""
    m = _LEADING_SAMPLE.match(raw)
    if m is not None:
        sample, turn, restart = int(m[1]), int(m[2] or 0), int(m[3] or 0)
        return (sample, turn, restart) if sample < MAX_SAMPLES and turn < MAX_TURNS and restart < MAX_RESTARTS else None
    if b'"sample"' not in raw and b'"turn"' not in raw and b'"restart"' not in raw:
        return 0, 0, 0
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record_place(obj) if isinstance(obj, dict) else None


def record_place(obj: dict[str, Any]) -> Place | None:
    """(`sample`, `turn`, `restart`) of a parsed output or ledger line (0 when absent); None when one is not
    valid."""
    sample, turn, restart = obj.get("sample", 0), obj.get("turn", 0), obj.get("restart", 0)
    if not (valid_sample(sample) and _below(turn, MAX_TURNS) and _below(restart, MAX_RESTARTS)):
        return None
    return sample, turn, restart


def _below(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


def place_key(key: int, sample: int, turn: int, restart: int = 0) -> int:
    """The key of (id, sample, turn) of restart generation `restart` for the row whose id key is `key`."""
    return turn_key(restart_key(sample_key(key, sample), restart), turn)


def sample_seed(seed: int, row_id: RowId, sample: int) -> int:
    """The seed one sample is sent with: a hash of (the run's or row's seed, id, sample), so a sample
    resent after a crash asks the server for the same thing."""
    data = orjson.dumps([seed, str(row_id), sample])
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % SEED_MODULUS


def turn_seed(seed: int, row_id: RowId, sample: int, turn: int) -> int:
    """The seed turn `turn` > 0 of one sample's conversation is sent with (turn 0: sample_seed's)."""
    data = orjson.dumps([seed, str(row_id), sample, turn])
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % SEED_MODULUS


def answer_seed(seed: int, row_id: RowId, sample: int, turn: int, attempt: int) -> int:
    """The seed attempt `attempt` of one answer is sent with: attempt 0 is the sample's (or turn's) own seed;
    a resample of a rejected answer (attempt 1, 2, ...) hashes the attempt in too, so it is another draw, and a
    rerun that resends the same attempt asks for the same thing."""
    if attempt == 0:
        return sample_seed(seed, row_id, sample) if turn == 0 else turn_seed(seed, row_id, sample, turn)
    data = orjson.dumps([seed, str(row_id), sample, turn, attempt, "resample"])
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") % SEED_MODULUS


def check_samples(value: Any, what: str) -> int:
    """A samples count from a flag or a row, or ValueError saying why not."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SAMPLES:
        raise ValueError(f"{what} must be an integer from 1 to {MAX_SAMPLES}, not {value!r}")
    return value


def samples_from_n(sampling: dict[str, Any], samples: int | None, where: str) -> tuple[dict[str, Any], int | None]:
    """`sampling` without `n`, and the samples count it asks for: `n` becomes samples, never silently
    dropped. ValueError when it contradicts an explicit samples count."""
    if "n" not in sampling:
        return sampling, samples
    n = check_samples(sampling["n"], f'"n" in {where}')
    if samples is not None and samples != n:
        raise ValueError(f'"n": {n} in {where} contradicts samples {samples}; keep one (use samples)')
    return {k: v for k, v in sampling.items() if k != "n"}, n


def run_samples(sampling: dict[str, Any], samples: int | None) -> tuple[dict[str, Any], int]:
    """--sampling and --samples as the run uses them (ConfigError on a contradiction)."""
    try:
        rest, k = samples_from_n(sampling, samples, "--sampling")
        return rest, check_samples(1 if k is None else k, "--samples")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def row_samples(row: dict[str, Any], sampling: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int | None]:
    """A row's own `samples` and `sampling` (`n` there becomes its samples); ValueError when invalid."""
    own = check_samples(row["samples"], "samples") if row.get("samples") is not None else None
    if sampling is None:
        return None, own
    rest, k = samples_from_n(sampling, own, "the row's sampling")
    return rest, k


class Settles(Protocol):
    """What the resume state answers about one key (resume.settled.ResumeState)."""

    def settled(self, key: int, retry: frozenset[str]) -> str | None: ...

    def generation(self, key: int) -> int:
        """The newest restart generation of the (id, sample) whose sample_key is `key` (0: none)."""


def current_key(state: Settles, key: int, sample: int) -> int:
    """The (id, sample) key of the row with id key `key` in its newest restart generation."""
    plain = sample_key(key, sample)
    return restart_key(plain, state.generation(plain))


def pending(state: Settles, key: int, k: int, retry: frozenset[str]) -> tuple[int, ...]:
    """The samples of the row with id key `key` that still need a request."""
    return tuple(s for s in range(k) if state.settled(current_key(state, key, s), retry) is None)


def row_reason(state: Settles, key: int, k: int, retry: frozenset[str]) -> str | None:
    """Why a row needs no request ("done" when every sample is; else the first sample's permanent
    ledger reason), or None when one of its samples still does."""
    reason = "done"
    for s in range(k):
        why = state.settled(current_key(state, key, s), retry)
        if why is None:
            return None
        if why != "done" and reason == "done":
            reason = why
    return reason


def truncated_in(finish_reason: str | None, content: str, reasoning: str | None) -> str | None:
    """Where a completion cut at max_tokens stopped: "reasoning" (still thinking, no answer yet) or
    "answer"; None when it was not cut."""
    if finish_reason != "length":
        return None
    if not content.strip() and reasoning:
        return "reasoning"
    if content.lstrip().startswith("<think>") and "</think>" not in content:
        return "reasoning"  # no reasoning parser on the server: the thinking is still open in content
    return "answer"
