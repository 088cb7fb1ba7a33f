"""JSON replies stay JSON: a string in a schema's grammar admits no raw control character (a
newline, a tab, U+0000...), which JSON allows only escaped. CI once drew a json_object reply
`{",\n":false}` at a temperature: the converter's string rule let the newline through.

Checked on the grammar itself, against the whole vocabulary of a real model (its tokenizer only,
no context): after `{"`, which tokens may come next. The converter's own grammar is checked beside
it, so the test shows the hole it guards against rather than passing on any grammar."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from sidecar.native.grammar import compact, json_schema_grammar
from sidecar.native.token_candidates import TokenCandidates

CONTROL = {chr(c) for c in range(0x20)} | {"\x7f"}


@pytest.fixture(scope="module")
def vocab(smollm2_vocab: object) -> object:
    return smollm2_vocab


def _piece(vocab: object, token: int) -> str:
    buffer = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
    return buffer.raw[: max(n, 0)].decode("utf-8", errors="replace")


def _tokens(vocab: object, text: str) -> list[int]:
    data = text.encode()
    out = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), out, len(out), False, False)
    return list(out[:n])


def _next_pieces(vocab: object, grammar: str, after: str) -> list[str]:
    """Pieces of every token the grammar allows once `after` has been written."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp did not parse the grammar"
    try:
        for token in _tokens(vocab, after):
            llama_cpp.llama_sampler_accept(sampler, token)
        candidates = TokenCandidates(llama_cpp.llama_vocab_n_tokens(vocab))
        candidates.fill_flat(np.array([], dtype=np.int64))
        candidates.apply(sampler)
        return [_piece(vocab, int(t)) for t in candidates.allowed_ids()]
    finally:
        llama_cpp.llama_sampler_free(sampler)


def _with_control(pieces: list[str]) -> list[str]:
    return [p for p in pieces if CONTROL & set(p)]


@pytest.mark.parametrize("schema", ['{"type": "object"}', '{"type": "string", "maxLength": 12}'])
def test_a_string_admits_no_raw_control_character(vocab: object, schema: str) -> None:
    opening = '{"' if "object" in schema else '"'
    pieces = _next_pieces(vocab, json_schema_grammar(schema), opening)
    assert pieces, "the grammar allowed nothing inside the string"
    assert not _with_control(pieces), f"tokens with raw control characters allowed: {_with_control(pieces)[:5]}"
    assert any("\\" in p for p in pieces), "an escape (\\n written as two characters) must stay possible"


def test_the_converters_own_rule_lets_them_through(vocab: object) -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    pieces = _next_pieces(vocab, compact(json_schema_to_gbnf('{"type": "object"}')), '{"')
    assert _with_control(pieces), "the converter no longer admits control characters: strict_strings may go"
