"""The planner's answer: a frozen Schedule the executor applies to llama.cpp, with predictions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DECODE = "decode"
PREFILL = "prefill"
CPU = "CPU"
GPU0 = "GPU0"


@dataclass(frozen=True)
class TierPlan:
    """The plan for forward passes carrying up to `max_tokens` new tokens.

    placement: FULL_GPU, STATIC, DYNAMIC, GPU_STREAMING or CPU_ONLY (the proto's Placement).
    threads: CPU threads for these passes (llama_set_n_threads). predicted_ms_per_pass: one
    pass of `max_tokens` tokens (a prefill tier runs as several micro-batches). runner_up: the
    best other family for this tier and its predicted time ("" and 0 when there is none).
    copy_bytes_per_pass / cpu_busy_ms: weights streamed over PCIe per pass, and the CPU time
    spent while those copies run.
    """

    max_tokens: int
    phase: str
    placement: str
    threads: int
    predicted_ms_per_pass: float
    predicted_tokens_per_s: float
    runner_up: str
    runner_up_ms: float
    copy_bytes_per_pass: float = 0.0
    cpu_busy_ms: float = 0.0


@dataclass(frozen=True)
class UnitPlacement:
    """Where one sub-layer lives and computes.

    resident_on: "GPU0" (weights in VRAM) or "CPU". small_tiers / large_tiers: where it
    computes in passes below / at or above the op-offload threshold ("gpu", "cpu" or
    "streamed").
    """

    unit: str
    kind: str
    layer: int | None
    weight_bytes: int
    resident_on: str
    small_tiers: str
    large_tiers: str


@dataclass(frozen=True)
class Schedule:
    """Everything the executor must set, and what the planner predicts it gives.

    tensor_overrides: (regex, "CPU" | "GPU0") pairs in llama.cpp `-ot` syntax, first match
    wins, applied on top of `n_gpu_layers`. op_offload / op_offload_min_batch: host weights
    are copied to the GPU for ops of at least that many tokens (GGML_OP_OFFLOAD_MIN_BATCH,
    read once per process). threads_decode / threads_prefill: llama_set_n_threads(n_threads,
    n_threads_batch): one-token passes, and every pass of more than one token (batched decode
    included, as llama.cpp applies it); each TierPlan has its own count for setting per pass. micro_batch /
    n_batch / n_outputs_max: llama_context_params. kv_unified: False gives every sequence its
    own KV stream, so a pass attends only to its own sequences' cells (the cost model assumes
    so; in a unified cache every pass attends over all cells in use, masked).
    vram_bytes_by_component: (name, bytes) pairs. predicted_ttft_ms: time to first token for
    a prompt of `reference_prompt_tokens`.
    """

    model: str
    hardware: str
    budget_bytes: int
    max_cpu_threads: int
    ctx: int
    tiers: tuple[TierPlan, ...]
    units: tuple[UnitPlacement, ...]
    residency: str
    tensor_overrides: tuple[tuple[str, str], ...]
    n_gpu_layers: int
    op_offload: bool
    op_offload_min_batch: int
    threads_decode: int
    threads_prefill: int
    micro_batch: int
    n_batch: int
    n_outputs_max: int
    kv_type: str
    kv_on_gpu: bool
    flash_attention: bool
    kv_unified: bool
    vram_bytes_by_component: tuple[tuple[str, int], ...]
    predicted_ttft_ms: float
    reference_prompt_tokens: int
    notes: tuple[str, ...] = ()

    @property
    def vram_bytes(self) -> int:
        return sum(b for _, b in self.vram_bytes_by_component)

    def tier_for(self, n_tokens: int, phase: str | None = None) -> TierPlan:
        """The smallest tier holding a pass of `n_tokens` tokens (of `phase` when given); the
        largest tier when none does."""
        tiers = [t for t in self.tiers if phase is None or t.phase == phase] or list(self.tiers)
        fitting = [t for t in tiers if t.max_tokens >= n_tokens]
        return min(fitting, key=lambda t: t.max_tokens) if fitting else max(tiers, key=lambda t: t.max_tokens)

    def objective(self) -> float:
        """Geometric mean of the tiers' predicted tokens/s: what the search maximises."""
        import math

        rates = [t.predicted_tokens_per_s for t in self.tiers if t.predicted_tokens_per_s > 0]
        return math.exp(sum(math.log(r) for r in rates) / len(rates)) if rates else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists, component pairs a mapping)."""
        data = asdict(self)
        data["vram_bytes_by_component"] = dict(self.vram_bytes_by_component)
        data["tensor_overrides"] = [list(p) for p in self.tensor_overrides]
        data["vram_bytes"] = self.vram_bytes
        return data
