"""Hand engine events to an asyncio consumer without ever blocking the engine.

The engine thread calls `put` once per token. Waking the event loop for every token costs a
syscall and a context switch on a machine whose cores are all busy decoding, so the collector
wakes the loop only when the consumer is actually waiting; tokens that arrive while the consumer
is busy (sending the previous chunk) pile up and leave together as one batch.
"""

from __future__ import annotations

import asyncio
import threading

from sidecar.backend.requests import TextDelta


class StreamCollector:
    """One per request. `put` from any thread; `next_batch` from the owning event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[object] = []
        self._waiter: asyncio.Future[None] | None = None
        # True while the consumer is sure to look again (busy, or a wake-up is on its way).
        self._consumer_will_look = True
        self._ended = False  # the stream's last event (Finished or an error) has been put
        self._pause: asyncio.Future[None] | None = None

    def put(self, item: object) -> None:
        """Add an event. Never blocks; safe after the loop has closed (the event is dropped)."""
        last = not isinstance(item, TextDelta)
        with self._lock:
            self._items.append(item)
            if last:
                self._ended = True  # always wake: a pause between chunks must not delay the end
            elif self._consumer_will_look:
                return
            self._consumer_will_look = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # loop closed: the daemon is gone and nobody is listening
            pass

    def _wake(self) -> None:
        for future in (self._waiter, self._pause):
            if future is not None and not future.done():
                future.set_result(None)

    async def pause(self, seconds: float) -> None:
        """Let tokens gather for up to `seconds`; return at once when the stream's end arrives,
        so frame pacing never holds back the last chunk."""
        with self._lock:
            if self._ended:
                return
            self._pause = pause = self._loop.create_future()
        timer = self._loop.call_later(seconds, lambda: pause.done() or pause.set_result(None))
        try:
            await pause
        finally:
            timer.cancel()

    async def next_batch(self) -> list[object]:
        """Every event put since the last call, in order; waits until there is at least one."""
        while True:
            with self._lock:
                if self._items:
                    batch, self._items = self._items, []
                    self._consumer_will_look = True
                    return batch
                self._consumer_will_look = False
                self._waiter = self._loop.create_future()
            await self._waiter
