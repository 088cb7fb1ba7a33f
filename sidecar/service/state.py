"""Broadcast of the daemon's state (phase, budget, schedule) to every WatchState caller."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from sidecar.budget import Budget


@dataclass(frozen=True)
class DaemonState:
    """What a watcher sees. `reason` says why it changed ("initial", "draining", "budget", ...)."""

    phase: str
    budget: Budget
    reason: str
    # sidecar.profiler.status.ProfileView: the machine profile and its background measurement.
    profile: object = None
    # With reason "context_full": pb.MemoriesAdded (a session's turns became memories).
    memories_added: object = None


class StateHub:
    """Holds the current state; each subscriber gets its own queue, so a slow watcher only delays
    itself. Used from the event loop thread only."""

    def __init__(self, initial: DaemonState) -> None:
        self.current = initial
        self._subscribers: set[asyncio.Queue[DaemonState | None]] = set()

    def publish(self, **changes: object) -> None:
        """Apply changes (phase=..., budget=..., reason=...) and tell every subscriber."""
        self.current = replace(self.current, **changes)
        for q in self._subscribers:
            q.put_nowait(self.current)

    def close(self) -> None:
        """End every watch stream."""
        for q in self._subscribers:
            q.put_nowait(None)

    async def watch(self):
        """Yield the current state at once, then each change, until close()."""
        q: asyncio.Queue[DaemonState | None] = asyncio.Queue()
        self._subscribers.add(q)
        try:
            # The first event is sent because the caller subscribed, whatever changed last.
            yield replace(self.current, reason="initial")
            while (state := await q.get()) is not None:
                yield state
        finally:
            self._subscribers.discard(q)
