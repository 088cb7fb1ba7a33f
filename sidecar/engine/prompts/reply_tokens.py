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
from collections import Counter
from collections.abc import Callable, Iterable

from sidecar.backend.chat_segments import Tokenize

# Sayings remembered per session at most, newest kept. The history bounds them first (replies its
# trimming dropped are forgotten); this bounds a session whose history holds many short replies.
MAX_REPLIES = 256

# Reply text -> the tokens of each time it was said, oldest first; None where a saying's tokens
# were not kept (a stop string cut it), so the list stays aligned with the history's sayings.
Sayings = list  # list[array | None]


def remember(store: dict[str, Sayings], reply: str, generated: list[int], piece: Callable[[int], bytes],
             tokenize: Tokenize, history: Iterable[tuple[str, str]] = ()) -> None:
    """Keep `generated` (the reply's tokens as decoded into the cache) as the latest saying of the
    text `reply`, and forget sayings no longer in `history` (the conversation, this reply
    included). The text may run past the tokens (the last token sampled at max_tokens is not
    decoded yet): the rest is tokenized. A reply cut by a stop string is shorter than its tokens:
    its saying keeps none.

    A text said more than once keeps each saying's tokens: the same tool call twice need not be
    the same tokens (the model closed a value with `"` one time and ` "` the next), and the one
    token list per text there was before gave both sayings the later one's, so the history parted
    from the cache at the earlier saying and everything after it was computed again (61 prompt
    tokens a turn instead of 18, three tool calls of one guard)."""
    said = Counter(content for role, content in history if role == "assistant")
    said[reply] = max(said[reply] - 1, 0)  # the sayings before this one
    for text in list(store):
        keep = said[text]
        if keep == 0:
            del store[text]
        elif len(store[text]) > keep:
            del store[text][:-keep]  # the earliest left the context
    if not reply:
        return
    tokens: array | None = None
    try:
        written = b"".join(piece(t) for t in generated).decode("utf-8")
    except UnicodeDecodeError:
        written = None  # the tokens end inside a character: not the reply's text
    if written is not None and reply.startswith(written):
        rest = reply[len(written):]
        # 4 bytes a token, not a Python int's 28 and a list slot's 8: many NPCs, each with its history.
        tokens = array("i", list(generated) + (tokenize(rest, add_bos=False, parse_special=False) if rest else []))
    sayings = store.pop(reply, [])
    store[reply] = sayings + [tokens]  # re-inserted: the dict's order is the newest saying's
    held = sum(map(len, store.values()))
    while held > MAX_REPLIES:
        oldest = next(iter(store))
        del store[oldest][0]
        held -= 1
        if not store[oldest]:
            del store[oldest]


def tokenizer(tokenize: Tokenize, store: dict[str, Sayings] | None,
              conversation: Iterable[tuple[str, str]] = ()) -> Tokenize:
    """`tokenize` for rendering `conversation`, giving a remembered reply's tokens for its text as
    plain content. A text said several times gets its sayings' tokens in order, aligned from the
    end: the conversation may have lost its earliest sayings to trimming, never its latest."""
    if not store:
        return tokenize
    in_conversation = Counter(content for role, content in conversation if role == "assistant")
    asked: Counter[str] = Counter()

    def with_replies(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        sayings = store.get(text) if not parse_special and not add_bos else None
        if sayings:
            at = len(sayings) - max(in_conversation[text], 1) + asked[text]
            asked[text] += 1
            kept = sayings[at] if 0 <= at < len(sayings) else None
            if kept is not None:
                return list(kept)
        return tokenize(text, add_bos=add_bos, parse_special=parse_special)
    return with_replies
