"""Runs a profile plan: probes every (shape, weight type) on every device, then bandwidths.

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
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from sidecar.profiler.bandwidth import dram_read_from_entries, measure_memcpy
from sidecar.profiler.busy import measure_overlap
from sidecar.profiler.database import SCHEMA_VERSION, BandwidthEntry, KernelEntry, ProfileDB
from sidecar.profiler.fingerprint import fingerprint_of, llama_build_info
from sidecar.profiler.ggml_devices import GgmlDevice
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.kernels import ProbeSession, RepeatPolicy, time_probe
from sidecar.profiler.llama_runtime import quiet_llama_logs
from sidecar.profiler.machine_load import OtherLoadMeter
from sidecar.profiler.plan import (
    OP_FFN,
    OP_GRAPH_OVERHEAD,
    OP_LAYER_OVERHEAD,
    QUICK_PLAN,
    ProbeShape,
    ProfilePlan,
    thread_counts,
)
from sidecar.profiler.probe_models import (
    SKELETON,
    deep_probe,
    one_layer_probe,
    probe_cache_dir,
    probe_weights,
)
from sidecar.profiler.progress import ProgressReporter, SilentProgress
from sidecar.profiler.transfers import CopyLoop, measure_h2d

# GPU caches reach ~100 MB; a deep GPU probe must be well past that to be VRAM-bound.
GPU_DEEP_TARGET_BYTES = 512 << 20
GPU_DEPTH_FACTOR = 8
COPY_BYTES = 256 << 20
GPU_FAILURES = (RuntimeError, MemoryError, OSError, NotImplementedError)
# An op measured at or below this share of its probe's time is noise, not a measurement.
CLAMP_SHARE = 0.05


@dataclass(frozen=True)
class _Setup:
    plan: ProfilePlan
    threads: tuple[int, ...]
    policy: RepeatPolicy
    cache_dir: Path
    scratch: Path
    quantize_threads: int


@dataclass(frozen=True)
class _Target:
    """Where a probe runs: the CPU, or one GPU (its position among llama.cpp's GPUs)."""

    label: str
    gpu_ordinal: int | None = None


def probe_depth(shape: ProbeShape, op: str, op_bytes: int, target_bytes: int, max_depth: int) -> int:
    """Layers a probe needs so one batch-1 decode reads at least `target_bytes` of weights."""
    per_layer = op_bytes * shape.active_params(op, 1) / shape.op_params(op)
    return max(1, min(max_depth, math.ceil(target_bytes / max(per_layer, 1.0))))


class _ProbeTimer:
    """Times the probes of one (shape, weight type) on one target, deleting deep copies."""

    def __init__(self, setup: _Setup, shape: ProbeShape, weight_type: str, target: _Target) -> None:
        self.setup, self.shape, self.weight_type, self.target = setup, shape, weight_type, target
        plan = setup.plan
        on_gpu = target.gpu_ordinal is not None
        self.batches = plan.gpu_batches if on_gpu else plan.batches
        self.threads = (max(setup.threads),) if on_gpu else setup.threads
        self.deep_target = GPU_DEEP_TARGET_BYTES if on_gpu else plan.deep_target_bytes
        # Small sub-layers need hundreds of layers to get past a GPU's cache.
        self.max_depth = plan.max_depth * (GPU_DEPTH_FACTOR if on_gpu else 1)

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
                path, batches, self.threads, self.setup.policy, self.target.gpu_ordinal
            )
        finally:
            if path != source:
                with contextlib.suppress(OSError):
                    path.unlink()


def measure_shape_type(
    setup: _Setup, shape: ProbeShape, ops: tuple[str, ...], weight_type: str, target: _Target
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


def measure_copies(device: GgmlDevice, nbytes: int) -> tuple[list[BandwidthEntry], list[str]]:
    """Host-to-device bandwidth from pageable and pinned memory, nothing else running."""
    figures, notes = [], []
    for memory in ("pageable", "pinned"):
        try:
            fig = measure_h2d(device.index, nbytes, pinned=memory == "pinned")
        except (NotImplementedError, MemoryError, RuntimeError) as exc:
            notes.append(f"{device.name}: {memory} copy not measured ({exc})")
            continue
        figures.append(
            BandwidthEntry("h2d", device.name.lower(), "ggml_backend_tensor_set", memory,
                           "idle", 1, nbytes, fig.gbps)
        )
    return figures, notes


def measure_busy_figures(
    setup: _Setup, shape: ProbeShape, weight_type: str, device: GgmlDevice,
    idle_entries: list[KernelEntry],
) -> tuple[list[BandwidthEntry], list[KernelEntry]]:
    """Copies while the CPU decodes, and CPU decodes while copies run (pageable source).

    CPU entries are the idle FFN entries scaled by the measured busy/idle ratio of the
    whole probe, so they stay per-layer figures like their idle twins.
    """
    plan = setup.plan
    threads = max(setup.threads)
    batches = tuple(b for b in plan.batches if b <= plan.deep_max_batch) or (1,)
    source = one_layer_probe(shape, OP_FFN, weight_type, setup.cache_dir, setup.quantize_threads)
    # The deep probe, as for the idle entries: pageable copies and DRAM-bound decodes
    # compete for the same memory bandwidth, which is the effect to capture.
    depth = probe_depth(
        shape, OP_FFN, probe_weights(source, OP_FFN).op_bytes, plan.deep_target_bytes, plan.max_depth
    )
    path = deep_probe(source, shape, OP_FFN, depth, setup.scratch / f"busy-{source.name}")
    with ProbeSession(path, max(batches)) as session, CopyLoop(device.index, COPY_BYTES, False) as copy:
        session.set_threads(threads)
        session.decode_seconds(1)
        figs = measure_overlap(session, batches, copy, setup.policy)
    label = device.name.lower()
    bandwidths = [
        BandwidthEntry("h2d", label, "ggml_backend_tensor_set", "pageable", "cpu_busy", threads,
                       figs.nbytes, figs.nbytes / figs.copy_busy_s / 1e9),
    ]
    busy_entries = []
    for e in idle_entries:
        if (e.op, e.shape, e.weight_type, e.threads, e.device) == (OP_FFN, shape.name, weight_type, threads, "cpu") and e.batch in figs.cpu_idle_s:
            ratio = figs.cpu_busy_s[e.batch] / figs.cpu_idle_s[e.batch]
            busy_entries.append(replace(e, seconds=e.seconds * ratio, condition="h2d_busy"))
    return bandwidths, busy_entries


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
        kept.append(replace(group[0], weight_type="", seconds=seconds))
    return kept


def run_profile(
    plan: ProfilePlan = QUICK_PLAN,
    *,
    hardware: HardwareInfo | None = None,
    progress: ProgressReporter | None = None,
    cache_dir: Path | None = None,
) -> ProfileDB:
    """Measure this machine according to `plan` and return the profile (nothing is saved).

    On a machine where llama.cpp sees no GPU the GPU parts are skipped with a note; the CPU
    is profiled either way.
    """
    started = time.monotonic()
    others = OtherLoadMeter()
    progress = progress or SilentProgress()
    hardware = hardware or discover_hardware()
    llama_version, system_info = llama_build_info()
    threads = plan.threads or thread_counts(
        hardware.logical_cores, hardware.physical_cores, plan.mode == "quick"
    )
    gpus = hardware.ggml_gpus if plan.measure_gpu else ()
    notes: list[str] = []
    if not hardware.ggml_gpus:
        notes.append(hardware.gpu_note or "no GPU: llama.cpp sees no GPU device (CPU-only build)")
    elif not plan.measure_gpu:
        notes.append("GPU figures not measured in this mode")
    type_steps = sum(len(f.weight_types) for f in plan.families)
    total = type_steps * (1 + len(gpus)) + 1 + len(gpus) + (1 if gpus and plan.measure_busy else 0)
    entries: list[KernelEntry] = []
    bandwidths: list[BandwidthEntry] = []
    with quiet_llama_logs() as llama_errors, tempfile.TemporaryDirectory(prefix="xlm-profile-") as scratch:
        setup = _Setup(
            plan=plan,
            threads=threads,
            policy=RepeatPolicy(plan.seconds_per_point, plan.min_repeats, plan.max_repeats),
            cache_dir=cache_dir or probe_cache_dir(),
            scratch=Path(scratch),
            quantize_threads=hardware.logical_cores,
        )
        progress.start(total, f"{plan.mode} profile")
        targets = [_Target("cpu")] + [_Target(g.name.lower(), i) for i, g in enumerate(gpus)]
        for family in plan.families:
            for weight_type in family.weight_types:
                for target in targets:
                    where = "" if target.gpu_ordinal is None else f" on {target.label}"
                    progress.step(f"{family.shape.name} {weight_type}{where}")
                    try:
                        new, new_notes = measure_shape_type(
                            setup, family.shape, family.ops, weight_type, target
                        )
                    except GPU_FAILURES as exc:
                        if target.gpu_ordinal is None:
                            raise
                        # The GPU paths cannot be exercised on CPU-only test machines; a
                        # failure there must cost the GPU figures, not the whole profile.
                        notes.append(f"{target.label} {family.shape.name} {weight_type}: {exc}")
                        continue
                    entries += new
                    notes += new_notes
        progress.step("memory bandwidth")
        bandwidths += dram_read_from_entries(entries)
        bandwidths.append(measure_memcpy(plan.memcpy_bytes))
        for gpu in gpus:
            progress.step(f"copies to {gpu.name}")
            figures, copy_notes = measure_copies(gpu, COPY_BYTES)
            bandwidths += figures
            notes += copy_notes
        if gpus and plan.measure_busy:
            progress.step("copies and CPU kernels overlapping")
            family = plan.families[0]
            weight_type = "Q4_0" if "Q4_0" in family.weight_types else family.weight_types[0]
            try:
                busy_bw, busy_entries = measure_busy_figures(
                    setup, family.shape, weight_type, gpus[0], entries
                )
                bandwidths += busy_bw
                entries += busy_entries
            except GPU_FAILURES as exc:
                notes.append(f"overlap figures not measured: {exc}")
        progress.finish()
    contention = others.share()
    if contention > 0.1:
        notes.append(
            f"other processes kept {contention:.0%} of the CPUs busy while profiling: "
            "CPU figures are pessimistic; profile again on an idle machine"
        )
    notes += [f"llama.cpp error: {line}" for line in llama_errors[:5]]
    return ProfileDB(
        schema_version=SCHEMA_VERSION,
        fingerprint=fingerprint_of(hardware, llama_version, system_info),
        mode=plan.mode,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        duration_s=time.monotonic() - started,
        contention=contention,
        llama_cpp_version=llama_version,
        system_info=system_info,
        hardware=hardware,
        shapes=tuple(f.shape for f in plan.families),
        entries=tuple(merge_overheads(entries)),
        bandwidths=tuple(bandwidths),
        notes=tuple(notes),
    )
