"""Embeddings share the engine with the streams (issue 36, P3): a big call runs in slices between
the streams' passes, so an NPC talking beside it keeps receiving tokens, and a call whose client
has gone stops before its next slice. Over HTTP (the `openai` package, httpx where a client must
be killed), gRPC and the WebSocket bridge; the gaps beside an NPC that talks while they are
measured (stream_heartbeat.py). Bounds are relative to what the same test measures, never absolute.

Before: 4 inputs of 510 tokens held every stream for the whole call (14.5 s in the issue), and a
call of 16 went on after its client was killed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import openai
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.openai_http_support import http_base
from support.stream_heartbeat import Heartbeat
from support.bridge import BridgeClient
from sidecar.engine.model_calls import MAX_EMBED_TOKENS
from sidecar.native.embedding_context import EMBED_CONTEXT

STOPPED = "model call stopped: its caller has gone"
LONG = 510  # tokens of one input, as in the issue
SENTENCE = "The smith of Oakvale hammered a blade by the forge while the rain fell. "


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    running = start_daemon("--stream-interval-ms", "0", "--parallel", "2")
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def heartbeat(daemon: RunningDaemon) -> Iterator[Heartbeat]:
    """The NPC talks only while gap_beside measures (it would decode through the whole module)."""
    beat = Heartbeat(daemon)
    beat.pause()
    yield beat
    beat.stop()


@pytest.fixture(scope="module")
def client(daemon: RunningDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http_base(daemon)}/v1", api_key=daemon.token, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def long_ids(daemon: RunningDaemon) -> list[int]:
    with daemon.client(timeout_s=60) as c:
        ids = c.tokenize(SENTENCE * 40)
    assert len(ids) >= LONG
    return ids[:LONG]


@pytest.fixture(scope="module")
def long_text(daemon: RunningDaemon, long_ids: list[int]) -> str:
    """A text of about LONG tokens (gRPC and the bridge take text only)."""
    with daemon.client(timeout_s=60) as c:
        text = c.detokenize(long_ids[:LONG - 8])
        assert LONG - 16 <= len(c.tokenize(text, add_special=True)) <= EMBED_CONTEXT
    return text


def events_so_far(daemon: RunningDaemon, wanted: str) -> int:
    """How many log lines of event `wanted` the daemon has written so far. Count them before
    what causes the next one: the log is read as the daemon writes it (start_daemon's drain), so
    a line counted after the cause may already be the one awaited (a bridge cancel is logged
    before the client has read its CANCELLED frame)."""
    return sum(1 for e in list(daemon.log_lines) if e.get("event") == wanted)


def silence_ms(heartbeat: Heartbeat, since: float, until: float) -> float:
    """The NPC's longest wait for a token in [since, until], across its replies too: a call run
    whole stalled the engine as often between two replies as inside one."""
    times = sorted(t for reply in list(heartbeat.replies) for t in reply)
    gaps = [b - a for a, b in zip(times, times[1:]) if b >= since and a <= until]
    if times and times[-1] < until:
        gaps.append(until - times[-1])
    return max(gaps, default=0.0) * 1000.0


def gap_beside(heartbeat: Heartbeat, call) -> tuple[float, float, float]:
    """(the NPC's longest wait before the call, during it, the call's time), in ms."""
    heartbeat.resume()
    try:
        quiet_from = time.monotonic()
        time.sleep(1.5)
        quiet = silence_ms(heartbeat, quiet_from, time.monotonic())
        t0 = time.monotonic()
        call()
        t1 = time.monotonic()
        return quiet, silence_ms(heartbeat, t0, t1), (t1 - t0) * 1000.0
    finally:
        heartbeat.pause()


@pytest.mark.parametrize("way", ["http", "grpc"])
def test_a_stream_keeps_receiving_tokens_beside_4_inputs_of_510_tokens(way, daemon, heartbeat, client, long_ids,
                                                                       long_text) -> None:
    def call() -> None:
        if way == "http":
            reply = client.embeddings.create(model="x", input=[long_ids] * 4)
            assert len(reply.data) == 4 and reply.usage.prompt_tokens == 4 * LONG
        else:
            with daemon.client(timeout_s=300) as c:
                assert len(c.embed([long_text] * 4)) == 4

    quiet, during, took = gap_beside(heartbeat, call)
    print(f"{way} 4 x {LONG}: longest gap {during:.0f} ms beside the call ({took:.0f} ms), {quiet:.0f} ms before it")
    # Sixteen slices with a pass of the stream between two: the gap is about a slice, not the call
    # (which it was: the whole call ran between two passes).
    assert during < took / 3, (during, took, quiet)


def test_a_stream_keeps_receiving_tokens_beside_256_short_lines(client, heartbeat) -> None:
    def call() -> None:
        assert len(client.embeddings.create(model="x", input=["hi"] * 256).data) == 256

    quiet, during, took = gap_beside(heartbeat, call)
    print(f"http 256 x 'hi': longest gap {during:.0f} ms beside the call ({took:.0f} ms), {quiet:.0f} ms before it")
    # Packed 64 to a pass: four slices, each one pass.
    assert during < quiet + took / 2, (during, took, quiet)


def test_a_call_over_the_bound_is_refused_by_name(client, daemon, long_ids, long_text) -> None:
    over = MAX_EMBED_TOKENS // LONG + 1
    with pytest.raises(openai.BadRequestError, match=f"at most {MAX_EMBED_TOKENS} per request"):
        client.embeddings.create(model="x", input=[long_ids] * over)
    with daemon.client(timeout_s=60) as c, pytest.raises(grpc.RpcError) as refused:
        c.embed([long_text] * (MAX_EMBED_TOKENS // (LONG - 16) + 1))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and str(MAX_EMBED_TOKENS) in refused.value.details()


def _gone_then_quick(daemon: RunningDaemon, client: openai.OpenAI, long_ids: list[int], leave) -> dict:
    """Start 16 inputs of 510 tokens and leave (`leave`): the call stops before its next slice (the
    log says after how many), and the next call is not kept waiting behind the inputs left."""
    t0 = time.monotonic()
    client.embeddings.create(model="x", input=[long_ids])
    one_input_s = time.monotonic() - t0
    seen = events_so_far(daemon, STOPPED)
    leave()
    stopped = daemon.wait_for_event(STOPPED, 60, after=seen)
    t1 = time.monotonic()
    assert len(client.embeddings.create(model="x", input=[long_ids]).data) == 1
    assert time.monotonic() - t1 < 3 * one_input_s, "the next call waited behind the abandoned one"
    # 16 inputs of four slices each; the client left a few slices in.
    assert stopped["slices_run"] < 16 * 4 // 2, stopped
    return stopped


def test_a_killed_http_client_stops_its_call(daemon, client, long_ids) -> None:
    base = http_base(daemon)

    def leave() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {daemon.token}"}, timeout=2.0) as raw:
            with pytest.raises(httpx.ReadTimeout):
                raw.post("/v1/embeddings", json={"input": [long_ids] * 16})

    _gone_then_quick(daemon, client, long_ids, leave)


def test_a_grpc_deadline_stops_its_call(daemon, client, long_ids, long_text) -> None:
    def leave() -> None:
        with daemon.client(timeout_s=2.0) as c, pytest.raises(grpc.RpcError) as gone:
            c.embed([long_text] * 16)
        assert gone.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    _gone_then_quick(daemon, client, long_ids, leave)


def test_a_bridge_cancel_stops_its_call(daemon, client, long_ids, long_text) -> None:
    def leave() -> None:
        with BridgeClient(daemon.ws_address, daemon.token) as bridge:
            bridge.send({"id": "e", "method": "Embed", "request": {"input": [long_text] * 16}})
            time.sleep(1.0)
            bridge.send({"id": "e", "cancel": True})
            assert list(bridge.frames_of("e", timeout=30))[-1]["error"]["code"] == "CANCELLED"

    _gone_then_quick(daemon, client, long_ids, leave)
