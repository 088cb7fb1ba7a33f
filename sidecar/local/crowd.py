"""How many conversations the daemon decodes together when `--parallel` is not given.

A town square is a dozen or more NPCs starting to talk at once; with fewer sequences than
speakers the rest wait for whole replies of others before they start. Each sequence has its own
KV stream of `--ctx` cells, allocated (and cleared, so resident) at start-up, so the count is what
that memory affords: the most of AUTO_MAX whose KV fits in KV_SHARE of the host's memory, never
fewer than AUTO_MIN (the old default). SmolLM2-135M at --ctx 4096 takes 94 MB a sequence, so 16
(1.5 GB); a 4B model with 8 KV heads 600 MB, so 4 on a 16 GB machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import psutil

from sidecar.errors import InvalidArgument
from sidecar.memory.footprint import store_bytes

AUTO_MAX = 16
AUTO_MIN = 4
KV_SHARE = 1 / 8
# Sequences allocated at start without --parallel: 2 x 4096 cells is the KV llama-server's
# defaults hold (4 slots sharing 8192 cells); more come as more NPCs talk at once (kv_demand.py).
START_SEQUENCES = 2
# Host memory the process holds besides the model's weights and its KV cache: Python with gRPC, the
# HTTP server and numpy, and llama.cpp's compute buffers at --batch 512 (measured idle with SmolLM2
# at 4 x 4096 cells: 568 MB resident, of which 377 MB KV and 98 MB weights).
PROCESS_BYTES = 100 << 20
# Of a RAM budget, the most the prefix cache may take, and the most the evicted sessions' saved
# KV states may (past it the least recently used keep their text only).
PREFIX_SHARE = 1 / 8
SAVED_SESSIONS_SHARE = 1 / 8
# The vision worker (a process of its own, sidecar/vision) at its peak, an image being encoded on the
# CPU: the worker itself with its vocabulary-only text model (about 60 MB idle), the projector's
# weights (loaded for each image under VLMOpt, so counted whole either way) and the encoder's
# compute buffer, measured on the test projector (README, "Vision"): 121 MiB with flash attention,
# 1132 MiB without. A RAM budget sets this aside whenever a projector is given, since an image can
# come at any moment and the KV cannot be shrunk under live replies to make room for it.
VISION_WORKER_BYTES = 60 << 20
ENCODER_COMPUTE_BYTES = {True: 128 << 20, False: 1152 << 20}


def vision_host_bytes(projector_bytes: int, flash_attention: bool) -> int:
    """Host memory the vision worker may hold while it encodes an image on the CPU."""
    return VISION_WORKER_BYTES + projector_bytes + ENCODER_COMPUTE_BYTES[flash_attention]


def auto_parallel(sequence_kv_bytes: int, host_memory_bytes: int) -> int:
    """Sequences whose KV caches fit in KV_SHARE of `host_memory_bytes`, within AUTO_MIN..AUTO_MAX."""
    fits = int(host_memory_bytes * KV_SHARE) // max(sequence_kv_bytes, 1)
    return max(AUTO_MIN, min(AUTO_MAX, fits))


@lru_cache(maxsize=8)
def _sequence_kv_bytes(model_path: Path, ctx: int) -> int:
    from sidecar.model_info import inspect_gguf, kv_cache_bytes

    return kv_cache_bytes(inspect_gguf(model_path), ctx)


def parallel_for(parallel: int, model_path: Path, ctx: int) -> int:
    """`parallel` when given (non-zero), else the automatic count for this model and context."""
    if parallel:
        return parallel
    from sidecar.model_info.gguf_reader import GgufReadError

    try:
        kv = _sequence_kv_bytes(Path(model_path), ctx)
    except (GgufReadError, OSError):
        return AUTO_MIN  # loading the model says what is wrong with it, with its exit code
    return auto_parallel(kv, psutil.virtual_memory().total)


@dataclass(frozen=True)
class MemoryReserve:
    """What NPC memory takes of a RAM budget (memory/footprint.py): its embedding model whole, and
    the store's share of the budget."""

    model_bytes: int = 0
    store: bool = False

    def bytes(self, ram_budget: int) -> int:
        return self.model_bytes + (store_bytes(ram_budget) if self.store else 0)


NO_MEMORY = MemoryReserve()


def _kv_room(ram_budget: int, model_bytes: int, prefix_cache_bytes: int, vision_bytes: int,
             memory: MemoryReserve = NO_MEMORY) -> int:
    """What `ram_budget` leaves for the KV beside the weights, the process, the vision worker, NPC
    memory and the two caches' shares of it (`prefix_cache_bytes`: --prefix-cache-mb, before its
    share)."""
    saved = int(ram_budget * SAVED_SESSIONS_SHARE)
    prefix = min(prefix_cache_bytes, int(ram_budget * PREFIX_SHARE))
    return ram_budget - PROCESS_BYTES - model_bytes - prefix - saved - vision_bytes - memory.bytes(ram_budget)


def smallest_ram_budget(model_bytes: int, sequence_kv_bytes: int, prefix_cache_bytes: int,
                        vision_bytes: int = 0, memory: MemoryReserve = NO_MEMORY) -> int:
    """The smallest budget in whole MiB that holds one conversation, by the very rule that checks
    a budget: the caches' shares grow with the budget, so the figure is searched, not summed (a
    refusal that named the sum at the refused budget named a figure that was refused too)."""
    def holds(mib: int) -> bool:
        return _kv_room(mib << 20, model_bytes, prefix_cache_bytes, vision_bytes, memory) >= max(sequence_kv_bytes, 1)

    high = 1
    while not holds(high):
        high *= 2
    low = high // 2  # does not hold (or is 0); what it leaves only grows with the budget
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high << 20


def sequences_within(ram_budget: int, model_bytes: int, sequence_kv_bytes: int, prefix_cache_bytes: int, ctx: int,
                     budget_name: str = "--ram-budget", vision_bytes: int = 0,
                     memory: MemoryReserve = NO_MEMORY) -> int:
    """Sequences whose KV fits in `ram_budget` beside the weights, the process, the prefix cache and
    the vision worker; InvalidArgument, naming the smallest budget that holds one, when not even one
    does (`budget_name`: the flag or field the budget came in, SetBudget's ram_size at runtime).
    `prefix_cache_bytes` is --prefix-cache-mb: a budget caps it at its share."""
    n = _kv_room(ram_budget, model_bytes, prefix_cache_bytes, vision_bytes, memory) // max(sequence_kv_bytes, 1)
    if n < 1:
        need = smallest_ram_budget(model_bytes, sequence_kv_bytes, prefix_cache_bytes, vision_bytes, memory)
        prefix = min(prefix_cache_bytes, int(need * PREFIX_SHARE))
        vision = f", the vision worker encoding {vision_bytes >> 20}" if vision_bytes else ""
        vision += f", NPC memory {memory.bytes(need) >> 20}" if memory.bytes(need) else ""
        raise InvalidArgument(
            f"{budget_name} {ram_budget >> 20} MiB is below what this model needs: {need >> 20} MiB ({budget_name} "
            f"{need >> 20}M holds one conversation: weights {model_bytes >> 20}, its KV at --ctx {ctx} "
            f"{sequence_kv_bytes >> 20}, prefix cache {prefix >> 20}, evicted sessions "
            f"{int(need * SAVED_SESSIONS_SHARE) >> 20}{vision}, the process {PROCESS_BYTES >> 20}); "
            "give more, or lower --ctx")
    return int(n)


def ram_ceiling(ram_budget: int, model_path: Path, ctx: int, prefix_cache_bytes: int,
                budget_name: str = "--ram-budget", vision_bytes: int = 0, memory: MemoryReserve = NO_MEMORY) -> int:
    """The most sequences a RAM budget holds for this model and context."""
    from sidecar.model_info.gguf_reader import GgufReadError

    try:
        kv = _sequence_kv_bytes(Path(model_path), ctx)
        size = Path(model_path).stat().st_size
    except (GgufReadError, OSError):
        return AUTO_MIN  # loading the model says what is wrong with it
    return sequences_within(ram_budget, size, kv, prefix_cache_bytes, ctx, budget_name, vision_bytes, memory)
