"""Start-up failures said the way the daemon's log is read: one JSON object per line under JSON logs.

A launcher reads the daemon's stderr line by line as JSON (deploy/LAUNCH.md). A bad flag is found
by argparse, and a bad value by the settings, before logging is set up: both printed plain text
(argparse its usage too), the one time the launcher most needs to read the reason. Under JSON logs
(`--log-format json`, or `auto` with stderr not a terminal, as sidecar.lifecycle.logs decides) each is one
object, `{"event": "xlm-sidecar: <reason>", "level": "error", ...}`; the exit code is unchanged.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

LOG_FORMAT_FLAG = "--log-format"
LOG_FORMAT_ENV = "XLM_SIDECAR_LOG_FORMAT"

# Set by the entry point for the serve command: client commands (chat, status) talk to a person.
json_lines = False


def logs_are_json(argv: list[str]) -> bool:
    """Whether the serve command with these arguments will log JSON lines: the last --log-format
    (any prefix argparse takes, `=value` or the next argument), else the environment, else `auto`:
    JSON when stderr is not a terminal."""
    fmt = os.environ.get(LOG_FORMAT_ENV, "auto")
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if len(name) >= len("--log-f") and LOG_FORMAT_FLAG.startswith(name):  # --log-l is --log-level
            if eq:
                fmt = value
            elif i + 1 < len(argv):
                fmt = argv[i + 1]
    return fmt == "json" or (fmt == "auto" and not _stderr_is_terminal())


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def say_failure(text: str) -> None:
    """One start-up failure line on stderr: a JSON object under JSON logs, else the text itself."""
    if not json_lines:
        print(text, file=sys.stderr)
        return
    from sidecar.lifecycle.json_stderr import active_capture

    line = json.dumps({"event": text, "level": "error", "logger": "cli",
                       "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")},
                      ensure_ascii=False)
    capture = active_capture()  # logging is set up: straight to the real stderr, not through the pipe
    stream = capture.real if capture is not None else sys.stderr
    stream.write(line + "\n")
    stream.flush()


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one JSON object under JSON logs (without the usage text,
    which `--help` prints), exit code 2 as before."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if not json_lines:
            super().error(message)
        say_failure(f"xlm-sidecar: {message} (see `{self.prog} --help`)")
        self.exit(2)
