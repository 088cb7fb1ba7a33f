"""How much CPU other processes took while we measured.

Timings taken while something else computes are pessimistic, and with llama.cpp's OpenMP
thread pool badly so: when another process holds a core, a decode on all cores waits at
every barrier for the descheduled thread. The profile records the share so a reader (or a
later re-profile decision) can tell a quiet measurement from a contended one.
"""

from __future__ import annotations

import time

import psutil


def _busy_seconds(times) -> float:
    return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


class OtherLoadMeter:
    """Measures the CPU share used by other processes between construction and `share()`."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._cpus = psutil.cpu_count(logical=True) or 1
        self._start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        mine = self._me.cpu_times()
        own = mine.user + mine.system + getattr(mine, "children_user", 0.0) + getattr(mine, "children_system", 0.0)
        return time.monotonic(), _busy_seconds(psutil.cpu_times()), own

    def share(self) -> float:
        """Fraction (0..1) of all logical CPUs that other processes kept busy so far."""
        wall0, busy0, own0 = self._start
        wall1, busy1, own1 = self._snapshot()
        elapsed = max(wall1 - wall0, 1e-6)
        others = (busy1 - busy0) - (own1 - own0)
        return min(1.0, max(0.0, others / (elapsed * self._cpus)))


def others_busy_now(interval: float = 0.5) -> float:
    """Share of the CPUs other processes use over the next `interval` seconds."""
    meter = OtherLoadMeter()
    time.sleep(interval)
    return meter.share()
