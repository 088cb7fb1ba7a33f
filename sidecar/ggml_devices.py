"""The compute devices llama.cpp itself sees, read through ggml's backend registry (ctypes).

NVML tells us what the hardware is; this tells us what the llama.cpp build can use (a CPU-only
wheel on a machine with a GPU lists no GPU).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# enum ggml_backend_dev_type, in header order (ggml-backend.h).
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True)
class GgmlDevice:
    """One ggml backend device: its registry name ("CPU", "CUDA0"), description and memory."""

    index: int
    name: str
    description: str
    kind: str
    memory_total: int
    memory_free: int

    @property
    def is_gpu(self) -> bool:
        """True for devices with their own memory that llama.cpp can offload to."""
        return self.kind == "gpu"


def llama_lib_dir() -> Path:
    """The folder holding the shared libraries of the installed llama-cpp-python."""
    import llama_cpp  # loads libllama, which loads and registers the ggml backends

    return Path(llama_cpp.__file__).parent / "lib"


@lru_cache(maxsize=1)
def ggml_libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libggml, libggml-base) with the prototypes we call declared, loaded once."""
    lib_dir = llama_lib_dir()
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_count.argtypes = []
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, fn).restype = ctypes.c_char_p
        getattr(base, fn).argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_memory.restype = None
    base.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    return ggml, base


def device_handle(index: int) -> int:
    """The ggml_backend_dev_t of device `index` in the registry, as an integer pointer."""
    ggml, _ = ggml_libraries()
    handle = ggml.ggml_backend_dev_get(index)
    if not handle:
        raise IndexError(f"no ggml device {index}")
    return handle


def list_ggml_devices() -> tuple[GgmlDevice, ...]:
    """Every device in ggml's registry, in registry order (CPU last in CUDA builds)."""
    ggml, base = ggml_libraries()
    devices = []
    for index in range(ggml.ggml_backend_dev_count()):
        handle = ggml.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        kind_id = base.ggml_backend_dev_type(handle)
        devices.append(
            GgmlDevice(
                index=index,
                name=(base.ggml_backend_dev_name(handle) or b"").decode(errors="replace"),
                description=(base.ggml_backend_dev_description(handle) or b"").decode(
                    errors="replace"
                ),
                kind=DEVICE_KINDS[kind_id] if 0 <= kind_id < len(DEVICE_KINDS) else str(kind_id),
                memory_total=int(total.value),
                memory_free=int(free.value),
            )
        )
    return tuple(devices)
