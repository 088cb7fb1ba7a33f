"""A HardwareModel built from a real (tiny) machine profile: the measured kernels become the cost
model's series and predict a probe's own time. Here, not in unit/, because the profile times
this machine: beside the other test worker it took 22 s of retried points, alone under 2 s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sidecar.model_info import model_from_hf_config, sub_layers
from sidecar.planner.cost_model import ON_CPU, PassShape, compute_seconds
from sidecar.planner.hardware_model import hardware_from_profile
from support.hf_models import LLAMA_8B


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    from sidecar.profiler import run_profile
    from sidecar.profiler.plan import tiny_plan

    return run_profile(tiny_plan(measure_gpu=False), cache_dir=Path(tmp_path_factory.mktemp("probes")))


def test_hardware_from_a_real_profile(tiny_profile):
    hw = hardware_from_profile(tiny_profile)
    assert hw.source.startswith("profile:") and hw.gpu is None
    assert hw.cpu.logical_cores == tiny_profile.hardware.logical_cores
    assert hw.cpu.dram_gbps > 0 and hw.kernels and hw.overheads
    assert {p.op for p in hw.kernels} == {"attn_qkvo", "ffn"}
    # Every cleaned series is monotone in batch.
    for series in hw.kernel_series.values():
        times = [p.seconds for p in series]
        assert times == sorted(times)


def test_measured_figures_drive_the_prediction(tiny_profile):
    hw = hardware_from_profile(tiny_profile)
    series = next(s for k, s in hw.kernel_series.items() if k[0] == "ffn" and k[3] == "Q4_0" and k[4] == 1)
    p = series[0]
    # A unit exactly like the probe's FFN is predicted at the probe's measured time.
    unit = dataclasses.replace(
        next(u for u in sub_layers(model_from_hf_config(LLAMA_8B, "Q4_0")) if u.kind == "ffn"),
        weight_type="Q4_0", weight_bytes=int(p.weight_bytes), bytes_per_token=p.weight_bytes,
        flops_per_token=p.flops / p.batch)
    assert compute_seconds(hw, unit, ON_CPU, PassShape.prefill(p.batch), 1) == pytest.approx(p.seconds, rel=1e-6)


def test_profile_gpu_figures_are_used(tiny_profile):
    from sidecar.profiler.database import BandwidthEntry
    from sidecar.native.ggml_devices import GgmlDevice
    from sidecar.profiler.hardware import GpuInfo

    gpu_device = GgmlDevice(1, "CUDA0", "Fake GPU", "gpu", 8 << 30, 7 << 30)
    nvml = GpuInfo(0, "Fake GPU", 8 << 30, 7 << 30, 1 << 30, 0, 4, 16, 4, 16, "555")
    gpu_entries = tuple(dataclasses.replace(e, device="cuda0", seconds=e.seconds / 20)
                        for e in tiny_profile.entries if e.op in ("attn_qkvo", "ffn") and e.threads == 1)
    db = dataclasses.replace(
        tiny_profile,
        hardware=dataclasses.replace(tiny_profile.hardware, gpus=(nvml,),
                                     ggml_devices=tiny_profile.hardware.ggml_devices + (gpu_device,)),
        entries=tiny_profile.entries + gpu_entries,
        bandwidths=tiny_profile.bandwidths + (
            BandwidthEntry("h2d", "cuda0", "ggml_backend_tensor_set", "pageable", "idle", 1, 1 << 28, 11.0),),
    )
    hw = hardware_from_profile(db)
    assert hw.gpu is not None and hw.gpu.pcie_gbps == 11.0 and hw.gpu.vram_bytes == 8 << 30
    assert hw.gpu.pcie_label == "4.0x16"
    assert any(p.device == "gpu" for p in hw.kernels)
