"""Where the Python stacks go when the daemon dies of a fatal signal (SIGABRT, SIGSEGV).

A C++ exception that crosses llama.cpp's C API ends the process through std::terminate, whose
message goes to file descriptor 2: with JSON logs, a pipe that a dying process no longer reads
(json_stderr.py). CI's grammar fuzz saw exit -6 and nothing else, three runs in five, before the
cause (grammar_accept.py) was found by hand. Python's faulthandler writes every thread's stack
straight to a file at the signal, without the interpreter's help, so the next crash names the line
that called into native code.

The file is `crash-<pid>.txt` in the runtime folder (or XLM_SIDECAR_CRASH_FILE), removed when the
daemon exits normally: one that is left is a crash's report.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
from pathlib import Path

from sidecar.lifecycle.runtime_dir import runtime_dir

CRASH_FILE_ENV = "XLM_SIDECAR_CRASH_FILE"


def crash_file_path() -> Path:
    override = os.environ.get(CRASH_FILE_ENV)
    return Path(override) if override else runtime_dir() / f"crash-{os.getpid()}.txt"


def write_stacks_on_crash() -> Path | None:
    """Arm faulthandler to write into the crash file; None when no file could be opened (the
    daemon runs on without it)."""
    path = crash_file_path()
    try:
        report = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held open until exit: written at the signal
    except OSError:
        return None
    faulthandler.enable(file=report, all_threads=True)

    def _clean_exit() -> None:
        faulthandler.disable()
        report.close()
        with contextlib.suppress(OSError):
            path.unlink()

    atexit.register(_clean_exit)
    return path
