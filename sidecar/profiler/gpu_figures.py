"""The GPU steps' measurements as profile entries: host-to-device copies alone, and copies and
CPU kernels overlapping (each slows the other). The steps that take them are in steps.py."""

from __future__ import annotations

from dataclasses import replace

from sidecar.native.ggml_devices import GgmlDevice
from sidecar.profiler.busy import measure_overlap
from sidecar.profiler.database import BandwidthEntry, KernelEntry
from sidecar.profiler.kernels import ProbeSession
from sidecar.profiler.plan import OP_FFN, ProbeShape
from sidecar.profiler.probe_models import deep_probe, one_layer_probe, probe_weights
from sidecar.profiler.sublayers import ProbeSetup, probe_depth
from sidecar.profiler.transfers import CopyLoop, measure_h2d

COPY_BYTES = 256 << 20


def measure_copies(device: GgmlDevice, nbytes: int) -> tuple[list[BandwidthEntry], list[str]]:
    """Host-to-device bandwidth from pageable and pinned memory, nothing else running."""
    figures, notes = [], []
    for memory in ("pageable", "pinned"):
        try:
            fig = measure_h2d(device.index, nbytes, pinned=memory == "pinned")
        except (NotImplementedError, MemoryError, RuntimeError) as exc:
            notes.append(f"{device.name}: {memory} copy not measured ({exc})")
            continue
        figures.append(
            BandwidthEntry("h2d", device.name.lower(), "ggml_backend_tensor_set", memory,
                           "idle", 1, nbytes, fig.gbps)
        )
    return figures, notes


def measure_busy_figures(
    setup: ProbeSetup, shape: ProbeShape, weight_type: str, device: GgmlDevice,
    idle_entries: list[KernelEntry],
) -> tuple[list[BandwidthEntry], list[KernelEntry]]:
    """Copies while the CPU decodes, and CPU decodes while copies run.

    Copy figures for pageable and (where the device has it) pinned sources. CPU entries
    come from the pageable case, whose copies read DRAM through the CPU like mmap'd
    weights do; they are the idle FFN entries scaled by the measured busy/idle ratio of
    the whole probe, so they stay per-layer figures like their idle twins.
    """
    plan = setup.plan
    threads = max(setup.threads)
    batches = tuple(b for b in plan.batches if b <= plan.deep_max_batch) or (1,)
    source = one_layer_probe(shape, OP_FFN, weight_type, setup.cache_dir, setup.quantize_threads)
    # The deep probe, as for the idle entries: pageable copies and DRAM-bound decodes
    # compete for the same memory bandwidth, which is the effect to capture.
    depth = probe_depth(
        shape, OP_FFN, probe_weights(source, OP_FFN).op_bytes, plan.deep_target_bytes, plan.max_depth
    )
    path = deep_probe(source, shape, OP_FFN, depth, setup.scratch / f"busy-{source.name}")
    label = device.name.lower()
    bandwidths = []
    with ProbeSession(path, max(batches)) as session:
        session.set_threads(threads)
        session.decode_seconds(1)
        for memory in ("pinned", "pageable"):  # pageable last: its figures are kept below
            try:
                with CopyLoop(device.index, COPY_BYTES, memory == "pinned") as copy:
                    figs = measure_overlap(session, batches, copy, setup.policy)
            except NotImplementedError:
                continue  # no pinned memory on this device
            bandwidths.append(
                BandwidthEntry("h2d", label, "ggml_backend_tensor_set", memory, "cpu_busy",
                               threads, figs.nbytes, figs.nbytes / figs.copy_busy_s / 1e9)
            )
    busy_entries = []
    for e in idle_entries:
        if (e.op, e.shape, e.weight_type, e.threads, e.device) == (OP_FFN, shape.name, weight_type, threads, "cpu") and e.batch in figs.cpu_idle_s:
            ratio = figs.cpu_busy_s[e.batch] / figs.cpu_idle_s[e.batch]
            busy_entries.append(replace(e, seconds=e.seconds * ratio, condition="h2d_busy"))
    return bandwidths, busy_entries
