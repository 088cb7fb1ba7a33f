"""`xlm-sidecar serve`: load the model, listen, serve until told to stop."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from sidecar import __version__
from sidecar.engine import Engine
from sidecar.default_model import default_model_path
from sidecar.engine.native_model import check_gguf_file
from sidecar.executor import (
    describe_placement,
    engine_config,
    gpu_free_bytes,
    load_plan_inputs,
    load_projector,
    register_devices,
)
from sidecar.lifecycle.daemon_lifecycle import DaemonLifecycle
from sidecar.service.budget_control import BudgetControl
from sidecar.service.core import ServiceInfo, SidecarService
from sidecar.service.openai_http import start_http
from sidecar.service.transports import start_transports
from sidecar.settings import Settings

log = structlog.get_logger("daemon")


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Run the daemon until SIGINT/SIGTERM or the death of --parent-pid (or until the task is cancelled).

    Raises ModelLoadError or PortInUse when it cannot start, InvalidArgument for settings that do
    not go together; the CLI turns those into exit codes.
    """
    # Entered first: a launcher that stops us the moment we say "listening" gets a clean exit, and a
    # second daemon on the same port or socket fails before spending time on loading the model.
    async with DaemonLifecycle(settings) as lifecycle:
        await _serve(settings, lifecycle, ready)


async def _serve(settings: Settings, lifecycle: DaemonLifecycle, ready: asyncio.Event | None) -> None:
    if settings.remote_url:
        from sidecar.remote.serve import serve_remote

        await serve_remote(settings, lifecycle, ready)
        return
    budget = settings.budget_value
    check_gguf_file(settings.model or default_model_path())  # a wrong path fails before any profiling
    await asyncio.to_thread(register_devices, settings)  # --rpc servers: before anything lists devices
    # A mismatched pair fails before profiling.
    projector, text_model = await asyncio.to_thread(load_projector, settings)
    inputs = await asyncio.to_thread(load_plan_inputs, settings, text_model)
    config = engine_config(settings, budget, inputs, projector)
    stop = lifecycle.stop  # set by SIGINT/SIGTERM and by the parent's death
    log.info("loading model", path=str(config.model_path), budget=budget.describe())
    engine = await asyncio.to_thread(Engine, config)
    try:
        info = ServiceInfo(
            __version__, (), settings.max_message_bytes, settings.stream_interval_ms / 1000.0, settings.max_image_bytes
        )
        service = SidecarService(engine, budget, info)
        service.budget_control = BudgetControl(
            engine, budget, lambda b: engine_config(settings, b, inputs, projector, kv_type=engine.config.kv_type), service.state,
            lambda: gpu_free_bytes(engine.config.device),
        )
        await service.budget_control.fit_to_measured()
        transports = await start_transports(service, settings, lifecycle.authenticator)
        await start_http(transports, service, settings, lifecycle.authenticator)
        service.info = replace(info, listen_addresses=transports.addresses)
        lifecycle.listening(transports.port)
        log.info(
            "listening",
            **transports.log_fields(),
            **lifecycle.log_fields(),
            model=engine.facts.name,
            ctx=config.n_ctx,
            parallel=config.n_seq,
            tier_threads=dict(config.tier_threads),
            placement=describe_placement(config),
            vision=_describe_vision(config),
            planned=inputs is not None,
        )
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
            log.info("stopping", grace_s=lifecycle.grace_s, reason=lifecycle.stop_reason)
        finally:
            service.begin_drain()
            await transports.stop(lifecycle.grace_s, lifecycle.hurry)
    finally:
        await asyncio.to_thread(engine.close)
        log.info("stopped")


def _describe_vision(config) -> str:
    v = config.vision
    if v is None:
        return "off"
    return f"{v.projector_path.name}: {v.placement}, flash attention {'on' if v.flash_attention else 'off'}"
