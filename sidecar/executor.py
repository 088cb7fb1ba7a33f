"""From the budget in force to what the engine runs: plan, then turn the plan into llama.cpp settings.

Until the planner lands this is the CPU-only plan: all weights in host memory, and the threads of
every token tier capped by what the game allows.
"""

from __future__ import annotations

from sidecar.budget import Budget
from sidecar.default_model import default_model_path
from sidecar.engine import EngineConfig
from sidecar.settings import Settings


def engine_config(settings: Settings, budget: Budget | None = None) -> EngineConfig:
    """The engine configuration for `budget` (default: the one the daemon was started with)."""
    budget = budget or settings.budget_value
    threads = settings.cpu_threads()
    if budget.max_cpu_threads:
        threads = min(threads, budget.max_cpu_threads)
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


def gpu_free_bytes(index: int = 0) -> int | None:
    """Free VRAM on GPU `index` as NVML reports it, or None when there is no NVIDIA GPU or NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, NVMLError (no driver, no device), OSError (no library)
        return None
