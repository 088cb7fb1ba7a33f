"""Timing the sub-layers of one (shape, weight type) on one device, from probe models.

How one entry is derived (see probe_models for what a probe holds):
  per-layer seconds = (T_probe(L) - T_skeleton(L)) / L
where T is the median decode time at one (batch, threads) point and L the probe's depth.
T_skeleton(L) is interpolated linearly from skeletons of depth 1 and depth L_max (the
per-layer stand-in cost is the same in every layer), so only two skeletons are timed.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from sidecar.profiler.database import KernelEntry
from sidecar.profiler.kernels import RepeatPolicy, time_probe
from sidecar.profiler.plan import OP_GRAPH_OVERHEAD, OP_LAYER_OVERHEAD, ProbeShape, ProfilePlan
from sidecar.profiler.probe_models import SKELETON, deep_probe, one_layer_probe, probe_weights

# GPU caches reach ~100 MB; a deep GPU probe must be well past that to be VRAM-bound.
GPU_DEEP_TARGET_BYTES = 512 << 20
GPU_DEPTH_FACTOR = 8
# An op measured at or below this share of its probe's time is noise, not a measurement.
CLAMP_SHARE = 0.05


@dataclass(frozen=True)
class ProbeSetup:
    """What every probe of one profile run shares: plan, thread counts, files, repeats."""

    plan: ProfilePlan
    threads: tuple[int, ...]
    policy: RepeatPolicy
    cache_dir: Path
    scratch: Path
    quantize_threads: int


@dataclass(frozen=True)
class ProbeTarget:
    """Where a probe runs: the CPU, or one GPU (its position among llama.cpp's GPUs)."""

    label: str
    gpu_ordinal: int | None = None


def probe_depth(shape: ProbeShape, op: str, op_bytes: int, target_bytes: int, max_depth: int) -> int:
    """Layers a probe needs so one batch-1 decode reads at least `target_bytes` of weights."""
    per_layer = op_bytes * shape.active_params(op, 1) / shape.op_params(op)
    return max(1, min(max_depth, math.ceil(target_bytes / max(per_layer, 1.0))))


class _ProbeTimer:
    """Times the probes of one (shape, weight type) on one target, deleting deep copies."""

    def __init__(self, setup: ProbeSetup, shape: ProbeShape, weight_type: str, target: ProbeTarget) -> None:
        self.setup, self.shape, self.weight_type, self.target = setup, shape, weight_type, target
        plan = setup.plan
        on_gpu = target.gpu_ordinal is not None
        self.batches = plan.gpu_batches if on_gpu else plan.batches
        self.threads = (max(setup.threads),) if on_gpu else setup.threads
        self.deep_target = GPU_DEEP_TARGET_BYTES if on_gpu else plan.deep_target_bytes
        # Small sub-layers need hundreds of layers to get past a GPU's cache.
        self.max_depth = plan.max_depth * (GPU_DEPTH_FACTOR if on_gpu else 1)
        # Worst spread of the trials behind each (batch, threads) point, over the probes timed.
        self.spreads: dict[tuple[int, int], float] = {}

    def one_layer(self, kind: str) -> Path:
        s = self.setup
        return one_layer_probe(self.shape, kind, self.weight_type, s.cache_dir, s.quantize_threads)

    def time(self, kind: str, depth: int, batches: tuple[int, ...]) -> dict[tuple[int, int], float]:
        if not batches:
            return {}
        source = self.one_layer(kind)
        path = source
        if depth > 1:
            path = deep_probe(
                source, self.shape, kind, depth, self.setup.scratch / f"{source.stem}-L{depth}.gguf"
            )
        try:
            return time_probe(
                path, batches, self.threads, self.setup.policy, self.target.gpu_ordinal, self.spreads
            )
        finally:
            if path != source:
                with contextlib.suppress(OSError):
                    path.unlink()


def measure_shape_type(
    setup: ProbeSetup, shape: ProbeShape, ops: tuple[str, ...], weight_type: str, target: ProbeTarget
) -> tuple[list[KernelEntry], list[str]]:
    """Entries for every op of `shape` in `weight_type` on `target`, plus any notes."""
    timer = _ProbeTimer(setup, shape, weight_type, target)
    plan = setup.plan
    notes: list[str] = []
    weights = {op: probe_weights(timer.one_layer(op), op) for op in ops}
    for op, w in weights.items():
        if w.types != {weight_type}:
            notes.append(f"{shape.name} {op} {weight_type}: llama.cpp stored {sorted(w.types)}")
    depths = {
        op: probe_depth(shape, op, w.op_bytes, timer.deep_target, timer.max_depth)
        for op, w in weights.items()
    }
    deep_batches = tuple(b for b in timer.batches if b <= plan.deep_max_batch)
    shallow_batches = tuple(b for b in timer.batches if b > plan.deep_max_batch)
    l_max = max(depths.values())
    skel_1 = timer.time(SKELETON, 1, timer.batches)
    skel_deep = timer.time(SKELETON, l_max, timer.batches) if l_max > 1 else skel_1

    def layer_overhead(point: tuple[int, int]) -> float:
        # Noise can make the deep skeleton look cheaper per layer than zero.
        return max(0.0, (skel_deep[point] - skel_1[point]) / (l_max - 1)) if l_max > 1 else 0.0

    entries: list[KernelEntry] = []
    clamped: list[str] = []

    def entry(op: str, point: tuple[int, int], seconds: float, overhead: float, depth: int,
              weight_bytes: float, flops: float, rows: int, cols: int) -> KernelEntry:
        batch, threads = point
        return KernelEntry(
            op=op, shape=shape.name, weight_type=weight_type, rows=rows, cols=cols, batch=batch,
            threads=threads, device=target.label, condition="idle", seconds=seconds,
            overhead_seconds=overhead, weight_bytes=int(weight_bytes), flops=flops, depth=depth,
            spread=timer.spreads.get(point, 0.0),
        )

    for op in ops:
        depth = depths[op]
        timings = {**timer.time(op, 1, shallow_batches if depth > 1 else timer.batches)}
        if depth > 1:
            timings.update(timer.time(op, depth, deep_batches))
        rows, cols = shape.op_rows_cols(op)
        for point, total in sorted(timings.items()):
            batch = point[0]
            used_depth = depth if batch in deep_batches else 1
            overhead = skel_1[point] + (used_depth - 1) * layer_overhead(point)
            net = (total - overhead) / used_depth
            if net <= CLAMP_SHARE * total / used_depth:
                # Only noise makes a probe cost no more than its own skeleton.
                clamped.append(f"{op} b{batch} t{point[1]}")
                net = CLAMP_SHARE * total / used_depth
            active = weights[op].op_bytes * shape.active_params(op, batch) / shape.op_params(op)
            entries.append(
                entry(op, point, net, overhead / used_depth, used_depth, active,
                      shape.flops(op, batch), rows, cols)
            )
    for point in sorted(skel_1):
        per_layer = layer_overhead(point)
        if l_max > 1:
            entries.append(entry(OP_LAYER_OVERHEAD, point, per_layer, 0.0, l_max, 0, 0.0, 0, 0))
        entries.append(
            entry(OP_GRAPH_OVERHEAD, point, max(0.0, skel_1[point] - per_layer), 0.0, 1, 0, 0.0, 0, 0)
        )
    if clamped:
        notes.append(
            f"{target.label} {shape.name} {weight_type}: {len(clamped)} entries barely above "
            f"their skeleton, set to {CLAMP_SHARE:.0%} of the probe time (noisy machine?): "
            + ", ".join(clamped[:4]) + (" ..." if len(clamped) > 4 else "")
        )
    return entries, notes


def merge_overheads(entries: list[KernelEntry]) -> list[KernelEntry]:
    """One overhead entry per (op, shape, batch, threads, device): the median over types.

    The stand-in sub-layers that make up the overhead are tiny whatever their type, so
    per-type copies would mostly repeat noise and double the database's size.
    """
    groups: dict[tuple, list[KernelEntry]] = {}
    kept: list[KernelEntry] = []
    for e in entries:
        if e.op in (OP_LAYER_OVERHEAD, OP_GRAPH_OVERHEAD):
            groups.setdefault((e.op, e.shape, e.batch, e.threads, e.device, e.condition), []).append(e)
        else:
            kept.append(e)
    for group in groups.values():
        seconds = statistics.median(e.seconds for e in group)
        kept.append(replace(group[0], weight_type="", seconds=seconds, load=max(e.load for e in group),
                            spread=max(e.spread for e in group)))
    return kept
