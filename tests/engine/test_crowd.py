"""Crowds at the default settings: how many conversations the daemon decodes together, and a
16-NPC scene against the default daemon in which nobody waits for another's whole reply."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sidecar.api import pb
from sidecar.client import Reply
from sidecar.local.crowd import AUTO_MAX, AUTO_MIN, auto_parallel, parallel_for
from sidecar.model_info.default_model import default_model_path
from support.suite_model import suite_model_path

from support.no_early_stop import grpc_sampling

GIB = 1 << 30


def test_sequences_are_what_an_eighth_of_memory_holds_between_4_and_16() -> None:
    smollm2_at_4096 = 94_371_840  # 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes x 4096 cells
    assert auto_parallel(smollm2_at_4096, 24 * GIB) == AUTO_MAX
    assert auto_parallel(smollm2_at_4096, 8 * GIB) == 11
    four_b_at_4096 = 600 << 20
    assert auto_parallel(four_b_at_4096, 16 * GIB) == AUTO_MIN
    assert parallel_for(7, default_model_path(), 4096) == 7, "an explicit --parallel wins"


def test_sixteen_npcs_at_the_default_settings_all_start_before_any_reply_ends(daemon, eog) -> None:
    ready = next(e for e in daemon.log_lines if e.get("event") == "ready")
    assert ready["parallel"] == parallel_for(0, suite_model_path(), 4096)
    if ready["parallel"] < 16:
        pytest.skip("this machine's memory affords fewer than 16 sequences at --ctx 4096 (README: crowds)")

    def npc(i: int) -> pb.GenerationFinal:
        # The end-of-generation tokens banned: every reply runs its 8 tokens (one that ended at its
        # first would be over before the last NPC's first token, with no one waiting on anyone).
        with daemon.client(timeout_s=120) as client:
            reply = Reply()
            "".join(client.chat(f"Villager {i}, what is your trade?", system=f"You are villager number {i}.",
                                max_tokens=8, reply=reply, sampling=grpc_sampling(eog)))
            return reply.final

    # The first crowd grows the KV from its start to 16 sequences (kv_demand.py): those beyond the
    # first two wait for the allocation. Once grown (for 30 s of quiet), a crowd all starts at once.
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(npc, range(16)))
    with daemon.client(timeout_s=60) as client:
        assert client.status().memory.kv_sequences == 16
    with ThreadPoolExecutor(16) as pool:
        finals = list(pool.map(npc, range(16)))
    first_reply_done = min(f.timings.total_ms for f in finals)
    last_first_token = max(f.timings.time_to_first_token_ms for f in finals)
    assert last_first_token < first_reply_done, "an NPC waited for another's whole reply"
