"""Progress of a profile run: a rich progress bar on a terminal, log lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol


class ProgressReporter(Protocol):
    """Told how many steps a run has, then each step as it starts, then the end."""

    def start(self, total: int, title: str) -> None: ...

    def step(self, label: str) -> None: ...

    def finish(self) -> None: ...


class SilentProgress:
    """Reports nothing (tests, library use)."""

    def start(self, total: int, title: str) -> None:
        pass

    def step(self, label: str) -> None:
        pass

    def finish(self) -> None:
        pass


class LogProgress:
    """One structured log line per step, for services and redirected output."""

    def __init__(self, log: Any = None) -> None:
        if log is None:
            import structlog

            log = structlog.get_logger("sidecar.profiler")
        self._log = log
        self._total = 0
        self._done = 0
        self._started = 0.0

    def start(self, total: int, title: str) -> None:
        self._total, self._done, self._started = total, 0, time.monotonic()
        self._log.info("profile_started", title=title, steps=total)

    def step(self, label: str) -> None:
        self._done += 1
        self._log.info(
            "profile_step",
            step=self._done,
            of=self._total,
            label=label,
            elapsed_s=round(time.monotonic() - self._started, 1),
        )

    def finish(self) -> None:
        self._log.info("profile_finished", elapsed_s=round(time.monotonic() - self._started, 1))


class RichProgress:
    """A progress bar on stderr with the current step's name."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[label]}"),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = None

    def start(self, total: int, title: str) -> None:
        self._progress.start()
        self._task = self._progress.add_task(title, total=total, label="")

    def step(self, label: str) -> None:
        # A step is announced when it starts, so the bar counts the ones before it as done.
        task = self._progress.tasks[0]
        completed = task.completed + 1 if task.fields.get("label") else task.completed
        self._progress.update(self._task, completed=completed, label=label)

    def finish(self) -> None:
        self._progress.update(self._task, completed=self._progress.tasks[0].total, label="done")
        self._progress.stop()


def progress_for_terminal(log: Any = None) -> ProgressReporter:
    """RichProgress when stderr is a terminal, else LogProgress."""
    return RichProgress() if sys.stderr.isatty() else LogProgress(log)
