"""`python -m sidecar.profiler ...`: the same as `xlm-sidecar ...` (kept for scripts that call the package)."""

import sys

from sidecar.cli import main

if __name__ == "__main__":
    sys.exit(main())
