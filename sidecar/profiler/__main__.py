"""`python -m sidecar.profiler profile ...`: the profile subcommand without the main CLI."""

from __future__ import annotations

import argparse
import sys

from sidecar.profiler.cli import register


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` as `profile [options]` and run it."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.profiler")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
