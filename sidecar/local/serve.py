"""`xlm-sidecar serve` with a local model: listen, load the model, serve until told to stop.

The transports are bound first (health NOT_SERVING, phase STARTING then LOADING), so a launcher
can poll from the first second and a taken port fails before any loading; generation calls are
refused with a retry hint until the model is loaded (phase READY, health SERVING, a `ready` log
line). Without a machine profile the plan comes from built-in defaults, and the profile is
measured in the background while the engine is idle (sidecar.profiler.background).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import platformdirs
import structlog

from sidecar import __version__
from sidecar.engine import Engine
from sidecar.model_info.default_model import default_model_path
from sidecar.native.model import check_gguf_file
from sidecar.local.executor import (
    describe_placement,
    engine_config,
    gpu_free_bytes,
    load_plan_inputs,
    load_projector,
    register_devices,
)
from sidecar.lifecycle.daemon_lifecycle import DaemonLifecycle
from sidecar.profiler.refresh import ProfileRefresh, profile_view
from sidecar.guard.frame_guard import GuardSettings
from sidecar.guard.guard_task import FrameGuard
from sidecar.service.budget_control import BudgetControl
from sidecar.service.core import ServiceInfo, SidecarService
from sidecar.memory.footprint import embedder_host_bytes
from sidecar.service.memories import Memories, MemorySettings
from sidecar.service.ram_budget import RamRule
from sidecar.service.transports import start_transports
from sidecar.settings import Settings

log = structlog.get_logger("daemon")


async def serve_local(settings: Settings, lifecycle: DaemonLifecycle, ready: asyncio.Event | None) -> None:
    """Serve the model in this process, through the llama.cpp engine, until the lifecycle says stop."""
    budget = settings.budget_value
    check_gguf_file(settings.model or default_model_path())  # a wrong path fails before listening
    if settings.memory and settings.embedding_model not in ("auto", "words"):
        check_gguf_file(Path(os.path.expanduser(settings.embedding_model)))
    settings.sequences()  # and so does a RAM budget too small for the model
    info = ServiceInfo(
        __version__, (), settings.max_message_bytes, settings.stream_interval_ms / 1000.0, settings.max_image_bytes,
        settings.ram_budget_bytes, settings.vision_reserved_bytes, game_pid=settings.game_pid,
    )
    service = SidecarService(None, budget, info)
    transports = await start_transports(service, settings, lifecycle.authenticator, serving=False)
    service.info = replace(info, listen_addresses=transports.addresses)
    lifecycle.listening(transports.port)
    log.info("listening", **transports.log_fields(), **lifecycle.log_fields(), phase="starting")
    engine: Engine | None = None
    refresh: ProfileRefresh | None = None
    guard_task: asyncio.Task | None = None
    try:
        loading = asyncio.ensure_future(_load(settings, budget, service))
        stopped = asyncio.ensure_future(lifecycle.stop.wait())
        await asyncio.wait([loading, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            # Stopped while loading (the game quit, or a signal): the load cannot be interrupted, so
            # it is left to finish in its thread and the process exits without it.
            loading.add_done_callback(_drop_result)
            log.info("stopping", grace_s=0, reason=lifecycle.stop_reason, phase=service.state.current.phase)
            return
        stopped.cancel()
        engine, config, inputs, projector = loading.result()
        service.attach_backend(engine)
        _start_memory(settings, service)
        inputs_holder = [inputs]  # the background profile swaps in better inputs (ProfileRefresh)
        service.budget_control = BudgetControl(
            engine, budget,
            lambda b, micro_batch=None: engine_config(settings, b, inputs_holder[0], projector,
                                                   kv_type=engine.config.kv_type, micro_batch=micro_batch),
            service.state, lambda: gpu_free_bytes(engine.config.device),
            ram_bytes=settings.ram_budget_bytes, ram_rule=RamRule(settings),
            on_ram_shares=lambda shares: service.memories.set_max_total(shares.memories_max),
        )
        await service.budget_control.fit_to_measured()
        guard_task = _start_frame_guard(settings, service, engine)
        await transports.set_serving()
        view = profile_view(inputs)
        service.state.publish(phase="ready", reason="ready", profile=view)
        log.info(
            "ready",
            model=engine.facts.name,
            ctx=config.n_ctx,
            parallel=config.n_seq,
            tier_threads=dict(engine.config.tier_threads),
            placement=describe_placement(engine.config),
            vision=_describe_vision(engine.config),
            planned=inputs is not None,
            profile=view.state,
        )
        if ready is not None:
            ready.set()
        refresh = ProfileRefresh.start_if_needed(settings, inputs, engine, service, inputs_holder)
        await lifecycle.stop.wait()
        log.info("stopping", grace_s=lifecycle.grace_s, reason=lifecycle.stop_reason)
    finally:
        if guard_task is not None:
            guard_task.cancel()
        if refresh is not None:
            refresh.signal_stop()  # at once: a probe must not hold cores during the grace period
        service.begin_drain()
        await transports.stop(lifecycle.grace_s if engine is not None else 0, lifecycle.hurry)
        if refresh is not None:
            await refresh.stop()
        if engine is not None:
            await asyncio.to_thread(engine.close)
        service.memories.close()
        await asyncio.to_thread(service.grammar_checks.close)
        log.info("stopped")


def _start_memory(settings: Settings, service: SidecarService) -> None:
    """NPC memory; its embedding model loads on the memory thread at first use (memories.py)."""
    embedder = settings.memory_embedder
    if embedder != settings.embedding_model:
        log.warning("memory embeddings by words only: the RAM budget cannot hold the embedding model beside a "
                    "conversation; give it about model_mib more", ram_budget_mib=settings.ram_budget_bytes >> 20,
                    model_mib=embedder_host_bytes(settings.embedding_model) >> 20)
    service.memories = Memories(MemorySettings(
        enabled=settings.memory, embedder=embedder,
        cache_dir=Path(platformdirs.user_cache_dir("xlm-sidecar")) / "embedding-models",
        max_total=settings.memories_max, max_per_scope=min(MemorySettings.max_per_scope, settings.memories_max)))


def _start_frame_guard(settings: Settings, service: SidecarService, engine: Engine) -> asyncio.Task:
    """The frame-time guard, watching the game: the process named by --parent-pid, else the one
    that started us (a game that launches the daemon is its parent)."""
    service.frame_guard = FrameGuard(
        GuardSettings(frame_budget_ms=settings.frame_budget_ms, priority=settings.frame_guard_priority),
        settings.frame_guard,
        settings.game_pid, engine.set_pass_limits, lambda: engine.pass_limiter.last_pause_ms,
        busy_since=lambda: engine.busy_since,
    )
    return asyncio.create_task(service.frame_guard.run(), name="frame-guard")


async def _load(settings: Settings, budget, service: SidecarService):
    """Headers, plan and model: (engine, config, plan inputs, projector). Runs in a daemon thread,
    so a stop during a long load does not wait for it."""
    loop = asyncio.get_running_loop()

    def work():
        _hold_for_tests()
        register_devices(settings)  # --rpc servers: before anything lists devices
        # A mismatched pair fails before the model is loaded.
        projector, text_model = load_projector(settings)
        inputs = load_plan_inputs(settings, text_model)
        config = engine_config(settings, budget, inputs, projector)
        loop.call_soon_threadsafe(functools.partial(service.state.publish, phase="loading", reason="loading"))
        log.info("loading model", path=str(config.model_path), budget=budget.describe())
        return Engine(config), config, inputs, projector

    return await _in_daemon_thread(work)


# Test hook: the load waits until this file exists, so tests can watch the phases before READY.
HOLD_ENV = "XLM_SIDECAR_TEST_HOLD_LOAD"


def _hold_for_tests() -> None:
    hold = os.environ.get(HOLD_ENV)
    deadline = time.monotonic() + 120
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


async def _in_daemon_thread(work):
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            outcome = (work(), None)
        except BaseException as e:  # handed to the awaiting coroutine
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the loop is closed: the daemon stopped during the load
            pass

    threading.Thread(target=run, name="xlm-load", daemon=True).start()
    return await future


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():
        if error is None and result is not None:
            result[0].close()  # loaded after the daemon was told to stop
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _drop_result(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result()[0].close()


def _describe_vision(config) -> str:
    v = config.vision
    if v is None:
        return "off"
    return f"{v.projector_path.name}: {v.placement}, flash attention {'on' if v.flash_attention else 'off'}"
