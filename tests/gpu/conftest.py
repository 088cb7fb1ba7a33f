"""The GPU-device test set: llama.cpp's real placement onto a GPU-type ggml device.

The device is ggml's RPC backend serving this machine's CPU from a second process on loopback
(sidecar.ggml_rpc): llama.cpp lists it as RPC0, type GPU, and weights, KV cache and compute
buffers placed there really live in the server's memory. What it cannot give is a GPU's speed, so
the planner is handed a described GPU (DEVICE_HARDWARE) in place of a measured profile: the
speeds are the stand-in, the placement and the buffers are real.

Without an RPC build of llama-cpp-python these tests skip, and say so; with
XLM_REQUIRE_GPU_DEVICE=1 (CI) they fail instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from device_helpers import require_rpc

@pytest.fixture(scope="session")
def rpc_device() -> Iterator[str]:
    """RPC0, registered in this test process against a server of its own (a client keeps its one
    connection for its whole life, and a server serves one client at a time)."""
    require_rpc()
    from sidecar.ggml_rpc import RpcServerProcess, add_rpc_server

    with RpcServerProcess(threads=1) as server:
        (name,) = add_rpc_server(server.endpoint)
        yield name


@pytest.fixture(scope="session")
def smollm2_moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sidecar.testmodels import smollm2_source_path, write_smollm2_moe

    return write_smollm2_moe(tmp_path_factory.mktemp("moe") / "smollm2_moe.gguf", source=smollm2_source_path())


