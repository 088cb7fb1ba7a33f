"""What NPCs remember: memories by scope, searched exactly, bounded per scope and in all.

A scope is a name the game chooses: one NPC ("smith"), one NPC and one player ("smith/p1"), or
what several NPCs share ("village"). A session reads the scopes it names and nothing else, so a
memory of one player's conversation cannot reach another player's prompt by accident of search.

Exact search (one matrix product per scope) rather than an approximate index: a game's scopes
hold hundreds to thousands of memories, and at 10,000 of 512 dimensions the product takes about
a millisecond (bench/run.py memory prints it), with nothing to build, tune or go stale, and
exact answers. An index library (usearch, hnswlib) pays off from about 10^5 vectors a scope.

When a scope or the whole store is full, the memory used least (then the oldest) leaves first.
Thread-safe: the service's worker threads add and search while transports list and forget.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from sidecar.errors import InvalidArgument

# Bytes a memory costs beyond its text and vector (the record, its index entries).
RECORD_OVERHEAD = 240


@dataclass
class Memory:
    id: int
    scope: str
    text: str
    tags: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)
    # "game": added by Remember; "context": turns that left a session's context.
    source: str = "game"
    session_id: str = ""
    # The session's user turn it was (1 = the first), for memories from the context; 0 otherwise.
    turn: int = 0
    uses: int = 0
    last_used: float = 0.0

    @property
    def bytes(self) -> int:
        return len(self.text.encode("utf-8")) + sum(len(t) for t in self.tags) + RECORD_OVERHEAD


class _Scope:
    """One scope's memories and their vectors, row i of `vectors` belonging to `memories[i]`."""

    def __init__(self, dims: int) -> None:
        self.memories: list[Memory] = []
        self.vectors = np.zeros((16, dims), dtype=np.float32)

    def append(self, memory: Memory, vector: np.ndarray) -> None:
        n = len(self.memories)
        if n == len(self.vectors):
            grown = np.zeros((2 * n, self.vectors.shape[1]), dtype=np.float32)
            grown[:n] = self.vectors
            self.vectors = grown
        self.vectors[n] = vector
        self.memories.append(memory)

    def remove(self, index: int) -> Memory:
        """Swap-remove: the last row moves into the hole, so removal costs one row's copy."""
        last = len(self.memories) - 1
        gone = self.memories[index]
        self.memories[index] = self.memories[last]
        self.vectors[index] = self.vectors[last]
        self.memories.pop()
        return gone

    def least_used(self) -> int:
        return min(range(len(self.memories)), key=lambda i: self._rank(self.memories[i]))

    @staticmethod
    def _rank(m: Memory) -> tuple[int, float]:
        return m.uses, max(m.last_used, m.created)


class MemoryStore:
    def __init__(self, dims: int, max_per_scope: int, max_total: int) -> None:
        if max_per_scope < 1 or max_total < 1:
            raise InvalidArgument("memory bounds must be at least 1")
        self.dims = dims
        self.max_per_scope = max_per_scope
        self.max_total = max_total
        self._scopes: dict[str, _Scope] = {}
        self._where: dict[int, str] = {}  # memory id -> its scope
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._where)

    def add(self, scope: str, texts: list[str], vectors: np.ndarray, *, tags: tuple[str, ...] = (),
            source: str = "game", session_id: str = "", turns: list[int] | None = None) -> list[Memory]:
        """Store one memory per text (its row of `vectors`, unit length), evicting the least used
        of the scope, then of the store, past their bounds. Returns them, in order."""
        if vectors.shape != (len(texts), self.dims):
            raise ValueError(f"vectors are {vectors.shape}; expected ({len(texts)}, {self.dims})")
        added = []
        with self._lock:
            index = self._scopes.get(scope)
            if index is None:
                index = self._scopes[scope] = _Scope(self.dims)
            for i, text in enumerate(texts):
                memory = Memory(next(self._ids), scope, text, tags, source=source, session_id=session_id,
                                turn=turns[i] if turns else 0)
                while len(index.memories) >= self.max_per_scope:
                    self._evict(scope, index.least_used())
                while len(self._where) >= self.max_total:
                    self._evict_anywhere()
                index.append(memory, vectors[i])
                self._where[memory.id] = scope
                added.append(memory)
        return added

    def set_max_total(self, max_total: int) -> int:
        """A new bound on memories in all (a RAM budget changed: footprint.py); the least used
        leave until the store is within it, and a scope is never allowed more. Returns how many left."""
        if max_total < 1:
            raise InvalidArgument("memory bounds must be at least 1")
        with self._lock:
            before = self.evicted
            self.max_total = max_total
            self.max_per_scope = min(self.max_per_scope, max_total)
            while len(self._where) > self.max_total:
                self._evict_anywhere()
            return self.evicted - before

    def restore(self, memories: list[Memory], vectors: np.ndarray) -> list[Memory]:
        """Memories from a save: their texts, times, uses and origins kept, under new ids (ids are
        this daemon's own), within the bounds like any other."""
        restored = []
        with self._lock:
            for memory, vector in zip(memories, vectors):
                memory.id = next(self._ids)
                index = self._scopes.setdefault(memory.scope, _Scope(self.dims))
                while len(index.memories) >= self.max_per_scope:
                    self._evict(memory.scope, index.least_used())
                while len(self._where) >= self.max_total:
                    self._evict_anywhere()
                index.append(memory, vector)
                self._where[memory.id] = memory.scope
                restored.append(memory)
        return restored

    def search(self, scopes: list[str], query: np.ndarray, k: int, *, tags: tuple[str, ...] = (),
               min_score: float = -1.0) -> list[tuple[Memory, float]]:
        """The k memories of `scopes` most similar to `query` (a unit vector), best first, scoring
        at least `min_score`; with `tags`, only memories carrying every one of them."""
        found: list[tuple[Memory, float]] = []
        with self._lock:
            for scope in dict.fromkeys(scopes):
                index = self._scopes.get(scope)
                if index is None or not index.memories:
                    continue
                n = len(index.memories)
                scores = index.vectors[:n] @ query
                if tags:
                    wanted = set(tags)
                    scores = np.where([wanted.issubset(m.tags) for m in index.memories], scores, -np.inf)
                take = min(k, n)
                best = np.argpartition(-scores, take - 1)[:take]
                found += [(index.memories[i], float(scores[i])) for i in best if scores[i] >= min_score]
        found.sort(key=lambda pair: -pair[1])
        return found[:k]

    def mark_used(self, memories: list[Memory]) -> None:
        now = time.time()
        with self._lock:
            for memory in memories:
                memory.uses += 1
                memory.last_used = now

    def forget(self, *, ids: tuple[int, ...] = (), tags: tuple[str, ...] = (), scope: str = "") -> int:
        """Forget the memories named by id, or those carrying every one of `tags` (in `scope`, or
        everywhere), or a whole scope. Returns how many went."""
        with self._lock:
            doomed = [i for i in ids if i in self._where]
            if tags or (scope and not ids):
                wanted = set(tags)
                for name, index in self._scopes.items():
                    if scope and name != scope:
                        continue
                    doomed += [m.id for m in index.memories if wanted.issubset(m.tags)]
            for memory_id in set(doomed):
                self._remove_id(memory_id)
            return len(set(doomed))

    def listing(self, *, scope: str = "", tags: tuple[str, ...] = (), offset: int = 0,
                limit: int = 100) -> tuple[list[Memory], int]:
        """Memories of `scope` (or all), oldest first, filtered by tags: a page and the total."""
        with self._lock:
            chosen = [m for name, index in self._scopes.items() if not scope or name == scope
                      for m in index.memories if set(tags).issubset(m.tags)]
        chosen.sort(key=lambda m: m.id)
        return chosen[offset:offset + limit], len(chosen)

    def of_scopes(self, scopes: set[str]) -> tuple[list[Memory], np.ndarray]:
        """Every memory of `scopes` with its vector (a save's)."""
        with self._lock:
            memories, rows = [], []
            for name in scopes:
                index = self._scopes.get(name)
                if index is not None:
                    memories += index.memories
                    rows.append(index.vectors[:len(index.memories)])
        return memories, (np.concatenate(rows) if rows else np.zeros((0, self.dims), dtype=np.float32))

    def scope_names(self) -> list[str]:
        with self._lock:
            return [name for name, index in self._scopes.items() if index.memories]

    @property
    def bytes(self) -> int:
        """Host memory the store holds: texts, records and the vectors' arrays."""
        with self._lock:
            return sum(index.vectors.nbytes + sum(m.bytes for m in index.memories) for index in self._scopes.values())

    def _remove_id(self, memory_id: int) -> None:
        scope = self._where.pop(memory_id)
        index = self._scopes[scope]
        position = next(i for i, m in enumerate(index.memories) if m.id == memory_id)
        index.remove(position)
        if not index.memories:
            del self._scopes[scope]

    def _evict(self, scope: str, position: int) -> None:
        gone = self._scopes[scope].remove(position)
        del self._where[gone.id]
        self.evicted += 1

    def _evict_anywhere(self) -> None:
        scope = min((name for name, index in self._scopes.items() if index.memories),
                    key=lambda name: _Scope._rank(self._scopes[name].memories[self._scopes[name].least_used()]))
        self._evict(scope, self._scopes[scope].least_used())
