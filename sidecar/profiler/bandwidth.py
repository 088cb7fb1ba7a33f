"""DRAM bandwidth, two ways, each labelled with its method in the database.

1. "dram_read": the weight bytes per second llama.cpp's own batch-1 matrix products stream
   from a probe far larger than the CPU caches (F16 and Q8_0 FFN probes, whose
   dequantisation is cheap enough to leave them memory-bound). This is what decode sees.
2. "memcpy": a large numpy copy on one thread, read plus write bytes counted. A floor on
   what one core can move; on many-core machines it under-reports the total.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from sidecar.profiler.database import BandwidthEntry, KernelEntry
from sidecar.profiler.plan import OP_FFN

MEMORY_BOUND_TYPES = ("F16", "Q8_0")


def dram_read_from_entries(entries: list[KernelEntry] | tuple[KernelEntry, ...]) -> list[BandwidthEntry]:
    """The best batch-1 FFN weight stream rate per thread count, as "dram_read" figures."""
    best: dict[int, KernelEntry] = {}
    for e in entries:
        if (
            e.device == "cpu"
            and e.condition == "idle"
            and e.op == OP_FFN
            and e.batch == 1
            and e.weight_type in MEMORY_BOUND_TYPES
            and (e.threads not in best or e.weight_gbps > best[e.threads].weight_gbps)
        ):
            best[e.threads] = e
    return [
        BandwidthEntry(
            kind="dram_read",
            device="cpu",
            method=f"llama_decode batch 1, {e.shape} ffn {e.weight_type}, {e.depth}-layer probe",
            memory="",
            condition="idle",
            threads=t,
            bytes=e.weight_bytes * e.depth,
            gbps=e.weight_gbps,
        )
        for t, e in sorted(best.items())
    ]


def measure_memcpy(nbytes: int, repeats: int = 5) -> BandwidthEntry:
    """Copy `nbytes` between two numpy arrays; GB/s counts bytes read plus bytes written."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)  # fault both in before timing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return BandwidthEntry(
        kind="memcpy",
        device="cpu",
        method="numpy copyto, 1 thread, read+write bytes",
        memory="",
        condition="idle",
        threads=1,
        bytes=nbytes,
        gbps=2 * nbytes / seconds / 1e9,
    )
