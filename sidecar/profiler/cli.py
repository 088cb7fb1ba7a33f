"""The `profile` subcommand: measure this machine, or show a stored profile."""

from __future__ import annotations

import argparse
from pathlib import Path

_DEFAULT = "<default>"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `profile` to an argparse subparsers object; its handler is `args.run(args) -> int`."""
    parser = subparsers.add_parser(
        "profile",
        help="measure this machine once (kernels, bandwidth) for the placement planner",
        description=(
            "Measure llama.cpp's kernels and this machine's bandwidths and store them as the "
            "profile the planner estimates from. Stored under the user cache directory, named "
            "by a fingerprint of the hardware and llama.cpp build. A game's installer runs this "
            "once; without it the daemon starts on built-in defaults and measures the quick "
            "profile in the background while idle."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="quick profile (under 30 s)")
    parser.add_argument("--out", type=Path, metavar="PATH", help="write the profile here instead")
    parser.add_argument(
        "--show",
        nargs="?",
        const=_DEFAULT,
        metavar="PATH",
        help="print a stored profile as tables (default: this machine's) and exit",
    )
    parser.add_argument(
        "--force", action="store_true", help="measure even if an up-to-date profile exists"
    )
    # `run` is what sidecar.cli dispatches on; `func` is the argparse convention.
    parser.set_defaults(run=run_profile_command, func=run_profile_command)
    return parser


def run_profile_command(args: argparse.Namespace) -> int:
    """Handle `profile`: returns the process exit code."""
    from rich.console import Console

    from sidecar.profiler.database import ProfileError, load_profile, save_profile
    from sidecar.profiler.hardware import discover_hardware
    from sidecar.profiler.store import current_fingerprint, profile_file_name, profiles_dir

    err = Console(stderr=True)
    if args.show is not None:
        from sidecar.profiler.show import render_profile

        path = Path(args.show) if args.show != _DEFAULT else args.out
        if path is None:
            path = profiles_dir() / profile_file_name(current_fingerprint())
        try:
            render_profile(load_profile(path))
        except FileNotFoundError:
            err.print(f"no profile at {path}; run `xlm-sidecar profile` first")
            return 1
        except ProfileError as exc:
            err.print(f"cannot read {path}: {exc}")
            return 1
        return 0

    hardware = discover_hardware()
    fingerprint = current_fingerprint(hardware)
    target = args.out or profiles_dir() / profile_file_name(fingerprint)
    if not args.force and target.exists():
        try:
            existing = load_profile(target)
        except ProfileError:
            existing = None
        if (
            existing is not None
            and existing.fingerprint == fingerprint
            and (existing.mode == "full" or args.quick)
        ):
            err.print(f"profile up to date ({existing.mode}) at {target}; --force to measure again")
            return 0

    from sidecar.profiler.plan import FULL_PLAN, QUICK_PLAN
    from sidecar.profiler.progress import progress_for_terminal
    from sidecar.profiler.runner import run_profile

    if not hardware.ggml_gpus:
        err.print(f"{hardware.gpu_note or 'no GPU: llama.cpp sees no GPU device'}; profiling the CPU")
    from sidecar.profiler.machine_load import others_busy_now

    busy = others_busy_now()
    if busy > 0.25:
        err.print(
            f"warning: other processes use {busy:.0%} of the CPUs; CPU figures will be "
            "pessimistic (profile again when the machine is idle)"
        )
    db = run_profile(
        QUICK_PLAN if args.quick else FULL_PLAN,
        hardware=hardware,
        progress=progress_for_terminal(),
    )
    save_profile(db, target)
    size_kb = target.stat().st_size / 1024
    print(
        f"wrote {db.mode} profile to {target}: {len(db.entries)} entries, {size_kb:.0f} KB, "
        f"{db.duration_s:.1f} s"
    )
    return 0
