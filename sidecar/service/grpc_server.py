"""The gRPC transport: xlm.v1.Sidecar over grpc.aio, plus the standard health service.

Only decoding, calling the service core, and turning typed errors into status codes happen here.
"""

from __future__ import annotations

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sidecar.api import pb, rpc
from sidecar.errors import SidecarError
from sidecar.service.core import SidecarService
from sidecar.service.status_codes import status_code_for

log = structlog.get_logger("grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sidecar"].full_name


class PortInUse(Exception):
    """Another process (perhaps another daemon) already listens on the address."""


async def _abort(context: grpc.aio.ServicerContext, error: BaseException) -> None:
    if not isinstance(error, SidecarError):
        log.exception("unexpected error in a call", exc_info=error)
    await context.abort(status_code_for(error), str(error) or type(error).__name__)


class SidecarServicer(rpc.SidecarServicer):
    """Adapts the service core to grpc.aio. Cancellation by the client cancels the handler task,
    which closes the core's stream and so cancels the engine job."""

    def __init__(self, core: SidecarService) -> None:
        self.core = core

    async def Generate(self, request, context):
        try:
            async for chunk in self.core.generate(request):
                yield chunk
        except SidecarError as e:
            await _abort(context, e)

    async def AskImage(self, request, context):
        try:
            async for chunk in self.core.ask_image(request):
                yield chunk
        except SidecarError as e:
            await _abort(context, e)

    async def SetBudget(self, request, context):
        try:
            return await self.core.set_budget(request)
        except SidecarError as e:
            await _abort(context, e)

    async def WatchState(self, request, context):
        async for event in self.core.watch_state():
            yield event

    async def GetStatus(self, request, context):
        return await self.core.get_status()

    async def EndSession(self, request, context):
        try:
            return await self.core.end_session(request)
        except SidecarError as e:
            await _abort(context, e)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Without this, Linux lets a second daemon bind the same port and steal half the calls.
        ("grpc.so_reuseport", 0),
    ]


async def start_grpc_server(core: SidecarService, address: str, max_message_bytes: int) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Bind and start. Returns the server, its health servicer and the bound port (useful with port 0).

    Raises PortInUse when the address is taken.
    """
    server = grpc.aio.server(options=server_options(max_message_bytes))
    rpc.add_SidecarServicer_to_server(SidecarServicer(core), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise PortInUse(f"cannot listen on {address}: {e}") from e
    if port == 0 and not address.endswith(":0"):
        raise PortInUse(f"cannot listen on {address}: the port is in use")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, port
