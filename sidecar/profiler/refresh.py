"""The daemon's side of the background profile: start it when the plan in force was made
without a good profile, publish its progress (WatchState, GetStatus), and when it lands re-plan
the budget in force with it and switch the way a budget change does (no stream dropped)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from sidecar.profiler.status import MEASURED, OFF, REFRESHING, ProfileView

log = structlog.get_logger("profile")


def profile_view(inputs) -> ProfileView:
    """What GetStatus and WatchState say about the profile behind `inputs` (PlanInputs or None)."""
    if inputs is None or getattr(inputs, "startup", None) is None:
        return ProfileView(OFF, "off")
    return inputs.startup.view


class ProfileRefresh:
    """One background measurement and the re-plan it ends with. Made on the daemon's loop."""

    def __init__(self, inputs, engine, service, holder: list) -> None:
        from sidecar.profiler.background import BackgroundProfiler, EngineActivity
        from sidecar.profiler.startup import background_plan

        self._loop = asyncio.get_running_loop()
        self._service = service
        self._engine = engine  # the Engine: its schedule's threads are logged after a re-plan
        self._holder = holder
        self._view = inputs.startup.view
        self._switches: set[asyncio.Task] = set()
        start = inputs.startup
        self.profiler = BackgroundProfiler(
            background_plan(), start.hardware, start.measure_to, EngineActivity(engine),
            self._progress_from_thread, self._complete_from_thread,
        )

    @classmethod
    def start_if_needed(cls, settings, inputs, engine, service, holder: list) -> ProfileRefresh | None:
        start = getattr(inputs, "startup", None)
        if start is None or start.measure_to is None:
            return None
        refresh = cls(inputs, engine, service, holder)
        log.info("measuring the machine profile in the background, while idle", reason=start.reason,
                 plan=refresh.profiler.plan.mode)
        refresh.profiler.start()
        return refresh

    def signal_stop(self) -> None:
        """Tell the profiler to stop (it gives the cores back within one probe decode)."""
        self.profiler.request_stop()

    async def stop(self) -> None:
        await asyncio.to_thread(self.profiler.stop)
        for task in list(self._switches):
            task.cancel()

    # -- from the profiler's thread --------------------------------------------------------------

    def _progress_from_thread(self, done: int, total: int, step: str, discarded: int) -> None:
        self._loop.call_soon_threadsafe(self._publish, done, total, step, discarded)

    def _complete_from_thread(self, db) -> None:
        self._loop.call_soon_threadsafe(self._switch_soon, db)

    # -- on the loop -------------------------------------------------------------------------------

    def _publish(self, done: int, total: int, step: str, discarded: int) -> None:
        self._view = replace(self._view, steps_done=done, steps_total=total, step=step, slices_discarded=discarded)
        self._service.state.publish(profile=self._view, reason="profile")

    def _switch_soon(self, db) -> None:
        task = asyncio.ensure_future(self._switch(db))
        self._switches.add(task)
        task.add_done_callback(self._switches.discard)

    async def _switch(self, db) -> None:
        from sidecar.planner import hardware_from_profile
        from sidecar.profiler.quality import profile_disturbed

        hardware = await asyncio.to_thread(hardware_from_profile, db)
        state = REFRESHING if profile_disturbed(db) else MEASURED
        view = replace(self._view, state=state, source="background", step="")
        inputs = self._holder[0]
        self._holder[0] = replace(inputs, hardware=hardware, startup=replace(inputs.startup, db=db, view=view))
        control = self._service.budget_control
        change = await control.replan("profile")
        self._view = view
        self._service.state.publish(profile=view, reason="profile")
        log.info("re-planned with the measured profile", profile=state, reloaded=change.reloaded,
                 pause_ms=round(change.pause_ms, 1), tier_threads=dict(self._engine.config.tier_threads))
