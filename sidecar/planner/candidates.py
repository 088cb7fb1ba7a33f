"""The five plan families, and the residencies a plan search compares.

A residency is fixed when the model loads; what may change from one forward pass to the next
(llama.cpp's op offload, switched by batch size) is whether host-resident weights run on the
CPU or are copied to the GPU for the pass. So one schedule is one residency plus a token
threshold, and each tier's family names what its passes do:

  FULL_GPU       everything resident.
  STATIC         attention and KV pinned, host units (the FFN) run on the CPU.
  DYNAMIC        attention pinned, host FFN weights streamed to the GPU for the pass.
  GPU_STREAMING  every unit runs on the GPU; whatever is not resident (attention included,
                 when it did not all fit) streams in.
  CPU_ONLY       nothing on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model_info.units import ATTENTION, EMBEDDING, SubLayer
from sidecar.planner.budget_fill import FillInputs, Residency, fill_attention_first, full_residency, no_residency
from sidecar.planner.cost_model import ON_CPU, ON_GPU, STREAMED, PassShape, unit_tokens

FULL_GPU = "FULL_GPU"
STATIC = "STATIC"
DYNAMIC = "DYNAMIC"
GPU_STREAMING = "GPU_STREAMING"
CPU_ONLY = "CPU_ONLY"
FAMILIES = (FULL_GPU, STATIC, DYNAMIC, GPU_STREAMING, CPU_ONLY)

# Op offload off: no pass is ever big enough to stream.
NEVER = 1 << 30


@dataclass(frozen=True)
class Candidate:
    """One residency the search evaluates. `streaming`: its passes may stream host weights
    (the residency then reserves a stream slot)."""

    residency: Residency
    streaming: bool

    @property
    def label(self) -> str:
        return self.residency.label + (" (streaming)" if self.streaming else "")


def is_full(residency: Residency, units: tuple[SubLayer, ...]) -> bool:
    """Every unit but the host-side embedding lookup is resident."""
    return all(u.name in residency.resident for u in units if u.kind != EMBEDDING)


def all_attention_pinned(residency: Residency, units: tuple[SubLayer, ...]) -> bool:
    return all(u.name in residency.resident for u in units if u.kind == ATTENTION)


def family(residency: Residency, units: tuple[SubLayer, ...], streams: bool) -> str:
    """The family a pass belongs to, given the residency and whether host weights stream in it."""
    if is_full(residency, units):
        return FULL_GPU
    if not residency.resident and not residency.kv_layers and not streams:
        return CPU_ONLY
    if streams:
        return DYNAMIC if all_attention_pinned(residency, units) else GPU_STREAMING
    return STATIC


def execution(units: tuple[SubLayer, ...], residency: Residency, shape: PassShape, threshold: int) -> tuple[str, ...]:
    """Where each unit computes in one pass: resident units on the GPU; host units are
    copied to the GPU when the op's batch reaches `threshold` (op offload), else run on the
    CPU; the embedding lookup always runs on the host."""
    where = []
    for u in units:
        if u.name in residency.resident:
            where.append(ON_GPU)
        elif u.kind != EMBEDDING and unit_tokens(u, shape) >= threshold:
            where.append(STREAMED)
        else:
            where.append(ON_CPU)
    return tuple(where)


def candidates(inputs: FillInputs, budget: int, has_gpu: bool) -> tuple[Candidate, ...]:
    """Residencies worth comparing within `budget` bytes of VRAM.

    Always CPU only. With a GPU and a budget: everything resident when it fits; otherwise
    the method's fill without a stream slot (static) and with one (dynamic / streaming), and
    pure streaming with nothing pinned when even one layer's attention does not fit.
    """
    found = [Candidate(no_residency(inputs), False)]
    if not has_gpu or budget <= 0:
        return tuple(found)
    full = full_residency(inputs)
    if full.vram_bytes <= budget:
        found.append(Candidate(full, False))
        return tuple(found)
    static = fill_attention_first(inputs, budget, streaming=False)
    if static is not None:
        found.append(Candidate(static, False))
    dynamic = fill_attention_first(inputs, budget, streaming=True)
    if dynamic is not None:
        found.append(Candidate(dynamic, True))
    else:
        bare = no_residency(inputs, streaming=True)
        if bare.vram_bytes <= budget:
            found.append(Candidate(bare, True))
    return tuple(found)


def smallest_gpu_need(inputs: FillInputs) -> int:
    """VRAM the smallest plan that uses the GPU needs: pure streaming, nothing pinned."""
    return no_residency(inputs, streaming=True).vram_bytes
