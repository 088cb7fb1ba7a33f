"""Roofline cost model: how long one forward pass takes for a placement, from the hardware model.

Every figure here is a pure function of frozen inputs. A pass is priced in two steps: what it
costs wherever its units run (PassFigures: a UnitCost per unit, attention, overheads), then the
sum for one placement; a search keeps the first step in a memo, as it tries many placements of
the same pass. The terms, and why each is there:

  unit on a device   measured kernel time of the nearest profiled op (measured.py), scaled by
                     max(bytes ratio, FLOPs ratio) (the roofline: a kernel below its ridge point
                     costs bytes, above it FLOPs), interpolated over batch (log-log), shape
                     (log of params), weight type (nearest bits per weight) and threads (log);
                     without a profile, max(bytes / bandwidth, FLOPs / FLOP rate).
  attention context  reading the KV cache the new tokens attend to, and the Q.K / P.V FLOPs over
                     it, on the device that holds the cache.
  streamed unit      its weights (for experts, only those the batch touches) cross PCIe, then
                     the GPU computes it. Per split, time = max(compute, overlap x prefetch of the
                     next split) + (1 - overlap) x that prefetch: llama.cpp's op offload copies
                     synchronously (overlap 0); a double-buffered executor hides it (overlap 1).
  busy figures       while copies run the CPU is slower (its kernels by the profile's busy
                     factor) and so is PCIe (the busy bandwidth), when the two really overlap.
  device switches    each hand-over between CPU and GPU synchronises and moves the activations.
  overheads          per layer (norms, rope, residual adds, barriers) and per pass (graph build,
                     launch), from the profile's skeleton probes or the constants below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.model_info.kv import attention_flops, kv_read_bytes
from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import ATTENTION, EMBEDDING, MOE_EXPERTS, OUTPUT, SubLayer
from sidecar.planner.hardware_model import GB, GRAPH_OVERHEAD, LAYER_OVERHEAD, ON_CPU, ON_GPU, HardwareModel
from sidecar.planner.measured import measured_overhead, measured_seconds
from sidecar.planner.placement_sum import (
    STREAMED, PassCost, UnitColumns, UnitLayout, placement_masks, placement_sum, unit_columns, unit_layout,
)
from sidecar.profiler.plan import OP_ATTENTION, OP_FFN, OP_MOE

# A unit runs on the CPU (ON_CPU), on the GPU from VRAM (ON_GPU), or on the GPU with its weights
# copied over for the pass (STREAMED, defined beside the sum that reads it).

# --- GPU constants (used where the profile has no GPU figures) -------------------------------
# Quantized mat-vec kernels reach about this share of the data-sheet VRAM bandwidth.
GPU_BW_EFFICIENCY = 0.75
# Quantized matmul (dequantize + MMQ / cuBLAS) reaches about this share of data-sheet FLOPs; so do
# the vision encoder's products (vision.py).
GPU_COMPUTE_EFFICIENCY = 0.5
# Launch and tail of one kernel; a sub-layer is several kernels.
GPU_KERNEL_S = 5e-6
GPU_KERNELS_PER_UNIT = 6
# Graph build and the final synchronisation of a pass that uses the GPU.
GPU_PASS_OVERHEAD_S = 250e-6
# Norms, rope, residual adds of one layer on the GPU: a handful of small kernels.
GPU_LAYER_OVERHEAD_S = 40e-6

# --- CPU constants (used where the profile has no figure) ------------------------------------
# One token's mat-vec cannot use the SIMD units fully (no reuse of a loaded weight, no
# repacked GEMM); the efficiency climbs to 1 by CPU_FULL_BATCH tokens.
CPU_MATVEC_EFFICIENCY = 0.3
CPU_FULL_BATCH = 32
# A second hardware thread on a core adds this share of a core.
SMT_GAIN = 0.2
# Float weights run the CPU's float kernels, slower than the integer-dot quantized ones.
CPU_FLOAT_FACTOR = 0.6
# Attention over the cache (F16 dot products, softmax) runs below matmul throughput.
CPU_ATTENTION_EFFICIENCY = 0.5
CPU_LAYER_OVERHEAD_S = 15e-6
CPU_GRAPH_OVERHEAD_S = 60e-6

# --- the link ---------------------------------------------------------------------------------
# A CPU<->GPU hand-over: synchronise both sides plus the latency of a small copy.
DEVICE_SWITCH_S = 30e-6
# Latency of starting one host-to-device copy.
PCIE_COPY_LATENCY_S = 10e-6

# Profile op names by unit kind: which measured kernel a unit's time is read from.
_OP_BY_KIND = {ATTENTION: OP_ATTENTION, MOE_EXPERTS: OP_MOE}
_FALLBACK_OPS = {OP_ATTENTION: (OP_ATTENTION, OP_FFN), OP_FFN: (OP_FFN, OP_ATTENTION),
                 OP_MOE: (OP_MOE, OP_FFN, OP_ATTENTION)}


@dataclass(frozen=True)
class ExecutorModel:
    """What the executor can overlap: share of a streamed copy hidden under the previous compute."""

    name: str
    copy_overlap: float


# llama.cpp's op offload copies a host weight synchronously before the op that needs it.
OP_OFFLOAD = ExecutorModel("llama.cpp op offload (copy, then compute)", 0.0)
# The method's double-buffered slot: the next copy runs while this split computes.
DOUBLE_BUFFERED = ExecutorModel("double-buffered streaming", 1.0)


@dataclass(frozen=True)
class PassShape:
    """One forward pass: `tokens` new tokens from `n_seq` sequences, each of which has `context`
    tokens cached already, asking for `n_outputs` rows of logits."""

    tokens: int
    n_seq: int
    context: int
    n_outputs: int

    @staticmethod
    def decode(n_seq: int, context: int) -> PassShape:
        """One new token for each of `n_seq` sequences, every one of them wanting logits."""
        return PassShape(n_seq, n_seq, context, n_seq)

    @staticmethod
    def prefill(tokens: int, offset: int = 0, last: bool = True) -> PassShape:
        """A chunk of one prompt starting at `offset`; only the prompt's last chunk wants logits."""
        return PassShape(tokens, 1, offset, 1 if last else 0)


# ------------------------------------------------------------------ roofline fallbacks


def cpu_bandwidth_gbps(hw: HardwareModel, threads: int) -> float:
    """DRAM bandwidth `threads` threads can stream: one core's share each, up to the bus."""
    return min(hw.cpu.dram_gbps, hw.cpu.gbps_per_core * max(1, threads))


def effective_cores(hw: HardwareModel, threads: int) -> float:
    """Cores' worth of compute from `threads` threads: full cores first, then SMT siblings."""
    c = hw.cpu
    full = min(threads, c.physical_cores)
    smt = max(0, min(threads, c.logical_cores) - c.physical_cores)
    return max(1.0, full + SMT_GAIN * smt)


def cpu_flops_rate(hw: HardwareModel, threads: int, batch: float, weight_type: str) -> float:
    """Matmul FLOP/s on the CPU for `batch` tokens (roofline constant, no profile)."""
    eff = min(1.0, CPU_MATVEC_EFFICIENCY + (1 - CPU_MATVEC_EFFICIENCY) * math.log2(max(batch, 1))
              / math.log2(CPU_FULL_BATCH))
    kind = CPU_FLOAT_FACTOR if weight_type.upper() in ("F16", "BF16", "F32") else 1.0
    return hw.cpu.gflops_per_core * GB * effective_cores(hw, threads) * eff * kind


def _roofline_cpu(hw: HardwareModel, unit_bytes: float, unit_flops: float, batch: float, threads: int,
                  weight_type: str) -> float:
    return max(unit_bytes / (cpu_bandwidth_gbps(hw, threads) * GB),
               unit_flops / cpu_flops_rate(hw, threads, batch, weight_type))


def _roofline_gpu(hw: HardwareModel, unit_bytes: float, unit_flops: float) -> float:
    g = hw.gpu
    assert g is not None
    return (max(unit_bytes / (g.mem_gbps * GB * GPU_BW_EFFICIENCY),
                unit_flops / (g.tflops * 1e12 * GPU_COMPUTE_EFFICIENCY))
            + GPU_KERNELS_PER_UNIT * GPU_KERNEL_S)


# ------------------------------------------------------------------ per unit


def unit_tokens(unit: SubLayer, shape: PassShape) -> int:
    """Rows the unit multiplies in this pass: logits rows for the output, all tokens otherwise."""
    return shape.n_outputs if unit.kind == OUTPUT else shape.tokens


def compute_seconds(hw: HardwareModel, unit: SubLayer, device: str, shape: PassShape, threads: int,
                    busy: bool = False) -> float:
    """Seconds `device` ("cpu" or "gpu") spends on the unit's matrix products in this pass.

    `busy`: a host-to-device copy runs at the same time (CPU kernels then use the busy figures).
    """
    tokens = unit_tokens(unit, shape)
    if tokens <= 0:
        return 0.0
    unit_bytes = unit.bytes_read(tokens)
    unit_flops = unit.flops(tokens)
    if unit.kind == EMBEDDING:
        # A row lookup: bandwidth only.
        bw = cpu_bandwidth_gbps(hw, threads) if device == ON_CPU else hw.gpu.mem_gbps  # type: ignore[union-attr]
        return unit_bytes / (bw * GB)
    op = _OP_BY_KIND.get(unit.kind, OP_FFN)
    params = unit.flops_per_token / 2.0
    for candidate in _FALLBACK_OPS[op]:
        batch: float = tokens
        if unit.kind == MOE_EXPERTS and candidate != OP_MOE:
            # Without an expert probe, each touched expert is a dense matmul over its share.
            batch = unit.tokens_per_expert(tokens)
            params = unit.flops_per_token / 2.0 / max(unit.n_expert_used, 1)
        measured = measured_seconds(hw, candidate, device, unit.weight_type, batch, threads, busy,
                                     unit_bytes, unit_flops, params)
        if measured is not None:
            return measured
    if device == ON_GPU:
        return _roofline_gpu(hw, unit_bytes, unit_flops)
    seconds = _roofline_cpu(hw, unit_bytes, unit_flops, tokens, threads, unit.weight_type)
    return seconds * (hw.cpu.busy_slowdown if busy else 1.0)


def copy_seconds(hw: HardwareModel, unit: SubLayer, shape: PassShape, busy: bool = False) -> float:
    """Seconds to copy what the pass needs of a host-resident unit to the GPU.

    Routed experts copy only the experts the batch touches (llama.cpp copies just those).
    """
    g = hw.gpu
    if g is None:
        raise ValueError("no GPU to stream to")
    tokens = unit_tokens(unit, shape)
    if tokens <= 0:
        return 0.0
    gbps = g.pcie_busy_gbps if busy else g.pcie_gbps
    return unit.bytes_read(tokens) / (gbps * GB) + PCIE_COPY_LATENCY_S


def measures_own_attention(hw: HardwareModel, device: str) -> bool:
    """True when the profile's attention op on `device` already includes attention among the
    pass's own tokens (its probe attends over a cache holding exactly the batch)."""
    return any(k[0] == OP_ATTENTION and k[1] == device for k in hw.kernel_series)


def attention_context_seconds(hw: HardwareModel, model: ModelInfo, layer: int, device: str, shape: PassShape,
                              threads: int, kv_type: str) -> float:
    """Seconds for the new tokens of one layer to attend to what they see: the `shape.context`
    cached tokens and, unless the measured attention op already covers it, on average half of
    their own sequence's new tokens (causal).

    Each sequence reads its own cache once; every token does the Q.K and P.V work over it.
    """
    own = 0.0 if measures_own_attention(hw, device) else shape.tokens / max(shape.n_seq, 1) / 2.0
    seen = shape.context + own
    if seen <= 0:
        return 0.0
    read = shape.n_seq * kv_read_bytes(model, layer, int(round(seen)), kv_type)
    flops = shape.tokens * attention_flops(model, layer, int(round(seen)))
    if device == ON_GPU:
        g = hw.gpu
        assert g is not None
        return max(read / (g.mem_gbps * GB * GPU_BW_EFFICIENCY), flops / (g.tflops * 1e12 * GPU_COMPUTE_EFFICIENCY))
    rate = cpu_flops_rate(hw, threads, shape.tokens, "F16") * CPU_ATTENTION_EFFICIENCY
    return max(read / (cpu_bandwidth_gbps(hw, threads) * GB), flops / rate)


def layer_overhead_seconds(hw: HardwareModel, device: str, tokens: int, threads: int) -> float:
    """Per-layer time outside the weight products (norms, rope, residuals, barriers)."""
    measured = measured_overhead(hw, LAYER_OVERHEAD, device, tokens, threads)
    if measured is not None:
        return measured
    return GPU_LAYER_OVERHEAD_S if device == ON_GPU else CPU_LAYER_OVERHEAD_S


def graph_overhead_seconds(hw: HardwareModel, uses_cpu: bool, uses_gpu: bool, tokens: int, threads: int) -> float:
    """Per-pass time: graph build, thread start, launch and final synchronisation."""
    total = 0.0
    if uses_cpu or not uses_gpu:
        measured = measured_overhead(hw, GRAPH_OVERHEAD, ON_CPU, tokens, threads)
        total += CPU_GRAPH_OVERHEAD_S if measured is None else measured
    if uses_gpu:
        measured = measured_overhead(hw, GRAPH_OVERHEAD, ON_GPU, tokens, threads)
        total += GPU_PASS_OVERHEAD_S if measured is None else measured
    return total


def switch_seconds(hw: HardwareModel, model: ModelInfo, tokens: int) -> float:
    """One hand-over between CPU and GPU: synchronise and move the activations (F32 rows)."""
    if hw.gpu is None:
        return 0.0
    return DEVICE_SWITCH_S + tokens * model.n_embd * 4 / (hw.gpu.pcie_gbps * GB)


# ------------------------------------------------------------------ one pass


@dataclass(frozen=True, slots=True)
class UnitCost:
    """What one unit costs in one pass for each way it can run (seconds), and what streaming it
    copies. Slots: these are read in the planner's innermost loop."""

    cpu_seconds: float
    # On the CPU while the next unit's copy runs beside it (the profile's busy figures); the idle
    # figure again when the pass cannot overlap copies with compute.
    cpu_contended_seconds: float
    gpu_seconds: float  # inf without a GPU
    copy_seconds: float  # its weights (the experts touched) over PCIe; inf without a GPU
    # The copy while a CPU split runs beside it (the busy PCIe bandwidth); as above without overlap.
    copy_contended_seconds: float
    copy_bytes: float
    # False when the unit multiplies no rows (the output in a pass that wants no logits): it
    # then forces no device switch.
    has_rows: bool


def unit_cost(hw: HardwareModel, unit: SubLayer, shape: PassShape, threads: int, contention: bool) -> UnitCost:
    """The unit's cost in this pass. `contention`: price the busy figures too (only a pass that
    streams under an executor that overlaps copies reads them)."""
    rows = unit_tokens(unit, shape)
    has_gpu = hw.has_gpu
    cpu = compute_seconds(hw, unit, ON_CPU, shape, threads)
    copy = copy_seconds(hw, unit, shape) if has_gpu else math.inf
    return UnitCost(
        cpu_seconds=cpu,
        cpu_contended_seconds=compute_seconds(hw, unit, ON_CPU, shape, threads, busy=True) if contention else cpu,
        gpu_seconds=compute_seconds(hw, unit, ON_GPU, shape, threads) if has_gpu else math.inf,
        copy_seconds=copy,
        copy_contended_seconds=copy_seconds(hw, unit, shape, busy=True) if has_gpu and contention else copy,
        copy_bytes=unit.bytes_read(rows),
        has_rows=rows > 0,
    )


def cost_signature(unit: SubLayer) -> tuple:
    """Everything `unit_cost` reads of a unit: units with equal signatures cost the same."""
    return (unit.kind, unit.weight_type, unit.weight_bytes, unit.flops_per_token, unit.bytes_per_token,
            unit.n_expert, unit.n_expert_used)


@dataclass(frozen=True)
class PassFigures:
    """The part of one pass's cost that does not depend on where units run, for one (hardware,
    model, units, shape, threads, KV type, contention); `pass_figures` makes it."""

    units: tuple[UnitCost, ...]  # one per unit, in order
    # One layer's attention over the cache by (sliding-window layer, device holding its KV).
    attention: Mapping[tuple[bool, str], float]
    layer_overhead: Mapping[str, float]  # by device
    switch_seconds: float  # one CPU<->GPU hand-over
    columns: UnitColumns  # `units` with the units' facts, as arrays for placed_pass_cost


def pass_figures(hw: HardwareModel, model: ModelInfo, units: tuple[SubLayer, ...], shape: PassShape,
                 threads: int, kv_type: str = "F16", contention: bool = False,
                 layout: UnitLayout | None = None) -> PassFigures:
    """The placement-independent figures of one pass (see PassFigures); `layout` is
    `units_layout(model, units)`, when the caller keeps it."""
    if layout is None:
        layout = units_layout(model, units)
    # Every layer's units usually share shape and type: each signature is priced once.
    priced = [unit_cost(hw, u, shape, threads, contention) for u in layout.representatives]
    costs = tuple(priced[i] for i in layout.index.tolist())
    kv_devices = (ON_CPU, ON_GPU) if hw.has_gpu else (ON_CPU,)
    attention = {(sliding, device): attention_context_seconds(hw, model, layer, device, shape, threads, kv_type)
                 for sliding, layer in layout.standing_for.items() for device in kv_devices}
    overhead = {device: layer_overhead_seconds(hw, device, shape.tokens, threads) for device in (ON_CPU, ON_GPU)}
    return PassFigures(costs, attention, overhead, switch_seconds(hw, model, shape.tokens),
                       unit_columns(priced, layout, attention))


def units_layout(model: ModelInfo, units: tuple[SubLayer, ...]) -> UnitLayout:
    """What pass_figures and placed_pass_cost read of `units` (placement_sum.UnitLayout); units
    cost alike when their cost_signature is equal, and layers' attention differs only by sliding
    window (kv.py)."""
    return unit_layout(units, frozenset(model.swa_layers), cost_signature)


@dataclass
class FiguresMemo:
    """Pass figures kept across a search, which prices the same pass under many placements. One
    memo serves one (hardware, model, units) only: those are not part of its keys."""

    figures: dict[tuple[PassShape, int, str, bool], PassFigures] = field(default_factory=dict)
    layout: UnitLayout | None = None


def memoised_pass_figures(memo: FiguresMemo, hw: HardwareModel, model: ModelInfo, units: tuple[SubLayer, ...],
                          shape: PassShape, threads: int, kv_type: str, contention: bool) -> PassFigures:
    """`pass_figures`, kept in `memo` by (shape, threads, KV type, contention)."""
    key = (shape, threads, kv_type, contention)
    figures = memo.figures.get(key)
    if figures is None:
        if memo.layout is None:
            memo.layout = units_layout(model, units)
        figures = memo.figures[key] = pass_figures(hw, model, units, shape, threads, kv_type, contention, memo.layout)
    return figures


def placed_pass_cost(hw: HardwareModel, model: ModelInfo, units: tuple[SubLayer, ...], where: tuple[str, ...],
                     kv_gpu_layers: frozenset[int], shape: PassShape, threads: int, executor: ExecutorModel,
                     figures: PassFigures) -> PassCost:
    """Cost of one pass with unit i running as where[i], summed from the pass's figures
    (placement_sum.py: units run in order; attention over the cache runs where that layer's KV
    lives)."""
    if len(where) != len(units) or len(figures.units) != len(units):
        raise ValueError("one placement and one figure per unit")
    return placement_sum(figures.columns, placement_masks(where), kv_gpu_layers, hw.has_gpu, executor.copy_overlap,
                         figures.switch_seconds, figures.layer_overhead,
                         lambda uses_cpu, uses_gpu: graph_overhead_seconds(hw, uses_cpu, uses_gpu, shape.tokens, threads))


def pass_cost(
    hw: HardwareModel,
    model: ModelInfo,
    units: tuple[SubLayer, ...],
    where: tuple[str, ...],
    kv_gpu_layers: frozenset[int],
    shape: PassShape,
    threads: int,
    kv_type: str = "F16",
    executor: ExecutorModel = OP_OFFLOAD,
    memo: FiguresMemo | None = None,
) -> PassCost:
    """Predicted cost of one pass with unit i running as where[i] ("cpu", "gpu" or "streamed").

    `memo`, when given, keeps the pass's placement-independent figures across calls (same
    hardware, model and units only: see `memoised_pass_figures`).
    """
    if len(where) != len(units):
        raise ValueError("one placement per unit")
    # Busy figures matter only when copies overlap compute: a streaming pass, an overlapping executor.
    contention = STREAMED in where and executor.copy_overlap > 0
    if memo is None:
        figures = pass_figures(hw, model, units, shape, threads, kv_type, contention)
    else:
        figures = memoised_pass_figures(memo, hw, model, units, shape, threads, kv_type, contention)
    return placed_pass_cost(hw, model, units, where, kv_gpu_layers, shape, threads, executor, figures)
