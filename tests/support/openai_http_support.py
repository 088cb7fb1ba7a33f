"""Shared by the HTTP API's tests: where a daemon's OpenAI-compatible API listens."""

from __future__ import annotations

from support.daemons import RunningDaemon


def http_base(daemon: RunningDaemon) -> str:
    """The daemon's HTTP address from its listening line, e.g. http://127.0.0.1:41234."""
    listening = next(e for e in reversed(daemon.log_lines) if e.get("event") == "listening")
    assert listening.get("http_address"), f"the daemon serves no HTTP API: {listening}"
    return listening["http_address"]
