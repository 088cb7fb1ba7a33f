"""The machine profile a benchmark's daemon starts with: the stored one, as it is.

With `--profile auto` a daemon whose stored profile was measured under load (on a shared machine,
most are) measures a new one in the background whenever its own engine is idle, and re-plans when
it lands. In a side-by-side benchmark its engine is idle exactly while the other sides run, so
those sides would be measured against a profiler spinning on the same cores, and the daemon would
reload mid-run. Benchmarks hand their daemons the stored file instead (`--profile FILE`: used as
it is, nothing measured in the background), so every side runs alone and the planner sees the
same figures as `auto` would have started with.
"""

from __future__ import annotations


def profile_flags() -> list[str]:
    """`--profile FILE` for the stored profile of this machine; none (auto) when there is none,
    and then the daemon's start-up line says it measures in the background."""
    from sidecar.profiler.store import default_profile_path

    path = default_profile_path()
    if not path.is_file():
        print(f"   no stored machine profile ({path}): the daemon plans from defaults and measures one in the background")
        return []
    return ["--profile", str(path)]
