"""The GPU-device test set: llama.cpp's real placement onto a GPU-type ggml device.

The device is ggml's RPC backend serving this machine's CPU from a second process on loopback
(sidecar.native.ggml_rpc): llama.cpp lists it as RPC0, type GPU, and weights, KV cache and compute
buffers placed there really live in the server's memory. What it cannot give is a GPU's speed, so
the planner is handed a described GPU (DEVICE_HARDWARE) in place of a measured profile: the
speeds are the stand-in, the placement and the buffers are real.

Without an RPC build of llama-cpp-python these tests skip, and say so; with
XLM_REQUIRE_GPU_DEVICE=1 (CI) they fail instead. The fixtures (rpc_device, smollm2_moe_path) are
in tests/conftest.py: one RPC server for the whole test process, which registers it once (a
conftest.py of tests/gpu/ with its own would register a second).
"""

from __future__ import annotations

import threading

from sidecar.engine import Engine, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.local.measured_placement import load_within, measured_placement  # noqa: F401 (re-exported)
from sidecar.errors import SidecarError

from sidecar.native.ggml_rpc import STAND_IN_GPU_HARDWARE

# A desktop-class GPU as the planner should see RPC0 (a stand-in for speed only). 8 GiB, far
# above every budget the tests grant, so the budget is what binds.
DEVICE_HARDWARE = STAND_IN_GPU_HARDWARE
GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
MIB = 1 << 20


def greedy_reply(engine: Engine, text: str, max_tokens: int = 32,
                 banned: tuple[int, ...] = ()) -> tuple[list[int], list[int]]:
    """One greedy reply: the prompt's token ids as the engine built them, and the reply's.
    `banned`: token ids it may not choose (no_early_stop.py: the end-of-generation tokens, for a
    reply of the whole max_tokens); score it with the same ban."""
    from support.greedy_agreement import engine_prompt_tokens
    from support.no_early_stop import engine_sampling

    tokens: list[int] = []
    done = threading.Event()
    result: list[object] = []

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            tokens.extend(event.token_ids)
        else:
            result.append(event)
            done.set()

    spec = GenerationSpec(prompt=Prompt(messages=(("user", text),)), sampling=engine_sampling(GREEDY, banned),
                          max_tokens=max_tokens)
    prompt = engine_prompt_tokens(engine, spec)
    engine.submit(spec, sink)
    assert done.wait(300), "the engine never finished"
    if isinstance(result[0], SidecarError):
        raise result[0]
    assert isinstance(result[0], Finished)
    return prompt, tokens
