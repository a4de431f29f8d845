"""Which server's prefix cache likely holds a prompt's leading messages: a client-side model of SGLang's radix
cache, by whole messages.

A prompt is a chain of digests, one per message boundary (the first message, the first two, ...), each with
the characters up to it. A server is credited with every chain it was sent, in an LRU bounded in characters
(its KV pool, in tokens, times CHARS_PER_TOKEN: what it can hold at most), as its radix cache evicts the
least recently used prefixes; where the server reports the cached part of each prompt, that bound follows what
it really keeps (PrefixModel.observed). The match of a prompt on a server is the characters of the longest link it
holds. This only steers the choice among servers with a free slot (balancer.py); nothing counted depends on it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

CHARS_PER_TOKEN = 4  # a generous figure: the model holds at most what the server can
DEFAULT_POOL_TOKENS = 200_000  # a server that gives no KV pool size
MIN_SHARED_CHARS = 200  # links shorter than this are left out of a chain
MIN_CAPACITY_CHARS = 4096  # what the model keeps however small the server's reports say its cache is


class Holder(Protocol):
    """What steering reads of a server (state.ServerState): its prefix model, its slots and those taken."""

    @property
    def prefixes(self) -> PrefixModel: ...

    @property
    def capacity(self) -> int: ...

    def taken(self) -> int: ...


S = TypeVar("S", bound=Holder)


@dataclass(frozen=True, slots=True)
class Link:
    """The prefix of a prompt up to one message boundary."""

    digest: bytes
    chars: int


def fleet_cache_tokens(pools: Iterable[int | None]) -> int:
    """The prefix-cache tokens of a fleet whose servers have these KV pools (None: not given, taken as the
    default, as PrefixModel does)."""
    return sum(pool or DEFAULT_POOL_TOKENS for pool in pools)


def chain(messages: Sequence[Any] | None) -> tuple[Link, ...]:
    """The links of a chat prompt (none for a completions prompt or a one-message prompt: only an identical
    prompt could share it, and samples of one prompt have their own way to one server)."""
    if not messages or len(messages) < 2:
        return ()
    out, h, chars = [], b"", 0
    for m in messages:
        raw = orjson.dumps(m, option=orjson.OPT_SORT_KEYS)
        h = hashlib.blake2b(h + raw, digest_size=16).digest()
        chars += len(raw)
        if chars >= MIN_SHARED_CHARS:  # a shorter prefix (a bare template header) is no reason to prefer
            out.append(Link(h, chars))
    return tuple(out)


def nearest(servers: Iterable[S], links: tuple[Link, ...]) -> S | None:
    """The first of `servers` holding the longest prefix of the prompt (None: none holds any)."""
    return _nearest(servers, links)[0]


def _nearest(servers: Iterable[S], links: tuple[Link, ...]) -> tuple[S | None, int]:
    best: S | None = None
    found = 0
    for server in servers:
        if (n := server.prefixes.match(links)) > found:
            best, found = server, n
    return best, found


def steer(candidates: list[S], serving: list[S], links: tuple[Link, ...], patient: bool) -> tuple[S | None, bool]:
    """Where a prompt should go among the servers that may take it now (`candidates`, the balancer's order),
    and whether it should rather wait: (server, wait). It goes where it would run at once if it can: among
    the candidates with a free running slot (with none anywhere, among all of them: their queue margins),
    the one holding the longest prefix any server in service (`serving`) holds takes it; when only a busy
    one holds that, a `patient` prompt waits for room there (the balancer bounds how long), else it takes
    the candidate holding the most. (None, False): no preference."""
    free = [s for s in candidates if s.taken() < s.capacity] or candidates
    best, n = _nearest(free, links)
    holder, longest = _nearest(serving, links)
    if best is not None and n >= longest:
        return best, False
    if patient and holder is not None:
        return None, True
    return best, False


class PrefixModel:
    """The prefixes one server was last sent, at most `capacity_chars` characters of them."""

    def __init__(self, pool_tokens: int | None) -> None:
        self.pool_tokens = pool_tokens or DEFAULT_POOL_TOKENS  # the server's KV pool, or what we take it for
        self.capacity_chars = self.pool_tokens * CHARS_PER_TOKEN
        self._held: OrderedDict[bytes, int] = OrderedDict()
        self._chars = 0

    def match(self, links: tuple[Link, ...]) -> int:
        """The characters of the longest of `links` held (0: none)."""
        for link in reversed(links):
            if link.digest in self._held:
                return link.chars
        return 0

    def observed(self, links: tuple[Link, ...], expected: int, cached_tokens: int, prompt_tokens: int) -> None:
        """What the server reported of one prompt (`usage.prompt_tokens_details.cached_tokens`) against the
        characters the model `expected` it to hold: the model's size follows the server's cache. Held for
        under half of that: the server keeps less than the model (a smaller cache, or one shared with the
        running requests), which shrinks to three quarters of what it holds; held beyond what was expected
        (the model had let it go), the model grows by the difference."""
        if not links or prompt_tokens <= 0:
            return
        held = cached_tokens * links[-1].chars // prompt_tokens  # in the chain's characters
        if expected >= MIN_SHARED_CHARS and 2 * held < expected:
            self.capacity_chars = max(MIN_CAPACITY_CHARS, self._chars * 3 // 4)
            self._evict()
        elif held > expected + MIN_SHARED_CHARS:
            self.capacity_chars += held - expected

    def note(self, links: tuple[Link, ...]) -> None:
        """The server was sent this prompt: every link is held, the shortest most recently (so a longer prefix
        leaves before the shorter ones it extends, as a radix tree's leaves do)."""
        held = self._held
        for i in range(len(links) - 1, -1, -1):
            link = links[i]
            if link.digest in held:
                held.move_to_end(link.digest)
                continue
            added = link.chars - (links[i - 1].chars if i else 0)  # a link stores only its own message
            held[link.digest] = added
            self._chars += added
        self._evict()

    def _evict(self) -> None:
        held = self._held
        while self._chars > self.capacity_chars and len(held) > 1:
            _, chars = held.popitem(last=False)
            self._chars -= chars
