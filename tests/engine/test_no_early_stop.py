"""no_early_stop.py finds exactly llama.cpp's end-of-generation tokens, and banning them makes a
reply run to max_tokens (the tests that need a whole-length reply rely on both)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.api import pb

from support.no_early_stop import Vocabulary, default_eog_ids, eog_ids, file_eog_ids, grpc_eog_ids, grpc_sampling, vocab_eog_ids


@pytest.fixture(scope="module")
def tiny_models(model_files) -> dict[str, Path]:
    return model_files("tiny_llama", "tiny_llama_moe", "tiny_qwen3moe")


def _vocab(path: Path) -> Iterator[Vocabulary]:
    v = Vocabulary(path)
    try:
        yield v
    finally:
        v.close()


@pytest.mark.parametrize("name", ["smollm2", "tiny_llama", "tiny_llama_moe", "tiny_qwen3moe"])
def test_the_lookup_finds_exactly_the_models_eog_tokens(name: str, smollm2_path: Path, tiny_models) -> None:
    path = smollm2_path if name == "smollm2" else tiny_models[name]
    for v in _vocab(path):
        exact = vocab_eog_ids(v.vocab)
        assert exact, "llama.cpp lists no end-of-generation token"
        assert eog_ids(v.tokenize) == exact, (name, [v.tokenize(t) for t in ("<|im_end|>", "<|endoftext|>", "<reponame>")])
    assert file_eog_ids(path) == exact
    if name == "smollm2":
        assert default_eog_ids() == exact


def test_over_grpc_the_ban_makes_the_reply_run_to_max_tokens(client, smollm2_path: Path) -> None:
    ids = grpc_eog_ids(client)
    for v in _vocab(smollm2_path):
        assert ids == vocab_eog_ids(v.vocab)
    reply = client.complete(pb.GenerateRequest(prompt="Hi", max_tokens=6, sampling=grpc_sampling(ids, temperature=0.0)))
    assert (reply.final.finish_reason, reply.final.usage.completion_tokens) == (pb.FINISH_REASON_LENGTH, 6)
    assert not set(reply.token_ids) & set(ids)
