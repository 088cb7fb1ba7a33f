"""The GPU-device test set: llama.cpp's real placement onto a GPU-type ggml device.

The device is ggml's RPC backend serving this machine's CPU from a second process on loopback
(sidecar.ggml_rpc): llama.cpp lists it as RPC0, type GPU, and weights, KV cache and compute
buffers placed there really live in the server's memory. What it cannot give is a GPU's speed, so
the planner is handed a described GPU (DEVICE_HARDWARE) in place of a measured profile: the
speeds are the stand-in, the placement and the buffers are real.

Without an RPC build of llama-cpp-python these tests skip, and say so; with
XLM_REQUIRE_GPU_DEVICE=1 (CI) they fail instead. Test modules import the fixtures they use from
here: a conftest.py in this folder would shadow tests/conftest.py, which they import by name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.engine import Engine, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.errors import SidecarError

from sidecar.ggml_rpc import STAND_IN_GPU_HARDWARE

# A desktop-class GPU as the planner should see RPC0 (a stand-in for speed only). 8 GiB, far
# above every budget the tests grant, so the budget is what binds.
DEVICE_HARDWARE = STAND_IN_GPU_HARDWARE
GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
MIB = 1 << 20


def require_rpc() -> None:
    """Skip (or fail, under XLM_REQUIRE_GPU_DEVICE=1) without ggml's RPC backend."""
    from sidecar.ggml_rpc import rpc_available

    if rpc_available():
        return
    reason = "llama-cpp-python has no RPC backend: run ./scripts/setup (it builds one) to run the GPU-device tests"
    if os.environ.get("XLM_REQUIRE_GPU_DEVICE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def greedy_tokens(engine: Engine, text: str, max_tokens: int = 24) -> list[int]:
    """The token ids of one greedy reply."""
    tokens: list[int] = []
    done = threading.Event()
    result: list[object] = []

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            tokens.extend(event.token_ids)
        else:
            result.append(event)
            done.set()

    spec = GenerationSpec(prompt=Prompt(messages=(("user", text),)), sampling=GREEDY, max_tokens=max_tokens)
    engine.submit(spec, sink)
    assert done.wait(300), "the engine never finished"
    if isinstance(result[0], SidecarError):
        raise result[0]
    assert isinstance(result[0], Finished)
    return tokens


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


