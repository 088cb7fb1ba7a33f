"""The frame guard's rule for a load that waits for the replies (issue 40), on a live daemon: a
process busy between the replies and idle while they run does not take a core from their start.
A module of its own: test_frame_guard_daemon.py keeps a busy game running for its whole module,
and that game, running beside every reply, rightly keeps its core."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import start_daemon, stop_daemon
from test_frame_guard_daemon import GAME, _counting, _guard_status



@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core taken needs two to show")
def test_a_load_that_waits_for_the_replies_leaves_their_start_every_core() -> None:
    """Issue 40: a process busy between the replies and idle while they run (a benchmark's other
    side; here a busy loop stopped before the reply) took a core from the start of every reply.
    After one reply has run with nothing beside it, the same load between replies no longer does;
    the steady game of test_frame_guard_daemon.py still does (test_the_guard_watches_the_game_and_leaves_it_a_core)."""
    cores = len(os.sched_getaffinity(0))
    daemon = start_daemon("--stream-interval-ms", "0")
    try:
        load = subprocess.Popen([sys.executable, "-c", GAME])
        try:
            state = _guard_status(daemon, lambda s: "other processes" in s.reason)
            assert 0 < state.max_threads < cores, state
        finally:
            load.kill()
            load.wait()
        with daemon.client(timeout_s=120) as client:
            # A reply of about 2.5 s, past several watch intervals, read to its end (one still
            # running when the load comes back would have the load beside it): its length from
            # this machine's speed.
            started = time.monotonic()
            client.complete(_counting(32))
            per_token_s = (time.monotonic() - started) / 32
            client.complete(_counting(max(32, min(2000, int(2.5 / per_token_s)))))
        load = subprocess.Popen([sys.executable, "-c", GAME])
        try:
            state = _guard_status(daemon, lambda s: "waits for the replies" in s.reason)
            assert "waits for the replies" in state.reason and state.max_threads == 0, state
        finally:
            load.kill()
            load.wait()
    finally:
        stop_daemon(daemon)
