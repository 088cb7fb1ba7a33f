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


def test_the_steady_load_is_the_environment_and_bursts_stand_out() -> None:
    from sidecar.profiler.environment import LoadHistory, threads_that_fit

    # A game's main loop on one of two cores: one thread fits beside it, two do not.
    assert threads_that_fit((1, 2), logical_cores=2, others_cores=1.02) == (1,)
    assert threads_that_fit((1, 2), logical_cores=2, others_cores=0.05) == (1, 2)
    assert threads_that_fit((1, 8, 16), logical_cores=16, others_cores=1.0) == (1, 8)
    # Something is always measured, even when the others hold every core.
    assert threads_that_fit((1, 2), logical_cores=2, others_cores=2.0) == (1,)
    history = LoadHistory(window_s=10.0)
    for i in range(20):
        history.add(1.0, now=i * 0.4)
    assert abs(history.level() - 1.0) < 1e-9 and not history.in_burst() and not history.quiet()
    history.add(1.9, now=8.4)  # a level load starts
    assert history.in_burst() and history.level() == 1.0


def test_deferred_thread_counts_are_estimated_from_fewer_threads() -> None:
    from sidecar.planner.disturbed import fill_deferred

    key = ("op", "device", "shape", "weight_type", "batch", "busy")
    points, added = fill_deferred([_point(1, 10.0, False)], key, (2,))
    assert added == 1
    two = next(p for p in points if p.threads == 2)
    assert two.disturbed and abs(two.seconds - 10.0 * 0.5 ** 0.5) < 1e-9
    # A series that measured the thread count keeps its figure; nothing deferred, nothing added.
    measured = [_point(1, 10.0, False), _point(2, 6.0, False)]
    assert fill_deferred(measured, key, (2,)) == (measured, 0)
    assert fill_deferred([_point(1, 10.0, False)], key, ()) == ([_point(1, 10.0, False)], 0)
