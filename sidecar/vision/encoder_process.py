"""The parent's handle on the vision worker process (encode_worker.py): one encode at a time,
answered on a thread of its own, killed on cancel.

The process is started before the first image and again right after a cancel kills it: a start
costs seconds on a busy machine (the interpreter, llama.cpp, the vocabulary), which would
otherwise land on the player's question. Idle, it holds about 60 MB of host memory and no weights:
with VLMOpt the encoder's weights are loaded for each image and freed after it; a resident encoder
stays loaded in the child.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace

import psutil
import structlog

from sidecar import errors
from sidecar.vision.encode_worker import EncodeFailed, EncodeRequest, read_message, worker_command, write_message
from sidecar.vision.encoder import EncodedImage, EncoderStats

log = structlog.get_logger("vision")

Outcome = EncodedImage | errors.SidecarError
Done = Callable[[Outcome, EncoderStats | None], None]


def _as_error(failure: EncodeFailed) -> errors.SidecarError:
    kind = getattr(errors, failure.kind, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.SidecarError)):
        kind = errors.EngineFailure
    return kind(failure.message)


class EncoderProcess:
    """Thread-safe: `start` is called from the engine thread, `done` runs on the reply thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._busy = False
        self._generation = 0  # bumped by cancel: a late reply of a killed encode is dropped

    def start(self, request: EncodeRequest, done: Done) -> None:
        """Begin encoding; `done(outcome, stats)` is called exactly once unless cancelled first."""
        with self._lock:
            if self._busy:
                raise RuntimeError("the vision worker encodes one image at a time")
            self._busy = True
            generation = self._generation
            try:
                process = self._running()
                process.xlm_reading = True
                write_message(process.stdin, request)
            except (OSError, ValueError) as e:
                self._busy = False
                if self._process is not None:
                    self._process.xlm_reading = False
                self._kill_locked()
                done(errors.EngineFailure(f"the vision worker could not start: {e}"), None)
                return
        threading.Thread(target=self._await_reply, args=(process, generation, done), name="xlm-vision-reply",
                         daemon=True).start()

    def _running(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        # A fresh child, in its own process group so a kill takes any helper it forks with it. Its
        # stderr (llama.cpp's lines, not in the daemon's log format) is kept for the error report.
        stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            env={**os.environ, "OMP_WAIT_POLICY": "passive"}, start_new_session=True,
        )
        self._process.xlm_stderr = stderr
        return self._process

    def _await_reply(self, process: subprocess.Popen, generation: int, done: Done) -> None:
        try:
            reply = read_message(process.stdout)
        except Exception:  # EOF from a kill or a crash, or a reply that does not unpickle
            reply = None
            process.stdout.close()  # a kill ends the read with EOF; the child is gone
        finally:
            process.xlm_reading = False
        with self._lock:
            if generation != self._generation:
                return  # cancelled: the engine has already moved on
            self._busy = False
            if reply is None:
                self._kill_locked()
        if reply is None:
            self.prestart()  # the next image should not wait for a start
            code = process.poll()
            done(errors.EngineFailure(f"the vision worker died while encoding (exit {code}): {_stderr_tail(process)}"), None)
        elif isinstance(reply, EncodeFailed):
            done(_as_error(reply), None)
        else:
            encoded, stats = reply
            done(encoded, stats)

    def cancel(self) -> None:
        """Stop the encode in flight now: the child is killed, its reply never delivered."""
        with self._lock:
            if not self._busy:
                return
            self._generation += 1
            self._busy = False
            self._kill_locked()
        log.info("image encode cancelled; vision worker stopped")
        self.prestart()

    def prestart(self) -> None:
        """Have an idle child ready for the next image."""
        with self._lock:
            try:
                self._running()
            except OSError as e:  # reported again, to the request, when an image comes
                log.warning("the vision worker could not start", error=str(e))

    def _kill_locked(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.stdin.close()
        except OSError:
            pass
        if not self._busy_reading(process):
            process.stdout.close()
        process.wait()

    @staticmethod
    def _busy_reading(process: subprocess.Popen) -> bool:
        # The reply thread owns stdout while an encode is in flight (it closes it itself); closing
        # it under that thread's read would wait for the read.
        return getattr(process, "xlm_reading", False)

    def resident_bytes(self) -> int:
        """The worker's resident memory now (0: none running): it is a process of its own, so the
        daemon's own resident figure does not count it."""
        process = self._process
        if process is None or process.poll() is not None:
            return 0
        try:
            return psutil.Process(process.pid).memory_info().rss
        except psutil.Error:
            return 0  # it ended meanwhile

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            self._busy = False
            self._kill_locked()


def _stderr_tail(process: subprocess.Popen) -> str:
    try:
        process.xlm_stderr.seek(0)
        lines = process.xlm_stderr.read().decode(errors="replace").strip().splitlines()
    except (OSError, ValueError, AttributeError):
        return ""
    return " | ".join(lines[-3:])


def merged_stats(total: EncoderStats, reported: EncoderStats | None, resident: bool) -> EncoderStats:
    """The engine's running encoder stats after one more image from the child."""
    if reported is None:
        return total
    return replace(total, images_encoded=total.images_encoded + 1, last_encode_ms=reported.last_encode_ms,
                   last_load_ms=reported.last_load_ms,
                   compute_buffer_bytes=reported.compute_buffer_bytes or total.compute_buffer_bytes,
                   loaded=resident)
