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
# Debug lines of load_tensors and llama_kv_cache: the device of each layer's weights (layer
# n_layer is the output layer) and of each layer's KV cache.
_LAYER = re.compile(r"load_tensors: layer\s+(?P<layer>\d+) assigned to device (?P<device>[^,\s]+)")
_KV_LAYER = re.compile(r"llama_kv_cache: layer\s+(?P<layer>\d+): dev = (?P<device>\S+)")
_BLOCK = re.compile(r"^blk\.(?P<layer>\d+)\.")
# "llama_kv_cache: size = 2.99 MiB (256 cells, 30 layers, 1/1 seqs), K (q8_0): 1.49 MiB, V (q8_0): ..."
_KV_TYPES = re.compile(r"llama_kv_cache: size = .* K \((?P<k>\w+)\):.* V \((?P<v>\w+)\):")


@dataclass(frozen=True)
class LoadReport:
    """Bytes per buffer type for each kind of buffer, and the tensors each override moved."""

    model_bytes: dict[str, int] = field(default_factory=dict)
    kv_bytes: dict[str, int] = field(default_factory=dict)
    compute_bytes: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)
    overridden: dict[str, str] = field(default_factory=dict)
    # layer -> device ("CPU", "RPC0", "CUDA0") as llama.cpp assigned it before overrides; the
    # output layer is numbered n_layer. Empty when the log had no debug lines.
    layer_devices: dict[int, str] = field(default_factory=dict)
    # layer -> device of that layer's KV cache.
    kv_layer_devices: dict[int, str] = field(default_factory=dict)
    # The KV cache's ggml types as llama.cpp allocated them ("F16", "Q8_0"); "" if not logged.
    kv_k_type: str = ""
    kv_v_type: str = ""

    def tensor_device(self, tensor: str, n_layer: int, *, output: bool = False) -> str:
        """Where llama.cpp put one weight tensor: its override, else its layer's device. The
        embedding stays on the CPU; output tensors go with layer n_layer, and so does a tied
        output's token_embd (`output=True`: llama.cpp loads a second copy of it there)."""
        if tensor in self.overridden:
            return buffer_device(self.overridden[tensor])
        if m := _BLOCK.match(tensor):
            return self.layer_devices.get(int(m["layer"]), "CPU")
        if output or tensor.startswith("output"):
            return self.layer_devices.get(n_layer, "CPU")
        return "CPU"

    def device_bytes(self, device: str) -> int:
        """All bytes in the memory of one device ("CUDA0", "RPC0", or "CPU" for every host
        buffer), every kind of buffer."""
        return sum(
            n
            for table in (self.model_bytes, self.kv_bytes, self.compute_bytes, self.output_bytes)
            for buft, n in table.items()
            if buffer_device(buft) == device
        )

    def by_device(self) -> dict[str, dict[str, int]]:
        """{device: {"model"|"kv"|"compute"|"output": bytes}}, devices as buffer_device names them."""
        out: dict[str, dict[str, int]] = {}
        kinds = (("model", self.model_bytes), ("kv", self.kv_bytes), ("compute", self.compute_bytes),
                 ("output", self.output_bytes))
        for kind, table in kinds:
            for buft, n in table.items():
                device = out.setdefault(buffer_device(buft), {"model": 0, "kv": 0, "compute": 0, "output": 0})
                device[kind] += n
        return out

    def vram_bytes(self) -> int:
        """Bytes in GPU memory, every kind of buffer."""
        return sum(
            n
            for table in (self.model_bytes, self.kv_bytes, self.compute_bytes, self.output_bytes)
            for buft, n in table.items()
            if is_vram(buft)
        )


# Device-memory buffer types as llama.cpp names them: "CUDA0", "Vulkan1", "RPC0[127.0.0.1:50052]".
# Pinned host buffers ("CUDA_Host") and CPU ones ("CPU", "CPU_Mapped", "CPU_REPACK") are not.
_VRAM_BUFFER = re.compile(r"^(?P<device>(CUDA|ROCm|HIP|Vulkan|SYCL|MUSA|CANN|RPC|Metal|OpenCL)\d*)(\[[^\]]*\])?$")


def is_vram(buffer_type: str) -> bool:
    """True for device-memory buffers ("CUDA0", "RPC0[host:port]"); host buffers are not."""
    return bool(_VRAM_BUFFER.match(buffer_type))


def buffer_device(buffer_type: str) -> str:
    """The ggml device whose memory a buffer type is: "CUDA0" -> "CUDA0",
    "RPC0[127.0.0.1:50052]" -> the RPC device registered for that server, every host buffer ->
    "CPU"."""
    from sidecar.native.ggml_devices import known_buffer_device

    if known := known_buffer_device(buffer_type):
        return known
    m = _VRAM_BUFFER.match(buffer_type)
    return m["device"] if m else "CPU"


def parse_load_log(lines: list[str]) -> LoadReport:
    """Read a load log (as captured by capture_native_log) into a LoadReport."""
    tables: dict[str, dict[str, int]] = {"model": {}, "KV": {}, "compute": {}, "output": {}}
    overridden: dict[str, str] = {}
    layers: dict[int, str] = {}
    kv_layers: dict[int, str] = {}
    kv_types = ("", "")
    for line in lines:
        line = line.strip()
        if m := _BUFFER.match(line):
            table = tables[m["kind"]]
            table[m["buft"]] = table.get(m["buft"], 0) + int(float(m["mib"]) * _MIB)
        elif m := _OVERRIDE.search(line):
            overridden[m["tensor"]] = m["buft"]
        elif m := _LAYER.search(line):
            layers[int(m["layer"])] = m["device"]
        elif m := _KV_LAYER.search(line):
            kv_layers[int(m["layer"])] = m["device"]
        elif m := _KV_TYPES.search(line):
            kv_types = (m["k"].upper(), m["v"].upper())
    return LoadReport(tables["model"], tables["KV"], tables["compute"], tables["output"], overridden, layers, kv_layers,
                      *kv_types)
