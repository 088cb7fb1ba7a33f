"""Hardware discovery with fake NVML modules: several GPUs, none, NVML missing or broken."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from sidecar.profiler.fingerprint import fingerprint_of
from sidecar.native.ggml_devices import GgmlDevice, list_ggml_devices
from sidecar.profiler.hardware import discover_gpus, discover_hardware

GIB = 1 << 30


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeNVML:
    """The subset of pynvml discovery calls, answering from a list of GPU dicts."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[dict], driver: str = "580.12", init_error: Exception | None = None):
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.shutdown_called = False

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self):
        return self.driver.encode()  # older pynvml returns bytes

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"])

    def _field(self, h, key):
        if key not in h:
            raise FakeNotSupported("Not Supported")
        return h[key]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._field(h, "gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._field(h, "width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._field(h, "gen_max")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._field(h, "width_max")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._field(h, "compute")]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._field(h, "graphics")]


def two_gpus() -> FakeNVML:
    return FakeNVML(
        [
            {
                "name": "NVIDIA GeForce RTX 4070",
                "total": 12 * GIB,
                "free": 9 * GIB,
                "gen": 4, "width": 16, "gen_max": 4, "width_max": 16,
                # A game (pid 4242) listed as compute and graphics, and ourselves.
                "compute": [(4242, 2 * GIB), (os.getpid(), 512 << 20)],
                "graphics": [(4242, 2 * GIB), (777, GIB)],
            },
            {
                # A GPU that refuses PCIe and process queries (e.g. a vGPU).
                "name": b"NVIDIA RTX A2000",
                "total": 6 * GIB,
                "free": 6 * GIB,
            },
        ]
    )


def test_several_gpus_are_described_field_by_field():
    gpus, note = discover_gpus(lambda: two_gpus())
    assert note == ""
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4070", "NVIDIA RTX A2000"]
    first, second = gpus
    assert (first.vram_total, first.vram_free, first.vram_used) == (12 * GIB, 9 * GIB, 3 * GIB)
    # Our own process is not "other"; a process in both lists counts once.
    assert first.vram_used_by_others == 3 * GIB
    assert (first.pcie_gen, first.pcie_width) == (4, 16)
    assert first.driver == "580.12"
    assert (second.pcie_gen, second.pcie_width, second.vram_used_by_others) == (None, None, None)


def test_zero_gpus_is_no_gpu():
    gpus, note = discover_gpus(lambda: FakeNVML([]))
    assert gpus == ()
    assert note.startswith("no GPU")


def test_pynvml_not_installed_is_no_gpu():
    def missing():
        raise ImportError("No module named 'pynvml'")

    gpus, note = discover_gpus(missing)
    assert gpus == () and "no GPU" in note and "pynvml" in note


@pytest.mark.parametrize(
    "error", [FakeNVMLError("NVML Shared Library Not Found"), OSError("libnvidia-ml.so.1")]
)
def test_nvml_library_missing_is_no_gpu(error):
    gpus, note = discover_gpus(lambda: FakeNVML([{"name": "x"}], init_error=error))
    assert gpus == () and note.startswith("no GPU")


def test_real_pynvml_without_driver_is_no_gpu():
    # This machine has nvidia-ml-py but no libnvidia-ml: the real module must not crash us.
    gpus, note = discover_gpus()
    if gpus:
        pytest.skip("a real GPU is present")
    assert note.startswith("no GPU")


def test_nvml_failing_mid_query_is_no_gpu_and_shuts_down():
    nvml = two_gpus()

    def broken(_h):
        raise FakeNVMLError("GPU is lost")

    nvml.nvmlDeviceGetMemoryInfo = broken
    gpus, note = discover_gpus(lambda: nvml)
    assert gpus == () and "GPU is lost" in note
    assert nvml.shutdown_called


def _cuda_device() -> GgmlDevice:
    return GgmlDevice(0, "CUDA0", "NVIDIA GeForce RTX 4070", "gpu", 12 * GIB, 9 * GIB)


def test_discover_hardware_combines_nvml_and_ggml():
    cpu = GgmlDevice(1, "CPU", "AMD EPYC", "cpu", 24 * GIB, 20 * GIB)
    hw = discover_hardware(nvml_loader=lambda: two_gpus(), ggml_probe=lambda: (_cuda_device(), cpu))
    assert len(hw.gpus) == 2
    assert [d.name for d in hw.ggml_gpus] == ["CUDA0"]
    assert hw.logical_cores >= hw.physical_cores >= 1
    assert hw.ram_total > hw.ram_free > 0
    assert hw.cpu_model


def test_discover_hardware_survives_missing_llama_libraries():
    def broken_probe():
        raise OSError("libggml.so: cannot open shared object file")

    hw = discover_hardware(nvml_loader=lambda: FakeNVML([]), ggml_probe=broken_probe)
    assert hw.ggml_devices == () and hw.gpus == ()
    assert hw.gpu_note.startswith("no GPU")


def test_real_ggml_device_list_has_a_cpu():
    devices = list_ggml_devices()
    assert any(d.kind == "cpu" for d in devices)
    assert all(d.name for d in devices)


def test_fingerprint_follows_driver_and_build_not_free_memory():
    base = discover_hardware(nvml_loader=lambda: two_gpus(), ggml_probe=lambda: ())
    fp = fingerprint_of(base, "0.3.36", "CPU : AVX2 = 1")
    assert len(fp) == 16
    assert fingerprint_of(base, "0.3.36", "CPU : AVX2 = 1") == fp
    other_driver = discover_hardware(
        nvml_loader=lambda: FakeNVML(two_gpus().gpus, driver="590.1"), ggml_probe=lambda: ()
    )
    assert fingerprint_of(other_driver, "0.3.36", "CPU : AVX2 = 1") != fp
    assert fingerprint_of(base, "0.3.37", "CPU : AVX2 = 1") != fp
    assert fingerprint_of(base, "0.3.36", "CPU : AVX2 = 1 | CUDA = 1") != fp
    from dataclasses import replace

    assert fingerprint_of(replace(base, ram_free=1), "0.3.36", "CPU : AVX2 = 1") == fp
