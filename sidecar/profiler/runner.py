"""Runs a profile plan in one go (the install-time `xlm-sidecar profile`): every step of
sidecar.profiler.steps, then the steps measured under load once more when the machine is quiet.
Also the GPU steps' measurements: copies alone and overlapping CPU work.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from sidecar.ggml_devices import GgmlDevice
from sidecar.profiler.busy import measure_overlap
from sidecar.profiler.database import BandwidthEntry, KernelEntry, ProfileDB
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.kernels import ProbeSession
from sidecar.profiler.llama_runtime import quiet_llama_logs
from sidecar.profiler.plan import OP_FFN, QUICK_PLAN, ProbeShape, ProfilePlan
from sidecar.profiler.probe_models import deep_probe, one_layer_probe, probe_weights
from sidecar.profiler.progress import ProgressReporter, SilentProgress
from sidecar.profiler.quality import step_disturbed
from sidecar.profiler.steps import (
    ScratchDir,
    StepResult,
    assemble_profile,
    drop_sources,
    keep_fastest,
    make_setup,
    measure_step,
    profile_steps,
    wait_for_quiet,
)
from sidecar.profiler.sublayers import ProbeSetup, probe_depth
from sidecar.profiler.transfers import CopyLoop, measure_h2d

COPY_BYTES = 256 << 20
# How long an install-time profile waits for a quiet machine before keeping marked figures.
REMEASURE_WAIT_S = 20.0


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
    quiet_wait_s: float = REMEASURE_WAIT_S,
) -> ProfileDB:
    """Measure this machine according to `plan` and return the profile (nothing is saved).

    On a machine where llama.cpp sees no GPU the GPU parts are skipped with a note; the CPU
    is profiled either way. Steps measured while other processes loaded the CPUs are measured
    again once the machine is quiet (waiting up to `quiet_wait_s` for it), keeping the faster
    figure of each point; what stays disturbed is marked in the entries' `load`.
    """
    started = time.monotonic()
    progress = progress or SilentProgress()
    hardware = hardware or discover_hardware()
    steps = profile_steps(plan, hardware)
    scratch = ScratchDir()
    setup = make_setup(plan, hardware, scratch.path, cache_dir)
    results: list[StepResult] = []
    try:
        with quiet_llama_logs() as llama_errors:
            progress.start(len(steps), f"{plan.mode} profile")
            entries: list[KernelEntry] = []
            for step in steps:
                progress.step(step.label)
                result = measure_step(step, setup, entries)
                results.append(result)
                entries += result.entries
            again = [i for i, r in enumerate(results) if step_disturbed(r.load, hardware.logical_cores)]
            for i in again:
                if not wait_for_quiet(hardware.logical_cores, quiet_wait_s):
                    break  # still busy: keep the marked figures rather than wait for ever
                progress.step(f"{steps[i].label} (again: measured under load)")
                results[i] = keep_fastest(results[i], measure_step(steps[i], setup, entries))
            progress.finish()
        drop_sources(plan, setup.cache_dir)
    finally:
        scratch.close()
    notes = [f"llama.cpp error: {line}" for line in llama_errors[:5]]
    return assemble_profile(plan, hardware, results, time.monotonic() - started, notes)
