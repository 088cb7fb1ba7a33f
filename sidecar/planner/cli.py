"""The `plan` subcommand: print the schedule for a model, budget and machine."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


def _tiers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give token counts like 1,4,16,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: token counts must be positive")
    return values


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `plan` to an argparse subparsers object; its handler is `args.run(args)` (also
    `args.func`) and returns the exit code."""
    parser = subparsers.add_parser(
        "plan",
        help="plan sub-layer placement per token tier within a VRAM budget",
        description=(
            "Plan where each sub-layer of a model runs, per token tier, within a VRAM budget and a CPU "
            "thread cap, and predict time to first token and tokens/s; compare with llama.cpp's -ngl "
            "and --fit on the same budget. --model takes a GGUF file or a Hugging Face config.json "
            "(with --weight-type) for models not downloaded yet."
        ),
    )
    parser.add_argument("--model", type=Path, help="GGUF file or config.json (default: the bundled SmolLM2)")
    parser.add_argument("--weight-type", help="for a config.json: ggml type or llama.cpp mix (default Q4_K_M)")
    parser.add_argument("--budget", default=None, help="VRAM the model may use: 512M, 2G, 0 = CPU only")
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    parser.add_argument("--max-cpu-threads", type=int, default=0, help="most CPU threads a pass may use (0: no cap)")
    parser.add_argument("--hardware", help="profile or spec JSON file, a preset (laptop-4gb, desktop-16gb, "
                        "cpu-only) or a spec like cpu=8/16,dram=60,ram=32G,gpu=8G,gpu_bw=256,tflops=15,pcie=4.0x8 "
                        "(default: this machine's profile)")
    parser.add_argument("--decode-tiers", type=_tiers, help="decode tiers (default 1,4,16,64)")
    parser.add_argument("--prefill-tiers", type=_tiers, help="prefill tiers (default 512, 1024, ... n_batch)")
    parser.add_argument("--n-batch", type=int, default=2048, help="largest prompt piece per llama_decode")
    parser.add_argument("--kv-type", default="auto", help="KV cache type: auto, F16, Q8_0, ...")
    parser.add_argument("--executor", choices=("op-offload", "double-buffered"), default="op-offload",
                        help="what the executor overlaps: llama.cpp op offload (nothing) or a double-buffered slot")
    parser.add_argument("--json", action="store_true", help="print the schedule (and anchors) as JSON")
    parser.add_argument("--no-anchors", action="store_true", help="skip the -ngl / --fit comparison")
    parser.add_argument("--sweep", action="store_true", help="predicted tokens/s across budgets instead")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="with --sweep: also write this plot (matplotlib)")
    # The main CLI dispatches on `run`, `python -m sidecar.planner` on `func`.
    parser.set_defaults(run=run_plan_command, func=run_plan_command)
    return parser


def run_plan_command(args: argparse.Namespace) -> int:
    """Handle `plan`: returns the process exit code."""
    from rich.console import Console

    from sidecar.budget import Budget, parse_size
    from sidecar.errors import InvalidArgument
    from sidecar.planner.anchors import anchors
    from sidecar.planner.cost_model import DOUBLE_BUFFERED, OP_OFFLOAD
    from sidecar.planner.options import PlanOptions
    from sidecar.planner.render import print_schedule, sweep_table
    from sidecar.planner.planning import PlanError, plan
    from sidecar.planner.sources import load_hardware, load_model
    from sidecar.planner.sweep import sweep, sweep_budgets, write_plot

    err = Console(stderr=True)
    # Piped output (files, CI logs) gets a width that holds the tables rather than rich's 80.
    out = Console(width=None if sys.stdout.isatty() else 150)
    try:
        if args.model is None:
            from sidecar.model_info.default_model import default_model_path

            args.model = default_model_path()
        model = load_model(args.model, args.weight_type)
        hw, hw_source = load_hardware(args.hardware)
        budget_bytes = parse_size(args.budget) if args.budget is not None else None
        if budget_bytes is None and not args.sweep:
            raise InvalidArgument("--budget is required (e.g. --budget 2G, or 0 for CPU only), unless --sweep")
        budget = Budget(budget_bytes or 0, args.max_cpu_threads)
    except (FileNotFoundError, ValueError, InvalidArgument, OSError) as exc:
        err.print(f"plan: {exc}")
        return 2
    options = PlanOptions(n_batch=args.n_batch, kv_type=args.kv_type,
                          executor=DOUBLE_BUFFERED if args.executor == "double-buffered" else OP_OFFLOAD)
    if args.decode_tiers:
        options = replace(options, decode_tiers=args.decode_tiers)
    if args.prefill_tiers:
        options = replace(options, prefill_tiers=args.prefill_tiers)
    try:
        if args.sweep:
            budgets = sweep_budgets(model, hw)
            rows = sweep(model, hw, budgets, args.max_cpu_threads, args.ctx, options)
            if args.json:
                print(json.dumps([{"budget_bytes": b, "schedule": s.to_dict()} for b, s in rows], indent=2))
            else:
                out.print(f"[bold]model[/] {model.describe()}\n[bold]hardware[/] {hw.describe()} ({hw_source})")
                out.print(sweep_table(rows))
            if args.plot:
                write_plot(rows, args.plot, f"{model.name} on {hw.name}")
                err.print(f"wrote {args.plot}")
            return 0
        schedule = plan(model, hw, budget, args.ctx, options)
        found = () if args.no_anchors else anchors(model, hw, budget, args.ctx, options)
    except PlanError as exc:
        err.print(f"plan: {exc}")
        return 1
    except RuntimeError as exc:
        err.print(f"plan: {exc}")
        return 1
    if args.json:
        data = {"schedule": schedule.to_dict(),
                "anchors": [{"name": a.name, "description": a.description, "n_gpu_layers": a.n_gpu_layers,
                             "tensor_overrides": [list(p) for p in a.tensor_overrides], "vram_bytes": a.vram_bytes,
                             "threads": a.threads, "tiers": [t.__dict__ for t in a.tiers]} for a in found]}
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    print_schedule(out, model, hw, hw_source, schedule, found)
    return 0
