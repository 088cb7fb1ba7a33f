"""Below the game's scheduling priority: the frame guard's first lever. When a game thread wakes on
a core a daemon thread holds, the OS then hands the core over at once instead of at the end of the
daemon's time slice, which is what a frame waiting on it needs.

Lowering needs no privilege and cannot be undone without one, so it is done once, and only ever
lowers. Linux keeps a nice value per thread: every thread is lowered, and those started later
inherit it from the thread that starts them (llama.cpp's workers from the engine thread), which a
sweep twice a second makes sure of. Windows and macOS have one priority for the process.

Two strengths (--frame-guard-priority): "low" is nice 19 (below normal on Windows); "idle", the
default, is the idle scheduling class (SCHED_IDLE on Linux, the idle priority class on Windows),
under every nice value, so that a game thread waking on a core a daemon thread holds takes it at
once. Both leave the daemon a small share of a core the game keeps busy: not starved, never first.
bench/run.py game measures them side by side."""

from __future__ import annotations

import os
import sys

import psutil
import structlog

log = structlog.get_logger("guard")

# The lowest: the daemon only ever gets a core the game does not want. Measured on 2 cores beside
# a game thread (bench/run.py game): with the threads the game leaves free, the NPCs lose little.
NICE = 19


PRIORITIES = ("idle", "low")


class LowPriority:
    def __init__(self, strength: str = "idle") -> None:
        if strength not in PRIORITIES:
            raise ValueError(f"priority {strength!r}: one of {', '.join(PRIORITIES)}")
        self.idle_class = strength == "idle"
        self.applied = False
        self._done: set[int] = set()
        self._failed = False

    def apply(self) -> None:
        try:
            if sys.platform.startswith("linux"):
                for name in os.listdir("/proc/self/task"):
                    tid = int(name)
                    if tid not in self._done:
                        self._lower_thread(tid)
                        self._done.add(tid)
            elif not self.applied:
                process = psutil.Process()
                if sys.platform == "win32":
                    process.nice(psutil.IDLE_PRIORITY_CLASS if self.idle_class else psutil.BELOW_NORMAL_PRIORITY_CLASS)
                else:
                    process.nice(max(NICE, process.nice()))
            self.applied = True
        except (OSError, psutil.Error) as e:
            if not self._failed:  # once: a sandbox that forbids it should not fill the log
                log.warning("could not lower the daemon's priority", error=str(e))
                self._failed = True

    def _lower_thread(self, tid: int) -> None:
        os.setpriority(os.PRIO_PROCESS, tid, max(NICE, os.getpriority(os.PRIO_PROCESS, tid)))
        # The nice value first: under SCHED_IDLE it is ignored, but it still holds should the
        # class be refused (some sandboxes forbid sched_setscheduler) and threads inherit both.
        if self.idle_class and os.sched_getscheduler(tid) != os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
