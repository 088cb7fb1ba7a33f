"""Switching the engine to a new configuration between two forward passes.

A change of threads is read per pass and needs nothing; a RAM budget's shares (the KV's ceiling of
sequences, the prefix cache's and the evicted sessions' bounds) are taken between two passes
without a rebuild (kv_demand.py). Anything else (placement, context, batch
sizes) saves every sequence's KV state to host memory, frees model and context, builds them anew
and restores the sequences, so each conversation goes on where it was; if the new configuration
does not load, the old one is built again around the same saved states.

These functions take the engine whole: a reload swaps its model, context and encoder, which only
the engine thread may touch.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from sidecar.backend.engine_config import EngineConfig, same_placement
from sidecar.backend.phase import EnginePhase
from sidecar.engine.jump_forward import ForcedText
from sidecar.engine.loading import load_model_and_context, load_report_of
from sidecar.engine.kv_resizing import shrink_to_ceiling
from sidecar.engine.memory_trim import release_freed_memory
from sidecar.errors import EngineFailure, FailedPrecondition, SidecarError

if TYPE_CHECKING:  # the engine imports this module
    from sidecar.engine.engine import Engine

log = structlog.get_logger("engine")


@dataclass
class ReloadRequest:
    config: EngineConfig
    done: Future
    force: bool = False


def reload_if_wanted(engine: Engine, request: ReloadRequest) -> None:
    """Apply a reload unless its caller gave up (a SetBudget call cancelled by the game): then
    the change is not applied, and the future can no longer take a result."""
    if not request.done.set_running_or_notify_cancel():
        return
    try:
        _reload(engine, request)
    except Exception as e:  # the engine thread must outlive any one reload
        log.exception("reload failed")
        if not request.done.done():
            request.done.set_exception(EngineFailure(f"reload failed: {type(e).__name__}: {e}"))


def _reload(engine: Engine, request: ReloadRequest) -> None:
    """Save every sequence, rebuild model and context with the new configuration, restore."""
    if not request.force and same_placement(engine.config, request.config, memory=False):
        # Threads are read per pass, and the RAM budget's shares need no rebuild either.
        if request.config.n_seq != engine.config.n_seq and not engine.model.plain_kv:
            request.done.set_exception(FailedPrecondition(
                "this model's KV cache (sliding-window or recurrent) cannot change its number of sequences "
                "while it runs; give it --ram-budget at launch"))
            return
        request.done.set_result((False, _take_memory_shares(engine, request.config)))
        return
    t0 = time.perf_counter()
    engine.phase = EnginePhase.RELOADING
    saved = {s.seq: engine.ctx.save(s.seq) for s in engine.slots if s.cached}
    old_config = engine.config
    if engine.encoder is not None:
        engine.encoder.close()  # it holds the old text model's pointer
        engine.encoder = None
    engine.model_calls.release()  # its embedding context is on the old model
    engine.pool.settle()  # and so is a bigger KV cache being made
    # The prompt thread (prompt_prep.py) tokenizes with the model: not while it is freed.
    with engine.model_lock:
        engine.ctx.close()
        engine.model.close()
        try:
            engine.model, engine.ctx = load_model_and_context(request.config, engine.pool.allocated)
            engine.config = request.config
            # The KV's ceiling follows the new configuration here too: growth read config.n_seq
            # and a lowered budget's shrink read the pool's, which only the in-place path moved.
            engine.pool.take_ceiling(request.config)
            engine.load_report = load_report_of(engine.model, engine.ctx)
            engine.model_generation += 1  # prompts built with the old tokenizer are built again
        except SidecarError as e:
            log.error("reload failed; restoring the previous configuration", error=str(e))
            engine.model, engine.ctx = load_model_and_context(old_config, engine.pool.allocated)
            engine.model_generation += 1
            engine.encoder = engine.open_encoder(old_config)
            _restore_all(engine, saved)
            engine.phase = EnginePhase.READY
            request.done.set_exception(e)
            return
    engine.encoder = engine.open_encoder(engine.config)
    _restore_all(engine, saved)
    # What the status RPC and the prefix cache's sizing read of the model: another model file
    # has other facts and another KV size per token.
    engine.facts = engine.model.facts()
    engine.forced_text = ForcedText(engine.model) if engine.config.jump_forward else None
    engine.kv_bytes_per_token = engine.model.kv_bytes_per_token_f16()
    engine.sharing.kv_bytes_per_token = engine.kv_bytes_per_token
    if request.config.model_path != old_config.model_path:
        engine.sharing.cache.clear()  # states of another model's KV
        engine.prep.contexts.clear()  # and tokens of another tokenizer
    engine.sharing.cache.max_bytes = request.config.prefix_cache_bytes
    restored = len(saved)
    saved.clear()
    release_freed_memory()
    engine.phase = EnginePhase.READY
    engine.last_reload_pause_ms = (time.perf_counter() - t0) * 1000.0
    log.info("reloaded", pause_ms=round(engine.last_reload_pause_ms, 1), sequences=restored)
    request.done.set_result((True, engine.last_reload_pause_ms))


def _take_memory_shares(engine: Engine, config: EngineConfig) -> float:
    """`config` in force between two passes: the prefix cache and the evicted sessions' states
    within their new bounds, the KV's ceiling moved, and the sequences past a lowered one given
    back now where they are idle (the busy ones as their replies end). The resize's pause, ms."""
    engine.config = config
    engine.pool.take_ceiling(config)
    engine.sessions.max_saved_bytes = config.saved_sessions_bytes
    engine.sessions.keep_saved_within()
    engine.sharing.cache.max_bytes = config.prefix_cache_bytes
    engine.sharing.cache.keep_within()
    resizes = engine.pool.resizes
    shrink_to_ceiling(engine)
    if engine.pool.resizes == resizes:
        # The evicted sessions' states and prefixes let go above are pieces of a few MB that
        # glibc keeps (a shrink trims by itself): 24 NPC sessions, then 420M with one sequence
        # allocated, left 477 MiB resident without this.
        release_freed_memory()
    return engine.pool.last_resize_ms if engine.pool.resizes > resizes else 0.0


def _restore_all(engine: Engine, saved: dict[int, bytes]) -> None:
    for seq, state in saved.items():
        engine.ctx.restore(seq, state)
