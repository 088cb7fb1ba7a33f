"""`xlm-sidecar serve`: load the model, listen, serve until told to stop."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace

import structlog

from sidecar import __version__
from sidecar.default_model import default_model_path
from sidecar.engine import Engine, EngineConfig
from sidecar.service.core import ServiceInfo, SidecarService
from sidecar.service.grpc_server import start_grpc_server
from sidecar.settings import Settings, format_address

log = structlog.get_logger("daemon")

SHUTDOWN_GRACE_S = 5.0


def engine_config(settings: Settings) -> EngineConfig:
    """The engine's settings from the daemon's. The schedule (placement, threads per tier) will
    come from the planner; until then the model runs on the CPU with one thread count."""
    threads = settings.cpu_threads()
    return EngineConfig(
        model_path=settings.model or default_model_path(),
        n_ctx=settings.ctx,
        n_seq=settings.parallel,
        n_batch=settings.batch,
        threads_decode=threads,
        threads_prefill=threads,
        flash_attention=settings.flash_attention_flag,
        n_gpu_layers=0,
        max_sessions=settings.max_sessions,
        max_prompt_tokens=min(settings.max_prompt_tokens, settings.ctx - 1),  # 0 stays 0: the engine's default
        max_tokens_per_request=settings.max_tokens_per_request,
    )


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Run the daemon until SIGINT/SIGTERM (or until the task is cancelled).

    Raises ModelLoadError or PortInUse when it cannot start; the CLI turns those into exit codes.
    """
    config = engine_config(settings)
    budget = settings.budget_value
    # Installed first, so a launcher that stops us the moment we say "listening" gets a clean exit.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
            pass
    log.info("loading model", path=str(config.model_path), budget=budget.describe())
    engine = await asyncio.to_thread(Engine, config)
    try:
        info = ServiceInfo(__version__, (), settings.max_message_bytes, settings.stream_interval_ms / 1000.0)
        service = SidecarService(engine, budget, info)
        server, health_servicer, port = await start_grpc_server(service, settings.address, settings.max_message_bytes)
        address = format_address(settings.host, port)
        service.info = replace(info, listen_addresses=(address,))
        log.info(
            "listening",
            address=address,
            model=engine.facts.name,
            threads=config.threads_decode,
            ctx=config.n_ctx,
            placement="cpu only (the VRAM planner is not in this version)",
        )
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
            log.info("stopping", grace_s=SHUTDOWN_GRACE_S)
        finally:
            service.begin_drain()
            await health_servicer.enter_graceful_shutdown()
            await server.stop(SHUTDOWN_GRACE_S)
    finally:
        await asyncio.to_thread(engine.close)
        log.info("stopped")
