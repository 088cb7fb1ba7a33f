"""The gRPC transport: xlm.v1.Sidecar over grpc.aio, with the standard health and reflection services.

Only decoding, checking the token, calling the service core and turning typed errors into status
codes happen here.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Awaitable, Callable

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.api import pb
from sidecar.service.auth import METADATA_KEY, Authenticator
from sidecar.service.caller import Caller, grpc_caller
from sidecar.service.calls import CALLS, Call
from sidecar.service.core import SidecarService
from sidecar.service.refusals import refusal_for

log = structlog.get_logger("grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sidecar"].full_name  # "xlm.v1.Sidecar"
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# Health stays open: a launcher polls readiness before it has read the token file, and the answer
# (SERVING or not) tells a caller nothing it could misuse. Everything else needs the token.
_OPEN_METHOD_PREFIXES = (f"/{HEALTH_SERVICE_NAME}/",)
_UNAUTHENTICATED_DETAIL = "missing or wrong token: send metadata 'authorization: Bearer <token>'"


class PortInUse(Exception):
    """Another process (perhaps another daemon) already listens on the address."""


async def _abort(context: grpc.aio.ServicerContext, error: BaseException) -> None:
    refusal = refusal_for(error)
    if refusal.unexpected:
        log.exception("unexpected error in a call", exc_info=error)
    pushback = refusal.grpc_pushback  # gRFC A6: clients' retry policies honour this trailer
    trailers = (("grpc-retry-pushback-ms", pushback),) if pushback is not None else ()
    await context.abort(refusal.grpc_code, refusal.message, trailing_metadata=trailers)


# -- the calls, from the shared table ------------------------------------------------------------


class _Undecodable:
    """Stands in for a request whose bytes are not a valid message, so the call can answer
    INVALID_ARGUMENT (grpc itself would answer UNKNOWN)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def deserialize(data: bytes) -> object:
        try:
            return deserializer(data)
        except Exception as e:  # DecodeError, and invalid UTF-8 in a string field
            return _Undecodable(e)

    return deserialize


async def _refuse_undecodable(request: object, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message: {request.error}")


def _caller(context: grpc.aio.ServicerContext, authenticator: Authenticator) -> Caller:
    """Who called: the peer's address and whether it carried the game token (the edge has already
    checked that it carried a token the daemon takes)."""
    header = _metadata_value(context.invocation_metadata(), METADATA_KEY)
    return grpc_caller(context.peer(), authenticator.is_game_header(header))


def _method_handler(call: Call, core: SidecarService, authenticator: Authenticator) -> grpc.RpcMethodHandler:
    """grpc.aio handler for one call. Cancellation by the client, or its deadline passing, cancels
    the handler task; `aclosing` then closes the core's stream at once (not whenever the garbage
    collector gets to it), which cancels the engine job and frees its sequence."""
    if call.streaming:

        async def stream(request, context):
            await _refuse_undecodable(request, context)
            try:
                async with contextlib.aclosing(call.invoke(core, request, _caller(context, authenticator))) as responses:
                    async for response in responses:
                        yield response
            except Exception as e:
                await _abort(context, e)

        return grpc.unary_stream_rpc_method_handler(
            stream, _tolerant(call.request_type.FromString), call.response_type.SerializeToString
        )

    async def unary(request, context):
        await _refuse_undecodable(request, context)
        try:
            return await call.invoke(core, request, _caller(context, authenticator))
        except Exception as e:
            await _abort(context, e)

    return grpc.unary_unary_rpc_method_handler(unary, _tolerant(call.request_type.FromString), call.response_type.SerializeToString)


def add_sidecar_service(core: SidecarService, server: grpc.aio.Server, authenticator: Authenticator | None = None) -> None:
    """Register every call of xlm.v1.Sidecar (what the generated add_SidecarServicer_to_server
    does, but from the table both transports share)."""
    authenticator = authenticator or Authenticator(None)
    handlers = {name: _method_handler(call, core, authenticator) for name, call in CALLS.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


# -- the edge: the token ---------------------------------------------------------------------------


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, detail: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only answers `code`. Requests stay raw bytes: a refused
    caller's payload is never parsed."""

    async def unary(request, context):
        await context.abort(code, detail)

    async def stream(request, context):
        await context.abort(code, detail)
        yield  # pragma: no cover - makes this an async generator

    shapes = {
        (False, False): grpc.unary_unary_rpc_method_handler(unary),
        (False, True): grpc.unary_stream_rpc_method_handler(stream),
        (True, False): grpc.stream_unary_rpc_method_handler(unary),
        (True, True): grpc.stream_stream_rpc_method_handler(stream),
    }
    return shapes[(handler.request_streaming, handler.response_streaming)]


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without the token (UNAUTHENTICATED) before any handler runs or any request
    byte is parsed."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_METHOD_PREFIXES):
            return handler  # unknown methods answer UNIMPLEMENTED; health is open
        if not self.authenticator.accepts_header(_metadata_value(details.invocation_metadata, METADATA_KEY)):
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAIL)
        return handler


def _metadata_value(metadata: object, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None


# -- the server ----------------------------------------------------------------------------------


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Without this, Linux lets a second daemon bind the same port and steal half the calls.
        ("grpc.so_reuseport", 0),
    ]


async def start_grpc_server(
    core: SidecarService,
    address: str,
    max_message_bytes: int,
    authenticator: Authenticator | None = None,
    serving: bool = True,
    more_hosts: tuple[str, ...] = (),
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Bind and start. `address` is "host:port" or "unix:PATH" (made owner-only); `more_hosts`
    are listened on at the same port. Returns the server, its health servicer and the bound port
    (useful with port 0; 0 for a Unix socket).

    Health answers NOT_SERVING until the caller marks it SERVING when `serving` is False (the
    daemon listens before its model is loaded). Raises PortInUse when the address is taken. A Unix socket path must already be free: gRPC
    replaces an existing socket file silently, so the caller checks ownership (instance lock) first.
    """
    authenticator = authenticator or Authenticator(None)
    server = grpc.aio.server(options=server_options(max_message_bytes), interceptors=[EdgeInterceptor(authenticator)])
    add_sidecar_service(core, server, authenticator)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server)
    socket_path = address[len("unix:"):] if address.startswith("unix:") else None
    try:
        if socket_path is not None:
            port = _bind_unix_owner_only(server, address, socket_path)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise PortInUse(f"cannot listen on {address}: {e}") from e
    if socket_path is None and port == 0 and not address.endswith(":0"):
        raise PortInUse(f"cannot listen on {address}: the port is in use")
    for host in more_hosts:  # the other addresses --host lists, on the port the first one got
        also = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(also)
        except RuntimeError as e:
            raise PortInUse(f"cannot listen on {also}: {e}") from e
        if bound != port:
            raise PortInUse(f"cannot listen on {also}: the port is in use")
    await server.start()
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)
    return server, health_servicer, 0 if socket_path is not None else port


def _bind_unix_owner_only(server: grpc.aio.Server, address: str, path: str) -> int:
    # The umask makes the socket owner-only from the moment it exists (no window in which another
    # user could connect); the chmod is for platforms whose bind ignores the umask.
    old_umask = os.umask(0o177)
    try:
        bound = server.add_insecure_port(address)
    finally:
        os.umask(old_umask)
    if not bound or not os.path.exists(path):
        raise PortInUse(f"cannot listen on {address}: could not create the socket")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    return bound
