"""A session's replies keep the tokens the model generated, so the next turn finds them in the cache.

Each turn renders the whole conversation and tokenizes it again; the engine then reuses the KV
cache up to the first token that differs. A reply tokenized from its text is not always the token
sequence the model wrote: under a grammar (tool calls, JSON schemas) the sampler builds text piece
by piece, `{` then `"` where the tokenizer would write `{"`, so a 23-token tool call matched the
cache for 5 tokens and the rest of it, and everything after it, was computed again every turn.
Free text mostly matches (one token in 157 differed over four turns). So when a reply ends, the
tokens it was generated as are kept with its text, and tokenizing that text (as message content)
gives them back. They are a valid tokenization of the text: the pieces of those tokens are it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable

from sidecar.backend.chat_segments import Tokenize

# Replies remembered per session at most, newest kept. The history bounds them first (replies its
# trimming dropped are forgotten); this bounds a session whose history holds many short replies.
MAX_REPLIES = 256


def remember(store: dict[str, array], reply: str, generated: list[int], piece: Callable[[int], bytes],
             tokenize: Tokenize, history: Iterable[tuple[str, str]] = ()) -> None:
    """Keep `generated` (the reply's tokens as decoded into the cache) for the text `reply`, and
    forget replies no longer in `history` (the conversation, this reply included). The text may run
    past the tokens (the last token sampled at max_tokens is not decoded yet): the rest is
    tokenized. A reply cut by a stop string is shorter than its tokens: nothing is kept."""
    held = {content for role, content in history if role == "assistant"}
    for text in [t for t in store if t not in held]:
        del store[text]
    if not reply:
        return
    try:
        written = b"".join(piece(t) for t in generated).decode("utf-8")
    except UnicodeDecodeError:
        return  # the tokens end inside a character: not the reply's text
    if not reply.startswith(written):
        return
    rest = reply[len(written):]
    store.pop(reply, None)
    # 4 bytes a token, not a Python int's 28 and a list slot's 8: many NPCs, each with its history.
    store[reply] = array("i", list(generated) + (tokenize(rest, add_bos=False, parse_special=False) if rest else []))
    while len(store) > MAX_REPLIES:
        del store[next(iter(store))]


def tokenizer(tokenize: Tokenize, store: dict[str, array] | None) -> Tokenize:
    """`tokenize`, giving a remembered reply's tokens for its text as plain content."""
    if not store:
        return tokenize

    def with_replies(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        if not parse_special and not add_bos:
            kept = store.get(text)
            if kept is not None:
                return list(kept)
        return tokenize(text, add_bos=add_bos, parse_special=parse_special)
    return with_replies
