"""ggml's RPC backend: a device on another process (or machine) that llama.cpp treats as a GPU.

A server exposes this machine's CPU device over TCP; a client registers the endpoint and llama.cpp
lists it as "RPC0", type GPU. Weights, KV cache and compute buffers placed there really live in
the server's memory, so placement, per-device buffers and reloads that move tensors can be run and
checked without a GPU (tests/gpu/). The RPC device reports host RAM as its memory (free = total,
never moving) and has no op offload, and one server serves one client connection at a time.

    python -m sidecar.native.ggml_rpc --endpoint 127.0.0.1:50052 --threads 1     # the server

`xlm-sidecar serve --rpc 127.0.0.1:50052` registers it in the daemon, as llama.cpp's `--rpc` does.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from sidecar.native.ggml_devices import (
    buffer_type_name,
    cpu_device_handle,
    ggml_libraries,
    library_path,
    list_ggml_devices,
    open_library,
)


# How the planner should see an RPC device that stands in for a GPU (`serve --hardware`): a
# desktop-class GPU of 8 GiB on PCIe 4.0 x16. Only the speed is made up (the RPC device runs at
# CPU speed); the placement, the buffers and the reloads it leads to are real. Two cores, one
# thread each side: two each thrash OpenMP's barriers on a 2-core machine.
STAND_IN_GPU_HARDWARE = "cpu=2/2,dram=50,ram=24G,gpu=8G,gpu_bw=400,tflops=20,pcie=4.0x16,gpu_name=RPC0"


class RpcUnavailable(RuntimeError):
    """This llama-cpp-python was built without GGML_RPC (scripts/setup builds it with RPC)."""


def rpc_library() -> ctypes.CDLL:
    """libggml-rpc with the prototypes we call, or RpcUnavailable."""
    try:
        library_path("libggml-rpc")
    except FileNotFoundError as e:
        raise RpcUnavailable(f"llama-cpp-python was built without ggml's RPC backend: {e}") from None
    rpc = open_library("libggml-rpc")
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
    ]
    return rpc


def rpc_available() -> bool:
    """True when the installed llama.cpp has the RPC backend."""
    try:
        rpc_library()
    except RpcUnavailable:
        return False
    return True


@lru_cache(maxsize=None)
def add_rpc_server(endpoint: str) -> tuple[str, ...]:
    """Register the RPC server at `endpoint` ("host:port") in llama.cpp's registry, once per
    process; returns the names of the devices it added ("RPC0"). The server must be up."""
    rpc = rpc_library()
    ggml, _ = ggml_libraries()
    before = {d.name for d in list_ggml_devices()}
    reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise RuntimeError(f"ggml could not reach the RPC server at {endpoint}")
    ggml.ggml_backend_register(reg)  # add_server returns an unregistered entry, as llama.cpp's --rpc does
    # list_ggml_devices reads (and keeps) each new device's fixed memory figure now, and
    # buffer_type_name its buffer type's name, before any engine shares the connection.
    added = tuple(d.name for d in list_ggml_devices() if d.name not in before)
    for name in added:
        buffer_type_name(name)
    return added


def serve_forever(endpoint: str, threads: int, cache_dir: str | None = None) -> None:
    """Serve this machine's CPU device at `endpoint` until the process is killed."""
    rpc = rpc_library()
    devices = (ctypes.c_void_p * 1)(cpu_device_handle())
    rpc.ggml_backend_rpc_start_server(
        endpoint.encode(), cache_dir.encode() if cache_dir else None, threads, 1, devices
    )


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServerProcess:
    """An RPC server in a child process on a free loopback port; a context manager that stops it.

    One server per client process: a client holds its connection for its whole life, and the
    server serves one connection at a time."""

    def __init__(self, threads: int = 1, python: str = sys.executable) -> None:
        self.port = free_loopback_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [python, "-m", "sidecar.native.ggml_rpc", "--endpoint", self.endpoint, "--threads", str(threads)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        self._wait_listening()

    def _wait_listening(self, timeout_s: float = 60.0) -> None:
        # A plain TCP probe: the server takes it as a client that says nothing and hangs up, then
        # accepts the next connection.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the RPC server exited with {self.process.returncode}: {self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the RPC server did not listen on {self.endpoint} within {timeout_s} s")

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()

    def __enter__(self) -> RpcServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sidecar.native.ggml_rpc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="127.0.0.1:50052", help="host:port to listen on (keep it on loopback)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the device's kernels")
    parser.add_argument("--cache-dir", type=Path, default=None, help="tensor cache folder (default: none)")
    args = parser.parse_args(argv)
    serve_forever(args.endpoint, args.threads, str(args.cache_dir) if args.cache_dir else None)


if __name__ == "__main__":
    main()
