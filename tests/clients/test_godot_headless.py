"""The addon inside a real Godot 4, headless: clients/godot/tests/protocol_test.tscn replays every
protocol fixture through XlmSidecarClient against a live daemon (the frames it sends must be exactly
the fixture's; the tool-call fixture goes to a second daemon, serving SmolLM2), then launches a
daemon of its own with the game's pid and a token, talks to it and stops it. Runs where a Godot 4
binary exists (GODOT4_BIN, or godot4/godot on PATH whose --version starts with 4); skipped, saying
so, elsewhere: Godot 4 cannot be installed on the project's machines, so this one stays a skip there
even when XLM_REQUIRE_CLIENT_TOOLS=1."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.daemons import REPO, RunningDaemon, start_daemon, stop_daemon

GODOT_PROJECT = REPO / "clients" / "godot"
TEST_SCENE = "res://tests/protocol_test.tscn"
DAEMON_FLAGS = ["--threads", "1", "--profile", "off"]
# Godot runs in a process the daemon did not start: it carries the game token, so its frame reports
# count (only the game's do; README, "Only the game steers the guard").
GAME_TOKEN = "godot-tests-game-token-0123456789"
GAME = {"XLM_SIDECAR_GAME_TOKEN": GAME_TOKEN}


def godot_version(binary: str) -> str:
    try:
        result = subprocess.run([binary, "--headless", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"did not run ({e})"
    return result.stdout.strip()


def find_godot4() -> tuple[str | None, str]:
    """(binary, "") for a Godot 4, else (None, why not). An explicit GODOT4_BIN that is not Godot 4
    is an error, not a reason to skip."""
    explicit = os.environ.get("GODOT4_BIN")
    if explicit:
        version = godot_version(explicit)
        if not version.startswith("4."):
            pytest.fail(f"GODOT4_BIN={explicit} is not Godot 4: --version says {version!r}")
        return explicit, ""
    seen = []
    for name in ("godot4", "godot"):
        binary = shutil.which(name)
        if binary is None:
            continue
        version = godot_version(binary)
        if version.startswith("4."):
            return binary, ""
        seen.append(f"{binary} is {version!r}")
    found = "; ".join(seen) if seen else "no godot4 or godot on PATH"
    return None, f"no Godot 4 binary to run the headless test scene ({found}; set GODOT4_BIN)"


def free_port_pair() -> int:
    """A port P with P and P + 1 free (the launched daemon's gRPC and WebSocket ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two free ports in a row")


@pytest.fixture(scope="module")
def godot() -> str:
    binary, reason = find_godot4()
    if binary is None:
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="module")
def models(model_files) -> dict[str, Path]:
    return model_files("tiny_llama", "tiny_projector")


@pytest.fixture(scope="module")
def daemon(godot: str, models: dict[str, Path]) -> Iterator[RunningDaemon]:
    running = start_daemon("--model", str(models["tiny_llama"]), "--mmproj", str(models["tiny_projector"]), *DAEMON_FLAGS,
                           env=GAME)
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def smollm2_daemon(godot: str) -> Iterator[RunningDaemon]:
    running = start_daemon("--budget", "0", *DAEMON_FLAGS, env=GAME)
    yield running
    stop_daemon(running)


def test_the_addon_passes_its_protocol_test_scene_in_headless_godot(
    godot: str, daemon: RunningDaemon, smollm2_daemon: RunningDaemon, models: dict[str, Path], tmp_path: Path
) -> None:
    # A copy, so Godot's .godot/ cache lands outside the checkout.
    project = tmp_path / "project"
    shutil.copytree(GODOT_PROJECT, project, ignore=shutil.ignore_patterns(".godot"))
    env = {k: v for k, v in os.environ.items() if k != "XLM_SIDECAR_TOKEN"}
    env.update(
        XLM_TEST_WS_URL=daemon.ws_address,
        XLM_TEST_TOKEN=GAME_TOKEN,
        XLM_TEST_VISION="1",
        XLM_TEST_SMOLLM2_WS_URL=smollm2_daemon.ws_address,
        XLM_TEST_SMOLLM2_TOKEN=GAME_TOKEN,
        XLM_TEST_DAEMON_EXE=str(Path(sys.executable).with_name("xlm-sidecar")),
        XLM_TEST_DAEMON_PORT=str(free_port_pair()),
        XLM_TEST_DAEMON_ARGS=json.dumps(["--model", str(models["tiny_llama"]), *DAEMON_FLAGS]),
    )
    result = subprocess.run(
        [godot, "--headless", "--path", str(project), TEST_SCENE],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "ALL PASSED" in result.stdout, output
