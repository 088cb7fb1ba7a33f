"""What the GPU check found, per budget, and the table it prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

GIB = 1 << 30


@dataclass(frozen=True)
class Measured:
    """One configuration run for real: decode tokens/s and the VRAM it held (NVML peak of the
    process less the CUDA context every process pays)."""

    label: str
    tokens_per_s: float
    vram_bytes: int


@dataclass
class BudgetResult:
    """Everything about one budget: our plan's prediction and measurement, and the peers'."""

    budget_bytes: int
    predicted: float = 0.0  # our schedule's decode tokens/s, as `xlm-sidecar plan` predicts
    measured: Measured | None = None  # the daemon serving with that budget
    llama_buffers_bytes: int = 0  # VRAM the daemon's llama.cpp reports (weights, KV, compute)
    predicted_ngl: float = 0.0  # the planner's prediction for llama.cpp's best -ngl
    predicted_fit: float = 0.0  # ... and for --fit (emulated)
    planned_ngl: int = 0  # the planner's best -ngl that fits, where the hand sweep centres
    manual: list[Measured] = field(default_factory=list)  # every -ngl / -ncmoe configuration tried
    fit: Measured | None = None  # llama.cpp's own fit

    def best_manual(self) -> Measured | None:
        return best_within(self.manual, self.budget_bytes)


def best_within(runs: Sequence[Measured], budget_bytes: int) -> Measured | None:
    """The fastest run that kept within the budget; None when none did."""
    fitting = [r for r in runs if r.vram_bytes <= budget_bytes]
    return max(fitting, key=lambda r: r.tokens_per_s, default=None)


def ngl_candidates(best_predicted: int, n_layer: int) -> list[int]:
    """-ngl values to measure around the planner's best-that-fits guess (it may be one off)."""
    return sorted({max(0, min(n_layer, best_predicted + d)) for d in (-1, 0, 1)})


def ncmoe_candidates(layer_expert_bytes: int, dense_bytes: int, n_layer: int, budget_bytes: int) -> list[int]:
    """-ncmoe values (experts of the first K layers on the CPU, everything else on the GPU) near
    the smallest K whose GPU part fits the budget."""
    room = budget_bytes - dense_bytes
    on_gpu = max(0, min(n_layer, room // layer_expert_bytes)) if layer_expert_bytes > 0 else n_layer
    k = n_layer - on_gpu
    return sorted({max(0, min(n_layer, k + d)) for d in (-1, 0, 1)})


def _rate(m: Measured | None) -> str:
    return f"{m.tokens_per_s:7.1f}" if m else "      -"


def _gib(n: int | None) -> str:
    return f"{n / GIB:5.2f}" if n else "    -"


def render_table(results: Sequence[BudgetResult]) -> str:
    """Decode tokens/s and VRAM (GiB) per budget: ours predicted and measured, llama.cpp's best
    hand-tuned configuration and its fit, measured, with the planner's predictions for them."""
    header = (
        "budget | ours: predicted measured  VRAM | best by hand: measured  VRAM (config)      predicted"
        " | --fit: measured  VRAM  predicted | ours vs best"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        manual = r.best_manual()
        ours = r.measured.tokens_per_s if r.measured else 0.0
        peers = [m.tokens_per_s for m in (manual, r.fit) if m and m.vram_bytes <= r.budget_bytes]
        ratio = f"{ours / max(peers):5.2f}x" if ours and peers else "    -"
        lines.append(
            f"{r.budget_bytes / GIB:4.0f}G  |        {r.predicted:7.1f} {_rate(r.measured)} {_gib(r.measured.vram_bytes if r.measured else None)}"
            f" |               {_rate(manual)} {_gib(manual.vram_bytes if manual else None)} ({(manual.label if manual else 'none fits'):<18})"
            f" {r.predicted_ngl:7.1f} |        {_rate(r.fit)} {_gib(r.fit.vram_bytes if r.fit else None)}  {r.predicted_fit:7.1f}"
            f" | {ratio}"
        )
    return "\n".join(lines)
