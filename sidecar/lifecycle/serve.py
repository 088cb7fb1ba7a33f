"""`xlm-sidecar serve`: the daemon's lifecycle around one of its two backends.

A local model (sidecar.local.serve: the llama.cpp engine) or a remote inference server
(sidecar.remote.serve). Each is imported only when chosen: remote mode never loads llama.cpp.
"""

from __future__ import annotations

import asyncio

from sidecar.lifecycle.daemon_lifecycle import DaemonLifecycle
from sidecar.settings import Settings


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Run the daemon until SIGINT/SIGTERM or the death of --parent-pid (or until the task is cancelled).

    `ready` is set once generation calls are taken. Raises ModelLoadError or PortInUse when it
    cannot start, InvalidArgument for settings that do not go together; the CLI turns those into
    exit codes.
    """
    # Entered first: a launcher that stops us the moment we say "listening" gets a clean exit, and a
    # second daemon on the same port or socket fails before spending time on loading the model.
    async with DaemonLifecycle(settings) as lifecycle:
        if settings.remote_url:
            from sidecar.remote.serve import serve_remote

            await serve_remote(settings, lifecycle, ready)
        else:
            from sidecar.local.serve import serve_local

            await serve_local(settings, lifecycle, ready)
