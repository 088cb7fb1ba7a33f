"""Route llama.cpp's own log lines into our structured log instead of raw stderr.

llama.cpp prints hundreds of lines per model load; a game's log should carry only warnings and
errors from it, as structured events, unless the user asks for more (XLM_SIDECAR_LLAMA_LOG=debug).
"""

from __future__ import annotations

import ctypes
import os

import llama_cpp
import structlog

log = structlog.get_logger("llama.cpp")

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont(inuation of the previous line).
_LEVEL_NAMES = {1: "debug", 2: "info", 3: "warning", 4: "error"}
_installed: list[object] = []  # keeps the ctypes callback alive for the life of the process


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
        if level < threshold:
            return
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:
            getattr(log, _LEVEL_NAMES.get(level, "info"))(message)

    _installed.append(forward)
    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))
