"""Which figures count as disturbed, and what the planner makes of them (pure functions)."""

from __future__ import annotations

from sidecar.planner.disturbed import cap_disturbed
from sidecar.planner.hardware_model import KernelPoint
from sidecar.profiler.quality import entry_disturbed, step_disturbed


def test_a_busy_core_disturbs_the_figures_that_need_it() -> None:
    # Two cores, another process on one of them: two threads are disturbed, one is not.
    assert entry_disturbed(0.5, threads=2, logical_cores=2)
    assert not entry_disturbed(0.5, threads=1, logical_cores=2)
    # Sixteen cores and one busy loop: only the thread counts that need its core.
    assert entry_disturbed(1 / 16, threads=16, logical_cores=16)
    assert not entry_disturbed(1 / 16, threads=8, logical_cores=16)
    # A shell's blip is not load.
    assert not step_disturbed(0.05, logical_cores=2)
    assert step_disturbed(0.5, logical_cores=2)


def _point(threads: int, seconds: float, disturbed: bool, batch: int = 1) -> KernelPoint:
    return KernelPoint("ffn", "cpu", "small", "Q4_0", batch, threads, False, seconds, 1e6, 1e6, disturbed)


def test_only_disturbed_figures_are_capped_by_fewer_threads() -> None:
    key = ("op", "device", "shape", "weight_type", "batch", "busy")
    points, changed = cap_disturbed([_point(1, 10.0, False), _point(2, 30.0, True)], key)
    assert changed == 1 and max(p.seconds for p in points if p.threads == 2) < 10.0
    # The same slow figure measured on a quiet machine is the truth and stays.
    points, changed = cap_disturbed([_point(1, 10.0, False), _point(2, 30.0, False)], key)
    assert changed == 0 and next(p for p in points if p.threads == 2).seconds == 30.0
    # A quiet pair elsewhere in the profile gives the speed-up to expect.
    quiet = {("cpu", 1, 1, 2): 0.9}
    points, _ = cap_disturbed([_point(1, 10.0, False), _point(2, 30.0, True)], key, quiet)
    assert abs(next(p for p in points if p.threads == 2).seconds - 9.0) < 1e-9
