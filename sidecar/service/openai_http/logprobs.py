"""Token log probabilities in OpenAI's two shapes: chat's `logprobs.content` entries, and the legacy
completions' parallel lists (tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

from sidecar.api import pb


def _text(piece: bytes) -> str:
    # A token may hold part of a character; OpenAI then gives the text it can and the bytes.
    return piece.decode("utf-8", errors="replace")


def chat_entries(entries: list[pb.TokenLogprob]) -> list[dict]:
    return [{
        "token": _text(e.piece), "logprob": e.logprob, "bytes": list(e.piece),
        "top_logprobs": [{"token": _text(t.piece), "logprob": t.logprob, "bytes": list(t.piece)} for t in e.top],
    } for e in entries]


def chat_logprobs(entries: list[pb.TokenLogprob]) -> dict:
    return {"content": chat_entries(entries), "refusal": None}


def completion_logprobs(entries: list[pb.TokenLogprob], text_start: int = 0) -> dict:
    """`text_start`: where these tokens' text begins in the whole completion (a stream's later
    chunks)."""
    offsets, at = [], text_start
    for e in entries:
        offsets.append(at)
        at += len(_text(e.piece))
    return {
        "tokens": [_text(e.piece) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_text(t.piece): t.logprob for t in e.top} for e in entries],
        "text_offset": offsets,
    }
