"""A daemon that dies of a fatal signal leaves every thread's Python stack in its crash file
(lifecycle/crash_file.py): CI's grammar fuzz saw "exit status -6" and nothing else, because the
C++ exception's message went into a pipe the dying process no longer read. A daemon that stops
normally leaves no file."""

from __future__ import annotations

import os
import signal

from support.daemons import start_daemon, stop_daemon


def test_a_fatal_signal_leaves_the_stacks_and_a_clean_stop_leaves_nothing() -> None:
    running = start_daemon("--threads", "1", "--no-frame-guard")
    assert running.crash_file is not None and os.path.exists(running.crash_file)
    assert stop_daemon(running) == 0
    assert not os.path.exists(running.crash_file), "a clean stop left its crash file"

    running = start_daemon("--threads", "1", "--no-frame-guard")
    os.kill(running.process.pid, signal.SIGABRT)
    assert running.process.wait(60) == -signal.SIGABRT
    words = running.last_words()
    assert "Current thread" in words and "sidecar/cli.py" in words, words[-2000:]
    os.unlink(running.crash_file)
