"""Placement on a GPU-type device, planned against measured, per budget.

Loads SmolLM2 (and its MoE, --moe) onto ggml's RPC device (a second process serving this CPU;
see sidecar.native.ggml_rpc) at each budget as the daemon does (plan, load, re-plan while llama.cpp's
buffers exceed the grant), and prints per budget: the plan's residency and VRAM, what llama.cpp
allocated on the device (weights, KV, compute, from its own load report), the sub-layers on the
device as planned and as placed, and whether the two agree. The planner sees a described GPU
(the stand-in is its speed; nothing else is).

    python bench/run.py placement [--budgets 0,24M,48M,96M,4G] [--moe]

Fails (exit 1) when a plan and its placement disagree, or llama.cpp allocated past the budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import ScenarioFailed
from sidecar.local.measured_placement import load_within, measured_placement

MIB = 1 << 20

def rows_for(model: Path, budgets: list[int]) -> list[dict]:
    from sidecar.budget import Budget
    from sidecar.local.executor import load_plan_inputs
    from sidecar.native.ggml_rpc import STAND_IN_GPU_HARDWARE as DEVICE_HARDWARE
    from sidecar.settings import Settings

    settings = Settings(model=model, ctx=512, parallel=2, threads=1, hardware=DEVICE_HARDWARE)
    info = load_plan_inputs(settings).model
    rows = []
    for budget in budgets:
        engine = load_within(settings, Budget(budget))
        try:
            s, report = engine.config.schedule, engine.load_report
            planned = {u.unit: u.resident_on for u in s.units}
            placed = measured_placement(engine, info)
            kinds = report.by_device().get(engine.config.device, {"model": 0, "kv": 0, "compute": 0, "output": 0})
            rows.append({
                "model": model.stem, "budget": budget, "residency": s.residency, "kv_type": s.kv_type,
                "planned_vram": s.vram_bytes, "planned_for": s.budget_bytes,
                "measured": kinds, "measured_total": sum(kinds.values()),
                "units_planned_on_device": sum(v == "GPU0" for v in planned.values()),
                "units_placed_on_device": sum(v == "GPU0" for v in placed.values()),
                "units": len(planned), "agree": planned == placed,
            })
        finally:
            engine.close()
    return rows


def render(rows: list[dict]) -> str:
    out = ["| model | budget | residency (KV) | planned | on device: weights + KV + compute = total | sub-layers planned / placed | agree |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured"]
        out.append(
            f"| {r['model']} | {r['budget'] / MIB:.0f} MiB | {r['residency']} ({r['kv_type']}) | {r['planned_vram'] / MIB:.1f} MiB"
            + (f" (re-planned for {r['planned_for'] / MIB:.1f})" if r["planned_for"] != r["budget"] else "")
            + f" | {m['model'] / MIB:.1f} + {m['kv'] / MIB:.1f} + {(m['compute'] + m['output']) / MIB:.1f} = "
              f"{r['measured_total'] / MIB:.1f} MiB | {r['units_planned_on_device']} / {r['units_placed_on_device']} of {r['units']}"
              f" | {'yes' if r['agree'] else 'NO'} |")
    return "\n".join(out)


def options(group) -> None:
    group.add_argument("--budgets", default="0,24M,48M,96M,4G")
    group.add_argument("--moe", action="store_true", help="also the SmolLM2 MoE (generated into a temporary folder)")


def scenario(args: argparse.Namespace) -> dict:
    from sidecar.budget import parse_size
    from sidecar.model_info.default_model import default_model_path
    from sidecar.native.ggml_rpc import RpcServerProcess, add_rpc_server

    budgets = [parse_size(b) for b in args.budgets.split(",")]
    models = [default_model_path()]
    if args.moe:
        import tempfile

        from sidecar.testmodels import smollm2_source_path, write_smollm2_moe

        models.append(write_smollm2_moe(Path(tempfile.mkdtemp()) / "smollm2_moe.gguf", source=smollm2_source_path()))
    with RpcServerProcess(threads=1) as server:
        add_rpc_server(server.endpoint)
        rows = [row for m in models for row in rows_for(m, budgets)]
    print(render(rows))
    bad = [r for r in rows if not (r["agree"] and r["measured_total"] <= r["budget"])]
    if bad:
        raise ScenarioFailed(f"{len(bad)} of {len(rows)} placements disagree with their plan or exceed the budget",
                             {"rows": rows})
    return {"rows": rows}
