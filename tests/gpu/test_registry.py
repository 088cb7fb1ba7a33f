"""The ggml we read and register devices in is the one llama.cpp uses.

llama-cpp-python's wheel ships libggml.so, libggml.so.0 and libggml.so.0.x.y as separate files;
libllama links libggml.so.0. Opening libggml.so by path loads a second ggml with a registry of its
own: a device registered there is invisible to llama.cpp (seen: "offloaded 31/31 layers to GPU"
while every layer stayed on the CPU).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from sidecar.backend.load_report import parse_load_log
from sidecar.native.model import NativeModel
from sidecar.native.ggml_devices import _mapped_files, gpu_device_names, library_path, llama_lib_dir


def test_the_libraries_we_open_are_the_sonames_libllama_links() -> None:
    import llama_cpp  # noqa: F401 (maps libllama and what it links)

    mapped = {p.name for p in _mapped_files()}
    for stem in ("libggml", "libggml-base", "libggml-cpu"):
        path = library_path(stem)
        assert path.name == f"{stem}.so.0" and path.name in mapped, f"{path} is not the copy libllama runs"


@pytest.mark.slow
def test_a_device_we_register_is_where_llama_cpp_places(rpc_device: str, smollm2_path: Path) -> None:
    assert rpc_device in gpu_device_names()
    model = NativeModel(smollm2_path, n_gpu_layers=99)
    try:
        report = parse_load_log(model.load_log)
    finally:
        model.close()
    assert report.device_bytes(rpc_device) > 50 << 20, "llama.cpp did not place onto the device we registered"
    assert set(report.layer_devices.values()) == {rpc_device}


def test_a_second_copy_of_ggml_does_not_see_it(rpc_device: str) -> None:
    plain = llama_lib_dir() / "libggml.so"
    ours = library_path("libggml")
    if not plain.exists() or os.path.samefile(plain, ours):
        pytest.skip("this build has no separate libggml.so to be fooled by")
    other = ctypes.CDLL(str(plain))
    other.ggml_backend_dev_count.restype = ctypes.c_size_t
    other.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    other.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    # The trap this module guards against: the same names, another registry.
    assert not other.ggml_backend_dev_by_name(rpc_device.encode())
