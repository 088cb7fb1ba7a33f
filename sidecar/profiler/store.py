"""Where this machine's profile lives, and getting one (loading it or measuring it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.profiler.database import SCHEMA_VERSION, ProfileDB, ProfileError, load_profile, save_profile
from sidecar.profiler.fingerprint import fingerprint_of, llama_build_info
from sidecar.profiler.hardware import HardwareInfo, discover_hardware
from sidecar.profiler.plan import FULL_PLAN, QUICK_PLAN
from sidecar.profiler.progress import LogProgress, ProgressReporter


def profiles_dir() -> Path:
    """The folder holding profiles: <user cache dir>/xlm-sidecar/profiles."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("xlm-sidecar")) / "profiles"


def current_fingerprint(hardware: HardwareInfo | None = None) -> str:
    """The fingerprint of this machine and llama.cpp build (runs hardware discovery)."""
    version, system_info = llama_build_info()
    return fingerprint_of(hardware or discover_hardware(), version, system_info)


def default_profile_path(hardware: HardwareInfo | None = None) -> Path:
    """Where the profile for this machine and llama.cpp build is stored.

    <user cache dir>/xlm-sidecar/profiles/<fingerprint>.v<schema>.json: a new driver, CPU or llama.cpp
    build gives a new fingerprint, so an old profile is simply not found.
    """
    return profiles_dir() / profile_file_name(current_fingerprint(hardware))


def profile_file_name(fingerprint: str) -> str:
    """<fingerprint>.json for schema 1; later schemas add their version, so builds of two schema
    versions on one machine each keep their own profile instead of re-measuring over the other's."""
    return f"{fingerprint}.json" if SCHEMA_VERSION == 1 else f"{fingerprint}.v{SCHEMA_VERSION}.json"


def ensure_profile(
    quick: bool = True,
    log: Any = None,
    progress: ProgressReporter | None = None,
    path: Path | None = None,
) -> tuple[ProfileDB, bool]:
    """This machine's profile and whether it was just created.

    Loads the profile stored for the current fingerprint. When there is none, or it is
    unreadable or of another schema version, runs a profile (quick unless `quick=False`),
    saves it atomically and returns (profile, True). `log` is a structlog-style logger for
    the progress lines and the reason a profile was (re)made.
    """
    if log is None:
        import structlog

        log = structlog.get_logger("sidecar.profiler")
    hardware = discover_hardware()
    target = path or default_profile_path(hardware)
    try:
        return load_profile(target), False
    except FileNotFoundError:
        log.info("profile_missing", path=str(target), mode="quick" if quick else "full")
    except ProfileError as exc:
        log.warning("profile_unusable", path=str(target), reason=str(exc))
    from sidecar.profiler.runner import run_profile

    db = run_profile(
        QUICK_PLAN if quick else FULL_PLAN,
        hardware=hardware,
        progress=progress or LogProgress(log),
    )
    save_profile(db, target)
    log.info("profile_saved", path=str(target), seconds=round(db.duration_s, 1))
    return db, True
