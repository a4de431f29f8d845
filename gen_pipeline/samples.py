"""K completions per prompt: the identity of each sample, its seed, and what a resume still owes.

Each completion is keyed `(id, sample)`, `sample` in 0..K-1. Its 64-bit key is `id_key(id)` for
sample 0 and a hash of (that key, sample) otherwise, so a line written before samples existed (no
`sample` field: sample 0) keeps the key it always had, and the done-key index, the input cursor and
the ledger keep one int per line. A row is settled when each of its K sample keys is done (or under a
permanent ledger reason); a resume sends only the samples that are not.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

import orjson

from .errors import ConfigError
from .records import MAX_SAMPLES, MAX_TURNS, RowId

SEED_MODULUS = 2**31  # servers take 32-bit signed seeds

# `{"id": X, "sample": N,` (and `"turn": T,` after it, under --turns all) at the start of a line: how our
# own output writes a completion.
_LEADING_SAMPLE = re.compile(
    rb'\{"id":\s*(?:"[^"\\]*"|-?[1-9]\d*|0)\s*,\s*"sample":\s*(0|[1-9]\d{0,8})\s*'
    rb'(?:,\s*"turn":\s*(0|[1-9]\d{0,8})\s*)?[,}]'
)


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


def valid_sample(value: Any) -> bool:
    """Whether a line's `sample` value is one we could have written."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SAMPLES


def line_sample(raw: bytes) -> int | None:
    """The `sample` of one output line (0 when it has none, an older line); None when it is not valid."""
    place = line_place(raw)
    return place[0] if place is not None else None


def line_place(raw: bytes) -> tuple[int, int] | None:
    """(`sample`, `turn`) of one output line (0 for either when it has none); None when one is not valid.

    Our own lines carry them right after the id and are read without parsing; any other line that
    mentions "sample" or "turn" is parsed in full."""
    m = _LEADING_SAMPLE.match(raw)
    if m is not None:
        sample, turn = int(m[1]), int(m[2] or 0)
        return (sample, turn) if sample < MAX_SAMPLES and turn < MAX_TURNS else None
    if b'"sample"' not in raw and b'"turn"' not in raw:
        return 0, 0
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return record_place(obj) if isinstance(obj, dict) else None


def record_place(obj: dict[str, Any]) -> tuple[int, int] | None:
    """(`sample`, `turn`) of a parsed output or ledger line (0 when absent); None when one is not valid."""
    sample, turn = obj.get("sample", 0), obj.get("turn", 0)
    valid_turn = isinstance(turn, int) and not isinstance(turn, bool) and 0 <= turn < MAX_TURNS
    return (sample, turn) if valid_sample(sample) and valid_turn else None


def place_key(key: int, sample: int, turn: int) -> int:
    """The key of (id, sample, turn) for the row whose id key is `key`."""
    return turn_key(sample_key(key, sample), turn)


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
    """What the resume state answers about one key (rundir.store.ResumeState)."""

    def settled(self, key: int, retry: frozenset[str]) -> str | None: ...


def pending(state: Settles, key: int, k: int, retry: frozenset[str]) -> tuple[int, ...]:
    """The samples of the row with id key `key` that still need a request."""
    return tuple(s for s in range(k) if state.settled(sample_key(key, s), retry) is None)


def row_reason(state: Settles, key: int, k: int, retry: frozenset[str]) -> str | None:
    """Why a row needs no request ("done" when every sample is; else the first sample's permanent
    ledger reason), or None when one of its samples still does."""
    reason = "done"
    for s in range(k):
        why = state.settled(sample_key(key, s), retry)
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
