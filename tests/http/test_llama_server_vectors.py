"""llama.cpp's test_embedding and test_tokenize, as scenarios against this daemon (the port and what it
leaves out are listed in test_llama_server_scenarios.py)."""

from __future__ import annotations

import base64
import struct

import httpx
import llama_cpp
import numpy as np
import openai
import pytest

from support.llama_server_support import MEANING, Vocab, refused
from support.llama_server_support import api, vocab  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


# -- embeddings --------------------------------------------------------------------------------


def _embed(raw: httpx.Client, value, path: str = "/v1/embeddings", **body) -> dict:
    reply = raw.post(path, json={"input": value, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _unit(vector) -> bool:
    return abs(float(np.linalg.norm(vector)) - 1.0) < 1e-3


def test_embedding_single(raw: httpx.Client) -> None:
    """test_embedding::test_embedding_single and ::test_embedding_pooling_mean: one vector, unit length."""
    body = _embed(raw, MEANING)
    assert body["object"] == "list" and len(body["data"]) == 1
    vector = body["data"][0]["embedding"]
    assert len(vector) > 1 and _unit(vector) and body["data"][0]["object"] == "embedding"


def test_embedding_multiple(raw: httpx.Client) -> None:
    """test_embedding::test_embedding_multiple and ::test_embedding_pooling_mean_multiple."""
    lines = [MEANING, "Write a joke about AI from a very long prompt which will not be truncated", "This is a test",
             "This is another test"]
    data = _embed(raw, lines)["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3]
    assert len({len(d["embedding"]) for d in data}) == 1 and all(len(d["embedding"]) > 1 and _unit(d["embedding"]) for d in data)


def test_embedding_inputs_in_openai_s_forms(raw: httpx.Client, vocab: Vocab) -> None:
    """test_embedding::test_embedding_mixed_input, the forms OpenAI defines: a text, token ids,
    texts, lists of token ids. Ids of a text give the text's own vector."""
    for value, count in (("string", 1), ([12, 34, 56], 1), (["string1", "string2"], 2), ([[12, 34, 56], [12, 34, 56]], 2)):
        data = _embed(raw, value)["data"]
        assert len(data) == count and all(len(d["embedding"]) > 1 for d in data), value
    pair = _embed(raw, [[12, 34, 56], [12, 34, 56]])["data"]
    assert np.allclose(pair[0]["embedding"], pair[1]["embedding"], atol=1e-3)
    assert np.allclose(_embed(raw, [12, 34, 56])["data"][0]["embedding"], pair[0]["embedding"], atol=1e-3)
    ids = vocab.tokenize(MEANING, add_special=True, parse_special=False)
    assert np.allclose(_embed(raw, ids)["data"][0]["embedding"], _embed(raw, MEANING)["data"][0]["embedding"], atol=1e-3)


@pytest.mark.parametrize("value", [
    "", [""], [],  # OpenAI: the input "cannot be an empty string"; llama-server embeds "" (test_embedding_mixed_input)
    {"content": "string"}, {"content": [{"type": "unknown"}]},
    {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
    {"content": [{"type": "input_video", "input_video": {"url": "data:video/mp4;base64,AAAA"}}]},
    ["string1", [12, 34, 56]],
])
def test_embedding_invalid_input(raw: httpx.Client, value) -> None:
    """test_embedding::test_embedding_invalid_input (and the empty input, refused as OpenAI refuses it)."""
    refused(raw.post("/v1/embeddings", json={"input": value}))


def test_embedding_with_the_openai_library(client: openai.OpenAI) -> None:
    """test_embedding::test_embedding_openai_library_single and ::_multiple (the client asks for
    base64 and decodes it)."""
    one = client.embeddings.create(model="text-embedding-3-small", input=MEANING)
    assert len(one.data) == 1 and len(one.data[0].embedding) > 1 and _unit(one.data[0].embedding)
    four = client.embeddings.create(model="text-embedding-3-small", input=[
        MEANING, "Write a joke about AI from a very long prompt which will not be truncated", "This is a test",
        "This is another test"])
    assert len(four.data) == 4 and all(len(d.embedding) == len(one.data[0].embedding) for d in four.data)
    assert np.allclose(four.data[0].embedding, one.data[0].embedding, atol=1e-3)


def test_embedding_prompt_too_long(client: openai.OpenAI) -> None:
    """test_embedding::test_embedding_error_prompt_too_long: an input past the embedding context."""
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="x", input="This is a test " * 512)
    assert e.value.type == "invalid_request_error"


def test_same_input_gives_the_same_vector(raw: httpx.Client) -> None:
    """test_embedding::test_same_prompt_give_same_result, and the same input alone and in a batch."""
    data = _embed(raw, [MEANING] * 5)["data"]
    for d in data[1:]:
        assert np.allclose(d["embedding"], data[0]["embedding"], atol=1e-3)
    alone = _embed(raw, MEANING)["data"][0]["embedding"]
    mixed = _embed(raw, ["Rain over the harbour.", MEANING, "x " * 200])["data"]
    assert np.allclose(mixed[1]["embedding"], alone, atol=1e-3) and np.allclose(alone, data[0]["embedding"], atol=1e-3)
    assert not np.allclose(mixed[0]["embedding"], alone, atol=1e-3)  # a different text is another vector


@pytest.mark.parametrize("content", [MEANING, "This is a test"])
def test_embedding_usage_single(raw: httpx.Client, vocab: Vocab, content: str) -> None:
    """test_embedding::test_embedding_usage_single: the input's tokens, as the model tokenizes it
    (llama.cpp's 9 and 6 are its test model's counts)."""
    usage = _embed(raw, content)["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == len(vocab.tokenize(content, add_special=True, parse_special=False))


def test_embedding_usage_multiple(raw: httpx.Client, vocab: Vocab) -> None:
    """test_embedding::test_embedding_usage_multiple."""
    usage = _embed(raw, [MEANING, MEANING])["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == 2 * len(vocab.tokenize(MEANING, add_special=True, parse_special=False))


def test_embedding_base64(raw: httpx.Client) -> None:
    """test_embedding::test_embedding_openai_library_base64: little-endian float32s, the float reply's."""
    floats = _embed(raw, "Test base64 embedding output")["data"][0]["embedding"]
    encoded = _embed(raw, "Test base64 embedding output", encoding_format="base64")["data"]
    assert len(encoded) == 1 and isinstance(encoded[0]["embedding"], str)
    decoded = base64.b64decode(encoded[0]["embedding"], validate=True)
    values = struct.unpack(f"<{len(decoded) // 4}f", decoded)
    assert len(decoded) % 4 == 0 and len(values) == len(floats)
    assert np.allclose(values, floats, atol=1e-3)


def test_embeddings_without_v1(raw: httpx.Client) -> None:
    """llama-server's /embeddings (test_embedding::test_embedding_pooling_none posts there) is
    served here as /v1/embeddings without the prefix, in OpenAI's shape."""
    bare = _embed(raw, MEANING, path="/embeddings")
    assert bare["object"] == "list" and bare["data"][0]["object"] == "embedding"
    assert np.allclose(bare["data"][0]["embedding"], _embed(raw, MEANING)["data"][0]["embedding"], atol=1e-3)


# -- tokenize and detokenize -------------------------------------------------------------------


def test_tokenize_detokenize(raw: httpx.Client, vocab: Vocab) -> None:
    """test_tokenize::test_tokenize_detokenize: the model's own tokens, and back to the text."""
    content = "What is the capital of France ?"
    tokens = raw.post("/tokenize", json={"content": content}).json()["tokens"]
    assert len(tokens) > 5 and tokens == vocab.tokenize(content)
    assert raw.post("/detokenize", json={"tokens": tokens}).json()["content"] == content
    assert raw.post("/v1/tokenize", json={"content": content}).json()["tokens"] == tokens


def test_tokenize_with_bos(raw: httpx.Client, vocab: Vocab) -> None:
    """test_tokenize::test_tokenize_with_bos: add_special adds what the model's vocabulary asks
    for (a BOS where it wants one; SmolLM2 wants none), as llama.cpp's tokenizer does."""
    content = "What is the capital of France ?"
    plain = raw.post("/tokenize", json={"content": content}).json()["tokens"]
    special = raw.post("/tokenize", json={"content": content, "add_special": True}).json()["tokens"]
    assert special == vocab.tokenize(content, add_special=True)
    assert special[len(special) - len(plain):] == plain and len(special) - len(plain) in (0, 1)
    if llama_cpp.llama_vocab_get_add_bos(vocab.model.vocab):
        assert special[0] == llama_cpp.llama_vocab_bos(vocab.model.vocab)


UNICODE = "This is a test string with unicode 媽 and emoji 🤗"


def test_tokenize_with_pieces(raw: httpx.Client, vocab: Vocab) -> None:
    """test_tokenize::test_tokenize_with_pieces: each token with its id and a piece."""
    tokens = raw.post("/tokenize", json={"content": UNICODE, "with_pieces": True}).json()["tokens"]
    assert [t["id"] for t in tokens] == vocab.tokenize(UNICODE)
    for token in tokens:
        assert token["id"] > 0 and len(token["piece"]) > 0
        # A piece that is whole text is that text (pieces of part of a character: next test).
        try:
            assert token["piece"] == vocab.piece(token["id"]).decode("utf-8")
        except UnicodeDecodeError:
            pass


def test_tokenize_pieces_of_part_of_a_character_are_its_bytes(raw: httpx.Client, vocab: Vocab) -> None:
    """llama-server's /tokenize with_pieces gives a piece that is not valid UTF-8 as the list of
    its bytes, so the pieces, joined, are the text (a client that shows tokens relies on it)."""
    tokens = raw.post("/tokenize", json={"content": UNICODE, "with_pieces": True}).json()["tokens"]
    partial = [t for t in tokens if not _is_utf8(vocab.piece(t["id"]))]
    assert partial, "the text has no token holding part of a character: the test shows nothing"
    for token in partial:
        assert token["piece"] == list(vocab.piece(token["id"])), token
    joined_pieces = b"".join(bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode() for t in tokens)
    assert joined_pieces == UNICODE.encode()


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_tokenize_special_tokens(raw: httpx.Client, vocab: Vocab) -> None:
    """parse_special, as llama-server reads it (on by default): a special token's text is its one
    id, or, off, plain text; detokenize renders special tokens as their text."""
    special_id = llama_cpp.llama_vocab_eos(vocab.model.vocab)  # <|im_end|> in SmolLM2
    assert llama_cpp.llama_vocab_get_attr(vocab.model.vocab, special_id) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    special_piece = vocab.piece(special_id).decode()
    special_text = special_piece + "user"
    parsed = raw.post("/tokenize", json={"content": special_text}).json()["tokens"]
    assert parsed == vocab.tokenize(special_text, parse_special=True) and parsed[0] == special_id
    assert raw.post("/tokenize", json={"content": special_text, "parse_special": True}).json()["tokens"] == parsed
    plain = raw.post("/tokenize", json={"content": special_text, "parse_special": False}).json()["tokens"]
    assert plain == vocab.tokenize(special_text, parse_special=False) and special_id not in plain
    for tokens in (parsed, plain):
        assert raw.post("/detokenize", json={"tokens": tokens}).json()["content"] == special_text
    pieces = raw.post("/tokenize", json={"content": special_text, "with_pieces": True}).json()["tokens"]
    assert pieces[0] == {"id": special_id, "piece": special_piece}
