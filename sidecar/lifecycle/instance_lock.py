"""One daemon per port or socket: an advisory lock on a file named after the endpoint.

The kernel drops the lock when the process dies, however it dies, so a crashed daemon never
leaves a stale lock behind. A daemon that stops cleanly deletes its file while still holding the
lock; a daemon that locked a file just as it was deleted sees that the path no longer leads to
its file and tries again, so two daemons never both believe they hold the endpoint.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: the bind itself refuses a second daemon (no SO_REUSEPORT there)
    fcntl = None  # type: ignore[assignment]


class AlreadyServing(Exception):
    """Another live daemon holds the endpoint's lock."""

    def __init__(self, what: str, pid: int | None) -> None:
        owner = f" (pid {pid})" if pid else ""
        super().__init__(f"another xlm-sidecar{owner} is already serving it")
        self.pid = pid


class InstanceLock:
    """Held from acquire() until release() or the end of the process."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; AlreadyServing names the holder's pid when it is known."""
        if fcntl is None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                os.close(fd)
                raise AlreadyServing(self.what, pid) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # locked a file that its owner deleted on the way out: take the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            if _same_file(self._fd, self.path):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)  # still locked: no one can be using this file now
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> InstanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        opened, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
