"""Install-phase profiling: measure this machine once, store a small profile database.

Public API for the rest of the sidecar (the planner reads ProfileDB as pure data):

    default_profile_path() -> Path
    load_profile(path) -> ProfileDB
    save_profile(db, path) -> Path
    ensure_profile(quick=True, log=None) -> (ProfileDB, was_created)
    run_profile(plan, *, hardware=None, progress=None, cache_dir=None) -> ProfileDB

Importing this package is cheap: llama.cpp is loaded only when something is measured or
fingerprinted.
"""

from sidecar.profiler.database import (
    SCHEMA_VERSION,
    BandwidthEntry,
    KernelEntry,
    ProfileDB,
    ProfileError,
    ProfileFormatError,
    SchemaVersionError,
    load_profile,
    save_profile,
)
from sidecar.profiler.plan import FULL_PLAN, QUICK_PLAN, ProbeShape, ProfilePlan
from sidecar.profiler.store import default_profile_path, ensure_profile


def run_profile(*args, **kwargs) -> ProfileDB:
    """Measure this machine (see sidecar.profiler.runner.run_profile); nothing is saved."""
    from sidecar.profiler.runner import run_profile as _run

    return _run(*args, **kwargs)


__all__ = [
    "FULL_PLAN",
    "QUICK_PLAN",
    "SCHEMA_VERSION",
    "BandwidthEntry",
    "KernelEntry",
    "ProbeShape",
    "ProfileDB",
    "ProfileError",
    "ProfileFormatError",
    "ProfilePlan",
    "SchemaVersionError",
    "default_profile_path",
    "ensure_profile",
    "load_profile",
    "run_profile",
    "save_profile",
]
