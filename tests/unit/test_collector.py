"""The collector between the engine thread and a stream's coroutine."""

from __future__ import annotations

import asyncio
import threading
import time

from sidecar.engine import TextDelta
from sidecar.backend.requests import Finished, FinishReason, Timings, Usage
from sidecar.service.collector import StreamCollector

FINISHED = Finished(FinishReason.STOP, Usage(1, 0, 1), Timings(0, 0, 0, 0, 0), "")


def test_tokens_gather_while_the_consumer_is_busy_and_leave_as_one_batch() -> None:
    async def run():
        c = StreamCollector(asyncio.get_running_loop())
        for i in range(5):
            c.put(TextDelta(str(i), (i,)))
        return await c.next_batch()

    assert [e.text for e in asyncio.run(run())] == ["0", "1", "2", "3", "4"]


def test_a_pause_between_chunks_ends_as_soon_as_the_stream_ends() -> None:
    async def run():
        c = StreamCollector(asyncio.get_running_loop())
        threading.Timer(0.05, c.put, (FINISHED,)).start()  # the engine thread finishes
        t0 = time.perf_counter()
        await c.pause(5.0)
        waited = time.perf_counter() - t0
        return waited, await c.next_batch()

    waited, batch = asyncio.run(run())
    assert waited < 2.0 and batch == [FINISHED]


def test_a_pause_lasts_its_interval_while_tokens_keep_coming() -> None:
    async def run():
        c = StreamCollector(asyncio.get_running_loop())
        threading.Timer(0.01, c.put, (TextDelta("a", (1,)),)).start()
        t0 = time.perf_counter()
        await c.pause(0.2)
        return time.perf_counter() - t0

    assert asyncio.run(run()) >= 0.19
