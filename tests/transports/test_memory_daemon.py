"""NPC memory through a live daemon (SmolLM2 and the packaged all-MiniLM-L6-v2): turns that leave
a small context become memories of the session's scope, a later question recalls the fact into
the prompt (the final chunk names it, and the prompt grows by it), scopes do not leak between
players, the world prefix stays cached with memories in play, bad input is refused and the
daemon serves on. What the model answers is never asserted."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from sidecar.api import pb
from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.suite_model import bundled_model_flags
from support.no_early_stop import default_eog_ids, grpc_sampling
from support.bridge import BridgeClient

ARGS = ("--budget", "0", "--ctx", "256", "--threads", "1", "--stream-interval-ms", "0")
SAMPLING = grpc_sampling(default_eog_ids(), temperature=0.0, repeat_penalty=1.0)
FILLER = ("Tell me about the road north and the weather on it, the bandits at the crossroads, "
          "the price of bread at the market and the guards at the gate. ")


def turn(client, sid: str, text: str, *, system: str = "", context: str = "",
         memory: pb.MemoryOptions | None = None) -> pb.GenerationFinal:
    messages = ([pb.ChatMessage(role="system", content=system)] if system else []) + [pb.ChatMessage(role="user", content=text)]
    reply = client.complete(pb.GenerateRequest(messages=pb.ChatMessages(messages=messages), sampling=SAMPLING,
                                               max_tokens=8, session_id=sid, context=context, memory=memory))
    return reply.final


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    d = start_daemon(*ARGS)
    yield d
    stop_daemon(d)


@pytest.fixture(scope="module")
def evening(daemon) -> dict:
    """Player 1 tells the smith a fact, then talks until it leaves the 256-token context."""
    with daemon.client(timeout_s=120) as c:
        finals = [turn(c, "smith/p1", "My sister is called Mira and she sells herbs.", system="You are Brom.")]
        while not any(f.memories_added for f in finals) and len(finals) < 20:
            finals.append(turn(c, "smith/p1", FILLER))
        listed = c.list_memories("smith/p1")
    return dict(finals=finals, listed=listed)


def test_dropped_turns_become_memories_of_the_session(evening) -> None:
    finals, listed = evening["finals"], evening["listed"]
    dropping = [f for f in finals if f.history_turns_dropped]
    assert dropping, "the context never filled"
    assert [list(f.memories_added) for f in dropping][0]  # the final chunk says so
    assert listed.total >= 1
    first = listed.memories[0]
    assert first.source == "context" and first.session_id == "smith/p1" and first.turn == 1
    assert "Mira" in first.text


def test_a_later_question_recalls_the_fact_into_the_prompt(daemon, evening) -> None:
    fact = evening["listed"].memories[0]
    question = "Do you remember what my sister's name was?"
    with daemon.client(timeout_s=120) as c:
        plain = turn(c, "smith/p1", question, memory=pb.MemoryOptions(off=True))
        recalled = turn(c, "smith/p1", question, memory=pb.MemoryOptions(k=4, max_tokens=80))
        again = turn(c, "smith/p1", question)  # the options held; the fact is in the context now
        # The prompt itself: two new sessions alike but for recall, reading the smith's scope.
        reads = pb.MemoryOptions(read_scopes=["smith/p1"], k=1, max_tokens=80)
        without = turn(c, "probe/a", question, system="You are Brom.", memory=pb.MemoryOptions(off=True))
        with_fact = turn(c, "probe/b", question, system="You are Brom.", memory=reads)
        fact_tokens = len(c.tokenize(fact.text))
    assert list(plain.memories_used) == []
    assert fact.id in recalled.memories_used
    # Told once, the memory stays in the conversation (and its KV cache): not told twice.
    assert fact.id not in again.memories_used
    assert again.history_turns_dropped or again.usage.cached_prompt_tokens >= recalled.usage.prompt_tokens
    assert list(with_fact.memories_used) == [fact.id]
    # The block (a header, the fact's text, a chat template's system turn) and nothing else.
    assert fact_tokens < with_fact.usage.prompt_tokens - without.usage.prompt_tokens < fact_tokens + 40


def test_scopes_do_not_leak_between_players(daemon, evening) -> None:
    with daemon.client(timeout_s=120) as c:
        other = turn(c, "smith/p2", "Do you remember what my sister's name was?", system="You are Brom.")
        assert list(other.memories_used) == []
        shared = c.remember(["The mill by the river burned down last winter."], scope="village", tags=["lore"])
        reads = pb.MemoryOptions(scope="smith/p2", read_scopes=["smith/p2", "village"], max_tokens=80)
        knows = turn(c, "smith/p2", "What happened to the mill by the river?", memory=reads)
        assert shared[0].id in knows.memories_used
        assert not set(knows.memories_used) & {m.id for m in evening["listed"].memories}
        found = c.recall("sister's name", ["smith/p2", "village"], k=10)
        assert all(r.memory.scope in ("smith/p2", "village") for r in found)


def test_world_prefix_stays_cached_with_memories(daemon) -> None:
    world = "The kingdom of Eld. Winter. The king is ill. " * 6
    with daemon.client(timeout_s=120) as c:
        c.remember(["The baker owes the player a loaf of bread."], scope="town")
        reads = pb.MemoryOptions(read_scopes=["town"], max_tokens=80)
        turn(c, "baker", "Hello, who owes me bread?", system="You are the baker.", context=world, memory=reads)
        second = turn(c, "miller", "Hello, who owes me bread?", system="You are the miller.", context=world,
                      memory=reads)
    assert second.memories_used
    assert second.usage.cached_prompt_tokens >= 40  # the world prefix, copied, not computed


@pytest.mark.parametrize("request_, code", [
    (pb.RememberRequest(scope="s", texts=[""]), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RememberRequest(scope="s", texts=["x" * 5000]), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RememberRequest(scope="s", texts=["bell\x07"]), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RememberRequest(texts=["no scope"]), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RememberRequest(scope="s", texts=["t"] * 65), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RecallRequest(scopes=["s"], query="q", k=100000), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.RecallRequest(scopes=[], query="q"), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.ForgetRequest(), grpc.StatusCode.INVALID_ARGUMENT),
    (pb.ListMemoriesRequest(limit=5000), grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_memory_calls_are_refused_and_change_nothing(daemon, request_, code) -> None:
    method = {pb.RememberRequest: "Remember", pb.RecallRequest: "Recall", pb.ForgetRequest: "Forget",
              pb.ListMemoriesRequest: "ListMemories"}[type(request_)]
    with daemon.client(timeout_s=60) as c:
        before = c.list_memories().total
        with pytest.raises(grpc.RpcError) as e:
            getattr(c._stub, method)(request_, timeout=30)
        assert e.value.code() == code
        assert c.list_memories().total == before
        assert c.forget(ids=[10**12]) == 0  # unknown ids: nothing, no error


def test_memory_over_the_bridge(daemon) -> None:
    with BridgeClient(daemon.ws_address, daemon.token) as bridge:
        [made] = bridge.call("Remember", {"scope": "guard", "texts": ["The gate closes at dusk."], "tags": ["rule"]})
        memory_id = made["result"]["memories"][0]["id"]
        [found] = bridge.call("Recall", {"scopes": ["guard"], "query": "when does the gate close?"})
        assert found["result"]["memories"][0]["memory"]["id"] == memory_id
        [gone] = bridge.call("Forget", {"tags": ["rule"], "scope": "guard"})
        assert gone["result"]["forgotten"] == 1
        [bad] = bridge.call("Remember", {"scope": "guard", "texts": [""]})
        assert "error" in bad


def test_memories_travel_with_a_save(daemon) -> None:
    with daemon.client(timeout_s=120) as c:
        turn(c, "bard", "Hello there.", system="You are the bard.",
             memory=pb.MemoryOptions(scope="bard", read_scopes=["bard", "tavern"]))
        c.remember(["The player sang the ballad of the grey mare."], scope="bard", tags=["song"])
        c.remember(["The tavern's cellar floods every spring."], scope="tavern")
        c.remember(["Unrelated: the guard's secret."], scope="guard-only")
        saved = c.export_sessions(["bard"])
        c.forget(scope="bard")
        c.forget(scope="tavern")
        c.import_sessions(saved.data, replace=True)
        bard = c.list_memories("bard").memories
        tavern = c.list_memories("tavern").memories
        assert [m.text for m in bard] == ["The player sang the ballad of the grey mare."]
        assert list(bard[0].tags) == ["song"] and [m.text for m in tavern] == ["The tavern's cellar floods every spring."]
        # The vectors came back usable: a search finds it.
        assert c.recall("which song did I sing?", ["bard"])[0].memory.id == bard[0].id
        assert c.list_memories("guard-only").total == 1  # not in the save, not touched


def test_memory_over_http_with_the_openai_client(daemon) -> None:
    import httpx
    import openai

    from support.openai_http_support import http_base

    base = http_base(daemon)
    headers = {"Authorization": f"Bearer {daemon.token}"} if daemon.token else {}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        made = http.post("/v1/memories", json={"scope": "innkeeper", "texts": ["The player's room is number seven."]})
        assert made.status_code == 200, made.text
        memory_id = made.json()["memories"][0]["id"]
        found = http.post("/v1/memories/search", json={"scopes": ["innkeeper"], "query": "which room is mine?"}).json()
        assert found["memories"][0]["memory"]["id"] == memory_id
        assert http.get("/v1/memories", params={"scope": "innkeeper"}).json()["total"] == 1
        bad = http.post("/v1/memories", json={"scope": "innkeeper", "texts": ["\x00"]})
        assert bad.status_code == 400 and "control" in bad.text
        assert http.post("/v1/memories/search", json={"scopes": ["x"], "nonsense": 1}).status_code == 400
    client = openai.OpenAI(base_url=base + "/v1", api_key=daemon.token or "none")
    reply = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Which room is mine?"}], max_tokens=4, temperature=0,
        user="innkeeper/p1", extra_body={"memory": {"read_scopes": ["innkeeper"], "max_tokens": 80}})
    assert reply.choices[0].message is not None
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        assert http.post("/v1/memories/forget", json={"scope": "innkeeper"}).json()["forgotten"] == 1
        refused = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "user": "x", "memory": {"k": 500}})
        assert refused.status_code == 400


def test_no_memory_refuses_memory_calls_and_keeps_nothing() -> None:
    d = start_daemon(*ARGS, "--no-memory")
    try:
        with d.client(timeout_s=120) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.remember(["x"], scope="s")
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "--no-memory" in e.value.details()
            finals = [turn(c, "npc", FILLER, system="You are Brom.") for _ in range(6)]
            assert any(f.history_turns_dropped for f in finals)
            assert not any(f.memories_added or f.memories_used for f in finals)
            assert not c.status().memories.enabled
    finally:
        stop_daemon(d)


def test_a_ram_budget_too_small_for_the_embedding_model_finds_memories_by_words() -> None:
    # --ctx 4096 (SmolLM2: 94 MB of KV a conversation): 512M holds one conversation, and not the
    # embedding model beside it (memory/footprint.py); 1G holds both. The bundled Q4_1 file: the
    # suite's Q4_0 copy is 10 MB smaller, enough for both at 512M.
    small = start_daemon(*bundled_model_flags(), "--budget", "0", "--ram-budget", "512M", "--stream-interval-ms", "0")
    try:
        with small.client(timeout_s=120) as c:
            c.remember(["The smith's sister is called Mira."], scope="smith")
            status = c.status()
        assert status.memories.embedder == "words" and status.memories.model_bytes == 0
        assert status.memory.kv_sequences_max == 1
        assert any(line.get("event", "").startswith("memory embeddings by words only") for line in small.log_lines)
    finally:
        stop_daemon(small)
