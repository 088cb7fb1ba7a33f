"""What the engine needs to know to load and run a model, resolved once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import InvalidArgument


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    n_ctx: tokens of KV cache (shared by all conversations while only one sequence exists).
    n_batch: most prompt tokens per forward pass; longer prompts are prefilled in chunks.
    threads_decode / threads_prefill: CPU threads for 1-token passes and for larger passes.
    flash_attention: None lets llama.cpp decide per backend.
    """

    model_path: Path
    n_ctx: int = 4096
    n_batch: int = 512
    threads_decode: int = 1
    threads_prefill: int = 1
    flash_attention: bool | None = None
    n_gpu_layers: int = 0
    max_sessions: int = 64
    max_queue: int = 64
    max_prompt_tokens: int = 0  # 0: three quarters of the context, leaving room for the reply
    max_tokens_per_request: int = 2048

    def __post_init__(self) -> None:
        if not 64 <= self.n_ctx <= 1 << 20:
            raise InvalidArgument(f"context size {self.n_ctx} is out of range (64 .. 1048576)")
        if not 1 <= self.n_batch <= self.n_ctx:
            raise InvalidArgument(f"batch size {self.n_batch} must be between 1 and the context size")
        if self.threads_decode < 1 or self.threads_prefill < 1:
            raise InvalidArgument("thread counts must be at least 1")
        if self.max_prompt_tokens == 0:
            object.__setattr__(self, "max_prompt_tokens", self.n_ctx * 3 // 4)
        if not 1 <= self.max_prompt_tokens < self.n_ctx:
            raise InvalidArgument("max_prompt_tokens must be smaller than the context size")
