"""The daemon's life: following the game's process, draining on SIGTERM/SIGINT, refusing to start
with a parent that is not there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from support.daemons import start_daemon, stop_daemon, wait_for_event
from sidecar.api import pb
from support.no_early_stop import default_eog_ids, grpc_sampling
from support.bridge import COUNTING, LONG_PROMPT, ONE_THREAD, BridgeClient

def test_the_instance_lock_admits_one_holder_and_survives_a_crash(tmp_path) -> None:
    from sidecar.lifecycle.instance_lock import AlreadyServing, InstanceLock

    path = tmp_path / "port-1.lock"
    first = InstanceLock(path, "port 1")
    first.acquire()
    with pytest.raises(AlreadyServing, match=f"pid {os.getpid()}"):
        InstanceLock(path, "port 1").acquire()
    first.release()
    assert not path.exists()  # a clean stop leaves nothing behind
    # A holder that died without releasing (here: in another process) leaves its file, unlocked.
    subprocess.run(
        [sys.executable, "-c", f"from sidecar.lifecycle.instance_lock import InstanceLock; InstanceLock(__import__('pathlib').Path({str(path)!r}), 'x').acquire()"],
        check=True, timeout=60,
    )
    assert path.exists()
    second = InstanceLock(path, "port 1")
    second.acquire()
    second.release()


# The model's end-of-generation tokens banned (no_early_stop.py): a reply runs to its max_tokens,
# whatever the model would say (without the repetition penalty SmolLM2 also counts on here on the
# CPUs tried, and stops near 34 with it, but another CPU's kernels may round otherwise). Every
# daemon here serves the default model. COUNTING is the same over the WebSocket bridge.
COUNTING_SAMPLING = grpc_sampling(default_eog_ids(), temperature=0, repeat_penalty=1.0)
ENDLESS = pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=2000, sampling=COUNTING_SAMPLING)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_the_daemon_exits_within_2_s_of_its_parents_death(reaped: bool) -> None:
    parent = subprocess.Popen(["sleep", "600"])
    running = start_daemon(*ONE_THREAD, "--parent-pid", str(parent.pid))
    try:
        with running.client(timeout_s=60) as client:
            assert client.status().phase == pb.ENGINE_PHASE_READY
        parent.kill()
        if reaped:
            parent.wait()
        died = time.monotonic()
        code = running.process.wait(timeout=30)
        took = time.monotonic() - died
    finally:
        parent.kill()
        parent.wait()
        if running.process.poll() is None:
            running.process.kill()
    assert code == 0
    assert took < 2.0, f"exited {took:.2f} s after the parent"


def test_a_parent_pid_that_is_not_running_is_refused() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--port", "0", "--parent-pid", str(gone.pid), "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "--parent-pid" in result.stderr


def _stream_in_thread(client, request: pb.GenerateRequest) -> tuple[threading.Thread, threading.Event, dict]:
    """Stream `request` in a thread; the event is set at the first chunk; the dict gets 'chunks'
    and, if the call failed, 'error'."""
    first = threading.Event()
    outcome: dict = {"chunks": []}

    def run() -> None:
        try:
            for chunk in client.generate(request):
                outcome["chunks"].append(chunk)
                first.set()
        except grpc.RpcError as e:
            outcome["error"] = e.code()
        finally:
            first.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, first, outcome


def _refused_soon(call, timeout_s: float = 30.0) -> grpc.RpcError:
    """The error a call gets once the daemon refuses it (polled: the drain begins just after the
    "stopping" line is written)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            call()
        except grpc.RpcError as e:
            return e
        time.sleep(0.05)
    raise AssertionError(f"still answered {timeout_s} s after the daemon said it was stopping")


def test_sigterm_lets_calls_in_flight_finish_and_refuses_new_ones() -> None:
    running = start_daemon(*ONE_THREAD, "--grace-seconds", "120", "--stream-interval-ms", "0")
    try:
        with running.client(timeout_s=120) as client, BridgeClient(running.ws_address, running.token) as bridge:
            # The end-of-generation tokens banned: both calls reach their 40 unless shutdown cuts
            # them. (With "Once upon a time" sampled, a reply once ended at its end-of-text token
            # after 31, and the test failed with nothing wrong.)
            request = pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=40, sampling=COUNTING_SAMPLING)
            thread, first, outcome = _stream_in_thread(client, request)
            bridge.send({"id": "ws", "method": "Generate", "request": {**COUNTING, "maxTokens": 40}})
            assert "chunk" in next(bridge.frames_of("ws"))
            assert first.wait(120)
            running.process.send_signal(signal.SIGTERM)
            wait_for_event(running, "stopping", 60)
            # New calls are refused on both transports while the old ones go on.
            with running.client(timeout_s=30) as late:
                assert _refused_soon(late.status).code() == grpc.StatusCode.UNAVAILABLE
            [frame] = bridge.call("GetStatus", call_id="late")
            assert frame["error"]["code"] == "UNAVAILABLE"
            ws_frames = list(bridge.frames_of("ws"))
            thread.join(120)
        assert "error" not in outcome, outcome
        assert outcome["chunks"][-1].final.usage.completion_tokens == 40
        assert ws_frames[-1] == {"id": "ws", "end": True}
        assert ws_frames[-2]["chunk"]["final"]["usage"]["completionTokens"] == 40
        assert running.process.wait(timeout=60) == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()


def test_calls_still_running_when_the_grace_period_ends_get_a_cancelled_final_chunk() -> None:
    """Issue 17 (5): at the end of the grace period a gRPC stream ended UNAVAILABLE without a final
    chunk and a WebSocket call got only close 1001. FINISH_REASON_CANCELLED covers shutdown: each
    gets its final chunk with usage, then its terminal frame (OK status, `end`)."""
    running = start_daemon(*ONE_THREAD, "--grace-seconds", "1", "--stream-interval-ms", "0")
    try:
        with running.client(timeout_s=120) as client, BridgeClient(running.ws_address, running.token) as bridge:
            thread, first, outcome = _stream_in_thread(client, ENDLESS)
            bridge.send({"id": "ws", "method": "Generate", "request": {**COUNTING, "maxTokens": 2000}})
            assert "chunk" in next(bridge.frames_of("ws"))
            assert first.wait(120)
            running.process.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            ws_frames = list(bridge.frames_of("ws", timeout=60))
            assert running.process.wait(timeout=60) == 0
            took = time.monotonic() - stopped
            thread.join(60)
        assert "error" not in outcome, outcome
        final = outcome["chunks"][-1].final
        assert final.finish_reason == pb.FINISH_REASON_CANCELLED
        assert final.usage.completion_tokens == sum(len(c.token_ids) for c in outcome["chunks"]) > 0
        assert ws_frames[-1] == {"id": "ws", "end": True}, ws_frames[-3:]
        ws_final = ws_frames[-2]["chunk"]["final"]
        assert ws_final["finishReason"] == "FINISH_REASON_CANCELLED"
        assert int(ws_final["usage"]["completionTokens"]) > 0
        assert took < 15, took
    finally:
        if running.process.poll() is None:
            running.process.kill()


def test_during_the_grace_period_grpc_answers_unavailable_and_health_not_serving() -> None:
    """Issue 17 (8): the gRPC port closed at once on SIGTERM (connection refused, health not
    pollable). Until the grace period ends it answers: UNAVAILABLE from the daemon for new work,
    NOT_SERVING from health."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    running = start_daemon(*ONE_THREAD, "--grace-seconds", "120", "--stream-interval-ms", "0")
    try:
        with running.client(timeout_s=120) as client:
            request = pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=200, sampling=COUNTING_SAMPLING)
            thread, first, outcome = _stream_in_thread(client, request)  # still running at the checks below
            assert first.wait(120)
            running.process.send_signal(signal.SIGTERM)
            wait_for_event(running, "stopping", 60)
            with running.client(timeout_s=30) as late:
                refused = _refused_soon(lambda: late.complete(pb.GenerateRequest(prompt="Hi", max_tokens=2)))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in refused.details()  # the daemon's answer, not a refused connection
            # gRFC A6's "do not retry": the client's retry policy gives up at once, not after 5 tries.
            assert dict(refused.trailing_metadata() or ()).get("grpc-retry-pushback-ms") == "-1"
            with grpc.insecure_channel(running.address) as channel:
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
                assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
            thread.join(120)
        assert "error" not in outcome and outcome["chunks"][-1].final.usage.completion_tokens > 0
        assert running.process.wait(timeout=60) == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()


def test_a_second_sigint_skips_the_rest_of_the_grace_period() -> None:
    running = start_daemon(*ONE_THREAD, "--grace-seconds", "300")
    try:
        with running.client(timeout_s=120) as client, BridgeClient(running.ws_address, running.token) as bridge:
            # ENDLESS: a reply that ended early would leave the daemon nothing to drain.
            thread, first, _ = _stream_in_thread(client, ENDLESS)
            bridge.send({"id": "ws", "method": "Generate", "request": {**COUNTING, "maxTokens": 2000}})
            assert "chunk" in next(bridge.frames_of("ws"))
            assert first.wait(120)
            running.process.send_signal(signal.SIGINT)
            wait_for_event(running, "stopping", 60)
            assert running.process.poll() is None  # draining, within its grace period
            running.process.send_signal(signal.SIGINT)
            stopped = time.monotonic()
            # Well inside the 300 s grace: the second signal cut it short.
            assert running.process.wait(timeout=60) == 0
            print(f"exited {time.monotonic() - stopped:.2f} s after the second SIGINT")
            thread.join(60)
    finally:
        if running.process.poll() is None:
            running.process.kill()


def test_sigterm_without_calls_exits_at_once() -> None:
    running = start_daemon(*ONE_THREAD, "--grace-seconds", "300")
    started = time.monotonic()
    assert stop_daemon(running) == 0
    assert time.monotonic() - started < 15
