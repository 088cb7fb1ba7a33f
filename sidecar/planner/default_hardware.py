"""The machine as the planner sees it before any profile: its cores and memory, with the
roofline defaults of hardware_model for the figures only a profile measures.

The daemon plans with this at its first start (the profile is then measured in the background),
so the first reply never waits for a measurement. Pure: hardware discovery is done by the caller.
"""

from __future__ import annotations

from sidecar.planner.hardware_model import HardwareModel, hardware_from_spec
from sidecar.profiler.hardware import HardwareInfo

# A GPU nobody measured yet: figures at the low end of the cards a game targets (RTX 3050-class
# memory and compute, PCIe 3.0 x16), so the first plan streams less rather than more.
DEFAULT_GPU_MEM_GBPS = 200.0
DEFAULT_GPU_TFLOPS = 8.0


def hardware_from_facts(info: HardwareInfo) -> HardwareModel:
    """The defaults' HardwareModel for this machine (source "defaults")."""
    spec: dict = {
        "name": info.cpu_model,
        "ram": info.ram_total,
        "cpu": {"name": info.cpu_model, "cores": max(1, info.physical_cores), "threads": max(1, info.logical_cores)},
    }
    if info.ggml_gpus and info.gpus:
        g = info.gpus[0]
        pcie = f"{g.pcie_gen}.0x{g.pcie_width}" if g.pcie_gen and g.pcie_width else "3.0x16"
        spec["gpu"] = {"name": g.name, "vram": g.vram_total, "mem_gbps": DEFAULT_GPU_MEM_GBPS,
                       "tflops": DEFAULT_GPU_TFLOPS, "pcie": pcie}
    model = hardware_from_spec(spec)
    from dataclasses import replace

    return replace(model, source="defaults",
                   notes=("no profile of this machine yet: built-in defaults (cores, roofline figures)",))
