"""What a plan costs a SetBudget: the first plan of a model on a machine, then plans of other
budgets with the passes kept (PlanMemo, as the daemon keeps them), each checked to be the schedule a
plan from nothing makes. Pure Python, no daemon: the figures are this CPU's.

    .venv/bin/python bench/plan_time.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sidecar.budget import Budget  # noqa: E402
from sidecar.planner import plan  # noqa: E402
from sidecar.planner.hardware_model import GIB, MIB  # noqa: E402
from sidecar.planner.search import PlanMemo  # noqa: E402
from support.hf_models import HARDWARE, model  # noqa: E402  (the HF configs the planner tests use)

CASES = (("qwen3_30b_a3b", "desktop"), ("qwen3_30b_a3b", "laptop"), ("llama_8b", "desktop"))
BUDGETS = (1 * GIB, 512 * MIB, 2 * GIB, 3 * GIB, 4 * GIB, 8 * GIB)


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def main() -> None:
    print(f"{'model':<16}{'machine':<9}{'first plan':>11}{'next, new budget':>18}{'again, same budget':>20}")
    for name, hw_name in CASES:
        m, hw, memo = model(name), HARDWARE[hw_name](), PlanMemo()
        plan(m, hw, Budget(BUDGETS[0]), ctx=4096)  # imports and lazy tables out of the first figure
        first, _ = timed(lambda: plan(m, hw, Budget(BUDGETS[0]), ctx=4096, memo=memo))
        new = []
        for b in BUDGETS[1:]:
            seconds, kept = timed(lambda: plan(m, hw, Budget(b), ctx=4096, memo=memo))
            assert kept == plan(m, hw, Budget(b), ctx=4096), f"{name} {hw_name} {b >> 20} MiB: the memo changed the plan"
            new.append(seconds)
        again = [timed(lambda: plan(m, hw, Budget(b), ctx=4096, memo=memo))[0] for b in BUDGETS[1:]]
        print(f"{name:<16}{hw_name:<9}{first:>10.2f}s{sum(new) / len(new):>17.2f}s{sum(again) / len(again):>19.2f}s")


if __name__ == "__main__":
    main()
