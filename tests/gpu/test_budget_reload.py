"""SetBudget that really moves tensors: a daemon on RPC0 with 8 live streams, all-on-device to a
small budget and back. Each change reloads with the new placement, the device's buffers are
within the new budget by the time the call returns, no stream drops, and every stream's reply
is what the model says given its own prompt: within rounding of a plain CPU llama.cpp at every
position (greedy_agreement.py). A sequence whose KV cache was lost, swapped or restored wrong in a
reload continues from the wrong context, many logits off. Exact equality with an uninterrupted
run is not asked: part of the reply is computed on another placement, where llama.cpp's kernels
may round a near-tie the other way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.daemons import require_rpc
from support.device_helpers import DEVICE_HARDWARE, MIB
from support.greedy_agreement import CpuReference, assert_greedy_agrees
from support.no_early_stop import grpc_eog_ids, grpc_sampling

from sidecar.api import pb

STREAMS = 8
TOKENS = 96
SMALL, ALL = 24 * MIB, 4096 * MIB
# Raw prompts, so the CPU reference tokenizes them exactly as the daemon does.
PROMPTS = [f"Once upon a time, a {who} set out on a long journey. On the first day," for who in (
    "dragon", "knight", "merchant", "wizard", "thief", "baker", "sailor", "miner")]


@pytest.fixture(scope="module")
def device_daemon() -> Iterator[RunningDaemon]:
    require_rpc()
    from sidecar.native.ggml_rpc import RpcServerProcess

    with RpcServerProcess(threads=1) as server:
        daemon = start_daemon("--rpc", server.endpoint, "--hardware", DEVICE_HARDWARE, "--budget", "4G",
                              "--ctx", "512", "--parallel", str(STREAMS), "--threads", "1")
        try:
            yield daemon
        finally:
            stop_daemon(daemon)


def run_streams(client, eog: tuple[int, ...]) -> tuple[list[list[int]], list[pb.GenerationFinal | None], list[threading.Thread]]:
    """The streams, greedy with the end-of-generation tokens banned: each runs its TOKENS, so all
    are still live when the budget changes."""
    tokens: list[list[int]] = [[] for _ in range(STREAMS)]
    finals: list[pb.GenerationFinal | None] = [None] * STREAMS

    def one(i: int) -> None:
        request = pb.GenerateRequest(prompt=PROMPTS[i], max_tokens=TOKENS,
                                     sampling=grpc_sampling(eog, temperature=0.0, repeat_penalty=1.0))
        for chunk in client.generate(request):
            tokens[i].extend(chunk.token_ids)
            if chunk.HasField("final"):
                finals[i] = chunk.final

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    return tokens, finals, threads


def device_bytes(status: pb.Status) -> int:
    device = status.memory.placement_device
    return sum(d.model_bytes + d.kv_cache_bytes + d.compute_bytes + d.output_bytes
               for d in status.memory.devices if d.device == device)


@pytest.mark.slow
def test_budget_changes_move_tensors_under_live_streams(device_daemon: RunningDaemon, smollm2_path) -> None:
    with device_daemon.client(timeout_s=600) as client:
        status = client.status()
        assert status.memory.placement_device == "RPC0"
        assert device_bytes(status) > 90 * MIB, "at 4 GiB SmolLM2 should sit on the device whole"

        eog = grpc_eog_ids(client)
        tokens, finals, threads = run_streams(client, eog)
        while sum(map(len, tokens)) < STREAMS * 4:  # every stream is replying
            time.sleep(0.05)
        changes, alive = [], []
        for budget in (SMALL, ALL):
            change = client.set_budget(pb.SetBudgetRequest(vram_bytes=budget))
            alive.append(sum(t.is_alive() for t in threads))
            on_device = device_bytes(client.status())
            changes.append((budget, change.reloaded, change.pause_ms, on_device))
            assert change.reloaded, f"SetBudget {budget // MIB} MiB did not reload"
            assert on_device <= budget, f"{on_device / MIB:.1f} MiB on the device after the call for {budget // MIB} MiB returned"
        alive_during = alive[0]  # streams that went on across the first reload
        for t in threads:
            t.join(600)

    print("budget changes (budget, reloaded, pause ms, device bytes after):", changes, f"streams live during: {alive_during}")
    assert alive_during > 0, "the streams ended before the budget changed: nothing was tested"
    assert all(f is not None and f.finish_reason != pb.FINISH_REASON_CANCELLED for f in finals), "a stream was dropped"
    with CpuReference(smollm2_path) as reference:
        for i, (prompt, reply, final) in enumerate(zip(PROMPTS, tokens, finals)):
            prompt_tokens = reference.tokenize_raw(prompt)
            assert len(prompt_tokens) == final.usage.prompt_tokens
            agreement = assert_greedy_agrees(reference, prompt_tokens, reply, f"stream {i} across the reloads", banned=eog)
            print(f"stream {i}: {agreement.describe()}")
