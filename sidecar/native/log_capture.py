"""Route llama.cpp's own log lines into our structured log instead of raw stderr.

llama.cpp prints hundreds of lines per model load; a game's log should carry only warnings and
errors from it, as structured events, unless the user asks for more (XLM_SIDECAR_LLAMA_LOG=debug).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp
import structlog

log = structlog.get_logger("llama.cpp")

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont(inuation of the previous line).
_LEVEL_NAMES = {1: "debug", 2: "info", 3: "warning", 4: "error"}
_installed: list[object] = []  # keeps the ctypes callback alive for the life of the process
_captures: list[list[str]] = []  # open capture_native_log() blocks receive every line


def install_native_log_filter() -> None:
    """Send llama.cpp log lines at warning or above (or at the level in XLM_SIDECAR_LLAMA_LOG) to structlog."""
    if _installed:
        return
    threshold = {"debug": 1, "info": 2, "warning": 3, "error": 4}.get(
        os.environ.get("XLM_SIDECAR_LLAMA_LOG", "warning").lower(), 3
    )
    last_level = [2]

    @llama_cpp.llama_log_callback
    def forward(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        if level == 5:  # continuation lines belong to the previous line's level
            level = last_level[0]
        last_level[0] = level
        if _captures:
            line = text.decode("utf-8", errors="replace")
            for capture in _captures:
                capture.append(line)
        if level < threshold:
            return
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:
            getattr(log, _LEVEL_NAMES.get(level, "info"))(message)

    _installed.append(forward)
    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))
    # libmtmd (the vision encoder) keeps its own logger; its lines belong in the same stream, and
    # its buffer sizes are read from captures like the text model's.
    from llama_cpp import mtmd_cpp

    mtmd_cpp.mtmd_log_set(forward, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(forward, ctypes.c_void_p(0))
    _report_aborts_as_json()


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # ggml_abort_callback_t


def _report_aborts_as_json() -> None:
    """Under JSON logs, ggml's abort message (GGML_ASSERT, GGML_ABORT) goes out as one JSON
    error object, written before abort() ends the process. Without the callback ggml prints it to
    fd 2, the pipe json_stderr reads, and abort() may end the process before the reader has passed
    it on (and it would pass as a plain warning). The gdb backtrace ggml would print next is off
    either way: GGML_NO_BACKTRACE, sidecar/__init__.py."""
    from sidecar.lifecycle.json_stderr import active_capture

    capture = active_capture()
    if capture is None:
        return  # console logs: ggml prints its message to the terminal itself
    from sidecar.native.ggml_devices import open_library

    try:
        setter = open_library("libggml-base").ggml_set_abort_callback  # the ggml libllama uses
    except (OSError, AttributeError):  # a build without it: the message may be lost, nothing worse
        return
    setter.argtypes, setter.restype = [_ABORT_CALLBACK], ctypes.c_void_p

    @_ABORT_CALLBACK
    def report(message: bytes | None) -> None:
        capture.fatal((message or b"").decode("utf-8", errors="replace"), logger="ggml")

    _installed.append(report)
    setter(report)


@contextmanager
def capture_native_log() -> Iterator[list[str]]:
    """Collect every llama.cpp log line (any level) emitted inside the block.

    llama.cpp reports where it put tensors and how large each buffer is only in its load log;
    the executor reads that report to check the placement it asked for.
    """
    install_native_log_filter()
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)
