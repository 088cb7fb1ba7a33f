"""Cancellation through either transport frees the engine: a client killed mid-stream, and many
cancels in a row, leave no sequence busy and the daemon's memory flat."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from sidecar.api import pb
from support.bridge import COUNTING, LONG_PROMPT, ONE_THREAD, BridgeClient
from support.no_early_stop import default_eog_ids, grpc_sampling, http_bias

# The default model's end-of-generation tokens banned (no_early_stop.py): every call here is
# still running when its client goes or cancels, whatever the model would say.
NO_END = http_bias(default_eog_ids())
LONG = pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=2000, sampling=grpc_sampling(default_eog_ids(), temperature=0))

GRPC_CLIENT = """
import json, sys
from sidecar.api import pb
from sidecar.client import SidecarClient
bias = {int(t): b for t, b in json.loads(sys.argv[4]).items()}
request = pb.GenerateRequest(prompt=sys.argv[3], max_tokens=2000, sampling=pb.SamplingParams(temperature=0, logit_bias=bias))
for chunk in SidecarClient(sys.argv[1], token=sys.argv[2]).generate(request):
    print("streaming", flush=True)
"""

WS_CLIENT = """
import json, sys
from websockets.sync.client import connect
with connect(sys.argv[1], additional_headers={"Authorization": "Bearer " + sys.argv[2]}) as ws:
    request = {"prompt": sys.argv[3], "maxTokens": 2000, "sampling": {"logitBias": json.loads(sys.argv[4])}}
    ws.send(json.dumps({"id": 1, "method": "Generate", "request": request}))
    while True:
        ws.recv()
        print("streaming", flush=True)
"""


@pytest.fixture(scope="module")
def daemon_() -> Iterator[RunningDaemon]:
    running = start_daemon(*ONE_THREAD, "--stream-interval-ms", "0")
    yield running
    stop_daemon(running)


def wait_until_idle(client, timeout_s: float = 30.0) -> pb.Status:
    """Poll until no request holds a sequence or waits for one; returns that status (or the last)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        idle = status.throughput.requests_active == 0 and status.throughput.requests_queued == 0
        if idle or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


@pytest.mark.parametrize("transport", ["grpc", "websocket"])
def test_a_client_killed_mid_stream_frees_its_sequence(daemon_: RunningDaemon, transport: str) -> None:
    script, address = (GRPC_CLIENT, daemon_.address) if transport == "grpc" else (WS_CLIENT, daemon_.ws_address)
    victim = subprocess.Popen(
        [sys.executable, "-c", script, address, daemon_.token, LONG_PROMPT, json.dumps(NO_END)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert victim.stdout.readline().strip() == "streaming"
        with daemon_.client(timeout_s=60) as client:
            assert client.status().throughput.requests_active == 1
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
            status = wait_until_idle(client)
        assert status.throughput.requests_active == 0
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_100_cancels_in_a_row_leave_no_sequence_behind_and_memory_flat(daemon_: RunningDaemon) -> None:
    with daemon_.client(timeout_s=120) as client, BridgeClient(daemon_.ws_address, daemon_.token) as bridge:

        def cancel_over_grpc() -> None:
            stream = client.generate(LONG)
            assert next(stream).text is not None  # mid-stream: the first chunk has come
            stream.close()  # cancels the call

        def cancel_over_websocket(i: int) -> None:
            bridge.send({"id": i, "method": "Generate", "request": {**COUNTING, "maxTokens": 2000}})
            assert "chunk" in next(bridge.frames_of(i))
            bridge.send({"id": i, "cancel": True})
            assert list(bridge.frames_of(i))[-1]["error"]["code"] == "CANCELLED"

        for i in range(10):  # warm up: allocator pools, gRPC buffers, first-use caches
            cancel_over_grpc()
            cancel_over_websocket(-i - 1)
        before = wait_until_idle(client)
        for i in range(100):  # 100 on each transport
            cancel_over_grpc()
            cancel_over_websocket(i)
        after = wait_until_idle(client)
    assert after.throughput.requests_active == 0 and after.throughput.requests_queued == 0
    assert len(after.sessions) == len(before.sessions)
    growth = after.memory.host_resident_bytes - before.memory.host_resident_bytes
    assert growth < 20 << 20, f"resident memory grew {growth / 2**20:.1f} MiB over 200 cancels"
    print(json.dumps({"rss_before_mib": before.memory.host_resident_bytes / 2**20, "growth_mib": growth / 2**20}))
