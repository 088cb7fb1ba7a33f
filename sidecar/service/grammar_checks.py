"""Each new grammar is tried in a child process before the engine runs it (issue 36, P1 and P2).

What is checked and why is in sidecar/native/grammar_probe.py, the child. Here: one child, started
on the first grammar and again after one kills it; one check at a time (callers wait on a lock, off
the event loop); a wall-clock limit past which the child is killed and the grammar refused; and a
cache of verdicts, because a game sends the same few tool sets and schemas turn after turn, so a
grammar costs its check once (measured: README, "Grammars and schemas").

Remote mode never starts it: the remote server compiles its own grammars.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

import structlog

from sidecar.errors import InvalidArgument

log = structlog.get_logger("grammar")

# Past this the child is killed: its own CPU limit (grammar_probe.CHECK_CPU_S) ends a costly check
# sooner on an idle machine; this bounds a check on a PC whose cores the game and the engine hold.
WALL_LIMIT_S = 15.0
VERDICTS_KEPT = 512
WORKER_COMMAND = "_grammar-probe"
_IDLE_EXIT = "the checker had exited on its idle timer"


def probe_command() -> list[str]:
    """How to start the child: the same interpreter (or frozen binary) as this process."""
    if getattr(sys, "frozen", False):
        return [sys.executable, WORKER_COMMAND]
    return [sys.executable, "-m", "sidecar.native.grammar_probe"]


class GrammarChecks:
    """`check` returns when a grammar may run, or raises InvalidArgument saying why not."""

    def __init__(self, wall_limit_s: float = WALL_LIMIT_S) -> None:
        self.wall_limit_s = wall_limit_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._verdicts: OrderedDict[str, str | None] = OrderedDict()  # key -> refusal, None when it may run
        self._stderr_tail: ChildOutputTail | None = None
        self.checked = 0
        self.refused = 0

    def check(self, model_path: Path, grammar: str, banned: tuple[int, ...] = ()) -> None:
        key = hashlib.sha256(json.dumps([str(model_path), grammar, sorted(banned)]).encode("utf-8")).hexdigest()
        with self._lock:
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                refusal = self._verdicts[key]
            else:
                refusal = self._ask(model_path, grammar, banned)
                self._verdicts[key] = refusal
                while len(self._verdicts) > VERDICTS_KEPT:
                    self._verdicts.popitem(last=False)
        if refusal is not None:
            raise InvalidArgument(refusal)

    def _ask(self, model_path: Path, grammar: str, banned: tuple[int, ...]) -> str | None:
        self.checked += 1
        started = time.monotonic()
        refusal = self._ask_child(model_path, grammar, banned, started)
        if refusal is _IDLE_EXIT:  # the child left on its idle timer just as this check came
            refusal = self._ask_child(model_path, grammar, banned, time.monotonic())
        if refusal is not None:
            self.refused += 1
        log.info("grammar checked", ms=round((time.monotonic() - started) * 1000.0, 1), refused=refusal,
                 bytes=len(grammar))
        return refusal

    def _ask_child(self, model_path: Path, grammar: str, banned: tuple[int, ...], started: float) -> str | None:
        process = self._running()
        request = json.dumps({"model": str(model_path), "grammar": grammar, "banned": sorted(set(banned))})
        try:
            process.stdin.write(request + "\n")
            process.stdin.flush()
            line = self._reply_line(process, started + self.wall_limit_s)
        except (BrokenPipeError, OSError):
            line = ""
        if line is None:
            self._kill()
            refusal = (f"checking the grammar took more than {self.wall_limit_s:.0f} s (compiling it or trying its "
                       f"first tokens): simplify it (nested repetitions multiply its work)")
        elif not line:
            refusal = self._death_refusal(process)
        else:
            reply = json.loads(line)
            refusal = None if reply.get("ok") else str(reply.get("reason"))
        return refusal

    def _death_refusal(self, process: subprocess.Popen) -> str:
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        if code == 0:
            return _IDLE_EXIT
        if code == -signal.SIGXCPU:
            return ("checking the grammar used more CPU time than allowed (compiling it or trying its first tokens): "
                    "simplify it (nested repetitions multiply its work)")
        # An allocation refused under the child's memory bound, or llama.cpp aborting on it: either
        # way this grammar would have taken the daemon with it.
        log.warning("the grammar checker died", code=code, said=self._stderr_tail.text() if self._stderr_tail else "")
        return f"llama.cpp failed on the grammar while checking it (the checker ended with code {code}); it is refused"

    @staticmethod
    def _reply_line(process: subprocess.Popen, deadline: float) -> str | None:
        """The child's reply, "" when it died, None past the deadline."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([process.stdout], [], [], left)
            if ready:
                return process.stdout.readline()

    def _running(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        # Its own process group, so a kill takes anything it forks with it. Its stderr is read here
        # and only its tail kept: llama.cpp prints a grammar it cannot parse, whole, so with stderr
        # joined to ours a player's 79 KB grammar went into the game's log raw, and where the game
        # did not read that pipe, filled it: the checker blocked mid-print and every grammar
        # request after it waited out its deadline (tests: test_grammar_checks_output.py).
        self._process = subprocess.Popen(probe_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
                                         start_new_session=True, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
        self._stderr_tail = ChildOutputTail(self._process)
        return self._process

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._kill()


class ChildOutputTail:
    """Reads a child's stderr to its end on a thread of its own, keeping the last TAIL_CHARS."""

    TAIL_CHARS = 600

    def __init__(self, process: subprocess.Popen) -> None:
        self._tail = ""
        self._stream = process.stderr
        threading.Thread(target=self._read, name="grammar-checker-stderr", daemon=True).start()

    def _read(self) -> None:
        assert self._stream is not None
        try:
            while chunk := self._stream.read(4096):
                self._tail = (self._tail + chunk)[-self.TAIL_CHARS:]
        except (OSError, ValueError):  # closed when the child is killed
            pass

    def text(self) -> str:
        return " ".join(self._tail.split())[-self.TAIL_CHARS:]
