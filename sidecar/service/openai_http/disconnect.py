"""A request's work ends when its client goes away.

After the body is read, the ASGI `receive` channel has nothing more to say but
`http.disconnect`, so waiting on it beside the work tells, at once, that the client closed the
connection. The work is then cancelled: the core's stream closes and the engine cancels the
request at its next step, freeing the sequence (where waiting for the next write to fail would
notice only at the next chunk, and never for a reply that is not streamed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work was done."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """The work's result; ClientGone (the work cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # we are cancelled ourselves (the server is closing)
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone()


class EventStream:
    """An ASGI response of server-sent events that stops (and closes its source) the moment the
    client disconnects."""

    def __init__(self, events: AsyncIterator[str], source: AsyncIterator | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.events = events
        self.source = source  # the core's stream the events come from: closed with them
        self.headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no")]
        self.headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def pump() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event.encode("utf-8"), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnected(receive, pump())
        except (ClientGone, OSError):
            pass
        finally:
            for stream in (self.events, self.source):
                if stream is not None:
                    with contextlib.suppress(RuntimeError):
                        await stream.aclose()
