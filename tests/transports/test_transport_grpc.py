"""The gRPC edge beyond the calls themselves: reflection, deadlines, undecodable requests, the Unix
socket, and one daemon per port or socket."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from sidecar.api import pb
from support.bridge import LONG_PROMPT, ONE_THREAD
from support.no_early_stop import default_eog_ids, grpc_sampling

# Greedy with the default model's end-of-generation tokens banned: a reply runs to its max_tokens
# (a stream still runs while a test acts, a deadline passes first), whatever the model would say.
NO_END = grpc_sampling(default_eog_ids(), temperature=0)


@pytest.fixture(scope="module")
def daemon_(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    running = start_daemon(*ONE_THREAD, "--stream-interval-ms", "0")
    yield running
    stop_daemon(running)


def wait_until_idle(client, timeout_s: float = 30.0) -> pb.Status:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        if status.throughput.requests_active == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def list_services(address: str, metadata) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        [response] = list(stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=30))
    return sorted(s.name for s in response.list_services_response.service)


def test_reflection_lists_the_services_to_token_holders(daemon_: RunningDaemon) -> None:
    names = list_services(daemon_.address, [("authorization", f"Bearer {daemon_.token}")])
    assert {"xlm.v1.Sidecar", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(names)
    with pytest.raises(grpc.RpcError) as e:
        list_services(daemon_.address, None)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_passed_deadline_ends_the_stream_and_frees_its_sequence(daemon_: RunningDaemon) -> None:
    with daemon_.client(timeout_s=0.5) as hurried, pytest.raises(grpc.RpcError) as e:
        hurried.complete(pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=1000, sampling=NO_END))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with daemon_.client(timeout_s=60) as client:
        assert wait_until_idle(client).throughput.requests_active == 0


@pytest.mark.parametrize(
    ("method", "payload"),
    [
        (method, payload)
        for method in ("Generate", "GetStatus", "EndSession")
        for payload in (b"\xff\xff\xff\xff\x0f", b"\x0a\x80", b"\x0b")  # bad tag, truncated, lone group start
    ]
    + [("Generate", b"\x12\x02\xff\xfe"), ("EndSession", b"\x0a\x02\xff\xfe")],  # a string that is not UTF-8
)
def test_undecodable_requests_get_invalid_argument(daemon_: RunningDaemon, method: str, payload: bytes) -> None:
    streaming = method == "Generate"
    with grpc.insecure_channel(daemon_.address) as channel:
        path = f"/xlm.v1.Sidecar/{method}"
        call = channel.unary_stream(path) if streaming else channel.unary_unary(path)
        with pytest.raises(grpc.RpcError) as e:
            result = call(payload, metadata=[("authorization", f"Bearer {daemon_.token}")], timeout=30)
            if streaming:
                list(result)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()


def test_messages_over_the_size_limit_are_refused(daemon_: RunningDaemon) -> None:
    with daemon_.client(timeout_s=60) as client, pytest.raises(grpc.RpcError) as e:
        client.complete(pb.GenerateRequest(prompt="x" * (9 << 20)))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def longest_gap_while(daemon: RunningDaemon, action) -> tuple[float, object]:
    """Run `action()` while a stream is running; returns the longest gap between that stream's
    chunks while the action ran (seconds) and what the action returned."""
    import threading

    arrivals: list[float] = []
    started, measured = threading.Event(), threading.Event()

    def stream() -> None:
        # Leaving the loop cancels the call: the rest of its 400 tokens measured nothing (up to
        # 12 s a test on a loaded 2-core machine).
        with daemon.client(timeout_s=120) as c:
            for _ in c.generate(pb.GenerateRequest(prompt=LONG_PROMPT, max_tokens=400, sampling=NO_END)):
                arrivals.append(time.monotonic())
                started.set()
                if measured.is_set():
                    break

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert started.wait(120)
    time.sleep(0.3)
    t0 = time.monotonic()
    outcome = action()
    t1 = time.monotonic()
    time.sleep(0.3)
    measured.set()
    thread.join(180)
    during = [t for t in arrivals if t0 - 0.5 <= t <= t1 + 0.3]
    gaps = [b - a for a, b in zip(during, during[1:])]
    return max(gaps) if gaps else t1 - t0, outcome


def test_a_7_mb_prompt_is_refused_at_once_and_other_streams_keep_flowing(daemon_: RunningDaemon) -> None:
    """Issue 17 (3): a 7 MB prompt took 5.6 s to be refused while every other stream stalled as
    long (tokenized on the engine thread). Now it is refused by its size before tokenizing."""

    def refuse() -> tuple[str, str, float]:
        t0 = time.monotonic()
        with daemon_.client(timeout_s=60) as client:
            try:
                client.complete(pb.GenerateRequest(prompt="word " * ((7 << 20) // 5)))
            except grpc.RpcError as e:
                return e.code().name, e.details(), time.monotonic() - t0
        return "OK", "", time.monotonic() - t0

    gap, (code, details, took) = longest_gap_while(daemon_, refuse)
    print(f"7 MB prompt refused in {took * 1000:.0f} ms; longest chunk gap meanwhile {gap * 1000:.0f} ms; load {os.getloadavg()}")
    assert code == "INVALID_ARGUMENT"
    # The mechanism: refused by its bytes, before anything tokenized it (the tokenizer's refusal
    # names tokens, not bytes).
    assert "bytes" in details and "--max-prompt-tokens" in details, details
    # The figures are the benchmark's to judge (200 ms is the target, printed above). These bounds
    # are generous for slow and shared machines and still far below what the defect cost
    # (5.6 s to refuse, every stream stalled as long, on a 2-core machine).
    assert took < 4.0, took
    assert gap < 2.5, gap


def _oversized(kind: str) -> pb.GenerateRequest:
    """The requests of issue 29 (2-4) that slipped past the size check and stalled every stream."""
    ask = [pb.ChatMessage(role="user", content="Hello")]
    if kind == "context":  # 7 MiB of shared context: 104 s to refuse
        return pb.GenerateRequest(messages=pb.ChatMessages(messages=ask), context="word " * ((7 << 20) // 5))
    if kind == "empty messages":  # 300,000 of them, 2.4 MB: 64 s
        return pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user")] * 300_000))
    # 64 tools with 100 KB descriptions: 11 s
    return pb.GenerateRequest(messages=pb.ChatMessages(messages=ask), tools=[
        pb.Tool(name=f"t{i}", description="d" * 100_000) for i in range(64)])


@pytest.mark.parametrize("kind", ["context", "empty messages", "tool descriptions"])
def test_every_field_of_an_oversized_request_is_refused_by_one_rule(daemon_: RunningDaemon, kind: str) -> None:
    """Issue 29 (2-4): the size check counted the prompt's content bytes only. Now the whole of
    what the model would read counts (contents, roles, context, tools), and each message at least
    its template tokens: refused by size before anything renders or tokenizes it."""
    request = _oversized(kind)

    def refuse() -> tuple[str, str, float]:
        t0 = time.monotonic()
        with daemon_.client(timeout_s=120) as client:
            try:
                client.complete(request)
            except grpc.RpcError as e:
                return e.code().name, e.details(), time.monotonic() - t0
        return "OK", "", time.monotonic() - t0

    gap, (code, details, took) = longest_gap_while(daemon_, refuse)
    print(f"{kind}: refused in {took * 1000:.0f} ms; longest chunk gap meanwhile {gap * 1000:.0f} ms; load {os.getloadavg()}")
    assert code == "INVALID_ARGUMENT", (code, details)
    assert "--max-prompt-tokens" in details, details
    # Generous for slow and shared machines (the target, 200 ms, is printed), far below what the
    # defects cost: 104 s, 64 s and 11 s, every stream stalled as long.
    assert took < 5.0 and gap < 2.5, (took, gap)


def test_a_second_daemon_on_the_same_port_fails_fast_and_names_the_first(daemon_: RunningDaemon) -> None:
    port = daemon_.address.rsplit(":", 1)[1]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--port", port, "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 4, result.stderr
    assert f"pid {daemon_.process.pid}" in result.stderr
    assert "loading model" not in result.stderr  # refused before spending time on the model
    assert time.monotonic() - started < 60


def test_a_websocket_port_in_use_is_reported_and_exits_4() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--port", "0", "--ws-port", str(port), "--log-format", "json"],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 4, result.stderr
    assert "WebSocket" in result.stderr and str(port) in result.stderr


# -- Unix socket ----------------------------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to about 100 bytes: pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="xlm-") as d:
        yield Path(d)


def test_unix_socket_is_owner_only_serves_and_keeps_a_second_daemon_out(socket_dir: Path) -> None:
    path = socket_dir / "sidecar.sock"
    running = start_daemon(*ONE_THREAD, "--socket", str(path), token=None, env={"XLM_SIDECAR_RUNTIME_DIR": str(socket_dir / "run")})
    try:
        assert running.address == f"unix:{path}"
        assert running.ws_address is None  # no TCP port the game did not ask for
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        token_file = Path(next(e for e in running.log_lines if e.get("event") == "listening")["token_file"])
        assert token_file.parent == socket_dir / "run" and token_file.name.startswith("unix-")
        with running.client(timeout_s=60, token_file=token_file) as client:
            status = client.status()
            assert status.listen_addresses == [f"unix:{path}"]
            assert client.complete(pb.GenerateRequest(prompt="Hello", max_tokens=2, sampling=NO_END)).final.usage.completion_tokens == 2
        second = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--socket", str(path), "--log-format", "json"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "XLM_SIDECAR_RUNTIME_DIR": str(socket_dir / "run")},
        )
        assert second.returncode == 4 and "already serving" in second.stderr, second.stderr
        assert stat.S_ISSOCK(path.stat().st_mode)  # the second daemon did not take the socket over
        with running.client(timeout_s=60, token_file=token_file) as client:
            assert client.status().phase == pb.ENGINE_PHASE_READY
    finally:
        assert stop_daemon(running) == 0
    assert not path.exists() and not token_file.exists()


def test_a_stale_socket_file_is_replaced(socket_dir: Path) -> None:
    path = socket_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, as after a daemon that was killed
    assert path.exists()
    running = start_daemon(*ONE_THREAD, "--socket", str(path))
    try:
        with running.client(timeout_s=60) as client:
            assert client.status().phase == pb.ENGINE_PHASE_READY
    finally:
        stop_daemon(running)


def test_a_socket_path_that_is_a_regular_file_is_left_alone(socket_dir: Path) -> None:
    path = socket_dir / "notes.txt"
    path.write_text("mine")
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--socket", str(path), "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 4 and "not a socket" in result.stderr, result.stderr
    assert path.read_text() == "mine"
