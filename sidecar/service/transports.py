"""Start and stop every transport in front of the service core: gRPC (loopback TCP or a Unix
socket), the WebSocket bridge and the OpenAI-compatible HTTP API, with one token and one grace
period.

A transport is one module that decodes its wire format, calls the core (the calls of calls.py, or
core.generate for a generation) and tells errors by refusals.py's table; it is started here."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2

from sidecar.service.auth import Authenticator
from sidecar.service.core import SidecarService
from sidecar.service.grpc_server import SERVICE_NAME, PortInUse, start_grpc_server
from sidecar.service.openai_http import OpenAIHttpServer, start_http
from sidecar.service.websocket_bridge import WebSocketBridge
from sidecar.settings import Settings, format_address


def grpc_address(settings: Settings) -> str:
    """What gRPC binds: "unix:PATH" with --socket, else host:port."""
    if settings.socket is not None:
        return f"unix:{settings.socket}"
    return settings.address


def websocket_port(settings: Settings) -> int | None:
    """The bridge's port, or None when it is off: --ws-port if given (-1 = off); otherwise the gRPC
    port + 1 (0 when gRPC picks a free port). Off by default with --socket: a game that chose a
    Unix socket speaks gRPC, and a TCP port it did not ask for would only widen what is exposed."""
    if settings.ws_port is not None:
        return None if settings.ws_port < 0 else settings.ws_port
    if settings.socket is not None:
        return None
    if settings.port == 0 or settings.port == 65535:
        return 0
    return settings.port + 1


def websocket_frame_limit(max_message_bytes: int) -> int:
    """Largest WebSocket frame: a message of max_message_bytes in JSON, where bytes fields grow by a
    third in base64, plus room for the JSON around it."""
    return max_message_bytes + max_message_bytes // 3 + (64 << 10)


# At the end of the grace period: how long cancelled streams get to produce their final chunk, and
# how long the transports then get to write what is left (final chunks, statuses, end frames).
FINAL_CHUNK_WAIT_S = 3.0
FLUSH_S = 1.0


@dataclass
class Transports:
    grpc_server: grpc.aio.Server
    health: health.aio.HealthServicer
    address: str  # gRPC, as clients dial it: "127.0.0.1:50551" or "unix:/path"
    port: int  # gRPC's bound TCP port; 0 on a Unix socket
    bridge: WebSocketBridge | None
    ws_address: str | None  # "ws://127.0.0.1:50552"
    core: SidecarService | None = None
    http: OpenAIHttpServer | None = None
    http_address: str | None = None  # "http://127.0.0.1:50553" (the OpenAI API's base is <it>/v1)

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.address,) + tuple(a for a in (self.ws_address, self.http_address) if a)

    async def set_serving(self) -> None:
        """Health turns SERVING: the model is loaded and generation calls are taken."""
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def log_fields(self) -> dict[str, object]:
        return {"address": self.address, "ws_address": self.ws_address, "http_address": self.http_address}

    async def stop(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Drain both transports at once. For grace_s (cut short when `hurry` is set) both keep
        answering: new work gets UNAVAILABLE, health NOT_SERVING, calls in flight go on. Streams
        still running then are cancelled in the engine, so each still gets its final chunk
        (FINISH_REASON_CANCELLED, with usage) and its terminal frame before the ports close."""
        await self.health.enter_graceful_shutdown()
        if self.bridge is not None:
            self.bridge.begin_drain()
        if self.core is not None:
            await self.core.streams_done(grace_s, hurry)
            if self.core.cancel_streams():
                # One engine step ends them; a step is milliseconds, but a busy machine is slow.
                await self.core.streams_done(FINAL_CHUNK_WAIT_S)
        stopping = [asyncio.ensure_future(self.grpc_server.stop(FLUSH_S))]
        rest_s = FLUSH_S if self.core is not None else grace_s
        if self.bridge is not None:
            stopping.append(asyncio.ensure_future(self.bridge.close(rest_s, hurry)))
        if self.http is not None:
            stopping.append(asyncio.ensure_future(self.http.close(rest_s, hurry)))
        await asyncio.gather(*stopping)


async def start_transports(
    core: SidecarService, settings: Settings, authenticator: Authenticator, serving: bool = True,
    model_id: str | None = None,
) -> Transports:
    """Bind and start gRPC, the bridge, then the HTTP API. PortInUse (everything started is
    stopped again) when one cannot listen. With `serving` False health says NOT_SERVING until
    `set_serving`. `model_id` names the model in /v1/models (default: the local model file's
    stem; remote mode: the server's model)."""
    transports = await _start_grpc_and_bridge(core, settings, authenticator, serving)
    await start_http(transports, core, settings, authenticator, model_id=model_id)
    return transports


async def _start_grpc_and_bridge(core: SidecarService, settings: Settings, authenticator: Authenticator,
                                 serving: bool) -> Transports:
    address = grpc_address(settings)
    # A screenshot may be larger than any other message: an AskImage carrying the largest image
    # accepted must get through (and be refused by size, with a message, above that).
    limit = max(settings.max_message_bytes, settings.max_image_bytes + (64 << 10))
    more_hosts = settings.hosts[1:] if settings.socket is None else ()
    server, health_servicer, port = await start_grpc_server(core, address, limit, authenticator, serving, more_hosts)
    if settings.socket is None:
        address = format_address(settings.hosts[0], port)
    ws_port = websocket_port(settings)
    if ws_port is None:
        return Transports(server, health_servicer, address, port, None, None, core)
    bridge = WebSocketBridge(core, authenticator, websocket_frame_limit(limit), settings.cors_origin or ())
    try:
        bound = await bridge.start(settings.hosts, ws_port)
    except OSError as e:
        await server.stop(None)
        where = ", ".join(format_address(host, ws_port) for host in settings.hosts)
        raise PortInUse(f"cannot listen on {where} (WebSocket bridge): {e.strerror or e}; use --ws-port or --no-websocket") from e
    ws_address = f"ws://{format_address(settings.hosts[0], bound)}"
    return Transports(server, health_servicer, address, port, bridge, ws_address, core)
