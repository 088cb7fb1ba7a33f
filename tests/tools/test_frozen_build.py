"""The frozen one-folder daemon (deploy/build_frozen.py) starts without the venv and streams a reply.

The build (PyInstaller, about 30 s on 2 cores) is kept in build/frozen/<fingerprint of the
sources>/ and reused while nothing it is made of changes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support.daemons import REPO, start_daemon, stop_daemon
from sidecar.api import pb
from sidecar.client import Reply

from support.no_early_stop import grpc_eog_ids, grpc_sampling

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("PyInstaller") is None and os.environ.get("XLM_REQUIRE_CLIENT_TOOLS") != "1",
    reason="PyInstaller is not installed (pip install -e '.[deploy]')",
)


def _build_script():
    spec = importlib.util.spec_from_file_location("build_frozen", REPO / "deploy" / "build_frozen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def frozen() -> Path:
    """The frozen executable, with the default model bundled: built now, or the cached build."""
    script = _build_script()
    cache = REPO / "build" / "frozen" / script.source_fingerprint(with_default_model=True)
    exe = script.executable(cache / "dist")
    if not exe.is_file():
        for stale in cache.parent.glob("*"):  # builds of older sources: 250 MB each
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        script.build(cache / "dist", cache / "work", with_default_model=True)
        took = time.monotonic() - started
        (cache / "build-seconds.txt").write_text(f"{took:.1f}\n")
        print(f"\nfrozen build took {took:.0f} s")
    return exe


def _without_python_env() -> dict[str, str]:
    """The environment of a game's launcher: no venv, no Python paths."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "XLM_SIDECAR_MODEL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = "/usr/bin:/bin"
    return env


def test_frozen_daemon_streams_a_reply(frozen: Path, tmp_path: Path) -> None:
    version = subprocess.run([str(frozen), "--version"], capture_output=True, text=True, timeout=60, env=_without_python_env())
    assert version.returncode == 0 and version.stdout.startswith("xlm-sidecar "), version
    # The vision encoder's worker process starts from the same binary; with no request it exits 0.
    worker = subprocess.run([str(frozen), "_vision-worker"], input=b"", capture_output=True, timeout=60,
                            env=_without_python_env())
    assert worker.returncode == 0, worker.stderr[-2000:]
    # No --model: the bundled SmolLM2 is the default, found inside the bundle, not in the venv.
    daemon = start_daemon(program=(str(frozen),), env={**_without_python_env(), "XLM_SIDECAR_RUNTIME_DIR": str(tmp_path)},
                          drain=False)
    try:
        loading = next(e for e in daemon.log_lines if e["event"] == "loading model")
        assert Path(loading["path"]).is_relative_to(frozen.parent), loading
        listening = next(e for e in daemon.log_lines if e["event"] == "listening")
        assert Path(listening["token_file"]).is_file()
        reply = Reply()
        with daemon.client(timeout_s=120) as client:
            # The end-of-generation tokens banned: the reply says something, whatever the model would.
            pieces = list(client.chat("Greetings, traveller! Who are you?", max_tokens=24, reply=reply,
                                      sampling=grpc_sampling(grpc_eog_ids(client), temperature=0.0)))
        assert len(pieces) >= 1 and reply.text.strip(), reply.text  # what it says differs by CPU
        assert reply.final is not None and 0 < reply.final.usage.completion_tokens <= 24
        assert reply.final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    finally:
        code = stop_daemon(daemon)
    assert code == 0
    assert not Path(listening["token_file"]).exists()  # removed on a clean stop
    tail = [json.loads(line) for line in daemon.process.stderr.read().splitlines() if line.startswith("{")]
    assert [e["event"] for e in tail][-1:] == ["stopped"], tail
