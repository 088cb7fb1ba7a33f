"""Measuring the machine profile inside the running daemon, without ever delaying a reply.

The daemon starts on a plan from built-in defaults; this thread measures the profile's steps
(sidecar.profiler.steps) one slice at a time, only while the engine has had nothing to do for a
moment, at the lowest scheduling priority. A slice stops within one probe decode when the engine
gets work (ProbeInterrupted) and is measured again later.

Other processes' load is judged against what a game's PC always looks like
(sidecar.profiler.environment): the steady load is the environment, and a slice measures the
thread counts that fit beside it (all of them on a quiet machine), deferring the others to a
quiet moment (the planner estimates them from fewer threads meanwhile). A burst above the
environment stops the slice, which is measured again, at most MAX_BURST_RETRIES times per step;
after that its figures are kept, fastest of their trials, marked by the load they saw. So a PC
that is never quiet still gets its profile, in about the time of the steps at the fitting thread
counts. When every step is in, the profile is saved and handed to `on_complete`, which re-plans;
steps with deferred thread counts or taken under load are then measured again whenever the
machine is quiet, and the improved profile is saved and handed over again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from sidecar.profiler.database import KernelEntry, ProfileDB, save_profile
from sidecar.profiler.environment import BURST_CORES, BurstWatch, LoadHistory, threads_that_fit
from sidecar.profiler.hardware import HardwareInfo
from sidecar.profiler.kernels import ProbeInterrupted
from sidecar.profiler.llama_runtime import quiet_llama_logs_on_this_thread
from sidecar.profiler.machine_load import others_busy_now
from sidecar.profiler.plan import ProfilePlan
from sidecar.profiler.quality import step_disturbed
from sidecar.profiler.slice_thread import lower_this_thread_priority, run_slice
from sidecar.profiler.steps import (
    ScratchDir,
    StepResult,
    assemble_profile,
    drop_sources,
    keep_fastest,
    make_setup,
    measure_step,
    profile_steps,
)

log = structlog.get_logger("profile")

# The engine must have been idle this long before a slice starts: a game's NPC lines come in
# bursts, and the next one is likely right behind the last.
IDLE_BEFORE_S = 1.5
POLL_S = 0.2
# How often a running slice asks whether the engine got work (each ask reads engine counters).
CHECK_EVERY_S = 0.01
MAX_ATTEMPTS = 4
# A slice that a burst of other load overlapped is measured again at most this many times; then
# its figures are kept, marked by their load (a PC whose load never settles still gets a profile).
MAX_BURST_RETRIES = 2
# A slice waits at most this long for a burst to pass before it starts anyway (watched as above).
QUIET_PATIENCE_S = 10.0
# Samples of the others' load the first slice waits for, so the environment is a level, not a blip.
SETTLE_S = 1.0


class EngineActivity:
    """Whether the engine is working, from its snapshot: requests running or queued, a phase
    other than ready, or any token processed since the last look."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self._last_work = 0
        self._last_change = time.monotonic()
        self._checked = 0.0
        self._busy = False

    def busy(self) -> bool:
        now = time.monotonic()
        if now - self._checked < CHECK_EVERY_S:
            return self._busy
        self._checked = now
        try:
            snap = self._engine.snapshot()
        except RuntimeError:  # read while the engine thread changed its sessions: it is working
            self._last_change = now
            self._busy = True
            return True
        t = snap.throughput
        work = t.tokens_generated + t.prompt_tokens_processed + t.requests_served
        running = snap.requests_active > 0 or snap.requests_queued > 0 or snap.phase.value != "ready"
        changed = work != self._last_work
        if changed or running:
            self._last_work = work
            self._last_change = now
        self._busy = running or changed
        return self._busy

    def idle_for(self) -> float:
        """Seconds since the engine last did anything (0 while it works)."""
        if self.busy():
            return 0.0
        return time.monotonic() - self._last_change


class BackgroundProfiler:
    """One background measurement of `plan`, saved to `path` when complete."""

    def __init__(
        self,
        plan: ProfilePlan,
        hardware: HardwareInfo,
        path: Path,
        activity: EngineActivity,
        on_progress: Callable[[int, int, str, int], None],
        on_complete: Callable[[ProfileDB], None],
        cache_dir: Path | None = None,
    ) -> None:
        self.plan, self.hardware, self.path = plan, hardware, path
        self.activity = activity
        self._on_progress, self._on_complete = on_progress, on_complete
        self._cache_dir = cache_dir
        self._stop = threading.Event()
        self.discarded = 0
        self._loaded_since: float | None = None
        self._history = LoadHistory()
        self.result: ProfileDB | None = None  # the last profile handed over
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="xlm-profile", daemon=True)

    def start(self) -> BackgroundProfiler:
        self._thread.start()
        return self

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        lower_this_thread_priority()
        scratch = ScratchDir()
        try:
            with quiet_llama_logs_on_this_thread():
                self._measure(scratch)
        except BaseException as e:  # a failed background profile leaves the plan in force
            self.error = e
            log.warning("background profile failed; keeping the plan in force", reason=f"{type(e).__name__}: {e}")
        finally:
            scratch.close()

    def _measure(self, scratch: ScratchDir) -> None:
        """First every step once (beside the environment, see `_wait_for_slice`), then the
        profile is saved and handed over; then the steps taken under load again, only when quiet,
        and the profile saved and handed over once more if any were."""
        started = time.monotonic()
        steps = profile_steps(self.plan, self.hardware)
        setup = make_setup(self.plan, self.hardware, scratch.path, self._cache_dir)
        results: list[StepResult | None] = [None] * len(steps)
        for i in range(len(steps)):
            if not self._take(steps, setup, results, i, patient=True):
                return
        drop_sources(self.plan, setup.cache_dir)
        self._finish(steps, results, started)
        logical = self.hardware.logical_cores
        for _attempt in range(MAX_ATTEMPTS - 1):
            loaded = [i for i, r in enumerate(results) if step_disturbed(r.load, logical) or r.deferred_threads]
            if not loaded:
                return
            for i in loaded:
                if not self._take(steps, setup, results, i, patient=False):
                    return
            self._finish(steps, results, started)

    def _take(self, steps, setup, results: list[StepResult | None], i: int, patient: bool) -> bool:
        """Measure step `i` until a take did not overlap engine work (nor, MAX_BURST_RETRIES times,
        a burst of other load); False when stopped."""
        logical = self.hardware.logical_cores
        bursts = 0
        while not self._stop.is_set():
            if not self._wait_for_slice(patient):
                self._stop.wait(POLL_S)
                continue
            done = sum(1 for r in results if r is not None)
            self._on_progress(done, len(steps), steps[i].label, self.discarded)
            entries: list[KernelEntry] = [e for r in results if r is not None for e in r.entries]
            level = self._history.level()
            fit = threads_that_fit(setup.threads, logical, level)
            # Quantizing a probe splits every tensor over its threads too: a starved one stalls it.
            sliced = replace(setup, threads=fit, quantize_threads=max(1, min(setup.quantize_threads, max(fit))))
            allowed = level + BURST_CORES
            watch = BurstWatch(logical, allowed) if bursts < MAX_BURST_RETRIES else None
            try:
                taken = run_slice(lambda: measure_step(steps[i], sliced, entries),
                                  lambda: self._stop.is_set() or self.activity.busy() or (watch is not None and watch()))
            except ProbeInterrupted:
                self.discarded += 1
                if watch is not None and watch.burst:
                    bursts += 1
                    log.debug("profile slice thrown away: a burst of other load", step=steps[i].label,
                              environment=round(level, 2))
                else:
                    log.debug("profile slice thrown away: the engine got work", step=steps[i].label)
                continue
            if self.activity.idle_for() == 0.0:
                self.discarded += 1  # the engine worked meanwhile (between two checks)
                continue
            others = taken.load * logical
            self._history.add(others)
            if others > allowed and bursts < MAX_BURST_RETRIES:
                bursts += 1  # a burst between two checks, or too short for one
                self.discarded += 1
                continue
            taken.deferred_threads = tuple(t for t in setup.threads if t not in fit)
            if step_disturbed(taken.load, logical):
                log.debug("profile slice measured beside other load", step=steps[i].label,
                          load=round(taken.load, 3), environment=round(level, 2), threads=list(fit))
            results[i] = taken if results[i] is None else keep_fastest(results[i], taken)
            return True
        return False

    def _finish(self, steps, results: list[StepResult], started: float) -> None:
        self._on_progress(len(steps), len(steps), "", self.discarded)
        db = assemble_profile(self.plan, self.hardware, list(results), time.monotonic() - started,
                              ["measured in the background by the daemon, in slices while idle"])
        save_profile(db, self.path)
        self.result = db
        log.info("background profile saved", path=str(self.path), seconds=round(db.duration_s, 1),
                 slices_discarded=self.discarded, contention=round(db.contention, 3))
        self._on_complete(db)

    def _wait_for_slice(self, patient: bool) -> bool:
        """Sample the others' load; True once the engine has been idle IDLE_BEFORE_S and the load
        allows a slice: not in a burst above the environment (or, `patient`, a burst that lasted
        QUIET_PATIENCE_S: the level catches up with a load that stays), or quiet (not `patient`:
        the re-measures, which want every thread count)."""
        self._history.add(others_busy_now(POLL_S) * self.hardware.logical_cores)
        if self.activity.idle_for() < IDLE_BEFORE_S:
            return False
        if not patient:
            return self._history.quiet()
        if self._history.span_s() < SETTLE_S:
            return False
        if not self._history.in_burst():
            self._loaded_since = None
            return True
        now = time.monotonic()
        if self._loaded_since is None:
            self._loaded_since = now
        return now - self._loaded_since >= QUIET_PATIENCE_S
