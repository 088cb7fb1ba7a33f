"""Where a daemon keeps its per-launch files (token files, instance locks): a folder only its user
can enter, found the same way by the daemon and by clients on the same machine."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import warnings
from pathlib import Path

import platformdirs

APP_NAME = "xlm-sidecar"
# Tests and unusual setups point daemon and clients at another folder with this variable.
RUNTIME_DIR_ENV = "XLM_SIDECAR_RUNTIME_DIR"


def runtime_dir() -> Path:
    """The folder, created owner-only (0700) if missing. Raises PermissionError when it exists but
    belongs to someone else or others may enter it, since a token file there would leak."""
    path = _pick()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.name == "posix":
        info = path.stat()
        if info.st_uid != os.getuid():
            raise PermissionError(f"runtime folder {path} belongs to another user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(path, 0o700)
    return path


def _pick() -> Path:
    override = os.environ.get(RUNTIME_DIR_ENV)
    if override:
        return Path(override)
    if os.name == "posix" and sys.platform != "darwin" and not os.environ.get("XDG_RUNTIME_DIR"):
        # platformdirs would fall back to /tmp/runtime-<uid>, a name anyone can create first.
        return Path(platformdirs.user_cache_dir(APP_NAME)) / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Path(platformdirs.user_runtime_dir(APP_NAME))


def endpoint_name(port: int | None = None, socket_path: str | os.PathLike[str] | None = None) -> str:
    """A file-name-safe name for what a daemon listens on: "port-50551", or "unix-<hash>" for a
    socket (hashed from its absolute path, so spellings of the same path agree)."""
    if socket_path is not None:
        absolute = os.path.realpath(os.fspath(socket_path))
        return "unix-" + hashlib.sha256(absolute.encode()).hexdigest()[:16]
    if port is None:
        raise ValueError("give a port or a socket path")
    return f"port-{port}"
