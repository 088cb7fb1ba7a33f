"""A fuzz target for caller-written grammars (issue 36): unsatisfiable ones, token ids in and out
of the vocabulary, nested repetitions, long chains of optional rules and wide alternations, mixed
with grammars that hold, sent over gRPC and the WebSocket bridge while an NPC streams beside them.

The run ends with its tally: requests, crashes, hangs, stalls (the streaming NPC waiting more than
STALL_LIMIT_MS, or 8 times its typical gap on a machine where that is more, again when the grammar
is sent a second time) and undocumented codes; each must stay at zero. Gaps that did not come back
are counted apart, as one-off gaps. Kept to about a minute so CI runs it every time.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.run_summary import record_tally
from sidecar.api import pb
from support.stream_heartbeat import Heartbeat
from support.bridge import BridgeClient

STALL_LIMIT_MS = 200.0
# derandomize: the same 40 grammars every run, so a CI verdict says what changed in the code, not
# what the dice drew; XLM_GRAMMAR_FUZZ_RANDOM=1 draws afresh to hunt. Drawn at random, CI's daemon
# died in 3 of 5 runs (SIGABRT, no message): the hunt found `root ::= <[17]>{5}` (jump-forward
# handed llama.cpp's grammar the tokenizer's "!!", which it refuses by throwing) and, beside it,
# tokens llama.cpp's grammar allows and then cannot accept (grammar_accept.py). Both are @examples,
# run every time.
FUZZ = settings(deadline=None, database=None, max_examples=40,
                derandomize=not os.environ.get("XLM_GRAMMAR_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TALLY: Counter[str] = Counter()
FAILURES = ("crashes", "hangs", "stalls", "undocumented codes")

literal = st.sampled_from(['"a"', '"yes"', '"\\x00"', '"🐉"', "[a-z]", "[^\\x00-\\U0010FFFF]", "[0-9]", '"\\""'])
token_ref = st.sampled_from([1, 17, 49151, 49152, 999999, 2**31 - 1]).map(lambda t: f"<[{t}]>")
atom = literal | token_ref
counts = st.integers(0, 5) | st.integers(20, 60) | st.integers(900, 2500)


def _chain(n: int, item: str) -> str:
    return "root ::= r0\n" + "".join(f"r{i} ::= {item}? r{i + 1}\n" for i in range(n)) + f"r{n} ::= {item}\n"


grammars = st.one_of(
    atom.map(lambda a: f"root ::= {a}"),
    st.tuples(atom, atom).map(lambda p: f"root ::= {p[0]} {p[1]}"),
    st.tuples(atom, counts, counts).map(lambda p: f"root ::= ({p[0]}{{0,{p[1]}}}){{0,{p[2]}}}"),
    st.tuples(atom, counts).map(lambda p: f"root ::= {p[0]}{{{p[1]}}}"),
    st.tuples(counts, atom).map(lambda p: _chain(p[0], p[1])),
    counts.map(lambda n: "root ::= " + " | ".join(f'"w{i}"' for i in range(max(n, 1) * 10))),
    st.sampled_from(["root ::= (\"a\"*)*", "root ::= (\"a\"+)+ \"b\"", "root ::= x\nx ::= \"(\" x \")\" | \"\"",
                     'root ::= "Aye" | "Nay"', "root ::= [a-z]+"]),
)


@pytest.fixture(scope="module")
def fuzzed(request: pytest.FixtureRequest) -> Iterator[tuple[RunningDaemon, Heartbeat]]:
    running = start_daemon("--threads", "1", "--max-tokens-per-request", "64", "--ctx", "512", "--parallel", "3",
                           "--stream-interval-ms", "0", "--no-frame-guard")
    beat = Heartbeat(running)
    yield running, beat
    beat.stop()
    alive = running.process.poll() is None
    TALLY["crashes"] += not alive
    record_tally(request.config, "grammar fuzz tally", {k: TALLY[k] for k in ("requests", *FAILURES, "one-off gaps")})
    assert alive, f"the daemon died during the grammar fuzz:\n{running.last_words()}"
    assert stop_daemon(running) == 0


def _send(daemon: RunningDaemon, grammar: str, transport: str, temperature: float) -> str:
    if transport == "grpc":
        request = pb.GenerateRequest(prompt="a", max_tokens=4, grammar=grammar,
                                     sampling=pb.SamplingParams(temperature=temperature))
        with daemon.client(timeout_s=60) as client:
            try:
                client.complete(request)
            except grpc.RpcError as e:
                return e.code().name
            except Exception:  # noqa: BLE001 - a transport failure here means the daemon went away
                return "CRASH"
        return "OK"
    with BridgeClient(daemon.ws_address, daemon.token) as client:
        try:
            last = client.call("Generate", {"prompt": "a", "maxTokens": 4, "grammar": grammar,
                                            "sampling": {"temperature": temperature}})[-1]
        except TimeoutError:
            return "DEADLINE_EXCEEDED"
    return last["error"]["code"] if "error" in last else "OK"


@FUZZ
@given(grammar=grammars, transport=st.sampled_from(["grpc", "websocket"]), temperature=st.sampled_from([0.0, 0.8]))
@example(grammar="root ::= <[17]>{5}", transport="grpc", temperature=0.0)
@example(grammar="root ::= <[17]>{3}", transport="websocket", temperature=0.8)
@example(grammar='root ::= "!" <[10095]>', transport="grpc", temperature=0.8)
@example(grammar='root ::= "a" !<[2]>', transport="grpc", temperature=0.8)
def test_fuzzed_grammars_never_crash_or_stall_the_daemon(fuzzed, grammar: str, transport: str,
                                                         temperature: float) -> None:
    import time

    daemon, beat = fuzzed
    before = {k: TALLY[k] for k in FAILURES}
    started = time.monotonic()
    code = _send(daemon, grammar, transport, temperature)
    ended = time.monotonic()
    time.sleep(0.2)  # the NPC's next token: a stall shows as the gap up to it
    gap = beat.longest_gap_ms(started, ended)
    TALLY["requests"] += 1
    if code == "DEADLINE_EXCEEDED":
        TALLY["hangs"] += 1
    elif code in ("UNAVAILABLE", "CRASH") or daemon.process.poll() is not None:
        TALLY["crashes"] += 1
    elif code not in ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
        TALLY["undocumented codes"] += 1
    limit = max(STALL_LIMIT_MS, 8 * beat.typical_gap_ms())
    stalled = gap > limit
    if stalled and code not in ("CRASH", "UNAVAILABLE"):
        # A stall the grammar causes comes back when it is sent again; one from this shared
        # 2-core machine (another process, the test's own threads) does not. A comment makes the
        # grammar new to the daemon's verdict cache, so the retry pays for its check again too.
        TALLY["one-off gaps"] += 1
        started = time.monotonic()
        _send(daemon, f"{grammar}\n# retry {TALLY['one-off gaps']}\n", transport, temperature)
        ended = time.monotonic()
        time.sleep(0.2)
        stalled = beat.longest_gap_ms(started, ended) > limit
    if stalled:
        TALLY["stalls"] += 1
    grown = {k: TALLY[k] - before[k] for k in FAILURES if TALLY[k] > before[k]}
    died = daemon.last_words() if daemon.process.poll() is not None else ""
    assert not grown, (grown, code, f"{gap:.0f} ms", grammar[:300], died)
