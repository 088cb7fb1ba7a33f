"""Replies keep the tokens they were generated as (sidecar.engine.prompts.reply_tokens): pure, a toy
tokenizer that writes `{"` as one token where a sampler wrote `{` then `"`."""

from __future__ import annotations

from sidecar.engine.prompts import reply_tokens

VOCAB = {1: b'{"', 2: b"{", 3: b'"', 4: b"a", 5: b"}", 6: b'"}', 7: b"\xc3", 8: b"\xa9"}


def piece(token: int) -> bytes:
    return VOCAB[token]


def tokenize(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
    """Greedy longest match, as a tokenizer would: never the sampler's `{` `"`."""
    data, out = text.encode(), []
    by_bytes = sorted(((v, k) for k, v in VOCAB.items()), key=lambda kv: -len(kv[0]))
    while data:
        token_bytes, token = next((v, k) for v, k in by_bytes if data.startswith(v))
        out.append(token)
        data = data[len(token_bytes):]
    return ([0] if add_bos else []) + out


def test_a_reply_is_tokenized_as_it_was_generated() -> None:
    store: dict = {}
    generated = [2, 3, 4, 3, 5]  # { " a " }
    assert tokenize('{"a"}', add_bos=False, parse_special=False) == [1, 4, 6]
    reply_tokens.remember(store, '{"a"}', generated, piece, tokenize)
    tok = reply_tokens.tokenizer(tokenize, store)
    assert tok('{"a"}', add_bos=False, parse_special=False) == generated
    # Only as plain message content: template text and other text tokenize as ever.
    assert tok('{"a"}', add_bos=False, parse_special=True) == [1, 4, 6]
    assert tok('{"a', add_bos=False, parse_special=False) == [1, 4]


def test_a_last_token_not_yet_decoded_is_tokenized_and_a_cut_reply_is_not_kept() -> None:
    store: dict = {}
    reply_tokens.remember(store, '{"a"}', [2, 3, 4], piece, tokenize)  # '"}' sampled last, never decoded
    assert [list(t) for t in store['{"a"}']] == [[2, 3, 4, 6]]
    reply_tokens.remember(store, '{"', [2, 3, 4, 3], piece, tokenize)  # a stop string cut the text
    assert store['{"'] == [None]
    reply_tokens.remember(store, "a\xe9", [4, 7], piece, tokenize)  # ends inside a character
    assert store["a\xe9"] == [None]
    tok = reply_tokens.tokenizer(tokenize, store)
    assert tok('{"', add_bos=False, parse_special=False) == [1]  # none kept: tokenized


def test_replies_the_history_dropped_are_forgotten_and_the_newest_kept_within_the_bound() -> None:
    store: dict = {}
    history: list[tuple[str, str]] = []
    for i in range(reply_tokens.MAX_REPLIES + 5):
        history += [("user", "hi"), ("assistant", "a" * (i + 1))]
        reply_tokens.remember(store, "a" * (i + 1), [4] * (i + 1), piece, tokenize, history)
    assert sum(map(len, store.values())) == reply_tokens.MAX_REPLIES and "a" not in store
    assert "a" * (reply_tokens.MAX_REPLIES + 5) in store
    trimmed = history[-4:]  # the context kept the last two turns
    reply_tokens.remember(store, trimmed[-1][1], [4] * len(trimmed[-1][1]), piece, tokenize, trimmed)
    assert set(store) == {trimmed[1][1], trimmed[3][1]}


def test_a_text_said_twice_gets_each_sayings_tokens_in_order() -> None:
    """The same tool call twice, its value closed with `"` one time and `"}` the next: both sayings
    are in the cache as generated, so each renders as its own tokens; once the earlier one has left
    the context, the one left renders as the later saying's."""
    store: dict = {}
    first, second = [2, 3, 4, 6], [1, 4, 3, 5]  # both spell {"a"}
    history = [("user", "hi"), ("assistant", '{"a"}')]
    reply_tokens.remember(store, '{"a"}', first, piece, tokenize, history)
    history += [("user", "again"), ("assistant", '{"a"}')]
    reply_tokens.remember(store, '{"a"}', second, piece, tokenize, history)
    conversation = history + [("user", "and now?")]
    tok = reply_tokens.tokenizer(tokenize, store, conversation)
    assert [tok('{"a"}', add_bos=False, parse_special=False) for _ in range(2)] == [first, second]
    trimmed = history[2:] + [("user", "and now?")]
    tok = reply_tokens.tokenizer(tokenize, store, trimmed)
    assert tok('{"a"}', add_bos=False, parse_special=False) == second
    reply_tokens.remember(store, "b", [4], piece, tokenize, trimmed[:2] + [("assistant", "b")])
    assert [list(t) for t in store['{"a"}']] == [second]  # the first saying left the context
