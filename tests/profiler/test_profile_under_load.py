"""A profile a busy PC cannot poison: taken while a busy-loop process holds one of the cores, it
is marked, and it leads to the thread choice of a quiet profile; stored, it is detected at the
next start and measured again in the background. Real probes (the tiny plan), real planner on
the real SmolLM2 header, a real busy-loop process, a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sidecar.budget import Budget
from sidecar.model_info import inspect_gguf
from sidecar.planner import hardware_from_profile, plan
from sidecar.profiler.database import ProfileDB, load_profile, save_profile
from sidecar.profiler.plan import tiny_plan
from sidecar.profiler.quality import disturbed_share, profile_disturbed
from sidecar.profiler.runner import run_profile
from support.daemons import start_daemon, stop_daemon
from support.daemons import wait_for_event as _events_until

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                                reason="needs two cores and CPU affinity (Linux)")


@contextmanager
def busy_loop_on_one_core() -> Iterator[None]:
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(loop.pid, {max(os.sched_getaffinity(0))})
        yield
    finally:
        loop.kill()
        loop.wait()


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> tuple[ProfileDB, ProfileDB]:
    probes = tmp_path_factory.mktemp("probes")
    quiet = run_profile(tiny_plan(), cache_dir=probes, quiet_wait_s=0)
    with busy_loop_on_one_core():
        busy = run_profile(tiny_plan(), cache_dir=probes, quiet_wait_s=0)
    return quiet, busy


def tier_threads(db: ProfileDB, model) -> dict[int, int]:
    schedule = plan(model, hardware_from_profile(db), Budget(vram_bytes=0), ctx=4096)
    return {t.max_tokens: t.threads for t in schedule.tiers}


def assert_never_fewer_threads(disturbed: dict[int, int], quiet: dict[int, int]) -> None:
    """The rule the planner keeps for figures it knows were disturbed: never fewer threads than
    the quiet profile plans, tier by tier. Not equality: where a quiet profile finds one and two
    threads within its 2% slack (the small decode tiers of a 135M model here), which of the two it
    plans flips between quiet runs of the tiny profile (a quiet profile in CI planned {1: 1, 4: 1},
    others {1: 2, 4: 2}); a disturbed figure is capped at the modest speed-up
    quiet figures show, which keeps the extra thread, and the profile is taken again when quiet.
    The bug this guards against planned one thread for every tier, on every start after a busy
    first launch."""
    fewer = {k: (disturbed[k], quiet[k]) for k in quiet if disturbed[k] < quiet[k]}
    assert not fewer, f"fewer threads than the quiet profile plans (tier: (disturbed, quiet)): {fewer}"


def test_a_profile_beside_a_busy_loop_is_marked_and_plans_the_quiet_threads(profiles, smollm2_path) -> None:
    quiet, busy = profiles
    assert profile_disturbed(busy) and disturbed_share(busy) > 0, "the busy loop's load was not noticed"
    assert busy.contention > 0.3
    model = inspect_gguf(smollm2_path)
    print("threads per tier, quiet", tier_threads(quiet, model), "busy", tier_threads(busy, model))
    assert_never_fewer_threads(tier_threads(busy, model), tier_threads(quiet, model))
    assert all(e.spread >= 0 for e in busy.entries)


def test_a_disturbed_profile_on_disk_is_refreshed_at_start(profiles, tmp_path: Path) -> None:
    _, busy = profiles
    env = {"XDG_CACHE_HOME": str(tmp_path), "XLM_SIDECAR_BACKGROUND_PROFILE_PLAN": "tiny"}
    from sidecar.profiler import store

    # The same folder the daemon will look in, from the same fingerprint.
    target = tmp_path / "xlm-sidecar" / "profiles" / store.profile_file_name(store.current_fingerprint())
    save_profile(busy, target)
    daemon = start_daemon("--budget", "0", "--profile", "auto", env=env)  # about the profile: not off
    try:
        ready = next(e for e in daemon.log_lines if e["event"] == "ready")
        assert ready["profile"] == "refreshing"
        _events_until(daemon, "background profile saved", 180)
    finally:
        stop_daemon(daemon)
    refreshed = load_profile(target)
    assert refreshed.created_at != busy.created_at or refreshed.duration_s != busy.duration_s
    assert "measured in the background" in " ".join(refreshed.notes)


def _poisoned(db: ProfileDB, marked: bool) -> ProfileDB:
    """`db` as a busy loop on one of two cores leaves it, with or without the load recorded: every
    figure at the most threads three times its one-thread figure (the issue measured multi-threaded
    figures about three times slower). Set from the one-thread figure rather than scaled from its
    own, so that taken at face value it always loses: the test does not depend on how close this
    run's quiet one- and two-thread figures happened to be."""
    from dataclasses import replace

    top = max(e.threads for e in db.entries)

    def series(e) -> tuple:
        return (e.op, e.shape, e.weight_type, e.batch, e.device, e.condition)
    one = {series(e): e.seconds for e in db.entries if e.threads == 1}
    entries = tuple(replace(e, seconds=3.0 * one.get(series(e), e.seconds), load=0.5 if marked else 0.0)
                    if e.threads == top else e for e in db.entries)
    return replace(db, entries=entries)


def test_figures_known_disturbed_never_pick_fewer_threads(profiles, smollm2_path) -> None:
    quiet, _ = profiles
    model = inspect_gguf(smollm2_path)
    quiet_threads = tier_threads(quiet, model)
    marked = tier_threads(_poisoned(quiet, marked=True), model)
    assert_never_fewer_threads(marked, quiet_threads)
    # The same figures without their load are believed, and the plan drops to one thread: the mark
    # is what keeps the threads.
    unmarked = tier_threads(_poisoned(quiet, marked=False), model)
    assert set(unmarked.values()) == {1}, unmarked
    assert any(marked[k] > 1 for k in marked), (marked, quiet_threads)
