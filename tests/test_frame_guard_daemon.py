"""The frame-time guard on a live daemon with the real model: it watches the game that launched it
(--parent-pid), lowers its own priority, takes frame reports over gRPC and the WebSocket bridge, and
refuses impossible reports and floods with a clear error while a stream goes on to its end."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from conftest import RunningDaemon, start_daemon, stop_daemon
from no_early_stop import default_eog_ids, grpc_bias
from sidecar.api import pb, rpc
from test_transport_websocket import BridgeClient

# A game: one thread busy all the time (a busier game than any real one, so the watch sees it at once).
GAME = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"


def _stub(daemon: RunningDaemon):
    channel = grpc.insecure_channel(daemon.address)
    return channel, rpc.SidecarStub(channel), (("authorization", f"Bearer {daemon.token}"),)


def _report(**fields) -> pb.FrameReport:
    base = dict(frames=60, window_ms=1000, frame_ms_p50=9, frame_ms_p99=25, frame_ms_max=30, frames_over_budget=6,
                frame_budget_ms=16.7)
    return pb.FrameReport(**{**base, **fields})


def _scheduling(pid: int) -> set[tuple[int, int]]:
    """(nice, scheduling policy) of each of the process's threads."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        # stat's 19th field is nice and its 41st the policy; the first two precede the ")".
        values.add((int(fields[16]), int(fields[38])))
    return values


@pytest.fixture(scope="module")
def game() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", GAME])
    yield process
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def guarded(game: subprocess.Popen) -> Iterator[RunningDaemon]:
    daemon = start_daemon("--parent-pid", str(game.pid), "--stream-interval-ms", "0")
    yield daemon
    stop_daemon(daemon)


def _guard_status(daemon: RunningDaemon, until, timeout_s: float = 20.0) -> pb.FrameGuardState:
    with daemon.client(timeout_s=30) as client:
        deadline = time.monotonic() + timeout_s
        while True:
            state = client.status().frame_guard
            if until(state) or time.monotonic() > deadline:
                return state
            time.sleep(0.25)


def test_the_guard_watches_the_game_and_leaves_it_a_core(guarded: RunningDaemon) -> None:
    state = _guard_status(guarded, lambda s: s.game_busy_threads >= 1)
    cores = len(os.sched_getaffinity(guarded.process.pid)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert state.enabled and state.source == "watching the game process", state
    assert state.game_busy_threads >= 1 and state.game_busy_cores > 0.1
    assert state.max_threads == max(1, cores - state.game_busy_threads), state
    assert "busy" in state.reason and state.changes >= 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_every_daemon_thread_runs_below_the_games_priority(guarded: RunningDaemon) -> None:
    state = _guard_status(guarded, lambda s: s.low_priority)
    assert state.low_priority
    with guarded.client(timeout_s=60) as client:  # threads started for a generation are lowered too
        client.complete(pb.GenerateRequest(prompt="Hello", max_tokens=4))
    time.sleep(1.0)  # the guard's sweep runs twice a second
    # nice 19 on every thread; the idle class too where the guard took it (the game, or anything
    # else busy here, fills every core), and then on every thread.
    state = _guard_status(guarded, lambda s: True)
    assert _scheduling(guarded.process.pid) == {(19, os.SCHED_IDLE if state.idle_class else os.SCHED_OTHER)}, state


def test_frame_reports_steer_the_passes_and_a_stream_runs_to_its_end(guarded: RunningDaemon) -> None:
    channel, stub, metadata = _stub(guarded)
    request = pb.GenerateRequest(prompt="List every number from 1 to 500:\n1\n2\n", max_tokens=96,
                                 sampling=pb.SamplingParams(temperature=0, logit_bias=grpc_bias(default_eog_ids())))
    tokens, finals = [], []

    def stream() -> None:
        with guarded.client(timeout_s=300) as client:
            for chunk in client.generate(request):
                tokens.extend(chunk.token_ids)
                if chunk.HasField("final"):
                    finals.append(chunk.final)

    thread = threading.Thread(target=stream)
    thread.start()
    answers = []
    try:
        for _ in range(8):  # late frames, one report a second, as a game sends them
            answers.append(stub.ReportFrames(_report(), metadata=metadata, timeout=10))
            time.sleep(1.05)
        thread.join(300)
    finally:
        channel.close()
    assert [a.source for a in answers][-1] == "frame reports" and answers[-1].reports >= 8
    assert answers[-1].max_pass_tokens == 32, [(a.max_threads, a.max_pass_tokens, a.reason) for a in answers]
    assert answers[-1].game_frame_ms_p99 == 25 and math.isclose(answers[-1].game_over_budget_share, 0.1)
    if sys.platform.startswith("linux"):  # late frames: the idle class, on every thread, within a sweep
        state = _guard_status(guarded, lambda s: s.idle_class)
        assert state.idle_class and _scheduling(guarded.process.pid) == {(19, os.SCHED_IDLE)}, state
    assert len(finals) == 1 and finals[0].finish_reason == pb.FINISH_REASON_LENGTH and len(tokens) == 96


def test_impossible_reports_and_floods_get_clear_errors_and_nothing_else_is_lost(guarded: RunningDaemon) -> None:
    channel, stub, metadata = _stub(guarded)
    request = pb.GenerateRequest(prompt="Count: 1 2 3", max_tokens=48,
                                 sampling=pb.SamplingParams(temperature=0, logit_bias=grpc_bias(default_eog_ids())))
    with guarded.client(timeout_s=300) as client:
        stream = client.generate(request)
        first = next(stream)
        try:
            for bad, said in [(_report(frames=0), "frames"), (_report(frame_ms_p50=-4), "frame_ms_p50"),
                              (_report(frame_ms_p99=math.nan), "frame_ms_p99"), (_report(window_ms=0), "window_ms"),
                              (_report(frames_over_budget=99), "frames_over_budget")]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ReportFrames(bad, metadata=metadata, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and said in refused.value.details()
            codes = []
            for _ in range(80):
                try:
                    stub.ReportFrames(_report(frames_over_budget=0, frame_ms_p99=12), metadata=metadata, timeout=10)
                    codes.append("OK")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
                    assert "a second" in e.details()
            assert "RESOURCE_EXHAUSTED" in codes and codes.count("OK") >= 10 and set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}
            rest = list(stream)
        finally:
            channel.close()
        chunks = [first, *rest]
        assert chunks[-1].final.finish_reason == pb.FINISH_REASON_LENGTH
        assert sum(len(c.token_ids) for c in chunks) == 48
        assert client.status().frame_guard.enabled  # and the daemon answers as before


def test_reports_over_the_websocket_bridge(guarded: RunningDaemon) -> None:
    with BridgeClient(guarded.ws_address, guarded.token) as bridge:
        time.sleep(1.1)  # past the flood test's allowance
        [ok] = bridge.call("ReportFrames", {"frames": 60, "windowMs": 1000, "frameMsP50": 8, "frameMsP99": 12,
                                            "frameMsMax": 14, "frameBudgetMs": 16.7}, call_id="r1")
        assert ok["result"]["enabled"] is True and ok["result"]["source"] == "frame reports", ok
        for request, said in [({"frames": 10, "windowMs": 1000, "frameMsP50": "NaN"}, "frame_ms_p50"),
                              ({"frames": 10, "windowMs": -5}, "window_ms"),
                              ({"frames": 10, "windowMs": 1000, "frameBudgetMs": 1e6}, "frame_budget_ms")]:
            [frame] = bridge.call("ReportFrames", request, call_id="bad")
            assert frame["error"]["code"] == "INVALID_ARGUMENT" and said in frame["error"]["message"], frame
        [status] = bridge.call("GetStatus", call_id="s")
        assert int(status["result"]["frameGuard"]["reports"]) >= 1  # uint64: a string in proto3 JSON


def test_the_guard_can_be_turned_off(game: subprocess.Popen) -> None:
    daemon = start_daemon("--parent-pid", str(game.pid), "--no-frame-guard")
    try:
        time.sleep(1.5)
        channel, stub, metadata = _stub(daemon)
        try:
            answer = stub.ReportFrames(_report(), metadata=metadata, timeout=10)
        finally:
            channel.close()
        assert not answer.enabled and answer.source == "off" and answer.reports == 1
        assert answer.max_threads == 0 and answer.max_pass_tokens == 0 and not answer.low_priority
        with daemon.client() as client:
            state = client.status().frame_guard
        assert not state.enabled and "--no-frame-guard" in state.reason
        if sys.platform.startswith("linux"):
            # The main thread keeps the game's priority (the background profiler's own thread runs
            # lowered whatever the guard does: sidecar/profiler/background.py).
            assert os.getpriority(os.PRIO_PROCESS, daemon.process.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        stop_daemon(daemon)


def test_frame_budget_flag_is_checked() -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--frame-budget-ms", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "frame" in done.stderr.lower(), done.stderr

