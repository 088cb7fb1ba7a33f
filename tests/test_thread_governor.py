"""The thread governor's decisions, as a table of pass timings (pure logic, no llama.cpp)."""

from __future__ import annotations

import pytest

from sidecar.engine.thread_governor import GovernorSettings, ThreadGovernor, predicted_pass_ms

FAST = GovernorSettings(slow_ratio=3.0, slow_passes=3, probe_after=10, max_probe_after=40, probe_passes=4, keep_gain=0.85, window=8)


def run(governor: ThreadGovernor, planned: int, cost_at: dict[int, float], passes: int, predicted_ms: float = 10.0) -> list[str]:
    """Feed `passes` passes whose time is predicted_ms * cost_at[threads used]; the decisions."""
    actions = []
    for _ in range(passes):
        used = governor.threads(planned)
        decision = governor.record(planned, used, predicted_ms * cost_at[used], predicted_ms)
        actions.append(decision.action)
    return actions


QUIET = {1: 1.7, 2: 1.0}  # one thread is 1.7x slower than the planned two
BUSY = {1: 1.6, 2: 18.0}  # another process holds a core: two threads wait at every barrier


@pytest.mark.parametrize(
    "name, phases, expected_caps",
    [
        # (cost table, passes) phases, then the cap after each phase
        ("quiet machine stays at plan", [(QUIET, 50)], [2]),
        ("busy machine steps down after a run of slow passes", [(BUSY, 3)], [1]),
        ("two slow passes are noise", [(BUSY, 2), (QUIET, 1), (BUSY, 2)], [2, 2, 2]),
        ("busy, then quiet: probes back up", [(BUSY, 3), (QUIET, 30)], [1, 2]),
        ("stays busy: probes revert and stay at one thread", [(BUSY, 3), (BUSY, 200)], [1, 1]),
        ("a slow single thread is the best there is", [(BUSY, 3), ({1: 50.0, 2: 60.0}, 100)], [1, 1]),
    ],
)
def test_governor_table(name: str, phases: list, expected_caps: list[int]) -> None:
    governor = ThreadGovernor(max_threads=2, settings=FAST)
    caps = []
    for costs, passes in phases:
        run(governor, 2, costs, passes)
        caps.append(governor.cap)
    assert caps == expected_caps, name


def test_probes_back_off_while_the_machine_stays_busy() -> None:
    governor = ThreadGovernor(max_threads=2, settings=FAST)
    actions = run(governor, 2, BUSY, 400)
    probes = [i for i, a in enumerate(actions) if a == "probe"]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] >= FAST.max_probe_after, gaps
    # Time spent at the slow thread count stays a small share of all passes.
    assert actions.count("revert") == len(probes) - (1 if len(actions) - probes[-1] <= FAST.probe_passes else 0)


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
