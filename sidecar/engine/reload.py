"""Switching the engine to a new configuration between two forward passes.

A change of threads is read per pass and needs nothing; a RAM budget's shares (the KV's ceiling of
sequences, the prefix cache's and the evicted sessions' bounds) are taken between two passes
without a rebuild (kv_demand.py). Anything else (placement, context, batch
sizes) saves every sequence's KV state to host memory, frees model and context, builds them anew
and restores the sequences, so each conversation goes on where it was; if the new configuration
does not load, the old one is built again around the same saved states.

`Reloading` is a part of Engine (a mixin): it swaps the engine's model, context and encoder,
which only the engine thread may touch.
"""

from __future__ import annotations

import ctypes
import time
from concurrent.futures import Future
from dataclasses import dataclass

import structlog

from sidecar.backend.engine_config import EngineConfig, same_placement
from sidecar.backend.load_report import parse_load_log
from sidecar.backend.phase import EnginePhase
from sidecar.engine.loading import load_model_and_context
from sidecar.errors import EngineFailure, FailedPrecondition, SidecarError

log = structlog.get_logger("engine")

@dataclass
class ReloadRequest:
    config: EngineConfig
    done: Future
    force: bool = False


class Reloading:
    """Engine's reload, on the engine thread (see Engine.reload for the caller's side)."""

    def _reload_if_wanted(self, request: ReloadRequest) -> None:
        """Apply a reload unless its caller gave up (a SetBudget call cancelled by the game): then
        the change is not applied, and the future can no longer take a result."""
        if not request.done.set_running_or_notify_cancel():
            return
        try:
            self._reload(request)
        except Exception as e:  # the engine thread must outlive any one reload
            log.exception("reload failed")
            if not request.done.done():
                request.done.set_exception(EngineFailure(f"reload failed: {type(e).__name__}: {e}"))

    def _reload(self, request: ReloadRequest) -> None:
        """Save every sequence, rebuild model and context with the new configuration, restore."""
        if not request.force and same_placement(self.config, request.config, memory=False):
            # Threads are read per pass, and the RAM budget's shares need no rebuild either.
            if request.config.n_seq != self.config.n_seq and not self.model.plain_kv:
                request.done.set_exception(FailedPrecondition(
                    "this model's KV cache (sliding-window or recurrent) cannot change its number of sequences "
                    "while it runs; give it --ram-budget at launch"))
                return
            request.done.set_result((False, self._take_memory_shares(request.config)))
            return
        t0 = time.perf_counter()
        self.phase = EnginePhase.RELOADING
        saved = {s.seq: self._ctx.save(s.seq) for s in self._slots if s.cached}
        old_config = self.config
        if self.encoder is not None:
            self.encoder.close()  # it holds the old text model's pointer
            self.encoder = None
        self.model_calls.release()  # its embedding context is on the old model
        self.pool.settle()  # and so is a bigger KV cache being made
        # The prompt thread (prompt_prep.py) tokenizes with the model: not while it is freed.
        with self._model_lock:
            self._ctx.close()
            self.model.close()
            try:
                self.model, self._ctx = load_model_and_context(request.config, self.pool.allocated)
                self.config = request.config
                self.load_report = parse_load_log(self.model.load_log + self._ctx.load_log)
                self.model_generation += 1  # prompts built with the old tokenizer are built again
            except SidecarError as e:
                log.error("reload failed; restoring the previous configuration", error=str(e))
                self.model, self._ctx = load_model_and_context(old_config, self.pool.allocated)
                self.model_generation += 1
                self.encoder = self._open_encoder(old_config)
                self._restore_all(saved)
                self.phase = EnginePhase.READY
                request.done.set_exception(e)
                return
        self.encoder = self._open_encoder(self.config)
        self._restore_all(saved)
        # What the status RPC and the prefix cache's sizing read of the model: another model file
        # has other facts and another KV size per token.
        self.facts = self.model.facts()
        self._kv_bytes_per_token = self.model.kv_bytes_per_token_f16()
        self.sharing.kv_bytes_per_token = self._kv_bytes_per_token
        if request.config.model_path != old_config.model_path:
            self.sharing.cache.clear()  # states of another model's KV
            self.prep.contexts.clear()  # and tokens of another tokenizer
        self.sharing.cache.max_bytes = request.config.prefix_cache_bytes
        restored = len(saved)
        saved.clear()
        release_freed_memory()
        self.phase = EnginePhase.READY
        self.last_reload_pause_ms = (time.perf_counter() - t0) * 1000.0
        log.info("reloaded", pause_ms=round(self.last_reload_pause_ms, 1), sequences=restored)
        request.done.set_result((True, self.last_reload_pause_ms))

    def _take_memory_shares(self, config: EngineConfig) -> float:
        """`config` in force between two passes: the prefix cache and the evicted sessions' states
        within their new bounds, the KV's ceiling moved, and the sequences past a lowered one given
        back now where they are idle (the busy ones as their replies end). The resize's pause, ms."""
        self.config = config
        self.pool.take_ceiling(config)
        self.sessions.max_saved_bytes = config.saved_sessions_bytes
        self.sessions.keep_saved_within()
        self.sharing.cache.max_bytes = config.prefix_cache_bytes
        self.sharing.cache.keep_within()
        resizes = self.pool.resizes
        self._shrink_to_ceiling()
        if self.pool.resizes == resizes:
            # The evicted sessions' states and prefixes let go above are pieces of a few MB that
            # glibc keeps (a shrink trims by itself): 24 NPC sessions, then 420M with one sequence
            # allocated, left 477 MiB resident without this.
            release_freed_memory()
        return self.pool.last_resize_ms if self.pool.resizes > resizes else 0.0

    def _restore_all(self, saved: dict[int, bytes]) -> None:
        for seq, state in saved.items():
            self._ctx.restore(seq, state)


def release_freed_memory() -> None:
    """Hand memory freed by a reload back to the OS (glibc's malloc_trim). The saved sequences and
    the old host-side KV cache are freed in pieces of a few MB, which glibc keeps in its heap; a
    game watching our resident memory would see it grow with every budget change (seen in the
    soak on the RPC device: +27% after twelve reloads)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim, or another allocator
        pass
