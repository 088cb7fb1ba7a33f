"""The command line as a game developer meets it: start-up failures, chat, status."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.daemons import start_daemon, stop_daemon


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, timeout=timeout)


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and "xlm-sidecar" in result.stdout


def test_a_budget_that_is_not_a_size_is_refused_with_what_is_accepted() -> None:
    result = run_cli("--budget", "lots")
    assert result.returncode == 2
    assert "512M" in result.stderr and "3GiB" in result.stderr


@pytest.mark.parametrize(
    ("make_model", "message"),
    [
        (lambda d: d / "missing.gguf", "not found"),
        (lambda d: (d / "notes.gguf").write_text("hello") and d / "notes.gguf", "not a GGUF"),
        (lambda d: d, "not a file"),
    ],
)
def test_a_bad_model_path_says_what_is_wrong_and_exits_3(tmp_path: Path, make_model, message: str) -> None:
    result = run_cli("serve", "--model", str(make_model(tmp_path)), "--port", "0", "--log-format", "json")
    assert result.returncode == 3, result.stderr
    assert message in result.stderr


def test_a_truncated_model_is_refused(tmp_path: Path, smollm2_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(smollm2_path.read_bytes()[: 4 << 20])
    result = run_cli("serve", "--model", str(truncated), "--port", "0", "--log-format", "json")
    assert result.returncode == 3, result.stderr
    assert "could not load" in result.stderr


def test_a_port_in_use_is_reported_and_exits_4() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = run_cli("serve", "--port", str(port), "--log-format", "json")
    assert result.returncode == 4, result.stderr
    assert "cannot listen" in result.stderr


def test_chat_prints_the_reply(daemon) -> None:
    result = run_cli("chat", "What is the capital of France?", "--temperature", "0", "--address", daemon.address, "--stats")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # what the model says differs by CPU; that the CLI prints it does not
    assert "tokens/s" in result.stderr


def test_status_prints_model_and_budget(daemon) -> None:
    result = run_cli("status", "--address", daemon.address)
    assert result.returncode == 0, result.stderr
    assert "llama" in result.stdout and "budget" in result.stdout


def test_chat_without_a_daemon_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("chat", "hello", "--address", f"127.0.0.1:{port}", "--timeout", "5")
    assert result.returncode == 5
    assert "no daemon" in result.stderr


def test_sigterm_stops_the_daemon_cleanly() -> None:
    running = start_daemon("--budget", "512M")
    assert running.process.poll() is None
    assert stop_daemon(running) == 0
