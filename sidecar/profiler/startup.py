"""Which machine profile the daemon starts with, without measuring anything in front of it.

`--profile auto`: the stored profile for this machine when there is a good one; none (the
planner then uses built-in defaults) when it is missing, unreadable or of another schema; the
stored one, marked, when it holds figures taken under load. In the last two cases the daemon
measures a profile in the background (sidecar.profiler.background) and re-plans when it lands.
`--profile FILE`: that file, as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sidecar.profiler.database import ProfileDB, ProfileError, load_profile
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.plan import QUICK_PLAN, ProfilePlan, tiny_plan
from sidecar.profiler.quality import disturbed_share, profile_disturbed
from sidecar.profiler.status import DEFAULTS, MEASURED, REFRESHING, ProfileView
from sidecar.profiler.store import default_profile_path

# Test hook: the background profile measures the seconds-long tiny plan instead of the quick one.
PLAN_ENV = "XLM_SIDECAR_BACKGROUND_PROFILE_PLAN"


@dataclass(frozen=True)
class StartupProfile:
    db: ProfileDB | None  # None: plan from built-in defaults
    hardware: HardwareInfo
    view: ProfileView
    # Where a background profile goes; None when none is to be measured.
    measure_to: Path | None = None
    reason: str = ""


def startup_profile(setting: str, log=None) -> StartupProfile:
    """The profile to start with for `--profile` auto or FILE (see the module docstring)."""
    hardware = discover_hardware()
    if setting != "auto":
        return StartupProfile(load_profile(Path(setting)), hardware, ProfileView(MEASURED, setting))
    path = default_profile_path(hardware)
    try:
        db = load_profile(path)
    except FileNotFoundError:
        return StartupProfile(None, hardware, ProfileView(DEFAULTS, "defaults"), path, "no profile for this machine yet")
    except ProfileError as e:
        return StartupProfile(None, hardware, ProfileView(DEFAULTS, "defaults"), path, f"stored profile unusable: {e}")
    if profile_disturbed(db):
        share = disturbed_share(db)
        reason = (f"stored profile measured under load ({share:.0%} of its kernel figures disturbed, "
                  f"contention {db.contention:.0%})")
        return StartupProfile(db, hardware, ProfileView(REFRESHING, "disk"), path, reason)
    return StartupProfile(db, hardware, ProfileView(MEASURED, "disk"))


def background_plan() -> ProfilePlan:
    """What the daemon measures in the background: the quick plan (the tiny one for tests)."""
    return tiny_plan() if os.environ.get(PLAN_ENV) == "tiny" else QUICK_PLAN
