"""`--parent-pid`: stop when the game that launched us is gone, so a crashed game never leaves a
daemon holding VRAM and a port behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psutil

from sidecar.errors import InvalidArgument

POLL_INTERVAL_S = 0.25


class ParentProcess:
    """A process identified by pid *and* start time, so a recycled pid is not mistaken for it."""

    def __init__(self, pid: int) -> None:
        self.created: float | None = None
        try:
            process = psutil.Process(pid)
            self.created = process.create_time()
            alive = process.status() != psutil.STATUS_ZOMBIE
        except psutil.AccessDenied:  # another user's process: its existence is all we can follow
            alive = psutil.pid_exists(pid)
        except (psutil.NoSuchProcess, ValueError, OverflowError):
            alive = False
        if not alive:
            raise InvalidArgument(f"--parent-pid {pid}: no such process is running")
        self.pid = pid

    def alive(self) -> bool:
        if self.created is None:
            return psutil.pid_exists(self.pid)
        try:
            process = psutil.Process(self.pid)
            # A zombie has died; only its parent has not collected its exit status yet.
            return process.create_time() == self.created and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True  # it exists; we just may not look inside


async def watch_parent(parent: ParentProcess, on_death: Callable[[], None], interval_s: float = POLL_INTERVAL_S) -> None:
    """Poll until the parent is gone, then call on_death once. Cancel to stop watching."""
    while parent.alive():
        await asyncio.sleep(interval_s)
    on_death()
