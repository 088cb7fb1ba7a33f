"""Helpers of the GPU-device tests (fixtures are in conftest.py; see its docstring)."""

from __future__ import annotations

import os
import threading

import pytest

from sidecar.engine import Engine, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.errors import SidecarError

# A desktop-class GPU as the planner should see RPC0 (a stand-in for speed only: nothing here is
# measured). 8 GiB, far above every budget the tests grant, so the budget is what binds.
DEVICE_HARDWARE = "cpu=2/2,dram=50,ram=24G,gpu=8G,gpu_bw=400,tflops=20,pcie=4.0x16,gpu_name=RPC0"
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
