"""Hardware discovery: CPU, RAM, GPUs seen by NVML and devices seen by llama.cpp.

NVML and the ggml device probe are passed in, so tests can hand in fakes. A machine without
a GPU, without the NVML library or without the `pynvml` module gets `gpus == ()` and a note
saying why; discovery never raises for that.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sidecar.native.ggml_devices import GgmlDevice, list_ggml_devices

GIB = 1 << 30


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it. Fields NVML cannot give on this GPU are None."""

    index: int
    name: str
    vram_total: int
    vram_free: int
    vram_used: int
    # Memory held by processes other than this one (None when NVML cannot list processes).
    vram_used_by_others: int | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    driver: str


@dataclass(frozen=True)
class HardwareInfo:
    """What this machine is, as far as profiling needs to know."""

    cpu_model: str
    physical_cores: int
    logical_cores: int
    ram_total: int
    ram_free: int
    l3_cache_bytes: int | None
    gpus: tuple[GpuInfo, ...]
    ggml_devices: tuple[GgmlDevice, ...]
    # Why `gpus` is empty ("no GPU: NVML library not found"), or "" when NVML answered.
    gpu_note: str

    @property
    def ggml_gpus(self) -> tuple[GgmlDevice, ...]:
        """The GPU devices llama.cpp can offload to; empty on a CPU-only build or machine."""
        return tuple(d for d in self.ggml_devices if d.is_gpu)


def load_pynvml() -> Any:
    """Import `pynvml` (nvidia-ml-py) lazily; raises ImportError when it is not installed."""
    import pynvml

    return pynvml


def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def l3_cache_bytes() -> int | None:
    """Size of the last-level cache of CPU 0 (Linux sysfs), or None when unknown."""
    try:
        cache_dir = Path("/sys/devices/system/cpu/cpu0/cache")
        sizes = []
        for index in cache_dir.glob("index*"):
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        return max(sizes) if sizes else None
    except (OSError, ValueError):
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional(call: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> Any:
    # Consumer GPUs and virtual GPUs refuse some queries (NVML "Not Supported"); one refused
    # field must not hide the GPU.
    try:
        return call()
    except errors:
        return None


def _used_by_others(nvml: Any, handle: Any, errors: tuple[type[BaseException], ...]) -> int | None:
    processes = []
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nvml, query, None)
        listed = _optional(lambda fn=fn: fn(handle), errors) if fn else None
        if listed is None:
            return None
        processes.extend(listed)
    own = os.getpid()
    seen: dict[int, int] = {}
    for p in processes:
        if p.pid != own:
            # A process doing graphics and compute is listed twice with the same figure.
            seen[p.pid] = max(seen.get(p.pid, 0), int(getattr(p, "usedGpuMemory", 0) or 0))
    return sum(seen.values())


def discover_gpus(nvml_loader: Callable[[], Any] = load_pynvml) -> tuple[tuple[GpuInfo, ...], str]:
    """GPUs as NVML sees them, and a note explaining an empty answer.

    Returns ((), "no GPU: ...") when the module is missing, the library is missing, NVML
    fails to initialise or reports zero devices; never raises for those.
    """
    try:
        nvml = nvml_loader()
    except (ImportError, OSError) as exc:
        return (), f"no GPU: pynvml unavailable ({exc})"
    nvml_error = getattr(nvml, "NVMLError", OSError)
    errors: tuple[type[BaseException], ...] = (nvml_error, OSError)
    try:
        nvml.nvmlInit()
    except errors as exc:
        return (), f"no GPU: NVML not usable ({_text(exc) or type(exc).__name__})"
    try:
        driver = _text(_optional(nvml.nvmlSystemGetDriverVersion, errors) or "unknown")
        count = nvml.nvmlDeviceGetCount()
        gpus = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    vram_total=int(memory.total),
                    vram_free=int(memory.free),
                    vram_used=int(memory.used),
                    vram_used_by_others=_used_by_others(nvml, handle, errors),
                    pcie_gen=_optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle), errors),
                    pcie_width=_optional(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle), errors),
                    pcie_gen_max=_optional(lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle), errors),
                    pcie_width_max=_optional(lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle), errors),
                    driver=driver,
                )
            )
    except errors as exc:
        return (), f"no GPU: NVML query failed ({_text(exc) or type(exc).__name__})"
    finally:
        _optional(nvml.nvmlShutdown, errors)
    if not gpus:
        return (), "no GPU: NVML reports no devices"
    return tuple(gpus), ""


def discover_hardware(
    nvml_loader: Callable[[], Any] = load_pynvml,
    ggml_probe: Callable[[], tuple[GgmlDevice, ...]] = list_ggml_devices,
) -> HardwareInfo:
    """Describe this machine: CPU, RAM (psutil), GPUs (NVML) and llama.cpp's devices (ggml).

    A failing ggml probe (llama.cpp libraries missing) gives an empty device list rather
    than an error, so discovery can report what it found.
    """
    gpus, note = discover_gpus(nvml_loader)
    try:
        devices = tuple(ggml_probe())
    except (OSError, AttributeError, ImportError, RuntimeError):
        # RuntimeError: llama-cpp-python's "Failed to load shared library".
        devices = ()
    memory = psutil.virtual_memory()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return HardwareInfo(
        cpu_model=cpu_model_name(),
        physical_cores=int(physical),
        logical_cores=int(logical),
        ram_total=int(memory.total),
        ram_free=int(memory.available),
        l3_cache_bytes=l3_cache_bytes(),
        gpus=gpus,
        ggml_devices=devices,
        gpu_note=note,
    )
