"""NPC memory in a RAM budget (memory/footprint.py, local/crowd.py, settings.py): the store's share and
the embedding model come out of what the KV may take, a budget that cannot also hold the model
finds memories by words, and the bound on memories follows the budget."""

from __future__ import annotations

import pytest

from sidecar.local.crowd import MemoryReserve, sequences_within
from sidecar.errors import InvalidArgument
from sidecar.memory.footprint import MAX_MEMORIES, MINILM_HOST_BYTES, embedder_host_bytes, memories_within
from sidecar.settings import Settings

MIB = 1 << 20


def test_memory_comes_out_of_the_kv_and_is_named_when_it_does_not_fit() -> None:
    plain = sequences_within(2048 * MIB, 98 * MIB, 94 * MIB, 64 * MIB, 4096)
    reserve = MemoryReserve(MINILM_HOST_BYTES, store=True)
    assert sequences_within(2048 * MIB, 98 * MIB, 94 * MIB, 64 * MIB, 4096, memory=reserve) == plain - 2
    with pytest.raises(InvalidArgument, match="NPC memory"):
        sequences_within(400 * MIB, 98 * MIB, 94 * MIB, 64 * MIB, 4096, memory=reserve)


def test_a_budget_that_cannot_also_hold_the_model_finds_memories_by_words() -> None:
    if not embedder_host_bytes("auto"):
        pytest.skip("the packaged embedding model is not installed (scripts/setup installs it)")
    small, large = Settings(ram_budget="512M"), Settings(ram_budget="2G")
    assert small.memory_embedder == "words" and small.memory_reserve().model_bytes == 0
    assert large.memory_embedder == "auto" and large.memory_reserve().model_bytes == MINILM_HOST_BYTES
    # The model's share is KV the crowd no longer has, and --no-memory gives it back.
    assert Settings(ram_budget="2G", memory=False).sequences() > large.sequences() >= 1


def test_without_a_budget_nothing_is_set_aside_and_the_bounds_are_fixed() -> None:
    assert Settings().memory_reserve().bytes(0) == 0
    assert Settings().memories_max == MAX_MEMORIES == memories_within(0)


def test_the_bound_on_memories_follows_the_budget() -> None:
    assert memories_within(512 * MIB) < memories_within(1024 * MIB) < MAX_MEMORIES
    assert memories_within(64 << 30) == MAX_MEMORIES
    assert memories_within(1) == 1  # never none: a tiny budget is refused before memory matters


def test_words_and_a_missing_file_hold_no_model() -> None:
    assert embedder_host_bytes("words") == 0
    assert embedder_host_bytes("/no/such/model.gguf") == 0
