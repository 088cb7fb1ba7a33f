"""`python -m sidecar.planner plan ...`: the plan subcommand without the main CLI."""

from __future__ import annotations

import argparse
import sys

from sidecar.planner.cli import register


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` as `plan [options]` and run it."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.planner")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
