"""With JSON logs, every line on stderr is one JSON object, whoever writes it.

A launcher reads our stderr line by line and parses each line; one plain-text line (a traceback, a
warning, a library's own logging, gRPC's C core or llama.cpp printing before its log callback is
installed) breaks it. Two layers make sure none gets through:

- Python's own ways of printing go through structlog: stdlib logging (websockets, grpc, asyncio's
  "exception was never retrieved", warnings via logging.captureWarnings), sys.excepthook and
  threading.excepthook, each with its traceback as structured data.
- Everything else that writes to file descriptor 2 (native code, a stray print) lands in a pipe;
  a thread reads it and passes on JSON object lines as they are and wraps any other line as
  {"event": <line>, "logger": "stderr"}. structlog itself writes to the real stderr directly, so
  the daemon's own log never waits on that thread.

A native crash can take the last unread bytes of the pipe with it. ggml's aborts (GGML_ASSERT,
GGML_ABORT: the crashes llama.cpp reports) do not: their message comes to `FdCapture.fatal`
through ggml's abort callback (native/log_capture.py), which lets the reader empty the pipe and
then writes the message itself, as one error object, before the process dies.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import datetime
import json
import logging
import os
import sys
import threading
import time

import structlog


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def as_json_line(line: str, logger: str = "stderr") -> str:
    """`line` unchanged when it is already one JSON object, else wrapped as one (no newline)."""
    text = line.rstrip("\r\n")
    with contextlib.suppress(ValueError):
        if isinstance(json.loads(text), dict):
            return text
    return json.dumps({"event": text, "level": "warning", "logger": logger, "timestamp": _timestamp()},
                      ensure_ascii=False)


class _StructlogHandler(logging.Handler):
    """stdlib logging records, rendered by structlog as one JSON object each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            logger = structlog.get_logger(record.name)
            method = {"DEBUG": logger.debug, "INFO": logger.info, "WARNING": logger.warning}.get(record.levelname, logger.error)
            method(record.getMessage(), exc_info=record.exc_info or None)
        except Exception:  # logging must never raise into the code that logged
            self.handleError(record)


def route_python_output() -> None:
    """Send stdlib logging, warnings and uncaught exceptions (main thread and others) to structlog."""
    logging.basicConfig(handlers=[_StructlogHandler()], level=logging.WARNING, force=True)
    logging.captureWarnings(True)
    log = structlog.get_logger("python")

    def excepthook(kind, value, tb) -> None:
        log.error("uncaught exception", exc_info=(kind, value, tb))

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        thread = args.thread.name if args.thread is not None else "?"
        log.error("uncaught exception in a thread", thread=thread,
                  exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


class _LineWriter:
    """A text stream on a file descriptor that writes whole lines only, each in one write under
    a lock, so lines from structlog and from the pipe's reader never interleave."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._pending = threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._pending, "text", "") + text
        head, newline, rest = pending.rpartition("\n")
        self._pending.text = rest
        if newline:
            data = (head + newline).encode("utf-8", errors="backslashreplace")
            with self._lock:
                while data:
                    data = data[os.write(self._fd, data):]
        return len(text)

    def flush(self) -> None:
        pass  # only whole lines are written, and at once


class FdCapture:
    """Points file descriptor 2 at a pipe whose lines are re-emitted as JSON on the real stderr.
    `real` is a text stream on the real stderr for the structured log itself."""

    def __init__(self) -> None:
        self._real_fd = os.dup(2)
        self.real = _LineWriter(self._real_fd)
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._reader = threading.Thread(target=self._pump, args=(read_fd,), name="stderr-json", daemon=True)
        self._reader.start()
        atexit.register(self.close)

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = as_json_line(raw.decode("utf-8", errors="replace"))
                with contextlib.suppress(OSError, ValueError):
                    self.real.write(line + "\n")

    def fatal(self, message: str, logger: str, drain_s: float = 0.5) -> None:
        """Write `message` as an error object straight to the real stderr, once what native code
        wrote to the pipe before it is out (or `drain_s` has passed): the process is about to die,
        and the reader thread with it."""
        deadline = time.monotonic() + drain_s
        with contextlib.suppress(OSError, ValueError):
            while _unread_bytes(self._read_fd) and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.02)  # the reader has the last bytes; let it write their line
        line = json.dumps({"event": message.rstrip("\r\n"), "level": "error", "logger": logger,
                           "timestamp": _timestamp()}, ensure_ascii=False)
        with contextlib.suppress(OSError, ValueError):
            self.real.write(line + "\n")

    def close(self, timeout_s: float = 2.0) -> None:
        """Put the real stderr back on fd 2 (closing the pipe's last writer) and let the reader
        write out what is left."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.dup2(self._real_fd, 2)
        self._reader.join(timeout_s)


def _unread_bytes(fd: int) -> int:
    """Bytes in the pipe the reader has not taken yet (0 where FIONREAD is not there: Windows)."""
    try:
        import fcntl
        import termios
    except ImportError:
        return 0
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    return buf[0]


_capture: FdCapture | None = None


def active_capture() -> FdCapture | None:
    """The fd 2 capture when JSON logs installed one, else None."""
    return _capture


def capture_fd2() -> FdCapture:
    """Install the fd 2 capture once per process; returns it (its `real` stream is for structlog)."""
    global _capture
    if _capture is None:
        _capture = FdCapture()
    return _capture
