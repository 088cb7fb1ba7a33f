"""What the frame-time guard decides: from what it sees of the game, the limits on the engine's
passes. Pure: observations in, frozen limits out; no clock of its own, no I/O (guard_task.py feeds
it and applies what it decides).

Measured on a 2-core machine (bench/run.py game, issue 26) a game thread doing 8 ms a frame at 60
fps misses 5.8% of its frames beside the daemon's two spinning threads and none beside one thread.
So the levers, in the order they are pulled:

1. *Below the game's priority*, always while the guard is on. It costs nothing on an idle machine
   and makes the OS hand the core back the moment a game thread wakes, instead of at the end of a
   time slice.
2. *Threads*: the cores the game's busy threads (and anything else busy on the machine) leave free,
   at least one. A game thread busy 40% of a frame still needs a whole core when it runs. What
   counts is what runs beside the replies: a load that stops whenever a reply runs (a benchmark's
   other side, a script that asks and then reads) does not slow the next reply's start (on_load).
3. With frame reports, feedback on top: while frames run past their budget the guard steps up one
   level every `step_up_s`; after `step_down_s` of clean frames it steps one back. Levels: one
   thread fewer; passes of at most `short_pass_tokens` tokens (a long prefill split so no pass holds
   a core for long); a pause after each pass of half its time, then of its whole time. The ladder
   has a floor: together its steps leave the NPCs at least `npc_floor` (half) of the speed that what
   the watch measured leaves them (the cores the game really keeps busy are not theirs to keep), so
   a pause is shortened, or dropped, where a thread fewer already costs that much. The game never
   starves them to nothing, nor they it. Reports alone never take the idle scheduling class.

The GPU side would add observations (the game's GPU frame time, VRAM pressure, NVML utilisation)
and levers (a lower token tier, fewer layers streamed per pass) to the same ladder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GuardSettings:
    frame_budget_ms: float = 1000.0 / 60
    # A frame window counts as bad when more than this share of its frames ran over budget.
    bad_share: float = 0.01
    step_up_s: float = 2.0
    step_down_s: float = 10.0
    short_pass_tokens: int = 32
    # Reports older than this no longer steer (the game stopped sending, or paused).
    report_stale_s: float = 5.0
    # A thread of the game counts as busy above this share of a core.
    busy_thread_share: float = 0.10
    # How far below the game the daemon's threads go (priority.py): "auto" (nice 19, and the idle
    # scheduling class once the game fills every core or its frames run late), "idle" or "low".
    priority: str = "auto"
    # The idle class cannot be left, so "auto" takes it only when the need lasts this long (a start,
    # a scene load or one bad window is no reason to keep it for the daemon's whole life).
    idle_after_s: float = 5.0
    # The ladder's floor: the share of the speed the measured load leaves the NPCs that its steps
    # together keep (README: "the NPCs keep at least about half").
    npc_floor: float = 0.5


@dataclass(frozen=True)
class FrameWindow:
    """One FrameReport, checked."""

    frames: int
    window_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    over_budget: int
    budget_ms: float  # 0: the daemon's own


@dataclass(frozen=True)
class GameLoad:
    """What watching the game's process and the machine showed over the last interval."""

    game_busy_cores: float = 0.0
    game_busy_threads: int = 0
    other_busy_cores: float = 0.0  # the rest of the machine, neither the game nor the daemon
    watching_game: bool = False
    # The daemon ran passes for the whole interval: what the watch saw is what runs beside a reply.
    daemon_busy: bool = False


@dataclass(frozen=True)
class PassLimits:
    """What the engine applies to each pass. 0 = no limit (the plan's)."""

    max_threads: int = 0
    max_pass_tokens: int = 0
    pause_ratio: float = 0.0  # a pause after each pass, as a share of its time
    low_priority: bool = False
    idle_class: bool = False  # the idle scheduling class (priority.py); once taken, kept


NO_LIMITS = PassLimits()
MAX_LEVEL = 4


@dataclass(frozen=True)
class GuardState:
    limits: PassLimits = NO_LIMITS
    level: int = 0
    source: str = "nothing seen"
    reason: str = "nothing seen of the game yet"
    load: GameLoad = GameLoad()
    last_window: FrameWindow | None = None
    last_report_s: float = -math.inf
    last_step_s: float = -math.inf
    clean_since_s: float | None = None
    fills_since_s: float | None = None  # since when the game fills every core or its frames run late
    changes: int = 0
    reports: int = 0
    # The last report came from the watched process itself: the watch sees its threads, so nothing
    # is inferred from its frames.
    reporter_watched: bool = False
    # Whether the load waits for the daemon (on_load): the most cores taken while it was idle since
    # its last reply, while that reply ran (None outside a reply, or before a whole interval of
    # one), the idle figure as that reply began, and the cores of the load last seen waiting.
    idle_taken: int = 0
    busy_taken: int | None = None
    before_taken: int = 0
    waited_taken: int = 0
    # Something ran beside the last reply. Until something has, other processes' load seen only
    # between replies takes no core from the next one's start (decide).
    competed: bool = False

    @property
    def waits_for_us(self) -> bool:
        return self.waited_taken > 0


def budget_ms(settings: GuardSettings, window: FrameWindow | None) -> float:
    return window.budget_ms if window is not None and window.budget_ms > 0 else settings.frame_budget_ms


def on_report(state: GuardState, window: FrameWindow, now_s: float, settings: GuardSettings, cores: int, *,
              watched: bool = False) -> GuardState:
    """A frame report (the game's: guard_task.py refuses any other's): step the level up while
    frames run late, down after a clean stretch. `watched`: it came from the watched process."""
    budget = budget_ms(settings, window)
    bad = window.over_budget > settings.bad_share * window.frames or window.p99_ms > budget
    clean = window.over_budget == 0 and window.p99_ms <= 0.85 * budget
    level, clean_since = state.level, state.clean_since_s
    # Only a window that began after the last step is evidence about it: the one that straddles it
    # still shows the frames from before, and stepping on those climbs past what was needed.
    after_step = now_s - window.window_ms / 1000.0 >= state.last_step_s
    if bad:
        clean_since = None
        if level < MAX_LEVEL and after_step and now_s - state.last_step_s >= settings.step_up_s:
            level += 1
    elif clean:
        clean_since = now_s if clean_since is None else clean_since
        if level > 0 and now_s - clean_since >= settings.step_down_s:
            level, clean_since = level - 1, now_s
    else:
        clean_since = None
    stepped = level != state.level
    state = replace(state, level=level, clean_since_s=clean_since, last_window=window, last_report_s=now_s,
                    reports=state.reports + 1, last_step_s=now_s if stepped else state.last_step_s,
                    reporter_watched=watched)
    return decide(state, now_s, settings, cores)


def on_load(state: GuardState, load: GameLoad, now_s: float, settings: GuardSettings, cores: int) -> GuardState:
    """A sample of the watch. Besides the load itself it learns whether the load waits for the
    daemon: a load that was there before a reply and took no core while the reply ran (a
    benchmark's other side, a script that sends a request and then only reads the reply) is not
    held against the next reply's start; anything that runs beside a reply counts at once."""
    taken = _taken(load)
    if load.daemon_busy:
        if state.busy_taken is None:
            state = replace(state, busy_taken=taken, before_taken=state.idle_taken)
        else:
            state = replace(state, busy_taken=max(state.busy_taken, taken))
    else:
        beside = state.busy_taken
        if beside is not None:  # a reply just ended: what ran beside it is known
            state = replace(state, competed=beside > 0)
            if beside > 0:  # something ran beside it: nothing waits
                state = replace(state, waited_taken=0)
            elif state.before_taken > 0:  # a load before it, none beside it: that load waits
                state = replace(state, waited_taken=state.before_taken)
            # (nothing before and nothing beside: no news either way)
            state = replace(state, busy_taken=None, idle_taken=0)
        state = replace(state, idle_taken=max(state.idle_taken, taken))
    return decide(replace(state, load=load), now_s, settings, cores)


def _taken(load: GameLoad) -> int:
    return load.game_busy_threads + _whole_cores(load.other_busy_cores)


def _waiting_for_us(state: GuardState) -> bool:
    """The sampled load is one that waited for the daemon's last reply, at no more cores than it
    took before that reply: the next reply starts with the cores free (a load beyond it counts)."""
    load = state.load
    return not load.daemon_busy and 0 < _taken(load) <= state.waited_taken


def _whole_cores(busy: float) -> int:
    return round(busy) if busy >= 0.5 else 0


def decide(state: GuardState, now_s: float, settings: GuardSettings, cores: int) -> GuardState:
    """The limits for the state's load and level, and why."""
    load = state.load
    waiting = _waiting_for_us(state)
    if waiting:
        load = GameLoad(watching_game=load.watching_game)
    # Other processes (not the game the daemon watches, which launched it) seen only between
    # replies, where nothing ran beside the last one: a benchmark's other side, a build, a
    # launcher's burst. Taking a core for them cost the next reply a thread before it had seen
    # them (issue 40, measured: first token 1.85x, decode 0.70x). Beside a reply they count at the
    # first sample (half a second in), and between replies from then on.
    unproven = 0.0
    if not load.daemon_busy and not state.competed and load.other_busy_cores:
        unproven, load = load.other_busy_cores, replace(load, other_busy_cores=0.0)
    reporting = now_s - state.last_report_s <= settings.report_stale_s
    level = state.level if reporting else 0
    other_cores = load.other_busy_cores
    game_threads = load.game_busy_threads
    # What the watch measured, whatever the reports say: the idle class and the ladder's floor go by it.
    measured = _taken(load)
    if reporting and state.last_window is not None and not game_threads and not state.reporter_watched:
        # A game that reports frames with real work in them has at least its main thread busy, even
        # where its process is not the one we watch (it reports with the game token from another
        # process). Not from the watched process itself: there the watch sees its threads.
        w = state.last_window
        share = w.p50_ms / budget_ms(settings, w)
        game_threads = 1 if share >= settings.busy_thread_share else 0
        if game_threads:
            # The watched process (if any) shows no busy thread, so the reporting game is another
            # process, counted among the machine's others: not counted twice.
            other_cores = max(0.0, other_cores - min(share, 1.0))
    others = _whole_cores(other_cores)
    taken = game_threads + others
    threads = max(1, cores - taken) if taken else 0
    why = []
    if load.game_busy_threads:
        why.append(f"the game keeps {load.game_busy_threads} thread(s) busy ({load.game_busy_cores:.2f} cores)")
    elif game_threads:
        why.append("the game reports frames with work in them: one core for its main thread")
    if others:
        why.append(f"other processes keep {other_cores:.1f} cores busy")
    if waiting:
        why.append(f"the load on the machine ({state.waited_taken} core(s)) took none while a reply ran: "
                   "it waits for the replies, so the next one starts with every core")
    if _whole_cores(unproven):
        why.append(f"other processes keep {unproven:.1f} cores busy between the replies, none beside the last: "
                   "the next starts with every core, and they count once they run beside one")
    if level >= 1:
        threads = max(1, (threads or cores) - 1)
    tokens = settings.short_pass_tokens if level >= 2 else 0
    ladder_pause = {3: 0.5, 4: 1.0}.get(level, 0.0)
    # The floor: the threads the reports took (a step, an inferred main thread) and the pause
    # together keep the NPCs npc_floor of what the measured load leaves them. Threads are counted
    # as if the speed followed them (it follows them less: a safe side), a pause of r as 1/(1+r).
    free = max(1, cores - measured) if measured else cores
    if threads:
        threads = max(threads, math.ceil(settings.npc_floor * free - 1e-9))
    kept = min(threads or cores, free) / free
    pause = min(ladder_pause, max(0.0, kept / settings.npc_floor - 1.0))
    if reporting and state.last_window is not None:
        w = state.last_window
        why.append(f"frames p99 {w.p99_ms:.1f} ms, {w.over_budget}/{w.frames} over {budget_ms(settings, w):.1f} ms"
                   + (f" (level {level})" if level else ""))
        if pause < ladder_pause:
            why.append(f"pauses held to {pause:.2f} of a pass: the NPCs keep at least {settings.npc_floor:.0%} "
                       "of their speed")
    # The idle class only where the daemon must share a core with the game, as the watch measures
    # it (the game, or anything else, keeps every core busy): beside a game that leaves a core free
    # it cost the game's p99 frame time (bench/run.py game, one game thread on 2 cores: 12.8-13.4
    # ms against 10.6-11.4 at nice 19; the OS counts a core running only idle-class threads as
    # free, and wakes the game's thread there, off its warm cache), where beside a game on every
    # core it cut late frames from 8-10% to 1.3-1.4%. Late frames alone do not take it: they say
    # nothing of a core being shared, and it cannot be left without privilege, so once taken it is
    # kept for the daemon's life.
    fills = measured >= cores
    fills_since = (state.fills_since_s if state.fills_since_s is not None else now_s) if fills else None
    lasting = fills_since is not None and now_s - fills_since >= settings.idle_after_s
    idle = settings.priority == "idle" or (settings.priority == "auto" and lasting) or state.limits.idle_class
    if idle and settings.priority == "auto":
        why.append("in the idle scheduling class" + ("" if fills else " (taken earlier: kept)"))
    limits = PassLimits(max_threads=threads, max_pass_tokens=tokens, pause_ratio=pause, low_priority=True,
                        idle_class=idle)
    source = ("frame reports" if reporting else "watching the game process" if load.watching_game
              else "machine load" if others else "nothing seen")
    reason = "; ".join(why) if why else "the game leaves the cores free: below its priority only"
    changes = state.changes + (limits != state.limits)
    return replace(state, limits=limits, source=source, reason=reason, changes=changes, fills_since_s=fills_since)
