"""The thread governor's decisions, as a table of pass timings (pure logic, no llama.cpp)."""

from __future__ import annotations

import pytest

from sidecar.engine.threads.thread_governor import GovernorSettings, ThreadGovernor, predicted_pass_ms

FAST = GovernorSettings(suspect_ratio=1.5, hopeless_ratio=6.0, window=4, down_after=4, probe_after=10,
                        max_probe_after=40, probe_passes=4, keep_gain=0.85)


def run(governor: ThreadGovernor, planned: int, cost_at: dict[int, float], passes: int, predicted_ms: float = 10.0) -> list[str]:
    """Feed `passes` passes whose time is predicted_ms * cost_at[threads used]; the decisions."""
    actions = []
    for _ in range(passes):
        used = governor.threads(planned)
        decision = governor.record(planned, used, predicted_ms * cost_at[used], predicted_ms)
        actions.append(decision.action)
    return actions


QUIET = {1: 1.7, 2: 1.0}  # one thread is 1.7x slower than the planned two
BUSY = {1: 1.6, 2: 3.3}  # one of two cores busy (measured with SmolLM2, 4 streams)
VERY_BUSY = {1: 1.6, 2: 18.0}  # two threads wait at every barrier
OFF_PLAN = {1: 2.6, 2: 1.6}
SPIKE = {1: 1.7, 2: 2.5}  # one pass a little slow  # a quiet machine the plan overrates: two threads are still better


@pytest.mark.parametrize(
    "name, phases, expected_caps",
    [
        ("quiet machine stays at plan", [(QUIET, 60)], [2]),
        ("busy: a probe down finds one thread faster", [(BUSY, 40)], [1]),
        ("very busy: steps down at once", [(VERY_BUSY, 4)], [1]),
        ("one slow pass is noise", [(QUIET, 3), (SPIKE, 1), (QUIET, 40)], [2, 2, 2]),
        ("busy, then quiet: probes back up", [(VERY_BUSY, 4), (QUIET, 40)], [1, 2]),
        ("stays busy: probes up revert", [(VERY_BUSY, 4), (VERY_BUSY, 200)], [1, 1]),
        ("a plan that is off keeps the faster count", [(OFF_PLAN, 200)], [2]),
        ("a slow single thread is the best there is", [(VERY_BUSY, 4), ({1: 50.0, 2: 60.0}, 100)], [1, 1]),
    ],
)
def test_governor_table(name: str, phases: list, expected_caps: list[int]) -> None:
    governor = ThreadGovernor(max_threads=2, settings=FAST)
    caps = []
    for costs, passes in phases:
        run(governor, 2, costs, passes)
        caps.append(governor.cap)
    assert caps == expected_caps, name


def test_probes_back_off_while_nothing_changes() -> None:
    for costs in (VERY_BUSY, OFF_PLAN):
        governor = ThreadGovernor(max_threads=2, settings=FAST)
        actions = run(governor, 2, costs, 600)
        probes = [i for i, a in enumerate(actions) if a == "probe"]
        gaps = [b - a for a, b in zip(probes, probes[1:])]
        assert gaps == sorted(gaps) and gaps[-1] >= FAST.max_probe_after, (costs, gaps)


def test_never_more_than_planned_nor_less_than_one() -> None:
    governor = ThreadGovernor(max_threads=4, settings=FAST)
    run(governor, 4, {1: 90.0, 2: 90.0, 3: 90.0, 4: 90.0}, 100)
    assert governor.cap == 1
    assert governor.threads(1) == 1 and ThreadGovernor(max_threads=4).threads(2) == 2


def test_the_plans_time_for_a_pass_between_tiers() -> None:
    tiers = ((1, 6.0), (4, 20.0), (64, 140.0))
    assert predicted_pass_ms(1, tiers) == 6.0
    assert predicted_pass_ms(2, tiers) == pytest.approx(6.0 + 14.0 / 3)
    assert predicted_pass_ms(64, tiers) == 140.0
    assert predicted_pass_ms(128, tiers) == 280.0
    assert predicted_pass_ms(3, ()) == 0.0


def test_without_a_plan_a_prefill_is_not_measured_against_the_decodes() -> None:
    """The engine's hook without a schedule (an Engine made in-process): passes compare with the
    fastest of their own size. Before, a 76-token prefill counted against the 4-token decodes' best,
    looked 17x slow, and the cap dropped to one thread on a quiet machine (4 streams: 11 s became
    21 s for the same replies)."""
    from pathlib import Path

    from sidecar.backend.engine_config import EngineConfig
    from sidecar.engine.threads.thread_governor_hook import GovernedThreads, pass_size

    config = EngineConfig(model_path=Path("unused.gguf"), threads_decode=2, threads_prefill=2)
    assert config.schedule is None
    hook = GovernedThreads()
    for i in range(2000):
        n, ms = (76, 420.0) if i % 64 == 0 else (4, 24.0 + (i % 7))  # a round of 4 streams, 64 tokens
        planned = 2
        used = hook.threads(config, planned)
        assert used == planned, f"pass {i}: the cap dropped on passes that ran as fast as ever"
        hook.record(config, n, planned, used, ms)
    assert [pass_size(n) for n in (1, 3, 4, 5, 76, 512, 513)] == [1, 4, 4, 8, 128, 512, 1024]


def _long_prompt_beside_streams(hook, config, busy_from: int | None = None) -> list[int]:
    """Three streams' tokens and a slice of a 3,000-token prompt in every pass, deeper each time,
    timed as measured on a 2-core EPYC (flash attention off): 20 ms for the streams' decode plus
    a slice token's 2 ms near the start, growing by 3.3 ms per 1,000 tokens of depth. A slice is
    16-27 tokens, as the prompt budget gives it. From pass `busy_from` on, one core is busy: two
    threads take 3.3x as long. The threads each pass ran with."""
    used_per_pass = []
    for i in range(170):
        slice_tokens = 16 + (i * 7) % 12
        depth = 18.0 * i
        quiet_ms = 20.0 + slice_tokens * (2.0 + 0.0033 * depth)
        used = hook.threads(config, 2)
        busy = busy_from is not None and i >= busy_from
        ms = quiet_ms * ((3.3 if used == 2 else 1.6) if busy else (1.0 if used == 2 else 1.7))
        hook.record(config, 3 + slice_tokens, 2, used, ms, reads=depth * slice_tokens + 3 * 40)
        used_per_pass.append(used)
    return used_per_pass


@pytest.mark.parametrize("planned", [False, True], ids=["without a plan", "with a plan"])
def test_passes_deep_into_a_long_prompt_are_not_taken_for_a_busy_cpu(planned: bool) -> None:
    """A pass 3,000 tokens deep costs several times what the plan (priced from a prompt's start) or
    the fastest pass of its size says: the governor probed one thread for 8 passes, three times
    in one prompt, each pass 1.6-1.8x as long (the longest gaps the other NPCs saw)."""
    from pathlib import Path
    from types import SimpleNamespace

    from sidecar.backend.engine_config import EngineConfig
    from sidecar.engine.threads.thread_governor_hook import GovernedThreads

    schedule = SimpleNamespace(tiers=(SimpleNamespace(max_tokens=4, predicted_ms_per_pass=22.0),
                                      SimpleNamespace(max_tokens=32, predicted_ms_per_pass=78.0))) if planned else None
    config = EngineConfig(model_path=Path("unused.gguf"), threads_decode=2, threads_prefill=2, schedule=schedule)
    assert _long_prompt_beside_streams(GovernedThreads(), config) == [2] * 170
    # The same passes with a core busy half-way through: still seen, and one thread kept.
    used = _long_prompt_beside_streams(GovernedThreads(), config, busy_from=60)
    assert used[:60] == [2] * 60 and used[-40:] == [1] * 40


def test_the_cost_of_reading_the_cache_is_learned_from_quiet_deep_passes_and_busy_ones_do_not_raise_it() -> None:
    from sidecar.engine.threads.thread_governor import DEPTH_SAMPLES, SHALLOW_DEPTH, DepthCost

    cost = DepthCost()
    assert cost.predicted_ms(50.0, 10 * (SHALLOW_DEPTH - 1), 10, 2, 2, 99.0) == 50.0  # shallow: the base
    assert cost.predicted_ms(0.0, 20_000, 10, 2, 2, 99.0) == 0.0  # no base: not judged
    for _ in range(DEPTH_SAMPLES):  # quiet passes 2,000 deep: 0.005 ms a cached token read
        cost.predicted_ms(50.0, 20_000, 10, 2, 2, 150.0)
    assert cost.predicted_ms(50.0, 40_000, 10, 2, 2, 250.0) == pytest.approx(250.0)
    for _ in range(DEPTH_SAMPLES // 2):  # a busy spell, half as long as the samples kept
        cost.predicted_ms(50.0, 20_000, 10, 2, 2, 500.0)
    assert cost.predicted_ms(50.0, 20_000, 10, 2, 1, 900.0) == pytest.approx(150.0)
