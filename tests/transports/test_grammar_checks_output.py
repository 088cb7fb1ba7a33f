"""A grammar llama.cpp cannot parse is printed by it whole (fprintf to stderr, past our log
filter). With the grammar checker's stderr joined to the daemon's, a player's 79 KB grammar went
into the game's log raw, and where the game did not read the daemon's stderr the pipe filled: the
checker blocked mid-print and every grammar request after it waited out its deadline
(DEADLINE_EXCEEDED six times in a row, and a stop that took over 20 s). Now the daemon reads the
checker's output itself and keeps only its tail."""

from __future__ import annotations

import grpc

from support.daemons import start_daemon, stop_daemon
from sidecar.api import pb

# 8,000 alternatives and an unclosed group: refused by llama.cpp's parser, after it prints it all.
UNPARSABLE = "root ::= " + " | ".join(f'"w{i}"' for i in range(8000)) + " | ("


def test_refused_grammars_do_not_fill_a_pipe_nobody_reads() -> None:
    # drain=False: the daemon's stderr is a pipe this test never reads, as a game's may be.
    daemon = start_daemon("--threads", "1", "--ctx", "512", "--parallel", "2", drain=False)
    try:
        with daemon.client(timeout_s=20) as client:
            for i in range(6):  # ~470 KB of grammar text: the 64 KB pipe would have filled at once
                try:
                    client.complete(pb.GenerateRequest(prompt="a", max_tokens=2, grammar=UNPARSABLE + " " * i))
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
                    assert "could not be parsed" in e.details()
                else:
                    raise AssertionError("an unparsable grammar was accepted")
            client.complete(pb.GenerateRequest(prompt="a", max_tokens=2))  # and the daemon serves on
    finally:
        assert stop_daemon(daemon) == 0
