"""Runs a profile plan: every (shape, weight type) on every device, then bandwidths and,
with a GPU, copies alone and overlapping CPU work. See sublayers for how entries are derived.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from sidecar.profiler.bandwidth import dram_read_from_entries, measure_memcpy
from sidecar.profiler.busy import measure_overlap
from sidecar.profiler.database import SCHEMA_VERSION, BandwidthEntry, KernelEntry, ProfileDB
from sidecar.profiler.fingerprint import fingerprint_of, llama_build_info
from sidecar.ggml_devices import GgmlDevice
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.kernels import ProbeSession, RepeatPolicy
from sidecar.profiler.llama_runtime import quiet_llama_logs
from sidecar.profiler.machine_load import OtherLoadMeter
from sidecar.profiler.plan import OP_FFN, QUICK_PLAN, ProbeShape, ProfilePlan, thread_counts
from sidecar.profiler.probe_models import (
    SKELETON,
    deep_probe,
    drop_f16_source,
    one_layer_probe,
    probe_cache_dir,
    probe_weights,
)
from sidecar.profiler.progress import ProgressReporter, SilentProgress
from sidecar.profiler.sublayers import (
    ProbeSetup,
    ProbeTarget,
    measure_shape_type,
    merge_overheads,
    probe_depth,
)
from sidecar.profiler.transfers import CopyLoop, measure_h2d

COPY_BYTES = 256 << 20
GPU_FAILURES = (RuntimeError, MemoryError, OSError, NotImplementedError)


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
    setup: ProbeSetup, shape: ProbeShape, weight_type: str, device: GgmlDevice,
    idle_entries: list[KernelEntry],
) -> tuple[list[BandwidthEntry], list[KernelEntry]]:
    """Copies while the CPU decodes, and CPU decodes while copies run.

    Copy figures for pageable and (where the device has it) pinned sources. CPU entries
    come from the pageable case, whose copies read DRAM through the CPU like mmap'd
    weights do; they are the idle FFN entries scaled by the measured busy/idle ratio of
    the whole probe, so they stay per-layer figures like their idle twins.
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
    label = device.name.lower()
    bandwidths = []
    with ProbeSession(path, max(batches)) as session:
        session.set_threads(threads)
        session.decode_seconds(1)
        for memory in ("pinned", "pageable"):  # pageable last: its figures are kept below
            try:
                with CopyLoop(device.index, COPY_BYTES, memory == "pinned") as copy:
                    figs = measure_overlap(session, batches, copy, setup.policy)
            except NotImplementedError:
                continue  # no pinned memory on this device
            bandwidths.append(
                BandwidthEntry("h2d", label, "ggml_backend_tensor_set", memory, "cpu_busy",
                               threads, figs.nbytes, figs.nbytes / figs.copy_busy_s / 1e9)
            )
    busy_entries = []
    for e in idle_entries:
        if (e.op, e.shape, e.weight_type, e.threads, e.device) == (OP_FFN, shape.name, weight_type, threads, "cpu") and e.batch in figs.cpu_idle_s:
            ratio = figs.cpu_busy_s[e.batch] / figs.cpu_idle_s[e.batch]
            busy_entries.append(replace(e, seconds=e.seconds * ratio, condition="h2d_busy"))
    return bandwidths, busy_entries


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
        setup = ProbeSetup(
            plan=plan,
            threads=threads,
            policy=RepeatPolicy(plan.seconds_per_point, plan.min_repeats, plan.max_repeats),
            cache_dir=cache_dir or probe_cache_dir(),
            scratch=Path(scratch),
            quantize_threads=hardware.logical_cores,
        )
        progress.start(total, f"{plan.mode} profile")
        targets = [ProbeTarget("cpu")] + [ProbeTarget(g.name.lower(), i) for i, g in enumerate(gpus)]
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
            if "F16" not in family.weight_types:
                for kind in (*family.ops, SKELETON):
                    drop_f16_source(family.shape, kind, setup.cache_dir)
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
