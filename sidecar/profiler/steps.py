"""A profile as a list of independent steps, each measured on its own and stamped with the load.

Splitting the run lets it be measured in slices (the daemon's background profile measures one
step at a time while it is idle) and lets a step taken while other processes were busy be thrown
away and taken again when the machine is quiet (`ProfileRun.remeasure_disturbed`), so contention
is detected per step instead of being baked into the whole profile.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from sidecar.profiler.bandwidth import dram_read_from_entries, measure_memcpy
from sidecar.profiler.database import SCHEMA_VERSION, BandwidthEntry, KernelEntry, ProfileDB
from sidecar.profiler.fingerprint import fingerprint_of, llama_build_info
from sidecar.profiler.gpu_figures import COPY_BYTES, measure_busy_figures, measure_copies
from sidecar.profiler.hardware import HardwareInfo
from sidecar.profiler.kernels import RepeatPolicy
from sidecar.profiler.machine_load import OtherLoadMeter
from sidecar.profiler.plan import ProfilePlan, thread_counts
from sidecar.profiler.probe_models import SKELETON, drop_f16_source, probe_cache_dir
from sidecar.profiler.quality import DISTURBED_CORES, step_disturbed
from sidecar.profiler.sublayers import ProbeSetup, ProbeTarget, measure_shape_type, merge_overheads

GPU_FAILURES = (RuntimeError, MemoryError, OSError, NotImplementedError)
LOAD_WINDOW_S = 0.5


@dataclass
class StepResult:
    entries: list[KernelEntry] = field(default_factory=list)
    bandwidths: list[BandwidthEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Share of all CPUs other processes kept busy while the step ran (0..1).
    load: float = 0.0
    # Thread counts the step left out because other processes' steady load held the cores they
    # need (sidecar.profiler.environment); the planner estimates them from fewer threads.
    deferred_threads: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProfileStep:
    label: str
    measure: Callable[[ProbeSetup, list[KernelEntry]], StepResult]  # (setup, entries so far)


def _kernel_step(family, weight_type: str, target: ProbeTarget) -> ProfileStep:
    where = "" if target.gpu_ordinal is None else f" on {target.label}"

    def measure(setup: ProbeSetup, _entries: list[KernelEntry]) -> StepResult:
        try:
            entries, notes = measure_shape_type(setup, family.shape, family.ops, weight_type, target)
        except GPU_FAILURES as exc:
            if target.gpu_ordinal is None:
                raise
            # The GPU paths cannot be exercised on CPU-only test machines; a failure there must
            # cost the GPU figures, not the whole profile.
            return StepResult(notes=[f"{target.label} {family.shape.name} {weight_type}: {exc}"])
        return StepResult(entries, [], notes)

    return ProfileStep(f"{family.shape.name} {weight_type}{where}", measure)


def _memcpy_step(plan: ProfilePlan) -> ProfileStep:
    return ProfileStep("memory bandwidth", lambda _s, _e: StepResult(bandwidths=[measure_memcpy(plan.memcpy_bytes)]))


def _copies_step(gpu) -> ProfileStep:
    def measure(_setup: ProbeSetup, _entries: list[KernelEntry]) -> StepResult:
        figures, notes = measure_copies(gpu, COPY_BYTES)
        return StepResult(bandwidths=figures, notes=notes)

    return ProfileStep(f"copies to {gpu.name}", measure)


def _busy_step(plan: ProfilePlan, gpu) -> ProfileStep:
    family = plan.families[0]
    weight_type = "Q4_0" if "Q4_0" in family.weight_types else family.weight_types[0]

    def measure(setup: ProbeSetup, entries: list[KernelEntry]) -> StepResult:
        try:
            bw, busy = measure_busy_figures(setup, family.shape, weight_type, gpu, entries)
        except GPU_FAILURES as exc:
            return StepResult(notes=[f"overlap figures not measured: {exc}"])
        return StepResult(busy, bw)

    return ProfileStep("copies and CPU kernels overlapping", measure)


def profile_steps(plan: ProfilePlan, hardware: HardwareInfo) -> list[ProfileStep]:
    """Every step of `plan` on this machine, in the order they are measured."""
    gpus = hardware.ggml_gpus if plan.measure_gpu else ()
    targets = [ProbeTarget("cpu")] + [ProbeTarget(g.name.lower(), i) for i, g in enumerate(gpus)]
    steps = [_kernel_step(f, t, target) for f in plan.families for t in f.weight_types for target in targets]
    steps.append(_memcpy_step(plan))
    steps += [_copies_step(g) for g in gpus]
    if gpus and plan.measure_busy:
        steps.append(_busy_step(plan, gpus[0]))
    return steps


def measure_step(step: ProfileStep, setup: ProbeSetup, entries_so_far: list[KernelEntry]) -> StepResult:
    """Run one step, sampling the other processes' load over it; its entries carry that load."""
    meter = OtherLoadMeter()
    started = time.monotonic()
    result = step.measure(setup, entries_so_far)
    # CPU times tick in 10 ms: over a step of a few tens of milliseconds the share is noise, so
    # the window is stretched to LOAD_WINDOW_S (the others' load goes on while we wait).
    left = LOAD_WINDOW_S - (time.monotonic() - started)
    if left > 0:
        time.sleep(left)
    result.load = meter.share()
    result.entries = [replace(e, load=round(result.load, 3)) for e in result.entries]
    return result


def keep_fastest(old: StepResult, new: StepResult) -> StepResult:
    """Two takes of one step merged point by point: other load only ever slows a kernel down, so
    the faster figure of each point is the truer one (its load and spread go with it)."""
    best: dict[tuple, KernelEntry] = {}
    for e in [*old.entries, *new.entries]:
        key = (e.op, e.shape, e.weight_type, e.batch, e.threads, e.device, e.condition)
        if key not in best or e.seconds < best[key].seconds:
            best[key] = e
    load = min(old.load, new.load)
    # A thread count stays deferred only if neither take measured it.
    deferred = tuple(sorted(set(old.deferred_threads) & set(new.deferred_threads)))
    return StepResult(list(best.values()), new.bandwidths or old.bandwidths, new.notes, load, deferred)


def make_setup(plan: ProfilePlan, hardware: HardwareInfo, scratch: Path, cache_dir: Path | None = None) -> ProbeSetup:
    threads = plan.threads or thread_counts(hardware.logical_cores, hardware.physical_cores, plan.mode == "quick")
    return ProbeSetup(
        plan=plan,
        threads=threads,
        policy=RepeatPolicy(plan.seconds_per_point, plan.min_repeats, plan.max_repeats),
        cache_dir=cache_dir or probe_cache_dir(),
        scratch=scratch,
        quantize_threads=hardware.logical_cores,
    )


def drop_sources(plan: ProfilePlan, cache_dir: Path) -> None:
    """Delete cached F16 probe sources of families that do not measure F16 (hundreds of MB)."""
    for family in plan.families:
        if "F16" not in family.weight_types:
            for kind in (*family.ops, SKELETON):
                with contextlib.suppress(OSError):
                    drop_f16_source(family.shape, kind, cache_dir)


def assemble_profile(
    plan: ProfilePlan, hardware: HardwareInfo, results: list[StepResult], duration_s: float, extra_notes: list[str] = ()
) -> ProfileDB:
    """The profile the step results make: entries, derived bandwidths, notes and the load."""
    llama_version, system_info = llama_build_info()
    entries = [e for r in results for e in r.entries]
    bandwidths = dram_read_from_entries(entries) + [b for r in results for b in r.bandwidths]
    notes = list(extra_notes) + [n for r in results for n in r.notes]
    if not hardware.ggml_gpus:
        notes.insert(0, hardware.gpu_note or "no GPU: llama.cpp sees no GPU device (CPU-only build)")
    elif not plan.measure_gpu:
        notes.insert(0, "GPU figures not measured in this mode")
    # The profile's contention is its worst step's: the figure a reader checks first.
    contention = max((r.load for r in results), default=0.0)
    disturbed = [r for r in results if step_disturbed(r.load, hardware.logical_cores)]
    if disturbed:
        notes.append(
            f"{len(disturbed)} of {len(results)} steps were measured while other processes used more than "
            f"{DISTURBED_CORES} of a core (worst {contention:.0%} of the CPUs): their multi-threaded figures are "
            "marked and the planner does not trust them to pick fewer threads; profile again when the machine is idle"
        )
    deferred = tuple(sorted({t for r in results for t in r.deferred_threads}))
    if deferred:
        notes.append(
            f"{sum(bool(r.deferred_threads) for r in results)} of {len(results)} steps were measured beside other "
            f"processes' steady load, without {', '.join(map(str, deferred))} threads (their cores were taken): "
            "the planner estimates those from the fewer-thread figures until the machine is quiet"
        )
    return ProfileDB(
        schema_version=SCHEMA_VERSION,
        fingerprint=fingerprint_of(hardware, llama_version, system_info),
        mode=plan.mode,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        duration_s=duration_s,
        contention=contention,
        llama_cpp_version=llama_version,
        system_info=system_info,
        hardware=hardware,
        shapes=tuple(f.shape for f in plan.families),
        entries=tuple(merge_overheads(entries)),
        bandwidths=tuple(bandwidths),
        notes=tuple(notes),
        deferred_threads=deferred,
    )


class ScratchDir:
    """A temporary folder for deep probe copies, alive as long as a (possibly sliced) run."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="xlm-profile-")
        self.path = Path(self._tmp.name)

    def close(self) -> None:
        self._tmp.cleanup()


def wait_for_quiet(logical_cores: int, limit_s: float, sample_s: float = 0.5) -> bool:
    """Wait until other processes use less than DISTURBED_CORES of a core; False when `limit_s`
    passes first."""
    from sidecar.profiler.machine_load import others_busy_now

    deadline = time.monotonic() + limit_s
    while True:
        if others_busy_now(sample_s) * logical_cores < DISTURBED_CORES:
            return True
        if time.monotonic() >= deadline:
            return False
