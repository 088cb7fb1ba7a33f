"""A background profile slice runs on a thread that ends with it, so the engine keeps its speed.

llama.cpp's CPU backend, built with OpenMP as llama-cpp-python's wheel is, gives each thread that
runs a forward pass on more than one thread an OpenMP team of its own, kept until that thread
exits. libgomp counts the workers of every team, and once they outnumber the cores it stops
spinning between parallel regions (100 spins instead of about 300,000): from then on each of the
engine's passes waits for its workers to wake from a futex. On the 2-core Xeon (2026-12-07,
SmolLM2-135M Q4_1, an engine's 128-token greedy replies on 2 threads, /tmp probe) replies ran at
146-159 tokens/s alone, 122-140 while a thread that had run one 2-thread probe decode was alive,
and 138-159 again once it had ended. The profile's thread lived for the whole background
measurement, which on a PC that is seldom quiet is the daemon's first minutes or longer; now
each slice's decodes run on a thread of their own that is gone when the slice returns.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

from sidecar.profiler.kernels import interruptible
from sidecar.profiler.llama_runtime import quiet_llama_logs_here

T = TypeVar("T")


def lower_this_thread_priority() -> None:
    # Linux schedules threads as tasks: this thread, and the ggml worker threads it starts (they
    # inherit it), run at nice 19, so the engine's threads take the cores whenever they want them.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux: slices still stop when the engine works
        pass


def run_slice(measure: Callable[[], T], should_stop: Callable[[], bool]) -> T:
    """`measure()` on a new low-priority thread, its probe decodes interruptible by `should_stop`
    (ProbeInterrupted) and its llama.cpp lines kept out of the log; its result or its exception
    here, once that thread (and with it its OpenMP team) has ended."""
    outcome: dict[str, object] = {}

    def body() -> None:
        lower_this_thread_priority()
        try:
            with quiet_llama_logs_here(), interruptible(should_stop):
                outcome["value"] = measure()
        except BaseException as e:  # re-raised on the calling thread
            outcome["error"] = e

    thread = threading.Thread(target=body, name="xlm-profile-slice", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
