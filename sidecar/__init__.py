"""xlm-sidecar: runs language and vision-language models beside a game, inside its VRAM budget."""

import os
from importlib.metadata import PackageNotFoundError, version

# On an abort (GGML_ASSERT) ggml forks gdb to print a backtrace: about 60 raw lines on stderr,
# seconds of a frozen process, and a debugger attached to a game's helper. ggml reads the variable
# when it aborts, so setting it here covers the daemon and every process it starts. A crash
# report still says where: ggml's own message names the file and line.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

try:
    __version__ = version("xlm-sidecar")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
