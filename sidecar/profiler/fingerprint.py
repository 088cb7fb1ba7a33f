"""A short hash naming the profile that is valid for this hardware and llama.cpp build.

Anything that changes measured speed and can change between runs goes in: the CPU, its core
counts, RAM size, the GPUs and their driver, the devices llama.cpp sees, and the llama.cpp
build (version and the CPU features it was compiled for). Free memory and clocks do not:
they change every minute.
"""

from __future__ import annotations

import hashlib
import json

from sidecar.profiler.hardware import GIB, HardwareInfo


def llama_build_info() -> tuple[str, str]:
    """(llama-cpp-python version, llama_print_system_info() text) of the installed build."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    return str(llama_cpp.__version__), info.decode(errors="replace").strip()


def fingerprint_of(hardware: HardwareInfo, llama_version: str, system_info: str) -> str:
    """16 hex digits that change when the hardware or the llama.cpp build changes."""
    identity = {
        "cpu": hardware.cpu_model,
        "physical_cores": hardware.physical_cores,
        "logical_cores": hardware.logical_cores,
        # Rounded: the kernel reserves a slightly different amount after some updates.
        "ram_gib": round(hardware.ram_total / GIB),
        "gpus": [(g.name, g.vram_total // GIB, g.driver) for g in hardware.gpus],
        "ggml_devices": [(d.name, d.description, d.kind) for d in hardware.ggml_devices],
        "llama_cpp": llama_version,
        "system_info": system_info,
    }
    blob = json.dumps(identity, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
