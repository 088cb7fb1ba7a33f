"""Below the game's scheduling priority: the frame guard's first lever. When a game thread wakes on
a core a daemon thread holds, the OS then hands the core over at once instead of at the end of the
daemon's time slice, which is what a frame waiting on it needs.

Lowering needs no privilege and cannot be undone without one, so it is done once, and only ever
lowers. Linux keeps a nice value per thread: every thread is lowered, and those started later
inherit it from the thread that starts them (llama.cpp's workers from the engine thread), which a
sweep twice a second makes sure of. Windows and macOS have one priority for the process.

Two strengths: nice 19 (below normal on Windows), and under it the idle scheduling class
(SCHED_IDLE on Linux, the idle priority class on Windows), in which a game thread waking on a core
a daemon thread holds takes it at once. Which one, and when, is the guard's decision
(frame_guard.decide, --frame-guard-priority). Both leave the daemon a small share of a core the
game keeps busy: not starved, never first."""

from __future__ import annotations

import os
import sys

import psutil
import structlog

log = structlog.get_logger("guard")

# The lowest: the daemon only ever gets a core the game does not want. Measured on 2 cores beside
# a game thread (bench/run.py game): with the threads the game leaves free, the NPCs lose little.
NICE = 19


class LowPriority:
    """Lowers every thread of the daemon, once each: to nice 19, and to the idle class when asked."""

    def __init__(self) -> None:
        self.applied = False
        self.idle_applied = False
        self._low: set[int] = set()
        self._idle: set[int] = set()
        self._failed = False

    def apply(self, idle_class: bool = False) -> None:
        try:
            if sys.platform.startswith("linux"):
                for name in os.listdir("/proc/self/task"):
                    tid = int(name)
                    if tid not in self._low:
                        os.setpriority(os.PRIO_PROCESS, tid, max(NICE, os.getpriority(os.PRIO_PROCESS, tid)))
                        self._low.add(tid)
                    if idle_class and tid not in self._idle:
                        if os.sched_getscheduler(tid) != os.SCHED_IDLE:
                            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                        self._idle.add(tid)
            elif not self.applied or (idle_class and not self.idle_applied):
                process = psutil.Process()
                if sys.platform == "win32":
                    process.nice(psutil.IDLE_PRIORITY_CLASS if idle_class else psutil.BELOW_NORMAL_PRIORITY_CLASS)
                else:
                    process.nice(max(NICE, process.nice()))
            self.applied = True
            # Elsewhere (macOS) there is no idle class for a process: nice 19 is all it got.
            has_idle_class = sys.platform.startswith("linux") or sys.platform == "win32"
            self.idle_applied = self.idle_applied or (idle_class and has_idle_class)
        except (OSError, psutil.Error) as e:
            if not self._failed:  # once: a sandbox that forbids it should not fill the log
                log.warning("could not lower the daemon's priority", error=str(e))
                self._failed = True
