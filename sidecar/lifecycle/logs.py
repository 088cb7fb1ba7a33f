"""Structured logging for the daemon: readable on a terminal, JSON lines when a game captures it."""

from __future__ import annotations

import logging
import sys

import structlog
from structlog.tracebacks import ExceptionDictTransformer

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Set up structlog. fmt "auto" picks console on a TTY and JSON otherwise (a game's launcher
    reads our stderr through a pipe and wants one parseable object per line)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    target = None
    if use_json:
        # Every stderr line must be one JSON object: tracebacks as data, not text, and whatever
        # else writes to stderr (native code, Python's own hooks) wrapped (see json_stderr).
        from sidecar.lifecycle.json_stderr import capture_fd2, route_python_output

        target = capture_fd2().real
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            # Without locals: a frame's variables may hold player text or the token.
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
            if use_json
            else structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=_StderrOrNothing(target)),
        cache_logger_on_first_use=False,
    )
    if use_json:
        route_python_output()


class _StderrOrNothing:
    """stderr that goes quiet once its reader is gone. A game reads our log through a pipe; when the
    game dies the pipe breaks, and a log call that raised BrokenPipeError there would abort whatever
    was logging, such as the --parent-pid watch that is about to stop the daemon."""

    def __init__(self, stream=None) -> None:
        self._broken = False
        self._stream = stream  # None: whatever sys.stderr is at the time

    def write(self, text: str) -> int:
        if self._broken:
            return len(text)
        try:
            return (self._stream or sys.stderr).write(text)
        except (BrokenPipeError, ValueError):  # ValueError: stderr already closed
            self._broken = True
            return len(text)

    def flush(self) -> None:
        if self._broken:
            return
        try:
            (self._stream or sys.stderr).flush()
        except (BrokenPipeError, ValueError):
            self._broken = True
