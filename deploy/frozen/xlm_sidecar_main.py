"""Entry point of the frozen daemon: the same command line as the installed `xlm-sidecar`."""

import sys

from sidecar.cli import main

if __name__ == "__main__":
    sys.exit(main())
