"""Schedules, anchors and sweeps as text tables for the terminal (rich)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table

from sidecar.budget import format_size
from sidecar.model_info import ModelInfo
from sidecar.planner.anchors import Anchor
from sidecar.planner.hardware_model import MIB, HardwareModel
from sidecar.planner.schedule import Schedule


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f} MiB"


def tier_table(schedule: Schedule) -> Table:
    """Per tier: the chosen plan, threads, predicted time and rate, and the runner-up."""
    table = Table(title="Plan per token tier", title_justify="left")
    for col in ("tier", "plan", "threads", "ms/pass", "tokens/s", "runner-up", "its ms", "streamed"):
        table.add_column(col, justify="left" if col in ("tier", "plan", "runner-up") else "right")
    for t in schedule.tiers:
        table.add_row(
            f"{t.phase} {t.max_tokens}", t.placement, str(t.threads), f"{t.predicted_ms_per_pass:,.1f}",
            f"{t.predicted_tokens_per_s:,.1f}", t.runner_up or "-",
            f"{t.runner_up_ms:,.1f}" if t.runner_up else "-",
            _mib(t.copy_bytes_per_pass) if t.copy_bytes_per_pass else "-",
        )
    return table


def vram_table(schedule: Schedule) -> Table:
    """VRAM by component, with the total against the budget."""
    table = Table(title="VRAM by component", title_justify="left")
    table.add_column("component")
    table.add_column("bytes", justify="right")
    for name, n in schedule.vram_bytes_by_component:
        table.add_row(name, _mib(n))
    table.add_row("total", f"{_mib(schedule.vram_bytes)} of {format_size(schedule.budget_bytes)}", style="bold")
    return table


def settings_table(schedule: Schedule) -> Table:
    """What the executor sets in llama.cpp."""
    table = Table(title="llama.cpp settings", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    offload = f"on from {schedule.op_offload_min_batch} tokens" if schedule.op_offload else "off"
    rows = [
        ("residency", schedule.residency),
        ("n_gpu_layers", str(schedule.n_gpu_layers)),
        ("op offload", offload),
        ("threads", f"decode {schedule.threads_decode}, batch {schedule.threads_prefill}"),
        ("n_ubatch / n_batch", f"{schedule.micro_batch} / {schedule.n_batch}"),
        ("n_outputs_max", str(schedule.n_outputs_max)),
        ("KV cache", f"{schedule.kv_type}, {'GPU' if schedule.kv_on_gpu else 'host'}, "
                     f"{'unified' if schedule.kv_unified else 'one stream per sequence'}"),
        ("flash attention", "on" if schedule.flash_attention else "off"),
        ("time to first token", f"{schedule.predicted_ttft_ms:,.0f} ms for {schedule.reference_prompt_tokens} tokens"),
    ]
    for pattern, device in schedule.tensor_overrides:
        rows.append(("-ot", f"{pattern}={device}"))
    for note in schedule.notes:
        rows.append(("note", note))
    for k, v in rows:
        table.add_row(k, v)
    return table


def anchor_table(schedule: Schedule, found: tuple[Anchor, ...]) -> Table:
    """Tokens/s per tier: ours against llama.cpp's best -ngl and --fit on the same budget."""
    table = Table(title="Against llama.cpp on the same budget (predicted tokens/s)", title_justify="left")
    table.add_column("tier")
    table.add_column("ours", justify="right")
    for a in found:
        table.add_column(f"{a.name} ({_mib(a.vram_bytes)})", justify="right")
        table.add_column("ours/it", justify="right")
    for i, t in enumerate(schedule.tiers):
        row = [f"{t.phase} {t.max_tokens}", f"{t.predicted_tokens_per_s:,.1f}"]
        for a in found:
            at = a.tiers[i]
            row += [f"{at.predicted_tokens_per_s:,.1f}", f"{t.predicted_tokens_per_s / at.predicted_tokens_per_s:.2f}x"]
        table.add_row(*row)
    geo = ["geometric mean", f"{schedule.objective():,.1f}"]
    for a in found:
        geo += [f"{a.objective():,.1f}", f"{schedule.objective() / a.objective():.2f}x"]
    table.add_row(*geo, style="bold")
    return table


def print_schedule(console: Console, model: ModelInfo, hw: HardwareModel, hw_source: str, schedule: Schedule,
                   found: tuple[Anchor, ...] = ()) -> None:
    """The whole report: header, tiers, VRAM, settings, anchors."""
    console.print(f"[bold]model[/]    {model.describe()}")
    console.print(f"[bold]hardware[/] {hw.describe()} ({hw_source})")
    cap = schedule.max_cpu_threads or "no cap"
    console.print(f"[bold]budget[/]   VRAM {format_size(schedule.budget_bytes)}, CPU threads {cap}, "
                  f"context {schedule.ctx}")
    parts = [tier_table(schedule), vram_table(schedule), settings_table(schedule)]
    if found:
        parts.append(anchor_table(schedule, found))
    console.print(Group(*parts))


def sweep_table(rows: list[tuple[int, Schedule]]) -> Table:
    """Predicted tokens/s per tier across budgets."""
    table = Table(title="Predicted tokens/s across VRAM budgets", title_justify="left")
    table.add_column("budget")
    first = rows[0][1]
    for t in first.tiers:
        table.add_column(f"{t.phase[0]}{t.max_tokens}", justify="right")
    table.add_column("VRAM used", justify="right")
    table.add_column("plan (tier 1 / largest)")
    for budget, s in rows:
        table.add_row(format_size(budget), *(f"{t.predicted_tokens_per_s:,.1f}" for t in s.tiers), _mib(s.vram_bytes),
                      f"{s.tiers[0].placement} / {s.tiers[-1].placement}")
    return table
