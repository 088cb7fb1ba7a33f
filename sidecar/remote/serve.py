"""`xlm-sidecar serve --remote-url URL`: the daemon's transports, auth and lifecycle in front of a
RemoteBackend instead of a local model."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

import structlog

from sidecar import __version__
from sidecar.errors import InvalidArgument
from sidecar.lifecycle.daemon_lifecycle import DaemonLifecycle
from sidecar.remote.backend import RemoteBackend, RemoteOptions
from sidecar.remote.budget import RemoteBudget
from sidecar.service.core import ServiceInfo, SidecarService
from sidecar.service.transports import start_transports
from sidecar.settings import Settings

log = structlog.get_logger("daemon")


def remote_options(settings: Settings) -> RemoteOptions:
    """The remote settings, checked: InvalidArgument (exit code 2) for what does not go together."""
    if settings.model is not None:
        raise InvalidArgument("--model and --remote-url do not go together: in remote mode the server runs the model")
    api_key = None
    if settings.remote_api_key_env:
        api_key = os.environ.get(settings.remote_api_key_env)
        if not api_key:
            raise InvalidArgument(f"--remote-api-key-env: the environment variable {settings.remote_api_key_env} is not set")
    return RemoteOptions(
        url=_api_base(settings.remote_url or ""),
        model=settings.remote_model,
        api_key=api_key,
        max_sessions=settings.max_sessions,
        max_tokens_per_request=settings.max_tokens_per_request,
    )


def _api_base(url: str) -> str:
    """The OpenAI API's base URL; a bare "http://host:port" gets the "/v1" every server uses."""
    url = url.rstrip("/")
    scheme_end = url.index("://") + 3
    return url if "/" in url[scheme_end:] else url + "/v1"


async def serve_remote(settings: Settings, lifecycle: DaemonLifecycle, ready: asyncio.Event | None) -> None:
    """Serve the game's API, forwarding generation, until the lifecycle says stop."""
    options = remote_options(settings)
    budget = settings.budget_value
    backend = await RemoteBackend.start(options)
    try:
        info = ServiceInfo(__version__, (), settings.max_message_bytes, settings.stream_interval_ms / 1000.0,
                           game_pid=settings.game_pid)
        service = SidecarService(backend, budget, info)
        service.budget_control = RemoteBudget(budget, service.state)  # type: ignore[assignment]
        # The same OpenAI-compatible API as with a local model, so a plugin that speaks it works in
        # either mode: sessions, budget and auth are the daemon's, generation the server's.
        transports = await start_transports(service, settings, lifecycle.authenticator, model_id=backend.facts.name)
        service.info = replace(info, listen_addresses=transports.addresses)
        lifecycle.listening(transports.port)
        log.info(
            "listening",
            **transports.log_fields(),
            **lifecycle.log_fields(),
            backend="remote",
            remote_url=options.url,
            model=backend.facts.name,
        )
        # Nothing to load in remote mode: ready as soon as it listens (the launch contract's line).
        log.info("ready", backend="remote", model=backend.facts.name)
        if ready is not None:
            ready.set()
        try:
            await lifecycle.stop.wait()
            log.info("stopping", grace_s=lifecycle.grace_s, reason=lifecycle.stop_reason)
        finally:
            service.begin_drain()
            await transports.stop(lifecycle.grace_s, lifecycle.hurry)
    finally:
        await backend.aclose()
        log.info("stopped")
