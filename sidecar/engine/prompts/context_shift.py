"""Keeping a trimmed session's cache: cut the dropped turns out of the KV cache and shift the rest
down, instead of recomputing everything after the persona (seconds for a long history on a CPU)."""

from __future__ import annotations

from sidecar.native.context import NativeContext
from sidecar.engine.prompts.prompt_build import BuiltPrompt
from sidecar.engine.scheduling.slot import Slot


def shift_out_dropped(ctx: NativeContext, slot: Slot, prompt: BuiltPrompt) -> int:
    """If `slot` holds the untrimmed conversation, cut the dropped range out of its cache so the
    kept turns line up with the trimmed prompt. Returns the tokens kept that way (0: nothing
    shifted; the ordinary prefix match then recomputes)."""
    start, stop = prompt.dropped_tokens
    cached, tokens = slot.cached, prompt.tokens
    if stop <= start or len(cached) <= stop or cached[:start] != tokens[:start]:
        return 0
    # The kept turns must be exactly what follows the dropped range in the cache.
    n = 0
    limit = min(len(cached) - stop, len(tokens) - start - 1)
    while n < limit and cached[stop + n] == tokens[start + n]:
        n += 1
    if n == 0 or not ctx.cut_out(slot.seq, start, stop):
        return 0
    slot.cached = cached[:start] + cached[stop:]
    return n
