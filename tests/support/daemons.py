"""What tests use to start daemons and wait on them, in one place: every test module imports these
from here (`from support.daemons import ...`), conftest.py's fixtures too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.worker_threads import THREADS

# The launcher lives in the package so bench/ shares it.
from sidecar.lifecycle.daemon_process import RunningDaemon, stop_daemon  # noqa: F401
from sidecar.lifecycle.daemon_process import start_daemon as _start_daemon
from support.suite_model import suite_model_path

REPO = Path(__file__).resolve().parents[2]


def start_daemon(*args: str, **kwargs) -> RunningDaemon:
    """sidecar.lifecycle.daemon_process.start_daemon, with `--profile off` unless the test names a profile
    (`--profile auto`, a file) or a machine (`--hardware`): the planner's defaults, the same on
    every machine, and no profiler measuring in the background beside the test. A test about
    profiles passes `--profile auto` (with its own XDG_CACHE_HOME). Under scripts/pytest-parts'
    workers, `--threads` the worker's share of the cores unless the test names its own. The suite's
    model (suite_model.py) unless the test names `--model` (or a remote server), or launches a
    program of its own (the frozen build, whose bundled default is what it tests)."""
    if not any(a in ("--profile", "--hardware") or a.startswith(("--profile=", "--hardware=")) for a in args):
        args = (*args, "--profile", "off")
    if THREADS and not any(a == "--threads" or a.startswith("--threads=") for a in args):
        args = (*args, "--threads", str(THREADS))  # the worker's share of the cores (worker_threads.py)
    if "program" not in kwargs and not any(a.startswith(("--model", "--remote-url")) for a in args):
        args = (*args, "--model", str(suite_model_path()))  # SmolLM2 in Q4_0 (suite_model.py)
    return _start_daemon(*args, **kwargs)


def wait_for_event(daemon: RunningDaemon, wanted: str, timeout_s: float) -> list[dict]:
    """Wait for a log line whose event is `wanted`; returns every line so far. Waits on what the
    daemon says it did instead of sleeping a fixed time after a signal."""
    daemon.wait_for_event(wanted, timeout_s)
    return daemon.log_lines


def require_rpc() -> None:
    """Skip (or fail, under XLM_REQUIRE_GPU_DEVICE=1, as in CI) without ggml's RPC backend."""
    from sidecar.native.ggml_rpc import rpc_available

    if rpc_available():
        return
    reason = "llama-cpp-python has no RPC backend: run ./scripts/setup (it builds one) to run the GPU-device tests"
    if os.environ.get("XLM_REQUIRE_GPU_DEVICE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
