"""Where the engine is in its life; the WatchState stream and the status RPC report it."""

from __future__ import annotations

import enum


class EnginePhase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    RELOADING = "reloading"  # applying a new schedule; requests wait and resume after
    DRAINING = "draining"
    STOPPED = "stopped"
