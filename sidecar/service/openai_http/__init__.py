"""The OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/models, /health,
in front of the same service core as gRPC and the WebSocket bridge (see README, "OpenAI-compatible
HTTP API")."""

from sidecar.service.openai_http.server import OpenAIHttpServer

__all__ = ["OpenAIHttpServer", "http_port"]


def http_port(settings) -> int | None:
    """The API's port, or None when it is off: --http-port if given (-1 = off); otherwise the gRPC
    port + 2 (0 when gRPC picks a free port). Off with --socket, like the WebSocket bridge."""
    if settings.http_port is not None:
        return None if settings.http_port < 0 else settings.http_port
    if settings.socket is not None:
        return None
    if settings.port == 0 or settings.port >= 65534:
        return 0
    return settings.port + 2


async def start_http(transports, core, settings, authenticator, model_id: str | None = None) -> None:
    """Start the API beside the other transports (transports.start_transports calls it; it is
    added to `transports`, so it drains with them); PortInUse, with everything started stopped
    again, when it cannot listen."""
    from sidecar.service.grpc_server import PortInUse
    from sidecar.settings import format_address

    port = http_port(settings)
    if port is None:
        return
    from sidecar.model_info.default_model import default_model_path

    server = OpenAIHttpServer(core, authenticator, settings.model or default_model_path(), settings.max_tokens_per_request,
                              model_id=model_id, strict_model_names=settings.strict_model_names,
                              cors_origins=settings.cors_origin)
    try:
        bound = await server.start(settings.hosts, port)
    except OSError as e:
        await transports.stop(0)
        where = ", ".join(format_address(host, port) for host in settings.hosts)
        raise PortInUse(f"cannot listen on {where} (HTTP API): {e.strerror or e}; use --http-port or --no-http") from e
    transports.http = server
    transports.http_address = f"http://{format_address(settings.hosts[0], bound)}"
