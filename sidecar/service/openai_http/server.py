"""uvicorn serving the API in the daemon's own event loop, beside gRPC and the WebSocket bridge.

The daemon owns signals (SIGTERM drains every transport together), so uvicorn's own signal
handling is turned off; the daemon binds the socket itself, so a taken port is an OSError at
start, as for the other transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidecar.service.auth import Authenticator
from sidecar.service.core import SidecarService
from sidecar.service.openai_http.cors import CorsPolicy
from sidecar.service.openai_http.routes import OpenAIApi


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the daemon."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass

    @contextlib.contextmanager
    def capture_signals(self):  # uvicorn >= 0.29
        yield


# A connection has this long to send a request's headers, from when it opens or its last response
# ends (slowloris: 300 connections that never finished their headers were all held open).
HEADER_TIMEOUT_S = 10.0


class _HeaderTimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting = self.cycle
        self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not self._awaiting and self._header_deadline is not None:
            self._header_deadline.cancel()  # a request's headers are in
            self._header_deadline = None

    def on_response_complete(self) -> None:
        finished = self.cycle
        super().on_response_complete()  # may start a pipelined request at once
        if self.cycle is finished and not self.transport.is_closing() and self._header_deadline is None:
            self._awaiting = finished
            self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request the HTTP parser cannot read gets an OpenAI error object too, not plain text."""
        body = json.dumps({"error": {"message": f"malformed HTTP request: {msg}", "type": "invalid_request_error",
                                     "param": None, "code": "bad_request"}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # h11 will not answer in the state the bad bytes left it in
            pass
        self.transport.close()

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.cycle is self._awaiting and not self.transport.is_closing():
            self.transport.close()


class OpenAIHttpServer:
    """One per daemon, on the daemon's event loop."""

    def __init__(self, core: SidecarService, authenticator: Authenticator, model_path, max_tokens_per_request: int,
                 model_id: str | None = None, *, strict_model_names: bool = False,
                 cors_origins: tuple[str, ...] = ()) -> None:
        self.api = OpenAIApi(core, authenticator, model_path, max_tokens_per_request, model_id,
                             strict_model_names=strict_model_names, cors=CorsPolicy(cors_origins))
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None
        self._sockets: list[socket.socket] = []

    async def start(self, hosts: str | tuple[str, ...], port: int) -> int:
        """Listen on each host at one port; returns the bound port. OSError when it is taken."""
        hosts = (hosts,) if isinstance(hosts, str) else hosts
        sockets: list[socket.socket] = []
        try:
            for host in hosts:  # the first picks the port when it is 0; the others take the same
                sockets.append(_listening_socket(host, sockets[0].getsockname()[1] if sockets else port))
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        self._sockets = sockets
        # uvicorn logs through the standard library; only its warnings and errors are worth a line.
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
        config = uvicorn.Config(
            self.api.app(),
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_keep_alive=30,
            http=_HeaderTimedH11,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=sockets), name="openai-http")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError("the HTTP server stopped at start")
            await asyncio.sleep(0.01)
        return sockets[0].getsockname()[1]

    async def close(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Drain: stop accepting, let requests in flight finish for up to grace_s (or until
        `hurry` is set), then cancel them."""
        if self._server is None or self._task is None:
            return
        self._server.config.timeout_graceful_shutdown = grace_s
        self._server.should_exit = True
        waiters = [self._task]
        hurried = asyncio.ensure_future(hurry.wait()) if hurry is not None else None
        if hurried is not None:
            waiters.append(hurried)
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not self._task.done():
            self._server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if hurried is not None:
            hurried.cancel()
        for sock in self._sockets:
            sock.close()


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections of such a
    # socket. Without it Nagle's algorithm held each response's body (uvicorn writes it apart from
    # the headers) until the client ACKed the headers, which it delays by up to 40 ms: every reply
    # on a kept-alive connection came 40 ms late (a tool call of 45 tokens: 234 ms against 190 over gRPC).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
