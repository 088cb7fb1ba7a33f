"""Shared by the llama.cpp server scenarios (test_llama_server_*.py; the port and what it leaves
out are listed in test_llama_server_scenarios.py): the daemon started as llama.cpp's tests start
llama-server, and llama.cpp's own tokenizer on the served file as the reference. Their requests on
the bare URL and the openai client are tests/http/conftest.py's, on this daemon. Each module that
imports the fixtures gets its own daemon (they are module-scoped)."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import llama_cpp
import llama_cpp._internals as llama_internals
import openai
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon

LIMIT = 256  # the daemon's --max-tokens-per-request
GREEDY = {"temperature": 0.0}
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
CODING = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]
MEANING = "I believe the meaning of life is"


@pytest.fixture(scope="module")
def api() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--stream-interval-ms", "0", "--max-tokens-per-request", str(LIMIT))
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@dataclass(frozen=True)
class Vocab:
    """llama.cpp's own tokenizer on the file the daemon serves (its vocabulary only): the reference
    the daemon's /tokenize and /detokenize are held to."""

    model: llama_internals.LlamaModel

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self.model.tokenize(text.encode(), add_special, parse_special)

    def piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        size = llama_cpp.llama_token_to_piece(self.model.vocab, token, buffer, len(buffer), 0, True)
        assert size >= 0, f"token {token}'s piece is longer than {len(buffer)} bytes"
        return buffer.raw[:size]

    @property
    def eog(self) -> list[int]:
        """The end-of-generation tokens: banned, a reply runs its whole max_tokens."""
        vocab = self.model.vocab
        return [t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, t)]


@pytest.fixture(scope="module")
def vocab(raw: httpx.Client) -> Iterator[Vocab]:
    path = raw.get("/props").json()["model_path"]
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    loaded = llama_internals.LlamaModel(path_model=path, params=params, verbose=False)
    yield Vocab(loaded)
    loaded.close()


@pytest.fixture(scope="module")
def no_eog(vocab: Vocab) -> dict[str, float]:
    bias = {str(t): -100.0 for t in vocab.eog}
    assert bias, "the model has no end-of-generation token"
    return bias


def sse(raw: httpx.Client, path: str, body: dict) -> list[dict]:
    """A streamed reply's events, which must end in data: [DONE]."""
    with raw.stream("POST", path, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines[:-1]]


def refused(reply: httpx.Response) -> dict:
    """An OpenAI error object with a 400."""
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"], error
    return error


def joined(entries) -> bytes:
    return b"".join(bytes(e.bytes) for e in entries)
