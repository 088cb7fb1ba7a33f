"""The frame-time guard at work: checks the game's frame reports, watches the game's process and the
machine twice a second, and hands what frame_guard.py decides to the engine (its pass limits) and to
the OS (the daemon's priority). Lives on the daemon's event loop; the engine reads the limits
between passes."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace

import psutil
import structlog

from sidecar.api import pb
from sidecar.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from sidecar.guard.frame_guard import (
    FrameWindow,
    GameLoad,
    GuardSettings,
    GuardState,
    PassLimits,
    budget_ms,
    on_load,
    on_report,
)
from sidecar.guard.game_clients import GameClients
from sidecar.guard.priority import LowPriority
from sidecar.service.caller import Caller

log = structlog.get_logger("guard")

WATCH_INTERVAL_S = 0.5
# A game sends one report a second; a burst above this is a bug or a flood, refused so that the
# guard's decisions (and the event loop) cannot be driven from outside. Per client: one client's
# flood must not use up the game's allowance.
REPORTS_PER_S = 20.0
MAX_FRAME_MS = 60_000.0
# No game loop turns faster (100,000 frames a second): frames that would have to be shorter than
# this to fit their window are made up.
MIN_FRAME_MS = 0.01
# The window and the frame times may come from different clocks (a loop measuring its work, a
# window timed around it) and be rounded: a little room before a report is called impossible.
WINDOW_SLACK, WINDOW_SLACK_MS = 1.25, 2.0


def check_report(report: pb.FrameReport) -> FrameWindow:
    """The report as a FrameWindow; InvalidArgument naming the first impossible figure."""
    if not 1 <= report.frames <= 100_000:
        raise InvalidArgument(f"frames must be between 1 and 100000 (got {report.frames})")
    figures = {"window_ms": report.window_ms, "frame_ms_p50": report.frame_ms_p50, "frame_ms_p99": report.frame_ms_p99,
               "frame_ms_max": report.frame_ms_max, "frame_budget_ms": report.frame_budget_ms,
               "gpu_frame_ms_p99": report.gpu_frame_ms_p99}
    for name, value in figures.items():
        if not math.isfinite(value) or value < 0 or value > MAX_FRAME_MS:
            raise InvalidArgument(f"{name} must be between 0 and {MAX_FRAME_MS:g} ms (got {value})")
    if report.window_ms <= 0:
        raise InvalidArgument("window_ms must be above 0")
    if report.frame_budget_ms and not 1.0 <= report.frame_budget_ms <= 1000.0:
        raise InvalidArgument(f"frame_budget_ms must be 0 (the daemon's) or between 1 and 1000 (got {report.frame_budget_ms})")
    if report.frames_over_budget > report.frames:
        raise InvalidArgument(f"frames_over_budget ({report.frames_over_budget}) cannot exceed frames ({report.frames})")
    if report.frame_ms_p50 > report.frame_ms_p99 or (report.frame_ms_max and report.frame_ms_p99 > report.frame_ms_max):
        raise InvalidArgument("frame times must satisfy frame_ms_p50 <= frame_ms_p99 <= frame_ms_max")
    _check_budget_counts(report)
    _check_fits_window(report)
    return FrameWindow(report.frames, report.window_ms, report.frame_ms_p50, report.frame_ms_p99,
                       report.frame_ms_max, report.frames_over_budget, report.frame_budget_ms)


def _check_budget_counts(report: pb.FrameReport) -> None:
    """The late frames against the times, where the report says which budget it counted against."""
    budget, over = report.frame_budget_ms, report.frames_over_budget
    if not budget:
        return
    if report.frame_ms_p99 > budget and not over:
        raise InvalidArgument(f"frames_over_budget is 0 but frame_ms_p99 ({report.frame_ms_p99:g}) is over "
                              f"frame_budget_ms ({budget:g}): the longest frames are late")
    if over and report.frame_ms_max and report.frame_ms_max <= budget:
        raise InvalidArgument(f"frames_over_budget is {over} but frame_ms_max ({report.frame_ms_max:g}) is within "
                              f"frame_budget_ms ({budget:g})")


def _check_fits_window(report: pb.FrameReport) -> None:
    """The frames must fit in their window: at least half of them took the median or longer, a
    hundredth (at least one) the p99 or longer, one the longest time, each late one more than the
    budget, and none less than MIN_FRAME_MS. Each is a least total no true window is shorter than."""
    n = report.frames
    least = {
        "frames": n * MIN_FRAME_MS,
        "frame_ms_p50": (n // 2) * report.frame_ms_p50,
        "frame_ms_p99": max(1, n // 100) * report.frame_ms_p99,
        "frame_ms_max": report.frame_ms_max,
        "frames_over_budget": report.frames_over_budget * report.frame_budget_ms,
    }
    room = WINDOW_SLACK * report.window_ms + WINDOW_SLACK_MS
    for name, total in least.items():
        if total > room:
            raise InvalidArgument(f"{name} does not fit window_ms ({report.window_ms:g}): {n} frames with it take at "
                                  f"least {total:g} ms; the figures do not describe one window")


class ProcessWatch:
    """CPU time of the game's process per thread, and of the whole machine, between two samples."""

    def __init__(self, game_pid: int | None, busy_share: float = GuardSettings.busy_thread_share,
                 busy_since: Callable[[], float | None] = lambda: None) -> None:
        self._busy_share = busy_share
        self._busy_since = busy_since  # when the engine's current run of passes began; None: idle
        self._own = psutil.Process()
        self._game = None
        if game_pid and game_pid != os.getpid():
            try:
                self._game = psutil.Process(game_pid)
            except (psutil.Error, ValueError):
                self._game = None
        self._last: tuple[float, dict[int, float], float, float] | None = None

    def sample(self) -> GameLoad | None:
        now = time.monotonic()
        threads: dict[int, float] = {}
        if self._game is not None:
            try:
                threads = {t.id: t.user_time + t.system_time for t in self._game.threads()}
            except psutil.Error:
                self._game = None
        machine = psutil.cpu_times()
        busy = machine.user + machine.system + getattr(machine, "nice", 0.0) + getattr(machine, "irq", 0.0) \
            + getattr(machine, "softirq", 0.0) + getattr(machine, "steal", 0.0)
        own = sum(self._own.cpu_times()[:2])
        last, self._last = self._last, (now, threads, busy, own)
        if last is None or now - last[0] <= 0:
            return None
        dt = now - last[0]
        shares = [(cpu - last[1].get(tid, cpu)) / dt for tid, cpu in threads.items()]
        game = sum(shares)
        other = max(0.0, (busy - last[2]) / dt - (own - last[3]) / dt - game)
        busy_since = self._busy_since()
        return GameLoad(game_busy_cores=game, game_busy_threads=sum(1 for s in shares if s >= self._busy_share),
                        other_busy_cores=other, watching_game=self._game is not None,
                        daemon_busy=busy_since is not None and busy_since <= last[0])


class FrameGuard:
    """`report()` from the transports (through the service core), `run()` as a task, `state` for
    status. Disabled (--no-frame-guard), it answers the game's reports and applies nothing."""

    def __init__(self, settings: GuardSettings, enabled: bool, game_pid: int | None,
                 apply: Callable[[PassLimits], None], pause_ms: Callable[[], float] = lambda: 0.0,
                 cores: int | None = None, busy_since: Callable[[], float | None] = lambda: None) -> None:
        self.settings, self.enabled = settings, enabled
        self.cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self._pause_ms = pause_ms
        self.state = GuardState()
        if not enabled:
            self.state = replace(self.state, source="off", reason="--no-frame-guard: the plan's threads, no pauses")
        self._apply = apply
        self._watch = ProcessWatch(game_pid, settings.busy_thread_share, busy_since) if enabled else None
        self._priority = LowPriority()
        self._game = GameClients(game_pid)
        self._allowances: dict[str, tuple[float, float]] = {}  # client -> (reports left, when)

    async def report(self, report: pb.FrameReport, caller: Caller) -> pb.FrameGuardState:
        """A frame report from `caller`: at most REPORTS_PER_S a second from each client, only
        when its figures can be true (checked first: cheap, and they change nothing either way),
        and counted only from the game (game_clients.py)."""
        self._spend_allowance(caller, time.monotonic())
        window = check_report(report)
        watched = await self._game_or_refuse(caller)
        now = time.monotonic()
        if self.enabled:
            self._set(on_report(self.state, window, now, self.settings, self.cores, watched=watched))
        else:
            self.state = replace(self.state, last_window=window, last_report_s=now, reports=self.state.reports + 1)
        return self.to_pb()

    def _spend_allowance(self, caller: Caller, now: float) -> None:
        # The game token's holders share one allowance: each of them is the game.
        key = "game token" if caller.game_token else caller.key
        left, at = self._allowances.get(key, (REPORTS_PER_S, now))
        left = min(REPORTS_PER_S, left + (now - at) * REPORTS_PER_S)
        if len(self._allowances) > 256:  # a client quiet for a second is back to a full allowance
            self._allowances = {k: v for k, v in self._allowances.items() if now - v[1] < 1.0}
        if left < 1.0:
            self._allowances[key] = (left, now)
            raise ResourceExhausted(f"frame reports come at most {REPORTS_PER_S:g} a second from a client: send one a second")
        self._allowances[key] = (left - 1.0, now)

    async def _game_or_refuse(self, caller: Caller) -> bool:
        """True when the report is the watched process's, False when it carries the game token;
        PermissionDenied when it is neither's."""
        if caller.game_token:
            return False
        if caller.address is not None and self._game.game_pid is not None:
            now = time.monotonic()
            verdict = self._game.known(caller.address, now)
            if verdict is None:
                if not self._game.may_look_up(now):
                    raise ResourceExhausted("too many new clients report frames at once: try again in a second")
                verdict = await asyncio.to_thread(self._game.lookup, caller.address)
                self._game.remember(caller.address, verdict, time.monotonic())
            if verdict:
                return True
        raise PermissionDenied(self._not_the_game(caller))

    def _not_the_game(self, caller: Caller) -> str:
        pid = self._game.game_pid
        game = f"the watched process (pid {pid}: --parent-pid, else the daemon's parent)" if pid is not None \
            else "the watched process (none here: start the daemon with --parent-pid)"
        how = "over a Unix socket, whose clients the daemon cannot tell apart" if caller.address is None \
            else "from another process"
        return (f"frame reports steer the guard only from the game: {game} over TCP or the WebSocket bridge, or a "
                f"client carrying XLM_SIDECAR_GAME_TOKEN; this one came {how}")

    async def run(self) -> None:
        if not self.enabled:
            return
        self._set(on_load(self.state, GameLoad(), time.monotonic(), self.settings, self.cores))
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            load = await asyncio.to_thread(self._watch.sample)
            if load is not None:
                self._set(on_load(self.state, load, time.monotonic(), self.settings, self.cores))
            if self.state.limits.low_priority:  # threads started since, too
                await asyncio.to_thread(self._priority.apply, self.state.limits.idle_class)

    def _set(self, state: GuardState) -> None:
        before, self.state = self.state.limits, state
        if state.limits != before:
            self._apply(state.limits)
            log.info("frame guard", threads=state.limits.max_threads or "plan", pass_tokens=state.limits.max_pass_tokens
                     or "plan", pause=state.limits.pause_ratio, low_priority=state.limits.low_priority,
                     idle_class=state.limits.idle_class,
                     source=state.source, reason=state.reason)

    def to_pb(self) -> pb.FrameGuardState:
        s, limits, w = self.state, self.state.limits, self.state.last_window
        return pb.FrameGuardState(
            enabled=self.enabled, source=s.source, frame_budget_ms=budget_ms(self.settings, w),
            max_threads=limits.max_threads, max_pass_tokens=limits.max_pass_tokens,
            pause_ms=self._pause_ms(), low_priority=limits.low_priority and self._priority.applied,
            idle_class=self._priority.idle_applied, reason=s.reason,
            game_frame_ms_p99=w.p99_ms if w else 0.0, game_over_budget_share=(w.over_budget / w.frames) if w else 0.0,
            game_busy_cores=s.load.game_busy_cores, game_busy_threads=s.load.game_busy_threads,
            changes=s.changes, reports=s.reports)

