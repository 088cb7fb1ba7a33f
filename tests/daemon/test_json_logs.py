"""With --log-format json every line on stderr is one JSON object, whoever writes it (issue 17, 7).

Before, Python tracebacks (a library's stdlib logging, an exception in a thread, asyncio's "never
retrieved") and native writes came out as plain text between the JSON lines, and a launcher
parsing stderr line by line broke.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from support.daemons import start_daemon, stop_daemon
from support.bridge import ONE_THREAD

EVERY_KIND_OF_WRITER = r"""
import asyncio, logging, os, sys, threading, warnings
from sidecar.lifecycle.logs import configure_logging
configure_logging("json", "info")
import structlog
structlog.get_logger("daemon").info("structlog line")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("websockets.server").error("connection handler failed", exc_info=True)
    structlog.get_logger("daemon").exception("structlog with a traceback")
warnings.warn("a deprecation someone ignored")
t = threading.Thread(target=lambda: {}["missing"]); t.start(); t.join()
async def main():
    async def fail():
        raise RuntimeError("task failed")
    task = asyncio.ensure_future(fail())
    await asyncio.sleep(0.05)
    del task
asyncio.run(main())
import gc; gc.collect()
os.write(2, b"native: ggml_backend printed this\n")
os.write(2, b"two native\nlines at once\n")
print("a plain print to stderr", file=sys.stderr)
raise SystemError("uncaught at the end")
"""


def _objects(stderr: str) -> list[dict]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        value = json.loads(line)  # raises on any plain-text line
        assert isinstance(value, dict), line
        parsed.append(value)
    return parsed


def test_every_stderr_line_is_one_json_object_whoever_writes_it() -> None:
    result = subprocess.run([sys.executable, "-c", EVERY_KIND_OF_WRITER], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    events = _objects(result.stderr)
    text = " ".join(str(e.get("event")) for e in events)
    for expected in ("structlog line", "connection handler failed", "a deprecation someone ignored",
                     "uncaught exception in a thread", "native: ggml_backend printed this", "two native",
                     "lines at once", "a plain print to stderr", "uncaught exception"):
        assert expected in text, (expected, result.stderr)
    # Tracebacks travel as data inside the object, not as lines of their own.
    with_traces = [e for e in events if "exception" in e]
    assert len(with_traces) >= 4, result.stderr
    assert any("ZeroDivisionError" in json.dumps(e["exception"]) for e in with_traces)
    assert any("SystemError" in json.dumps(e["exception"]) for e in with_traces)


def test_a_daemon_with_json_logs_writes_only_json_lines() -> None:
    running = start_daemon(*ONE_THREAD, drain=False)
    with running.client(timeout_s=60) as client:
        client.status()
    assert stop_daemon(running) == 0
    rest = running.process.stderr.read()
    _objects(rest)
    assert any(e.get("event") == "stopped" for e in _objects(rest))


# A ggml abort, provoked cheaply: a tensor larger than its context's memory pool (GGML_ASSERT in
# ggml_new_object), in the very ggml libllama uses.
GGML_ABORT = r"""
import ctypes, sys
from sidecar.lifecycle.logs import configure_logging
configure_logging(sys.argv[1], "info")
from sidecar.native.ggml_devices import open_library
from sidecar.native.log_capture import install_native_log_filter
install_native_log_filter()
ggml = open_library("libggml-base")
class Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]
ggml.ggml_init.restype, ggml.ggml_init.argtypes = ctypes.c_void_p, [Params]
ggml.ggml_new_tensor_1d.restype = ctypes.c_void_p
ggml.ggml_new_tensor_1d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
ggml.ggml_new_tensor_1d(ggml.ggml_init(Params(1024, None, False)), 0, 1 << 20)
"""


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_native_abort_is_one_line_without_a_debugger_and_json_under_json_logs(fmt: str) -> None:
    # Before, ggml forked gdb on every abort: about 58 raw lines of backtrace on stderr, and under
    # JSON logs the abort message itself was lost with the pipe's reader (issue 36, P10).
    done = subprocess.run([sys.executable, "-c", GGML_ABORT, fmt], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "GGML_NO_BACKTRACE"})
    assert done.returncode == -signal.SIGABRT, done.stderr
    assert "GGML_ASSERT" in done.stderr, done.stderr
    for noise in ("gdb", "#0 ", "Inferior", "libthread_db"):
        assert noise not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 3, done.stderr
    if fmt == "json":
        events = _objects(done.stderr)
        [crash] = [e for e in events if "GGML_ASSERT" in e["event"]]
        assert crash["level"] == "error" and crash["logger"] == "ggml", crash
