"""Only the game steers the frame guard (issue 36): which client is the game (the watched process,
known by the client end of its connection, or the holder of the game token), the per-client
report allowance, and that a refused report changes nothing. Real sockets and processes, no daemon;
the daemon side is in test_frame_guard_daemon.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sidecar.api import pb
from sidecar.errors import PermissionDenied, ResourceExhausted
from sidecar.guard.frame_guard import GuardSettings
from sidecar.guard.game_clients import GameClients, normalize_host
from sidecar.guard.guard_task import REPORTS_PER_S, FrameGuard
from sidecar.service.caller import Caller, grpc_caller, socket_caller

# Connects to the port on argv[1], prints its own end of the connection, then holds it open.
CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""
LATE = pb.FrameReport(frames=60, window_ms=1000, frame_ms_p50=17, frame_ms_p99=30, frame_ms_max=33,
                      frames_over_budget=60, frame_budget_ms=16.7)
CLEAN = pb.FrameReport(frames=60, window_ms=1000, frame_ms_p50=8, frame_ms_p99=9, frame_ms_max=10, frame_budget_ms=16.7)
GAME = Caller("game token", None, game_token=True)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def _client(listener: socket.socket) -> tuple[subprocess.Popen, tuple[str, int], socket.socket]:
    """A process connected to `listener`: (it, its end's address, our end)."""
    process = subprocess.Popen([sys.executable, "-c", CLIENT, str(listener.getsockname()[1])],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    ours, _ = listener.accept()
    return process, ("127.0.0.1", port), ours


def test_the_game_is_the_process_that_holds_the_client_end_of_the_connection(listener: socket.socket) -> None:
    game, game_end, ours_g = _client(listener)
    other, other_end, ours_o = _client(listener)
    try:
        clients = GameClients(game.pid)
        assert clients.lookup(game_end) and not clients.lookup(other_end)
        assert not GameClients(other.pid).lookup(game_end) and GameClients(other.pid).lookup(other_end)
        assert not clients.lookup(("127.0.0.1", listener.getsockname()[1]))  # our own listening port
        assert not clients.lookup(("10.1.2.3", game_end[1]))  # that port, but from elsewhere
        # No game to watch (the daemon's own pid, none): nobody is the game by process.
        assert GameClients(None).game_pid is None and not GameClients(None).lookup(game_end)
    finally:
        for process in (game, other):
            process.kill()
            process.wait()
        ours_g.close()
        ours_o.close()
    assert not clients.lookup(game_end)  # the game is gone


def test_verdicts_are_remembered_and_lookups_are_rationed() -> None:
    clients = GameClients(None)
    clients.remember(("127.0.0.1", 5000), True, 100.0)
    assert clients.known(("127.0.0.1", 5000), 105.0) is True and clients.known(("127.0.0.1", 5000), 111.0) is None
    assert clients.known(("127.0.0.1", 5001), 105.0) is None
    now = time.monotonic()
    granted = [clients.may_look_up(now) for _ in range(20)]
    assert granted.count(True) == 5 and clients.may_look_up(now + 1.0)  # 5 a second


def test_callers_from_the_transports() -> None:
    assert grpc_caller("ipv4:127.0.0.1:5123", False).address == ("127.0.0.1", 5123)
    assert grpc_caller("ipv6:[::1]:5123", False).address == ("::1", 5123)
    assert grpc_caller("ipv6:%5B::ffff:127.0.0.1%5D:5123", True) == Caller("grpc ipv6:%5B::ffff:127.0.0.1%5D:5123",
                                                                           ("127.0.0.1", 5123), True)
    assert grpc_caller("unix:/run/x.sock", False).address is None and grpc_caller(None, False).address is None
    assert socket_caller("ws", ("::1", 7, 0, 0), False) == Caller("ws ::1:7", ("::1", 7))
    assert socket_caller("ws", "/run/x.sock", True).address is None
    assert normalize_host("::ffff:10.0.0.1") == "10.0.0.1" and normalize_host("[fe80::1%eth0]") == "fe80::1"


def _guard(game_pid: int | None = None) -> FrameGuard:
    return FrameGuard(GuardSettings(), True, game_pid, lambda limits: None, cores=2)


def _refused(guard: FrameGuard, report: pb.FrameReport, caller: Caller) -> type[Exception] | None:
    try:
        asyncio.run(guard.report(report, caller))
    except (PermissionDenied, ResourceExhausted) as e:
        return type(e)
    return None


def test_reports_from_another_client_are_refused_and_change_nothing(listener: socket.socket) -> None:
    game, game_end, ours_g = _client(listener)
    other, other_end, ours_o = _client(listener)
    try:
        guard = _guard(game.pid)
        for _ in range(10):
            assert _refused(guard, LATE, Caller("other", other_end)) is PermissionDenied
        assert _refused(guard, LATE, Caller("unix", None)) is PermissionDenied  # a Unix socket: anyone
        assert guard.state.reports == 0 and guard.state.level == 0 and guard.state.last_window is None
        answer = asyncio.run(guard.report(CLEAN, Caller("game", game_end)))  # the game, by its process
        assert answer.reports == 1 and answer.source == "frame reports" and guard.state.reporter_watched
        asyncio.run(guard.report(CLEAN, GAME))  # the game, by its token
        assert guard.state.reports == 2 and not guard.state.reporter_watched
    finally:
        for process in (game, other):
            process.kill()
            process.wait()
        ours_g.close()
        ours_o.close()
    with pytest.raises(PermissionDenied, match="XLM_SIDECAR_GAME_TOKEN"):
        asyncio.run(_guard(None).report(CLEAN, Caller("x", ("127.0.0.1", 1))))


def test_the_allowance_is_per_client_so_a_flood_does_not_use_up_the_games() -> None:
    guard = _guard(None)
    flood = [_refused(guard, CLEAN, Caller("flood", ("127.0.0.1", 1))) for _ in range(300)]
    # Refused for not being the game, and past its own allowance for flooding.
    assert flood[0] is PermissionDenied and flood.count(ResourceExhausted) >= 300 - 2 * REPORTS_PER_S
    assert _refused(guard, CLEAN, GAME) is None  # the game's allowance is its own
    assert guard.state.reports == 1
    late = [_refused(guard, CLEAN, GAME) for _ in range(40)]
    assert ResourceExhausted in late  # and the game has one too


def test_the_game_token_is_taken_for_every_call_and_marks_the_game() -> None:
    from sidecar.service.auth import Authenticator

    auth = Authenticator("the-daemons-token-0123456789", "the-games-token-0123456789")
    assert auth.accepts("the-daemons-token-0123456789") and auth.accepts("the-games-token-0123456789")
    assert not auth.accepts("another-token-0123456789") and not auth.accepts(None)
    assert auth.is_game_header("Bearer the-games-token-0123456789") and not auth.is_game("the-daemons-token-0123456789")
    assert not Authenticator("the-daemons-token-0123456789").is_game("the-daemons-token-0123456789")


@pytest.mark.parametrize(("game_token", "said"), [("short", "XLM_SIDECAR_GAME_TOKEN must be at least"),
                                                  ("the-daemons-token-0123456789", "must differ from XLM_SIDECAR_TOKEN")])
def test_a_bad_game_token_is_refused_at_launch(game_token: str, said: str, tmp_path) -> None:
    import os

    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "XLM_SIDECAR_RUNTIME_DIR": str(tmp_path),
                                            "XLM_SIDECAR_TOKEN": "the-daemons-token-0123456789",
                                            "XLM_SIDECAR_GAME_TOKEN": game_token})
    assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
