"""The frame-time guard's decisions (pure), its check of frame reports, the engine's pass limits and
the process watch against a real busy process. The daemon side is in test_frame_guard_daemon.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from sidecar.api import pb
from sidecar.engine.pass_limits import MAX_PAUSE_S, PassLimiter
from sidecar.errors import InvalidArgument
from sidecar.guard.frame_guard import MAX_LEVEL, FrameWindow, GameLoad, GuardSettings, GuardState, PassLimits, on_load, on_report
from sidecar.guard.guard_task import ProcessWatch, check_report

S = GuardSettings()
BAD = FrameWindow(frames=60, window_ms=1000, p50_ms=9, p99_ms=25, max_ms=30, over_budget=6, budget_ms=16.7)
CLEAN = FrameWindow(frames=60, window_ms=1000, p50_ms=8, p99_ms=9, max_ms=10, over_budget=0, budget_ms=16.7)


def test_a_busy_game_thread_takes_a_core_and_the_daemon_goes_below_its_priority() -> None:
    quiet = on_load(GuardState(), GameLoad(watching_game=True), 0.0, S, cores=2)
    assert quiet.limits == PassLimits(max_threads=0, low_priority=True)  # the plan's threads
    busy = on_load(quiet, GameLoad(game_busy_cores=0.45, game_busy_threads=1, watching_game=True), 0.5, S, cores=2)
    assert busy.limits.max_threads == 1 and busy.source == "watching the game process"
    assert "1 thread(s) busy" in busy.reason and busy.changes == quiet.changes + 1
    eight = on_load(GuardState(), GameLoad(game_busy_threads=2, watching_game=True), 0.0, S, cores=8)
    assert eight.limits.max_threads == 6
    # Never fewer than one thread, whatever the game takes: the NPCs are slowed, never stopped.
    swamped = on_load(GuardState(), GameLoad(game_busy_threads=4, other_busy_cores=3.0), 0.0, S, cores=2)
    assert swamped.limits.max_threads == 1


def test_other_load_on_the_machine_counts_from_half_a_core() -> None:
    assert on_load(GuardState(), GameLoad(other_busy_cores=0.3), 0.0, S, cores=4).limits.max_threads == 0
    loaded = on_load(GuardState(), GameLoad(other_busy_cores=1.6), 0.0, S, cores=4)
    assert loaded.limits.max_threads == 2 and loaded.source == "machine load"


def test_late_frames_climb_the_ladder_one_step_per_fresh_window_and_clean_ones_come_back() -> None:
    state, now, levels = GuardState(), 0.0, []
    for _ in range(12):
        now += 1.0
        state = on_report(state, BAD, now, S, cores=2)
        levels.append(state.level)
    assert levels == sorted(levels) and state.level == MAX_LEVEL
    # No faster than one step per step_up_s, and never on a window that straddled the last step.
    assert levels[:4] == [1, 1, 2, 2]
    limits = state.limits
    assert limits.max_threads == 1 and limits.max_pass_tokens == S.short_pass_tokens and limits.pause_ratio == 1.0
    for _ in range(int(S.step_down_s) + 2):
        now += 1.0
        state = on_report(state, CLEAN, now, S, cores=2)
    assert state.level == MAX_LEVEL - 1 and state.limits.pause_ratio == 0.5


def test_stale_reports_stop_steering() -> None:
    state = GuardState()
    for t in range(1, 8):
        state = on_report(state, BAD, float(t), S, cores=2)
    assert state.level >= 2
    later = on_load(state, GameLoad(watching_game=True), 8.0 + S.report_stale_s, S, cores=2)
    assert later.limits.max_pass_tokens == 0 and later.limits.pause_ratio == 0 and later.source != "frame reports"


def test_a_reporting_game_is_given_a_core_even_when_its_process_is_not_watched() -> None:
    state = on_report(GuardState(), CLEAN, 1.0, S, cores=2)
    assert state.limits.max_threads == 1 and "main thread" in state.reason
    idle_game = FrameWindow(60, 1000, 0.5, 0.9, 1.0, 0, 16.7)  # a menu screen: almost no work
    assert on_report(GuardState(), idle_game, 1.0, S, cores=2).limits.max_threads == 0


def _report(**fields) -> pb.FrameReport:
    base = dict(frames=60, window_ms=1000, frame_ms_p50=8, frame_ms_p99=12, frame_ms_max=15, frames_over_budget=0,
                frame_budget_ms=16.7)
    return pb.FrameReport(**{**base, **fields})


@pytest.mark.parametrize(("fields", "said"), [
    ({"frames": 0}, "frames must be between 1 and 100000"),
    ({"frames": 200_000}, "frames must be between 1 and 100000"),
    ({"frame_ms_p50": -1.0}, "frame_ms_p50"),
    ({"frame_ms_p99": math.nan}, "frame_ms_p99"),
    ({"frame_ms_max": math.inf}, "frame_ms_max"),
    ({"window_ms": 0.0}, "window_ms must be above 0"),
    ({"window_ms": 1e9}, "window_ms"),
    ({"frame_budget_ms": 0.2}, "frame_budget_ms"),
    ({"frames_over_budget": 61}, "cannot exceed frames"),
    ({"frame_ms_p50": 20.0}, "p50 <= p99 <= max"),
    ({"frames": 100_000, "frame_ms_p50": 8.0}, "do not describe one window"),
])
def test_impossible_reports_are_refused_by_name(fields: dict, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said.replace("(", r"\(").replace(")", r"\)")):
        check_report(_report(**fields))


def test_a_plain_report_becomes_a_window() -> None:
    window = check_report(_report(frame_budget_ms=0))
    assert window == FrameWindow(60, 1000, 8, 12, 15, 0, 0)


def test_pass_limiter_caps_threads_tokens_and_bounds_the_pause() -> None:
    limiter = PassLimiter()
    assert limiter.threads(4) == 4 and limiter.batch(512) == 512
    limiter.limits = PassLimits(max_threads=1, max_pass_tokens=32, pause_ratio=1.0)
    assert limiter.threads(4) == 1 and limiter.batch(512) == 32 and limiter.batch(8) == 8
    t0 = time.perf_counter()
    limiter.pause_after(5.0)  # a 5 s pass: the pause is bounded, messages must not wait seconds
    assert time.perf_counter() - t0 < MAX_PAUSE_S + 0.5 and limiter.last_pause_ms == pytest.approx(MAX_PAUSE_S * 1000)
    limiter.limits = PassLimits(pause_ratio=0.5)
    limiter.pause_after(0.02)
    assert limiter.last_pause_ms == pytest.approx(10.0)


def test_the_watch_sees_a_busy_thread_of_the_game_process() -> None:
    game = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    try:
        watch = ProcessWatch(game.pid)
        assert watch.sample() is None  # the first sample has nothing to compare with
        time.sleep(1.0)
        load = watch.sample()
        assert load is not None and load.watching_game
        assert load.game_busy_threads >= 1 and load.game_busy_cores > S.busy_thread_share
    finally:
        game.kill()
        game.wait()
    time.sleep(0.2)
    assert watch.sample().watching_game is False  # the game is gone: nothing left to watch


def test_no_game_to_watch_is_not_an_error() -> None:
    watch = ProcessWatch(None)
    watch.sample()
    time.sleep(0.2)
    load = watch.sample()
    assert load is not None and not load.watching_game and load.game_busy_threads == 0


def test_the_idle_class_only_where_the_game_fills_every_core_or_its_frames_run_late_for_a_while() -> None:
    one = on_load(GuardState(), GameLoad(game_busy_threads=1, watching_game=True), 0.0, S, cores=2)
    assert one.limits.low_priority and not one.limits.idle_class  # a core left: nice 19 only
    two = GameLoad(game_busy_threads=2, watching_game=True)
    brief = on_load(one, two, 0.5, S, cores=2)
    assert not brief.limits.idle_class  # it cannot be left: a moment of it is no reason
    lasting = on_load(on_load(brief, two, 3.0, S, cores=2), two, 0.5 + S.idle_after_s, S, cores=2)
    assert lasting.limits.idle_class and "idle scheduling class" in lasting.reason
    # Kept when the game goes back to one thread.
    back = on_load(lasting, GameLoad(game_busy_threads=1, watching_game=True), 6.0, S, cores=2)
    assert back.limits.idle_class and "taken earlier" in back.reason
    # A blip of both cores, then one again, then both: the clock starts again.
    blip = on_load(on_load(on_load(one, two, 1.0, S, cores=2), GameLoad(game_busy_threads=1, watching_game=True), 2.0,
                           S, cores=2), two, 5.5, S, cores=2)
    assert not blip.limits.idle_class
    # Frames late for a while (the ladder past its first step) on a machine with cores to spare.
    state, now = GuardState(), 0.0
    for _ in range(6):
        state, now = on_report(state, BAD, now, S, cores=8), now + 2.0
    assert state.level >= 2 and state.limits.idle_class
    assert not on_report(GuardState(), CLEAN, 0.0, S, cores=8).limits.idle_class
    low, idle = GuardSettings(priority="low"), GuardSettings(priority="idle")
    assert not on_load(on_load(GuardState(), two, 0.0, low, cores=2), two, 9.0, low, cores=2).limits.idle_class
    assert on_load(GuardState(), GameLoad(), 0.0, idle, cores=2).limits.idle_class


# Lowering cannot be undone without privilege, so each is applied in a process of its own.
LOWER = """
import json, os, sys, threading
from sidecar.guard.priority import LowPriority
started = threading.Event()
worker = threading.Thread(target=lambda: (started.set(), threading.Event().wait(5)), daemon=True)
worker.start(); started.wait()
lowered = LowPriority()
lowered.apply(idle_class=sys.argv[1] == "idle")
print(json.dumps(sorted({(os.getpriority(os.PRIO_PROCESS, int(t)), os.sched_getscheduler(int(t)))
                         for t in os.listdir("/proc/self/task")})))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("strength", ["idle", "low"])
def test_each_priority_strength_lowers_every_thread(strength: str) -> None:
    import os

    out = subprocess.run([sys.executable, "-c", LOWER, strength], capture_output=True, text=True, timeout=60, check=True)
    policy = os.SCHED_IDLE if strength == "idle" else os.SCHED_OTHER
    assert json.loads(out.stdout) == [[19, policy]], out.stdout  # every thread, the worker started before too


def test_a_reporting_game_that_is_not_watched_is_not_also_counted_among_the_others() -> None:
    # Unwatched, the game's own half core shows up as the machine's other load: with its main
    # thread inferred from its reports, that is one core taken, not two.
    for watching in (False, True):  # True: the daemon's parent is a launcher, idle, not the game
        load = GameLoad(other_busy_cores=0.6, watching_game=watching)
        state = on_load(on_report(GuardState(), CLEAN, 0.0, S, cores=2), load, 0.5, S, cores=2)
        assert state.limits.max_threads == 1 and not state.limits.idle_class, state.reason
    busy = on_load(on_report(GuardState(), CLEAN, 0.0, S, cores=2), GameLoad(other_busy_cores=1.6), 0.5, S, cores=2)
    assert busy.limits.max_threads == 1 and "other processes keep 1.1 cores busy" in busy.reason
