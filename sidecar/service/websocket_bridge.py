"""The WebSocket bridge: xlm.v1 over JSON frames (see json_frames) for GDScript and any client
without HTTP/2, in the daemon's process and event loop, in front of the same service core as gRPC.

Each call runs in its own task; several calls share one socket, told apart by id. A cancel frame,
a timeout or the socket closing cancels the task, which closes the core's stream and so cancels
the engine job. Backpressure: frames leave through a bounded per-connection queue and websockets'
write buffer limit, so a client that stops reading stalls its own calls (their tokens wait in the
engine's bounded per-request collector) instead of growing the daemon's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from http import HTTPStatus

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from sidecar.errors import ResourceExhausted, ShuttingDown
from sidecar.service import json_frames as frames
from sidecar.service.auth import Authenticator, token_from_auth_frame, token_from_header
from sidecar.service.caller import Caller, socket_caller
from sidecar.service.core import SidecarService
from sidecar.service.refusals import refusal_for

log = structlog.get_logger("websocket")

# Frames waiting to be written, per connection: enough to keep the socket busy, small enough that
# a client that does not read costs little.
OUTBOX_FRAMES = 32
# Calls in flight on one connection; more are refused with RESOURCE_EXHAUSTED.
MAX_CALLS_PER_CONNECTION = 64
# A connection that has not authenticated by then is closed.
AUTH_TIMEOUT_S = 10.0
# Close code for a refused token (policy violation).
CLOSE_UNAUTHENTICATED = 1008


class WebSocketBridge:
    """One per daemon, on the daemon's event loop."""

    def __init__(self, core: SidecarService, authenticator: Authenticator, max_frame_bytes: int,
                 cors_origins: Iterable[str] = ()) -> None:
        self.core = core
        self.authenticator = authenticator
        # Without a token, the web origins let in (--cors-origin), as the HTTP API lets them in.
        self.cors_origins = frozenset(cors_origins)
        self.max_frame_bytes = max_frame_bytes
        self.draining = False
        self._server: Server | None = None
        self._more: Server | None = None  # the other addresses --host lists, at the same port
        self._connections: set[_Connection] = set()

    async def start(self, hosts: str | tuple[str, ...], port: int) -> int:
        """Listen on each host at one port; returns the bound port. OSError when it is taken."""
        hosts = (hosts,) if isinstance(hosts, str) else hosts
        self._server = await self._serve(hosts[0], port)
        port = self._server.sockets[0].getsockname()[1]  # port 0: the others take the one it got
        if len(hosts) > 1:
            try:
                self._more = await self._serve(list(hosts[1:]), port)
            except OSError:
                self._server.close()
                raise
        return port

    async def _serve(self, host: str | list[str], port: int) -> Server:
        return await serve(
            self._handle,
            host,
            port,
            process_request=self._check_handshake,
            max_size=self.max_frame_bytes,
            compression=None,  # loopback: deflate would only cost CPU and memory per connection
            close_timeout=2,
            server_header=None,
        )

    def _check_handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        """Refuse a wrong token in the handshake at once (HTTP 401). Without a token required
        (--no-auth), refuse browsers (they send Origin) but for the origins --cors-origin names, as
        the HTTP API does: any web page could otherwise drive the model through a local port."""
        if not self.authenticator.required:
            origin = request.headers.get("Origin")
            if origin is not None and origin not in self.cors_origins:
                return connection.respond(HTTPStatus.FORBIDDEN, "browser origins are refused without a token, but "
                                                                "for those --cors-origin names\n")
            return None
        header = request.headers.get("Authorization")
        if header is not None and not self.authenticator.accepts(token_from_header(header)):
            return connection.respond(HTTPStatus.UNAUTHORIZED, "wrong token\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        token = token_from_header(ws.request.headers.get("Authorization"))
        authenticated = not self.authenticator.required or self.authenticator.accepts(token)
        connection = _Connection(self, ws, authenticated)
        connection.game_token = self.authenticator.is_game(token)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)

    def calls_in_flight(self) -> list[asyncio.Task]:
        return [task for c in self._connections for task in c.calls.values()]

    def begin_drain(self) -> None:
        """Refuse new connections and calls (UNAVAILABLE); calls in flight go on."""
        self.draining = True
        for server in (self._server, self._more):
            if server is not None:
                server.server.close()  # stop accepting; open connections stay

    async def close(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Drain: refuse new connections and calls (UNAVAILABLE), let calls in flight finish for
        up to grace_s (or until `hurry` is set), write out every frame they queued (their final
        chunks and terminal frames), then cancel what is left and close every connection."""
        if self._server is None:
            return
        self.begin_drain()
        pending = self.calls_in_flight()
        if pending and grace_s > 0:
            waiters = [asyncio.ensure_future(asyncio.wait(pending, timeout=grace_s))]
            if hurry is not None:
                waiters.append(asyncio.ensure_future(hurry.wait()))
            _, still = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in still:
                w.cancel()
        flushing = [asyncio.ensure_future(c.outbox.join()) for c in self._connections]
        if flushing:
            await asyncio.wait(flushing, timeout=max(grace_s, 0.5))
            for f in flushing:
                f.cancel()
        for connection in list(self._connections):
            connection.cancel_calls()
        for server in (self._server, self._more):
            if server is not None:
                server.close()  # going away (1001)
                await server.wait_closed()


class _Connection:
    """One client socket: reads frames, runs calls, writes their frames in order per call."""

    def __init__(self, bridge: WebSocketBridge, ws: ServerConnection, authenticated: bool) -> None:
        self.bridge = bridge
        self.core = bridge.core
        self.ws = ws
        self.authenticated = authenticated
        self.outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=OUTBOX_FRAMES)
        self.calls: dict[tuple[str, frames.CallId], asyncio.Task] = {}
        self._cancelled_by_client: set[tuple[str, frames.CallId]] = set()
        self._closing = False
        # It presented the game token (in the handshake or its last auth frame): ReportFrames' caller.
        self.game_token = False

    async def run(self) -> None:
        if not self.authenticated and not await self._authenticate():
            return
        writer = asyncio.create_task(self._write(), name="ws-writer")
        try:
            await self._read()
        except ConnectionClosed:
            pass
        finally:
            self.cancel_calls()
            if self.calls:
                await asyncio.gather(*self.calls.values(), return_exceptions=True)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await writer

    async def _authenticate(self) -> bool:
        """The first frame must carry the token; anything else closes the connection."""
        try:
            data = await asyncio.wait_for(self.ws.recv(), AUTH_TIMEOUT_S)
        except (TimeoutError, ConnectionClosed):
            await self.ws.close(CLOSE_UNAUTHENTICATED, "no token")
            return False
        call_id = None
        try:
            frame = frames.parse_client_frame(data)
        except frames.FrameError as e:
            frame, call_id = None, e.call_id
        if isinstance(frame, frames.AuthFrame) and self.bridge.authenticator.accepts(token_from_auth_frame(frame.token)):
            self.game_token = self.bridge.authenticator.is_game(token_from_auth_frame(frame.token))
            await self.ws.send(frames.auth_ok_frame())
            return True
        if isinstance(frame, (frames.CallFrame, frames.CancelFrame)):
            call_id = frame.call_id
        message = 'missing or wrong token: send {"auth": "<token>"} first, or the Authorization header'
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(frames.error_frame(call_id, "UNAUTHENTICATED", message))
            await self.ws.close(CLOSE_UNAUTHENTICATED, "unauthenticated")
        return False

    async def _write(self) -> None:
        while True:
            frame = await self.outbox.get()
            try:
                await self.ws.send(frame)  # waits while websockets' write buffer is above its limit
            finally:
                self.outbox.task_done()  # close() waits for the outbox to be written out

    async def _read(self) -> None:
        async for data in self.ws:
            try:
                frame = frames.parse_client_frame(data)
            except frames.FrameError as e:
                await self._send_error(e.call_id, e.error)
                continue
            if isinstance(frame, frames.AuthFrame):
                if not self.bridge.authenticator.accepts(token_from_auth_frame(frame.token)):
                    await self.ws.close(CLOSE_UNAUTHENTICATED, "wrong token")
                    return
                self.game_token = self.bridge.authenticator.is_game(token_from_auth_frame(frame.token))
                await self.outbox.put(frames.auth_ok_frame())
            elif isinstance(frame, frames.CancelFrame):
                self._cancel(frame.call_id)
            else:
                await self._start(frame)

    async def _start(self, frame: frames.CallFrame) -> None:
        key = frames.call_key(frame.call_id)
        if self.bridge.draining:
            await self._send_error(frame.call_id, ShuttingDown())
        elif key in self.calls:
            # Not an error frame of that id: the client would take it for the running call's end.
            await self.outbox.put(frames.duplicate_id_frame(frame.call_id, f"call id {frame.call_id!r} is in flight; the new call was refused"))
        elif len(self.calls) >= MAX_CALLS_PER_CONNECTION:
            await self._send_error(frame.call_id, ResourceExhausted(f"at most {MAX_CALLS_PER_CONNECTION} calls at once per connection"))
        else:
            task = asyncio.create_task(self._run_call(frame), name=f"ws-call-{frame.call.name}")
            self.calls[key] = task
            task.add_done_callback(lambda t, call_id=frame.call_id: self._ended(t, call_id))

    def _ended(self, task: asyncio.Task, call_id: frames.CallId) -> None:
        """A call cancelled before its task first ran never enters _run_call, so its `finally`
        does not run: end it here, or the client waits forever and its id stays taken."""
        key = frames.call_key(call_id)
        if self.calls.get(key) is not task:
            return  # _run_call cleaned up
        del self.calls[key]
        if key in self._cancelled_by_client and not self._closing:
            asyncio.get_running_loop().create_task(
                self.outbox.put(frames.error_frame(call_id, "CANCELLED", "cancelled by the client"))
            )
        self._cancelled_by_client.discard(key)

    def _cancel(self, call_id: frames.CallId) -> None:
        """Cancel a call in flight; a cancel for a call that already ended is ignored (it crossed
        the call's last frame on the wire)."""
        key = frames.call_key(call_id)
        task = self.calls.get(key)
        if task is not None and not task.done():
            self._cancelled_by_client.add(key)
            task.cancel()

    def cancel_calls(self) -> None:
        """The connection is going: cancel every call without sending anything more."""
        self._closing = True
        for task in self.calls.values():
            task.cancel()

    async def _run_call(self, frame: frames.CallFrame) -> None:
        key = frames.call_key(frame.call_id)
        call_id, call = frame.call_id, frame.call
        try:
            async with asyncio.timeout(frame.timeout_s):
                if call.streaming:
                    async with contextlib.aclosing(call.invoke(self.core, frame.request, self._caller())) as responses:
                        async for response in responses:
                            await self.outbox.put(frames.chunk_frame(call_id, response))
                    await self.outbox.put(frames.end_frame(call_id))
                else:
                    result = await call.invoke(self.core, frame.request, self._caller())
                    await self.outbox.put(frames.result_frame(call_id, result))
        except TimeoutError:
            await self.outbox.put(frames.error_frame(call_id, "DEADLINE_EXCEEDED", "the call's timeoutMs passed"))
        except asyncio.CancelledError:
            if self._closing or key not in self._cancelled_by_client:
                raise
            await self.outbox.put(frames.error_frame(call_id, "CANCELLED", "cancelled by the client"))
        except Exception as e:
            await self._send_error(call_id, e)
        finally:
            self.calls.pop(key, None)
            self._cancelled_by_client.discard(key)

    def _caller(self) -> Caller:
        return socket_caller("ws", self.ws.remote_address, self.game_token)

    async def _send_error(self, call_id: frames.CallId | None, error: BaseException) -> None:
        refusal = refusal_for(error)
        if refusal.unexpected:
            log.exception("unexpected error in a call", exc_info=error)
        await self.outbox.put(frames.error_frame(call_id, refusal.code_name, refusal.message, refusal.retry_after_ms))
