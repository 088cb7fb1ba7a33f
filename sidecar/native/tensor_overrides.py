"""llama.cpp's per-tensor placement (`tensor_buft_overrides`, the CLI's `-ot`), built with ctypes.

`llama_model_params.tensor_buft_overrides` points to a NULL-terminated array of
{const char *pattern; ggml_backend_buffer_type_t buft}; the first pattern that matches a tensor
name (as a regex search) decides its buffer. llama-cpp-python declares the field as a bare void
pointer, so the struct is ours, and the array and its strings must outlive the model load.
"""

from __future__ import annotations

import ctypes
import re

from sidecar.errors import InvalidArgument
from sidecar.native.ggml_devices import device_by_name, ggml_libraries, open_library


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def buffer_type(device: str) -> int:
    """The ggml buffer type for "CPU" or a ggml device name such as "CUDA0" or "RPC0", taken from
    the ggml libllama uses (a buffer type from another copy of ggml would be foreign to it)."""
    _, base = ggml_libraries()
    if device == "CPU":
        cpu = open_library("libggml-cpu")
        cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
        cpu.ggml_backend_cpu_buffer_type.argtypes = []
        return cpu.ggml_backend_cpu_buffer_type()
    dev = device_by_name(device)
    if not dev:
        raise InvalidArgument(f"llama.cpp has no device {device!r} (this build sees none, or another name)")
    return base.ggml_backend_dev_buffer_type(dev)


class TensorOverrides:
    """A live override array for one model load. Keep the object alive until the load returns."""

    def __init__(self, rules: tuple[tuple[str, str], ...]) -> None:
        for pattern, _device in rules:
            try:
                re.compile(pattern)
            except re.error as e:
                raise InvalidArgument(f"tensor override pattern {pattern!r} is not a regex: {e}") from e
        self.rules = rules
        self._patterns = [p.encode() for p, _ in rules]
        self._array = (_BuftOverride * (len(rules) + 1))()
        for i, ((_, device), pattern) in enumerate(zip(rules, self._patterns)):
            self._array[i].pattern = pattern
            self._array[i].buft = buffer_type(device)
        self._array[len(rules)].pattern = None  # the terminator llama.cpp looks for

    @property
    def pointer(self) -> int | None:
        """Value for llama_model_params.tensor_buft_overrides (None when there are no rules)."""
        return ctypes.addressof(self._array) if self.rules else None
