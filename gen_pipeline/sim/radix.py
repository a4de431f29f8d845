"""A port's prefix cache counted in tokens, as SGLang's radix cache keeps it.

A radix tree over token ids: each edge holds a run of ids, a request's prompt is matched against it from the
root and only the unmatched tail is prefilled. What a request computed (its prompt, then its prompt and each
answer) is inserted. The tree holds at most `capacity` tokens; past it the least recently used leaves are
evicted, one at a time, as SGLang's `evict` does (a parent left without children becomes a leaf itself).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "key", "last", "parent")

    def __init__(self, key: list[int], parent: _Node | None, last: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last = last


def _common(a: Sequence[int], start: int, key: list[int]) -> int:
    """How many ids of `key` equal those of `a` from `start` on."""
    end = min(len(key), len(a) - start)
    if a[start : start + end] == key[:end]:
        return end
    i = 0
    while i < end and a[start + i] == key[i]:
        i += 1
    return i


class RadixCache:
    """Token prefixes a port holds, at most `capacity` tokens (0: none), LRU-evicted by leaf."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = 0  # ids held now
        self._clock = itertools.count(1)
        self._root = _Node([], None, 0)

    def match(self, ids: Sequence[int]) -> int:
        """How many leading ids of `ids` the cache holds; the nodes matched count as used now."""
        now, node, i = next(self._clock), self._root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                break
            same = _common(ids, i, child.key)
            child.last = now
            i += same
            if same < len(child.key):
                break
            node = child
        return i

    def insert(self, ids: Sequence[int]) -> None:
        """Hold `ids` (splitting an edge where they leave it), then evict down to the capacity."""
        if self.capacity <= 0:
            return
        now, node, i = next(self._clock), self._root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                node.children[ids[i]] = _Node(list(ids[i:]), node, now)
                self.tokens += len(ids) - i
                break
            same = _common(ids, i, child.key)
            if same < len(child.key):
                child = self._split(child, same)
            child.last = now
            node, i = child, i + same
        self._evict()

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` ids; the new upper node is returned."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:at], parent, child.last)
        parent.children[child.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def _evict(self) -> None:
        """Drop least recently used leaves until at most `capacity` tokens are held."""
        if self.tokens <= self.capacity:
            return
        leaves = [(n.last, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(leaves)
        while self.tokens > self.capacity and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.tokens -= len(leaf.key)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        """Every node but the root."""
        out, todo = [], list(self._root.children.values())
        while todo:
            node = todo.pop()
            out.append(node)
            todo.extend(node.children.values())
        return out
