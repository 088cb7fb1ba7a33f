"""Host-to-device copy bandwidth, through ggml's backend API (ctypes), the path weights take.

A device buffer is allocated from the device's own buffer type, a 1-D I8 tensor is placed in
it, and `ggml_backend_tensor_set` copies into it (synchronous: it returns when the bytes are
on the device). The source is either ordinary (pageable) host memory or a buffer from the
device's host buffer type, which the CUDA backend allocates pinned. No CUDA runtime binding
is needed. On the CPU device the same calls are a memcpy, which is how tests exercise them.
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sidecar.native.ggml_devices import device_handle, ggml_libraries

GGML_TYPE_I8 = 24  # enum ggml_type (ggml.h)


class _InitParams(ctypes.Structure):
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


@lru_cache(maxsize=1)
def _api() -> ctypes.CDLL:
    _, base = ggml_libraries()
    protos = {
        "ggml_init": (ctypes.c_void_p, [_InitParams]),
        "ggml_free": (None, [ctypes.c_void_p]),
        "ggml_tensor_overhead": (ctypes.c_size_t, []),
        "ggml_new_tensor_1d": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]),
        "ggml_backend_dev_buffer_type": (ctypes.c_void_p, [ctypes.c_void_p]),
        "ggml_backend_dev_host_buffer_type": (ctypes.c_void_p, [ctypes.c_void_p]),
        "ggml_backend_buft_alloc_buffer": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
        "ggml_backend_buffer_get_base": (ctypes.c_void_p, [ctypes.c_void_p]),
        "ggml_backend_buffer_free": (None, [ctypes.c_void_p]),
        "ggml_backend_tensor_alloc": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        "ggml_backend_tensor_set": (
            None,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
        ),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(base, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return base


@contextlib.contextmanager
def _buffer(buft: int, nbytes: int) -> Iterator[int]:
    api = _api()
    buf = api.ggml_backend_buft_alloc_buffer(buft, nbytes)
    if not buf:
        raise MemoryError(f"ggml could not allocate {nbytes} bytes")
    try:
        yield buf
    finally:
        api.ggml_backend_buffer_free(buf)


@contextlib.contextmanager
def _device_tensor(device_index: int, nbytes: int) -> Iterator[int]:
    # A tensor in device memory, the copy target.
    api = _api()
    ctx = api.ggml_init(_InitParams(api.ggml_tensor_overhead() * 2, None, True))
    if not ctx:
        raise MemoryError("ggml_init failed")
    try:
        buft = api.ggml_backend_dev_buffer_type(device_handle(device_index))
        with _buffer(buft, nbytes) as buf:
            tensor = api.ggml_new_tensor_1d(ctx, GGML_TYPE_I8, nbytes)
            status = api.ggml_backend_tensor_alloc(buf, tensor, api.ggml_backend_buffer_get_base(buf))
            if status != 0:
                raise RuntimeError(f"ggml_backend_tensor_alloc failed ({status})")
            yield tensor
    finally:
        api.ggml_free(ctx)


@contextlib.contextmanager
def _host_source(device_index: int, nbytes: int, pinned: bool) -> Iterator[int]:
    if not pinned:
        # Touched once so page faults are not part of the copy time.
        array = np.ones(nbytes, dtype=np.uint8)
        yield array.ctypes.data
        return
    api = _api()
    buft = api.ggml_backend_dev_host_buffer_type(device_handle(device_index))
    if not buft:
        raise NotImplementedError("device has no pinned host buffer type")
    with _buffer(buft, nbytes) as buf:
        base = api.ggml_backend_buffer_get_base(buf)
        ctypes.memset(base, 1, nbytes)
        yield base


@dataclass(frozen=True)
class CopyFigure:
    """Median time and bandwidth of copying `nbytes` host-to-device."""

    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        """GB/s (10^9 bytes per second)."""
        return self.nbytes / self.seconds / 1e9


class CopyLoop:
    """A host-to-device copy that can be repeated, for alone and concurrent measurements."""

    def __init__(self, device_index: int, nbytes: int, pinned: bool) -> None:
        self.nbytes = nbytes
        with contextlib.ExitStack() as stack:
            self._src = stack.enter_context(_host_source(device_index, nbytes, pinned))
            self._dst = stack.enter_context(_device_tensor(device_index, nbytes))
            # Both acquired: keep them until close(); a failure above frees what was taken.
            self._stack = stack.pop_all()

    def copy_seconds(self) -> float:
        """Wall seconds of one synchronous copy of the whole buffer."""
        start = time.perf_counter()
        _api().ggml_backend_tensor_set(self._dst, self._src, 0, self.nbytes)
        return time.perf_counter() - start

    def measure(self, repeats: int) -> CopyFigure:
        """Median of `repeats` copies after one untimed warm-up copy."""
        self.copy_seconds()
        return CopyFigure(self.nbytes, statistics.median(self.copy_seconds() for _ in range(repeats)))

    def close(self) -> None:
        """Free the device tensor and the host source."""
        self._stack.close()

    def __enter__(self) -> CopyLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_h2d(device_index: int, nbytes: int, pinned: bool, repeats: int = 5) -> CopyFigure:
    """Host-to-device bandwidth to ggml device `device_index` with nothing else running.

    Raises NotImplementedError when `pinned` is asked of a device without pinned memory.
    """
    with CopyLoop(device_index, nbytes, pinned) as loop:
        return loop.measure(repeats)
