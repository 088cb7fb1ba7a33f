"""What the daemon tells callers about its machine profile: where it came from, and how far the
background measurement has got. Pure data; the service turns it into `ProfileProgress`."""

from __future__ import annotations

from dataclasses import dataclass

# The states of proto's ProfileState, by name.
MEASURED = "measured"  # a profile measured on this machine is in force
DEFAULTS = "defaults"  # built-in defaults; the profile is being measured in the background
REFRESHING = "refreshing"  # a profile with figures taken under load; those are re-measured
OFF = "off"  # no planner


@dataclass(frozen=True)
class ProfileView:
    state: str
    source: str  # "disk", "defaults", "background", a file path, "off"
    steps_done: int = 0
    steps_total: int = 0
    step: str = ""
    slices_discarded: int = 0
