"""The daemon before its engine exists, and its machine profile, as callers see them.

The daemon listens first and loads after (a launcher can poll health and watch the phase from
the first second), so status and state must be answerable without an engine, and calls that need
one are refused with a hint of when to try again.
"""

from __future__ import annotations

from sidecar.api import pb
from sidecar.budget import Budget
from sidecar.errors import NotReady
from sidecar.profiler.status import DEFAULTS, MEASURED, OFF, REFRESHING, ProfileView
from sidecar.service.convert import budget_to_pb, phase_to_pb

# How long a caller refused while the daemon starts should wait before trying again: a small
# model loads in about a second, and polling faster only takes CPU from the load.
RETRY_AFTER_MS = 500

_PROFILE_STATES = {
    MEASURED: pb.PROFILE_STATE_MEASURED,
    DEFAULTS: pb.PROFILE_STATE_DEFAULTS,
    REFRESHING: pb.PROFILE_STATE_REFRESHING,
    OFF: pb.PROFILE_STATE_OFF,
}


def not_ready(phase: str) -> NotReady:
    return NotReady(
        f"the daemon is {phase} (listening, the model not loaded yet); retry in {RETRY_AFTER_MS} ms, "
        "or wait for health SERVING / WatchState phase READY",
        RETRY_AFTER_MS,
    )


def profile_to_pb(view: ProfileView | None) -> pb.ProfileProgress | None:
    if view is None:
        return None
    return pb.ProfileProgress(
        state=_PROFILE_STATES.get(view.state, pb.PROFILE_STATE_UNSPECIFIED),
        steps_done=view.steps_done,
        steps_total=view.steps_total,
        step=view.step,
        slices_discarded=view.slices_discarded,
        source=view.source,
    )


def starting_status(
    *, phase: str, budget: Budget, version: str, uptime_s: float, host_resident_bytes: int,
    listen_addresses: list[str], max_message_bytes: int, max_image_bytes: int, profile: ProfileView | None,
    ram_budget_bytes: int = 0,
) -> pb.Status:
    """GetStatus before the engine exists: what is known without a model."""
    return pb.Status(
        version=version,
        phase=phase_to_pb(phase),
        budget=budget_to_pb(budget, ram_bytes=ram_budget_bytes),
        memory=pb.MemoryUse(host_resident_bytes=host_resident_bytes),
        limits=pb.Limits(max_message_bytes=max_message_bytes, max_image_bytes=max_image_bytes),
        uptime_s=uptime_s,
        listen_addresses=listen_addresses,
        profile=profile_to_pb(profile),
    )
