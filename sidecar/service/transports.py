"""Start and stop every transport in front of the service core: gRPC (loopback TCP or a Unix
socket) and the WebSocket bridge, with one token and one grace period."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2

from sidecar.service.auth import Authenticator
from sidecar.service.core import SidecarService
from sidecar.service.grpc_server import SERVICE_NAME, PortInUse, start_grpc_server
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


@dataclass
class Transports:
    grpc_server: grpc.aio.Server
    health: health.aio.HealthServicer
    address: str  # gRPC, as clients dial it: "127.0.0.1:50551" or "unix:/path"
    port: int  # gRPC's bound TCP port; 0 on a Unix socket
    bridge: WebSocketBridge | None
    ws_address: str | None  # "ws://127.0.0.1:50552"

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.address,) + ((self.ws_address,) if self.ws_address else ())

    async def set_serving(self) -> None:
        """Health turns SERVING: the model is loaded and generation calls are taken."""
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def log_fields(self) -> dict[str, object]:
        return {"address": self.address, "ws_address": self.ws_address}

    async def stop(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Drain both transports at once: calls in flight get grace_s to finish (cut short when
        `hurry` is set), new ones are refused."""
        await self.health.enter_graceful_shutdown()
        grpc_stopping = asyncio.ensure_future(self.grpc_server.stop(grace_s))
        stopping = [grpc_stopping]
        if self.bridge is not None:
            stopping.append(asyncio.ensure_future(self.bridge.close(grace_s, hurry)))
        if hurry is not None:
            hurried = asyncio.ensure_future(hurry.wait())
            await asyncio.wait([grpc_stopping, hurried], return_when=asyncio.FIRST_COMPLETED)
            if hurry.is_set() and not grpc_stopping.done():
                await self.grpc_server.stop(0)
            hurried.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hurried
        await asyncio.gather(*stopping)


async def start_transports(
    core: SidecarService, settings: Settings, authenticator: Authenticator, serving: bool = True
) -> Transports:
    """Bind and start gRPC, then the bridge. PortInUse (everything started is stopped again) when
    either cannot listen. With `serving` False health says NOT_SERVING until `set_serving`."""
    address = grpc_address(settings)
    # A screenshot may be larger than any other message: an AskImage carrying the largest image
    # accepted must get through (and be refused by size, with a message, above that).
    limit = max(settings.max_message_bytes, settings.max_image_bytes + (64 << 10))
    server, health_servicer, port = await start_grpc_server(core, address, limit, authenticator, serving)
    if settings.socket is None:
        address = format_address(settings.host, port)
    ws_port = websocket_port(settings)
    if ws_port is None:
        return Transports(server, health_servicer, address, port, None, None)
    bridge = WebSocketBridge(core, authenticator, websocket_frame_limit(limit))
    try:
        bound = await bridge.start(settings.host, ws_port)
    except OSError as e:
        await server.stop(None)
        where = format_address(settings.host, ws_port)
        raise PortInUse(f"cannot listen on {where} (WebSocket bridge): {e.strerror or e}; use --ws-port or --no-websocket") from e
    ws_address = f"ws://{format_address(settings.host, bound)}"
    return Transports(server, health_servicer, address, port, bridge, ws_address)
