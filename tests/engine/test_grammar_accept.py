"""llama.cpp's grammar allows a token that it then cannot accept, and the exception ends the
process (grammar_accept.py): found on a real vocabulary, in a forked copy, with the grammar left as
it was. CI's grammar fuzz drew `root ::= <[17]>{5}` and the daemon died with SIGABRT."""

from __future__ import annotations


import llama_cpp
import numpy as np
import pytest

from sidecar.native.grammar_accept import TokenRefs, accept_throws
from sidecar.native.token_candidates import TokenCandidates


@pytest.fixture(scope="module")
def vocab(smollm2_vocab: object) -> object:
    return smollm2_vocab


def one_token(vocab: object, text: str) -> int:
    out = (llama_cpp.llama_token * 8)()
    n = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), out, 8, False, False)
    assert n == 1, f"{text!r} is {n} tokens in this vocabulary"
    return int(out[0])


def allowed(grammar: object, token: int) -> bool:
    one = TokenCandidates(1)
    one.fill_ids(np.array([token], dtype=np.int32))
    one.apply(grammar)
    return one.allowed_ids().size == 1


def test_token_references_are_read_from_the_grammar() -> None:
    refs = TokenRefs.of('root ::= "a" <[17]> | <[2]>')
    assert refs.named == {17, 2} and not refs.excludes and refs.present
    assert TokenRefs.of("root ::= !<[2]>*").excludes
    assert not TokenRefs.of('root ::= "Aye" | "Nay"').present
    assert refs.could_disagree(17, b"!!") and not refs.could_disagree(17, b"!") and not refs.could_disagree(5, b"ab")
    assert TokenRefs.of("root ::= !<[2]>").could_disagree(5, b"ab")


def test_a_token_the_grammar_allows_but_cannot_accept_is_found_and_the_grammar_goes_on(vocab: object) -> None:
    bang, double = one_token(vocab, "!"), one_token(vocab, "!!")
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, f'root ::= "!" <[{double}]>'.encode(), b"root")
    try:
        assert allowed(grammar, double), "llama.cpp no longer allows it: the disagreement may be fixed upstream"
        assert accept_throws(grammar, double)
        # This process is alive and its grammar untouched: the legitimate path still works.
        assert not accept_throws(grammar, bang)
        llama_cpp.llama_sampler_accept(grammar, bang)
        assert allowed(grammar, double) and not accept_throws(grammar, double)
        llama_cpp.llama_sampler_accept(grammar, double)
    finally:
        llama_cpp.llama_sampler_free(grammar)


def test_a_token_reference_at_a_token_start_accepts(vocab: object) -> None:
    double = one_token(vocab, "!!")
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, f"root ::= <[{double}]>".encode(), b"root")
    try:
        assert allowed(grammar, double) and not accept_throws(grammar, double)
    finally:
        llama_cpp.llama_sampler_free(grammar)
