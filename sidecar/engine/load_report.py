"""What llama.cpp says it did at load: buffers per device and tensors moved by overrides.

llama.cpp has no API that lists where each tensor landed or how large each buffer is; it logs
both while loading ("load_tensors: CUDA0 model buffer size = ...", "tensor blk.0.ffn_up.weight
(...) buffer type overridden to CPU", "llama_kv_cache: CPU KV buffer size = ..."). We read those
lines back, so status reports measured placement and the planner can be corrected by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_MIB = 1024 * 1024
_BUFFER = re.compile(r"^(?P<stage>\w+):\s+(?P<buft>\S+)\s+(?P<kind>model|KV|compute|output)\s+buffer size\s*=\s*(?P<mib>[\d.]+)\s*MiB")
_OVERRIDE = re.compile(r"tensor (?P<tensor>\S+) \(.*\) buffer type overridden to (?P<buft>\S+)")


@dataclass(frozen=True)
class LoadReport:
    """Bytes per buffer type for each kind of buffer, and the tensors each override moved."""

    model_bytes: dict[str, int] = field(default_factory=dict)
    kv_bytes: dict[str, int] = field(default_factory=dict)
    compute_bytes: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)
    overridden: dict[str, str] = field(default_factory=dict)

    def device_bytes(self, device: str) -> int:
        """All bytes in buffers of one device ("CUDA0", "CPU", ...), every kind of buffer."""
        return sum(
            n
            for table in (self.model_bytes, self.kv_bytes, self.compute_bytes, self.output_bytes)
            for buft, n in table.items()
            if buft == device
        )

    def vram_bytes(self) -> int:
        """Bytes in GPU memory, every kind of buffer."""
        return sum(
            n
            for table in (self.model_bytes, self.kv_bytes, self.compute_bytes, self.output_bytes)
            for buft, n in table.items()
            if is_vram(buft)
        )


_VRAM_BUFFER = re.compile(r"^(CUDA|ROCm|HIP|Vulkan|SYCL|MUSA|CANN)\d+$")


def is_vram(buffer_type: str) -> bool:
    """True for device-memory buffers ("CUDA0"); pinned host buffers ("CUDA_Host") and CPU ones are not."""
    return bool(_VRAM_BUFFER.match(buffer_type))


def parse_load_log(lines: list[str]) -> LoadReport:
    """Read a load log (as captured by capture_native_log) into a LoadReport."""
    tables: dict[str, dict[str, int]] = {"model": {}, "KV": {}, "compute": {}, "output": {}}
    overridden: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if m := _BUFFER.match(line):
            table = tables[m["kind"]]
            table[m["buft"]] = table.get(m["buft"], 0) + int(float(m["mib"]) * _MIB)
        elif m := _OVERRIDE.search(line):
            overridden[m["tensor"]] = m["buft"]
    return LoadReport(tables["model"], tables["KV"], tables["compute"], tables["output"], overridden)
