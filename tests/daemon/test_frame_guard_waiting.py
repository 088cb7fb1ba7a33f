"""The frame guard's rule for a load between the replies (issue 40), on a live daemon: a process
busy between the replies takes no core from their start until it has run beside one.
A module of its own: test_frame_guard_daemon.py keeps a busy game running for its whole module,
and that game, running beside every reply, rightly keeps its core."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from support.daemons import start_daemon, stop_daemon
from test_frame_guard_daemon import GAME, _counting, _guard_status



def _long_reply(client) -> None:
    """A reply of about 2.5 s, past several watch intervals, read to its end (one still running
    when the load changes would have it beside): its length from this machine's speed."""
    started = time.monotonic()
    client.complete(_counting(32))
    per_token_s = (time.monotonic() - started) / 32
    client.complete(_counting(max(32, min(2000, int(2.5 / per_token_s)))))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core taken needs two to show")
def test_a_load_between_the_replies_takes_a_core_only_once_it_runs_beside_one() -> None:
    """Issue 40: a process busy between the replies (a benchmark's other side; here a busy loop,
    not the process the daemon watches) took a core from the start of every reply: first token
    1.85x and decode 0.70x of the guard off. Now it takes none until it runs beside a reply; then
    it does at once, and between replies too, until a reply runs without it. The watched game of
    test_frame_guard_daemon.py counts between replies as before."""
    cores = len(os.sched_getaffinity(0))
    daemon = start_daemon("--stream-interval-ms", "0")
    try:
        load = subprocess.Popen([sys.executable, "-c", GAME])
        try:
            state = _guard_status(daemon, lambda s: "between the replies" in s.reason)
            assert "between the replies" in state.reason and state.max_threads == 0, state
            with daemon.client(timeout_s=120) as client:
                _long_reply(client)  # the load runs beside it
            state = _guard_status(daemon, lambda s: 0 < s.max_threads < cores)
            assert 0 < state.max_threads < cores and "other processes keep" in state.reason, state
        finally:
            load.kill()
            load.wait()
        with daemon.client(timeout_s=120) as client:
            _long_reply(client)  # nothing beside it
        load = subprocess.Popen([sys.executable, "-c", GAME])
        try:
            state = _guard_status(daemon, lambda s: "between the replies" in s.reason or "waits" in s.reason)
            assert state.max_threads == 0, state
        finally:
            load.kill()
            load.wait()
    finally:
        stop_daemon(daemon)
