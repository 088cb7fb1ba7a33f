"""Runs a profile plan in one go (the install-time `xlm-sidecar profile`): every step of
sidecar.profiler.steps, then the steps measured under load once more when the machine is quiet.
"""

from __future__ import annotations

import time
from pathlib import Path

from sidecar.profiler.database import KernelEntry, ProfileDB
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.llama_runtime import quiet_llama_logs
from sidecar.profiler.plan import QUICK_PLAN, ProfilePlan
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

# How long an install-time profile waits for a quiet machine before keeping marked figures.
REMEASURE_WAIT_S = 20.0


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
