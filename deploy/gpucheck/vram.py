"""The GPU as NVML sees it: what it is, how much memory is free, and a process's peak use."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int
    free_bytes: int
    driver: str


def gpu_info(index: int = 0) -> GpuInfo:
    """The GPU's name, memory and driver; RuntimeError without NVML or a GPU."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise RuntimeError(f"NVML is not available ({e}): no NVIDIA driver on this machine") from None
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    return GpuInfo(
        name=name.decode() if isinstance(name, bytes) else name,
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        driver=driver.decode() if isinstance(driver, bytes) else driver,
    )


class PeakVram:
    """Samples one process's GPU memory (NVML, every `period_s`) from start() to stop(); `peak`
    is the most it held, CUDA context included (0 on a machine without NVML)."""

    def __init__(self, pid: int, index: int = 0, period_s: float = 0.05) -> None:
        self.pid = pid
        self.index = index
        self.period_s = period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PeakVram:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak

    def _run(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError:
            return  # no GPU: nothing to sample, and the peak stays 0
        while not self._stop.is_set():
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                processes = []
            for p in processes:
                if p.pid == self.pid and p.usedGpuMemory:
                    self.peak = max(self.peak, int(p.usedGpuMemory))
            time.sleep(self.period_s)
