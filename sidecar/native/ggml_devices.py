"""The compute devices llama.cpp itself sees, read through ggml's backend registry (ctypes).

NVML tells us what the hardware is; this tells us what the llama.cpp build can use (a CPU-only
wheel on a machine with a GPU lists no GPU), under the names llama.cpp gives them ("CUDA0",
"Vulkan0", "RPC0").

The registry must be llama.cpp's own. llama-cpp-python's wheel ships `libggml.so`, `libggml.so.0`
and `libggml.so.0.x.y` as three separate files, not links, and libllama links `libggml.so.0`:
opening `libggml.so` by path loads a second, independent ggml with a registry of its own, where
devices registered are invisible to llama.cpp and whose buffer types llama.cpp has never seen. So
we open exactly the files this process has already mapped for libllama.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# enum ggml_backend_dev_type, in header order (ggml-backend.h).
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")
GGML_BACKEND_DEVICE_TYPE_CPU = 0


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


def _mapped_files() -> list[Path]:
    """Files this process has mapped (Linux); empty where /proc is not there."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.append(Path(fields[5]))
    return paths


def _is_library(name: str, stem: str) -> bool:
    """True when file `name` is library `stem` ("libggml") in any of its spellings: libggml.so,
    libggml.so.0, libggml.so.0.25.3, libggml.dylib, libggml.0.dylib, ggml.dll."""
    return (
        name.startswith(stem + ".so")
        or (name.startswith(stem + ".") and name.endswith(".dylib"))
        or name == stem.removeprefix("lib") + ".dll"
    )


def library_path(stem: str) -> Path:
    """The file of library `stem` ("libggml", "libggml-base", "libggml-cpu", "libggml-rpc") that
    libllama uses: the one already mapped into this process from llama-cpp-python's folder, else
    (not loaded yet, or no /proc) the versioned soname libllama links, else the plain name."""
    lib_dir = llama_lib_dir()
    for path in _mapped_files():
        if path.parent == lib_dir and _is_library(path.name, stem):
            return path
    present = sorted((p for p in lib_dir.iterdir() if _is_library(p.name, stem)), key=lambda p: len(p.name))
    if not present:
        raise FileNotFoundError(f"{stem} is not in {lib_dir}")
    if sys.platform.startswith("linux"):
        # libllama's DT_NEEDED is the soname, one version component: libggml.so.0
        sonames = [p for p in present if p.name.count(".") == 2]
        if sonames:
            return sonames[0]
    return present[0]


@lru_cache(maxsize=None)
def open_library(stem: str) -> ctypes.CDLL:
    """`stem` opened as ctypes library, the same copy libllama uses (see library_path)."""
    return ctypes.CDLL(str(library_path(stem)))


@lru_cache(maxsize=1)
def ggml_libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libggml, libggml-base) with the prototypes we call declared, loaded once."""
    ggml = open_library("libggml")
    base = open_library("libggml-base")
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_count.argtypes = []
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_register.restype = None
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
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
    base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    return ggml, base


def device_handle(index: int) -> int:
    """The ggml_backend_dev_t of device `index` in the registry, as an integer pointer."""
    ggml, _ = ggml_libraries()
    handle = ggml.ggml_backend_dev_get(index)
    if not handle:
        raise IndexError(f"no ggml device {index}")
    return handle


def device_by_name(name: str) -> int | None:
    """The ggml_backend_dev_t named `name` ("RPC0", "CUDA0"), or None."""
    ggml, _ = ggml_libraries()
    return ggml.ggml_backend_dev_by_name(name.encode()) or None


def cpu_device_handle() -> int:
    """The CPU device of llama.cpp's registry."""
    ggml, _ = ggml_libraries()
    return ggml.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)


# RPC devices answer memory queries over the one socket the engine's graphs also use, and ggml's
# RPC client does not serialise commands on it: a query from another thread while the engine
# computes would interleave two commands. Their figures never move (the server reports its host
# RAM), so they are read once, when registered, and served from here.
_fixed_memory: dict[str, tuple[int, int]] = {}


def _read_memory(handle: int) -> tuple[int, int]:
    _, base = ggml_libraries()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    base.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def _is_rpc(name: str) -> bool:
    return name.startswith("RPC")


def device_memory(name: str) -> tuple[int, int] | None:
    """(free, total) bytes as ggml's backend reports them for device `name`, or None."""
    if name in _fixed_memory:
        return _fixed_memory[name]
    handle = device_by_name(name)
    if handle is None:
        return None
    memory = _read_memory(handle)
    if _is_rpc(name):
        _fixed_memory[name] = memory
    return memory


def devices_memory(names) -> dict[str, tuple[int, int]]:
    """(free, total) bytes of each named device but the host's ("CPU"), for the status RPC; a
    device ggml does not know is left out."""
    found = {name: device_memory(name) for name in names if name != "CPU"}
    return {name: memory for name, memory in found.items() if memory is not None}


# Buffer type name -> device name, for every device whose buffer type was asked for. RPC buffer
# types are named after the server's own device index, so the first device of every server is
# "RPC0[host:port]" whatever llama.cpp calls the device (RPC0, RPC1, ...): only this table tells.
_buffer_devices: dict[str, str] = {}


def buffer_type_name(name: str) -> str | None:
    """The name of device `name`'s own buffer type as llama.cpp logs it ("CUDA0",
    "RPC0[127.0.0.1:50052]"), or None for an unknown device."""
    handle = device_by_name(name)
    if handle is None:
        return None
    _, base = ggml_libraries()
    buft = base.ggml_backend_dev_buffer_type(handle)
    if not buft:
        return None
    buft_name = (base.ggml_backend_buft_name(buft) or b"").decode(errors="replace")
    _buffer_devices[buft_name] = name
    return buft_name


def known_buffer_device(buffer_type: str) -> str | None:
    """The device a buffer type name belongs to, when buffer_type_name was asked for it (no
    native call: safe from any thread)."""
    return _buffer_devices.get(buffer_type)


def list_ggml_devices() -> tuple[GgmlDevice, ...]:
    """Every device in ggml's registry, in registry order (CPU last in CUDA builds)."""
    ggml, base = ggml_libraries()
    devices = []
    for index, name, kind in _names_and_kinds():
        free, total = device_memory(name) or (0, 0)
        handle = ggml.ggml_backend_dev_get(index)
        devices.append(
            GgmlDevice(
                index=index,
                name=name,
                description=(base.ggml_backend_dev_description(handle) or b"").decode(errors="replace"),
                kind=kind,
                memory_total=total,
                memory_free=free,
            )
        )
    return tuple(devices)


def _names_and_kinds() -> list[tuple[int, str, str]]:
    """(index, name, kind) of every registered device: local calls only, no device round trip."""
    ggml, base = ggml_libraries()
    out = []
    for index in range(ggml.ggml_backend_dev_count()):
        handle = ggml.ggml_backend_dev_get(index)
        kind_id = base.ggml_backend_dev_type(handle)
        name = (base.ggml_backend_dev_name(handle) or b"").decode(errors="replace")
        out.append((index, name, DEVICE_KINDS[kind_id] if 0 <= kind_id < len(DEVICE_KINDS) else str(kind_id)))
    return out


def gpu_device_names() -> tuple[str, ...]:
    """ggml's GPU-type devices, in registry order: what the executor may place onto. Asks no
    device anything, so it is safe while the engine computes."""
    return tuple(name for _, name, kind in _names_and_kinds() if kind == "gpu")
