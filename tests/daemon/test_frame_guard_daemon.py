"""The frame-time guard on a live daemon with the real model: it watches the game that launched it
(--parent-pid), lowers its own priority, takes the game's frame reports over gRPC and the WebSocket
bridge, and refuses impossible reports, floods and every other client's reports with a clear error
while a stream goes on to its end.

Who is the game here: in `guarded` the busy process named by --parent-pid, which sends nothing, so
this test process reports as the game with the game token (XLM_SIDECAR_GAME_TOKEN); in `launched`
this test process itself, the daemon's parent, known by its connections. Any other client is a
child process with only the daemon's token (test_frame_reporters.py has the rule's own tests)."""

from __future__ import annotations

import json
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

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import default_eog_ids, grpc_bias
from sidecar.api import pb, rpc
from support.bridge import BridgeClient

# A game: one thread busy all the time (a busier game than any real one, so the watch sees it at once).
GAME = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"
GAME_TOKEN = "the-games-own-token-0123456789"
# Another client: reports `every frame late` twice a second over gRPC and the bridge (issue 36's
# attack), or `count` reports at once over gRPC (a flood); prints the codes it got, as JSON.
OTHER_CLIENT = """
import json, sys, time
import grpc
from websockets.sync.client import connect
from sidecar.api import pb, rpc
address, ws, token, mode, count = sys.argv[1:6]
late = pb.FrameReport(frames=30, window_ms=500, frame_ms_p50=17, frame_ms_p99=30, frame_ms_max=33,
                      frames_over_budget=30, frame_budget_ms=16.7)
codes = []
with grpc.insecure_channel(address) as channel, connect(ws, additional_headers={"Authorization": f"Bearer {token}"}) as bridge:
    stub = rpc.SidecarStub(channel)
    for i in range(int(count)):
        try:
            stub.ReportFrames(late, metadata=(("authorization", f"Bearer {token}"),), timeout=30)
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)
        if mode == "late":
            request = {"frames": 30, "windowMs": 500, "frameMsP50": 17, "frameMsP99": 30, "frameMsMax": 33,
                       "framesOverBudget": 30, "frameBudgetMs": 16.7}
            bridge.send(json.dumps({"id": i, "method": "ReportFrames", "request": request}))
            frame = json.loads(bridge.recv(timeout=30))
            codes.append(frame["error"]["code"] if "error" in frame else "OK")
            time.sleep(0.5)
print(json.dumps(codes))
"""


def _stub(daemon: RunningDaemon, token: str | None = None):
    channel = grpc.insecure_channel(daemon.address)
    return channel, rpc.SidecarStub(channel), (("authorization", f"Bearer {token or daemon.token}"),)


def _other_client(daemon: RunningDaemon, mode: str, count: int, token: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", OTHER_CLIENT, daemon.address, daemon.ws_address,
                             token or daemon.token, mode, str(count)], stdout=subprocess.PIPE, text=True)


def _codes(process: subprocess.Popen) -> list[str]:
    out, _ = process.communicate(timeout=120)
    return json.loads(out)


def _counting(max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt="List every number from 1 to 500:\n1\n2\n", max_tokens=max_tokens,
                              sampling=pb.SamplingParams(temperature=0, logit_bias=grpc_bias(default_eog_ids())))


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
    daemon = start_daemon("--parent-pid", str(game.pid), "--stream-interval-ms", "0",
                          env={"XLM_SIDECAR_GAME_TOKEN": GAME_TOKEN})
    yield daemon
    stop_daemon(daemon)


@pytest.fixture(scope="module")
def launched() -> Iterator[RunningDaemon]:
    """A daemon this process launched, as a game does: no --parent-pid, its parent is the game."""
    daemon = start_daemon("--stream-interval-ms", "0", env={"XLM_SIDECAR_GAME_TOKEN": GAME_TOKEN})
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
    channel, stub, metadata = _stub(guarded, GAME_TOKEN)
    tokens, finals = [], []

    def stream() -> None:
        with guarded.client(timeout_s=300) as client:
            for chunk in client.generate(_counting(96)):
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
    # The idle class only where the watch sees every core busy, never on late frames alone.
    state = _guard_status(guarded, lambda s: True)
    assert state.idle_class == ("in the idle scheduling class" in state.reason), state
    assert len(finals) == 1 and finals[0].finish_reason == pb.FINISH_REASON_LENGTH and len(tokens) == 96


def test_impossible_reports_and_floods_get_clear_errors_and_nothing_else_is_lost(guarded: RunningDaemon) -> None:
    channel, stub, metadata = _stub(guarded, GAME_TOKEN)
    with guarded.client(timeout_s=300) as client:
        stream = client.generate(_counting(48))
        first = next(stream)
        try:
            for bad, said in [(_report(frames=0), "frames"), (_report(frame_ms_p50=-4), "frame_ms_p50"),
                              (_report(frame_ms_p99=math.nan), "frame_ms_p99"), (_report(window_ms=0), "window_ms"),
                              (_report(frames_over_budget=99), "frames_over_budget"),
                              # 100,000 frames in a 1 ms window (issue 36: taken)
                              (_report(frames=100_000, window_ms=1, frame_ms_p50=0, frame_ms_p99=0, frame_ms_max=0,
                                       frames_over_budget=0), "frames does not fit window_ms"),
                              (_report(frame_ms_max=20), "frame_ms_p99 <= frame_ms_max"),
                              (_report(frames_over_budget=0), "frames_over_budget is 0")]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ReportFrames(bad, metadata=metadata, timeout=10)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and said in refused.value.details()
            # Another client floods (300 at once, issue 36): refused, and the game's allowance is its own.
            flood = _codes(_other_client(guarded, "flood", 300))
            assert len(flood) == 300 and set(flood) == {"PERMISSION_DENIED", "RESOURCE_EXHAUSTED"}, set(flood)
            ok = stub.ReportFrames(_report(frames_over_budget=0, frame_ms_p99=12), metadata=metadata, timeout=10)
            assert ok.source == "frame reports"
            codes = []
            for _ in range(80):  # the game's own flood
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
    with BridgeClient(guarded.ws_address, GAME_TOKEN) as bridge, BridgeClient(guarded.ws_address, guarded.token) as other:
        time.sleep(1.1)  # past the flood test's allowance
        [ok] = bridge.call("ReportFrames", {"frames": 60, "windowMs": 1000, "frameMsP50": 8, "frameMsP99": 12,
                                            "frameMsMax": 14, "frameBudgetMs": 16.7}, call_id="r1")
        assert ok["result"]["enabled"] is True and ok["result"]["source"] == "frame reports", ok
        reports = int(ok["result"]["reports"])  # uint64: a string in proto3 JSON
        for request, said in [({"frames": 10, "windowMs": 1000, "frameMsP50": "NaN"}, "frame_ms_p50"),
                              ({"frames": 10, "windowMs": -5}, "window_ms"),
                              ({"frames": 10, "windowMs": 1000, "frameBudgetMs": 1e6}, "frame_budget_ms"),
                              ({"frames": 100000, "windowMs": 1}, "frames does not fit window_ms")]:
            [frame] = bridge.call("ReportFrames", request, call_id="bad")
            assert frame["error"]["code"] == "INVALID_ARGUMENT" and said in frame["error"]["message"], frame
        # The daemon's token alone, from a connection of a process that is not the watched one.
        [refused] = other.call("ReportFrames", {"frames": 60, "windowMs": 1000, "frameMsP50": 17, "frameMsP99": 30,
                                                "frameMsMax": 33, "framesOverBudget": 60, "frameBudgetMs": 16.7})
        assert refused["error"]["code"] == "PERMISSION_DENIED", refused
        assert "XLM_SIDECAR_GAME_TOKEN" in refused["error"]["message"]
        [status] = bridge.call("GetStatus", call_id="s")
        assert int(status["result"]["frameGuard"]["reports"]) == reports
        assert status["result"]["frameGuard"]["gameFrameMsP99"] == 12  # the game's, not the other's 30


def test_only_the_game_that_launched_the_daemon_steers_it(launched: RunningDaemon) -> None:
    """Issue 36: "every frame late" twice a second from a process that is not the game, over gRPC
    and the bridge, beside a stream that must keep receiving tokens: each refused, nothing changed.
    The game (this process, the daemon's parent) reports over either, by its connection alone."""
    channel, stub, metadata = _stub(launched)
    try:
        clean = _report(frame_ms_p50=8, frame_ms_p99=12, frame_ms_max=14, frames_over_budget=0)
        first = stub.ReportFrames(clean, metadata=metadata, timeout=10)
        assert first.source == "frame reports" and first.reports == 1 and first.game_frame_ms_p99 == 12
        tokens, finals = [], []

        def stream() -> None:
            with launched.client(timeout_s=300) as client:
                for chunk in client.generate(_counting(64)):
                    tokens.append(len(chunk.token_ids))
                    if chunk.HasField("final"):
                        finals.append(chunk.final)

        thread = threading.Thread(target=stream)
        thread.start()
        attack = _codes(_other_client(launched, "late", 8))  # 4 s of it, both transports
        thread.join(300)
        assert attack == ["PERMISSION_DENIED"] * 16, attack
        assert len(finals) == 1 and sum(tokens) == 64 and finals[0].finish_reason == pb.FINISH_REASON_LENGTH
        with launched.client() as client:
            state = client.status().frame_guard
        assert state.reports == 1 and state.game_frame_ms_p99 == 12 and state.max_pass_tokens == 0, state
        # The same process with the game token is the game wherever it runs.
        named = _codes(_other_client(launched, "flood", 1, GAME_TOKEN))
        assert named == ["OK"]
        # The game, over the bridge: its connection is its own too.
        with BridgeClient(launched.ws_address, launched.token) as bridge:
            [ok] = bridge.call("ReportFrames", {"frames": 60, "windowMs": 1000, "frameMsP50": 8, "frameMsP99": 12,
                                                "frameMsMax": 14, "frameBudgetMs": 16.7})
        assert ok["result"]["source"] == "frame reports" and int(ok["result"]["reports"]) == 3, ok
    finally:
        channel.close()


def test_every_frame_late_from_the_game_keeps_the_npcs_at_half(launched: RunningDaemon) -> None:
    """The game's own reports of every frame late for 12 s: the ladder's top, and its floor. With
    nothing else busy, a thread fewer already halves the NPCs' cores, so no pause is added; where
    the machine is busy (the watch counts other processes) the pause is the ladder's."""
    channel, stub, metadata = _stub(launched)
    late = _report(frames=30, window_ms=500, frame_ms_p50=17, frame_ms_p99=30, frame_ms_max=33, frames_over_budget=30)
    try:
        answers = []
        for _ in range(24):
            answers.append(stub.ReportFrames(late, metadata=metadata, timeout=10))
            time.sleep(0.5)
    finally:
        channel.close()
    last = answers[-1]
    assert "(level 4)" in last.reason and last.max_pass_tokens == 32, [a.reason for a in answers]
    cores = len(os.sched_getaffinity(launched.process.pid)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores > 1 and "other processes" not in last.reason and not last.game_busy_threads:
        assert "pauses held to" in last.reason and last.max_threads >= cores // 2, last
    if cores == 2:  # one thread of two: no pause on top
        assert "pauses held to 0.00" in last.reason or "other processes" in last.reason or last.game_busy_threads, last


def test_the_guard_can_be_turned_off(game: subprocess.Popen) -> None:
    daemon = start_daemon("--parent-pid", str(game.pid), "--no-frame-guard", env={"XLM_SIDECAR_GAME_TOKEN": GAME_TOKEN})
    try:
        time.sleep(1.5)
        channel, stub, metadata = _stub(daemon)
        try:  # off, it still counts only the game's reports
            with pytest.raises(grpc.RpcError) as refused:
                stub.ReportFrames(_report(), metadata=metadata, timeout=10)
        finally:
            channel.close()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        channel, stub, metadata = _stub(daemon, GAME_TOKEN)
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
