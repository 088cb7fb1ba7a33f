"""xlm-sidecar: runs language and vision-language models beside a game, inside its VRAM budget."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("xlm-sidecar")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
