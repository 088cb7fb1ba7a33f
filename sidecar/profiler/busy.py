"""The "busy" figures: copies and CPU kernels slow each other down when they overlap.

Two measurements, each against its idle twin taken in the same call:
- host-to-device bandwidth while a CPU probe decodes in a loop on another thread;
- CPU probe decode time while host-to-device copies run in a loop on another thread.
Both `llama_decode` and `ggml_backend_tensor_set` are ctypes calls, which release the GIL,
so the two threads really run at the same time.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sidecar.profiler.kernels import ProbeSession, RepeatPolicy, median_seconds
from sidecar.profiler.transfers import CopyLoop


@contextmanager
def _running_in_background(work: Callable[[], object]) -> Iterator[None]:
    stop = threading.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                work()
                started.set()
        except BaseException as exc:  # surfaced in the caller's thread below
            failure.append(exc)
            started.set()

    worker = threading.Thread(target=loop, name="profile-background", daemon=True)
    worker.start()
    started.wait()
    try:
        yield
    finally:
        stop.set()
        worker.join()
    if failure:
        raise failure[0]


@dataclass(frozen=True)
class BusyFigures:
    """Idle and busy figures of one overlap experiment."""

    copy_idle_s: float
    copy_busy_s: float
    nbytes: int
    cpu_idle_s: dict[int, float]
    cpu_busy_s: dict[int, float]


def measure_overlap(
    session: ProbeSession,
    batches: tuple[int, ...],
    copy: CopyLoop,
    policy: RepeatPolicy,
    copy_repeats: int = 5,
) -> BusyFigures:
    """Time copies and CPU decodes alone, then each while the other runs continuously.

    `session` must already use the thread count to measure; the background CPU load is
    decodes at the largest of `batches`, the compute-heavy case.
    """
    cpu_idle = {b: median_seconds(session, b, policy) for b in batches}
    copy_idle = copy.measure(copy_repeats).seconds
    load_batch = max(batches)
    with _running_in_background(lambda: session.decode_seconds(load_batch)):
        copy_busy = statistics.median(copy.copy_seconds() for _ in range(copy_repeats))
    with _running_in_background(copy.copy_seconds):
        cpu_busy = {b: median_seconds(session, b, policy) for b in batches}
    return BusyFigures(copy_idle, copy_busy, copy.nbytes, cpu_idle, cpu_busy)
