"""The planner's I/O shell: read a model (GGUF or config.json) and a machine (profile, spec or
preset) into the pure inputs of `plan`. Nothing else in the planner touches files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.model_info import ModelInfo, inspect_gguf, model_from_hf_config
from sidecar.planner.hardware_model import (
    HardwareModel,
    cpu_only_box,
    desktop_16gb_pcie5x16,
    hardware_from_profile,
    hardware_from_spec,
    laptop_4gb_pcie4x8,
)

PRESETS = {
    "laptop-4gb": laptop_4gb_pcie4x8,
    "desktop-16gb": desktop_16gb_pcie5x16,
    "cpu-only": cpu_only_box,
}
# Short spec keys -> (section, key in hardware_from_spec's dict).
_SHORT_KEYS = {
    "name": (None, "name"), "ram": (None, "ram"),
    "dram": ("cpu", "dram_gbps"), "gflops": ("cpu", "gflops_per_core"),
    "gpu": ("gpu", "vram"), "vram": ("gpu", "vram"), "gpu_bw": ("gpu", "mem_gbps"),
    "tflops": ("gpu", "tflops"), "pcie": ("gpu", "pcie"), "pcie_gbps": ("gpu", "pcie_gbps"),
    "gpu_name": ("gpu", "name"), "cpu_name": ("cpu", "name"),
}
DEFAULT_WEIGHT_TYPE = "Q4_K_M"


def load_model(path: str | Path, weight_type: str | None = None) -> ModelInfo:
    """A GGUF file's header, or a Hugging Face config.json sized for `weight_type`
    (default Q4_K_M). Raises FileNotFoundError, or ValueError for what it cannot read."""
    path = Path(path)
    if path.suffix.lower() == ".json" or path.name == "config.json":
        config = json.loads(path.read_text())
        name = path.parent.name if path.name == "config.json" else path.stem
        return model_from_hf_config(config, weight_type or DEFAULT_WEIGHT_TYPE, name=name or None)
    if weight_type:
        raise ValueError("--weight-type applies to a config.json; a GGUF file has its own types")
    return inspect_gguf(path)


def parse_short_spec(text: str) -> dict[str, Any]:
    """"cpu=8/16,dram=60,ram=32G,gpu=8G,gpu_bw=256,tflops=15,pcie=4.0x8" -> a spec dict.

    cpu= takes cores/threads; sizes take units; bandwidths are GB/s. ValueError otherwise.
    """
    spec: dict[str, Any] = {"cpu": {}}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"hardware spec item {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        if key == "cpu":
            cores, _, threads = value.partition("/")
            spec["cpu"]["cores"] = int(cores)
            spec["cpu"]["threads"] = int(threads or cores)
            continue
        if key not in _SHORT_KEYS:
            raise ValueError(f"unknown hardware spec key {key!r}; known: cpu, {', '.join(_SHORT_KEYS)}")
        section, name = _SHORT_KEYS[key]
        target = spec if section is None else spec.setdefault(section, {})
        target[name] = value if name in ("vram", "ram", "pcie", "name") else float(value)
    return spec


def load_hardware(source: str | None) -> tuple[HardwareModel, str]:
    """(hardware, where it came from) for `--hardware`: a preset name, a profile or spec JSON
    file, a short spec string, or None for this machine's stored profile (measured figures).

    Without a stored profile, this machine is described by a spec from its core count and a
    note says so (run `xlm-sidecar profile` for measured figures).
    """
    if source is None:
        from sidecar.profiler import default_profile_path, load_profile

        path = default_profile_path()
        try:
            return hardware_from_profile(load_profile(path)), f"profile {path}"
        except FileNotFoundError:
            import os

            import psutil

            cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
            spec = {"name": "this machine (no profile)", "ram": psutil.virtual_memory().total,
                    "cpu": {"cores": cores, "threads": psutil.cpu_count() or cores}}
            return hardware_from_spec(spec), f"no profile at {path}: default figures (run `xlm-sidecar profile`)"
    if source in PRESETS:
        return PRESETS[source](), f"preset {source}"
    path = Path(source)
    if path.is_file():
        data = json.loads(path.read_text()) if path.suffix != ".gz" else None
        if data is None or "schema_version" in data:
            from sidecar.profiler import load_profile

            return hardware_from_profile(load_profile(path)), f"profile {path}"
        return hardware_from_spec(data), f"spec {path}"
    if "=" in source:
        return hardware_from_spec(parse_short_spec(source)), "spec from the command line"
    raise ValueError(f"--hardware {source!r}: not a file, a preset ({', '.join(PRESETS)}) or key=value spec")
