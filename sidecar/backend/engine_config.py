"""What the engine needs to know to load and run a model, resolved once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sidecar.errors import InvalidArgument
from sidecar.vision.encoder_settings import EncoderSettings


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    n_ctx: context per conversation (tokens of KV cache each sequence may hold).
    n_seq: conversations held in the KV cache at once; more sessions than this are evicted to host
        memory, least recently used first, and restored when they speak again.
    n_batch: most tokens in one forward pass (prefill chunks plus decode tokens).
    n_ubatch: most tokens llama.cpp computes at once inside a pass (the micro-batch).
    tier_threads: (max_tokens, threads) pairs, ascending: a pass of n tokens runs with the threads
        of the smallest tier holding n. Empty means threads_decode for 1 token, threads_prefill above.
    flash_attention: None lets llama.cpp decide per backend.
    n_gpu_layers, tensor_overrides, op_offload, kv_on_gpu: where weights, KV cache and the
        operations on host-resident weights live (the schedule's placement).
    """

    model_path: Path
    n_ctx: int = 4096
    n_seq: int = 4
    # Sequences allocated at start; more, up to n_seq, when more conversations run at once, and
    # back down when they go quiet (engine/kv_demand.py). 0 allocates all n_seq from the start.
    n_seq_start: int = 0
    # Grow the KV beside the loop (the streams running do not pause for the allocation, but the old
    # and the new context are held at once while it is made), or in it (freeing the old first: a
    # RAM budget holds, and every stream pauses for the allocation).
    grow_beside: bool = True
    n_batch: int = 512
    n_ubatch: int = 0  # 0: same as n_batch
    threads_decode: int = 1
    threads_prefill: int = 1
    tier_threads: tuple[tuple[int, int], ...] = field(default=())
    flash_attention: bool | None = None
    n_gpu_layers: int = 0
    # (regex, "CPU" | ggml device name) pairs, first match wins: the planner's sub-layer placement.
    tensor_overrides: tuple[tuple[str, str], ...] = ()
    op_offload: bool = True
    kv_on_gpu: bool = True
    # The KV cache's ggml type ("F16"; "Q8_0" when the planner needs it to keep attention pinned).
    kv_type: str = "F16"
    # Most tokens of one pass that ask for logits (0: n_batch). The engine asks for one per
    # sequence at most, so n_seq always suffices; the plan sizes the logits buffer from this.
    n_outputs_max: int = 0
    # Step threads down when passes run far slower than planned (a busy CPU), and back up. Off
    # pins every pass to its tier's threads: llama.cpp's CPU kernels round differently at other
    # thread counts, so only then is greedy text the same whatever else the machine runs.
    adaptive_threads: bool = True
    # Text a request's grammar forces is fed in one pass instead of one pass a token
    # (jump_forward.py); off, constrained replies decode token by token as llama.cpp's server does.
    jump_forward: bool = True
    # While a reply streams, a pass carries only the prompt tokens that keep it near a stream's
    # pass time (prompt_budget.py). The cut depends on measured times, so batch layouts vary from
    # run to run: off gives the fixed layouts token comparisons need.
    prompt_slices_beside_replies: bool = True
    max_sessions: int = 64
    max_queue: int = 256
    max_prompt_tokens: int = 0  # 0: three quarters of the context, leaving room for the reply
    max_tokens_per_request: int = 2048
    # Host memory for shared prompt prefixes (prefix_cache.py); 0 turns sharing off.
    prefix_cache_bytes: int = 256 << 20
    # Host memory for evicted sessions' KV states (0: no cap); past it the least recently used
    # sessions keep only their text and rebuild their cache when they speak (a RAM budget sets it).
    saved_sessions_bytes: int = 0
    # VRAM the planner expects this placement to take (0 without a plan): checked after loading
    # against what llama.cpp really allocated.
    planned_vram_bytes: int = 0
    # The ggml device the GPU placement is on ("CUDA0", "RPC0"; "CPU" without one): whose buffers
    # count against the budget.
    device: str = "CPU"
    # The planner's Schedule this configuration came from (None without a plan): status shows
    # its predictions per tier next to what the engine measures.
    schedule: object | None = field(default=None, compare=False)
    # The vision encoder (--mmproj), placed by the vision plan; None serves text only.
    vision: EncoderSettings | None = None

    def __post_init__(self) -> None:
        if not 64 <= self.n_ctx <= 1 << 20:
            raise InvalidArgument(f"context size {self.n_ctx} is out of range (64 .. 1048576)")
        if not 1 <= self.n_seq <= 256:
            raise InvalidArgument(f"parallel conversations {self.n_seq} out of range (1 .. 256)")
        if not 0 <= self.n_seq_start <= self.n_seq:
            raise InvalidArgument(f"starting sequences {self.n_seq_start} out of range (0 .. {self.n_seq})")
        if not 1 <= self.n_batch <= 1 << 16:
            raise InvalidArgument(f"batch size {self.n_batch} out of range (1 .. 65536)")
        if self.n_ubatch == 0:
            object.__setattr__(self, "n_ubatch", self.n_batch)
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise InvalidArgument("the micro-batch must be between 1 and the batch size")
        if self.threads_decode < 1 or self.threads_prefill < 1:
            raise InvalidArgument("thread counts must be at least 1")
        if not self.tier_threads:
            tiers = ((1, self.threads_decode), (self.n_batch, self.threads_prefill))
            object.__setattr__(self, "tier_threads", tiers)
        if self.max_prompt_tokens == 0:
            object.__setattr__(self, "max_prompt_tokens", self.n_ctx * 3 // 4)
        if not 1 <= self.max_prompt_tokens < self.n_ctx:
            raise InvalidArgument("max_prompt_tokens must be smaller than the context size")


# Read per pass (threads) or only reported (the schedule's predictions): changing them needs no reload.
_THREAD_FIELDS = {"threads_decode", "threads_prefill", "tier_threads", "schedule"}


# A RAM budget's shares (SetBudget.ram_size): the engine takes them between passes, resizing its
# sequences as kv_demand.py does, with no rebuild of the model.
MEMORY_FIELDS = {"n_seq", "n_seq_start", "grow_beside", "prefix_cache_bytes", "saved_sessions_bytes", "n_outputs_max"}


def same_placement(a: EngineConfig, b: EngineConfig, *, memory: bool = True) -> bool:
    """True when two configurations differ at most in threads, which need no reload; with
    `memory=False`, in threads and the RAM budget's shares (MEMORY_FIELDS), which need none either."""
    ignored = _THREAD_FIELDS if memory else _THREAD_FIELDS | MEMORY_FIELDS
    return all(getattr(a, f) == getattr(b, f) for f in a.__dataclass_fields__ if f not in ignored)
