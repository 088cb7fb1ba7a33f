"""A real daemon in a child process on a free port, for the test suite and the benchmarks.

Both drive `xlm-sidecar serve` the way a game does, from outside; keeping the launcher in the
installed package lets tests/conftest.py and bench/ import one copy without either putting the
other's folder on sys.path. The daemon never imports this module.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from sidecar.client import SidecarClient
from sidecar.service.auth import generate_token


@dataclass
class RunningDaemon:
    process: subprocess.Popen
    address: str
    log_lines: list[dict]
    # The token calls must carry (None when started with --no-auth, or when the daemon generated it:
    # then it is in the file named by the listening line's token_file).
    token: str | None = None
    ws_address: str | None = None
    # The thread that keeps reading the log into log_lines after start (start_daemon's drain).
    reader: threading.Thread | None = None
    # The last lines that were not our JSON log (llama.cpp's, an abort's): what a daemon that died
    # said last, for the test that saw it die.
    other_lines: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    crash_file: str | None = None

    def last_words(self) -> str:
        """Its exit status, last lines and, after a fatal signal, every thread's Python stack
        (lifecycle/crash_file.py), for a test's message when it died."""
        events = [json.dumps(e)[:400] for e in self.log_lines[-15:]]
        stacks = ""
        if self.crash_file is not None and os.path.exists(self.crash_file):
            with open(self.crash_file, encoding="utf-8", errors="replace") as f:
                stacks = f.read()[-6000:]
        return "\n".join([f"exit status {self.process.poll()}", *events, *self.other_lines, stacks])

    def wait_for_event(self, wanted: str, timeout_s: float, after: int = 0) -> dict:
        """The first log line whose event is `wanted` past the first `after` such lines, as the
        daemon writes it (a drained daemon's log is read by its thread; else here)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [e for e in list(self.log_lines) if e.get("event") == wanted]
            if len(found) > after:
                return found[after]
            if self.reader is not None:
                if self.process.poll() is not None and not self.reader.is_alive():
                    break
                time.sleep(0.02)
                continue
            line = self.process.stderr.readline() if self.process.stderr else ""
            if not line:
                break
            try:
                self.log_lines.append(json.loads(line))
            except ValueError:
                continue
        raise AssertionError(f"no {wanted!r} line within {timeout_s} s: {[e.get('event') for e in self.log_lines]}")

    def client(self, **kwargs: object) -> SidecarClient:
        kwargs.setdefault("token", self.token)
        return SidecarClient(self.address, **kwargs)


def start_daemon(
    *args: str,
    timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
    token: str | None = "auto",
    program: tuple[str, ...] = (sys.executable, "-m", "sidecar"),
    until: str = "ready",
    drain: bool = True,
) -> RunningDaemon:
    """Start `xlm-sidecar serve --port 0 ...` and wait for its `until` log line: "ready" (the model
    is loaded: calls are taken at once) or "listening" (bound; still starting).

    The daemon gets XLM_SIDECAR_TOKEN: `token`, a fresh random one for "auto", or none for None
    (then it generates its own, unless `env` sets one). `program` runs another build of the
    daemon, e.g. the frozen executable.

    With `drain` (the default) a thread keeps reading the daemon's log into `log_lines` after
    start: a pipe nobody reads fills at 64 KB, and the daemon then blocks on its next log line
    (its event loop too: GetStatus past its deadline, and a stop that took over 20 s, in CI at
    7cd68b8 and c4ee2ae, where llama.cpp printed whole refused grammars). A caller that reads
    `process.stderr` itself passes drain=False.
    """
    cmd = [*program, "serve", "--port", "0", "--log-format", "json", *args]
    env = {**os.environ, **(env or {})}
    if token == "auto":
        token = generate_token(24)
    if token is not None:
        env["XLM_SIDECAR_TOKEN"] = token
    else:
        token = env.get("XLM_SIDECAR_TOKEN")
    if "--no-auth" in args:
        token = None
    # Where the daemon writes its threads' stacks if a fatal signal ends it (last_words reads it).
    crash_file = env.setdefault("XLM_SIDECAR_CRASH_FILE",
                                os.path.join(tempfile.gettempdir(), f"xlm-sidecar-crash-{secrets.token_hex(6)}.txt"))
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines: list[dict] = []
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            raise RuntimeError(f"daemon exited with {process.wait()} before {until}: {lines}")
        try:
            event = json.loads(line)
        except ValueError:
            continue
        lines.append(event)
        if event.get("event") == until:
            listening = next(e for e in lines if e.get("event") == "listening")
            running = RunningDaemon(process, listening["address"], lines, token, listening.get("ws_address"),
                                    crash_file=crash_file)
            if drain:
                _keep_reading(running)
            return running
    process.kill()
    raise RuntimeError(f"daemon was not {until} within {timeout_s} s: {lines}")


def _keep_reading(daemon: RunningDaemon) -> None:
    def read() -> None:
        assert daemon.process.stderr is not None
        for line in daemon.process.stderr:
            try:
                daemon.log_lines.append(json.loads(line))
            except ValueError:
                daemon.other_lines.append(line.rstrip()[:400])  # llama.cpp's own, an abort's

    daemon.reader = threading.Thread(target=read, name=f"daemon-log-{daemon.process.pid}", daemon=True)
    daemon.reader.start()


def stop_daemon(daemon: RunningDaemon) -> int:
    daemon.process.terminate()
    try:
        return daemon.process.wait(timeout=20)
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
