"""Process-wide llama.cpp setup the profiler needs: backend init and quiet logs."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_init_lock = threading.Lock()
_initialised = False
_LOG_LEVEL_ERROR = 4  # enum ggml_log_level (ggml.h); llama-cpp-python's comment is stale


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process (idempotent, thread-safe)."""
    global _initialised
    import llama_cpp

    with _init_lock:
        if not _initialised:
            llama_cpp.llama_backend_init()
            _initialised = True


@contextmanager
def quiet_llama_logs() -> Iterator[list[str]]:
    """Silence llama.cpp's log while profiling, keeping error lines in the yielded list.

    Loading hundreds of probe models would print thousands of lines. The previous callback
    (llama-cpp-python's, or the engine's) is restored on exit.
    """
    import llama_cpp

    errors: list[str] = []
    previous_cb = llama_cpp.llama_log_callback()
    previous_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(previous_cb), ctypes.byref(previous_ud))

    def keep_errors(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level == _LOG_LEVEL_ERROR and text:
            errors.append(text.decode(errors="replace").rstrip())

    # Held in a local until restore: ggml may log from any thread while we run.
    callback = llama_cpp.llama_log_callback(keep_errors)
    llama_cpp.llama_log_set(callback, None)
    try:
        yield errors
    finally:
        llama_cpp.llama_log_set(previous_cb, previous_ud)


# Threads whose llama.cpp lines quiet_llama_logs_on_this_thread keeps out of the engine's log, as
# well as the thread that installed it (the background profile's slices each run on a thread of
# their own: see sidecar.profiler.slice_thread).
_quieted = threading.local()


@contextmanager
def quiet_llama_logs_here() -> Iterator[None]:
    """On this thread, the lines quiet_llama_logs_on_this_thread (installed by another) keeps back."""
    _quieted.on = True
    try:
        yield
    finally:
        _quieted.on = False


@contextmanager
def quiet_llama_logs_on_this_thread() -> Iterator[list[str]]:
    """Like quiet_llama_logs, but only for lines logged from the calling thread (and from threads
    inside quiet_llama_logs_here): the daemon's background profile loads probe models beside the
    engine, whose own lines (and the captures it reads buffer sizes from) must keep reaching its
    callback."""
    import llama_cpp

    errors: list[str] = []
    me = threading.get_ident()
    previous_cb = llama_cpp.llama_log_callback()
    previous_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(previous_cb), ctypes.byref(previous_ud))

    def route(level: int, text: bytes, user: ctypes.c_void_p) -> None:
        if threading.get_ident() != me and not getattr(_quieted, "on", False):
            if previous_cb:
                previous_cb(level, text, user)
            return
        if level == _LOG_LEVEL_ERROR and text:
            errors.append(text.decode(errors="replace").rstrip())

    callback = llama_cpp.llama_log_callback(route)
    llama_cpp.llama_log_set(callback, previous_ud)
    try:
        yield errors
    finally:
        llama_cpp.llama_log_set(previous_cb, previous_ud)
