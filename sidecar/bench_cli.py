"""`xlm-sidecar bench ...`: runs bench/run.py from a source checkout.

The benchmarks start peers (llama-cpp-python's server, llama.cpp's binaries) and write their
results into the checkout, so they live with the repository, not in the installed package (only
the daemon launcher they share with the tests does: sidecar.lifecycle.daemon_process); this command only
finds them next to the package and hands its arguments over. bench/run.py, run by path, loads its
package itself, so the working directory does not matter.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent.parent / "bench" / "run.py"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench",
        help="run the benchmarks (needs a source checkout: runs bench/run.py; `bench --help` for scenarios)",
        description="Runs bench/run.py of the source checkout this package was installed from, with these arguments.",
        # Every argument, --help included, goes to bench/run.py (which lists the scenarios): a
        # prefix no argument uses keeps argparse from reading "--quick" as an option of ours.
        add_help=False,
        prefix_chars="\x00",
    )
    parser.add_argument("args", nargs="*")
    parser.set_defaults(run=run_bench, func=run_bench)
    return parser


def run_bench(args: argparse.Namespace) -> int:
    if not RUNNER.is_file():
        print(f"xlm-sidecar bench needs a source checkout (git clone, then pip install -e .): "
              f"{RUNNER} is not there in this install", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, str(RUNNER), *args.args])
    return 0  # not reached: execv replaces this process
