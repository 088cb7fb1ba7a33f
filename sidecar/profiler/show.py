"""A profile database as readable rich tables (`xlm-sidecar profile --show`)."""

from __future__ import annotations

import sys
from collections import defaultdict

from rich.console import Console, Group
from rich.table import Table

from sidecar.profiler.database import ProfileDB
from sidecar.profiler.hardware import GIB
from sidecar.profiler.plan import OP_GRAPH_OVERHEAD, OP_LAYER_OVERHEAD


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def machine_table(db: ProfileDB) -> Table:
    """Who measured what: fingerprint, mode, CPU, RAM, GPUs, llama.cpp build, notes."""
    hw = db.hardware
    table = Table(title="Profile", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("fingerprint", db.fingerprint)
    table.add_row("mode", f"{db.mode} ({db.duration_s:.0f} s, {db.created_at})")
    table.add_row("other load", f"{db.contention:.0%} of the CPUs busy with other processes")
    table.add_row("CPU", f"{hw.cpu_model}: {hw.physical_cores} cores, {hw.logical_cores} threads")
    table.add_row("RAM", f"{_gib(hw.ram_total)} total, {_gib(hw.ram_free)} free at profile time")
    for g in hw.gpus:
        pcie = f"PCIe gen {g.pcie_gen or '?'} x{g.pcie_width or '?'}"
        table.add_row(
            f"GPU {g.index}",
            f"{g.name}: {_gib(g.vram_total)}, {_gib(g.vram_free)} free, {pcie}, driver {g.driver}",
        )
    if not hw.gpus:
        table.add_row("GPU", hw.gpu_note or "none")
    table.add_row("llama.cpp sees", ", ".join(f"{d.name} ({d.description})" for d in hw.ggml_devices))
    table.add_row("llama-cpp-python", db.llama_cpp_version)
    for i, note in enumerate(db.notes):
        table.add_row("notes" if i == 0 else "", note)
    return table


def bandwidth_table(db: ProfileDB) -> Table:
    """Every bandwidth figure with its method."""
    table = Table(title="Bandwidth", title_justify="left")
    for column in ("kind", "device", "memory", "condition", "threads", "GB/s", "method"):
        table.add_column(column, justify="right" if column in ("threads", "GB/s") else "left")
    for b in db.bandwidths:
        table.add_row(b.kind, b.device, b.memory or "-", b.condition, str(b.threads),
                      f"{b.gbps:.1f}", b.method)
    return table


def kernel_table(db: ProfileDB) -> Table:
    """One row per (device, op, shape, type, threads, condition); GFLOP/s per batch size.

    Overhead rows show milliseconds instead, and the first figure column gives the batch-1
    weight stream rate, the number that decides decode speed.
    """
    batches = sorted({e.batch for e in db.entries})
    rows: dict[tuple, dict[int, object]] = defaultdict(dict)
    for e in db.entries:
        rows[(e.device, e.op, e.shape, e.weight_type, e.threads, e.condition)][e.batch] = e
    any_busy = any(e.condition != "idle" for e in db.entries)
    table = Table(
        title="Kernels: GFLOP/s per batch size (overhead rows: ms per layer / per pass)",
        title_justify="left",
    )
    columns = ["device", "op", "shape", "type", "thr"] + (["cond"] if any_busy else []) + ["GB/s@1"]
    for column in columns:
        table.add_column(column, justify="right" if column in ("thr", "GB/s@1") else "left")
    for b in batches:
        table.add_column(f"b{b}", justify="right")
    for key in sorted(rows):
        by_batch = rows[key]
        overhead = key[1] in (OP_LAYER_OVERHEAD, OP_GRAPH_OVERHEAD)
        first = by_batch.get(1)
        gbps = "" if overhead or first is None else f"{first.weight_gbps:.1f}"
        cells = []
        for b in batches:
            e = by_batch.get(b)
            if e is None:
                cells.append("")
            elif overhead:
                cells.append(f"{e.seconds * 1e3:.3f}")
            else:
                cells.append(f"{e.gflops:.0f}")
        device, op, shape, wtype, threads, cond = key
        head = [device, op, shape, wtype or "-", str(threads)] + ([cond] if any_busy else [])
        table.add_row(*head, gbps, *cells)
    return table


def render_profile(db: ProfileDB, console: Console | None = None) -> None:
    """Print the profile as three tables: machine, bandwidth, kernels."""
    # Piped output gets a fixed wide layout instead of rich's 80-column default.
    console = console or (Console() if sys.stdout.isatty() else Console(width=150))
    console.print(Group(machine_table(db), bandwidth_table(db), kernel_table(db)))
