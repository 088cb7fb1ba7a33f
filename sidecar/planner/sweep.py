"""Plans across a range of budgets, and (optionally) a PNG of predicted tokens/s against budget."""

from __future__ import annotations

from pathlib import Path

from sidecar.budget import Budget
from sidecar.model_info import ModelInfo
from sidecar.planner.hardware_model import GIB, MIB, HardwareModel
from sidecar.planner.options import PlanOptions
from sidecar.planner.planning import plan
from sidecar.planner.schedule import Schedule

_STEPS = (0, 256 * MIB, 512 * MIB, 1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 6 * GIB, 8 * GIB, 12 * GIB, 16 * GIB,
          24 * GIB, 32 * GIB, 48 * GIB, 64 * GIB, 96 * GIB)


def sweep_budgets(model: ModelInfo, hw: HardwareModel) -> tuple[int, ...]:
    """Budgets worth showing: 0 and the usual sizes up to the GPU's memory or a little past the
    model (whichever is smaller)."""
    top = model.total_bytes + 2 * GIB
    if hw.gpu is not None:
        top = min(top, hw.gpu.vram_bytes)
    else:
        top = 0
    steps = [b for b in _STEPS if b <= top]
    if top and top not in steps:
        steps.append(top)
    return tuple(steps)


def sweep(model: ModelInfo, hw: HardwareModel, budgets: tuple[int, ...], max_cpu_threads: int, ctx: int,
          options: PlanOptions) -> list[tuple[int, Schedule]]:
    """(budget, schedule) for each budget (pure)."""
    return [(b, plan(model, hw, Budget(b, max_cpu_threads), ctx, options)) for b in budgets]


def write_plot(rows: list[tuple[int, Schedule]], path: Path, title: str) -> Path:
    """A PNG of predicted tokens/s per tier against budget (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("writing a plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    budgets_gib = [b / GIB for b, _ in rows]
    for i, tier in enumerate(rows[0][1].tiers):
        ax.plot(budgets_gib, [s.tiers[i].predicted_tokens_per_s for _, s in rows], marker="o",
                label=f"{tier.phase} {tier.max_tokens}")
    ax.set_xlabel("VRAM budget (GiB)")
    ax.set_ylabel("predicted tokens/s")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
