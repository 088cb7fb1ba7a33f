"""Shared prompt prefixes kept in host memory: the KV state of a prompt's beginning that many
conversations share (a game's world context before each NPC's persona), so each new conversation
copies those cells instead of computing them again.

An entry is keyed by its exact tokens: a lookup hashes the prompt's first n tokens for each length
n the cache holds (a handful), then compares the tokens themselves, so a prefix is never handed to
a prompt that differs anywhere before its end. Entries are sequence states (llama.cpp's
llama_state_seq_get_data) holding exactly those tokens; they go least recently used first when
the bytes held pass the bound. Pure Python: the engine does the copying.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixEntry:
    tokens: tuple[int, ...]
    state: bytes


@dataclass(frozen=True)
class PrefixCacheStats:
    max_bytes: int
    bytes_held: int
    entries: int
    hits: int
    misses: int
    tokens_saved: int
    # Requests that waited for another one's prefill of the same prefix instead of computing it.
    waits: int


class PrefixCache:
    """Prefix states by their tokens, LRU within `max_bytes` (0 disables the cache). Engine thread
    only, but for `stats`, which the status RPC reads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], PrefixEntry] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.tokens_saved = self.waits = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def fits(self, n_bytes: int) -> bool:
        return 0 < n_bytes <= self.max_bytes

    def longest(self, tokens: list[int]) -> PrefixEntry | None:
        """The longest entry that is a proper prefix of `tokens` (at least one token left over:
        the one whose logits the reply is sampled from); it becomes the most recently used."""
        for n in sorted((n for n in self._lengths if n < len(tokens)), reverse=True):
            head = tuple(tokens[:n])
            key = (n, hash(head))
            entry = self._entries.get(key)
            if entry is not None and entry.tokens == head:
                self._entries.move_to_end(key)
                return entry
        return None

    def holds(self, tokens: tuple[int, ...]) -> bool:
        entry = self._entries.get((len(tokens), hash(tokens)))
        return entry is not None and entry.tokens == tokens

    def put(self, tokens: tuple[int, ...], state: bytes) -> bool:
        """Keep `state` (a sequence holding exactly `tokens`); False when it alone exceeds the bound."""
        if not self.fits(len(state)):
            return False
        key = (len(tokens), hash(tokens))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(key, old)
            while self._entries and self._bytes + len(state) > self.max_bytes:
                lru_key, lru = self._entries.popitem(last=False)
                self._forget(lru_key, lru)
            self._entries[key] = PrefixEntry(tokens, state)
            self._lengths[len(tokens)] += 1
            self._bytes += len(state)
        return True

    def keep_within(self) -> None:
        """Drop the least recently used entries past `max_bytes` (a RAM budget lowered it)."""
        with self._lock:
            while self._entries and self._bytes > self.max_bytes:
                lru_key, lru = self._entries.popitem(last=False)
                self._forget(lru_key, lru)

    def _forget(self, key: tuple[int, int], entry: PrefixEntry) -> None:
        self._bytes -= len(entry.state)
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._lengths.clear()
            self._bytes = 0

    def record_hit(self, tokens: int) -> None:
        self.hits += 1
        self.tokens_saved += tokens

    def record_miss(self) -> None:
        self.misses += 1

    def record_wait(self) -> None:
        self.waits += 1

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                self.max_bytes, self._bytes, len(self._entries), self.hits, self.misses, self.tokens_saved, self.waits
            )
